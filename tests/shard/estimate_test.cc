// zero::Estimate (zero/estimate.h) against the engine's measured memory report and collectives, on the reference
// GPT trained through TrainRank on thread-ranks over real Gloo: over stages 0-3 x fp32/bf16 x offload (none,
// optimizer, optimizer and parameters) x worlds 1-4 x recomputation off/on (and accumulation modes, bounded
// windows), every tag of every rank's report equals the estimate byte for byte (asked: model state exactly, the
// rest within 2 %) and the measured true peak lies at or below the estimate's and within 10 % of it. Where overlap_comm
// leaves the buckets to timing, the measurement lies between the estimate's floor and its figure. The collectives one
// step issues are counted by a communicator wrapper and must equal the estimate's per kind.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpt/estimate.h"
#include "gpt/model.h"
#include "gpt/train.h"
#include "support/engine_helpers.h"
#include "support/forwarding_comm.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/estimate.h"
#include "zero/memory.h"

namespace zero {
namespace {

using testing::Borrow;

// kNvme: the optimizer offloaded to the NVMe tier (offload_optimizer.device "nvme"); kParamNvme: the parameters
// (offload_param.device "nvme") beside the optimizer in host memory; kAllNvme: both in the NVMe tier.
enum class Offload { kNone, kOptimizer, kAll, kNvme, kParamNvme, kAllNvme };

struct Case {
  int stage;
  bool bf16;
  Offload offload;
  int world;
  bool recompute;
  int ga = 1;
  GradAccumulationMode mode = GradAccumulationMode::kLowMemory;
  bool overlap = false;     // overlap_comm: true leaves the buckets to timing (checked against the floor)
  int64_t window = 0;       // reduce_bucket_size, stage3_prefetch_bucket_size, stage3_max_live_parameters
  bool persistent = false;  // DeepSpeed's persistence threshold (the tiny GPT's units then all stay gathered)
  std::string model = "tiny";
  int group = 0;  // hybrid sharding: mics_shard_size
};

std::string Name(const Case& c) {
  std::string s = absl::StrCat("S", c.stage, c.bf16 ? "Bf16" : "Fp32",
                               c.offload == Offload::kNone        ? ""
                               : c.offload == Offload::kOptimizer ? "OffloadOpt"
                               : c.offload == Offload::kNvme      ? "OffloadNvme"
                               : c.offload == Offload::kParamNvme ? "OffloadParamNvme"
                               : c.offload == Offload::kAllNvme   ? "OffloadAllNvme"
                                                                  : "OffloadAll",
                               "W", c.world, c.recompute ? "Recompute" : "");
  if (c.ga > 1) absl::StrAppend(&s, "Ga", c.ga);
  if (c.mode == GradAccumulationMode::kLowCommunication) absl::StrAppend(&s, "LowComm");
  if (c.overlap) absl::StrAppend(&s, "Overlap");
  if (c.window > 0) absl::StrAppend(&s, "Window", c.window);
  if (c.persistent) absl::StrAppend(&s, "Persistent");
  if (c.model != "tiny") absl::StrAppend(&s, "_", c.model);
  if (c.group > 0) absl::StrAppend(&s, "HybridGroupsOf", c.group);
  return s;
}

void PrintTo(const Case& c, std::ostream* os) { *os << Name(c); }

Config ConfigFor(const Case& c) {
  Config cfg = testing::TrainConfig(c.stage, /*micro=*/2, c.ga, 3e-3, 1.0, c.mode);
  cfg.bf16.enabled = c.bf16;
  cfg.zero.overlap_comm = c.overlap;
  if (c.offload != Offload::kNone) cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
  if (c.offload == Offload::kNvme || c.offload == Offload::kAllNvme) {
    cfg.zero.offload_optimizer.device = OffloadDevice::kNvme;
    cfg.zero.offload_optimizer.nvme_path = ::testing::TempDir();
    cfg.zero.sub_group_size = 4096;
  }
  if (c.offload == Offload::kParamNvme || c.offload == Offload::kAllNvme) {
    cfg.zero.offload_param.device = OffloadDevice::kNvme;
    cfg.zero.offload_param.nvme_path = ::testing::TempDir();
    cfg.zero.offload_param.buffer_count = 3;
  }
  if (c.offload == Offload::kAll) cfg.zero.offload_param.device = OffloadDevice::kCpu;
  if (c.window > 0) {
    cfg.zero.reduce_bucket_size = cfg.zero.stage3_prefetch_bucket_size = cfg.zero.stage3_max_live_parameters = c.window;
  }
  if (c.persistent) cfg.zero.stage3_param_persistence_threshold = 100'000;
  if (c.group > 0) cfg.zero.mics_shard_size = c.group;
  return cfg;
}

constexpr int64_t kSteps = 3;  // the arena is one block of its peak from the second pass on
constexpr int kSeq = 16;

// Every rank's measured report (rank order), after kSteps steps.
std::vector<MemoryReport> Measure(const Case& c, const Config& cfg) {
  gpt::TrainOptions opt;
  opt.model = c.model;
  opt.steps = kSteps;
  opt.seed = 5;
  opt.seq = kSeq;
  opt.local_world_size = c.world;
  opt.recompute = c.recompute;
  std::vector<MemoryReport> reports;
  testing::RunRanks(c.world, [&](Communicator& comm, int rank) {
    auto r = gpt::TrainRank(cfg, Borrow(comm), opt);
    ASSERT_OK(r) << "rank " << rank;
    if (rank == 0) reports = r->all_ranks;
  });
  return reports;
}

constexpr MemTag kModelState[] = {MemTag::kParams, MemTag::kGrads, MemTag::kOptimizer, MemTag::kMaster};

bool IsModelState(MemTag tag) {
  for (MemTag t : kModelState) {
    if (t == tag) return true;
  }
  return false;
}

class EstimateTest : public ::testing::TestWithParam<Case> {};

TEST_P(EstimateTest, EqualsTheMeasuredReport) {
  const Case c = GetParam();
  const Config cfg = ConfigFor(c);
  ASSERT_OK_AND_ASSIGN(const gpt::GptConfig mc, gpt::GptConfig::FromName(c.model));
  ASSERT_OK_AND_ASSIGN(const RankEstimate e, gpt::EstimateGpt(cfg, mc, kSeq, c.world, c.recompute));
  const std::vector<MemoryReport> measured = Measure(c, cfg);
  ASSERT_EQ(measured.size(), static_cast<size_t>(c.world));
  EXPECT_EQ(e.params, gpt::NumParams(mc));
  for (int rank = 0; rank < c.world; ++rank) {
    const MemoryReport& m = measured[rank];
    for (MemTier tier : {MemTier::kHost, MemTier::kDevice, MemTier::kNvme}) {
      for (size_t g = 0; g < static_cast<size_t>(MemTag::kCount); ++g) {
        const MemTag tag = static_cast<MemTag>(g);
        SCOPED_TRACE(absl::StrCat("rank ", rank, ", ", MemTagName(tag), " in the ", MemTierName(tier), " tier"));
        const int64_t got = m.Get(tier, tag).peak, want = e.memory.Get(tier, tag).peak;
        const int64_t floor = e.floor.Get(tier, tag).peak;
        const int64_t planned = e.planned.Get(tier, tag).current;
        if (IsModelState(tag)) {
          // What the plan places is held exactly, between steps too (Finalize allocated it; nothing frees it).
          EXPECT_EQ(m.Get(tier, tag).current, planned);
        }
        if (floor != want) {
          // overlap_comm: how many reductions are still in flight when the next scope opens is timing.
          EXPECT_GE(got, floor);
          EXPECT_LE(got, want);
        } else {
          // Model state exactly; the rest is held to the same standard, stricter than the 2 % it was asked to be
          // within: every figure is a sum of exact allocation sizes, and a tolerance would hide a missing small
          // buffer (a 64-byte change of the head's activations is 0.02 % of this model's).
          EXPECT_EQ(got, want);
        }
      }
      // The true peak (all tags alive at once) lies below the estimate's bound on it, and close to it.
      SCOPED_TRACE(absl::StrCat("rank ", rank, ", true peak of the ", MemTierName(tier), " tier"));
      EXPECT_LE(m.PeakTotal(tier), e.memory.PeakTotal(tier));
      if (e.floor.PeakTotal(tier) == e.memory.PeakTotal(tier)) {
        EXPECT_GE(static_cast<double>(m.PeakTotal(tier)), 0.9 * static_cast<double>(e.memory.PeakTotal(tier)));
      }
    }
  }
}

// Each stage x dtype x offload pair, with and without recomputation, the world cycling through 1-4; then the
// accumulation modes, bounded windows, persistence, overlapped reductions and the small GPT.
std::vector<Case> Grid() {
  std::vector<Case> cases;
  int i = 0;
  for (int stage = 0; stage <= 3; ++stage) {
    for (bool bf16 : {false, true}) {
      for (Offload off : {Offload::kNone, Offload::kOptimizer, Offload::kAll}) {
        if ((off == Offload::kOptimizer && stage == 0) || (off == Offload::kAll && stage != 3)) continue;
        for (bool recompute : {false, true}) cases.push_back({stage, bf16, off, 1 + i++ % 4, recompute});
      }
    }
  }
  const auto kLowComm = GradAccumulationMode::kLowCommunication;
  cases.push_back({0, true, Offload::kNone, 3, false, /*ga=*/2});
  cases.push_back({1, true, Offload::kNone, 2, true, 2});
  cases.push_back({2, false, Offload::kNone, 4, false, 2, kLowComm});
  cases.push_back({2, true, Offload::kOptimizer, 3, true, 1, kLowComm});
  cases.push_back({3, true, Offload::kNone, 2, false, 2, kLowComm});
  cases.push_back({3, false, Offload::kAll, 4, true, 2});
  cases.push_back({3, false, Offload::kNone, 3, false, 1, GradAccumulationMode::kLowMemory, false, /*window=*/60'000});
  cases.push_back({3, true, Offload::kOptimizer, 4, true, 1, GradAccumulationMode::kLowMemory, false, 60'000});
  cases.push_back({3, false, Offload::kNone, 2, false, 1, GradAccumulationMode::kLowMemory, false, 0, true});
  cases.push_back({2, false, Offload::kNone, 4, false, 1, GradAccumulationMode::kLowMemory, /*overlap=*/true});
  cases.push_back({3, true, Offload::kNone, 3, true, 2, GradAccumulationMode::kLowMemory, true});
  cases.push_back({3, false, Offload::kOptimizer, 2, false, 1, kLowComm, true, 60'000});
  cases.push_back({3, true, Offload::kNone, 4, true, 1, GradAccumulationMode::kLowMemory, false, 0, false, "small"});
  cases.push_back(
      {1, false, Offload::kOptimizer, 2, false, 1, GradAccumulationMode::kLowMemory, false, 0, false, "small"});
  // The NVMe tier: master and optimizer state in the "nvme" tier, the host holding its staging.
  cases.push_back({1, true, Offload::kNvme, 1, false});
  cases.push_back({2, false, Offload::kNvme, 2, true});
  cases.push_back({3, true, Offload::kNvme, 3, false});
  // The parameter tier: the shards in the "nvme" tier, the host holding its buffers.
  cases.push_back({3, true, Offload::kParamNvme, 2, false});
  cases.push_back({3, false, Offload::kAllNvme, 3, true, 2});
  cases.push_back({3, true, Offload::kParamNvme, 2, false, 1, GradAccumulationMode::kLowMemory, false, 0, true});
  // Hybrid sharding: the plan of a world of G, the replicas' all-reduce and its staging.
  cases.push_back(
      Case{.stage = 3, .bf16 = false, .offload = Offload::kNone, .world = 4, .recompute = false, .group = 2});
  cases.push_back(
      Case{.stage = 2, .bf16 = true, .offload = Offload::kOptimizer, .world = 4, .recompute = true, .group = 2});
  cases.push_back(
      Case{.stage = 1, .bf16 = true, .offload = Offload::kNone, .world = 6, .recompute = false, .group = 3});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Gpt, EstimateTest, ::testing::ValuesIn(Grid()),
                         [](const ::testing::TestParamInfo<Case>& i) { return Name(i.param); });

// ---- communication ---------------------------------------------------------------------------------------------

// Counts what the engine hands a communicator: elements per kind of collective, and calls. The engine's control
// all-reduces (the norm, the desync check) and the GPT's loss all-reduce carry a few floats and are left out.
class CountingComm final : public testing::ForwardingComm {
 public:
  explicit CountingComm(Communicator& inner) : ForwardingComm(inner) {}
  struct Counts {
    int64_t elements[3] = {0, 0, 0};
    int64_t calls[3] = {0, 0, 0};
  };
  Counts counts;

  Work AllGather(const void* send, void* recv, size_t count, DType dtype, CUstream_st* s) override {
    Count(CollectiveKind::kAllGather, count);
    return ForwardingComm::AllGather(send, recv, count, dtype, s);
  }
  Work ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, CUstream_st* s) override {
    Count(CollectiveKind::kReduceScatter, count);
    return ForwardingComm::ReduceScatter(send, recv, count, dtype, op, s);
  }
  Work ReduceScatterDestructive(void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                CUstream_st* s) override {
    Count(CollectiveKind::kReduceScatter, count);
    return ForwardingComm::ReduceScatterDestructive(send, recv, count, dtype, op, s);
  }
  Work AllReduce(void* buf, size_t count, DType dtype, ReduceOp op, CUstream_st* s) override {
    if (count > kControl) Count(CollectiveKind::kAllReduce, count);
    return ForwardingComm::AllReduce(buf, count, dtype, op, s);
  }

 private:
  static constexpr size_t kControl = 64;
  void Count(CollectiveKind kind, size_t count) {
    counts.elements[static_cast<int>(kind)] += static_cast<int64_t>(count);
    counts.calls[static_cast<int>(kind)] += 1;
  }
};

// Rank 0's counts over a whole run of `steps` steps of the tiny GPT.
CountingComm::Counts CountRun(const Case& c, const Config& cfg, int64_t steps) {
  gpt::TrainOptions opt;
  opt.model = "tiny";
  opt.steps = steps;
  opt.seq = kSeq;
  opt.local_world_size = c.world;
  opt.recompute = c.recompute;
  CountingComm::Counts out;
  testing::RunRanks(c.world, [&](Communicator& comm, int rank) {
    CountingComm counting(comm);
    auto r = gpt::TrainRank(cfg, Borrow(counting), opt);
    ASSERT_OK(r) << "rank " << rank;
    if (rank == 0) out = counting.counts;
  });
  return out;
}

class EstimateCommTest : public ::testing::TestWithParam<Case> {};

// Set-up (registration, initial values) and the end of the run (the reports' all-gather) issue collectives too:
// the difference between a run of 3 steps and one of 2 is exactly one step's.
TEST_P(EstimateCommTest, OneStepsCollectivesAreTheEstimates) {
  const Case c = GetParam();
  const Config cfg = ConfigFor(c);
  ASSERT_OK_AND_ASSIGN(const RankEstimate e, gpt::EstimateGpt(cfg, gpt::GptConfig::Tiny(), kSeq, c.world, c.recompute));
  const CountingComm::Counts two = CountRun(c, cfg, 2), three = CountRun(c, cfg, 3);
  int64_t want_elements[3] = {0, 0, 0}, want_calls[3] = {0, 0, 0};
  for (const CollectiveEstimate& ce : e.comm) {
    want_elements[static_cast<int>(ce.kind)] += ce.elements;
    want_calls[static_cast<int>(ce.kind)] += ce.calls;
  }
  for (CollectiveKind kind : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce}) {
    SCOPED_TRACE(CollectiveKindName(kind));
    const int k = static_cast<int>(kind);
    EXPECT_EQ(three.elements[k] - two.elements[k], want_elements[k]);
    EXPECT_EQ(three.calls[k] - two.calls[k], want_calls[k]);  // no unit of the tiny GPT is chunked
  }
}

INSTANTIATE_TEST_SUITE_P(
    Gpt, EstimateCommTest,
    ::testing::Values(Case{0, true, Offload::kNone, 2, false, 2}, Case{1, true, Offload::kNone, 3, false, 2},
                      Case{1, false, Offload::kOptimizer, 2, false},
                      Case{2, false, Offload::kNone, 2, false, 2, GradAccumulationMode::kLowCommunication},
                      Case{2, true, Offload::kNone, 4, true, 2},
                      Case{3, false, Offload::kNone, 2, true, 2, GradAccumulationMode::kLowMemory, true},
                      Case{3, true, Offload::kAll, 3, false, 1},
                      Case{3, false, Offload::kNone, 2, false, 1, GradAccumulationMode::kLowMemory, false, 0, true}),
    [](const ::testing::TestParamInfo<Case>& i) { return Name(i.param); });

// ---- the estimate alone ----------------------------------------------------------------------------------------

// The ZeRO paper's stage-3 figure for 16-bit Adam, 16Ψ/N, on a 70B-class GPT shape at 1,024 ranks (the shape
// docs/guide/scale.md reports): the plan's padded units, exactly.
TEST(EstimateTest, Stage3ModelStateIs16PsiOverN) {
  Config cfg = testing::TrainConfig(3, 1);
  cfg.bf16.enabled = true;
  const gpt::GptConfig m{.vocab = 32'000, .max_seq = 4096, .layers = 80, .heads = 64, .channels = 8192};
  ASSERT_OK_AND_ASSIGN(const RankEstimate e, gpt::EstimateGpt(cfg, m, 0, 1024, /*recompute=*/false, Backend::kNccl));
  EXPECT_EQ(e.params, gpt::NumParams(m));
  EXPECT_EQ(e.memory.ModelStateBytes(), 16 * e.padded / 1024);
  // NCCL's buffers are not tracked: the host tier holds only the CUDA trainer's copy of the step's loss.
  EXPECT_EQ(e.memory.Get(MemTier::kHost, MemTag::kStaging).peak, 4);
  // The CUDA trainer does not recompute, as zero-gpt --device cuda says.
  EXPECT_THAT(gpt::EstimateGpt(cfg, m, 0, 1024, /*recompute=*/true, Backend::kNccl).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("--recompute")));
  // Gathers at stage 3 move 16-bit parameters; reductions the fp32 wire (communication_data_type's default).
  ASSERT_EQ(e.comm.size(), 2u);
  EXPECT_EQ(e.comm[0].dtype, DType::kBF16);
  EXPECT_EQ(e.comm[1].dtype, DType::kF32);
  EXPECT_EQ(e.comm[1].elements, e.padded / 1024);
}

// A unit moved in chunks still counts once (CollectiveEstimate::calls): with buckets below the GPT's blocks every
// kind of collective has the calls of the whole run, exact and with qwZ and qgZ, one hop and two; exact chunks send
// the whole collective's bytes.
TEST(EstimateTest, AUnitInChunksCountsOneCall) {
  for (const bool zeropp : {false, true}) {
    for (const int per_host : {4, 2}) {
      SCOPED_TRACE(absl::StrCat(zeropp ? "qwZ + qgZ" : "exact", ", ", per_host, " ranks per host"));
      Config whole = testing::TrainConfig(3, 1);
      if (zeropp) testing::SetQuantized(whole, 256, 8, 256);
      Config chunked = whole;
      chunked.zero.allgather_bucket_size = 4096;
      chunked.zero.reduce_bucket_size = 4096;
      const gpt::GptConfig m = gpt::GptConfig::Tiny();
      ASSERT_OK_AND_ASSIGN(EstimateOptions o, gpt::GptEstimateOptions(whole, m, kSeq, 4, /*recompute=*/false));
      o.ranks_per_host = per_host;
      const std::vector<EstimateUnit> units = gpt::EstimateUnits(m);
      ASSERT_OK_AND_ASSIGN(const RankEstimate a, Estimate(whole, units, o));
      ASSERT_OK_AND_ASSIGN(const RankEstimate b, Estimate(chunked, units, o));
      int64_t above = 0;  // units the small buckets put in chunks
      for (const EstimateUnit& u : units) above += u.numel > 4096;
      ASSERT_GT(above, 0);
      ASSERT_EQ(a.comm.size(), b.comm.size());
      for (size_t i = 0; i < a.comm.size(); ++i) {
        SCOPED_TRACE(a.comm[i].what);
        EXPECT_EQ(a.comm[i].what, b.comm[i].what);
        EXPECT_EQ(b.comm[i].calls, a.comm[i].calls);
        if (zeropp) {
          // Each chunk's message carries as many exact 1-D elements as the shard with the most in that chunk:
          // at least the whole message's, and the same blocks.
          EXPECT_GE(b.comm[i].bytes_sent, a.comm[i].bytes_sent);
        } else {
          EXPECT_EQ(b.comm[i].bytes_sent, a.comm[i].bytes_sent);
        }
      }
    }
  }
}

TEST(EstimateTest, ErrorsNameWhatIsWrong) {
  const Config cfg = testing::TrainConfig(3, 1);
  const std::vector<EstimateUnit> units = {{.name = "a", .numel = 100}, {.name = "b", .numel = 0}};
  EXPECT_THAT(Estimate(cfg, units, {.world = 2}).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("\"b\"")));
  EXPECT_THAT(Estimate(cfg, {{.name = "a", .numel = 1}}, {.world = 0}).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("world")));
  // A shard group must divide the world (the config's rule for mics_shard_size, which it sets).
  EXPECT_THAT(Estimate(cfg, {{.name = "a", .numel = 1}}, {.world = 8, .shard_group = 3}).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("mics_shard_size")));
  EXPECT_THAT(Estimate(cfg, {{.name = "a", .numel = 1}}, {.world = 8, .shard_group = -1}).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("shard_group")));
  Config nvme = cfg;
  nvme.zero.offload_param.device = OffloadDevice::kNvme;  // without its nvme_path: the config's rule
  EXPECT_THAT(Estimate(nvme, {{.name = "a", .numel = 1}}, {.world = 2}).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("offload_param.nvme_path")));
  Config none = cfg;
  none.optimizer.reset();
  EXPECT_THAT(Estimate(none, {{.name = "a", .numel = 1}}, {.world = 2}).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("optimizer")));
  ASSERT_OK(Estimate(none, {{.name = "a", .numel = 1}}, {.world = 2, .optimizer_states = 1}));
  // A unit's parameters, where given, are its numel (0: their sum); a parameter of no elements is named.
  const std::vector<ParamSpec> wb = {{"w", {10, 10}}, {"b", {10}}};
  EXPECT_THAT(Estimate(cfg, {{.name = "a", .numel = 100, .params = wb}}, {.world = 2}).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("add up to 110")));
  EXPECT_THAT(Estimate(cfg, {{.name = "a", .params = {{"w", {10, 0}}}}}, {.world = 2}).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("parameter \"w\"")));
  ASSERT_OK_AND_ASSIGN(const RankEstimate sum, Estimate(cfg, {{.name = "a", .params = wb}}, {.world = 2}));
  EXPECT_EQ(sum.params, 110);
}

// More blocks never fit in less memory, and the answer is the largest that fits.
TEST(EstimateTest, LargestLayersThatFit) {
  Config cfg = testing::TrainConfig(3, 2);
  const gpt::GptConfig small = gpt::GptConfig::Small();
  const int64_t budget = int64_t{200} << 20;
  ASSERT_OK_AND_ASSIGN(const int layers, gpt::LargestLayersThatFit(cfg, small, 0, 2, false, Backend::kGloo, budget));
  ASSERT_GT(layers, 1);
  auto device_peak = [&](int l) {
    gpt::GptConfig m = small;
    m.layers = l;
    return gpt::EstimateGpt(cfg, m, 0, 2, false).value().memory.PeakTotal(MemTier::kDevice);
  };
  EXPECT_LE(device_peak(layers), budget);
  EXPECT_GT(device_peak(layers + 1), budget);
  ASSERT_OK_AND_ASSIGN(const int none, gpt::LargestLayersThatFit(cfg, small, 0, 2, false, Backend::kGloo, 1024));
  EXPECT_EQ(none, 0);
}

}  // namespace
}  // namespace zero
