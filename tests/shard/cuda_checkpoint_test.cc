// Checkpoints of the CUDA engine (an NCCL communicator; one GPU, so world size 1). An asynchronous save stages the
// rank's state from device memory (and the pinned host tier, with offload) into pinned host staging, and a
// background thread writes it while training goes on: its files are byte for byte those a synchronous save of the
// same state writes, the steps trained during the write are those of an unsaved run, and a fresh CUDA engine that
// loads it continues exactly as the unsaved run. Without clipping the CUDA engine's state is the host engine's bit
// for bit (cuda_engine_test), so its rank file is also the host engine's. Labelled `gpu`: skipped without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "support/device_view_io.h"
#include "support/engine_helpers.h"
#include "support/files.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/advanced/cuda_kernels.h"
#include "zero/checkpoint.h"
#include "zero/communicator.h"
#include "zero/dtype.h"
#include "zero/engine.h"
#include "zero/store.h"

namespace zero {
namespace {

using testing::DeviceViewIo;
using testing::ExpectSameParams;
using testing::ExpectSameSteps;
using testing::ReadWholeFile;
using testing::SyntheticTrace;

struct Case {
  const char* name;
  int stage;
  DType dtype;
  int ga;
  int offload = 0;     // 0: none; 1: offload_optimizer (cpu, pinned); 2: offload_optimizer + offload_param
  double ratio = 1.0;  // offload_optimizer.ratio (Twin-Flow below 1: state on both tiers)
};

Config CaseConfig(const Case& c) {
  // No clipping: the steps are bitwise the host engine's, so the files can be compared with its save.
  Config cfg = testing::TrainConfig(c.stage, /*micro=*/1, c.ga, 3e-3, /*clip=*/0.0);
  cfg.bf16.enabled = c.dtype == DType::kBF16;
  cfg.fp16.enabled = c.dtype == DType::kF16;
  if (c.offload >= 1) {
    cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
    cfg.zero.offload_optimizer.pin_memory = true;
    cfg.zero.offload_optimizer.ratio = c.ratio;
    cfg.zero.sub_group_size = 300;
  }
  if (c.offload >= 2) {
    cfg.zero.offload_param.device = OffloadDevice::kCpu;
    cfg.zero.offload_param.pin_memory = true;
  }
  return cfg;
}

// A fresh NCCL communicator of one rank for each engine (an engine shares its communicator).
StatusOr<std::unique_ptr<Engine>> MakeCudaEngine(const Config& cfg) {
  ZERO_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> nccl, Communicator::CreateNccl(Store::Hash(), 0, 1, {}));
  return testing::MakeSyntheticEngine(cfg, std::move(nccl));
}

constexpr char kTag[] = "/step-00000003/";
constexpr char kRankFile[] = "rank-00000-of-00001.bin";

class CudaCheckpointTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// One CUDA run saves synchronously after 3 steps; another asynchronously, and trains 3 more steps while the file
// is written, then waits. Every file of the two checkpoints is the same, byte for byte (meta.json too); the async
// run's steps equal an unsaved run's; a fresh CUDA engine loading the async checkpoint continues as the unsaved run.
TEST_P(CudaCheckpointTest, AsyncSaveEqualsSyncSaveAndLoadsBack) {
  const Case& c = GetParam();
  const Config cfg = CaseConfig(c);
  const std::string sync_dir = testing::MakeTempDir("zero_cuda_ckpt"),
                    async_dir = testing::MakeTempDir("zero_cuda_ckpt");
  constexpr int kFirst = 3, kSecond = 3;
  SyntheticTrace straight, with_sync, before, during, resumed;
  {
    ASSERT_OK_AND_ASSIGN(auto e, MakeCudaEngine(cfg));
    ASSERT_TRUE(e->on_device());
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kFirst + kSecond, c.ga, DeviceViewIo(*e), &straight));
  }
  {
    ASSERT_OK_AND_ASSIGN(auto e, MakeCudaEngine(cfg));
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kFirst, c.ga, DeviceViewIo(*e), &with_sync));
    ASSERT_OK(e->Save(sync_dir, {.trainer_state = {{"pos", "100"}}}).status());
  }
  {
    ASSERT_OK_AND_ASSIGN(auto e, MakeCudaEngine(cfg));
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kFirst, c.ga, DeviceViewIo(*e), &before));
    const int64_t staging_before = e->memory_report().Get(MemTier::kHost, MemTag::kStaging).current;
    ASSERT_OK_AND_ASSIGN(std::string tag, e->Save(async_dir, {.trainer_state = {{"pos", "100"}}, .async = true}));
    EXPECT_EQ(tag, "step-00000003");
    EXPECT_TRUE(e->save_in_flight());
    // The staging (pinned host memory on the CUDA engine) stays allocated, counted under kStaging.
    EXPECT_GT(e->memory_report().Get(MemTier::kHost, MemTag::kStaging).current, staging_before);
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kSecond, c.ga, DeviceViewIo(*e), &during, kFirst));
    ASSERT_OK(e->WaitForSave());
    EXPECT_FALSE(e->save_in_flight());
    ASSERT_OK(e->WaitForSave());  // nothing in flight: nothing to report
  }
  std::vector<StepResult> joined = before.steps;
  joined.insert(joined.end(), during.steps.begin(), during.steps.end());
  ExpectSameSteps(straight.steps, joined);
  ExpectSameParams(straight, during);
  {
    ASSERT_OK_AND_ASSIGN(auto e, MakeCudaEngine(cfg));
    ASSERT_OK_AND_ASSIGN(LoadResult r, e->Load(async_dir));
    EXPECT_EQ(r.step, kFirst);
    EXPECT_EQ(r.trainer_state.at("pos"), "100");
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kSecond, c.ga, DeviceViewIo(*e), &resumed, kFirst));
  }
  ExpectSameSteps(during.steps, resumed.steps);
  ExpectSameParams(straight, resumed);

  ASSERT_OK(VerifyCheckpoint(async_dir));
  ASSERT_OK_AND_ASSIGN(std::string latest, LatestCheckpointTag(async_dir));
  EXPECT_EQ(latest, "step-00000003");
  ASSERT_OK_AND_ASSIGN(auto unlisted, UnlistedCheckpointFiles(async_dir));
  EXPECT_TRUE(unlisted.empty());
  EXPECT_EQ(ReadWholeFile(sync_dir + kTag + "meta.json"), ReadWholeFile(async_dir + kTag + "meta.json"));
  const std::string a = ReadWholeFile(sync_dir + kTag + kRankFile), b = ReadWholeFile(async_dir + kTag + kRankFile);
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the async save's rank file differs from the sync save's (" << a.size() << " vs " << b.size()
                      << " bytes)";
}

// The same state saved by the host engine (Gloo, world size 1): the rank file (parameters, master weights and
// optimizer state) is the CUDA engine's async save's, byte for byte.
TEST_P(CudaCheckpointTest, AsyncRankFileEqualsTheHostEnginesSave) {
  const Case& c = GetParam();
  const Config cfg = CaseConfig(c);
  const std::string host_dir = testing::MakeTempDir("zero_cuda_ckpt"), dev_dir = testing::MakeTempDir("zero_cuda_ckpt");
  constexpr int kSteps = 3;
  SyntheticTrace th, td;
  {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Communicator> gloo, Communicator::CreateGloo(Store::Hash(), 0, 1, {}));
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, gloo));
    ASSERT_FALSE(e->on_device());
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kSteps, c.ga, testing::HostViewIo(), &th));
    ASSERT_OK(e->Save(host_dir).status());
  }
  {
    ASSERT_OK_AND_ASSIGN(auto e, MakeCudaEngine(cfg));
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, kSteps, c.ga, DeviceViewIo(*e), &td));
    ASSERT_OK(e->Save(dev_dir, {.async = true}).status());
    ASSERT_OK(e->WaitForSave());
  }
  ExpectSameParams(th, td);
  const std::string h = ReadWholeFile(host_dir + kTag + kRankFile), d = ReadWholeFile(dev_dir + kTag + kRankFile);
  ASSERT_FALSE(h.empty());
  ASSERT_EQ(h.size(), d.size());
  size_t first = h.size();
  for (size_t i = 0; i < h.size() && first == h.size(); ++i) {
    if (h[i] != d[i]) first = i;
  }
  EXPECT_EQ(first, h.size()) << "the CUDA engine's rank file differs from the host engine's, first at byte " << first
                             << " of " << h.size();
}

INSTANTIATE_TEST_SUITE_P(Stages, CudaCheckpointTest,
                         ::testing::Values(Case{"s0_f32", 0, DType::kF32, 1}, Case{"s2_bf16_ga2", 2, DType::kBF16, 2},
                                           Case{"s3_bf16", 3, DType::kBF16, 1},
                                           Case{"s3_bf16_twinflow", 3, DType::kBF16, 1, 1, 0.5},
                                           Case{"s3_f32_offload_all", 3, DType::kF32, 1, 2}),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace zero
