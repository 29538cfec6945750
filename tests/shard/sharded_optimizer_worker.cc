// zero_sharded_optimizer_worker: one rank of ShardedOptimizer's process test (under zero-run).
//
//   zero-run -n 3 -- zero_sharded_optimizer_worker --stage 2
//
// Trains tests/support/flat_mlp.h's C-style trainer on this rank's slice of the global batch through
// ShardedOptimizer for 50 steps, runs the trainer alone on the whole batch in-process as the reference, and prints
// "rank R: ok relative difference D" (exit 0 when D <= 1e-6) or "rank R: error ..." (exit 1).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "support/flat_mlp.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/sharded_optimizer.h"

int main(int argc, char** argv) {
  using namespace zero::testing::flat_mlp;
  int stage = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--stage") == 0) stage = std::atoi(argv[i + 1]);
  }
  auto comm = zero::Communicator::FromEnv(zero::Backend::kGloo);
  if (!comm.ok()) {
    std::printf("rank ?: error %s\n", comm.status().ToString().c_str());
    return 1;
  }
  const int rank = (*comm)->rank(), world = (*comm)->world_size();
  zero::Config cfg = zero::Config::Default();
  cfg.zero.stage = stage;
  cfg.train_micro_batch_size_per_gpu = 1;
  cfg.train_batch_size.reset();
  zero::OptimizerConfig o;
  o.type = "AdamW";
  o.lr = kLr;
  o.beta1 = kBeta1;
  o.beta2 = kBeta2;
  o.eps = kEps;
  o.weight_decay = kWd;
  cfg.optimizer = o;
  const int64_t cap = zero::ShardedOptimizer::Capacity(kNumel, world);
  std::vector<float> params(cap, 0.0f), grads(cap, 0.0f);
  InitParams(params.data());
  auto opt = zero::ShardedOptimizer::Create(
      cfg, std::move(*comm), {zero::FlatBuffers{params.data(), grads.data(), zero::DType::kF32, cap, kTensors}});
  if (!opt.ok()) {
    std::printf("rank %d: error %s\n", rank, opt.status().ToString().c_str());
    return 1;
  }
  const int per = kBatch / world;
  for (int t = 1; t <= kSteps; ++t) {
    ForwardBackward(params.data(), grads.data(), t, rank * per, (rank + 1) * per);
    auto r = (*opt)->Step();
    if (!r.ok()) {
      std::printf("rank %d: error %s\n", rank, r.status().ToString().c_str());
      return 1;
    }
  }
  std::vector<float> loss;
  const double d = RelativeDifference(params.data(), ReferenceRun(&loss));
  std::printf("rank %d: %s relative difference %.3g\n", rank, d <= 1e-6 ? "ok" : "error", d);
  return d <= 1e-6 ? 0 : 1;
}
