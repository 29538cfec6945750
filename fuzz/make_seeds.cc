// zero_fuzz_make_seeds OUT [CONFIG.json...]: writes the fuzz targets' seed inputs under OUT/<target>/ (the
// corpora in fuzz/corpus/ started from these; docs/internals/fuzzing.md):
//   config             each CONFIG file as it is, and the built-in default config
//   checkpoint_meta    the meta.json of checkpoints the Engine saved, and one with a rank description added
//   checkpoint_reader  the same checkpoints packed as that target reads them (flags, meta.json, rank files)
//   safetensors        zero-ckpt's exports of them (f32 and bf16)
//   store_protocol     event scripts of well-formed requests: SET, GET that waits and one that times out, ADD
//                      up to an overflow, an unknown command, a length over the limit
// The checkpoints: a few tiny units (fp32 at world 1; bf16 with a frozen unit and trainer state at world 2, as
// threads), trained one step, so every stream kind is there; and one unit of 300 000 elements whose sections
// span two checksum blocks, its rank file cut after the header (the target pads it back with zeros); and one saved
// with ZeRO++ qgZ's residuals (4 ranks as 2 hosts of 2).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/internal/format.h"
#include "comm/internal/store_protocol.h"
#include "nlohmann/json.hpp"
#include "zero/checkpoint.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/logging.h"
#include "zero/store.h"

namespace {

namespace fs = std::filesystem;

#define CHECK_OK(expr)                                                            \
  do {                                                                            \
    const absl::Status _s = (expr);                                               \
    if (!_s.ok()) {                                                               \
      std::fprintf(stderr, "make_seeds: %s: %s\n", #expr, _s.ToString().c_str()); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

std::string Slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
void Spit(const fs::path& p, const std::string& data) {
  fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << data;
  if (!f.good()) {
    std::fprintf(stderr, "make_seeds: cannot write %s\n", p.c_str());
    std::exit(1);
  }
}

struct Model {
  std::string config;  // JSON
  int world = 1;
  std::vector<std::pair<std::string, std::vector<zero::ParamSpec>>> units;
  std::vector<zero::ParamGroup> groups;
  std::vector<std::string> frozen;  // units the groups freeze: no Backward scope
  bool train = true;
  int per_host = 0;            // EngineOptions::local_world_size (0: the default)
  bool qgz_residuals = false;  // saved with SaveOptions::save_qgz_residuals (the config turns qgZ on)
};

// Trains `m` one step on m.world thread-ranks and saves it to dir (tag "seed").
void SaveCheckpoint(const Model& m, const std::string& dir) {
  zero::StatusOr<zero::Config> cfg = zero::Config::FromJsonString(m.config);
  CHECK_OK(cfg.status());
  auto store = zero::Store::Hash();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < m.world; ++rank) {
    threads.emplace_back([&, rank] {
      auto comm = zero::Communicator::CreateGloo(store, rank, m.world);
      CHECK_OK(comm.status());
      auto engine = zero::Engine::Create(*cfg, std::move(*comm),
                                         {.cpu_threads = 1, .local_world_size = m.per_host, .param_groups = m.groups});
      CHECK_OK(engine.status());
      zero::Engine& e = **engine;
      std::vector<zero::UnitId> ids;
      for (const auto& [name, params] : m.units) {
        auto id = e.AddUnit(name, params);
        CHECK_OK(id.status());
        ids.push_back(*id);
      }
      CHECK_OK(e.Finalize([](const std::string& unit, const zero::ParamSpec& p, float* v) {
        for (int64_t i = 0; i < p.numel(); ++i) v[i] = 0.01f * static_cast<float>((i * 7 + unit.size()) % 50) - 0.2f;
      }));
      if (m.train) {
        for (zero::UnitId id : ids) CHECK_OK(e.Forward(id).status());
        for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
          if (std::find(m.frozen.begin(), m.frozen.end(), m.units[*it].first) != m.frozen.end()) continue;
          auto scope = e.Backward(*it);
          CHECK_OK(scope.status());
          for (const auto& p : m.units[*it].second) {
            const zero::TensorView g = scope->Grad(p.name).value();
            for (int64_t i = 0; i < g.numel; ++i) {
              const float x = 0.001f * static_cast<float>(i % 13 + rank);
              if (g.dtype == zero::DType::kF32) {
                g.As<float>().value()[i] += x;
              } else {
                g.As<uint16_t>().value()[i] = zero::F32ToBF16(x);
              }
            }
          }
          CHECK_OK(scope->Close());
        }
        CHECK_OK(e.Step().status());
      }
      CHECK_OK(e.Save(dir, {.tag = "seed",
                            .trainer_state = {{"data_pos", absl::StrCat(rank * 100)}},
                            .save_qgz_residuals = m.qgz_residuals})
                   .status());
    });
  }
  for (auto& t : threads) t.join();
}

// The checkpoint_reader target's input: u8 flags | u16 meta length | meta.json | rank files.
std::string PackReader(uint8_t flags, const std::string& meta, const std::vector<std::string>& files) {
  std::string s;
  s.push_back(static_cast<char>(flags));
  s.push_back(static_cast<char>(meta.size() & 0xFF));
  s.push_back(static_cast<char>(meta.size() >> 8));
  s += meta;
  for (const auto& f : files) s += f;
  return s;
}

void CheckpointSeeds(const fs::path& out, const std::string& name, const Model& m, bool cut_rank_files) {
  const std::string dir = (fs::temp_directory_path() / ("zero-seeds-" + name)).string();
  fs::remove_all(dir);
  SaveCheckpoint(m, dir);
  const fs::path folder = fs::path(dir) / "seed";
  const std::string meta = Slurp(folder / "meta.json");
  if (meta.size() > 0xFFFF) {
    std::fprintf(stderr, "make_seeds: %s's meta.json is over 64 KiB\n", name.c_str());
    std::exit(1);
  }
  auto parsed = zero::ckpt::MetaFromJson(meta, "meta.json");
  CHECK_OK(parsed.status());
  std::vector<std::string> files;
  for (const auto& r : parsed->ranks) {
    std::string f = Slurp(folder / r.file);
    if (cut_rank_files) f.resize(zero::ckpt::kRankHeaderBytes);
    files.push_back(f);
  }
  Spit(out / "checkpoint_meta" / (name + ".json"), meta);
  // A rank's description beside it (the target parses a "rank_file" member as one).
  nlohmann::json j = nlohmann::json::parse(meta);
  j["rank_file"] = nlohmann::json::parse(zero::ckpt::RankFileMetaToJson(parsed->ranks.back()));
  Spit(out / "checkpoint_meta" / (name + "-rank-file.json"), j.dump());
  // As saved (no repair), and with every repair on (what a mutation then changes is checked past the checksums).
  if (!cut_rank_files) Spit(out / "checkpoint_reader" / (name + ".bin"), PackReader(0x00 | 0x40, meta, files));
  Spit(out / "checkpoint_reader" / (name + "-repaired.bin"), PackReader(0x0F | 0x90, meta, files));
  if (cut_rank_files) {
    fs::remove_all(dir);
    return;
  }
  for (zero::DType dt : {zero::DType::kF32, zero::DType::kBF16}) {
    const std::string st = (fs::path(dir) / "export.safetensors").string();
    CHECK_OK(zero::ExportSafetensors(dir, st, {.dtype = dt, .optimizer_state = dt == zero::DType::kF32}));
    Spit(out / "safetensors" / absl::StrCat(name, "-", std::string(zero::DTypeName(dt)), ".safetensors"), Slurp(st));
  }
  fs::remove_all(dir);
}

void StoreSeeds(const fs::path& out) {
  using namespace zero::internal;  // NOLINT(build/namespaces)
  // One event: bytes on connection c (in pieces of at most 255 bytes).
  auto bytes = [](int c, const std::string& b) {
    std::string s;
    for (size_t at = 0; at == 0 || at < b.size(); at += 255) {
      const std::string piece = b.substr(at, 255);
      s.push_back(static_cast<char>(c << 2 | 0));
      s.push_back(static_cast<char>(piece.size()));
      s += piece;
    }
    return s;
  };
  auto drain = [](int c) { return std::string(1, static_cast<char>(c << 2 | 3)); };
  auto close = [](int c) { return std::string(1, static_cast<char>(c << 2 | 1)); };
  auto wait = [](int log2_us) { return std::string{static_cast<char>(2), static_cast<char>(log2_us)}; };
  auto req = [](uint8_t cmd, const std::string& key, const std::string& payload) {
    return EncodeStoreRequest(cmd, key, payload);
  };
  // Rendezvous as Gloo does it over the store: ranks SET their addresses, GET each other's, ADD a barrier.
  std::string s = bytes(0, req(kStoreCmdSet, "rank0/addr", std::string(40, 'a'))) + drain(0) +
                  bytes(1, req(kStoreCmdGet, "rank0/addr", StoreI64Payload(30000))) + drain(1) +
                  bytes(1, req(kStoreCmdGet, "rank1/addr", StoreI64Payload(30000))) +
                  bytes(2, req(kStoreCmdGet, "rank1/addr", StoreI64Payload(-1))) +
                  bytes(1, req(kStoreCmdSet, "rank1/addr", std::string(300, 'b'))) + drain(1) + drain(2) +
                  bytes(0, req(kStoreCmdAdd, "barrier", StoreI64Payload(1))) +
                  bytes(1, req(kStoreCmdAdd, "barrier", StoreI64Payload(1))) + drain(0) + drain(1);
  Spit(out / "store_protocol" / "rendezvous.bin", s);
  // A GET that times out, one that waits forever, and the connection closing under it.
  s = bytes(0, req(kStoreCmdGet, "never", StoreI64Payload(5))) +
      bytes(1, req(kStoreCmdGet, "never", StoreI64Payload(0))) +
      bytes(3, req(kStoreCmdGet, "never", StoreI64Payload(-1))) + wait(12) + wait(13) + drain(0) + drain(1) + close(3) +
      bytes(2, req(kStoreCmdGet, "x", StoreI64Payload(INT64_MAX))) + wait(47) + drain(2);
  Spit(out / "store_protocol" / "timeouts.bin", s);
  // Counters to the edge of int64, write-once keys, an unknown command, a GET with a short payload.
  s = bytes(0, req(kStoreCmdAdd, "c", StoreI64Payload(INT64_MAX - 1))) +
      bytes(0, req(kStoreCmdAdd, "c", StoreI64Payload(1))) + bytes(0, req(kStoreCmdAdd, "c", StoreI64Payload(1))) +
      bytes(0, req(kStoreCmdAdd, "d", StoreI64Payload(INT64_MIN))) +
      bytes(0, req(kStoreCmdAdd, "d", StoreI64Payload(-1))) + bytes(1, req(kStoreCmdSet, "k", "v")) +
      bytes(1, req(kStoreCmdSet, "k", "w")) + bytes(1, req(7, "k", "")) + bytes(1, req(kStoreCmdGet, "k", "abc")) +
      drain(0) + drain(1);
  Spit(out / "store_protocol" / "edges.bin", s);
  // A request split across events, and a length over the limit, which drops the connection.
  const std::string r = req(kStoreCmdSet, "split", std::string(600, 'x'));
  std::string over = req(kStoreCmdSet, "", "");
  over[4] = 0x41;  // key_len 0x41000000 > 1 GiB
  s = bytes(0, r.substr(0, 3)) + bytes(0, r.substr(3, 100)) + bytes(0, r.substr(103)) + drain(0) +
      bytes(1, req(kStoreCmdGet, "k", StoreI64Payload(-1))) + bytes(1, over) + bytes(1, req(kStoreCmdSet, "k", "v"));
  Spit(out / "store_protocol" / "split-and-oversized.bin", s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: zero_fuzz_make_seeds OUT [CONFIG.json...]\n");
    return 2;
  }
  zero::SetLogLevel(zero::LogLevel::kError);
  const fs::path out = argv[1];
  for (int i = 2; i < argc; ++i) {
    Spit(out / "config" / fs::path(argv[i]).filename(), Slurp(argv[i]));
  }
  Spit(out / "config" / "default.json", zero::Config::Default().ToJson());

  const std::string adam = R"("optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.1}})";
  Model fp32{.config = absl::StrCat(R"({"train_micro_batch_size_per_gpu": 1, )", adam,
                                    R"(, "zero_optimization": {"stage": 1}})"),
             .world = 1,
             .units = {{"emb", {{"w", {4, 6}}}}, {"blk", {{"w", {5, 5}}, {"b", {5}}}}}};
  CheckpointSeeds(out, "fp32-world1", fp32, false);
  Model bf16{.config = absl::StrCat(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, )", adam,
                                    R"(, "zero_optimization": {"stage": 3}})"),
             .world = 2,
             .units = {{"base", {{"w", {8, 8}}}}, {"adapter", {{"a", {8, 2}}, {"b", {2, 8}}}}, {"head", {{"w", {3}}}}},
             .groups = {{.match = "base.*", .frozen = true}, {.match = "*.b", .weight_decay = 0.0, .lr_scale = 0.5}},
             .frozen = {"base"}};
  CheckpointSeeds(out, "bf16-world2-frozen", bf16, false);
  Model big{.config = absl::StrCat(R"({"train_micro_batch_size_per_gpu": 1, )", adam,
                                   R"(, "zero_optimization": {"stage": 2}})"),
            .world = 1,
            .units = {{"big", {{"w", {300, 1000}}}}},
            .train = false};
  CheckpointSeeds(out, "two-blocks", big, true);
  // ZeRO++ qgZ's residuals in the rank files (rank_state) and meta.json (qgz_residuals): 2 hosts of 2 ranks, so
  // both the first hop's and the host partials' are there.
  Model qgz{.config = absl::StrCat(R"({"train_micro_batch_size_per_gpu": 1, )", adam,
                                   R"(, "zero_optimization": {"stage": 2, "zero_quantized_gradients": true}})"),
            .world = 4,
            .units = {{"blk", {{"w", {16, 16}}, {"b", {16}}}}},
            .per_host = 2,
            .qgz_residuals = true};
  CheckpointSeeds(out, "qgz-world4", qgz, false);
  StoreSeeds(out);
  std::printf("make_seeds: wrote the seeds under %s\n", out.c_str());
  return 0;
}
