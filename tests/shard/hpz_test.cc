// ZeRO++'s hpZ (zero_hpz_partition_size H) on the host engine at stage 3, 2 ranks per host, H = 2, threads over
// real Gloo:
// - it trains plain stage 3 bit for bit (fp32 and bf16, worlds 2 and 4, with and without offload_optimizer): the
//   backward gathers from the secondary copy move the values the forward gathered, which are the parameters;
// - with qwZ the secondary copy holds the dequantized forward values (as ZeRO++ copies its secondary tensor from
//   the gathered parameter), so a backward scope sees exactly its forward's quantized weights: training equals,
//   bit for bit, plain qwZ with a trainer that computes its backward from the values its forward saw;
// - the backward gathers stay inside the host: the bytes per step equal a closed formula, rank by rank, and
//   zero::Estimate's prediction, and fewer cross hosts than plain stage 3;
// - each rank holds Ψ/H more parameter bytes (compute dtype), as the plan, the memory report and Estimate say;
// - a checkpoint saved with hpZ resumes bit for bit with hpZ on or off;
// - a checkpoint saved with qwZ, hpZ and qgZ all on holds the exact masters, which load at other worlds and stages
//   with ZeRO++ on or off;
// - what cannot work is refused, naming the keys.
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "shard/internal/agree.h"
#include "shard/internal/compute.h"
#include "shard/internal/registration.h"
#include "support/engine_helpers.h"
#include "support/files.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/checkpoint.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/estimate.h"
#include "zero/logging.h"
#include "zero/memory.h"

namespace zero {
namespace {

using testing::Borrow;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::TrainConfig;

constexpr int kPerHost = 2;
constexpr int kSteps = 4;
constexpr int64_t kBlock = 64;

Config Hpz(Config c, int H = 2) {
  c.zero.zero_hpz_partition_size = H;
  return c;
}
Config Qwz(Config c) {
  c.zero.zero_quantized_weights = true;
  c.zero.zero_quantized_weights_block_size = kBlock;
  return c;
}

EngineOptions PerHost(int n = kPerHost) {
  EngineOptions o;
  o.local_world_size = n;
  return o;
}

std::vector<testing::SyntheticTrace> Train(int world, const Config& cfg, std::vector<MemoryReport>* memory = nullptr) {
  std::vector<testing::SyntheticTrace> out(world);
  if (memory != nullptr) memory->assign(world, {});
  absl::Mutex mu;
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm), PerHost()));
    const MemoryReport m = e->memory_report();
    testing::SyntheticTrace t;
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kSteps, 1, testing::HostViewIo(), &t));
    absl::MutexLock lock(&mu);
    out[rank] = std::move(t);
    if (memory != nullptr) (*memory)[rank] = m;
  });
  return out;
}

void ExpectBitwiseEqual(const testing::SyntheticTrace& a, const testing::SyntheticTrace& b) {
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t k = 0; k < a.steps.size(); ++k) EXPECT_EQ(a.steps[k].grad_norm, b.steps[k].grad_norm) << "step " << k;
  ASSERT_EQ(a.params.size(), b.params.size());
  for (const auto& [name, v] : a.params) {
    const std::vector<float>& w = b.params.at(name);
    ASSERT_EQ(v.size(), w.size()) << name;
    EXPECT_EQ(std::memcmp(v.data(), w.data(), v.size() * sizeof(float)), 0) << name;
  }
}

struct Layout {
  int world;
  bool bf16;
  bool offload = false;  // offload_optimizer "cpu": the step on the host, the parameters copied back each step
};

class HpzParityTest : public ::testing::TestWithParam<Layout> {};

TEST_P(HpzParityTest, TrainsPlainStage3BitForBit) {
  const auto [world, bf16, offload] = GetParam();
  Config base = TrainConfig(3, 1);
  base.bf16.enabled = bf16;
  if (offload) base.zero.offload_optimizer.device = OffloadDevice::kCpu;
  const auto plain = Train(world, base);
  const auto hpz = Train(world, Hpz(base));
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ExpectBitwiseEqual(hpz[r], plain[r]);
    for (const auto& [name, v] : hpz[r].params) EXPECT_GT(testing::MovedElements(name, v), v.size() / 2) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HpzParityTest,
                         ::testing::Values(Layout{2, false}, Layout{4, false}, Layout{4, true}, Layout{2, true},
                                           Layout{4, true, true}, Layout{2, false, true}),
                         [](const auto& info) {
                           return absl::StrCat("world", info.param.world, info.param.bf16 ? "_bf16" : "_fp32",
                                               info.param.offload ? "_offload_optimizer" : "");
                         });

// The synthetic trainer's arithmetic (synthetic_trainer.h), the backward's gradient from the backward view's
// parameters. Records what each scope saw at step 0.
struct Seen {
  std::map<std::string, std::vector<float>> forward, backward;  // step 0, "unit.param"
  testing::SyntheticTrace trace;
};

void TrainSeeing(Engine& e, Seen* seen) {
  std::vector<UnitId> ids;
  for (const auto& [name, specs] : testing::SyntheticUnits()) ids.push_back(e.FindUnit(name));
  const testing::ViewIo io = testing::HostViewIo();
  std::vector<unsigned char> pbuf, gbuf;
  for (int k = 0; k < kSteps; ++k) {
    std::map<std::string, std::vector<float>> forward;
    for (size_t u = 0; u < ids.size(); ++u) {
      ASSERT_OK_AND_ASSIGN(auto f, e.Forward(ids[u]));
      for (const ParamSpec& spec : e.UnitParams(ids[u])) {
        ASSERT_OK_AND_ASSIGN(const TensorView pv, f.Param(spec.name));
        ASSERT_NO_FATAL_FAILURE(io.read(pv, &pbuf));
        std::vector<float>& v = forward[testing::SyntheticUnits()[u].first + "." + spec.name];
        for (int64_t i = 0; i < pv.numel; ++i) v.push_back(LoadAsF32(pbuf.data(), pv.dtype, i));
      }
    }
    for (size_t u = ids.size(); u-- > 0;) {
      ASSERT_OK_AND_ASSIGN(auto b, e.Backward(ids[u]));
      for (const ParamSpec& spec : e.UnitParams(ids[u])) {
        const std::string name = testing::SyntheticUnits()[u].first + "." + spec.name;
        ASSERT_OK_AND_ASSIGN(const TensorView pv, b.Param(spec.name));
        ASSERT_OK_AND_ASSIGN(const TensorView gv, b.Grad(spec.name));
        ASSERT_NO_FATAL_FAILURE(io.read(pv, &pbuf));
        ASSERT_NO_FATAL_FAILURE(io.read(gv, &gbuf));
        std::vector<float> p(pv.numel);
        for (int64_t i = 0; i < pv.numel; ++i) p[i] = LoadAsF32(pbuf.data(), pv.dtype, i);
        if (k == 0) seen->backward[name] = p;
        for (int64_t i = 0; i < gv.numel; ++i) {
          const float g =
              0.01f * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(k) + static_cast<float>(e.rank())) +
              0.1f * p[i];
          StoreFromF32(gbuf.data(), gv.dtype, i, LoadAsF32(gbuf.data(), gv.dtype, i) + g);
        }
        ASSERT_NO_FATAL_FAILURE(io.write(gbuf, gv));
      }
    }
    if (k == 0) seen->forward = forward;
    ASSERT_OK_AND_ASSIGN(const StepResult r, e.Step());
    seen->trace.steps.push_back(r);
  }
  for (size_t u = 0; u < ids.size(); ++u) {
    for (const ParamSpec& spec : e.UnitParams(ids[u])) {
      ASSERT_OK_AND_ASSIGN(seen->trace.params[testing::SyntheticUnits()[u].first + "." + spec.name],
                           e.GatherParam(ids[u], spec.name));
    }
  }
}

std::vector<Seen> TrainSeeing(int world, const Config& cfg) {
  std::vector<Seen> out(world);
  absl::Mutex mu;
  testing::RunRanks(world, [&](Communicator& comm, int rank) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, Borrow(comm), PerHost()));
    Seen s;
    ASSERT_NO_FATAL_FAILURE(TrainSeeing(*e, &s));
    absl::MutexLock lock(&mu);
    out[rank] = std::move(s);
  });
  return out;
}

class HpzQwzTest : public ::testing::TestWithParam<int> {};

TEST_P(HpzQwzTest, BackwardSeesTheForwardsQuantizedWeights) {
  const int world = GetParam();
  const Config qwz = Qwz(TrainConfig(3, 1));
  const auto both = TrainSeeing(world, Hpz(qwz));
  const auto plain = TrainSeeing(world, qwz);                // qwZ alone: every gather quantized
  const auto exact = TrainSeeing(world, TrainConfig(3, 1));  // step 0's parameters
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    int64_t quantized = 0;
    for (const auto& [name, fwd] : both[r].forward) {
      // The forward gathers the same quantized values with or without hpZ, and the backward sees them again: from
      // the secondary copy with hpZ, from a quantized gather of the unchanged shard without.
      const std::vector<float>& ref_fwd = plain[r].forward.at(name);
      ASSERT_EQ(fwd.size(), ref_fwd.size());
      EXPECT_EQ(std::memcmp(fwd.data(), ref_fwd.data(), fwd.size() * sizeof(float)), 0) << name;
      const std::vector<float>& bwd = both[r].backward.at(name);
      EXPECT_EQ(std::memcmp(fwd.data(), bwd.data(), fwd.size() * sizeof(float)), 0) << name;
      const std::vector<float>& ref_bwd = plain[r].backward.at(name);
      EXPECT_EQ(std::memcmp(fwd.data(), ref_bwd.data(), fwd.size() * sizeof(float)), 0) << name;
      const std::vector<float>& e = exact[r].backward.at(name);
      for (size_t i = 0; i < fwd.size(); ++i) quantized += fwd[i] != e[i];
    }
    EXPECT_GT(quantized, 0);  // the forward's values really are quantized
    ExpectBitwiseEqual(both[r].trace, plain[r].trace);
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, HpzQwzTest, ::testing::Values(2, 4),
                         [](const auto& info) { return absl::StrCat("world", info.param); });

// World 4, 2 ranks per host, H = 2: per unit of padded size P (S = P / 4, f32), rank w sends per step the forward
// gather's 3 S · 4 bytes to w + 1 (Gloo's ring: inside the host from ranks 0 and 2, across from 1 and 3), the
// backward gather's P / 2 · 4 bytes to its host partner w XOR 1, and the reduce-scatter's 2 S · 4 to w XOR 1, S · 4
// to w XOR 2 (across) and, from ranks 1 and 2, S · 4 to each other (across); the hpZ group's and shard group's
// fingerprints (check mode: 32 bytes per op and other rank, to the next rank); the norm's and the desync check's
// all-reduces to w - 1 (16, 12, 20, 24 bytes and 192).
std::array<int64_t, 2> Formula(int w) {
  std::array<int64_t, 2> b{0, 0};
  auto to = [&](int peer, int64_t bytes) { b[(peer % 4) / kPerHost == w / kPerHost ? 0 : 1] += bytes; };
  for (const EstimateUnit& u : testing::SyntheticEstimateUnits()) {
    const int64_t P = (u.numel + 127) / 128 * 128, S = P / 4;
    to(w + 1, 3 * S * 4 + 2 * 3 * 32);  // forward gather; its and the reduce-scatter's fingerprints
    to(w ^ 1, P / 2 * 4 + 32);          // backward gather in the host group, and its fingerprint
    to(w ^ 1, 2 * S * 4);
    to(w ^ 2, S * 4);
    if (w == 1 || w == 2) to(3 - w, S * 4);
  }
  to(w + 3, std::array<int64_t, 4>{16, 12, 20, 24}[w] + 192);
  to(w + 1, 2 * 3 * 32);
  return b;
}

TEST(HpzTrafficTest, BackwardGathersStayInsideTheHost) {
  const Config cfg = Hpz(TrainConfig(3, 1));
  const auto hpz = Train(4, cfg);
  const auto plain = Train(4, TrainConfig(3, 1));
  int64_t across = 0, plain_across = 0;
  for (int w = 0; w < 4; ++w) {
    SCOPED_TRACE(absl::StrCat("rank ", w));
    const std::array<int64_t, 2> want = Formula(w);
    for (const StepResult& s : hpz[w].steps) {
      EXPECT_EQ(s.intra_host_bytes, want[0]);
      EXPECT_EQ(s.inter_host_bytes, want[1]);
      // Ranks 0 and 2 send their ring all-gathers inside the host anyway; 1 and 3 no longer send backward's across.
      EXPECT_LE(s.inter_host_bytes, plain[w].steps[0].inter_host_bytes);
    }
    across += hpz[w].steps[0].inter_host_bytes;
    plain_across += plain[w].steps[0].inter_host_bytes;
    EstimateOptions o;
    o.world = 4;
    o.rank = w;
    o.ranks_per_host = kPerHost;
    o.check_order = true;
    ASSERT_OK_AND_ASSIGN(const RankEstimate e, Estimate(cfg, testing::SyntheticEstimateUnits(), o));
    EXPECT_EQ(e.intra_host_bytes, want[0]);
    EXPECT_EQ(e.inter_host_bytes, want[1]);
  }
  // What crossed with plain stage 3 and no longer does: ranks 1 and 3's backward gathers, 3 S · 4 bytes and a
  // fingerprint each per unit.
  int64_t backward_across = 0;
  for (const EstimateUnit& u : testing::SyntheticEstimateUnits())
    backward_across += 2 * (3 * ((u.numel + 127) / 128 * 128 / 4) * 4 + 3 * 32);
  EXPECT_EQ(plain_across - across, backward_across);
}

// Ψ/H more parameter bytes per rank, in the compute dtype, tagged params; the estimate says the same.
TEST(HpzMemoryTest, EachRankHoldsPsiOverHMore) {
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    Config base = TrainConfig(3, 1);
    base.bf16.enabled = bf16;
    std::vector<MemoryReport> with, without;
    Train(4, Hpz(base), &with);
    Train(4, base, &without);
    int64_t psi = 0;
    for (const EstimateUnit& u : testing::SyntheticEstimateUnits()) psi += (u.numel + 127) / 128 * 128;
    const int64_t extra = psi / 2 * (bf16 ? 2 : 4);
    const auto params = [](const MemoryReport& m) {
      return m.usage[static_cast<size_t>(MemTier::kDevice)][static_cast<size_t>(MemTag::kParams)].current;
    };
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(params(with[r]) - params(without[r]), extra) << "rank " << r;
      EXPECT_EQ(with[r].ModelStateBytes() - without[r].ModelStateBytes(), extra) << "rank " << r;
    }
    EstimateOptions o;
    o.world = 4;
    ASSERT_OK_AND_ASSIGN(const RankEstimate e, Estimate(Hpz(base), testing::SyntheticEstimateUnits(), o));
    ASSERT_OK_AND_ASSIGN(const RankEstimate e0, Estimate(base, testing::SyntheticEstimateUnits(), o));
    EXPECT_EQ(params(e.planned) - params(e0.planned), extra);
    EXPECT_EQ(params(e.planned), params(with[0]));
  }
}

// The secondary copy is derived state: a checkpoint saved with hpZ on holds what plain stage 3 saves, and training
// on from it, with hpZ on or off, gives what training straight on gives, bit for bit (Load marks the copies stale).
TEST(HpzCheckpointTest, ResumedWithOrWithoutHpzBitForBit) {
  const std::string dir = testing::MakeTempDir("hpz_ckpt");
  const Config hpz = Hpz(TrainConfig(3, 1));
  std::vector<testing::SyntheticTrace> straight(4), with(4), without(4);
  testing::RunRanks(4, [&](Communicator& comm, int rank) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(hpz, Borrow(comm), PerHost()));
    testing::SyntheticTrace t;
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 3, 1, testing::HostViewIo(), &t));
    ASSERT_OK(e->Save(dir, {.tag = "mid"}).status());
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 3, 1, testing::HostViewIo(), &straight[rank], 3));
  });
  for (const bool on : {true, false}) {
    testing::RunRanks(4, [&](Communicator& comm, int rank) {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(on ? hpz : TrainConfig(3, 1), Borrow(comm), PerHost()));
      ASSERT_OK_AND_ASSIGN(LoadResult r, e->Load(dir, {.tag = "mid"}));
      EXPECT_EQ(r.step, 3);
      ASSERT_NO_FATAL_FAILURE(
          testing::TrainSynthetic(*e, 3, 1, testing::HostViewIo(), on ? &with[rank] : &without[rank], 3));
    });
  }
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ExpectBitwiseEqual(with[r], straight[r]);
    ExpectBitwiseEqual(without[r], straight[r]);
  }
}

// ZeRO++ changes what moves on the wire, never what a checkpoint holds: with qwZ, hpZ and qgZ all on (4 ranks as
// 2 hosts of 2, fp32 and bf16), Save writes the exact fp32 masters, not the int8 values the scopes saw, and they
// load bit for bit at world 2 with ZeRO++ off, at world 3 (one host of 3, stage 2) with qgZ only, and at world 4
// with all three again, each at step 3. What each load gathers is compared with the masters the saving run
// gathered, and those differ from what its forward scopes saw (else the test could not tell them apart).
TEST(ZeroppCheckpointTest, SavesTheExactMastersAndLoadsAtOtherWorldsOnOrOff) {
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const std::string dir = testing::MakeTempDir("zeropp_ckpt");
    Config plain = TrainConfig(3, 1);
    plain.bf16.enabled = bf16;
    Config all = Hpz(Qwz(plain));
    all.zero.zero_quantized_gradients = true;
    std::vector<testing::SyntheticTrace> saved(4);
    std::vector<int64_t> seen_quantized(4);
    testing::RunRanks(4, [&](Communicator& comm, int rank) {
      ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(all, Borrow(comm), PerHost()));
      ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 3, 1, testing::HostViewIo(), &saved[rank]));
      ASSERT_OK(e->Save(dir, {.tag = "s3"}).status());
      // What a forward scope sees now: the masters quantized (and rounded to bf16).
      for (const auto& [unit, specs] : testing::SyntheticUnits()) {
        ASSERT_OK_AND_ASSIGN(UnitScope s, e->Forward(e->FindUnit(unit)));
        for (const ParamSpec& spec : specs) {
          ASSERT_OK_AND_ASSIGN(const TensorView v, s.Param(spec.name));
          const std::vector<float>& master = saved[rank].params.at(unit + "." + spec.name);
          for (int64_t i = 0; i < v.numel; ++i) seen_quantized[rank] += LoadAsF32(v.data, v.dtype, i) != master[i];
        }
      }
    });
    for (int r = 0; r < 4; ++r) EXPECT_GT(seen_quantized[r], 0) << "rank " << r;
    Config qgz_only = plain;
    qgz_only.zero.stage = 2;
    qgz_only.zero.zero_quantized_gradients = true;
    const struct {
      const char* name;
      int world, per_host;
      Config cfg;
    } loads[] = {{"world 2, ZeRO++ off", 2, 1, plain},
                 {"world 3, stage 2, qgZ only", 3, 3, qgz_only},
                 {"world 4, all three", 4, 2, all}};
    for (const auto& l : loads) {
      SCOPED_TRACE(l.name);
      testing::RunRanks(l.world, [&](Communicator& comm, int rank) {
        ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(l.cfg, Borrow(comm), PerHost(l.per_host)));
        ASSERT_OK_AND_ASSIGN(LoadResult r, e->Load(dir, {.tag = "s3"}));
        EXPECT_EQ(r.step, 3);
        for (const auto& [unit, specs] : testing::SyntheticUnits()) {
          for (const ParamSpec& spec : specs) {
            ASSERT_OK_AND_ASSIGN(std::vector<float> got, e->GatherParam(e->FindUnit(unit), spec.name));
            const std::vector<float>& want = saved[0].params.at(unit + "." + spec.name);
            ASSERT_EQ(got.size(), want.size());
            EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                << unit << "." << spec.name << " on rank " << rank;
          }
        }
      });
    }
  }
}

// Each refusal names the keys (and, at Engine::Create, the ranks per host).
TEST(HpzRefusalTest, WhatCannotWorkIsRefusedByName) {
  auto fails = [](const Config& c, int world, EngineOptions o, const std::string& what) {
    testing::RunRanks(world, [&](Communicator& comm, int) {
      auto e = Engine::Create(c, Borrow(comm), o);
      ASSERT_FALSE(e.ok());
      EXPECT_THAT(std::string(e.status().message()), HasSubstr("zero_optimization.zero_hpz_partition_size"));
      EXPECT_THAT(std::string(e.status().message()), HasSubstr(what));
    });
  };
  fails(Hpz(TrainConfig(2, 1)), 2, PerHost(), "zero_optimization.stage 2");
  fails(Hpz(TrainConfig(3, 1), 4), 2, PerHost(), "does not divide the world size 2");
  Config hybrid = Hpz(TrainConfig(3, 1));
  hybrid.zero.mics_shard_size = 2;
  fails(hybrid, 4, PerHost(), "mics_shard_size");
  Config offload = Hpz(TrainConfig(3, 1));
  offload.zero.offload_param.device = OffloadDevice::kCpu;
  fails(offload, 2, PerHost(), "offload_param");
  fails(Hpz(TrainConfig(3, 1)), 2, PerHost(1), "does not divide the 1 ranks per host");
  fails(Hpz(TrainConfig(3, 1), 4), 4, PerHost(2), "does not divide the 2 ranks per host");
  // Estimate refuses what Validate refuses.
  EstimateOptions o;
  o.world = 2;
  EXPECT_FALSE(Estimate(Hpz(TrainConfig(2, 1)), testing::SyntheticEstimateUnits(), o).ok());
}

// EngineOptions::local_world_size left at 0: the ranks per host are the launcher's, whichever launcher it is
// (torchrun's LOCAL_WORLD_SIZE, OpenMPI's OMPI_COMM_WORLD_LOCAL_SIZE, Slurm's tasks on this node). Under Slurm
// and OpenMPI they were once taken as 1, which refused hpZ and put qgZ's hops across every rank. The variables
// are set before the thread-ranks start and removed after they end (the ranks rendezvous through the test's own
// store, not through these).
TEST(HpzRefusalTest, RanksPerHostFromEachLauncher) {
  struct Launch {
    std::string name;
    std::map<std::string, std::string> vars;
    int per_host;  // what the engine must take
  };
  const std::vector<Launch> launches = {
      {"torchrun", {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}}, 2},
      {"openmpi",
       {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
       2},
      {"slurm",
       {{"SLURM_PROCID", "0"},
        {"SLURM_STEP_NUM_TASKS", "4"},
        {"SLURM_NODEID", "0"},
        {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}},
       2},
      {"slurm, one task per node",
       {{"SLURM_PROCID", "0"},
        {"SLURM_STEP_NUM_TASKS", "4"},
        {"SLURM_NODEID", "0"},
        {"SLURM_STEP_TASKS_PER_NODE", "1(x4)"}},
       1},
      {"no launcher", {}, 1},
  };
  for (const Launch& l : launches) {
    SCOPED_TRACE(l.name);
    for (const auto& [k, v] : l.vars) ::setenv(k.c_str(), v.c_str(), 1);
    EXPECT_EQ(Communicator::LaunchedLocalWorldSize(), l.per_host == 1 && l.vars.empty() ? 0 : l.per_host);
    testing::RunRanks(4, [&](Communicator& comm, int) {
      auto e = Engine::Create(Hpz(TrainConfig(3, 1)), Borrow(comm), EngineOptions{});
      if (l.per_host == 2) {
        EXPECT_OK(e.status());
      } else {
        ASSERT_FALSE(e.ok());
        EXPECT_THAT(std::string(e.status().message()), HasSubstr("does not divide the 1 ranks per host"));
      }
    });
    for (const auto& [k, v] : l.vars) ::unsetenv(k.c_str());
  }
}

// The hosts hpZ, qgZ and hybrid sharding group ranks by must be the hosts the launcher put them on.
// HostLayoutStatus decides from every rank's place the same way on every rank.
TEST(HostLayoutTest, BlocksPassOtherNumberingsAndUnequalHostsAreRefused) {
  using internal::HostLayoutStatus;
  using internal::HostPlace;
  auto places = [](std::vector<int> local, int per_host, int launcher) {
    std::vector<HostPlace> all;
    for (int l : local) all.push_back({per_host, l, launcher});
    return all;
  };
  // mpirun -H h0:2,h1:2 (by slot): ranks 0-1 on h0, 2-3 on h1.
  EXPECT_OK(HostLayoutStatus(places({0, 1, 0, 1}, 2, 1), true, false));
  EXPECT_OK(HostLayoutStatus(places({0, 1, 0, 1}, 2, 1), false, true));
  EXPECT_OK(HostLayoutStatus(places({-1, -1, -1, -1}, 2, 0), true, true));  // not checked (torchrun, zero-run)
  // mpirun --map-by node (srun --distribution=cyclic): ranks 0 and 2 on h0, 1 and 3 on h1.
  for (int launcher : {1, 2}) {
    for (bool hpz : {true, false}) {
      Status s = HostLayoutStatus(places({0, 0, 1, 1}, 2, launcher), hpz, !hpz);
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr(hpz ? "zero_optimization.zero_hpz_partition_size"
                                                          : "zero_optimization.zero_quantized_gradients"));
      EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 is local rank 0 of its host"));
      EXPECT_THAT(std::string(s.message()), HasSubstr(launcher == 1 ? "OMPI_COMM_WORLD_LOCAL_RANK" : "SLURM_LOCALID"));
      EXPECT_THAT(std::string(s.message()), HasSubstr(launcher == 1 ? "--map-by slot" : "--distribution=block"));
    }
  }
  EXPECT_OK(HostLayoutStatus(places({0, 0, 1, 1}, 2, 1), false, false));  // neither on: no host grouping
  // Hybrid sharding's shard groups of consecutive ranks: laid over hosts numbered in blocks, refused over others.
  EXPECT_OK(HostLayoutStatus(places({0, 1, 0, 1}, 2, 1), false, false, true));
  for (int launcher : {1, 2}) {
    Status s = HostLayoutStatus(places({0, 0, 1, 1}, 2, launcher), false, false, true);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("zero_optimization.mics_shard_size"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 is local rank 0 of its host"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("a shard group would span hosts"));
    // The advice fits hybrid: its groups do not follow EngineOptions::local_world_size.
    EXPECT_THAT(std::string(s.message()), Not(HasSubstr("local_world_size")));
  }
  // hpZ's key first where both group by host (hybrid with hpZ is refused by the config; the decision stays one).
  EXPECT_THAT(std::string(HostLayoutStatus(places({0, 0, 1, 1}, 2, 1), true, false, true).message()),
              HasSubstr("zero_hpz_partition_size"));
  // One host, or a host per rank: no group can span two.
  EXPECT_OK(HostLayoutStatus(places({1, 0}, 2, 1), true, true));
  EXPECT_OK(HostLayoutStatus(places({0, 0, 0}, 1, 2), false, true));
  // Unequal hosts (Slurm's "2,1"): qgZ takes one hop everywhere, fine; hpZ's groups cannot be placed.
  std::vector<HostPlace> uneven = {{2, 0, 2}, {2, 1, 2}, {1, 0, 2}};
  EXPECT_OK(HostLayoutStatus(uneven, false, true));
  EXPECT_OK(HostLayoutStatus(uneven, false, false, true));  // hybrid's groups do not follow the counts
  Status s = HostLayoutStatus(uneven, true, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 has 2, rank 2 has 1"));
  // Hosts of 2, 2 and 4 ranks at world 8: qgZ would take two hops on some ranks and one on the others.
  std::vector<HostPlace> mixed(8, HostPlace{2, -1, 0});
  for (int r = 4; r < 8; ++r) mixed[r].ranks_per_host = 4;
  s = HostLayoutStatus(mixed, false, true);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("different hops"));
}

// The same through Engine::Create, every rank refusing alike: OpenMPI's variables (as every process of an mpirun
// --map-by node job would hold its own) say this process is rank 1 at local rank 0 of 2; the thread-rank 1, whose
// rank and world are those, checks it; the others have no launcher place of their own.
TEST(HostLayoutTest, EngineRefusesRanksNotNumberedHostByHost) {
  const std::map<std::string, std::string> vars = {
      {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  for (const char* local : {"0", "1"}) {
    for (const char* grouping : {"hpZ", "qgZ", "hybrid"}) {
      SCOPED_TRACE(absl::StrCat("local rank ", local, ", ", grouping));
      for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
      ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", local, 1);
      Config c = TrainConfig(3, 1);
      if (std::string(grouping) == "hpZ") {
        c = Hpz(c);
      } else if (std::string(grouping) == "qgZ") {
        c.zero.zero_quantized_gradients = true;
      } else {
        c.zero.mics_shard_size = 2;  // hybrid sharding: shard groups {0, 1} and {2, 3}
      }
      // Shard groups of one rank (plain data parallelism) cannot span hosts: never refused.
      Config one = TrainConfig(3, 1);
      one.zero.mics_shard_size = 1;
      testing::RunRanks(4, [&](Communicator& comm, int) {
        auto e = Engine::Create(c, Borrow(comm), EngineOptions{});
        if (std::string(local) == "1") {
          EXPECT_OK(e.status());
        } else {
          ASSERT_FALSE(e.ok());
          EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition) << e.status();
          EXPECT_THAT(std::string(e.status().message()), HasSubstr("rank 1 is local rank 0 of its host"));
        }
        // The launcher's count passed on as EngineOptions::local_world_size (as zero-gpt does) is checked alike; a
        // numbering of the trainer's own (another count) is not second-guessed.
        auto passed_on = Engine::Create(c, Borrow(comm), PerHost(2));
        EXPECT_EQ(passed_on.ok(), std::string(local) == "1") << passed_on.status();
        EXPECT_OK(Engine::Create(c, Borrow(comm), PerHost(4)).status());
        if (std::string(grouping) == "hybrid") {
          EXPECT_OK(Engine::Create(one, Borrow(comm), EngineOptions{}).status());
        }
      });
      for (const auto& [k, v] : vars) ::unsetenv(k.c_str());
      ::unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    }
  }
}

// Hybrid shard groups that straddle hosts (neither mics_shard_size nor the ranks per host divides the other) work,
// and rank 0 says so once per engine, naming the first such group; groups inside a host or of whole hosts are not
// mentioned.
TEST(HostLayoutTest, HybridGroupsThatStraddleHostsAreSaid) {
  struct Case {
    int shard, per_host;
    const char* said;  // nullptr: nothing said
  };
  const Case cases[] = {
      {2, 3,
       "shard groups of 2 consecutive ranks over hosts of 3 ranks: neither size divides the other, so shard "
       "groups straddle hosts (the first: ranks 2-3)"},
      {3, 2,
       "shard groups of 3 consecutive ranks over hosts of 2 ranks: neither size divides the other, so shard "
       "groups straddle hosts (the first: ranks 0-2)"},
      {2, 5,
       "shard groups of 2 consecutive ranks over hosts of 5 ranks: neither size divides the other, so shard "
       "groups straddle hosts (the first: ranks 4-5)"},
      {2, 2, nullptr},  // each group inside a host
      {3, 3, nullptr},
      {2, 6, nullptr},  // one host
      {3, 1, nullptr},  // no count: nothing known of the hosts
  };
  const LogLevel level = CurrentLogLevel();
  if (!LogEnabled(LogLevel::kWarning)) SetLogLevel(LogLevel::kWarning);
  for (const Case& k : cases) {
    SCOPED_TRACE(absl::StrCat("mics_shard_size ", k.shard, ", ", k.per_host, " ranks per host"));
    std::vector<std::string> lines;
    absl::Mutex mu;
    SetLogSink([&](LogLevel, std::string_view line) {
      absl::MutexLock lock(&mu);
      lines.emplace_back(line);
    });
    Config c = TrainConfig(3, 1);
    c.zero.mics_shard_size = k.shard;
    testing::RunRanks(
        6, [&](Communicator& comm, int) { EXPECT_OK(Engine::Create(c, Borrow(comm), PerHost(k.per_host)).status()); });
    SetLogSink(nullptr);
    int said = 0;
    for (const std::string& l : lines) said += l.find("straddle") != std::string::npos;
    if (k.said == nullptr) {
      EXPECT_EQ(said, 0);
    } else {
      EXPECT_EQ(said, 1);  // rank 0 only
      EXPECT_THAT(lines, ::testing::Contains(HasSubstr(k.said)));
    }
  }
  SetLogLevel(level);
}

// The decision behind it, from every rank's count: hosts it cannot tell apart (a count at or above the world, ranks
// whose counts differ) are not judged, as HostLayoutStatus leaves unequal hosts unchecked for hybrid sharding.
TEST(HostLayoutTest, HybridStraddleWarningNamesTheFirstGroupThatStraddles) {
  auto places = [](std::vector<int> counts) {
    std::vector<internal::HostPlace> all;
    for (int c : counts) all.push_back({c, -1, 0});
    return all;
  };
  EXPECT_THAT(internal::HybridStraddleWarning(places({3, 3, 3, 3, 3, 3}), 2), HasSubstr("(the first: ranks 2-3)"));
  EXPECT_THAT(internal::HybridStraddleWarning(places({2, 2, 2, 2, 2, 2}), 3), HasSubstr("(the first: ranks 0-2)"));
  EXPECT_THAT(internal::HybridStraddleWarning(places({4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}), 6),
              HasSubstr("(the first: ranks 0-5)"));
  EXPECT_THAT(internal::HybridStraddleWarning(places({4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}), 3),
              HasSubstr("(the first: ranks 3-5)"));
  EXPECT_THAT(internal::HybridStraddleWarning(places({3, 3, 3, 3, 3, 3}), 2),
              HasSubstr("zero_optimization.mics_shard_size: shard groups of 2 consecutive ranks over hosts of 3"));
  EXPECT_EQ(internal::HybridStraddleWarning(places({2, 2, 2, 2, 2, 2}), 2), "");        // inside hosts
  EXPECT_EQ(internal::HybridStraddleWarning(places({2, 2, 2, 2, 2, 2, 2, 2}), 4), "");  // whole hosts
  EXPECT_EQ(internal::HybridStraddleWarning(places({8, 8, 8, 8, 8, 8}), 3), "");        // the count covers the world
  EXPECT_EQ(internal::HybridStraddleWarning(places({1, 1, 1, 1}), 2), "");              // no count
  EXPECT_EQ(internal::HybridStraddleWarning(places({2, 2, 3, 3, 3, 2}), 3), "");        // counts differ: not told
  EXPECT_EQ(internal::HybridStraddleWarning(places({3, 3, 3, 3, 3, 3}), 1), "");        // groups of one rank
  EXPECT_EQ(internal::HybridStraddleWarning({}, 2), "");
}

// Hosts whose ranks run on different machines: the ranks per host, or the launcher's numbering, is not the
// machines'. Found from every rank's machine, the same on every rank; a machine that several hosts share (hosts
// emulated on one machine, as the tests and scripts/two-hosts.sh do) is not a fault.
TEST(HostLayoutTest, FirstHostAcrossMachinesFindsTheRanksOfOneHostOnTwoMachines) {
  auto places = [](std::vector<uint64_t> machines, int per_host) {
    std::vector<internal::HostPlace> all;
    for (uint64_t m : machines) all.push_back({per_host, -1, 0, m});
    return all;
  };
  using internal::FirstHostAcrossMachines;
  using P = std::pair<int, int>;
  // Numbered by machine (torchrun's blocks): nothing; numbered across them (--map-by node): ranks 0 and 1.
  EXPECT_EQ(FirstHostAcrossMachines(places({7, 7, 9, 9}, 2)), P(-1, -1));
  EXPECT_EQ(FirstHostAcrossMachines(places({7, 9, 7, 9}, 2)), P(0, 1));
  // A count larger than the machines hold: 4 per host over machines of 3, or one host said for two machines.
  EXPECT_EQ(FirstHostAcrossMachines(places({7, 7, 7, 9, 9, 9, 5, 5}, 4)), P(2, 3));
  EXPECT_EQ(FirstHostAcrossMachines(places({7, 7, 9, 9}, 4)), P(1, 2));
  // Smaller than they hold (hosts inside machines), or hosts emulated on one machine: nothing.
  EXPECT_EQ(FirstHostAcrossMachines(places({7, 7, 7, 7, 9, 9, 9, 9}, 2)), P(-1, -1));
  EXPECT_EQ(FirstHostAcrossMachines(places({7, 7, 7, 7}, 2)), P(-1, -1));
  // Not told: a machine unknown, a host per rank, or counts that differ.
  EXPECT_EQ(FirstHostAcrossMachines(places({7, 9, 0, 9}, 2)), P(-1, -1));
  EXPECT_EQ(FirstHostAcrossMachines(places({7, 9, 7, 9}, 1)), P(-1, -1));
  std::vector<internal::HostPlace> uneven = places({7, 9, 7, 9}, 2);
  uneven[3].ranks_per_host = 1;
  EXPECT_EQ(FirstHostAcrossMachines(uneven), P(-1, -1));
  EXPECT_EQ(FirstHostAcrossMachines({}), P(-1, -1));
  // Runs of another size (the engine's own groups).
  EXPECT_EQ(internal::FirstRunAcrossMachines(places({7, 7, 9, 9, 9, 9, 5, 5}, 4), 2), P(-1, -1));
  EXPECT_EQ(internal::FirstRunAcrossMachines(places({7, 7, 7, 9, 9, 9, 5, 5}, 4), 2), P(2, 3));
  EXPECT_EQ(internal::FirstRunAcrossMachines(places({7, 7, 7, 9, 9, 9, 5, 5}, 4), 3), P(-1, -1));
  EXPECT_EQ(internal::FirstRunAcrossMachines(places({7, 7, 9, 7, 9, 9}, 4), 3), P(1, 2));
}

// What rank 0 says, through a real gather of the machines' names (thread-ranks, each given its machine): which of
// the engine's groups spans machines, for hpZ, qgZ and hybrid sharding, and nothing (no collective) where each host
// is one machine. Machine hashes whose float halves are NaN patterns or all ones travel intact.
TEST(HostLayoutTest, MachinesWarningSaysWhichGroupSpansMachines) {
  constexpr uint64_t kNaNs = 0x7FC000017FC00002ull, kOnes = ~0ull;
  struct Case {
    std::vector<uint64_t> machines;
    int per_host, hpz;
    bool qgz;
    int64_t shard;
    const char* said;       // nullptr: nothing
    bool one_name = false;  // every machine named "node" (host names alike, boot ids not)
  };
  const Case cases[] = {
      {{kNaNs, kOnes, kNaNs, kOnes},
       2,
       2,
       false,
       0,
       "zero_optimization.zero_hpz_partition_size: the engine takes each 2 consecutive ranks for one host "
       "(EngineOptions::local_world_size, else the launcher's count), but ranks 0 and 1 run on different machines "
       "(rank 0 on \"m0\", rank 1 on \"m1\"): one of hpZ's groups (ranks 0-1) spans two machines, so its backward "
       "gathers cross between them. Launch the ranks machine by machine, 2 to a machine"},
      // Hosts of 4 said, machines of 2: hpZ's groups of 2 lie on one machine each.
      {{7, 7, 9, 9},
       4,
       2,
       false,
       0,
       "ranks 1 and 2 run on different machines (rank 1 on \"m1\", rank 2 on \"m2\"): hpZ's groups of 2 ranks each "
       "lie on one machine, so none of their traffic crosses; StepResult's bytes inside and across hosts are counted "
       "by hosts of 4"},
      {{7, 9, 7, 9},
       2,
       1,
       true,
       0,
       "zero_optimization.zero_quantized_gradients: the engine takes each 2 consecutive ranks for one host"
       " (EngineOptions::local_world_size, else the launcher's count), but ranks 0 and 1 run on different machines"
       " (rank 0 on \"m0\", rank 1 on \"m1\"): one of qgZ's first hops (ranks 0-1) spans two machines"},
      {{7, 7, 9, 9}, 4, 1, true, 0, "qgZ takes one hop over every rank"},
      {{7, 9, 7, 9},
       2,
       1,
       false,
       2,
       "zero_optimization.mics_shard_size: the engine takes each 2 consecutive ranks for one host"
       " (EngineOptions::local_world_size, else the launcher's count), but ranks 0 and 1 run on different machines"
       " (rank 0 on \"m0\", rank 1 on \"m1\"): one of the shard groups (ranks 0-1) spans two machines, so its "
       "parameter gathers and gradient reductions cross between them"},
      {{7, 9, 7, 9},
       2,
       1,
       false,
       4,
       "the shard groups of 4 ranks were meant to be made of whole hosts of 2, and those hosts are not the machines"},
      {{7, 9, 7, 9},
       2,
       2,
       false,
       0,
       "(rank 0 on \"node\", rank 1 on \"node\": machines of one name with different boot ids)",
       true},
      {{7, 7, 9, 9}, 2, 2, false, 0, nullptr},
      {{7, 7, 7, 7}, 2, 2, false, 0, nullptr},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.said == nullptr ? "nothing said" : k.said);
    std::vector<internal::HostPlace> all;
    for (uint64_t m : k.machines) all.push_back({k.per_host, -1, 0, m});
    testing::RunRanks(4, [&](Communicator& comm, int rank) {
      MemoryTracker tracker;
      const std::unique_ptr<internal::ComputeTier> compute = internal::MakeHostCompute(&tracker);
      internal::HostCollectives host(&comm, compute);
      // The places gathered as Create gathers them, this rank's machine its own entry.
      std::vector<internal::HostPlace> got;
      ASSERT_OK(internal::CheckHostLayoutAgrees(host, all[static_cast<size_t>(rank)], false, false, false, &got));
      ASSERT_EQ(got.size(), all.size());
      for (size_t r = 0; r < all.size(); ++r) EXPECT_EQ(got[r].machine, all[r].machine) << r;
      StatusOr<std::string> said = internal::MachinesWarning(
          host, got, k.hpz, k.qgz, k.shard,
          {absl::StrCat("id", rank), k.one_name ? std::string("node") : absl::StrCat("m", rank)});
      ASSERT_OK(said.status());
      if (k.said == nullptr) {
        EXPECT_EQ(*said, "");
      } else {
        EXPECT_THAT(*said, HasSubstr(k.said));
      }
    });
  }
}

// The machine: ZERO_HOSTID where set, else the kernel's boot id named by the host name, else the host name.
TEST(HostLayoutTest, ThisHostIsTheOperatorsWordElseTheBootIdElseTheHostName) {
  auto env_of = [](std::map<std::string, std::string> vars) -> internal::EnvLookup {
    return [vars](const std::string& k) -> std::optional<std::string> {
      auto it = vars.find(k);
      return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
    };
  };
  const internal::MachineId set = internal::ThisHost(env_of({{"ZERO_HOSTID", "rack4-node17"}}));
  EXPECT_EQ(set.id, "rack4-node17");
  EXPECT_EQ(set.name, "ZERO_HOSTID=rack4-node17");
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  // A boot id file of our own (its newline not part of the id), and none at all.
  const std::string boot = ::testing::TempDir() + "/boot_id";
  {
    std::ofstream f(boot);
    f << "6f1c2a9e-0d4b-4c1e-9a77-3b2f5d8e1c40\n";
  }
  const internal::MachineId own = internal::ThisHost(env_of({{"ZERO_HOSTID", ""}}), boot);  // empty: not set
  EXPECT_EQ(own.id, "6f1c2a9e-0d4b-4c1e-9a77-3b2f5d8e1c40");
  EXPECT_EQ(own.name, std::string(host));
  const internal::MachineId none = internal::ThisHost(env_of({}), boot + ".missing");
  EXPECT_EQ(none.id, std::string(host));
  EXPECT_EQ(none.name, std::string(host));
}

}  // namespace
}  // namespace zero
