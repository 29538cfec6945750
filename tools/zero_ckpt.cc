// zero-ckpt: look into, check, export and reshard checkpoints that Engine::Save / ShardedOptimizer::Save wrote.
//
//   zero-ckpt inspect DIR [--tag T]          format, world size, stage, dtypes, step, units, files and sizes
//   zero-ckpt verify DIR [--tag T | --all]   every checksum and file; an incomplete or damaged checkpoint is named
//   zero-ckpt export DIR OUT.safetensors [--tag T] [--dtype f32|bf16|f16] [--optimizer-state]
//   zero-ckpt reshard DIR OUT --world M [--stage t] [--tag T]
//
// export streams (no more than one 16 MiB buffer whatever the model's size); reshard writes the checkpoint a
// run at M ranks (and stage t) would have saved, without running one. Exit 0 on success, 1 when the checkpoint
// is damaged, incomplete or absent (the error on stderr names the file and what is wrong), 2 on bad usage.
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
    "DIR holds `latest` and one folder per checkpoint; --tag picks a folder (default: the latest).\n";

int Usage(const std::string& why) {
  if (!why.empty()) std::cerr << "zero-ckpt: " << why << "\n";
  std::cerr << kUsage;
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
  if (argc < 3) return Usage("");
  const std::string cmd = argv[1];
  std::vector<std::string> pos;
  std::string tag;
  int world = 0, stage = -1;
  bool all = false, state = false;
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
      if (v == nullptr || !ParseInt(v, 1, 1 << 20, &world)) return Usage("--world needs a positive integer");
    } else if (a == "--stage") {
      const char* v = value();
      if (v == nullptr || !ParseInt(v, 0, 3, &stage)) return Usage("--stage needs 0, 1, 2 or 3");
    } else if (a == "--dtype") {
      const char* v = value();
      if (v == nullptr) return Usage("--dtype needs f32, bf16 or f16");
      auto d = zero::ParseDType(v);
      if (!d.ok()) return Usage(std::string("--dtype: ") + v + " is not f32, bf16 or f16");
      dtype = *d;
    } else if (a == "--all") {
      all = true;
    } else if (a == "--optimizer-state") {
      state = true;
    } else if (a.size() > 1 && a[0] == '-') {
      return Usage("unknown option " + a);
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
  return Usage("unknown command " + cmd);
}
