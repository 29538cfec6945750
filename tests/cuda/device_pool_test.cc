// DevicePool: blocks are reused without cudaMalloc in the steady state, reuse across streams waits for the
// release event (held open deterministically by a kernel spinning on a host flag, no timing involved), the
// byte limit turns into a device-side stream wait, and every byte is tracked by tag in the device tier.
#include "zero/advanced/device_memory.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "cuda_test_util.h"
#include "support/status_matchers.h"
#include "test_kernels.h"

namespace zero {
namespace {

using ::zero::testing::StatusIs;

using testing_cuda::HostFlag;
using testing_cuda::LaunchSpinUntilFlag;

constexpr unsigned long long kSpinLimitNs = 30ull * 1000 * 1000 * 1000;  // 30 s: only a broken test hits it

class DevicePoolTest : public testing_cuda::GpuTest {
 protected:
  void SetUp() override {
    testing_cuda::GpuTest::SetUp();
    if (IsSkipped()) return;
    ZERO_ASSERT_CUDA(cudaStreamCreateWithFlags(&a_, cudaStreamNonBlocking));
    ZERO_ASSERT_CUDA(cudaStreamCreateWithFlags(&b_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    for (cudaStream_t s : {a_, b_}) {
      if (s == nullptr) continue;
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
  }
  cudaStream_t a_ = nullptr;
  cudaStream_t b_ = nullptr;
};

int64_t DeviceBytes(const MemoryTracker& t, MemTag tag) { return t.Report().Get(MemTier::kDevice, tag).current; }

TEST_F(DevicePoolTest, NoCudaMallocInSteadyState) {
  MemoryTracker tracker;
  auto pool_or = DevicePool::Create(&tracker);
  ASSERT_OK(pool_or);
  DevicePool& pool = **pool_or;
  // One "training step": gather buffers on the comm stream (a), read on the compute stream (b) after an
  // event, released on b; gradient buckets on b.
  struct Req {
    size_t bytes;
    MemTag tag;
  };
  const std::vector<Req> step = {{3u << 20, MemTag::kGather},
                                 {(5u << 20) + 7, MemTag::kGather},
                                 {100000, MemTag::kBuckets},
                                 {1000, MemTag::kBuckets}};
  int64_t mallocs_after_warmup = -1;
  for (int s = 0; s < 10; ++s) {
    std::vector<DeviceBlock> live;
    for (const Req& r : step) {
      auto blk = pool.Allocate(r.bytes, r.tag, a_);
      ASSERT_OK(blk);
      ASSERT_GE(blk->capacity(), r.bytes);
      ZERO_ASSERT_CUDA(cudaMemsetAsync(blk->data(), s, r.bytes, a_));  // the "all-gather"
      live.push_back(std::move(*blk));
    }
    cudaEvent_t ev;
    ZERO_ASSERT_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    ZERO_ASSERT_CUDA(cudaEventRecord(ev, a_));
    ZERO_ASSERT_CUDA(cudaStreamWaitEvent(b_, ev, 0));  // cross-stream order by events only
    for (DeviceBlock& blk : live) {
      ZERO_ASSERT_CUDA(cudaMemsetAsync(blk.data(), 0, blk.size(), b_));  // the "forward" reading it
      blk.Release(b_);
    }
    ZERO_ASSERT_CUDA(cudaEventDestroy(ev));
    ZERO_ASSERT_CUDA(cudaStreamSynchronize(b_));  // the step ends; the next step's gathers see completed events
    if (s == 0) mallocs_after_warmup = pool.Stats().malloc_count;
  }
  const DevicePoolStats st = pool.Stats();
  EXPECT_EQ(mallocs_after_warmup, static_cast<int64_t>(step.size()));
  EXPECT_EQ(st.malloc_count, mallocs_after_warmup) << st.ToString();  // no cudaMalloc after the first step
  EXPECT_EQ(st.free_count, 0);
  EXPECT_EQ(st.allocations, 10 * static_cast<int64_t>(step.size()));
  EXPECT_EQ(st.reuses, 9 * static_cast<int64_t>(step.size()));
  EXPECT_EQ(st.blocks_in_use, 0);
  // Every byte held is in the tracker's device tier, under the tag it served.
  EXPECT_EQ(DeviceBytes(tracker, MemTag::kGather) + DeviceBytes(tracker, MemTag::kBuckets), st.bytes_reserved);
  EXPECT_EQ(DeviceBytes(tracker, MemTag::kGather), (4 << 20) + (6 << 20));  // rounded to 2 MiB
  EXPECT_EQ(DeviceBytes(tracker, MemTag::kBuckets), 100352 + 1024);         // rounded to 512 B
}

TEST_F(DevicePoolTest, CrossStreamReuseWaitsForTheReleaseEvent) {
  MemoryTracker tracker;
  auto pool_or = DevicePool::Create(&tracker);
  ASSERT_OK(pool_or);
  DevicePool& pool = **pool_or;
  HostFlag flag;
  ASSERT_TRUE(flag.ok());
  const size_t bytes = 1 << 20;

  auto x = pool.Allocate(bytes, MemTag::kGather, a_);
  ASSERT_OK(x);
  void* const x_ptr = x->data();
  // Stream b is busy until the flag is set; x's last user is b.
  ZERO_ASSERT_CUDA(LaunchSpinUntilFlag(flag.device(), kSpinLimitNs, b_));
  x->Release(b_);
  ASSERT_EQ(pool.Stats().malloc_count, 1);

  // (1) Another stream must not get x while b may still use it: a new block is allocated.
  auto y = pool.Allocate(bytes, MemTag::kGather, a_);
  ASSERT_OK(y);
  EXPECT_NE(y->data(), x_ptr);
  EXPECT_EQ(pool.Stats().malloc_count, 2);

  // (2) The releasing stream itself may reuse x at once: stream order puts the new work after the old.
  auto x_again = pool.Allocate(bytes, MemTag::kGather, b_);
  ASSERT_OK(x_again);
  EXPECT_EQ(x_again->data(), x_ptr);
  EXPECT_EQ(pool.Stats().same_stream_reuses, 1);
  x_again->Release(b_);

  // (3) Once b has passed the event, any stream may reuse x without a new cudaMalloc.
  flag.Set();
  ZERO_ASSERT_CUDA(cudaStreamSynchronize(b_));
  auto z = pool.Allocate(bytes, MemTag::kGather, a_);
  ASSERT_OK(z);
  EXPECT_EQ(z->data(), x_ptr);
  EXPECT_EQ(pool.Stats().malloc_count, 2);
  y->Release(a_);
  z->Release(a_);
  EXPECT_EQ(pool.Stats().blocks_in_use, 0);
}

TEST_F(DevicePoolTest, AtTheLimitTheNewStreamWaitsOnTheDevice) {
  MemoryTracker tracker;
  DevicePoolOptions opt;
  opt.max_bytes = 2 << 20;
  auto pool_or = DevicePool::Create(&tracker, opt);
  ASSERT_OK(pool_or);
  DevicePool& pool = **pool_or;
  HostFlag flag;
  ASSERT_TRUE(flag.ok());

  auto x = pool.Allocate(2 << 20, MemTag::kBuckets, a_);
  ASSERT_OK(x);
  void* const x_ptr = x->data();
  ZERO_ASSERT_CUDA(LaunchSpinUntilFlag(flag.device(), kSpinLimitNs, b_));
  x->Release(b_);

  // No room for a second block: a gets x, with a device-side wait on b's release event (the host goes on).
  auto y = pool.Allocate(2 << 20, MemTag::kBuckets, a_);
  ASSERT_OK(y);
  EXPECT_EQ(y->data(), x_ptr);
  EXPECT_EQ(pool.Stats().stream_waits, 1);
  EXPECT_EQ(pool.Stats().malloc_count, 1);
  ZERO_ASSERT_CUDA(cudaMemsetAsync(y->data(), 1, 2 << 20, a_));
  // a cannot have run its memset: it waits for b, which spins until the flag is set.
  EXPECT_EQ(cudaStreamQuery(a_), cudaErrorNotReady);
  cudaGetLastError();

  // While y is in use, the limit leaves nothing to hand out.
  auto w = pool.Allocate(1 << 20, MemTag::kBuckets, a_);
  EXPECT_THAT(w, StatusIs(absl::StatusCode::kResourceExhausted));

  flag.Set();
  ZERO_ASSERT_CUDA(cudaStreamSynchronize(a_));
  y->Release(a_);
}

TEST_F(DevicePoolTest, TracksTagsAndReturnsMemory) {
  MemoryTracker tracker;
  {
    auto pool_or = DevicePool::Create(&tracker);
    ASSERT_OK(pool_or);
    DevicePool& pool = **pool_or;
    auto empty = pool.Allocate(0, MemTag::kGather, a_);
    ASSERT_OK(empty);
    EXPECT_TRUE(empty->empty());

    auto g = pool.Allocate((1 << 20) + 1, MemTag::kGather, a_);
    ASSERT_OK(g);
    EXPECT_EQ(g->capacity(), size_t{2} << 20);
    EXPECT_EQ(DeviceBytes(tracker, MemTag::kGather), 2 << 20);
    EXPECT_EQ(pool.Stats().bytes_in_use, 2 << 20);
    g->Release(a_);
    ZERO_ASSERT_CUDA(cudaStreamSynchronize(a_));
    // The same block now serves a bucket: its bytes move to that tag.
    auto b = pool.Allocate(2 << 20, MemTag::kBuckets, a_);
    ASSERT_OK(b);
    EXPECT_EQ(pool.Stats().malloc_count, 1);
    EXPECT_EQ(DeviceBytes(tracker, MemTag::kGather), 0);
    EXPECT_EQ(DeviceBytes(tracker, MemTag::kBuckets), 2 << 20);
    EXPECT_EQ(tracker.Report().Get(MemTier::kHost, MemTag::kBuckets).current, 0);  // device tier only
    {
      DeviceBlock moved = std::move(*b);  // moving keeps one owner; destruction releases on its stream
      EXPECT_TRUE(b->empty());
    }
    EXPECT_EQ(pool.Stats().blocks_in_use, 0);
    ASSERT_OK(pool.ReleaseCachedSync());
    EXPECT_EQ(pool.Stats().free_count, 1);
    EXPECT_EQ(pool.Stats().bytes_reserved, 0);
    EXPECT_EQ(DeviceBytes(tracker, MemTag::kBuckets), 0);
    auto again = pool.Allocate(4096, MemTag::kStaging, a_);  // still usable after returning memory
    ASSERT_OK(again);
    EXPECT_EQ(DeviceBytes(tracker, MemTag::kStaging), 4096);
  }
  // Pool destroyed (after its last block was released by the DeviceBlock destructor): nothing left tracked.
  EXPECT_EQ(tracker.Report().Current(MemTier::kDevice), 0);
}

}  // namespace
}  // namespace zero
