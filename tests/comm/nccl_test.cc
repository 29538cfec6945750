// The NCCL communicator at world size 1 on one GPU (NCCL refuses two ranks on one device; multi-rank logic is
// proven on Gloo). Checks every op and dtype against the input, stream ordering through events (the op waits
// for work queued on the producer stream; WaitStream orders a consumer after the op), Work bookkeeping, and
// argument errors. Skips without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "support/status_matchers.h"
#include "zero/advanced/communicator_ext.h"
#include "zero/communicator.h"

namespace zero {
namespace {

using ::zero::testing::StatusIs;

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device"

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    CommOptions o;
    o.timeout = absl::Seconds(60);
    auto c = Communicator::CreateNccl(Store::Hash(), 0, 1, o);
    ASSERT_OK(c);
    comm_ = std::move(*c);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    comm_.reset();
  }

  void* Device(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    allocations_.emplace_back(p, &cudaFree);
    return p;
  }

  std::shared_ptr<Communicator> comm_;
  cudaStream_t stream_ = nullptr;
  std::vector<std::unique_ptr<void, cudaError_t (*)(void*)>> allocations_;
};

// Typed host values that are exact in every dtype (small integers).
std::vector<uint8_t> Values(size_t n, DType t) {
  std::vector<uint8_t> v(n * DTypeSize(t));
  for (size_t i = 0; i < n; ++i) StoreFromF32(v.data(), t, i, static_cast<float>(i % 17) - 8.0f);
  return v;
}

// Counts: one NCCL block's worth, and two that NCCL's single-rank average kernel split unevenly (49984 f32 over
// 13 blocks, 2^20 + 3 over 32), which left the output's last elements unwritten before ToNccl mapped an average
// at world size 1 to a sum (NVIDIA/nccl#1950). d_out is zeroed before each reduce-scatter, so every element
// must have been written.
TEST_F(NcclTest, EveryOpAndDtypeAtWorldOne) {
  EXPECT_EQ(comm_->backend(), Backend::kNccl);
  EXPECT_EQ(comm_->world_size(), 1);
  for (size_t n : {size_t{1000}, size_t{49984}, (size_t{1} << 20) + 3}) {
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message() << n << " elements");
      const size_t bytes = n * DTypeSize(t);
      const auto host = Values(n, t);
      void* d_in = Device(bytes);
      void* d_out = Device(bytes);
      std::vector<uint8_t> back(bytes);
      auto check = [&](Work w, const char* what) {
        ASSERT_OK(w.WaitStream(stream_)) << what;
        ASSERT_EQ(cudaMemcpyAsync(back.data(), d_out, bytes, cudaMemcpyDeviceToHost, stream_), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
        ASSERT_OK(w.Wait()) << what;
        // Where they differ, not just that they do (a missed tail shows as its first index).
        const size_t es = DTypeSize(t);
        size_t wrong = 0, first = n;
        for (size_t i = 0; i < n; ++i) {
          if (std::memcmp(back.data() + i * es, host.data() + i * es, es) != 0) {
            if (wrong++ == 0) first = i;
          }
        }
        EXPECT_EQ(wrong, 0u) << what << " dtype " << DTypeName(t) << ": " << wrong << " of " << n
                             << " elements differ, the first at index " << first;
      };
      ASSERT_EQ(cudaMemcpyAsync(d_in, host.data(), bytes, cudaMemcpyHostToDevice, stream_), cudaSuccess);
      check(comm_->AllGather(d_in, d_out, n, t, stream_), "AllGather");
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        ASSERT_EQ(cudaMemsetAsync(d_out, 0, bytes, stream_), cudaSuccess);
        check(comm_->ReduceScatter(d_in, d_out, n, t, op, stream_), "ReduceScatter");
        ASSERT_EQ(cudaMemcpyAsync(d_out, host.data(), bytes, cudaMemcpyHostToDevice, stream_), cudaSuccess);
        check(comm_->AllReduce(d_out, n, t, op, stream_), "AllReduce");
      }
      ASSERT_EQ(cudaMemcpyAsync(d_out, host.data(), bytes, cudaMemcpyHostToDevice, stream_), cudaSuccess);
      check(comm_->Broadcast(d_out, n, t, 0, stream_), "Broadcast");
    }
  }
  Work b = comm_->Barrier();
  EXPECT_OK(b.Wait(absl::Seconds(30)));
  EXPECT_TRUE(b.IsCompleted());
  EXPECT_OK(b.status());
}

// The all-to-all (grouped ncclSend/ncclRecv) at world 1: the one block goes to this rank itself, as the 16-bit
// words qgZ moves its records in; through advanced::ExtendedCommunicator, which the engine checks for it.
TEST_F(NcclTest, AllToAllAtWorldOneDeliversTheBlockToItself) {
  auto* x = advanced::Extended(*comm_);
  ASSERT_NE(x, nullptr);
  ASSERT_TRUE(x->SupportsAllToAll());
  for (size_t n : {size_t{1}, size_t{4097}}) {
    const auto host = Values(n, DType::kF16);
    void* d_in = Device(n * 2);
    void* d_out = Device(n * 2);
    std::vector<uint8_t> back(n * 2);
    ASSERT_EQ(cudaMemcpyAsync(d_in, host.data(), n * 2, cudaMemcpyHostToDevice, stream_), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(d_out, 0, n * 2, stream_), cudaSuccess);
    Work w = x->AllToAll(d_in, d_out, n, DType::kF16, stream_);
    ASSERT_OK(w.WaitStream(stream_));
    ASSERT_EQ(cudaMemcpyAsync(back.data(), d_out, n * 2, cudaMemcpyDeviceToHost, stream_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    ASSERT_OK(w.Wait());
    EXPECT_EQ(std::memcmp(back.data(), host.data(), n * 2), 0) << n << " elements";
  }
}

// ncclCommSplit at world 1 (the most one GPU allows): the child is a working communicator of its own (rank 0 of 1,
// the parent's device), and the parent keeps working after it; each counts its own bus bytes (0 at world 1).
TEST_F(NcclTest, SplitGivesAWorkingChildAndLeavesTheParentWorking) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Communicator> child, comm_->Split(/*color=*/0, /*key=*/0));
  EXPECT_EQ(child->backend(), Backend::kNccl);
  EXPECT_EQ(child->rank(), 0);
  EXPECT_EQ(child->world_size(), 1);
  EXPECT_EQ(child->cuda_device(), comm_->cuda_device());
  const size_t n = 4096;
  const auto host = Values(n, DType::kF32);
  void* d = Device(n * 4);
  std::vector<uint8_t> back(n * 4);
  for (Communicator* c : {child.get(), comm_.get()}) {
    ASSERT_EQ(cudaMemcpyAsync(d, host.data(), n * 4, cudaMemcpyHostToDevice, stream_), cudaSuccess);
    ASSERT_OK(c->AllReduce(d, n, DType::kF32, ReduceOp::kSum, stream_).WaitStream(stream_));
    ASSERT_EQ(cudaMemcpyAsync(back.data(), d, n * 4, cudaMemcpyDeviceToHost, stream_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(std::memcmp(back.data(), host.data(), n * 4), 0);
    EXPECT_EQ(c->bus_bytes(), 0);
  }
  EXPECT_EQ(comm_->Split(-1, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// The op must see work queued earlier on its producer stream: a large memset on `stream_` followed at once by
// an all-gather of the memset buffer (no host sync in between) must gather the memset bytes.
TEST_F(NcclTest, OpWaitsForProducerStream) {
  const size_t bytes = size_t{256} << 20;
  void* d_in = Device(bytes);
  void* d_out = Device(bytes);
  ASSERT_EQ(cudaMemset(d_in, 0, bytes), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d_in, 0x5A, bytes, stream_), cudaSuccess);
  Work w = comm_->AllGather(d_in, d_out, bytes / 2, DType::kBF16, stream_);
  ASSERT_OK(w.Wait());
  std::vector<uint8_t> tail(4096);
  ASSERT_EQ(
      cudaMemcpy(tail.data(), static_cast<uint8_t*>(d_out) + bytes - tail.size(), tail.size(), cudaMemcpyDeviceToHost),
      cudaSuccess);
  for (uint8_t b : tail) ASSERT_EQ(b, 0x5A);
}

TEST_F(NcclTest, SequenceNumbersAndDescriptions) {
  void* d = Device(64);
  Work a = comm_->AllReduce(d, 16, DType::kF32, ReduceOp::kSum, stream_);
  Work b = comm_->Broadcast(d, 16, DType::kF32, 0, stream_);
  EXPECT_EQ(a.sequence(), 0);
  EXPECT_EQ(b.sequence(), 1);
  EXPECT_EQ(b.Describe(), "Broadcast#1(f32, 16 elements, root 0)");
  EXPECT_OK(a.Wait());
  EXPECT_OK(b.Wait());
  Work bad = comm_->Broadcast(d, 16, DType::kF32, 1, stream_);
  EXPECT_THAT(bad.Wait(), StatusIs(absl::StatusCode::kInvalidArgument)) << bad.status();
}

// Fence: completes only after every op issued before it (a large all-gather queued behind a producer stream
// that is still writing its input), names the last op it covers, issues no op, and knows the device.
TEST_F(NcclTest, FenceCoversEarlierOpsAndIssuesNothing) {
  const size_t bytes = size_t{256} << 20;
  void* d_in = Device(bytes);
  void* d_out = Device(bytes);
  ASSERT_EQ(cudaMemsetAsync(d_in, 0x3C, bytes, stream_), cudaSuccess);
  Work w = comm_->AllGather(d_in, d_out, bytes / 2, DType::kBF16, stream_);
  Work f = comm_->Fence();
  EXPECT_EQ(f.Describe().rfind("Fence after#0", 0), 0u) << f.Describe();
  ASSERT_OK(f.Wait()) << f.status();
  EXPECT_TRUE(w.IsCompleted());  // the fence's end comes after the all-gather's on the one comm stream
  std::vector<uint8_t> tail(4096);
  ASSERT_EQ(
      cudaMemcpy(tail.data(), static_cast<uint8_t*>(d_out) + bytes - tail.size(), tail.size(), cudaMemcpyDeviceToHost),
      cudaSuccess);
  for (uint8_t b : tail) ASSERT_EQ(b, 0x3C);
  Work next = comm_->Barrier();
  EXPECT_EQ(next.sequence(), 1);  // the fence took no sequence number
  EXPECT_OK(next.Wait());
  EXPECT_EQ(comm_->cuda_device(), 0);
}

TEST(NcclCreate, BadDeviceIsInvalidArgument) {
  SKIP_WITHOUT_GPU();
  CommOptions o;
  o.device = 1000;
  auto c = Communicator::CreateNccl(Store::Hash(), 0, 1, o);
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(NcclCreate, FailsCleanlyWithoutGpu) {
  if (HaveGpu()) GTEST_SKIP() << "a CUDA device is present";
  auto c = Communicator::CreateNccl(Store::Hash(), 0, 1, {});
  EXPECT_FALSE(c.ok());
}

}  // namespace
}  // namespace zero
