// zero_initial_values_worker: one rank of the initial-value agreement test as a process (under zero-run).
//
//   zero-run -n 3 -- zero_initial_values_worker --stage 3 --sync rank0|require|trust
//
// Registers one unit with a 1,024-element parameter whose initializer rank 1 offsets by 1,000 (a forgotten
// seed), finalizes, gathers the parameter and prints one line: "rank R: ok hash H first F last L" or
// "rank R: error: MSG" (exit 1).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/engine.h"

int main(int argc, char** argv) {
  int stage = 3;
  std::string sync = "rank0";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--stage") == 0) stage = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sync") == 0) sync = argv[i + 1];
  }
  auto comm = zero::Communicator::FromEnv(zero::Backend::kGloo);
  if (!comm.ok()) {
    std::printf("rank ?: error: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  const int rank = (*comm)->rank();
  zero::Config cfg = zero::Config::Default();
  cfg.zero.stage = stage;
  cfg.zero.stage3_param_persistence_threshold = 0;
  cfg.train_micro_batch_size_per_gpu = 1;
  cfg.train_batch_size.reset();
  zero::OptimizerConfig o;
  o.type = "AdamW";
  cfg.optimizer = o;
  zero::EngineOptions opts;
  opts.initial_value_sync = sync == "require" ? zero::InitialValueSync::kRequireEqual
                            : sync == "trust" ? zero::InitialValueSync::kTrust
                                              : zero::InitialValueSync::kFromRank0;
  auto fail = [rank](const zero::Status& s) {
    std::printf("rank %d: error: %s\n", rank, s.ToString().c_str());
    std::fflush(stdout);
    return 1;
  };
  auto engine = zero::Engine::Create(cfg, std::move(*comm), opts);
  if (!engine.ok()) return fail(engine.status());
  auto unit = (*engine)->AddUnit("layer", {{"w", {32, 32}}});
  if (!unit.ok()) return fail(unit.status());
  zero::Status s = (*engine)->Finalize([rank](const std::string&, const zero::ParamSpec& p, float* v) {
    for (int64_t i = 0; i < p.numel(); ++i) v[i] = static_cast<float>(i) + (rank == 1 ? 1000.0f : 0.0f);
  });
  if (!s.ok()) return fail(s);
  auto w = (*engine)->GatherParam(*unit, "w");
  if (!w.ok()) return fail(w.status());
  uint64_t h = 1469598103934665603ull;
  for (float f : *w) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    h = (h ^ b) * 1099511628211ull;
  }
  std::printf("rank %d: ok hash %016llx first %g last %g\n", rank, static_cast<unsigned long long>(h), w->front(),
              w->back());
  return 0;
}
