// ShardedOptimizer (zero/sharded_optimizer.h): ZeRO 0-2 over a C-style trainer's own flat buffers. The trainer
// here is written the classic way — one params buffer, one grads buffer, tensors as slices, its own AdamW loop —
// and the wrapper at stages 0-2 × worlds 1-4 (each rank the mean loss of its slice of the same global batch) must
// give the parameters of the trainer's own single-process AdamW on the whole batch; the bytes each rank holds are
// the formulas', without the trainer's buffers.
#include "zero/sharded_optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "support/engine_helpers.h"
#include "support/flat_mlp.h"
#include "support/multi_rank.h"
#include "support/tolerance.h"
#include "support/world_stage.h"

namespace zero {
namespace {

using namespace testing::flat_mlp;  // the trainer under test

Config WrapperConfig(int stage) {
  Config c = testing::TrainConfig(stage, /*micro=*/1, /*ga=*/1, kLr, /*clip=*/0.0);
  c.optimizer->beta1 = kBeta1;
  c.optimizer->beta2 = kBeta2;
  c.optimizer->eps = kEps;
  c.optimizer->weight_decay = kWd;
  c.zero.overlap_comm = false;
  return c;
}

using Case = testing::WorldStage;

class ShardedOptimizerTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShardedOptimizerTest, MatchesTheTrainersOwnAdamWOnTheWholeBatch) {
  const auto [world, stage] = GetParam();
  // The reference: one process, the whole global batch, the trainer's own AdamW.
  std::vector<float> ref_loss;
  const std::vector<float> ref = ReferenceRun(&ref_loss);
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    const int64_t cap = ShardedOptimizer::Capacity(kNumel, world);
    std::vector<float> params(cap, 0.0f), grads(cap, 0.0f);
    InitParams(params.data());
    FlatBuffers flat{params.data(), grads.data(), DType::kF32, cap, kTensors, "mlp"};
    ASSERT_OK_AND_ASSIGN(auto opt, ShardedOptimizer::Create(WrapperConfig(stage), testing::Borrow(comm), {flat}));
    const int per = kBatch / world;
    for (int t = 1; t <= kSteps; ++t) {
      ForwardBackward(params.data(), grads.data(), t, rank * per, (rank + 1) * per);
      ASSERT_OK_AND_ASSIGN(StepResult r, opt->Step());
      EXPECT_EQ(r.step, t);
    }
    // The trainer's own buffer holds the result, on every rank.
    // Relative in norm (‖Δ‖ / ‖p‖), as the issue's "1e-6 relative" reads: elementwise, a parameter that AdamW
    // drives through zero has no scale of its own. Measured at most 4.6e-7 (world 3 and 4, here and under zero-run),
    // the same under every SIMD target and OpenBLAS kernel (the trainer calls no BLAS; the host kernels agree bit
    // for bit on every target): the issue's bound leaves 2x (bench/results/cpu-targets.md).
    double diff2 = 0, norm2 = 0, worst_abs = 0;
    for (int64_t i = 0; i < kNumel; ++i) {
      const double d = static_cast<double>(params[i]) - ref[i];
      diff2 += d * d;
      norm2 += static_cast<double>(ref[i]) * ref[i];
      worst_abs = std::max(worst_abs, std::abs(d));
    }
    testing::Deviation rel("params, relative in norm", 1e-6);
    EXPECT_TRUE(rel.Add(std::sqrt(diff2 / norm2)))
        << "relative difference to the single-process AdamW after " << kSteps << " steps: " << rel.worst()
        << " (largest element difference " << worst_abs << ")";
    if (world == 1) {
      EXPECT_EQ(diff2, 0.0) << "world 1 reduces nothing: bit for bit the trainer's own AdamW";
    }
    // Model state beyond the trainer's buffers: Adam's 8 bytes per element of this rank's shard (fp32: the
    // trainer's buffer is the master; stage 0 keeps the state in full). No gradient shard, at stage 2 either: the
    // reduced gradient lands in the trainer's own buffer, which exists anyway (PlanPolicy::GradInSlice).
    const MemoryReport mem = opt->memory_report();
    const int64_t shard = cap / world;
    const int64_t range = stage == 0 ? cap : shard;
    EXPECT_EQ(mem.Get(MemTier::kDevice, MemTag::kOptimizer).current, 8 * range);
    EXPECT_EQ(mem.Get(MemTier::kDevice, MemTag::kMaster).current, 0);
    EXPECT_EQ(mem.Get(MemTier::kDevice, MemTag::kParams).current, 0);  // the trainer's, reported apart:
    EXPECT_EQ(opt->trainer_bytes(), 2 * 4 * cap);
    EXPECT_EQ(mem.Get(MemTier::kDevice, MemTag::kGrads).peak, 0);
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShardedOptimizerTest,
                         ::testing::Values(Case{1, 0}, Case{1, 1}, Case{1, 2}, Case{2, 0}, Case{2, 1}, Case{2, 2},
                                           Case{3, 0}, Case{3, 1}, Case{3, 2}, Case{4, 0}, Case{4, 1}, Case{4, 2}),
                         testing::WorldStageName);

// 16-bit parameters in the trainer's buffer: the wrapper keeps the fp32 master (4 bytes per shard element) and
// writes the rounded values back; the loss follows the fp32 run's.
TEST(ShardedOptimizerBf16, KeepsAnFp32MasterOfTheShard) {
  const int world = 2;
  std::vector<float> ref_loss;  // full-batch loss before each step
  ReferenceRun(&ref_loss);
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    const int64_t cap = ShardedOptimizer::Capacity(kNumel, world);
    std::vector<uint16_t> params(cap, 0), grads(cap, 0);
    std::vector<float> p32(kNumel), g32(kNumel), scratch(kNumel), loss(kSteps);
    InitParams(p32.data());
    ConvertBuffer(p32.data(), DType::kF32, params.data(), DType::kBF16, kNumel);
    Config cfg = WrapperConfig(2);
    cfg.bf16.enabled = true;
    FlatBuffers flat{params.data(), grads.data(), DType::kBF16, cap, kTensors, "mlp"};
    ASSERT_OK_AND_ASSIGN(auto opt, ShardedOptimizer::Create(cfg, testing::Borrow(comm), {flat}));
    const int per = kBatch / world;
    for (int t = 1; t <= kSteps; ++t) {
      ConvertBuffer(params.data(), DType::kBF16, p32.data(), DType::kF32, kNumel);  // the trainer computes in f32
      loss[t - 1] = ForwardBackward(p32.data(), scratch.data(), t, 0, kBatch);      // the whole batch, for the record
      ForwardBackward(p32.data(), g32.data(), t, rank * per, (rank + 1) * per);
      ConvertBuffer(g32.data(), DType::kF32, grads.data(), DType::kBF16, kNumel);
      ASSERT_OK(opt->Step());
    }
    const MemoryReport mem = opt->memory_report();
    EXPECT_EQ(mem.Get(MemTier::kDevice, MemTag::kMaster).current, 4 * cap / world);
    EXPECT_EQ(mem.Get(MemTier::kDevice, MemTag::kOptimizer).current, 8 * cap / world);
    // The mixed-precision tests' tolerance (tests/shard/mixed_precision_engine_test.cc): 10-step means of the
    // loss within 2 % of the fp32 run's. Measured 0.12 % under every SIMD target and OpenBLAS kernel.
    testing::Deviation mean("10-step mean loss vs fp32", 0.02);
    for (int w = 0; w + 10 <= kSteps; w += 10) {
      double mb = 0, mf = 0;
      for (int t = w; t < w + 10; ++t) {
        mb += loss[t] / 10;
        mf += ref_loss[t] / 10;
      }
      EXPECT_TRUE(mean.Add(std::abs(mb - mf) / mf))
          << "steps " << w + 1 << ".." << w + 10 << ": " << mb << " vs " << mf;
    }
    EXPECT_LT(loss.back(), 0.5 * loss.front());  // it trained
  });
}

// Gradients handed over during backward (GradientsReady) reduce while the trainer computes the rest, and give the
// parameters of a run that hands nothing over, bit for bit. Two buffer pairs (two "layers"); the trainer finishes
// layer 1's gradient first, as backward does.
TEST(ShardedOptimizerOverlap, GradientsReadyStartsTheReductionAndChangesNothing) {
  const int world = 3;
  const std::vector<ParamSpec> layer = {{"w", {29, 11}}, {"b", {11}}};
  const int64_t n = 29 * 11 + 11;
  for (int stage = 0; stage <= 2; ++stage) {
    std::vector<std::vector<float>> final_params(2);
    for (bool hand_over : {false, true}) {
      testing::RunRanks(world, [&](Communicator& comm, int rank) {
        const int64_t cap = ShardedOptimizer::Capacity(n, world);
        std::vector<std::vector<float>> p(2, std::vector<float>(cap, 0.0f)), g(2, std::vector<float>(cap, 0.0f));
        for (int l = 0; l < 2; ++l) {
          for (int64_t i = 0; i < n; ++i) p[l][i] = 0.1f * std::sin(0.3f * static_cast<float>(i) + l);
        }
        Config cfg = WrapperConfig(stage);
        cfg.zero.overlap_comm = true;
        ASSERT_OK_AND_ASSIGN(
            auto opt, ShardedOptimizer::Create(cfg, testing::Borrow(comm),
                                               {FlatBuffers{p[0].data(), g[0].data(), DType::kF32, cap, layer, "l0"},
                                                FlatBuffers{p[1].data(), g[1].data(), DType::kF32, cap, layer, "l1"}}));
        auto grad = [&](int l, int step) {
          for (int64_t i = 0; i < n; ++i) {
            g[l][i] = 0.05f * std::cos(0.7f * static_cast<float>(i) + step + rank) + 0.2f * p[l][i];
          }
        };
        for (int step = 1; step <= 4; ++step) {
          grad(1, step);
          if (hand_over) {
            // This rank's own gradient, read before it is handed over: from then on the reduction may run at any
            // moment (a copy taken after GradientsReady could already hold the average, and this check then failed
            // under ASan's timing, once in a CI run).
            const std::vector<float> before(g[1].begin(), g[1].begin() + n);
            ASSERT_OK(opt->GradientsReady(1));
            EXPECT_THAT(opt->GradientsReady(1), testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                                                  ::testing::HasSubstr("already handed over")));
            if (stage == 0 && step == 1) {
              // Ops run in issue order: once a barrier issued after it completes, the average all-reduce of
              // layer 1's gradient has run, before Step was called.
              ASSERT_OK(comm.Barrier().Wait());
              size_t changed = 0;
              for (int64_t i = 0; i < n; ++i) changed += g[1][i] != before[i];
              EXPECT_GT(changed, 0u) << "the reduction had not run by the time of the barrier";
            }
          }
          grad(0, step);
          ASSERT_OK(opt->Step());
        }
        if (rank == 0) {
          std::vector<float>& out = final_params[hand_over];
          out.assign(p[0].begin(), p[0].begin() + n);
          out.insert(out.end(), p[1].begin(), p[1].begin() + n);
        }
      });
    }
    EXPECT_EQ(final_params[0], final_params[1]) << "stage " << stage;
  }
}

// Offload of master and state, and clipping, work as in the Engine: offloading the optimizer (stages 1-2) gives
// the same parameters bit for bit, with the optimizer state in the host tier; a clipped run differs from an
// unclipped one and reports the norm before clipping.
TEST(ShardedOptimizerOffload, OffloadIsBitwiseAndClippingApplies) {
  const int world = 2;
  for (int stage : {1, 2}) {
    std::vector<std::vector<float>> finals(3);
    for (int mode = 0; mode < 3; ++mode) {  // 0 plain, 1 offload_optimizer, 2 clipping at 0.01
      testing::RunRanks(world, [&](Communicator& comm, int rank) {
        const int64_t cap = ShardedOptimizer::Capacity(kNumel, world);
        std::vector<float> params(cap, 0.0f), grads(cap, 0.0f);
        InitParams(params.data());
        Config cfg = WrapperConfig(stage);
        if (mode == 1) cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
        if (mode == 2) cfg.gradient_clipping = 0.01;
        ASSERT_OK_AND_ASSIGN(auto opt, ShardedOptimizer::Create(cfg, testing::Borrow(comm),
                                                                {FlatBuffers{params.data(), grads.data(), DType::kF32,
                                                                             cap, kTensors, "mlp"}}));
        const int per = kBatch / world;
        for (int t = 1; t <= 10; ++t) {
          ForwardBackward(params.data(), grads.data(), t, rank * per, (rank + 1) * per);
          ASSERT_OK_AND_ASSIGN(StepResult r, opt->Step());
          if (mode == 2) {
            EXPECT_GT(r.grad_norm, 0.01);  // the norm before clipping
          }
        }
        const MemoryReport m = opt->memory_report();
        if (mode == 1) {
          EXPECT_EQ(m.Get(MemTier::kHost, MemTag::kOptimizer).current, 8 * cap / world);
          EXPECT_EQ(m.Get(MemTier::kDevice, MemTag::kOptimizer).current, 0);
        }
        if (rank == 0) finals[mode].assign(params.begin(), params.begin() + kNumel);
      });
    }
    EXPECT_EQ(finals[0], finals[1]) << "stage " << stage << ": offload changed the parameters";
    EXPECT_NE(finals[0], finals[2]) << "stage " << stage << ": clipping changed nothing";
  }
}

#ifdef ZERO_RUN_PATH
// Processes under zero-run: each rank a process on its slice of the batch, against the trainer alone (the
// worker computes the reference itself), within 1e-6 relative after 50 steps at stages 0-2.
TEST(ShardedOptimizerProcesses, MatchTheTrainersOwnAdamWUnderZeroRun) {
  for (int stage = 0; stage <= 2; ++stage) {
    const std::string cmd =
        absl::StrCat(ZERO_RUN_PATH, " -n 3 -- ", ZERO_SHARDED_OPTIMIZER_WORKER, " --stage ", stage, " 2>&1");
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[512];
    while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
    EXPECT_EQ(::pclose(p), 0) << out;
    testing::Deviation rel(absl::StrCat("stage ", stage, " params, relative in norm (the worker's bound)"), 1e-6);
    for (int r = 0; r < 3; ++r) {
      const size_t at = out.find(absl::StrCat("rank ", r, ": ok relative difference "));
      EXPECT_NE(at, std::string::npos) << "stage " << stage << ":\n" << out;
      if (at != std::string::npos) rel.Add(std::atof(out.c_str() + out.find("difference ", at) + 11));
    }
  }
}
#endif  // ZERO_RUN_PATH

// The trainer's own learning rate: Step({.lr = x}) equals a constant schedule of x.
TEST(ShardedOptimizerLr, StepTakesTheTrainersLearningRate) {
  std::vector<float> a(kNumel), b(kNumel);
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    for (int pass = 0; pass < 2; ++pass) {
      const int64_t cap = ShardedOptimizer::Capacity(kNumel, 2);
      std::vector<float> params(cap, 0.0f), grads(cap, 0.0f);
      InitParams(params.data());
      Config cfg = WrapperConfig(1);
      if (pass == 1) cfg.optimizer->lr = 3e-3;
      ASSERT_OK_AND_ASSIGN(auto opt, ShardedOptimizer::Create(cfg, testing::Borrow(comm),
                                                              {FlatBuffers{params.data(), grads.data(), DType::kF32,
                                                                           cap, kTensors, "mlp"}}));
      for (int t = 1; t <= 5; ++t) {
        ForwardBackward(params.data(), grads.data(), t, rank * 12, (rank + 1) * 12);
        StepOptions so;
        if (pass == 0) so.lr = 6e-3, so.lr_scale = 0.5;
        ASSERT_OK_AND_ASSIGN(StepResult r, opt->Step(so));
        EXPECT_DOUBLE_EQ(r.lr, 3e-3);
      }
      if (rank == 0) std::copy(params.begin(), params.begin() + kNumel, (pass == 0 ? a : b).begin());
    }
  });
  EXPECT_EQ(a, b);
}

// elastic_batch keep_micro with linear scaling, written for 4 ranks and run at 2: every step's learning rate is
// half the configured one, and the parameters are those of the same run configured at half the rate.
TEST(ShardedOptimizerLr, KeepMicroScalesTheLearningRateWithTheWorld) {
  std::vector<float> a(kNumel), b(kNumel);
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    for (int pass = 0; pass < 2; ++pass) {
      const int64_t cap = ShardedOptimizer::Capacity(kNumel, 2);
      std::vector<float> params(cap, 0.0f), grads(cap, 0.0f);
      InitParams(params.data());
      Config cfg = WrapperConfig(1);
      if (pass == 0) {
        cfg.optimizer->lr = 6e-3;
        ASSERT_OK(cfg.Set("elastic_batch.policy", R"("keep_micro")"));
        ASSERT_OK(cfg.Set("elastic_batch.reference_world_size", "4"));
        ASSERT_OK(cfg.Set("elastic_batch.lr_scaling", R"("linear")"));
      } else {
        cfg.optimizer->lr = 3e-3;
      }
      ASSERT_OK_AND_ASSIGN(auto opt, ShardedOptimizer::Create(cfg, testing::Borrow(comm),
                                                              {FlatBuffers{params.data(), grads.data(), DType::kF32,
                                                                           cap, kTensors, "mlp"}}));
      for (int t = 1; t <= 5; ++t) {
        ForwardBackward(params.data(), grads.data(), t, rank * 12, (rank + 1) * 12);
        ASSERT_OK_AND_ASSIGN(StepResult r, opt->Step());
        EXPECT_DOUBLE_EQ(r.lr, 3e-3);
      }
      if (rank == 0) std::copy(params.begin(), params.begin() + kNumel, (pass == 0 ? a : b).begin());
    }
  });
  EXPECT_EQ(a, b);
}

// The header's contract: after Step the trainer's gradient buffer is all zeros, padding included, at every stage
// and with 16-bit buffers (Step reduced in it and cleared it for the next backward; torch's step() would not).
TEST(ShardedOptimizerContract, StepLeavesTheGradientBufferZero) {
  for (int stage : {0, 1, 2}) {
    for (bool bf16 : {false, true}) {
      testing::RunRanks(3, [&](Communicator& comm, int rank) {
        const int64_t cap = ShardedOptimizer::Capacity(kNumel, 3);
        std::vector<float> p32(kNumel), g32(kNumel);
        InitParams(p32.data());
        Config cfg = WrapperConfig(stage);
        cfg.bf16.enabled = bf16;
        const DType dt = bf16 ? DType::kBF16 : DType::kF32;
        std::vector<char> params(cap * DTypeSize(dt)), grads(cap * DTypeSize(dt));
        ConvertBuffer(p32.data(), DType::kF32, params.data(), dt, kNumel);
        ASSERT_OK_AND_ASSIGN(
            auto opt, ShardedOptimizer::Create(cfg, testing::Borrow(comm),
                                               {FlatBuffers{params.data(), grads.data(), dt, cap, kTensors, "mlp"}}));
        for (int t = 1; t <= 2; ++t) {
          ForwardBackward(p32.data(), g32.data(), t, rank * 4, rank * 4 + 4);
          ConvertBuffer(g32.data(), DType::kF32, grads.data(), dt, kNumel);
          ASSERT_OK_AND_ASSIGN(StepResult r, opt->Step());
          EXPECT_GT(r.grad_norm, 0.0);
          EXPECT_EQ(std::count(grads.begin(), grads.end(), 0), static_cast<long>(grads.size()))
              << "stage " << stage << (bf16 ? " bf16" : " fp32") << " step " << t;
          ConvertBuffer(params.data(), dt, p32.data(), DType::kF32, kNumel);
        }
      });
    }
  }
}

TEST(ShardedOptimizerErrors, StageThreeCapacityAndDtypeAreNamed) {
  testing::RunRanks(2, [&](Communicator& comm, int) {
    std::vector<float> params(4096), grads(4096);
    EXPECT_THAT(ShardedOptimizer::Create(WrapperConfig(3), testing::Borrow(comm),
                                         {FlatBuffers{params.data(), grads.data(), DType::kF32, 4096, kTensors}}),
                testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("Engine's scoped API")));
    EXPECT_THAT(ShardedOptimizer::Create(WrapperConfig(1), testing::Borrow(comm),
                                         {FlatBuffers{params.data(), grads.data(), DType::kF32, kNumel, kTensors}}),
                testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                  ::testing::HasSubstr(absl::StrCat("capacity ", kNumel, " elements"))));
    EXPECT_THAT(ShardedOptimizer::Create(WrapperConfig(1), testing::Borrow(comm),
                                         {FlatBuffers{params.data(), grads.data(), DType::kBF16, 4096, kTensors}}),
                testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("the buffers are bf16")));
  });
}

}  // namespace
}  // namespace zero

namespace zero {
namespace {

// Hybrid sharding applies to the trainer's own buffers too: at world 4 in groups of 2 (mics_shard_size), stages 1
// and 2 give the single-process AdamW's parameters, each rank holding the optimizer state of a world of 2.
TEST(ShardedOptimizerHybrid, GroupsOfTwoMatchTheTrainersOwnAdamW) {
  constexpr int kWorld = 4, kGroup = 2;
  std::vector<float> ref_loss;
  const std::vector<float> ref = ReferenceRun(&ref_loss);
  for (int stage : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    testing::RunRanks(kWorld, [&](Communicator& comm, int rank) {
      const int64_t cap = ShardedOptimizer::Capacity(kNumel, kWorld);
      std::vector<float> params(cap, 0.0f), grads(cap, 0.0f);
      InitParams(params.data());
      FlatBuffers flat{params.data(), grads.data(), DType::kF32, cap, kTensors, "mlp"};
      Config cfg = WrapperConfig(stage);
      cfg.zero.mics_shard_size = kGroup;
      ASSERT_OK_AND_ASSIGN(auto opt, ShardedOptimizer::Create(cfg, testing::Borrow(comm), {flat}));
      const int per = kBatch / kWorld;
      for (int t = 1; t <= kSteps; ++t) {
        ForwardBackward(params.data(), grads.data(), t, rank * per, (rank + 1) * per);
        ASSERT_OK(opt->Step().status());
      }
      double diff2 = 0, norm2 = 0;
      for (int64_t i = 0; i < kNumel; ++i) {
        const double d = static_cast<double>(params[i]) - ref[i];
        diff2 += d * d;
        norm2 += static_cast<double>(ref[i]) * ref[i];
      }
      testing::Deviation rel(absl::StrCat("stage ", stage, " params, relative in norm"), 1e-6);
      EXPECT_TRUE(rel.Add(std::sqrt(diff2 / norm2))) << rel.worst();
      // Adam's state for this rank's shard of a world of 2: twice what full sharding over 4 holds.
      const int64_t q = 32 * kGroup, shard = (kNumel + q - 1) / q * q / kGroup;
      EXPECT_EQ(opt->memory_report().Get(MemTier::kDevice, MemTag::kOptimizer).current, 8 * shard);
    });
  }
}

// The same memory given twice would be reduced into and updated twice with no error: any overlap between the
// pairs' buffers (or one pair's params and grads) is refused, naming both.
TEST(ShardedOptimizerErrors, OverlappingBuffersAreRefused) {
  testing::RunRanks(1, [&](Communicator& comm, int) {
    const int64_t cap = ShardedOptimizer::Capacity(kNumel, 1);
    std::vector<float> a(2 * cap), b(cap), c(cap);
    auto create = [&](std::vector<FlatBuffers> pairs) {
      return ShardedOptimizer::Create(WrapperConfig(1), testing::Borrow(comm), std::move(pairs));
    };
    EXPECT_THAT(create({FlatBuffers{a.data(), b.data(), DType::kF32, cap, kTensors, "x"},
                        FlatBuffers{a.data(), c.data(), DType::kF32, cap, kTensors, "y"}}),
                testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                  ::testing::HasSubstr("FlatBuffers[1] \"y\"'s params overlap FlatBuffers[0] "
                                                       "\"x\"'s params")));
    EXPECT_THAT(create({FlatBuffers{a.data(), a.data(), DType::kF32, cap, kTensors, "x"}}),
                testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                  ::testing::HasSubstr("\"x\"'s grads overlap FlatBuffers[0] \"x\"'s params")));
    // Half-way into the first pair's params.
    EXPECT_THAT(create({FlatBuffers{a.data(), b.data(), DType::kF32, cap, kTensors, "x"},
                        FlatBuffers{c.data(), a.data() + cap / 2, DType::kF32, cap, kTensors, "y"}}),
                testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("overlap")));
    // Adjacent is fine.
    EXPECT_OK(create({FlatBuffers{a.data(), b.data(), DType::kF32, cap, kTensors, "x"},
                      FlatBuffers{a.data() + cap, c.data(), DType::kF32, cap, kTensors, "y"}})
                  .status());
  });
}

// The errors name the trainer's buffer pairs, not the Engine's calls ("AddUnit", "Finalize", "unit").
TEST(ShardedOptimizerErrors, SpeakOfBufferPairs) {
  const int64_t cap = ShardedOptimizer::Capacity(kNumel, 2);
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    std::vector<float> p1(cap), g1(cap), p2(cap), g2(cap);
    // Two pairs of one name.
    const StatusOr<std::unique_ptr<ShardedOptimizer>> same =
        ShardedOptimizer::Create(WrapperConfig(1), testing::Borrow(comm),
                                 {FlatBuffers{p1.data(), g1.data(), DType::kF32, cap, kTensors, "mlp"},
                                  FlatBuffers{p2.data(), g2.data(), DType::kF32, cap, kTensors, "mlp"}});
    EXPECT_THAT(same, testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                        ::testing::HasSubstr("FlatBuffers[1] \"mlp\": another buffer pair")));
    // A tensor named twice within a pair.
    std::vector<ParamSpec> twice = kTensors;
    twice[1].name = "w1";
    const StatusOr<std::unique_ptr<ShardedOptimizer>> dup = ShardedOptimizer::Create(
        WrapperConfig(1), testing::Borrow(comm), {FlatBuffers{p1.data(), g1.data(), DType::kF32, cap, twice, "mlp"}});
    EXPECT_THAT(dup,
                testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("FlatBuffers[0] \"mlp\":")));
    EXPECT_THAT(dup.status().message(), ::testing::Not(::testing::HasSubstr("AddUnit")));
    // The ranks disagree on the tensors: Finalize's check, in the wrapper's words.
    std::vector<ParamSpec> mine = kTensors;
    if (rank == 1) mine[3].name = "bias2";
    const StatusOr<std::unique_ptr<ShardedOptimizer>> differ = ShardedOptimizer::Create(
        WrapperConfig(1), testing::Borrow(comm), {FlatBuffers{p1.data(), g1.data(), DType::kF32, cap, mine, "mlp"}});
    EXPECT_THAT(differ, testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                          ::testing::HasSubstr("ShardedOptimizer::Create: ranks registered different "
                                                               "buffer pairs")));
    EXPECT_THAT(differ.status().message(), ::testing::Not(::testing::HasSubstr("Finalize")));
  });
}

// A frozen pair needs no gradient buffer; a trainable one does. bare_names keeps the tensors' own names for
// parameter groups (and checkpoints), and two pairs may not then give one name twice.
TEST(ShardedOptimizerFrozen, AFrozenPairMayHaveNoGradientsAndBareNamesAreTheTensorsOwn) {
  const int64_t cap = ShardedOptimizer::Capacity(kNumel, 2);
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    std::vector<float> base(cap), p(cap), g(cap);
    InitParams(base.data());
    InitParams(p.data());
    const std::vector<float> base0 = base;
    std::vector<ParamSpec> adapter = {
        {"adapter.w", {kH, kD}}, {"adapter.b", {kH}}, {"adapter.w2", {kH}}, {"adapter.b2", {1}}};
    std::vector<ParamSpec> frozen = {{"base.w", {kH, kD}}, {"base.b", {kH}}, {"base.w2", {kH}}, {"base.b2", {1}}};
    FlatBuffers fb_frozen{base.data(), nullptr, DType::kF32, cap, frozen, "base"};
    fb_frozen.bare_names = true;
    FlatBuffers fb_train{p.data(), g.data(), DType::kF32, cap, adapter, "adapter"};
    fb_train.bare_names = true;
    EngineOptions o;
    o.param_groups = {{.match = "base.*", .frozen = true}};  // bare: "base.w", not "base.base.w"
    ASSERT_OK_AND_ASSIGN(auto opt,
                         ShardedOptimizer::Create(WrapperConfig(2), testing::Borrow(comm), {fb_train, fb_frozen}, o));
    ForwardBackward(p.data(), g.data(), 1, rank * 4, rank * 4 + 4);
    ASSERT_OK(opt->Step().status());
    EXPECT_EQ(base, base0);
    // The same pair trainable, without gradients: refused, naming it.
    EXPECT_THAT(ShardedOptimizer::Create(WrapperConfig(2), testing::Borrow(comm), {fb_train, fb_frozen}),
                testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                  ::testing::HasSubstr("FlatBuffers[1] \"base\": grads is null")));
    // Bare names given twice.
    std::vector<float> p2(cap), g2(cap);
    FlatBuffers again{p2.data(), g2.data(), DType::kF32, cap, adapter, "again"};
    again.bare_names = true;
    EXPECT_THAT(ShardedOptimizer::Create(WrapperConfig(2), testing::Borrow(comm), {fb_train, again}),
                testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                  ::testing::HasSubstr("tensor full name \"adapter.w\" is also")));
  });
}

// A trainer that rewrites its 16-bit parameters (from a file of its own) hands them back with ReloadParams: the
// fp32 master takes them. Without it the next Step would write the old master over them.
TEST(ShardedOptimizerReload, ReloadParamsMakesTheTrainersValuesTheMaster) {
  const int world = 2;
  const int64_t cap = ShardedOptimizer::Capacity(kNumel, world);
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    std::vector<uint16_t> params(cap, 0), grads(cap, 0);
    std::vector<float> p32(kNumel), g32(kNumel);
    InitParams(p32.data());
    ConvertBuffer(p32.data(), DType::kF32, params.data(), DType::kBF16, kNumel);
    Config cfg = WrapperConfig(2);
    cfg.bf16.enabled = true;
    ASSERT_OK_AND_ASSIGN(auto opt, ShardedOptimizer::Create(
                                       cfg, testing::Borrow(comm),
                                       {FlatBuffers{params.data(), grads.data(), DType::kBF16, cap, kTensors, "mlp"}}));
    ConvertBuffer(params.data(), DType::kBF16, p32.data(), DType::kF32, kNumel);
    ForwardBackward(p32.data(), g32.data(), 1, rank * 4, rank * 4 + 4);
    ConvertBuffer(g32.data(), DType::kF32, grads.data(), DType::kBF16, kNumel);
    ASSERT_OK(opt->Step().status());
    // The trainer's own values: 0.25 everywhere (exact in bf16).
    std::vector<float> mine(kNumel, 0.25f);
    ConvertBuffer(mine.data(), DType::kF32, params.data(), DType::kBF16, kNumel);
    ASSERT_OK_AND_ASSIGN(std::vector<float> before, opt->GatherParam(0, "w1"));
    EXPECT_NE(before[0], 0.25f);  // not yet the master's
    ASSERT_OK(opt->ReloadParams(0));
    ASSERT_OK_AND_ASSIGN(std::vector<float> after, opt->GatherParam(0, "w1"));
    EXPECT_EQ(after, std::vector<float>(after.size(), 0.25f));
    EXPECT_THAT(opt->ReloadParams(1), testing::StatusIs(absl::StatusCode::kInvalidArgument));
  });
}

// The trainer's batch keys as DeepSpeed users write them: any one or two of the three. The wrapper checks them as
// written (the trainer accumulates its own micro-steps) and steps once per Step, whichever were given.
TEST(ShardedOptimizerBatch, AnyOfTheBatchKeysAlone) {
  const int64_t cap = ShardedOptimizer::Capacity(kNumel, 2);
  for (const char* keys : {R"("train_batch_size": 8)", R"("train_micro_batch_size_per_gpu": 4)",
                           R"("train_batch_size": 16, "gradient_accumulation_steps": 2)",
                           R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": 4)"}) {
    SCOPED_TRACE(keys);
    testing::RunRanks(2, [&](Communicator& comm, int rank) {
      ASSERT_OK_AND_ASSIGN(Config cfg, Config::FromJsonString(absl::StrCat(
                                           "{", keys, R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
                                           "zero_optimization": {"stage": 2}})")));
      std::vector<float> params(cap), grads(cap);
      InitParams(params.data());
      ASSERT_OK_AND_ASSIGN(auto opt, ShardedOptimizer::Create(cfg, testing::Borrow(comm),
                                                              {FlatBuffers{params.data(), grads.data(), DType::kF32,
                                                                           cap, kTensors, "mlp"}}));
      ForwardBackward(params.data(), grads.data(), 1, rank * 4, rank * 4 + 4);
      ASSERT_OK_AND_ASSIGN(StepResult r, opt->Step());
      EXPECT_EQ(r.step, 1);
    });
  }
}

}  // namespace
}  // namespace zero
