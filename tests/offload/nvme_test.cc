// The NVMe tier of optimizer offload (offload_optimizer.device "nvme", offload/nvme_store.h):
//  - the tiny GPT trained with the NVMe tier gives bitwise the losses and parameters of the same run with CPU
//    offload, at stages 1-3 and worlds 1-4 (threads over real Gloo), in fp32 and bf16 (stochastic rounding too),
//    with offload_param "cpu" beside it, with Twin-Flow, with gradient accumulation, with one staging buffer and
//    without the read/write pipelines;
//  - the master and optimizer state sit in the "nvme" tier of the memory report, as the plan lists them, and the
//    host tier holds none of them: the host bytes the tier needs follow the buffer settings, not the model;
//  - a checkpoint taken with the NVMe tier resumes bitwise with the NVMe tier and with CPU offload, and one taken
//    with CPU offload resumes with the NVMe tier;
//  - under a host budget below the optimizer state CPU offload fails naming the budget while the NVMe tier trains
//    to the same bits as CPU offload without the budget;
//  - the config's mistakes name their keys (no nvme_path, offload_param "nvme" without its own, a path that does
//    not exist).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpt/train.h"
#include "shard/internal/plan.h"
#include "support/engine_helpers.h"
#include "support/gpt_run.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::HasSubstr;

constexpr int kSteps = 8;

// A folder of its own per test under the test temp dir (the tier's files are unlinked once open, so it stays
// empty; a fresh one shows that nothing is left behind).
std::string TierDir(const std::string& name) {
  const std::string d = absl::StrCat(::testing::TempDir(), "/zero-nvme-", getpid(), "-", name);
  std::filesystem::create_directories(d);
  return d;
}

// After the engines are gone: their files were unlinked at once, so the folder is empty; then it goes.
void ExpectEmptyAndRemove(const std::string& dir) {
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << dir << " holds files the NVMe tier left behind";
  std::filesystem::remove_all(dir);
}

struct GptRun {
  std::vector<double> losses;
  std::vector<float> params;
  MemoryReport memory;
  int64_t nvme_read = 0, nvme_written = 0;  // rank 0's NVMe-tier bytes moved by the steps
  Status status;
};

GptRun Train(int world, const Config& cfg, int64_t steps = kSteps, const std::string& save = "",
             const std::string& resume = "", int64_t host_limit = 0) {
  gpt::TrainOptions opt = testing::TinyGptOptions(world, steps);
  opt.save_dir = save;
  opt.resume_dir = resume;
  opt.host_limit = host_limit;
  const testing::TinyGptRanks ranks = testing::RunTinyGpt(world, cfg, opt);
  const std::vector<gpt::TrainResult>& results = ranks.results;
  GptRun run;
  run.status = ranks.status;
  for (const auto& s : results[0].steps) run.losses.push_back(s.loss);
  run.params = results[0].final_params;
  run.memory = results[0].memory;
  run.nvme_read = results[0].nvme_step_bytes_read;
  run.nvme_written = results[0].nvme_step_bytes_written;
  return run;
}

enum class Precision { kF32, kBF16, kBF16Stochastic };

Config Cpu(int stage, Precision p, int ga = 1) {
  Config c = testing::TrainConfig(stage, /*micro=*/2, ga, 3e-3, 1.0);
  c.bf16.enabled = p != Precision::kF32;
  c.bf16.stochastic_rounding = p == Precision::kBF16Stochastic;
  c.zero.sub_group_size = 4096;  // several chunks per unit: the pass crosses chunk and unit boundaries
  c.zero.offload_optimizer.device = OffloadDevice::kCpu;
  return c;
}

Config Nvme(Config c, const std::string& dir, int buffers = 4, bool pipelined = true) {
  c.zero.offload_optimizer.device = OffloadDevice::kNvme;
  c.zero.offload_optimizer.nvme_path = dir;
  c.zero.offload_optimizer.buffer_count = buffers;
  c.zero.offload_optimizer.pipeline_read = pipelined;
  c.zero.offload_optimizer.pipeline_write = pipelined;
  c.aio.block_size = 65536;  // small blocks: chunks of 48 KiB still take several pieces
  c.aio.queue_depth = 4;
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

struct Case {
  int world;
  int stage;
  Precision precision;
  bool offload_params = false;
  double ratio = 1.0;
  int ga = 1;
  int buffers = 4;
  bool pipelined = true;
};

std::string Name(const Case& c) {
  const char* p = c.precision == Precision::kF32 ? "f32" : c.precision == Precision::kBF16 ? "bf16" : "bf16sr";
  std::string n = absl::StrCat("world", c.world, "_stage", c.stage, "_", p);
  if (c.offload_params) n += "_params";
  if (c.ratio < 1) n += absl::StrCat("_ratio", static_cast<int>(c.ratio * 100));
  if (c.ga > 1) n += absl::StrCat("_ga", c.ga);
  if (c.buffers != 4) n += absl::StrCat("_buffers", c.buffers);
  if (!c.pipelined) n += "_unpipelined";
  return n;
}

class NvmeParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(NvmeParityTest, BitwiseEqualToCpuOffload) {
  const Case c = GetParam();
  Config cpu = Cpu(c.stage, c.precision, c.ga);
  cpu.zero.offload_optimizer.ratio = c.ratio;
  if (c.offload_params) cpu.zero.offload_param.device = OffloadDevice::kCpu;
  const GptRun want = Train(c.world, cpu);
  const std::string dir = TierDir(Name(c));
  const GptRun got = Train(c.world, Nvme(cpu, dir, c.buffers, c.pipelined));
  ExpectEmptyAndRemove(dir);
  ExpectBitwise(got, want, Name(c));
  // The master and optimizer state moved from the host tier to the NVMe tier, byte for byte.
  const MemoryReport& g = got.memory;
  const MemoryReport& w = want.memory;
  EXPECT_GT(g.Get(MemTier::kNvme, MemTag::kOptimizer).current, 0);
  EXPECT_EQ(g.Get(MemTier::kNvme, MemTag::kOptimizer).current, w.Get(MemTier::kHost, MemTag::kOptimizer).current);
  EXPECT_EQ(g.Get(MemTier::kNvme, MemTag::kMaster).current, w.Get(MemTier::kHost, MemTag::kMaster).current);
  EXPECT_EQ(g.Get(MemTier::kHost, MemTag::kOptimizer).current, 0);
  EXPECT_EQ(g.Get(MemTier::kHost, MemTag::kMaster).current, 0);
  // The gradient's host part stays on the host, and the compute tier holds what it held with CPU offload.
  EXPECT_EQ(g.Get(MemTier::kHost, MemTag::kGrads).current, w.Get(MemTier::kHost, MemTag::kGrads).current);
  EXPECT_EQ(g.Current(MemTier::kDevice) - g.Get(MemTier::kDevice, MemTag::kActivations).current,
            w.Current(MemTier::kDevice) - w.Get(MemTier::kDevice, MemTag::kActivations).current);
  EXPECT_THAT(g.ToJson(), HasSubstr("\"tier\": \"nvme\""));
  // Every step read the tier's bytes once and wrote them back once: the formula, to the byte.
  const int64_t tier = g.Current(MemTier::kNvme);
  EXPECT_EQ(g.PeakTotal(MemTier::kNvme), tier);  // file regions, made once at Finalize
  EXPECT_EQ(got.nvme_read, kSteps * tier);
  EXPECT_EQ(got.nvme_written, kSteps * tier);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (int world = 1; world <= 4; ++world) {
    for (int stage = 1; stage <= 3; ++stage) cases.push_back({world, stage, Precision::kF32});
  }
  for (int stage = 1; stage <= 3; ++stage) cases.push_back({2, stage, Precision::kBF16});
  cases.push_back({3, 3, Precision::kBF16Stochastic});
  cases.push_back({3, 3, Precision::kF32, /*offload_params=*/true});
  cases.push_back({2, 3, Precision::kBF16, /*offload_params=*/true});
  cases.push_back({2, 3, Precision::kBF16, false, /*ratio=*/0.5});
  cases.push_back({2, 2, Precision::kBF16, false, 1.0, /*ga=*/2});
  cases.push_back({2, 2, Precision::kF32, false, 1.0, 1, /*buffers=*/1});
  cases.push_back({2, 3, Precision::kBF16, false, 1.0, 1, /*buffers=*/2, /*pipelined=*/false});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Nvme, NvmeParityTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return Name(info.param); });

// Resuming: a checkpoint holds the master and state the tier keeps in its files, and any offload setting reads it.
TEST(NvmeCheckpointTest, ResumesAcrossCpuOffloadAndNvme) {
  const int world = 2;
  for (int stage : {1, 3}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    const Config cpu = Cpu(stage, Precision::kBF16);
    const std::string tier_dir = TierDir(absl::StrCat("ckpt", stage));
    const Config nvme = Nvme(cpu, tier_dir);
    const GptRun whole = Train(world, nvme);
    ASSERT_TRUE(whole.status.ok()) << whole.status;
    const std::string from_nvme = TierDir(absl::StrCat("saved-nvme-", stage));
    const std::string from_cpu = TierDir(absl::StrCat("saved-cpu-", stage));
    std::filesystem::remove_all(from_nvme);
    std::filesystem::remove_all(from_cpu);
    ASSERT_TRUE(Train(world, nvme, kSteps / 2, from_nvme).status.ok());
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
      ExpectBitwise(resumed, tail, r.what);
    }
    std::filesystem::remove_all(from_nvme);
    std::filesystem::remove_all(from_cpu);
    ExpectEmptyAndRemove(tier_dir);
  }
}

// A model whose optimizer state does not fit the host budget: CPU offload fails naming the budget, the NVMe tier
// trains under it to the bits CPU offload gives without it.
TEST(NvmeBudgetTest, TrainsWhereCpuOffloadRunsOutOfHostMemory) {
  // One rank: no communicator staging in the host tier (at more ranks Gloo's, counted but never refused, is larger
  // than the tiny GPT's optimizer state; zero-gpt --host-limit shows the same with the small GPT, bench/results).
  const int world = 1;
  Config cpu = Cpu(2, Precision::kBF16);
  const std::string dir = TierDir("budget");
  Config nvme = Nvme(cpu, dir, /*buffers=*/2);
  nvme.zero.sub_group_size = 1024;  // staging: 2 chunks of 1024 elements
  nvme.aio.block_size = 4096;       // the I/O engine's staging: 2 × 4 KiB
  nvme.aio.queue_depth = 2;
  const GptRun want = Train(world, cpu);
  const GptRun free_nvme = Train(world, nvme);
  ASSERT_TRUE(want.status.ok()) << want.status;
  ASSERT_TRUE(free_nvme.status.ok()) << free_nvme.status;
  const int64_t cpu_host = want.memory.PeakTotal(MemTier::kHost);
  const int64_t nvme_host = free_nvme.memory.PeakTotal(MemTier::kHost);
  const int64_t state = want.memory.Get(MemTier::kHost, MemTag::kOptimizer).current +
                        want.memory.Get(MemTier::kHost, MemTag::kMaster).current;
  std::printf("host peak: CPU offload %lld, NVMe tier %lld; master + optimizer state %lld bytes\n",
              static_cast<long long>(cpu_host), static_cast<long long>(nvme_host), static_cast<long long>(state));
  ASSERT_LT(nvme_host, cpu_host - state / 2) << "the tiny GPT's state must outweigh the tier's staging";
  // Half-way between what the NVMe tier needs and what CPU offload needs: below CPU offload's optimizer state.
  const int64_t budget = nvme_host + (cpu_host - nvme_host) / 2;
  const GptRun refused = Train(world, cpu, kSteps, "", "", budget);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted) << refused.status;
  EXPECT_THAT(std::string(refused.status.message()), HasSubstr(absl::StrCat("budget of ", budget)));
  const GptRun fits = Train(world, nvme, kSteps, "", "", budget);
  ExpectBitwise(fits, want, "under the budget");
  EXPECT_LE(fits.memory.PeakTotal(MemTier::kHost), budget);
  ExpectEmptyAndRemove(dir);
}

// The host bytes the tier needs are the buffer settings', whatever the model: the plan of a unit 16 times larger
// holds the same host staging and no host master or state; the NVMe tier grows instead.
TEST(NvmePlanTest, HostBytesFollowTheBuffersNotTheModel) {
  Config cfg = Nvme(Cpu(3, Precision::kBF16), "/nonexistent-unused");
  cfg.zero.offload_optimizer.buffer_count = 3;
  ASSERT_OK_AND_ASSIGN(internal::PlanPolicy p, internal::PlanPolicy::FromConfig(cfg, 2, 0));
  p.optimizer_states = 2;
  const internal::StagePlan small = internal::MakePlan(p, {1 << 16});
  const internal::StagePlan large = internal::MakePlan(p, {1 << 20});
  for (const internal::StagePlan* plan : {&small, &large}) {
    const MemoryReport r = plan->Report();
    EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kMaster).current, 0);
    EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kOptimizer).current, 0);
    // buffer_count chunks of sub_group_size elements × (master + 2 states) × 4 bytes, each with 4 KiB for the
    // alignment, and the I/O engine's queue_depth × block_size.
    EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kStaging).current - 2 * 4096 * 2 /*copy-back tiles, bf16*/,
              3 * (4096 * 3 * 4 + 4096) + 4 * 65536);
  }
  const int64_t s = (1 << 16) / 2, l = (1 << 20) / 2;
  EXPECT_EQ(small.Report().Get(MemTier::kNvme, MemTag::kOptimizer).current, s * 8);
  EXPECT_EQ(large.Report().Get(MemTier::kNvme, MemTag::kOptimizer).current, l * 8);
  EXPECT_EQ(large.Report().Get(MemTier::kNvme, MemTag::kMaster).current, l * 4);
  EXPECT_EQ(small.Report().Get(MemTier::kHost, MemTag::kStaging).current,
            large.Report().Get(MemTier::kHost, MemTag::kStaging).current);
}

// The placement plan's bound on the NVMe tier is its regions: nothing transient lives there.
TEST(NvmeEngineTest, PeakBoundOfTheNvmeTierIsItsRegions) {
  const std::string dir = TierDir("bound");
  const Config cfg = Nvme(Cpu(3, Precision::kBF16), dir);
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, testing::Borrow(comm)));
    const MemoryReport r = e->memory_report();
    EXPECT_GT(r.Current(MemTier::kNvme), 0) << "rank " << rank;
    EXPECT_EQ(e->TruePeakBound(MemTier::kNvme).total(), r.Current(MemTier::kNvme)) << "rank " << rank;
    EXPECT_EQ(r.Get(MemTier::kHost, MemTag::kOptimizer).current, 0) << "rank " << rank;
  });
  ExpectEmptyAndRemove(dir);
}

TEST(NvmeConfigTest, MistakesNameTheirKeys) {
  auto parse = [](const std::string& offload) {
    return Config::FromJsonString(absl::StrCat(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW",
        "params": {"lr": 0.001}}, "zero_optimization": {"stage": 3, )",
                                               offload, "}}"));
  };
  StatusOr<Config> no_path = parse(R"("offload_optimizer": {"device": "nvme"})");
  ASSERT_FALSE(no_path.ok());
  EXPECT_THAT(std::string(no_path.status().message()), HasSubstr("offload_optimizer.nvme_path"));
  // offload_param's own tier (tests/offload/param_nvme_test.cc) needs its own nvme_path.
  StatusOr<Config> params = parse(R"("offload_param": {"device": "nvme"}, "offload_optimizer": {"device": "nvme",
      "nvme_path": "/tmp"})");
  ASSERT_FALSE(params.ok());
  EXPECT_THAT(std::string(params.status().message()), HasSubstr("offload_param.nvme_path"));
  ASSERT_OK_AND_ASSIGN(Config ok, parse(R"("offload_optimizer": {"device": "nvme", "nvme_path": "/x",
      "buffer_count": 2, "pipeline_read": true, "pipeline_write": true})"));
  EXPECT_EQ(ok.zero.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(ok.zero.offload_optimizer.buffer_count, 2);
  // A folder that does not exist: Finalize fails on every rank, naming the key and the path.
  const Config missing = Nvme(Cpu(2, Precision::kF32), "/nonexistent/zero-nvme");
  const GptRun r = Train(2, missing, 1);
  ASSERT_FALSE(r.status.ok());
  EXPECT_THAT(std::string(r.status.message()),
              AllOf(HasSubstr("offload_optimizer.nvme_path"), HasSubstr("/nonexistent/zero-nvme")));
}

}  // namespace
}  // namespace zero
