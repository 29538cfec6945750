// ZeRO++'s quantized gradient reduction (qgZ, zero_quantized_gradients) in the host engine:
// - gradients whose blocks quantize exactly (every value a multiple of its block's largest over 127, or 7 at int4,
//   the largest present) reduce to exactly the average, at stages 1-3, int8 and int4, in one hop (the ranks are one
//   host) and in two (2 hosts of 2 ranks, where the host sums are requantized exactly too), with and without LoCo;
// - LoCo's error feedback removes the bias of a constant gradient: over 50 steps the applied updates average to
//   the exact gradient far closer than without it;
// - the record format: int8 and int4 read back within half a step of their block, and the LoCo residual update is
//   e ← β·e + (1 − β)·(x + e − sent); a record's exact spans read back bit for bit and set no block's scale;
// - a unit's 1-D parameters (biases, norm gains) are reduced exact, as DeepSpeed does; their spans per shard;
// - units of constants and with an outlier of 1e4 train without a NaN; the tiny GPT trains to the exact run's
//   losses (int8, two hops, LoCo) within the drift of two runs;
// - a checkpoint saved with qgZ resumes at another world with it off; saved with its residuals
//   (SaveOptions::save_qgz_residuals) it resumes bit for bit at the same layout, and restarts them elsewhere;
// - configs that cannot work are errors naming the keys.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/internal/crc32c.h"
#include "checkpoint/internal/format.h"
#include "core/internal/quantize.h"
#include "gpt/train.h"
#include "shard/internal/compute.h"
#include "shard/internal/plan.h"
#include "shard/internal/qgz.h"
#include "support/engine_helpers.h"
#include "support/files.h"
#include "support/gpt_run.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "zero/advanced/engine_stats.h"
#include "zero/checkpoint.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/sharded_optimizer.h"

namespace zero {
namespace {

constexpr int64_t kBlock = 64;
constexpr int64_t kN = 3840;  // one parameter, a multiple of 32 · 4 and 32 · 6: no padding, shards of whole blocks

// SGD at lr 1 from zero parameters, no clipping: after a step each parameter is minus the reduced gradient.
Config QgzConfig(int stage, int bits, bool loco) {
  Config c = testing::TrainConfig(stage, 1, 1, 1.0, 0.0);
  OptimizerConfig sgd;
  sgd.type = "SGD";
  sgd.lr = 1.0;
  c.optimizer = sgd;
  c.zero.zero_quantized_gradients = true;
  c.zero.zero_quantized_gradients_bits = bits;
  c.zero.zero_quantized_gradients_block_size = kBlock;
  c.zero.zero_quantized_gradients_error_feedback = loco;
  return c;
}

// Trains one unit "u" (kN elements, zero at first; `specs`' parameters, one after another) `steps` steps on `world`
// thread-ranks with `per_host` ranks per host, rank r adding grad(r, i) to element i of its gradient each step;
// saves to `dir` (unless empty) after the last step; returns the parameters then, flat (rank 0's view, read in a
// forward scope) and checks every rank read the same.
std::vector<float> TrainOneUnit(const Config& cfg, int world, int per_host, int steps,
                                const std::function<float(int, int64_t)>& grad, const std::string& dir = "",
                                const std::vector<ParamSpec>& specs = {{"w", {kN}}}) {
  std::vector<std::vector<float>> out(world);
  testing::RunRanks(world, [&](Communicator& comm_ref, int rank) {
    EngineOptions o;
    o.local_world_size = per_host;
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(cfg, testing::Borrow(comm_ref), o));
    ASSERT_OK_AND_ASSIGN(UnitId u, engine->AddUnit("u", specs));
    ASSERT_OK(engine->Finalize(
        [](const std::string&, const ParamSpec& spec, float* p) { std::fill_n(p, spec.numel(), 0.0f); }));
    for (int step = 0; step < steps; ++step) {
      { ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Forward(u)); }
      {
        ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(u));
        int64_t base = 0;
        for (const ParamSpec& spec : specs) {
          ASSERT_OK_AND_ASSIGN(TensorView g, s.Grad(spec.name));
          for (int64_t i = 0; i < spec.numel(); ++i)
            StoreFromF32(g.data, g.dtype, i, LoadAsF32(g.data, g.dtype, i) + grad(rank, base + i));
          base += spec.numel();
        }
      }
      ASSERT_OK(engine->Step().status());
    }
    if (!dir.empty()) {
      ASSERT_OK(engine->Save(dir).status());
    }
    ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Forward(u));
    for (const ParamSpec& spec : specs) {
      ASSERT_OK_AND_ASSIGN(TensorView w, s.Param(spec.name));
      for (int64_t i = 0; i < spec.numel(); ++i) out[rank].push_back(LoadAsF32(w.data, w.dtype, i));
    }
  });
  for (int r = 1; r < world; ++r) EXPECT_EQ(out[r], out[0]) << "rank " << r << " reads other parameters";
  return out[0];
}

struct ExactCase {
  int stage, bits, world, per_host;
  bool loco;
  bool bf16 = false, offload = false;
  int64_t bucket = 0;  // reduce_bucket_size (0: the default): below the unit, it is reduced in quantized chunks
};
class QgzExactTest : public ::testing::TestWithParam<ExactCase> {};

TEST_P(QgzExactTest, ExactlyQuantizableGradientsReduceToTheAverage) {
  const auto [stage, bits, world, per_host, loco, bf16, offload, bucket] = GetParam();
  Config cfg = QgzConfig(stage, bits, loco);
  if (bucket > 0) cfg.zero.reduce_bucket_size = bucket;
  cfg.bf16.enabled = bf16;  // (int4 codes times up to 6, and their averages, are exact in bf16 too)
  if (offload) cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
  const int Q = bits == 8 ? 127 : 7;
  const int64_t S = kN / world;
  // Element j of each shard: Q at the start of every block (so each block's largest is Q · (r + 1)), else a code
  // in [-Q, Q]; rank r sends (r + 1) times it, and every host sum is a multiple of the same codes.
  auto code = [&](int64_t i) {
    const int64_t j = i % S;
    return j % kBlock == 0 ? Q : static_cast<int>((j * 37) % (2 * Q + 1)) - Q;
  };
  const std::vector<float> w = TrainOneUnit(cfg, world, per_host, 2, [&](int r, int64_t i) {
    return static_cast<float>(r + 1) * static_cast<float>(code(i));
  });
  const float mean = static_cast<float>(world + 1) / 2.0f;  // (1 + 2 + ... + world) / world
  for (int64_t i = 0; i < kN; ++i) {
    // Two steps of -mean · code.
    ASSERT_EQ(w[i], -2.0f * mean * static_cast<float>(code(i))) << "element " << i;
  }
}

// One hop: 4 ranks of one host, and 6 ranks on uneven hosts of 4 (logged). Two hops: 2 hosts of 2 ranks, and an odd
// host count, 3 hosts of 2. bf16 compute, and optimizer offload (the shard's host part lands as the reduce-scatter's).
// In quantized chunks: reduce_bucket_size 1024 at 4 ranks (chunks of 256 of a shard of 960, the last 192) and 6
// (chunks of 128 of 640).
INSTANTIATE_TEST_SUITE_P(
    Layouts, QgzExactTest,
    ::testing::Values(ExactCase{1, 8, 4, 4, true}, ExactCase{2, 8, 4, 4, true}, ExactCase{3, 8, 4, 4, true},
                      ExactCase{3, 8, 4, 2, true}, ExactCase{2, 4, 4, 2, true}, ExactCase{3, 4, 4, 4, false},
                      ExactCase{1, 8, 4, 2, false}, ExactCase{3, 8, 6, 2, true}, ExactCase{2, 8, 6, 4, true},
                      ExactCase{3, 4, 4, 2, true, true}, ExactCase{2, 8, 4, 2, true, false, true},
                      ExactCase{3, 4, 6, 2, true, true, true}, ExactCase{2, 8, 4, 4, true, false, false, 1024},
                      ExactCase{3, 8, 4, 2, true, false, false, 1024}, ExactCase{3, 4, 6, 2, true, true, true, 1024}),
    [](const auto& info) {
      const ExactCase& c = info.param;
      return absl::StrCat("stage", c.stage, "_int", c.bits, "_world", c.world, "_", c.per_host, "_per_host",
                          c.loco ? "_loco" : "", c.bf16 ? "_bf16" : "", c.offload ? "_offload" : "",
                          c.bucket > 0 ? "_chunked" : "");
    });

// A C-style trainer's one flat buffer (ShardedOptimizer, stages 1-2): its gradient, which the exact reduce-scatter
// cuts into chunks, is quantized whole, in one hop and in two, and exactly quantizable gradients reduce to exactly
// the average in the trainer's parameters.
TEST(QgzShardedOptimizer, AFlatBufferIsReducedQuantized) {
  // Shards of 4096: the exact path would cut this buffer into 4 chunks (internal::ReduceChunkPerRank).
  constexpr int kWorld = 4;
  constexpr int64_t kFlat = 16384;
  const int64_t cap = ShardedOptimizer::Capacity(kFlat, kWorld), S = cap / kWorld;
  ASSERT_EQ(cap, kFlat);  // no padding: the codes below fill every shard
  auto code = [&](int64_t i) {
    const int64_t j = i % S;
    return j % kBlock == 0 ? 127 : static_cast<int>((j * 37) % 255) - 127;
  };
  for (int stage : {1, 2}) {
    for (int per_host : {4, 2}) {
      SCOPED_TRACE(absl::StrCat("stage ", stage, ", ", per_host, " ranks per host"));
      testing::RunRanks(kWorld, [&](Communicator& comm_ref, int rank) {
        std::vector<float> params(cap, 0.0f), grads(cap, 0.0f);
        FlatBuffers flat{.params = params.data(), .grads = grads.data(), .capacity = cap, .tensors = {{"w", {kFlat}}}};
        EngineOptions o;
        o.local_world_size = per_host;
        ASSERT_OK_AND_ASSIGN(auto opt,
                             ShardedOptimizer::Create(QgzConfig(stage, 8, true), testing::Borrow(comm_ref), {flat}, o));
        const int64_t before = comm_ref.bus_bytes();
        for (int64_t i = 0; i < kFlat; ++i) grads[i] = static_cast<float>(rank + 1) * static_cast<float>(code(i));
        ASSERT_OK(opt->Step().status());
        for (int64_t i = 0; i < kFlat; ++i) {
          ASSERT_EQ(params[i], -2.5f * static_cast<float>(code(i))) << "element " << i;
        }
        // Less than the f32 reduce-scatter alone would send from this rank over the trainer's communicator (the
        // second hop, if any, is on a communicator of its own).
        EXPECT_LT(comm_ref.bus_bytes() - before, (kWorld - 1) * S * 4 + (kWorld - 1) * S * 4);
      });
    }
  }
}

// A checkpoint saved with qgZ holds the exact state (the residuals are not saved): loaded at another world with
// qgZ off, and at the same world with it on, the parameters read back are the saved ones.
TEST(QgzCheckpoint, ResumesAtAnotherWorldWithQgzOff) {
  const std::string dir = testing::MakeTempDir("zero_qgz_ckpt");
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> g(kN * 4);
  for (float& x : g) x = dist(rng);
  const std::vector<float> saved = TrainOneUnit(
      QgzConfig(3, 8, true), 4, 2, 3, [&](int r, int64_t i) { return g[r * kN + i]; }, dir);
  for (const auto& [world, qgz] : {std::pair{2, false}, std::pair{4, true}}) {
    SCOPED_TRACE(absl::StrCat("world ", world, qgz ? ", qgZ on" : ", qgZ off"));
    Config cfg = QgzConfig(3, 8, true);
    cfg.zero.zero_quantized_gradients = qgz;
    testing::RunRanks(world, [&](Communicator& comm_ref, int) {
      EngineOptions o;
      o.local_world_size = 2;
      ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(cfg, testing::Borrow(comm_ref), o));
      ASSERT_OK_AND_ASSIGN(UnitId u, engine->AddUnit("u", {{"w", {kN}}}));
      ASSERT_OK(engine->Finalize([](const std::string&, const ParamSpec&, float* p) { std::fill_n(p, kN, 1.0f); }));
      ASSERT_OK(engine->Load(dir).status());
      ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Forward(u));
      ASSERT_OK_AND_ASSIGN(float* w, s.Param<float>("w"));
      ASSERT_EQ(std::vector<float>(w, w + kN), saved);
    });
  }
}

// An engine of one unit "u" (kN elements, zero at first) on `comm`, `per_host` ranks per host (0: the default).
StatusOr<std::unique_ptr<Engine>> OneUnitEngine(const Config& cfg, Communicator& comm, int per_host) {
  EngineOptions o;
  o.local_world_size = per_host;
  ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(cfg, testing::Borrow(comm), o));
  ZERO_RETURN_IF_ERROR(engine->AddUnit("u", {{"w", {kN}}}).status());
  ZERO_RETURN_IF_ERROR(
      engine->Finalize([](const std::string&, const ParamSpec&, float* p) { std::fill_n(p, kN, 0.0f); }));
  return engine;
}

// Steps [from, to) of one unit "u" (kN elements, zero at first) on 4 thread-ranks, 2 per host, rank r adding
// grad(step, r, i) to element i of its gradient: loads `load_dir` when set before step `load_at` (-1: `from`; a path
// ending in .safetensors with Engine::LoadSafetensors, anything else with Engine::Load), and
// saves into `save_dir` with `so` after the last step when set. Rank 0's parameters (every rank's are checked alike
// by the Forward's gather).
std::vector<float> TrainSteps(const Config& cfg, int from, int to, const std::function<float(int, int, int64_t)>& grad,
                              const std::string& load_dir = "", const std::string& save_dir = "",
                              const SaveOptions& so = {}, int load_at = -1) {
  std::vector<std::vector<float>> out(4);
  testing::RunRanks(4, [&](Communicator& comm_ref, int rank) {
    ASSERT_OK_AND_ASSIGN(auto engine, OneUnitEngine(cfg, comm_ref, 2));
    const UnitId u = 0;  // its only unit
    for (int step = from; step < to; ++step) {
      if (!load_dir.empty() && step == (load_at < 0 ? from : load_at)) {
        if (absl::EndsWith(load_dir, ".safetensors")) {
          ASSERT_OK(engine->LoadSafetensors(load_dir));
        } else {
          ASSERT_OK(engine->Load(load_dir).status());
        }
      }
      { ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Forward(u)); }
      {
        ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(u));
        ASSERT_OK_AND_ASSIGN(float* gw, s.Grad<float>("w"));
        for (int64_t i = 0; i < kN; ++i) gw[i] += grad(step, rank, i);
      }
      ASSERT_OK(engine->Step().status());
    }
    if (!save_dir.empty()) {
      ASSERT_OK(engine->Save(save_dir, so).status());
      ASSERT_OK(engine->WaitForSave());
    }
    ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Forward(u));
    ASSERT_OK_AND_ASSIGN(float* w, s.Param<float>("w"));
    out[rank].assign(w, w + kN);
  });
  return out[0];
}

// Flips one bit of the byte at `offset` of the file: damage its checksum must catch.
void DamageByte(const std::string& path, int64_t offset) {
  std::string bytes = testing::ReadWholeFile(path);
  bytes[static_cast<size_t>(offset)] ^= 0x40;
  testing::WriteWholeFile(path, bytes);
}

int64_t CountDiffering(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  int64_t differ = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) differ += a[i] != b[i];
  return differ;
}

// A checkpoint saved without its LoCo residuals (the default): a Load restarts them at zero (and the reset_T count
// with them), so an engine that trained before it loads goes on exactly as a fresh engine loading the same
// checkpoint, never with the residuals of the steps the checkpoint does not hold. Engine::LoadSafetensors, which
// replaces the parameters mid-run, restarts them too: they are the rounding errors of the old parameters' gradients
// (the engine that kept them, the code before that case, failed it).
TEST(QgzCheckpoint, ALoadRestartsTheResidualsAsAFreshEngineHasThem) {
  const std::string dir = testing::MakeTempDir("zero_qgz_residuals");
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> g(kN * 4 * 3);
  for (float& x : g) x = dist(rng);
  auto grad = [&](int set) { return [&g, set](int r, int64_t i) { return g[(set * 4 + r) * kN + i]; }; };
  Config cfg = QgzConfig(3, 8, true);
  cfg.zero.zeropp_loco_reset_t = 5;  // reductions counted across the Load would reset at another step
  TrainOneUnit(cfg, 4, 2, 3, grad(0), dir + "/ckpt");
  ASSERT_OK(ExportSafetensors(dir + "/ckpt", dir + "/weights.safetensors"));
  for (const std::string& from : {dir + "/ckpt", dir + "/weights.safetensors"}) {
    SCOPED_TRACE(from);
    // Trains `before` steps on gradient set 1, loads `from`, then trains 3 steps on gradient set 2.
    auto resume = [&](int before) {
      return TrainSteps(
          cfg, 0, before + 3, [&](int step, int r, int64_t i) { return grad(step < before ? 1 : 2)(r, i); }, from, "",
          {}, before);
    };
    const std::vector<float> fresh = resume(0), trained = resume(4);
    ASSERT_EQ(fresh.size(), static_cast<size_t>(kN));
    EXPECT_EQ(CountDiffering(fresh, trained), 0) << "of " << kN << " parameters differ after the same load and steps";
  }
}

// SaveOptions::save_qgz_residuals: the checkpoint holds each rank's LoCo residuals (both hops') and the units'
// reset_T counts, so training 3 steps, saving, and training 3 more in another engine that loads it gives the
// parameters of 6 uninterrupted steps bit for bit, from a synchronous save and from an asynchronous one, whose files
// are the same bytes. reset_T = 4 falls after the cut: a count that restarted at the Load would reset at another
// step. Without the option the resumed run differs (the residuals restart at zero): what the test can tell apart.
TEST(QgzCheckpoint, SavedResidualsResumeBitForBit) {
  std::mt19937 rng(21);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> g(6 * 4 * kN);
  for (float& x : g) x = dist(rng);
  auto grad = [&](int step, int r, int64_t i) { return g[(static_cast<int64_t>(step) * 4 + r) * kN + i]; };
  // Stages 2 and 3 with the residuals in the compute dtype, and stage 3 with them in int8 blocks.
  for (const auto& [stage, int8] : {std::pair{2, false}, std::pair{3, false}, std::pair{3, true}}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage, int8 ? ", int8 residuals" : ""));
    Config cfg = QgzConfig(stage, 8, true);
    cfg.zero.zeropp_loco_reset_t = 4;
    if (int8) cfg.zero.zero_quantized_gradients_error_feedback_dtype = QgzResidualDType::kInt8;
    const std::vector<float> whole = TrainSteps(cfg, 0, 6, grad);
    std::string files[2];
    for (const bool async : {false, true}) {
      SCOPED_TRACE(async ? "asynchronous save" : "synchronous save");
      const std::string dir = testing::MakeTempDir("zero_qgz_saved_residuals");
      SaveOptions so;
      so.save_qgz_residuals = true;
      so.async = async;
      TrainSteps(cfg, 0, 3, grad, "", dir, so);
      for (int r = 0; r < 4; ++r)
        files[async] += testing::ReadWholeFile(absl::StrCat(dir, "/step-00000003/", ckpt::RankFileName(r, 4)));
      EXPECT_EQ(CountDiffering(TrainSteps(cfg, 3, 6, grad, dir), whole), 0) << "of " << kN << " parameters differ";
      ASSERT_OK_AND_ASSIGN(auto reader, ckpt::CheckpointReader::Open(dir, ""));
      ASSERT_TRUE(reader->meta().qgz.has_value());
      EXPECT_EQ(reader->meta().qgz->rounds, std::vector<int64_t>{3});
      EXPECT_EQ(reader->meta().qgz->int8, int8);
      EXPECT_EQ(reader->meta().ranks[1].rank_state.size(), 2u) << "both hops' residuals";
      ASSERT_OK(reader->VerifyAll());
    }
    EXPECT_TRUE(files[0] == files[1]) << "the asynchronous save's rank files differ from the synchronous save's";
    const std::string plain = testing::MakeTempDir("zero_qgz_unsaved_residuals");
    TrainSteps(cfg, 0, 3, grad, "", plain);
    const std::vector<float> restarted = TrainSteps(cfg, 3, 6, grad, plain);
    EXPECT_GT(CountDiffering(restarted, whole), 0)
        << "residuals restarted at zero should round the steps after the resume otherwise";
    if (int8) {
      // Residuals saved as int8 blocks are not read as compute-dtype values, nor the other way round: a Load with
      // the other kind restarts them, as if none were saved (the same parameters as the resume from `plain`). (Their
      // sections' sizes differ as well, which restarts them too: the meta's "residuals" is checked first.)
      Config other = cfg;
      other.zero.zero_quantized_gradients_error_feedback_dtype = QgzResidualDType::kCompute;
      const std::string saved = testing::MakeTempDir("zero_qgz_int8_residuals");
      SaveOptions so;
      so.save_qgz_residuals = true;
      TrainSteps(cfg, 0, 3, grad, "", saved, so);
      EXPECT_EQ(CountDiffering(TrainSteps(other, 3, 6, grad, saved), TrainSteps(other, 3, 6, grad, plain)), 0);
      const std::string saved_compute = testing::MakeTempDir("zero_qgz_compute_residuals");
      TrainSteps(other, 0, 3, grad, "", saved_compute, so);
      const std::string plain_compute = testing::MakeTempDir("zero_qgz_compute_plain");
      TrainSteps(other, 0, 3, grad, "", plain_compute);
      EXPECT_EQ(CountDiffering(TrainSteps(cfg, 3, 6, grad, saved_compute), TrainSteps(cfg, 3, 6, grad, plain_compute)),
                0);
      ASSERT_OK_AND_ASSIGN(const std::string described, DescribeCheckpoint(saved));
      EXPECT_NE(described.find("residuals in int8 blocks"), std::string::npos) << described;
    }
  }
}

// Saved residuals are only for the layout they were saved under: at another world, with qgZ off, or where a unit
// keeps none, a Load restarts them (and one reduced in chunks under a smaller reduce_bucket_size loads them); a damaged
// residual block fails the Load naming it; asking to save them where there are none, or under hybrid sharding, is an
// error naming the option or the reason.
TEST(QgzCheckpoint, SavedResidualsAreCheckedAndRestartedElsewhere) {
  auto grad = [](int step, int r, int64_t i) { return std::sin(0.1f * static_cast<float>(i + 7 * r + 31 * step)); };
  const Config cfg = QgzConfig(3, 8, true);
  const std::string dir = testing::MakeTempDir("zero_qgz_residuals_checked");
  SaveOptions so;
  so.save_qgz_residuals = true;
  TrainSteps(cfg, 0, 2, grad, "", dir, so);
  // Another world (2 ranks, one host), with qgZ on and off: loads, the residuals restarted.
  for (const bool qgz : {true, false}) {
    Config c = cfg;
    c.zero.zero_quantized_gradients = qgz;
    testing::RunRanks(2, [&](Communicator& comm_ref, int) {
      ASSERT_OK_AND_ASSIGN(auto engine, OneUnitEngine(c, comm_ref, 0));
      ASSERT_OK(engine->Load(dir).status());
    });
  }
  // The same world and hosts with a reduce_bucket_size under the unit: it is reduced in quantized chunks, whose
  // residuals are the whole reduction's, element by element: the saved ones fit it, and the Load succeeds.
  {
    Config c = cfg;
    c.zero.reduce_bucket_size = 1024;
    testing::RunRanks(4, [&](Communicator& comm_ref, int) {
      ASSERT_OK_AND_ASSIGN(auto engine, OneUnitEngine(c, comm_ref, 2));
      ASSERT_OK(engine->Load(dir).status());
    });
  }
  // zero-ckpt inspect names them; a reshard (even to the same world) drops them: they belong to the saved ranks.
  ASSERT_OK_AND_ASSIGN(const std::string described, DescribeCheckpoint(dir));
  EXPECT_NE(described.find("qgZ residuals of every rank (int8 blocks of 64"), std::string::npos) << described;
  const std::string resharded = testing::MakeTempDir("zero_qgz_residuals_resharded");
  ASSERT_OK(ReshardCheckpoint(dir, "", resharded, 4));
  {
    ASSERT_OK_AND_ASSIGN(auto r, ckpt::CheckpointReader::Open(resharded, ""));
    EXPECT_FALSE(r->meta().qgz.has_value());
    EXPECT_TRUE(r->meta().ranks[1].rank_state.empty());
  }
  // A meta.json that lists one residual of a rank twice, the second larger: refused when it is parsed (a Load would
  // read every listed section into the residual the first one sized).
  ASSERT_OK_AND_ASSIGN(auto reader, ckpt::CheckpointReader::Open(dir, ""));
  {
    ckpt::Meta m = reader->meta();
    ckpt::RankFileMeta& r = m.ranks[1];
    ckpt::Section twice = r.rank_state[0];
    twice.offset = r.bytes;
    twice.end = twice.begin + 2 * (twice.end - twice.begin);
    r.bytes += m.SectionBytes(twice);
    r.rank_state.push_back(twice);
    EXPECT_THAT(ckpt::MetaFromJson(ckpt::MetaToJson(m), "meta.json").status(),
                testing::StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("qgz_residual a second time")));
  }
  // qgz_residuals.residuals: "compute" here; absent (a checkpoint from before int8 residuals) it reads as "compute",
  // and any other value is refused naming the field.
  {
    ASSERT_FALSE(reader->meta().qgz->int8);
    auto with = [&](const char* residuals) {
      nlohmann::json j = nlohmann::json::parse(ckpt::MetaToJson(reader->meta()));
      if (residuals == nullptr) {
        j["qgz_residuals"].erase("residuals");
      } else {
        j["qgz_residuals"]["residuals"] = residuals;
      }
      j.erase("checksum");
      const std::string body = j.dump();
      j["checksum"] = absl::StrFormat("crc32c:%08x", ckpt::Crc32c(0, body.data(), body.size()));
      return ckpt::MetaFromJson(j.dump(), "meta.json");
    };
    // (Read as a value, not through the optional: GCC 12 sees the optional's payload as maybe uninitialized.)
    auto int8_of = [](const StatusOr<ckpt::Meta>& m) { return m.ok() && m->qgz.has_value() && m->qgz.value().int8; };
    const StatusOr<ckpt::Meta> absent = with(nullptr), int8 = with("int8");
    ASSERT_OK(absent.status());
    ASSERT_OK(int8.status());
    EXPECT_TRUE(absent->qgz.has_value());
    EXPECT_FALSE(int8_of(absent));
    EXPECT_TRUE(int8_of(int8));
    EXPECT_THAT(with("int4").status(), testing::StatusIs(absl::StatusCode::kDataLoss,
                                                         ::testing::HasSubstr("qgz_residuals.residuals is \"int4\"")));
  }
  // One byte of rank 1's host residual flipped: the Load fails on every rank, naming the section.
  const ckpt::RankFileMeta& r1 = reader->meta().ranks[1];
  ASSERT_EQ(r1.rank_state.size(), 2u);
  DamageByte(absl::StrCat(reader->folder(), "/", r1.file), r1.rank_state[1].offset + 5);
  testing::RunRanks(4, [&](Communicator& comm_ref, int rank) {
    ASSERT_OK_AND_ASSIGN(auto engine, OneUnitEngine(cfg, comm_ref, 2));
    const Status st = engine->Load(dir).status();
    EXPECT_FALSE(st.ok());
    if (rank == 1) {
      EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
      EXPECT_NE(st.message().find("qgz_host_residual"), std::string::npos) << st;
    }
  });
  // Hybrid sharding (groups of 2): every group has its own residuals, and only the first writes.
  Config hybrid = cfg;
  hybrid.zero.mics_shard_size = 2;
  testing::RunRanks(4, [&](Communicator& comm_ref, int) {
    ASSERT_OK_AND_ASSIGN(auto engine, OneUnitEngine(hybrid, comm_ref, 2));
    const Status st = engine->Save(testing::MakeTempDir("zero_qgz_hybrid"), so).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("hybrid sharding"), std::string::npos) << st;
  });
  // Nothing to save: error feedback off.
  Config off = cfg;
  off.zero.zero_quantized_gradients_error_feedback = false;
  testing::RunRanks(2, [&](Communicator& comm_ref, int) {
    ASSERT_OK_AND_ASSIGN(auto engine, OneUnitEngine(off, comm_ref, 0));
    const Status st = engine->Save(testing::MakeTempDir("zero_qgz_nothing"), so).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("save_qgz_residuals"), std::string::npos) << st;
  });
}

// Whether a Load restores the residuals is one decision for every rank: a meta.json (hand-edited, its checksum
// right) that lists rank 1's residuals nowhere while the other ranks' are listed makes rank 1 restart its own, and
// then every rank restarts, as from a checkpoint saved without them; ranks 0, 2 and 3 restoring theirs beside rank
// 1's zeros would train a state no run had (the Load before the agreement did, and failed this test). The residuals
// are read only once every rank will restore them: a damaged byte in rank 0's does not fail this Load.
TEST(QgzCheckpoint, EveryRankRestoresTheResidualsOrNone) {
  auto grad = [](int step, int r, int64_t i) { return std::sin(0.1f * static_cast<float>(i + 7 * r + 31 * step)); };
  const Config cfg = QgzConfig(3, 8, true);
  SaveOptions so;
  so.save_qgz_residuals = true;
  const std::string saved = testing::MakeTempDir("zero_qgz_agree_saved");
  const std::string edited = testing::MakeTempDir("zero_qgz_agree_edited");
  const std::string plain = testing::MakeTempDir("zero_qgz_agree_plain");
  TrainSteps(cfg, 0, 2, grad, "", saved, so);
  std::filesystem::copy(saved, edited,
                        std::filesystem::copy_options::recursive | std::filesystem::copy_options::copy_symlinks);
  TrainSteps(cfg, 0, 2, grad, "", plain);
  {
    ASSERT_OK_AND_ASSIGN(auto reader, ckpt::CheckpointReader::Open(edited, ""));
    ckpt::Meta m = reader->meta();
    ASSERT_EQ(m.ranks[1].rank_state.size(), 2u);
    m.ranks[1].rank_state.clear();
    testing::WriteWholeFile(absl::StrCat(reader->folder(), "/meta.json"), ckpt::MetaToJson(m));
    DamageByte(absl::StrCat(reader->folder(), "/", m.ranks[0].file), m.ranks[0].rank_state[0].offset + 5);
  }
  const std::vector<float> restored = TrainSteps(cfg, 2, 4, grad, saved);
  const std::vector<float> restarted = TrainSteps(cfg, 2, 4, grad, plain);
  ASSERT_GT(CountDiffering(restored, restarted), 0) << "restored and restarted residuals should train apart";
  EXPECT_EQ(CountDiffering(TrainSteps(cfg, 2, 4, grad, edited), restarted), 0)
      << "of " << kN << " parameters differ from the run whose every rank restarted its residuals";
}

// A constant gradient that does not quantize exactly: each step applies the same quantized value without error
// feedback, a biased one; with it the residual carries the loss into the next step, so the sum of the updates tracks
// the sum of the exact gradients (its error stays bounded, its mean error shrinks as 1/steps).
TEST(QgzLoco, ErrorFeedbackRemovesTheBiasOfAConstantGradient) {
  constexpr int kWorld = 4, kSteps = 50;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> g(kN * kWorld);
  for (float& x : g) x = dist(rng);
  auto grad = [&](int r, int64_t i) { return g[r * kN + i]; };
  std::vector<double> exact(kN, 0.0);
  for (int r = 0; r < kWorld; ++r) {
    for (int64_t i = 0; i < kN; ++i) exact[i] += -static_cast<double>(kSteps) * g[r * kN + i] / kWorld;
  }
  for (int bits : {8, 4}) {
    for (int per_host : {4, 2}) {
      SCOPED_TRACE(absl::StrCat("int", bits, ", ", per_host, " ranks per host"));
      auto mean_error = [&](bool loco, bool int8_residuals = false) {
        Config cfg = QgzConfig(2, bits, loco);
        if (int8_residuals) cfg.zero.zero_quantized_gradients_error_feedback_dtype = QgzResidualDType::kInt8;
        const std::vector<float> w = TrainOneUnit(cfg, kWorld, per_host, kSteps, grad);
        double sum = 0;
        for (int64_t i = 0; i < kN; ++i) sum += std::fabs(w[i] - exact[i]) / kSteps;
        return sum / kN;
      };
      const double without = mean_error(false), with = mean_error(true), with_int8 = mean_error(true, true);
      std::printf(
          "int%d, %d ranks per host: mean error per step %.3g without LoCo, %.3g with, %.3g with int8 "
          "residuals\n",
          bits, per_host, without, with, with_int8);
      EXPECT_GT(without, 0.0) << "the gradient does not quantize exactly";
      EXPECT_LT(with, 0.2 * without);
      // Residuals kept in int8 blocks (the LoCo paper's 8-bit compensation error) remove the bias as well: each
      // residual is rounded to 1/254 of its block's largest, far below the rounding it corrects (measured: within
      // 1 % of the compute dtype's error). A residual read from another row's or block's place (one set of scales
      // for every row, say) leaves 2-3 times the error.
      EXPECT_LT(with_int8, 1.25 * with);
    }
  }
}

// What LoCo's residuals take, as the plan lays them out (QgzResidualLayout) and the memory report counts them under
// grads: with two hops (4 ranks as 2 hosts of 2) the whole gradient's N·S elements and the host partials' M·S, in
// the compute dtype (f32 here: 4 bytes each), or as int8 blocks (1 byte each and one f32 scale per block of each
// shard or partial): about a quarter.
TEST(QgzLoco, Int8ResidualsTakeAByteAndAScalePerBlock) {
  constexpr int kWorld = 4, kPerHost = 2;
  auto grads = [&](bool loco, bool int8) {
    Config cfg = QgzConfig(3, 8, loco);
    if (int8) cfg.zero.zero_quantized_gradients_error_feedback_dtype = QgzResidualDType::kInt8;
    int64_t bytes = -1;
    testing::RunRanks(kWorld, [&](Communicator& comm_ref, int rank) {
      ASSERT_OK_AND_ASSIGN(auto engine, OneUnitEngine(cfg, comm_ref, kPerHost));
      if (rank == 1) bytes = engine->memory_report().Get(MemTier::kDevice, MemTag::kGrads).current;
    });
    return bytes;
  };
  const int64_t off = grads(false, false), compute = grads(true, false), int8 = grads(true, true);
  const int64_t S = kN / kWorld, M = kWorld / kPerHost;  // 960 per shard (15 blocks of 64), 2 hosts
  const int64_t blocks = (S + kBlock - 1) / kBlock;
  EXPECT_EQ(compute - off, 4 * (kWorld * S + M * S));
  EXPECT_EQ(int8 - off, kWorld * S + 4 * kWorld * blocks + M * S + 4 * M * blocks);
}

// The host compute tier the records are coded on (the engine's, on the Gloo engine).
internal::ComputeTier& HostTier() {
  static MemoryTracker tracker;
  static const std::unique_ptr<internal::ComputeTier> tier = internal::MakeHostCompute(&tracker);
  return *tier;
}

TEST(QgzFormat, RecordsReadBackWithinHalfAStepAndLocoKeepsTheSmoothedResidual) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int bits : {8, 4}) {
    const internal::QgzFormat f{bits, kBlock, 1000};  // the last block short
    std::vector<float> x(f.S), e(f.S), e0(f.S), back(f.S), scratch(3 * f.S);
    for (float& v : x) v = dist(rng);
    for (float& v : e) v = 0.01f * dist(rng);
    e0 = e;
    std::vector<uint8_t> rec(f.record_bytes(), 0xAB);
    const float beta = 0.8f;
    f.Encode(HostTier(), x.data(), {}, {e.data(), nullptr, DType::kF32}, beta, rec.data(), scratch.data());
    f.Decode(HostTier(), rec.data(), {}, back.data(), /*acc=*/false, nullptr);
    const float levels = bits == 8 ? 127.0f : 7.0f;
    for (int64_t b = 0; b * kBlock < f.S; ++b) {
      float m = 0;
      for (int64_t i = b * kBlock; i < std::min(f.S, (b + 1) * kBlock); ++i) m = std::max(m, std::fabs(x[i] + e0[i]));
      for (int64_t i = b * kBlock; i < std::min(f.S, (b + 1) * kBlock); ++i) {
        const float y = x[i] + e0[i];
        ASSERT_LE(std::fabs(back[i] - y), 0.5f * m / levels * 1.0001f) << "int" << bits << " element " << i;
        ASSERT_EQ(e[i], beta * e0[i] + (1.0f - beta) * (y - back[i])) << "int" << bits << " element " << i;
      }
    }
    // The padding after the codes is zeroed: every byte on the wire is defined.
    const int64_t used = 4 * ((f.S + kBlock - 1) / kBlock) + (bits == 8 ? f.S : (f.S + 1) / 2);
    for (int64_t i = used; i < f.record_bytes(); ++i) EXPECT_EQ(rec[i], 0) << "padding byte " << i;
  }
}

// Residuals kept as int8 blocks (zero_quantized_gradients_error_feedback_dtype "int8"): Encode reads the residual
// dequantized, codes exactly the record an f32 residual of those values codes, and stores the updated f32 residual
// requantized in blocks; on the exact spans it stays exactly zero. The int8 step is the f32 step and a rounding,
// nothing else.
TEST(QgzFormat, Int8ResidualsAreTheF32StepRequantized) {
  std::mt19937 rng(8);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::vector<internal::ExactSpan> spans = {{3, 10}, {990, 1000}};
  for (int bits : {8, 4}) {
    SCOPED_TRACE(absl::StrCat("int", bits));
    const internal::QgzFormat f{bits, kBlock, 1000, /*exact=*/17};  // the last block short
    const int64_t blocks = (f.S + kBlock - 1) / kBlock;
    std::vector<float> x(f.S), e32(f.S), scratch(3 * f.S), start(f.S);
    for (float& v : x) v = dist(rng);
    for (float& v : start) v = 0.01f * dist(rng);
    for (const internal::ExactSpan& sp : spans) std::fill(start.begin() + sp.begin, start.begin() + sp.end, 0.0f);
    // The starting residual as int8 blocks, and the same values in f32.
    std::vector<int8_t> codes(f.S);
    std::vector<float> scales(blocks);
    internal::QuantizeInt8(start.data(), DType::kF32, f.S, kBlock, codes.data(), scales.data());
    internal::DequantizeInt8(codes.data(), scales.data(), f.S, kBlock, e32.data(), DType::kF32);
    std::vector<uint8_t> rec8(f.record_bytes()), rec32(f.record_bytes());
    f.Encode(HostTier(), x.data(), spans, {codes.data(), scales.data(), DType::kF32}, 0.8f, rec8.data(),
             scratch.data());
    f.Encode(HostTier(), x.data(), spans, {e32.data(), nullptr, DType::kF32}, 0.8f, rec32.data(), scratch.data());
    EXPECT_EQ(rec8, rec32) << "the same record from the same residual values";
    std::vector<int8_t> want_codes(f.S);
    std::vector<float> want_scales(blocks);
    internal::QuantizeInt8(e32.data(), DType::kF32, f.S, kBlock, want_codes.data(), want_scales.data());
    EXPECT_EQ(codes, want_codes);
    EXPECT_EQ(scales, want_scales);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < f.S; ++i) nonzero += codes[i] != 0;
    EXPECT_GT(nonzero, f.S / 2) << "a residual was carried";
    for (const internal::ExactSpan& sp : spans) {
      for (int64_t i = sp.begin; i < sp.end; ++i) EXPECT_EQ(codes[i], 0) << "span element " << i;
    }
  }
}

// A record's exact spans (a unit's 1-D parameters): their values come back bit for bit, their residual stays zero,
// and they count as zeros in their blocks: an outlier of 1e4 in a span does not coarsen the block's other elements.
TEST(QgzFormat, ExactSpansReadBackBitForBitAndSetNoBlocksScale) {
  std::mt19937 rng(6);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::vector<internal::ExactSpan> spans = {{3, 10}, {64, 70}, {990, 1000}};
  std::vector<bool> in_span(1000, false);
  for (const internal::ExactSpan& sp : spans) std::fill(in_span.begin() + sp.begin, in_span.begin() + sp.end, true);
  for (int bits : {8, 4}) {
    for (bool loco : {false, true}) {
      SCOPED_TRACE(absl::StrCat("int", bits, loco ? ", LoCo" : ""));
      const internal::QgzFormat f{bits, kBlock, 1000, /*exact=*/30};  // 23 used: 7 slots of zeros after them
      std::vector<float> x(f.S), e(f.S, 0.0f), back(f.S), scratch(3 * f.S);
      for (float& v : x) v = dist(rng);
      x[5] = 1e4f;  // in the first span, in block 0
      const std::vector<float> x0 = x;
      std::vector<uint8_t> rec(f.record_bytes(), 0xAB);
      f.Encode(HostTier(), x.data(), spans, {loco ? e.data() : nullptr, nullptr, DType::kF32}, 0.8f, rec.data(),
               scratch.data());
      ASSERT_EQ(x, x0) << "Encode wrote into its input";
      f.Decode(HostTier(), rec.data(), spans, back.data(), /*acc=*/false, nullptr);
      const float levels = bits == 8 ? 127.0f : 7.0f;
      for (int64_t b = 0; b * kBlock < f.S; ++b) {
        const int64_t lo = b * kBlock, hi = std::min(f.S, (b + 1) * kBlock);
        float m = 0;  // the block's largest outside the spans
        for (int64_t i = lo; i < hi; ++i) m = in_span[i] ? m : std::max(m, std::fabs(x[i]));
        for (int64_t i = lo; i < hi; ++i) {
          if (in_span[i]) {
            ASSERT_EQ(back[i], x[i]) << "element " << i << " of a span";
            ASSERT_EQ(e[i], 0.0f) << "the residual of element " << i << " of a span";
          } else {
            ASSERT_LE(std::fabs(back[i] - x[i]), 0.5f * m / levels * 1.0001f) << "element " << i;
          }
        }
      }
      if (loco) {
        EXPECT_NE(e[0], 0.0f) << "no residual outside the spans";
      }
      // After the 23 exact values, the record's 7 spare slots are zero.
      const int64_t tail = internal::QgzRecordBytes(f.S, kBlock, bits);
      for (int64_t i = tail + 4 * 23; i < f.record_bytes(); ++i) EXPECT_EQ(rec[i], 0) << "spare byte " << i;
    }
  }
}

// Which elements are exact: every parameter of at most one dimension, cut at the shard boundaries (adjacent ones
// merged), in a unit that also has a parameter of two dimensions or more; none in a unit of 1-D parameters only (a
// trainer's flat buffer).
TEST(ExactSpans, OneDimensionalParametersCutAtTheShards) {
  using internal::ExactParam;
  using internal::ExactSpan;
  // w (2-D) [0, 100), b [100, 110), g [110, 140), v (2-D) [140, 300), s (0-D) [300, 301), c [301, 320); shards of 80.
  const std::vector<ExactParam> params = {{0, 100, 2},   {100, 10, 1}, {110, 30, 1},
                                          {140, 160, 2}, {300, 1, 0},  {301, 19, 1}};
  int64_t most = -1;
  const std::vector<std::vector<ExactSpan>> spans = internal::ExactSpans(params, 80, 4, &most);
  ASSERT_EQ(spans.size(), 4u);
  EXPECT_EQ(spans[0], std::vector<ExactSpan>{});
  EXPECT_EQ(spans[1], (std::vector<ExactSpan>{{20, 60}}));  // b and g, merged
  EXPECT_EQ(spans[2], std::vector<ExactSpan>{});
  EXPECT_EQ(spans[3], (std::vector<ExactSpan>{{60, 80}}));  // s and c
  EXPECT_EQ(most, 40);
  // A 1-D parameter across a shard boundary.
  const std::vector<std::vector<ExactSpan>> cut = internal::ExactSpans({{0, 70, 2}, {70, 20, 1}}, 80, 2, &most);
  EXPECT_EQ(cut[0], (std::vector<ExactSpan>{{70, 80}}));
  EXPECT_EQ(cut[1], (std::vector<ExactSpan>{{0, 10}}));
  EXPECT_EQ(most, 10);
  // 1-D parameters only: quantized whole.
  const std::vector<std::vector<ExactSpan>> flat = internal::ExactSpans({{0, 100, 1}, {100, 60, 1}}, 80, 2, &most);
  EXPECT_EQ(flat, (std::vector<std::vector<ExactSpan>>(2)));
  EXPECT_EQ(most, 0);
}

// In the engine: a bias between two weight matrices, across a shard boundary, is reduced exact (its average of values
// that sum exactly in any order comes back bit for bit) while the weights are quantized; an outlier of 1e4 in it
// leaves the weights' error at their own scale. Registered with two dimensions ({1, n}), the same values are
// quantized like a weight, and the outlier coarsens the weights in its blocks.
TEST(QgzTraining, OneDimensionalParametersAreReducedExact) {
  const std::vector<ParamSpec> specs = {{"w1", {30, 60}}, {"b", {240}}, {"w2", {30, 60}}};  // b: [1800, 2040)
  const std::vector<ParamSpec> shaped = {{"w1", {30, 60}}, {"b", {1, 240}}, {"w2", {30, 60}}};
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  constexpr int kWorld = 4;
  std::vector<float> g(kN * kWorld);
  for (int r = 0; r < kWorld; ++r) {
    for (int64_t i = 0; i < kN; ++i) {
      const bool bias = i >= 1800 && i < 2040;
      // The bias: multiples of 1/8 below 2^10 (any order sums them exactly); one of them near 1e4.
      g[r * kN + i] = bias ? static_cast<float>(static_cast<int>(i * 7 + r * 13) % 200 - 100) / 8.0f : dist(rng);
    }
    g[r * kN + 1810] = 8192.0f + 1024.0f * static_cast<float>(r);  // in a block with 8 elements of w1
  }
  std::vector<double> exact(kN, 0.0);  // minus the average: SGD at lr 1 from zero
  for (int r = 0; r < kWorld; ++r) {
    for (int64_t i = 0; i < kN; ++i) exact[i] -= static_cast<double>(g[r * kN + i]) / kWorld;
  }
  auto grad = [&](int r, int64_t i) { return g[r * kN + i]; };
  for (int per_host : {4, 2}) {
    SCOPED_TRACE(absl::StrCat(per_host, " ranks per host"));
    auto weight_error = [&](const std::vector<float>& w) {
      double worst = 0;
      for (int64_t i = 0; i < kN; ++i) {
        if (i < 1800 || i >= 2040) worst = std::max(worst, std::fabs(w[i] - exact[i]));
      }
      return worst;
    };
    const std::vector<float> w = TrainOneUnit(QgzConfig(2, 8, true), kWorld, per_host, 1, grad, "", specs);
    for (int64_t i = 1800; i < 2040; ++i) {
      ASSERT_EQ(w[i], static_cast<float>(exact[i])) << "bias element " << i - 1800;
    }
    const double exact_bias = weight_error(w);
    EXPECT_GT(exact_bias, 0.0) << "the weights are not quantized";
    EXPECT_LT(exact_bias, 0.1);
    const std::vector<float> q = TrainOneUnit(QgzConfig(2, 8, true), kWorld, per_host, 1, grad, "", shaped);
    int inexact = 0;
    for (int64_t i = 1800; i < 2040; ++i) inexact += q[i] != static_cast<float>(exact[i]) ? 1 : 0;
    EXPECT_GT(inexact, 0) << "a {1, n} parameter is reduced exact";
    EXPECT_GT(weight_error(q), 10 * exact_bias) << "the outlier did not share a block with a weight";
  }
}

// A unit above reduce_bucket_size is reduced in quantized chunks of whole blocks (the reduce-scatter's chunk per rank
// rounded down to a multiple of the block): each chunk quantizes the blocks a whole reduction would, with the same
// LoCo residuals, and sums them in the same order, so the chunked reduction trains the whole one's bits: random
// gradients over 4 steps with a bias reduced exact across chunk and shard boundaries, int8 and int4, LoCo on, one hop
// and two, stages 2 and 3 (chunks of 256 of a shard of 960, the last of 192; at 6 ranks, 128 of 640).
TEST(QgzTraining, ChunkedReductionsTrainTheWholeReductionsBits) {
  const std::vector<ParamSpec> specs = {{"w1", {30, 60}}, {"b", {240}}, {"w2", {30, 60}}};  // b: [1800, 2040)
  auto grad = [](int r, int64_t i) {
    return std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(r)) * (i % 97 == 0 ? 30.0f : 1.0f);
  };
  struct C {
    int stage, bits, world, per_host;
    int64_t block = kBlock, bucket = 1024;
  };
  // Blocks of 50 (int8) and 100 (int4) under buckets whose chunks per rank (288, 320) whole blocks alone would cut
  // to 250 and 300 elements, records of 2 mod 4 bytes: chunks are a multiple of 8 elements too (200 here), so the
  // records, back to back, keep their f32 scales 4-byte aligned (UBSan's alignment check watches it).
  for (const C c : {C{2, 8, 4, 4}, C{3, 8, 4, 2}, C{3, 4, 4, 2}, C{2, 8, 6, 2}, C{3, 8, 4, 2, 50, 1152},
                    C{2, 4, 4, 4, 100, 1280}}) {
    SCOPED_TRACE(absl::StrCat("stage ", c.stage, " int", c.bits, " world ", c.world, ", ", c.per_host,
                              " per host, blocks of ", c.block));
    Config whole = QgzConfig(c.stage, c.bits, /*loco=*/true);
    whole.zero.zero_quantized_gradients_block_size = c.block;
    whole.zero.zeropp_loco_reset_t = 3;  // a reset within the run, counted per reduction, not per chunk
    Config chunked = whole;
    chunked.zero.reduce_bucket_size = c.bucket;
    // Steps whose gradients differ (LoCo carries each one's rounding into the next).
    auto train = [&](const Config& cfg, int64_t* chunks) {
      std::vector<std::vector<float>> out(c.world);
      testing::RunRanks(c.world, [&](Communicator& comm_ref, int rank) {
        EngineOptions o;
        o.local_world_size = c.per_host;
        ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(cfg, testing::Borrow(comm_ref), o));
        ASSERT_OK_AND_ASSIGN(UnitId u, engine->AddUnit("u", specs));
        ASSERT_OK(engine->Finalize(
            [](const std::string&, const ParamSpec& spec, float* p) { std::fill_n(p, spec.numel(), 0.0f); }));
        for (int step = 0; step < 4; ++step) {
          { ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Forward(u)); }
          {
            ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(u));
            int64_t base = 0;
            for (const ParamSpec& spec : specs) {
              ASSERT_OK_AND_ASSIGN(float* g, s.Grad<float>(spec.name));
              for (int64_t i = 0; i < spec.numel(); ++i) g[i] += grad(rank + 7 * step, base + i);
              base += spec.numel();
            }
          }
          ASSERT_OK(engine->Step().status());
        }
        ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Forward(u));
        for (const ParamSpec& spec : specs) {
          ASSERT_OK_AND_ASSIGN(float* w, s.Param<float>(spec.name));
          out[rank].insert(out[rank].end(), w, w + spec.numel());
        }
        if (rank == 0) *chunks = advanced::Stats(*engine).qgz_chunk_reductions;
      });
      return out[0];
    };
    int64_t none = -1, chunks = -1;
    const std::vector<float> a = train(whole, &none), b = train(chunked, &chunks);
    EXPECT_EQ(none, 0);
    const int64_t granule = std::lcm(c.block, int64_t{8});
    const int64_t S = kN / c.world, chunk = std::max(granule, c.bucket / c.world / 32 * 32 / granule * granule);
    EXPECT_EQ(chunks, 4 * ((S + chunk - 1) / chunk)) << "four steps' reductions, in chunks";
    ASSERT_EQ(a.size(), b.size());
    int moved = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(std::memcmp(&a[i], &b[i], 4), 0) << "element " << i << ": " << a[i] << " whole, " << b[i] << " chunked";
      moved += a[i] != 0.0f;
    }
    EXPECT_GT(moved, 0);
  }
}

// The issue's degenerate case: a unit of constants and one with an outlier of 1e4, AdamW towards a target, 30
// steps at 4 ranks in two hops with int4 and LoCo: nothing becomes NaN, and the loss falls.
TEST(QgzTraining, ConstantsAndAnOutlierTrainWithoutNaN) {
  testing::RunRanks(4, [&](Communicator& comm_ref, int rank) {
    Config cfg = QgzConfig(3, 4, true);
    OptimizerConfig adamw;
    adamw.type = "AdamW";
    adamw.lr = 1e-2;
    cfg.optimizer = adamw;
    EngineOptions o;
    o.local_world_size = 2;
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(cfg, testing::Borrow(comm_ref), o));
    ASSERT_OK_AND_ASSIGN(UnitId constants, engine->AddUnit("constants", {{"w", {kN}}}));
    ASSERT_OK_AND_ASSIGN(UnitId outlier, engine->AddUnit("outlier", {{"w", {kN}}}));
    ASSERT_OK(engine->Finalize([&](const std::string& name, const ParamSpec&, float* out) {
      for (int64_t i = 0; i < kN; ++i) out[i] = name.rfind("constants", 0) == 0 ? 0.5f : (i == 5 ? 1e4f : 0.01f);
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
        for (int64_t i = 0; i < kN; ++i) loss += 0.5 * (w[i] - target(i)) * (w[i] - target(i));
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
    EXPECT_LT(last_loss, first_loss) << "rank " << rank;
  });
}

// fp16 with dynamic loss scaling: a step whose gradient overflows (an infinity on one rank) is skipped, and the
// residuals it would have poisoned restart at zero, so the next steps are finite and applied (a NaN residual would
// make every later reduction of the unit non-finite: the scaler would skip every step).
TEST(QgzTraining, AnOverflowedFp16StepDoesNotPoisonTheResiduals) {
  for (int per_host : {4, 2}) {
    SCOPED_TRACE(absl::StrCat(per_host, " ranks per host"));
    testing::RunRanks(4, [&](Communicator& comm_ref, int rank) {
      Config cfg = QgzConfig(3, 8, true);
      cfg.fp16.enabled = true;
      EngineOptions o;
      o.local_world_size = per_host;
      ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(cfg, testing::Borrow(comm_ref), o));
      ASSERT_OK_AND_ASSIGN(UnitId u, engine->AddUnit("u", {{"w", {kN}}}));
      ASSERT_OK(engine->Finalize([](const std::string&, const ParamSpec&, float* p) { std::fill_n(p, kN, 0.0f); }));
      for (int step = 0; step < 5; ++step) {
        { ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Forward(u)); }
        {
          ASSERT_OK_AND_ASSIGN(UnitScope s, engine->Backward(u));
          ASSERT_OK_AND_ASSIGN(TensorView g, s.Grad("w"));
          for (int64_t i = 0; i < kN; ++i) StoreFromF32(g.data, g.dtype, i, 0.001f * static_cast<float>(i % 7 + 1));
          if (step == 2 && rank == 1) StoreFromF32(g.data, g.dtype, 10, std::numeric_limits<float>::infinity());
        }
        ASSERT_OK_AND_ASSIGN(StepResult r, engine->Step());
        EXPECT_EQ(r.skipped, step == 2) << "step " << step;
        if (step != 2) {
          EXPECT_TRUE(std::isfinite(r.grad_norm)) << "step " << step;
        }
      }
    });
  }
}

TEST(QgzConfig, ImpossibleConfigsAreErrorsNamingTheKeys) {
  Config stage0 = QgzConfig(0, 8, true);
  EXPECT_THAT(stage0.Validate(4),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                ::testing::HasSubstr("zero_optimization.zero_quantized_gradients")));
  Config bits = QgzConfig(2, 5, true);
  EXPECT_THAT(bits.Validate(4),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                ::testing::HasSubstr("zero_optimization.zero_quantized_gradients_bits: 5")));
  for (int stage : {1, 2, 3}) EXPECT_OK(QgzConfig(stage, 4, true).Validate(4)) << "stage " << stage;
  ASSERT_OK_AND_ASSIGN(Config parsed, Config::FromJsonString(R"({
      "train_micro_batch_size_per_gpu": 1,
      "zero_optimization": {"stage": 3, "zero_quantized_gradients": true,
                            "zeropp_loco_param": {"err_beta": 0.5, "reset_T": 100}}})"));
  EXPECT_TRUE(parsed.zero.zero_quantized_gradients);
  EXPECT_EQ(parsed.zero.zeropp_loco_err_beta, 0.5);
  EXPECT_EQ(parsed.zero.zeropp_loco_reset_t, 100);
  EXPECT_FALSE(Config::FromJsonString(R"({"train_micro_batch_size_per_gpu": 1,
      "zero_optimization": {"stage": 3, "zeropp_loco_param": {"err_beta": 1.5}}})")
                   .ok());
}

// The tiny GPT with qgZ (int8, two hops of 2 ranks, LoCo) trains to the exact run's losses at 4 thread-ranks over
// 100 steps: the mean loss of each 10 steps within 4 % of the exact run's, the last 10 steps' within 2.5 %
// (measured: at most 1.68 %, the last 1.36 %). The runs drift apart as any two runs that differ in the last bits do:
// on this model, int8 without LoCo, or with blocks of 128, ended 0.3-0.8 % from the exact run, on either side, so
// the bound is the drift's with room for another CPU's kernels, not the quantization's alone
// (bench/results/zeropp.md has the small GPT's 300 steps).
TEST(QgzGpt, TrainsToTheExactLosses) {
  constexpr int kSteps = 100, kWindow = 10;
  const Config exact = testing::TrainConfig(3, 2);
  Config qgz = exact;
  qgz.zero.zero_quantized_gradients = true;
  gpt::TrainOptions opt = testing::TinyGptOptions(4, kSteps);
  opt.local_world_size = 2;  // two hosts of two ranks: both hops run
  const testing::TinyGptRanks a = testing::RunTinyGpt(4, exact, opt);
  const testing::TinyGptRanks b = testing::RunTinyGpt(4, qgz, opt);
  ASSERT_OK(a.status);
  ASSERT_OK(b.status);
  const auto& sa = a.results[0].steps;
  const auto& sb = b.results[0].steps;
  ASSERT_EQ(sa.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(sb.size(), static_cast<size_t>(kSteps));
  for (int w = 0; w < kSteps / kWindow; ++w) {
    double ma = 0, mb = 0;
    for (int s = w * kWindow; s < (w + 1) * kWindow; ++s) {
      ASSERT_TRUE(std::isfinite(sb[s].loss)) << "step " << s + 1;
      ma += sa[s].loss / kWindow;
      mb += sb[s].loss / kWindow;
    }
    const double gap = std::fabs(mb - ma) / ma, bound = w + 1 == kSteps / kWindow ? 0.025 : 0.04;
    std::printf("qgz steps %d-%d: mean loss %.4f vs %.4f exact (gap %.2f %%)\n", w * kWindow + 1, (w + 1) * kWindow, mb,
                ma, 100 * gap);
    EXPECT_LE(gap, bound) << "steps " << w * kWindow + 1 << "-" << (w + 1) * kWindow;
  }
  EXPECT_LT(sb.back().loss, sb.front().loss) << "it trains";
  EXPECT_LT(sb.back().inter_host_bytes, sa.back().inter_host_bytes) << "fewer bytes across hosts";
}

}  // namespace
}  // namespace zero
