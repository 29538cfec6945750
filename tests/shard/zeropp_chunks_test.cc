// ZeRO++'s quantized collectives in chunks, crossed with the features users combine them with. A unit above
// allgather_bucket_size is gathered (qwZ) and one above reduce_bucket_size reduced (qgZ) in chunks of whole blocks,
// which by design give the whole collectives' bits (docs/internals/design.md, "In chunks"); qwz_test and qgz_test
// prove it for each feature on its own. The ZeRO++ failures DeepSpeed's users report are combinations (hpZ with CPU
// offload stuck at a loss of 11.93, DeepSpeed issue #6926; hpZ hanging on 2 x 8 GPUs, #5030), so here the four
// units of the synthetic trainer (two above the small buckets, one below, one near them: the reducer's queue mixes
// chunked and whole units) train with ZeRO++ under each combination the config accepts, with small buckets and
// with the default ones, and must give the same steps (the gradient norm exactly) and the same parameters, bit for
// bit, on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "support/engine_helpers.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/advanced/engine_stats.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/sharded_optimizer.h"

namespace zero {
namespace {

struct Combination {
  std::string name;
  int world = 4, per_host = 2;
  int stage = 3;
  bool qwz = true, qgz = true;
  int hpz = 2, bits = 8, ga = 1;
  bool loco = true, int8_residuals = false;
  bool bf16 = false, fp16 = false;
  bool offload_optimizer = false, offload_param = false;
  int mics = 0;
};

Config ConfigOf(const Combination& c, bool small_buckets) {
  Config cfg = testing::TrainConfig(c.stage, 1, c.ga);
  testing::SetQuantized(cfg, c.qwz ? 32 : 0, c.qgz ? c.bits : 0, /*qgz_block=*/32);
  cfg.zero.zero_quantized_gradients_error_feedback = c.loco;
  if (c.int8_residuals) cfg.zero.zero_quantized_gradients_error_feedback_dtype = QgzResidualDType::kInt8;
  cfg.zero.zeropp_loco_reset_t = 3;  // a reset inside the run: counted per reduction, not per chunk
  cfg.zero.zero_hpz_partition_size = c.hpz;
  cfg.zero.mics_shard_size = c.mics;
  cfg.bf16.enabled = c.bf16;
  cfg.fp16.enabled = c.fp16;
  cfg.fp16.initial_scale_power = 4;  // the synthetic gradients are not scaled: keep the unscaled ones normal
  if (c.offload_optimizer) cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
  if (c.offload_param) cfg.zero.offload_param.device = OffloadDevice::kCpu;
  if (small_buckets) {
    // Units a (722 elements) and d (2,112) go in chunks at every world here, c (101) whole, b (437) either.
    cfg.zero.allgather_bucket_size = 256;
    cfg.zero.reduce_bucket_size = 256;
  }
  return cfg;
}

struct Trained {
  std::vector<testing::SyntheticTrace> traces;
  int64_t qwz_chunk_gathers = -1, qgz_chunk_reductions = -1;
};

Trained Train(const Combination& c, bool small_buckets) {
  const Config cfg = ConfigOf(c, small_buckets);
  Trained run;
  run.traces.resize(static_cast<size_t>(c.world));
  testing::RunRanks(c.world, [&](Communicator& comm, int rank) {
    EngineOptions o;
    o.local_world_size = c.per_host;
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, testing::Borrow(comm), o));
    ASSERT_NO_FATAL_FAILURE(
        testing::TrainSynthetic(*e, /*steps=*/5, c.ga, testing::HostViewIo(), &run.traces[static_cast<size_t>(rank)]));
    if (rank == 0) {
      run.qwz_chunk_gathers = advanced::Stats(*e).qwz_chunk_gathers;
      run.qgz_chunk_reductions = advanced::Stats(*e).qgz_chunk_reductions;
    }
  });
  return run;
}

TEST(ZeroppChunks, EveryCombinationTrainsTheWholeCollectivesBits) {
  const std::vector<Combination> combinations = {
      {.name = "qwZ + hpZ + qgZ, f32"},
      {.name = "bf16", .bf16 = true},
      {.name = "fp16 (dynamic loss scale)", .fp16 = true},
      {.name = "optimizer offloaded", .offload_optimizer = true},
      {.name = "parameters and optimizer offloaded, no hpZ",
       .hpz = 1,
       .offload_optimizer = true,
       .offload_param = true},
      {.name = "two micro-steps accumulated", .ga = 2},
      {.name = "hybrid sharding (groups of 2), no hpZ", .hpz = 1, .mics = 2},
      {.name = "int4, LoCo off", .bits = 4, .loco = false},
      {.name = "LoCo's residuals in int8 blocks", .int8_residuals = true},
      {.name = "bf16, int4, residuals in int8 blocks", .bits = 4, .int8_residuals = true, .bf16 = true},
      {.name = "one host: qgZ in one hop", .per_host = 4, .hpz = 4},
      {.name = "three hosts of 2", .world = 6},
      {.name = "one rank (what the CUDA engine's test runs)", .world = 1, .per_host = 1, .hpz = 1},
      {.name = "one rank, stage 2, int4 qgZ alone, residuals in int8 blocks",
       .world = 1,
       .per_host = 1,
       .stage = 2,
       .qwz = false,
       .hpz = 1,
       .bits = 4,
       .int8_residuals = true},
      {.name = "stage 2, qgZ alone, optimizer offloaded",
       .stage = 2,
       .qwz = false,
       .hpz = 1,
       .offload_optimizer = true},
  };
  for (const Combination& c : combinations) {
    SCOPED_TRACE(absl::StrCat(c.name, " (world ", c.world, ", ", c.per_host, " per host)"));
    const Trained whole = Train(c, /*small_buckets=*/false);
    const Trained chunked = Train(c, /*small_buckets=*/true);
    // The default buckets hold every unit whole; the small ones put units in chunks, on both paths asked for.
    EXPECT_EQ(whole.qwz_chunk_gathers, 0);
    EXPECT_EQ(whole.qgz_chunk_reductions, 0);
    if (c.qwz) {
      EXPECT_GT(chunked.qwz_chunk_gathers, 0);
    }
    if (c.qgz) {
      EXPECT_GT(chunked.qgz_chunk_reductions, 0);
    }
    for (int r = 0; r < c.world; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r));
      const testing::SyntheticTrace& a = whole.traces[static_cast<size_t>(r)];
      const testing::SyntheticTrace& b = chunked.traces[static_cast<size_t>(r)];
      ASSERT_EQ(a.steps.size(), 5u);
      testing::ExpectSameSteps(a.steps, b.steps);
      testing::ExpectSameParams(a, b);
      // Training happened: no step skipped throughout, and every unit moved.
      for (const StepResult& s : a.steps) EXPECT_FALSE(s.skipped) << "step " << s.step;
      for (const auto& [name, values] : a.params) EXPECT_GT(testing::MovedElements(name, values), 0u) << name;
    }
  }
}

// A C-style trainer's one flat buffer (ShardedOptimizer, stages 1 and 2, AdamW): reduce_bucket_size below its
// shard puts qgZ's reduction of it in chunks, which train the whole reduction's parameters bit for bit, LoCo on,
// in one hop and in two. (The trainer's buffers are read here after every step: the engine writes into them.)
TEST(ZeroppChunks, AFlatBufferInChunksTrainsTheWholeReductionsBits) {
  constexpr int kWorld = 4;
  constexpr int64_t kFlat = 6000;  // two tensors, the second a bias, padded to the capacity
  for (int stage : {1, 2}) {
    for (int per_host : {4, 2}) {
      SCOPED_TRACE(absl::StrCat("stage ", stage, ", ", per_host, " ranks per host"));
      auto train = [&](int64_t bucket) {
        Config cfg = testing::TrainConfig(stage, 1);
        testing::SetQuantized(cfg, 0, 8, /*qgz_block=*/64);
        cfg.zero.zeropp_loco_reset_t = 3;
        if (bucket > 0) cfg.zero.reduce_bucket_size = bucket;
        std::vector<std::vector<float>> out(kWorld);
        testing::RunRanks(kWorld, [&](Communicator& comm, int rank) {
          const int64_t cap = ShardedOptimizer::Capacity(kFlat, kWorld);
          std::vector<float> params(static_cast<size_t>(cap), 0.0f), grads(static_cast<size_t>(cap), 0.0f);
          for (int64_t i = 0; i < kFlat; ++i) params[i] = 0.01f * std::cos(0.11f * static_cast<float>(i));
          FlatBuffers flat{.params = params.data(),
                           .grads = grads.data(),
                           .capacity = cap,
                           .tensors = {{"w", {50, 118}}, {"b", {100}}}};
          EngineOptions o;
          o.local_world_size = per_host;
          ASSERT_OK_AND_ASSIGN(auto opt, ShardedOptimizer::Create(cfg, testing::Borrow(comm), {flat}, o));
          for (int step = 0; step < 5; ++step) {
            for (int64_t i = 0; i < kFlat; ++i) {
              grads[i] = 0.01f * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(step + 3 * rank)) +
                         0.1f * params[i];
            }
            ASSERT_OK_AND_ASSIGN(StepResult r, opt->Step());
            EXPECT_FALSE(r.skipped);
          }
          out[static_cast<size_t>(rank)].assign(params.begin(), params.begin() + kFlat);
        });
        return out;
      };
      const std::vector<std::vector<float>> whole = train(0), chunked = train(512);
      for (int r = 0; r < kWorld; ++r) {
        ASSERT_EQ(whole[r].size(), static_cast<size_t>(kFlat));
        ASSERT_EQ(chunked[r].size(), whole[r].size());
        size_t differ = 0, moved = 0;
        for (int64_t i = 0; i < kFlat; ++i) {
          differ += std::memcmp(&whole[r][i], &chunked[r][i], 4) != 0;
          moved += whole[r][i] != 0.01f * std::cos(0.11f * static_cast<float>(i));
        }
        EXPECT_EQ(differ, 0u) << "rank " << r << ": of " << kFlat;
        EXPECT_GT(moved, static_cast<size_t>(kFlat / 2)) << "rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace zero
