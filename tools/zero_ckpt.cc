// zero-ckpt: look into, check, export and reshard checkpoints that Engine::Save / ShardedOptimizer::Save wrote.
//
//   zero-ckpt inspect DIR [--tag T]          format, world size, stage, dtypes, step, units, files and sizes
//   zero-ckpt verify DIR [--tag T | --all]   every checksum and file; an incomplete or damaged checkpoint is named
//   zero-ckpt export DIR OUT.safetensors [--tag T] [--dtype f32|bf16|f16] [--optimizer-state]
//   zero-ckpt reshard DIR OUT --world M [--stage t] [--tag T]
//   zero-ckpt clean DIR [--dry-run]          remove incomplete saves, temporaries and files meta.json does not list
//
// export streams (no more than one 16 MiB buffer whatever the model's size); reshard writes the checkpoint a
// run at M ranks (and stage t) would have saved, without running one (OUT may be DIR: the folder is replaced
// whole). No command writes into the checkpoint it reads (DIR/latest, a checkpoint folder): refused. verify
// lists the files a checkpoint folder holds beyond what its meta.json lists. Exit 0 on success, 1 when the
// checkpoint is damaged, incomplete or absent or the output would overwrite it (the error on stderr names the
// file and what is wrong), 2 on bad usage (the error names the option, its value and the range).
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "zero/checkpoint.h"
#include "zero/dtype.h"

namespace {

constexpr const char* kUsage =
    "usage: zero-ckpt inspect DIR [--tag T]\n"
    "       zero-ckpt verify DIR [--tag T | --all]\n"
    "       zero-ckpt export DIR OUT.safetensors [--tag T] [--dtype f32|bf16|f16] [--optimizer-state]\n"
    "       zero-ckpt reshard DIR OUT --world M [--stage t] [--tag T]\n"
    "       zero-ckpt clean DIR [--dry-run]\n"
    "DIR holds `latest` and one folder per checkpoint; --tag picks a folder (default: the latest).\n"
    "  verify    every checksum; also names files in the folder that meta.json does not list\n"
    "  export    OUT may not be inside DIR's checkpoint folders nor DIR/latest\n"
    "  reshard   M in [1, the largest unit's 32-element blocks]; OUT may be DIR (the folder is replaced whole)\n"
    "  clean     removes saves that never finished, *.tmp.* leftovers and unlisted files (run it while nothing\n"
    "            saves into DIR; --dry-run only lists them)\n";

int Usage(const std::string& why) {
  if (!why.empty()) std::cerr << "zero-ckpt: " << why << "\n";
  std::cerr << kUsage;
  return 2;
}

// A bad value: what is wrong, without the whole usage text burying it.
int BadValue(const std::string& why) {
  std::cerr << "zero-ckpt: " << why << " (zero-ckpt --help for usage)\n";
  return 2;
}

int Fail(const zero::Status& s) {
  std::cerr << "zero-ckpt: " << s.message() << "\n";
  return 1;
}

bool ParseInt(const char* s, long lo, long hi, int* out) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::cout << kUsage;
    return 0;
  }
  // The grammar is COMMAND DIR [flags]: a flag where the command goes is named, not taken for a command.
  if (argc >= 2 && argv[1][0] == '-') return Usage(std::string("unknown flag ") + argv[1]);
  if (argc < 3) return Usage("");
  const std::string cmd = argv[1];
  std::vector<std::string> pos;
  std::string tag;
  int world = 0, stage = -1;
  bool all = false, state = false, dry_run = false;
  zero::DType dtype = zero::DType::kF32;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "--tag") {
      const char* v = value();
      if (v == nullptr) return Usage("--tag needs a value");
      tag = v;
    } else if (a == "--world") {
      const char* v = value();
      if (v == nullptr) return Usage("--world needs a value");
      if (!ParseInt(v, 1, 1 << 20, &world)) {
        return BadValue(std::string("--world ") + v + ": not a world size in [1, 1048576]");
      }
    } else if (a == "--stage") {
      const char* v = value();
      if (v == nullptr) return Usage("--stage needs a value");
      if (!ParseInt(v, 0, 3, &stage)) return BadValue(std::string("--stage ") + v + ": not a stage (0, 1, 2 or 3)");
    } else if (a == "--dtype") {
      const char* v = value();
      if (v == nullptr) return Usage("--dtype needs a value (f32, bf16 or f16)");
      auto d = zero::ParseDType(v);
      if (!d.ok()) return Usage(std::string("--dtype: ") + v + " is not f32, bf16 or f16");
      dtype = *d;
    } else if (a == "--all") {
      all = true;
    } else if (a == "--optimizer-state") {
      state = true;
    } else if (a == "--dry-run") {
      dry_run = true;
    } else if (a.size() > 1 && a[0] == '-') {
      return Usage("unknown flag " + a);
    } else {
      pos.push_back(a);
    }
  }
  if (cmd == "inspect") {
    if (pos.size() != 1) return Usage("inspect takes DIR");
    auto d = zero::DescribeCheckpoint(pos[0], tag);
    if (!d.ok()) return Fail(d.status());
    std::cout << *d;
    return 0;
  }
  if (cmd == "verify") {
    if (pos.size() != 1) return Usage("verify takes DIR");
    if (all) {
      auto results = zero::VerifyAllCheckpoints(pos[0]);
      if (!results.ok()) return Fail(results.status());
      auto latest = zero::LatestCheckpointTag(pos[0]);
      int bad = 0;
      for (const auto& [t, s] : *results) {
        const bool is_latest = latest.ok() && *latest == t;
        std::cout << t << (is_latest ? " (latest)" : "") << ": " << (s.ok() ? "ok" : std::string(s.message())) << "\n";
        bad += !s.ok();
      }
      if (!latest.ok()) std::cout << "latest: " << latest.status().message() << "\n";
      return bad == 0 && latest.ok() ? 0 : 1;
    }
    const zero::Status s = zero::VerifyCheckpoint(pos[0], tag);
    if (!s.ok()) return Fail(s);
    std::cout << "ok: " << pos[0] << "/" << (tag.empty() ? zero::LatestCheckpointTag(pos[0]).value_or("?") : tag)
              << "\n";
    // Not damage (the checkpoint loads), but not nothing either: a killed save's temporary, an old world's rank
    // files. Named, with the command that removes them; the exit status stays 0.
    auto stray = zero::UnlistedCheckpointFiles(pos[0], tag);
    if (stray.ok() && !stray->empty()) {
      std::cout << stray->size() << " file" << (stray->size() == 1 ? "" : "s")
                << " in the folder that meta.json does not list (zero-ckpt clean " << pos[0] << " removes them):\n";
      for (const std::string& f : *stray) std::cout << "  " << zero::PrintableName(f) << "\n";
    }
    return 0;
  }
  if (cmd == "export") {
    if (pos.size() != 2) return Usage("export takes DIR OUT.safetensors");
    zero::ExportOptions o;
    o.tag = tag;
    o.dtype = dtype;
    o.optimizer_state = state;
    const zero::Status s = zero::ExportSafetensors(pos[0], pos[1], o);
    if (!s.ok()) return Fail(s);
    std::cout << "wrote " << pos[1] << "\n";
    return 0;
  }
  if (cmd == "reshard") {
    if (pos.size() != 2) return Usage("reshard takes DIR OUT");
    if (world == 0) return Usage("reshard needs --world M");
    const zero::Status s = zero::ReshardCheckpoint(pos[0], tag, pos[1], world, stage);
    if (!s.ok()) return Fail(s);
    std::cout << "wrote " << pos[1] << "/" << zero::LatestCheckpointTag(pos[1]).value_or("?") << " for " << world
              << " ranks\n";
    return 0;
  }
  if (cmd == "clean") {
    if (pos.size() != 1) return Usage("clean takes DIR");
    auto gone = zero::CleanCheckpoints(pos[0], {.dry_run = dry_run});
    if (!gone.ok()) return Fail(gone.status());
    for (const std::string& p : *gone)
      std::cout << (dry_run ? "would remove " : "removed ") << zero::PrintableName(p) << "\n";
    if (gone->empty()) std::cout << "nothing to remove in " << pos[0] << "\n";
    return 0;
  }
  return Usage("unknown command " + cmd);
}
