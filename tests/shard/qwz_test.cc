// ZeRO++'s quantized weight gather (qwZ, zero_quantized_weights) in the host engine at stage 3:
// - forward and backward scopes see exactly the blockwise-quantized shards (each rank's shard quantized on its own,
//   in its blocks, and dequantized into the gathered buffer: core/internal/quantize.h), the same on every rank and
//   in both, as DeepSpeed quantizes every gather; every gather's bytes on the wire are the quantized message's;
// - a unit's 1-D parameters (a norm gain between two weights) are gathered exact, and set no block's scale;
// - a unit above allgather_bucket_size is gathered in quantized chunks of whole blocks: the whole gather's values,
//   bit for bit, scope by scope and trained;
// - units of constants and with an outlier of 1e4 gather finite values within half a step of their block, and
//   train 30 steps without a NaN;
// - the tiny GPT trains to the unquantized run's losses within 1 % (every 10 steps) at 4 thread-ranks;
// - a config that asks for it below stage 3 is an error naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/internal/op.h"
#include "core/internal/quantize.h"
#include "gpt/train.h"
#include "shard/internal/plan.h"
#include "support/engine_helpers.h"
#include "support/gpt_run.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/advanced/engine_stats.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace zero {
namespace {

constexpr int64_t kBlock = 64;
constexpr int64_t kN = 1000;  // one parameter; padded to world x 32, so the shards cut blocks unevenly

std::vector<float> Values() {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> v(kN);
  for (auto& x : v) x = dist(rng);
  v[5] = 1e4f;                                      // an outlier: only its block's step grows
  for (int64_t i = 100; i < 300; ++i) v[i] = 0.5f;  // constants
  for (int64_t i = 400; i < 470; ++i) v[i] = 0.0f;  // a block of zeros
  return v;
}

Config QwzConfig(int stage, bool bf16) {
  Config c = testing::TrainConfig(stage, 1);
  c.zero.zero_quantized_weights = true;
  c.zero.zero_quantized_weights_block_size = kBlock;
  c.bf16.enabled = bf16;
  return c;
}

struct QwzCase {
  int world;
  bool bf16;
};
class QwzGatherTest : public ::testing::TestWithParam<QwzCase> {};

TEST_P(QwzGatherTest, ForwardAndBackwardSeeTheQuantizedShards) {
  const auto [world, bf16] = GetParam();
  const DType cd = bf16 ? DType::kBF16 : DType::kF32;
  const size_t cds = DTypeSize(cd);
  const std::vector<float> w0 = Values();
  // What every rank must see in a forward scope: the parameters in the compute dtype, padded as the engine pads
  // them, each rank's shard quantized in blocks of kBlock and read back.
  const int64_t padded = (kN + world * 32 - 1) / (world * 32) * (world * 32), S = padded / world;
  std::vector<uint8_t> exact(padded * cds, 0), quantized(padded * cds);
  for (int64_t i = 0; i < kN; ++i) StoreFromF32(exact.data(), cd, i, w0[i]);
  for (int r = 0; r < world; ++r) {
    std::vector<int8_t> q(S);
    std::vector<float> scales(internal::QuantBlocks(S, kBlock));
    internal::QuantizeInt8Scalar(exact.data() + r * S * cds, cd, S, kBlock, q.data(), scales.data());
    internal::DequantizeInt8Scalar(q.data(), scales.data(), S, kBlock, quantized.data() + r * S * cds, cd);
  }
  testing::RunRanks(world, [&](Communicator& comm_ref, int rank) {
    auto comm = testing::Borrow(comm_ref);
    // SGD without gradients leaves the parameters as they are, so every step expects the same values. Two units,
    // so that from the second step on the gathers are prefetched by the recorded order: b's forward (quantized)
    // while a's forward scope is open, a's backward while b's backward scope is.
    Config cfg = QwzConfig(3, bf16);
    OptimizerConfig sgd;
    sgd.type = "SGD";
    sgd.lr = 0.1;
    cfg.optimizer = sgd;
    cfg.zero.stage3_max_live_parameters = 1'000'000;   // set (not DeepSpeed's default): the plan keeps it, so both
    cfg.zero.stage3_prefetch_bucket_size = 1'000'000;  // units fit in the window and the prefetch runs
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(cfg, comm));
    ASSERT_OK_AND_ASSIGN(UnitId a, engine->AddUnit("a", {{"w", {kN}}}));
    ASSERT_OK_AND_ASSIGN(UnitId b, engine->AddUnit("b", {{"w", {kN}}}));
    ASSERT_OK(engine->Finalize(
        [&](const std::string&, const ParamSpec&, float* out) { std::memcpy(out, w0.data(), kN * sizeof(float)); }));
    auto expect = [&](const UnitScope& s, const std::vector<uint8_t>& want, const std::string& what) {
      ASSERT_OK_AND_ASSIGN(TensorView w, s.Param("w"));
      ASSERT_EQ(0, std::memcmp(w.data, want.data(), kN * cds)) << what << " on rank " << rank;
    };
    for (int step = 0; step < 3; ++step) {
      const std::string at = absl::StrCat(" at step ", step);
      const int64_t before = comm->bus_bytes();
      {
        ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Forward(a));
        expect(s, quantized, "a forward" + at);
      }
      const int64_t forward_bytes = comm->bus_bytes() - before;
      {
        ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Forward(b));
        expect(s, quantized, "b forward" + at);
      }
      const int64_t mid = comm->bus_bytes();
      int64_t backward_bytes = 0;
      {
        ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(b));
        backward_bytes = comm->bus_bytes() - mid;  // the gather only: the scope's reduction runs at its close
        expect(s, quantized, "b backward" + at);
      }
      {
        ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(a));
        expect(s, quantized, "a backward" + at);
      }
      if (step == 0 && world > 1) {
        // Both gathers are one all-gather of a QwzMessageBytes message per rank (moved as 16-bit words), not of S
        // elements of the compute dtype (the first step gathers on demand, one unit at a time).
        internal::OpDesc qwz{.kind = internal::OpKind::kAllGather,
                             .dtype = DType::kF16,
                             .count = static_cast<uint64_t>(internal::QwzMessageBytes(S, kBlock) / 2)};
        EXPECT_EQ(forward_bytes, internal::BusBytes(qwz, world));
        EXPECT_EQ(backward_bytes, internal::BusBytes(qwz, world));
      }
      ASSERT_OK(engine->Step().status());
    }
    EXPECT_GT(advanced::Stats(*engine).prefetch_gathers, 0) << "the later steps' gathers were prefetched";
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, QwzGatherTest,
                         ::testing::Values(QwzCase{1, false}, QwzCase{2, false}, QwzCase{3, true}, QwzCase{4, false},
                                           QwzCase{4, true}),
                         [](const auto& info) {
                           return absl::StrCat("world", info.param.world, info.param.bf16 ? "_bf16" : "_f32");
                         });

// A unit of w1 {20, 30}, a norm gain g {100} of ones (elements [kG0, kG1)) and w2 {10, 30}, the weights of std 0.02,
// and what a gather of it must give at `world` ranks: each shard quantized in blocks of kBlock with g's elements
// zeroed, read back, and g put back exact (`shaped`: g registered as {1, 100}, quantized with the weights).
constexpr int64_t kG0 = 600, kG1 = 700;
std::vector<float> GainUnitValues() {
  std::mt19937 rng(8);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> w0(kN);
  for (int64_t i = 0; i < kN; ++i)
    w0[i] = i >= kG0 && i < kG1 ? 1.0f + 0.001f * static_cast<float>(i - kG0) : dist(rng);
  return w0;
}
// `most`: the most of g's elements any shard holds (0 when shaped).
std::vector<uint8_t> GainUnitGathered(const std::vector<float>& w0, int world, DType cd, bool shaped, int64_t* most) {
  const size_t cds = DTypeSize(cd);
  const int64_t padded = (kN + world * 32 - 1) / (world * 32) * (world * 32), S = padded / world;
  std::vector<uint8_t> want(padded * cds, 0);
  for (int64_t i = 0; i < kN; ++i) StoreFromF32(want.data(), cd, i, w0[i]);
  *most = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t lo = std::max(kG0, r * S), hi = std::min(kG1, (r + 1) * S);  // g in shard r
    std::vector<uint8_t> shard(want.begin() + r * S * cds, want.begin() + (r + 1) * S * cds), g;
    if (!shaped && lo < hi) {
      g.assign(shard.begin() + (lo - r * S) * cds, shard.begin() + (hi - r * S) * cds);
      std::fill(shard.begin() + (lo - r * S) * cds, shard.begin() + (hi - r * S) * cds, uint8_t{0});
      *most = std::max(*most, hi - lo);
    }
    std::vector<int8_t> q(S);
    std::vector<float> scales(internal::QuantBlocks(S, kBlock));
    internal::QuantizeInt8Scalar(shard.data(), cd, S, kBlock, q.data(), scales.data());
    internal::DequantizeInt8Scalar(q.data(), scales.data(), S, kBlock, want.data() + r * S * cds, cd);
    std::copy(g.begin(), g.end(), want.begin() + lo * cds);
  }
  return want;
}
StatusOr<UnitId> AddGainUnit(Engine& engine, bool shaped) {
  const std::vector<int64_t> g_shape = shaped ? std::vector<int64_t>{1, 100} : std::vector<int64_t>{100};
  return engine.AddUnit("u", {{"w1", {20, 30}}, {"g", g_shape}, {"w2", {10, 30}}});
}
Status FinalizeGainUnit(Engine& engine, const std::vector<float>& w0) {
  return engine.Finalize([&](const std::string&, const ParamSpec& p, float* out) {
    const int64_t at = p.name == "w1" ? 0 : p.name == "g" ? kG0 : kG1;
    std::memcpy(out, w0.data() + at, p.numel() * sizeof(float));
  });
}

// A unit's 1-D parameters go exact beside the quantized blocks: here a norm gain g of ones between two weight
// matrices of std 0.02. In the blocks it would set the scale (1/127, a third of the weights' spread); sent exact, the
// gathered g is bit for bit the parameter and the weights are quantized as if g were zeros. Registered as {1, 100}
// it is quantized with them, as a weight. The message grows by the most exact elements of any shard.
TEST(QwzGather, OneDimensionalParametersGoExact) {
  const std::vector<float> w0 = GainUnitValues();
  for (const auto& [world, bf16] : {std::pair{2, false}, std::pair{3, true}}) {
    for (bool shaped : {false, true}) {
      SCOPED_TRACE(absl::StrCat("world ", world, bf16 ? " bf16" : " f32", shaped ? ", g as {1, 100}" : ""));
      const DType cd = bf16 ? DType::kBF16 : DType::kF32;
      const size_t cds = DTypeSize(cd);
      const int64_t padded = (kN + world * 32 - 1) / (world * 32) * (world * 32), S = padded / world;
      int64_t most = 0;
      const std::vector<uint8_t> want = GainUnitGathered(w0, world, cd, shaped, &most);
      const int64_t message = internal::QwzMessageBytes(S, kBlock) + (most * static_cast<int64_t>(cds) + 3) / 4 * 4;
      testing::RunRanks(world, [&](Communicator& comm_ref, int rank) {
        auto comm = testing::Borrow(comm_ref);
        ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(QwzConfig(3, bf16), comm));
        ASSERT_OK_AND_ASSIGN(UnitId u, AddGainUnit(*engine, shaped));
        ASSERT_OK(FinalizeGainUnit(*engine, w0));
        const int64_t before = comm->bus_bytes();
        ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Forward(u));
        if (world > 1) {
          const internal::OpDesc op{
              .kind = internal::OpKind::kAllGather, .dtype = DType::kF16, .count = static_cast<uint64_t>(message / 2)};
          EXPECT_EQ(comm->bus_bytes() - before, internal::BusBytes(op, world));
        }
        ASSERT_OK_AND_ASSIGN(TensorView w1, s.Param("w1"));  // the unit's flat buffer starts at w1
        ASSERT_EQ(0, std::memcmp(w1.data, want.data(), kN * cds)) << "rank " << rank;
      });
    }
  }
}

// A unit above allgather_bucket_size is gathered in chunks, each quantized: chunks of whole blocks (the all-gather's
// chunk per rank rounded down to a multiple of the block, at least one block), each chunk's message its blocks'
// scales and codes, then the most of g's elements any shard has in that chunk, exact. The blocks are the whole
// gather's, so forward and backward scopes see its values bit for bit, and the wire carries the chunks' messages:
// here bucket 300 at world 2 (chunks of 128 elements per rank: 4) and world 3 (64: 6, the last of 32).
TEST(QwzGather, AUnitAboveTheBucketIsGatheredInQuantizedChunks) {
  constexpr int64_t kBucket = 300;
  const std::vector<float> w0 = GainUnitValues();
  for (const auto& [world, bf16] : {std::pair{2, false}, std::pair{3, true}, std::pair{4, false}}) {
    for (bool shaped : {false, true}) {
      SCOPED_TRACE(absl::StrCat("world ", world, bf16 ? " bf16" : " f32", shaped ? ", g as {1, 100}" : ""));
      const DType cd = bf16 ? DType::kBF16 : DType::kF32;
      const int64_t cds = static_cast<int64_t>(DTypeSize(cd));
      const int64_t padded = (kN + world * 32 - 1) / (world * 32) * (world * 32), S = padded / world;
      int64_t most = 0;
      const std::vector<uint8_t> want = GainUnitGathered(w0, world, cd, shaped, &most);
      // The chunks' messages, as the layout is defined above: every rank's chunk k the same size.
      const int64_t gather_chunk = std::max<int64_t>(32, kBucket / world / 32 * 32);
      const int64_t chunk = std::max(kBlock, gather_chunk / kBlock * kBlock);
      uint64_t bytes = 0;
      int chunks = 0;
      for (int64_t a = 0; a < S; a += chunk, ++chunks) {
        const int64_t b = std::min(S, a + chunk);
        int64_t exact = 0;
        for (int r = 0; r < world && !shaped; ++r) {
          exact = std::max<int64_t>(exact, std::min(kG1, r * S + b) - std::max(kG0, r * S + a));
        }
        const int64_t message = internal::QwzMessageBytes(b - a, kBlock) + (exact * cds + 3) / 4 * 4;
        bytes += internal::BusBytes(
            {.kind = internal::OpKind::kAllGather, .dtype = DType::kF16, .count = static_cast<uint64_t>(message / 2)},
            world);
      }
      ASSERT_GT(chunks, 1);
      testing::RunRanks(world, [&](Communicator& comm_ref, int rank) {
        auto comm = testing::Borrow(comm_ref);
        Config cfg = QwzConfig(3, bf16);
        cfg.zero.allgather_bucket_size = kBucket;
        OptimizerConfig sgd;  // no gradients: the parameters stay as they are, so every gather gives `want`
        sgd.type = "SGD";
        sgd.lr = 0.1;
        cfg.optimizer = sgd;
        ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(cfg, comm));
        ASSERT_OK_AND_ASSIGN(UnitId u, AddGainUnit(*engine, shaped));
        ASSERT_OK(FinalizeGainUnit(*engine, w0));
        for (int step = 0; step < 2; ++step) {
          for (bool backward : {false, true}) {
            const std::string what = absl::StrCat(backward ? "backward" : "forward", " at step ", step);
            const int64_t before = comm->bus_bytes();
            ASSERT_OK_AND_ASSIGN(UnitScope s, backward ? engine->Backward(u) : engine->Forward(u));
            if (world > 1) {
              EXPECT_EQ(comm->bus_bytes() - before, static_cast<int64_t>(bytes)) << what;
            }
            ASSERT_OK_AND_ASSIGN(TensorView w1, s.Param("w1"));
            ASSERT_EQ(0, std::memcmp(w1.data, want.data(), kN * cds)) << what << " on rank " << rank;
          }
          ASSERT_OK(engine->Step().status());
        }
        EXPECT_EQ(advanced::Stats(*engine).qwz_chunk_gathers, 4 * chunks) << "two steps' forward and backward";
      });
    }
  }
}

// Trained, a chunked qwZ gather is the whole one: the synthetic trainer's units with allgather_bucket_size 300 (every
// unit but the smallest in chunks) train the bits of the default bucket (every unit whole), their gradient norms
// and parameters (the trainer's gradients read the gathered weights), at world 4 in f32 (with hpZ too: the forward
// chunked, the backward from the secondary copy) and world 3 in bf16.
TEST(QwzTraining, ChunkedGathersTrainTheWholeGathersBits) {
  struct C {
    int world;
    bool bf16;
    int hpz;
  };
  for (const C c : {C{4, false, 1}, C{4, false, 2}, C{3, true, 1}}) {
    SCOPED_TRACE(absl::StrCat("world ", c.world, c.bf16 ? " bf16" : " f32", c.hpz > 1 ? " hpZ 2" : ""));
    auto train = [&](int64_t bucket, int64_t* chunk_gathers) {
      Config cfg = testing::TrainConfig(3, 1);
      cfg.bf16.enabled = c.bf16;
      cfg.zero.zero_quantized_weights = true;
      cfg.zero.zero_quantized_weights_block_size = 32;
      cfg.zero.zero_hpz_partition_size = c.hpz;
      if (bucket > 0) cfg.zero.allgather_bucket_size = bucket;
      std::vector<testing::SyntheticTrace> traces(c.world);
      testing::RunRanks(c.world, [&](Communicator& comm, int rank) {
        EngineOptions o;
        o.local_world_size = 2;  // hosts of 2 ranks: hpZ's host group
        ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, testing::Borrow(comm), o));
        ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, /*steps=*/4, 1, testing::HostViewIo(), &traces[rank]));
        if (rank == 0) *chunk_gathers = advanced::Stats(*e).qwz_chunk_gathers;
      });
      return traces;
    };
    int chunked = 0;
    for (const auto& [name, specs] : testing::SyntheticUnits()) {
      int64_t n = 0;
      for (const ParamSpec& p : specs) n += p.numel();
      const int64_t q = 32 * c.world;
      chunked += internal::ChunkPerRank((n + q - 1) / q * q, c.world, 300) > 0;
    }
    ASSERT_GE(chunked, 2);
    int64_t whole_chunks = -1, chunk_gathers = -1;
    const std::vector<testing::SyntheticTrace> whole = train(0, &whole_chunks), chunks = train(300, &chunk_gathers);
    EXPECT_EQ(whole_chunks, 0);
    EXPECT_GT(chunk_gathers, 0);
    for (int r = 0; r < c.world; ++r) {
      ASSERT_EQ(whole[r].steps.size(), chunks[r].steps.size());
      for (size_t k = 0; k < whole[r].steps.size(); ++k) {
        EXPECT_EQ(whole[r].steps[k].grad_norm, chunks[r].steps[k].grad_norm) << "rank " << r << " step " << k;
      }
      EXPECT_EQ(whole[r].params, chunks[r].params) << "rank " << r;
      EXPECT_FALSE(chunks[r].params.empty());
    }
  }
}

// The degenerate case, trained: a unit of constants (every element 0.5, where the block's scale is exact)
// and a unit whose one outlier of 1e4 stretches its block's step, pulled by AdamW towards a target for 30 steps
// with qwZ at 2 and 4 ranks. Nothing becomes NaN or infinite (the forward's quantized weights, the gradients the
// trainer computes from them, the loss, the norm), and the loss falls.
TEST(QwzTraining, ConstantsAndAnOutlierTrainWithoutNaN) {
  for (int world : {2, 4}) {
    testing::RunRanks(world, [&](Communicator& comm_ref, int rank) {
      auto comm = testing::Borrow(comm_ref);
      Config cfg = QwzConfig(3, /*bf16=*/false);
      OptimizerConfig adamw;
      adamw.type = "AdamW";
      adamw.lr = 1e-2;
      cfg.optimizer = adamw;
      ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(cfg, comm));
      ASSERT_OK_AND_ASSIGN(UnitId constants, engine->AddUnit("constants", {{"w", {kN}}}));
      ASSERT_OK_AND_ASSIGN(UnitId outlier, engine->AddUnit("outlier", {{"w", {kN}}}));
      const std::vector<float> w0 = Values();
      ASSERT_OK(engine->Finalize([&](const std::string& name, const ParamSpec&, float* out) {
        for (int64_t i = 0; i < kN; ++i) out[i] = name.rfind("constants", 0) == 0 ? 0.5f : w0[i];
      }));
      auto target = [](int64_t i) { return 0.01f * static_cast<float>(i % 13) - 0.06f; };
      double first_loss = 0, last_loss = 0;
      for (int step = 0; step < 30; ++step) {
        std::vector<std::vector<float>> fwd(2);
        double loss = 0;
        const UnitId units[2] = {constants, outlier};
        for (int u = 0; u < 2; ++u) {
          ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Forward(units[u]));
          ASSERT_OK_AND_ASSIGN(float* w, s.Param<float>("w"));
          fwd[u].assign(w, w + kN);
          for (int64_t i = 0; i < kN; ++i) {
            ASSERT_TRUE(std::isfinite(w[i])) << "unit " << u << " element " << i << " at step " << step;
            loss += 0.5 * (w[i] - target(i)) * (w[i] - target(i));
          }
        }
        for (int u = 1; u >= 0; --u) {
          ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(units[u]));
          ASSERT_OK_AND_ASSIGN(float* g, s.Grad<float>("w"));
          for (int64_t i = 0; i < kN; ++i) g[i] += fwd[u][i] - target(i);
        }
        ASSERT_OK_AND_ASSIGN(StepResult r, engine->Step());
        ASSERT_TRUE(std::isfinite(r.grad_norm)) << "step " << step << " rank " << rank;
        ASSERT_TRUE(std::isfinite(loss)) << "step " << step;
        if (step == 0) first_loss = loss;
        last_loss = loss;
      }
      EXPECT_LT(last_loss, first_loss) << "world " << world << " rank " << rank;
    });
  }
}

TEST(QwzConfig, BelowStage3IsAnErrorNamingTheKey) {
  for (int stage : {0, 1, 2}) {
    Config c = QwzConfig(stage, false);
    EXPECT_THAT(c.Validate(4), testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                                 ::testing::HasSubstr("zero_optimization.zero_quantized_weights")))
        << "stage " << stage;
  }
  Config ok = QwzConfig(3, false);
  EXPECT_OK(ok.Validate(4));
}

// The tiny GPT with qwZ trains to the unquantized run's losses at 4 thread-ranks (fp32), over 100 steps with a linear
// warmup over 20 steps to lr 3e-3: the mean loss of each 10 steps within 6 % of the unquantized run's, the last 10
// steps' within 1 % (measured with 1-D parameters exact: at most 1.75 %, the last 0.22 %). A single step's loss is one
// batch's and the runs' weights drift apart, hence the means. Without the warmup one of the two runs spikes
// somewhere: with 1-D parameters exact the qwZ run did in steps 31-40 (that window 20.9 % apart, the last 0.19 %).
// bf16 is not held to it: there both runs spike at lr 3e-3 and the gap reached 9.9 % (steps 31-40) and 1.8 % at the
// end (bench/results/zeropp.md).
TEST(QwzGpt, TrainsToTheUnquantizedLosses) {
  constexpr int kSteps = 100, kWindow = 10;
  for (bool bf16 : {false}) {
    Config exact = testing::TrainConfig(3, 2);
    exact.bf16.enabled = bf16;
    exact.scheduler.type = "WarmupLR";  // to lr 3e-3 over 20 steps
    exact.scheduler.warmup_type = "linear";
    exact.scheduler.warmup_min_lr = 0.0;
    exact.scheduler.warmup_max_lr = 3e-3;
    exact.scheduler.warmup_num_steps = 20;
    Config qwz = exact;
    qwz.zero.zero_quantized_weights = true;
    const gpt::TrainResult a = testing::TrainTinyGpt(4, exact, kSteps);
    const gpt::TrainResult b = testing::TrainTinyGpt(4, qwz, kSteps);
    ASSERT_EQ(a.steps.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(b.steps.size(), static_cast<size_t>(kSteps));
    for (int w = 0; w < kSteps / kWindow; ++w) {
      double ma = 0, mb = 0;
      for (int s = w * kWindow; s < (w + 1) * kWindow; ++s) {
        ASSERT_TRUE(std::isfinite(b.steps[s].loss)) << "step " << s + 1;
        ma += a.steps[s].loss / kWindow;
        mb += b.steps[s].loss / kWindow;
      }
      const double gap = std::fabs(mb - ma) / ma, bound = w + 1 == kSteps / kWindow ? 0.01 : 0.06;
      std::printf("qwz %s steps %d-%d: mean loss %.4f vs %.4f unquantized (gap %.2f %%)\n", bf16 ? "bf16" : "f32",
                  w * kWindow + 1, (w + 1) * kWindow, mb, ma, 100 * gap);
      EXPECT_LE(gap, bound) << (bf16 ? "bf16" : "f32") << " steps " << w * kWindow + 1 << "-" << (w + 1) * kWindow;
    }
    EXPECT_LT(b.steps.back().loss, b.steps.front().loss) << "it trains";
    EXPECT_LT(b.steps.back().group_bytes, a.steps.back().group_bytes) << "fewer bytes on the wire";
  }
}

}  // namespace
}  // namespace zero
