// The NVMe tier of parameter offload (offload_param.device "nvme", offload/nvme_param_tier.h), stage 3:
//  - the tiny GPT trained with the parameter shards in the NVMe tier gives bitwise the losses and parameters of the
//    same run with offload_param "cpu" and of the run without parameter offload, at worlds 1-4 (threads over real
//    Gloo), fp32 and bf16 (stochastic rounding too), beside offload_optimizer "none", "cpu" and "nvme", with
//    gradient accumulation, one staging buffer, persistent units (which stay gathered in the compute tier), qwZ's
//    quantized gathers and hybrid sharding;
//  - the shards sit in the "nvme" tier of the memory report (as many bytes as offload_param "cpu" keeps on the
//    host), and the tier moves exactly the bytes of the formula: a unit's shard read once per gather and, in fp32
//    (where the shard is the master), once per step before its update; written once per step;
//  - the host bytes the tier needs are its buffer settings' (buffer_count × min(buffer_size, largest shard)), not
//    the model's;
//  - a checkpoint taken with the tier resumes bitwise with the tier and with offload_param "cpu", and one taken
//    with "cpu" resumes with the tier (asynchronous saves too);
//  - the refused combinations and bad settings name their keys (and the unit, and the path).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpt/model.h"
#include "gpt/train.h"
#include "offload/nvme_param_tier.h"
#include "shard/internal/plan.h"
#include "support/engine_helpers.h"
#include "support/gpt_run.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/estimate.h"

namespace zero {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kSteps = 6;

std::string TierDir(const std::string& name) {
  const std::string d = absl::StrCat(::testing::TempDir(), "/zero-pnvme-", getpid(), "-", name);
  std::filesystem::create_directories(d);
  return d;
}

// The tier's files are unlinked once open: nothing is left behind.
void ExpectEmptyAndRemove(const std::string& dir) {
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << dir << " holds files the NVMe tier left behind";
  std::filesystem::remove_all(dir);
}

struct GptRun {
  std::vector<double> losses;
  std::vector<float> params;
  MemoryReport memory;
  int64_t param_read = 0, param_written = 0;  // rank 0's parameter-tier bytes moved by gathers and steps
  int64_t gathers = 0;                        // rank 0's stage-3 gathers (prefetched and on demand)
  Status status;
};

GptRun Train(int world, const Config& cfg, int64_t steps = kSteps, const std::string& save = "",
             const std::string& resume = "", bool save_async = false) {
  gpt::TrainOptions opt = testing::TinyGptOptions(world, steps);
  opt.save_dir = save;
  opt.resume_dir = resume;
  opt.save_async = save_async;
  const testing::TinyGptRanks ranks = testing::RunTinyGpt(world, cfg, opt);
  const std::vector<gpt::TrainResult>& results = ranks.results;
  GptRun run;
  run.status = ranks.status;
  for (const auto& s : results[0].steps) run.losses.push_back(s.loss);
  run.params = results[0].final_params;
  run.memory = results[0].memory;
  run.param_read = results[0].nvme_param_step_bytes_read;
  run.param_written = results[0].nvme_param_step_bytes_written;
  run.gathers = results[0].prefetch_gathers + results[0].demand_gathers;
  return run;
}

enum class Precision { kF32, kBF16, kBF16Stochastic };
enum class Opt { kNone, kCpu, kNvme };

Config Base(Precision p, Opt opt, int ga, const std::string& opt_dir) {
  Config c = testing::TrainConfig(3, /*micro=*/2, ga, 3e-3, 1.0);
  c.bf16.enabled = p != Precision::kF32;
  c.bf16.stochastic_rounding = p == Precision::kBF16Stochastic;
  c.zero.sub_group_size = 4096;
  if (opt != Opt::kNone) c.zero.offload_optimizer.device = OffloadDevice::kCpu;
  if (opt == Opt::kNvme) {
    c.zero.offload_optimizer.device = OffloadDevice::kNvme;
    c.zero.offload_optimizer.nvme_path = opt_dir;
  }
  c.aio.block_size = 65536;
  c.aio.queue_depth = 4;
  return c;
}

Config ParamCpu(Config c) {
  c.zero.offload_param.device = OffloadDevice::kCpu;
  return c;
}

Config ParamNvme(Config c, const std::string& dir, int buffers = 5, int64_t buffer_size = 100'000'000) {
  c.zero.offload_param.device = OffloadDevice::kNvme;
  c.zero.offload_param.nvme_path = dir;
  c.zero.offload_param.buffer_count = buffers;
  c.zero.offload_param.buffer_size = buffer_size;
  return c;
}

void ExpectBitwise(const GptRun& got, const GptRun& want, const std::string& what) {
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
  ASSERT_TRUE(want.status.ok()) << what << ": " << want.status;
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t s = 0; s < want.losses.size(); ++s) EXPECT_EQ(got.losses[s], want.losses[s]) << what << " step " << s;
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  ASSERT_FALSE(want.params.empty()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < want.params.size(); ++i) differ += std::memcmp(&got.params[i], &want.params[i], 4) != 0;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << want.params.size() << " final parameters differ";
}

// The tiny GPT's units on a rank of `world`: the root (embeddings, final layernorm; open for the whole pass, so
// gathered once per micro-step) and `layers` blocks (gathered for the forward and again for the backward).
struct Shards {
  int64_t root = 0, block = 0;
  int layers = 0;
};

Shards TinyShards(int world, bool root_persistent) {
  const gpt::GptConfig mc = gpt::GptConfig::FromName("tiny").value();
  auto shard = [world](int64_t numel) {
    const int64_t q = int64_t{32} * world;
    return (numel + q - 1) / q * q / world;
  };
  return Shards{root_persistent ? 0 : shard(gpt::UnitNumel(gpt::RootParams(mc))),
                shard(gpt::UnitNumel(gpt::BlockParams(mc))), static_cast<int>(mc.layers)};
}

struct Case {
  int world;
  Precision precision;
  Opt opt = Opt::kCpu;
  int ga = 1;
  int buffers = 5;
  bool persistent = false;  // the root unit below stage3_param_persistence_threshold: kept gathered
  bool qwz = false;         // zero_quantized_weights: forward gathers quantize the shard read from the tier
  int group = 0;            // hybrid sharding: mics_shard_size (the shards are a group's)
};

std::string Name(const Case& c) {
  const char* p = c.precision == Precision::kF32 ? "f32" : c.precision == Precision::kBF16 ? "bf16" : "bf16sr";
  const char* o = c.opt == Opt::kNone ? "optnone" : c.opt == Opt::kCpu ? "optcpu" : "optnvme";
  std::string n = absl::StrCat("world", c.world, "_", p, "_", o);
  if (c.ga > 1) n += absl::StrCat("_ga", c.ga);
  if (c.buffers != 5) n += absl::StrCat("_buffers", c.buffers);
  if (c.persistent) n += "_persistent";
  if (c.qwz) n += "_qwz";
  if (c.group > 0) n += absl::StrCat("_groupsof", c.group);
  return n;
}

void PrintTo(const Case& c, std::ostream* os) { *os << Name(c); }

class ParamNvmeParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(ParamNvmeParityTest, BitwiseEqualToCpuAndNoOffload) {
  const Case c = GetParam();
  const std::string opt_dir = TierDir(Name(c) + "-opt");
  const std::string dir = TierDir(Name(c));
  Config base = Base(c.precision, c.opt, c.ga, opt_dir);
  if (c.persistent) base.zero.stage3_param_persistence_threshold = 30000;  // the root unit (18.6 k), not blocks
  base.zero.zero_quantized_weights = c.qwz;
  base.zero.mics_shard_size = c.group;
  const GptRun none = Train(c.world, base);
  const GptRun cpu = Train(c.world, ParamCpu(base));
  const GptRun got = Train(c.world, ParamNvme(base, dir, c.buffers));
  ExpectEmptyAndRemove(dir);
  ExpectEmptyAndRemove(opt_dir);
  ExpectBitwise(got, cpu, Name(c) + " against offload_param \"cpu\"");
  ExpectBitwise(got, none, Name(c) + " against no parameter offload");
  // The shards moved from the host tier to the NVMe tier, byte for byte; the compute tier is offload "cpu"'s.
  const MemoryReport& g = got.memory;
  const MemoryReport& w = cpu.memory;
  const int64_t shards = g.Get(MemTier::kNvme, MemTag::kParams).current;
  EXPECT_GT(shards, 0);
  EXPECT_EQ(shards, w.Get(MemTier::kHost, MemTag::kParams).current);
  EXPECT_EQ(g.Get(MemTier::kHost, MemTag::kParams).current, 0);
  EXPECT_EQ(g.Get(MemTier::kDevice, MemTag::kParams).current, w.Get(MemTier::kDevice, MemTag::kParams).current);
  EXPECT_EQ(g.Current(MemTier::kDevice) - g.Get(MemTier::kDevice, MemTag::kActivations).current,
            w.Current(MemTier::kDevice) - w.Get(MemTier::kDevice, MemTag::kActivations).current);
  EXPECT_THAT(g.ToJson(), HasSubstr("\"tier\": \"nvme\""));
  // The formula, to the byte: every gather read its unit's shard, every step wrote every shard once (and read it
  // first in fp32, where it is the master).
  const size_t cds = c.precision == Precision::kF32 ? 4 : 2;
  const Shards s = TinyShards(c.group > 0 ? c.group : c.world, c.persistent);
  EXPECT_EQ(shards, static_cast<int64_t>(cds) * (s.root + s.layers * s.block));
  const int64_t sharded_units = (c.persistent ? 0 : 1) + s.layers;
  const int64_t gathers_per_step = c.ga * ((c.persistent ? 0 : 1) + 2 * s.layers);
  ASSERT_EQ(got.gathers, kSteps * gathers_per_step) << "the formula below assumes these gathers";
  ASSERT_EQ(none.gathers, got.gathers) << "the tier gathers what the compute tier gathers";
  const int64_t gathered = c.ga * (s.root + 2 * s.layers * s.block) * static_cast<int64_t>(cds);
  const int64_t updated = c.precision == Precision::kF32 ? shards : 0;
  EXPECT_EQ(got.param_read, kSteps * (gathered + updated));
  EXPECT_EQ(got.param_written, kSteps * shards);
  EXPECT_GT(sharded_units, 0);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (int world = 1; world <= 4; ++world) cases.push_back({world, Precision::kF32});
  cases.push_back({2, Precision::kBF16});
  cases.push_back({3, Precision::kBF16, Opt::kNone});
  cases.push_back({2, Precision::kF32, Opt::kNone});
  cases.push_back({2, Precision::kF32, Opt::kNvme});
  cases.push_back({3, Precision::kBF16, Opt::kNvme});
  cases.push_back({3, Precision::kBF16Stochastic});
  cases.push_back({2, Precision::kBF16, Opt::kCpu, /*ga=*/2});
  cases.push_back({4, Precision::kF32, Opt::kNvme, /*ga=*/2});
  cases.push_back({2, Precision::kBF16, Opt::kCpu, 1, /*buffers=*/1});
  cases.push_back({3, Precision::kF32, Opt::kNone, 1, /*buffers=*/2});
  cases.push_back({2, Precision::kBF16, Opt::kCpu, 1, 5, /*persistent=*/true});
  cases.push_back({2, Precision::kBF16, Opt::kCpu, 1, 5, false, /*qwz=*/true});
  cases.push_back({4, Precision::kF32, Opt::kCpu, 1, 5, false, false, /*group=*/2});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(ParamNvme, ParamNvmeParityTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return Name(info.param); });

// Resuming: a checkpoint holds the shards the tier keeps in its file, and any parameter offload reads it.
TEST(ParamNvmeCheckpointTest, ResumesAcrossCpuAndNvme) {
  const int world = 2;
  for (Opt opt : {Opt::kCpu, Opt::kNvme}) {
    for (Precision p : {Precision::kBF16, Precision::kF32}) {
      const std::string what = absl::StrCat(opt == Opt::kCpu ? "optimizer cpu" : "optimizer nvme",
                                            p == Precision::kF32 ? ", fp32" : ", bf16");
      SCOPED_TRACE(what);
      const std::string opt_dir = TierDir("ckpt-opt");
      const std::string tier_dir = TierDir("ckpt");
      const Config cpu = ParamCpu(Base(p, opt, 1, opt_dir));
      const Config nvme = ParamNvme(Base(p, opt, 1, opt_dir), tier_dir, /*buffers=*/2);
      const GptRun whole = Train(world, nvme);
      ASSERT_TRUE(whole.status.ok()) << whole.status;
      const std::string from_nvme = TierDir("saved-nvme");
      const std::string from_cpu = TierDir("saved-cpu");
      std::filesystem::remove_all(from_nvme);
      std::filesystem::remove_all(from_cpu);
      // The asynchronous save stages both tiers' values as the synchronous one does (StartAsyncSave did not stage
      // the optimizer tier's state before the parameter tier came).
      ASSERT_TRUE(Train(world, nvme, kSteps / 2, from_nvme, "", /*save_async=*/p == Precision::kBF16).status.ok());
      ASSERT_TRUE(Train(world, cpu, kSteps / 2, from_cpu).status.ok());
      struct Resume {
        const char* what;
        const Config* cfg;
        const std::string* dir;
      };
      for (const Resume& r : {Resume{"nvme -> nvme", &nvme, &from_nvme}, Resume{"nvme -> cpu", &cpu, &from_nvme},
                              Resume{"cpu -> nvme", &nvme, &from_cpu}}) {
        const GptRun resumed = Train(world, *r.cfg, kSteps, "", *r.dir);
        ASSERT_TRUE(resumed.status.ok()) << r.what << ": " << resumed.status;
        ASSERT_EQ(resumed.losses.size(), static_cast<size_t>(kSteps / 2)) << r.what;
        for (int s = 0; s < kSteps / 2; ++s) {
          EXPECT_EQ(resumed.losses[s], whole.losses[kSteps / 2 + s]) << r.what << " step " << kSteps / 2 + s;
        }
        GptRun tail = whole;
        tail.losses = resumed.losses;
        ExpectBitwise(resumed, tail, absl::StrCat(what, ": ", r.what));
      }
      std::filesystem::remove_all(from_nvme);
      std::filesystem::remove_all(from_cpu);
      ExpectEmptyAndRemove(tier_dir);
      ExpectEmptyAndRemove(opt_dir);
    }
  }
}

// The host bytes the tier needs are the buffer settings', whatever the model: plans of 4 and of 64 units hold the
// same host staging and no host parameters; the NVMe tier grows instead.
TEST(ParamNvmePlanTest, HostBytesFollowTheBuffersNotTheModel) {
  Config cfg = ParamNvme(Base(Precision::kBF16, Opt::kCpu, 1, ""), "/nonexistent-unused", /*buffers=*/3,
                         /*buffer_size=*/1 << 15);
  const int world = 2;
  ASSERT_OK_AND_ASSIGN(internal::PlanPolicy p, internal::PlanPolicy::FromConfig(cfg, world, 0));
  p.optimizer_states = 2;
  const internal::StagePlan small = internal::MakePlan(p, std::vector<int64_t>(4, 1 << 16));
  const internal::StagePlan large = internal::MakePlan(p, std::vector<int64_t>(64, 1 << 16));
  const internal::StagePlan cpu_small = [&] {
    internal::PlanPolicy q = p;
    q.param_nvme = false;
    return internal::MakePlan(q, std::vector<int64_t>(4, 1 << 16));
  }();
  const int64_t shard = (1 << 16) / world;  // 32 Ki elements, exactly buffer_size
  for (const internal::StagePlan* plan : {&small, &large}) {
    const MemoryReport r = plan->Report();
    EXPECT_EQ(plan->param_slot_elems, shard);
    EXPECT_EQ(plan->param_too_large, -1);
    EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kParams).current, 0);
    // buffer_count buffers of one bf16 shard (64 KiB, whole 4 KiB blocks) + 4 KiB for the alignment, and the I/O
    // engine's queue_depth × block_size, beside what offload_param "cpu" stages.
    EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kStaging).current -
                  cpu_small.Report().Get(MemTier::kHost, MemTag::kStaging).current,
              3 * (shard * 2 + 4096) + 4 * 65536);
    EXPECT_EQ(internal::NvmeParamTier::SlotBytes(shard * 2), shard * 2 + 4096);
  }
  EXPECT_EQ(small.Report().Get(MemTier::kNvme, MemTag::kParams).current, 4 * shard * 2);
  EXPECT_EQ(large.Report().Get(MemTier::kNvme, MemTag::kParams).current, 64 * shard * 2);
  EXPECT_EQ(small.Report().Get(MemTier::kHost, MemTag::kStaging).current,
            large.Report().Get(MemTier::kHost, MemTag::kStaging).current);
  EXPECT_EQ(cpu_small.Report().Get(MemTier::kHost, MemTag::kParams).current, 4 * shard * 2);
  // A unit whose shard exceeds buffer_size: the plan says which (Finalize and Estimate refuse it).
  const internal::StagePlan too_large = internal::MakePlan(p, {1 << 10, (1 << 16) + 64, 1 << 16});
  EXPECT_EQ(too_large.param_too_large, 1);
}

// The engine holds what the plan lists: the host tier's staging is the buffers' and the I/O engine's, and the
// bound on the NVMe tier is its regions.
TEST(ParamNvmeEngineTest, MemoryReportAndEstimateAgree) {
  const std::string dir = TierDir("engine");
  Config cfg = ParamNvme(Base(Precision::kBF16, Opt::kNone, 1, ""), dir, /*buffers=*/2);
  cfg.zero.stage3_param_persistence_threshold = 0;
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, testing::Borrow(comm)));
    const MemoryReport r = e->memory_report();
    EXPECT_GT(r.Get(MemTier::kNvme, MemTag::kParams).current, 0) << "rank " << rank;
    EXPECT_EQ(e->TruePeakBound(MemTier::kNvme).total(), r.Current(MemTier::kNvme)) << "rank " << rank;
    EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kParams).current, 0) << "rank " << rank;
  });
  ExpectEmptyAndRemove(dir);
  // zero::Estimate places the shards in the "nvme" tier too.
  ASSERT_OK_AND_ASSIGN(const RankEstimate est,
                       Estimate(cfg, {{.name = "a", .numel = 1 << 16}, {.name = "b", .numel = 1 << 16}}, {.world = 2}));
  EXPECT_EQ(est.memory.Get(MemTier::kNvme, MemTag::kParams).current, 2 * (1 << 15) * 2);
  EXPECT_EQ(est.memory.Get(MemTier::kHost, MemTag::kParams).current, 0);
  EXPECT_THAT(est.MemoryJson(), HasSubstr("\"tier\": \"nvme\""));
}

TEST(ParamNvmeConfigTest, MistakesNameTheirKeys) {
  auto parse = [](const std::string& zero) {
    return Config::FromJsonString(absl::StrCat(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW",
        "params": {"lr": 0.001}}, "zero_optimization": {)",
                                               zero, "}}"));
  };
  // DeepSpeed's keys parse; an empty nvme_path, or a stage below 3, names the keys.
  ASSERT_OK_AND_ASSIGN(Config ok, parse(R"("stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x",
      "buffer_count": 3, "buffer_size": 4096, "pin_memory": false}, "offload_optimizer": {"device": "cpu"})"));
  EXPECT_EQ(ok.zero.offload_param.device, OffloadDevice::kNvme);
  EXPECT_EQ(ok.zero.offload_param.nvme_path, "/x");
  EXPECT_EQ(ok.zero.offload_param.buffer_count, 3);
  EXPECT_EQ(ok.zero.offload_param.buffer_size, 4096);
  StatusOr<Config> no_path = parse(R"("stage": 3, "offload_param": {"device": "nvme"})");
  ASSERT_FALSE(no_path.ok());
  EXPECT_THAT(std::string(no_path.status().message()), HasSubstr("offload_param.nvme_path"));
  StatusOr<Config> stage2 = parse(R"("stage": 2, "offload_param": {"device": "nvme", "nvme_path": "/x"})");
  ASSERT_FALSE(stage2.ok());
  EXPECT_THAT(std::string(stage2.status().message()),
              AllOf(HasSubstr("offload_param.device"), HasSubstr("zero_optimization.stage")));

  const std::string dir = TierDir("config");
  const Config good = ParamNvme(Base(Precision::kBF16, Opt::kCpu, 1, ""), dir);
  // Twin-Flow updates parameters in the compute tier: refused beside the tier, naming both keys.
  Config twin = good;
  twin.zero.offload_optimizer.ratio = 0.5;
  GptRun r = Train(2, twin, 1);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << r.status;
  EXPECT_THAT(std::string(r.status.message()),
              AllOf(HasSubstr("offload_optimizer.ratio"), HasSubstr("offload_param.device \"nvme\"")));
  // No staging buffer.
  Config none = good;
  none.zero.offload_param.buffer_count = 0;
  r = Train(2, none, 1);
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("offload_param.buffer_count"));
  // A buffer smaller than a shard: the key, the unit and the sizes.
  Config small = good;
  small.zero.offload_param.buffer_size = 1000;
  r = Train(2, small, 1);
  ASSERT_FALSE(r.status.ok());
  EXPECT_THAT(std::string(r.status.message()),
              AllOf(HasSubstr("offload_param.buffer_size: 1000"), HasSubstr("unit "), HasSubstr("elements")));
  ASSERT_OK_AND_ASSIGN(const gpt::GptConfig mc, gpt::GptConfig::FromName("tiny"));
  EXPECT_THAT(Estimate(small, {{.name = "blk", .numel = gpt::UnitNumel(gpt::BlockParams(mc))}}, {.world = 2}).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                AllOf(HasSubstr("offload_param.buffer_size"), HasSubstr("\"blk\""))));
  // A folder that does not exist: Finalize fails on every rank, naming the key and the path.
  const Config missing = ParamNvme(Base(Precision::kF32, Opt::kNone, 1, ""), "/nonexistent/zero-pnvme");
  r = Train(2, missing, 1);
  ASSERT_FALSE(r.status.ok());
  EXPECT_THAT(std::string(r.status.message()),
              AllOf(HasSubstr("offload_param.nvme_path"), HasSubstr("/nonexistent/zero-pnvme")));
  ExpectEmptyAndRemove(dir);
}

}  // namespace
}  // namespace zero
