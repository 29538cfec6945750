// A program that links zero::cuda with a plain target_link_libraries and references none of its symbols: the
// link option zero::cuda carries (--undefined=zero_cuda_register, src/CMakeLists.txt) must still pull its
// registration out of the static archive, so the CPU library's CUDA seams reach the real implementations.
// unlinked_test.cc is the counterpart without zero::cuda. Runs without a GPU (CI) and with one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/internal/cuda_backend.h"
#include "support/status_matchers.h"
#include "zero/communicator.h"
#include "zero/memory.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::zero::testing::IsOk;

TEST(CudaLinked, TheBackendIsRegisteredBeforeMain) {
  const internal::CudaBackend* cuda = internal::GetCudaBackend();
  ASSERT_NE(cuda, nullptr);
  EXPECT_NE(cuda->device_count, nullptr);
  EXPECT_NE(cuda->alloc_pinned, nullptr);
  EXPECT_NE(cuda->free_pinned, nullptr);
  EXPECT_NE(cuda->alloc_device, nullptr);
  EXPECT_NE(cuda->free_device, nullptr);
  EXPECT_NE(cuda->create_nccl, nullptr);
  EXPECT_NE(cuda->make_compute, nullptr);
}

TEST(CudaLinked, CreateNcclReachesTheNcclCommunicator) {
  // Rank 5 of 1: the NCCL communicator's own argument check answers, before any CUDA call, on every machine.
  auto c = Communicator::CreateNccl(Store::Hash(), 5, 1, {});
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("CreateNccl: rank 5 is not in [0, world_size 1)"));
  EXPECT_THAT(std::string(c.status().message()), Not(HasSubstr("link zero::cuda")));
}

TEST(CudaLinked, DeviceBufferIsTheDevicesOrACudaError) {
  const internal::CudaBackend* cuda = internal::GetCudaBackend();
  ASSERT_NE(cuda, nullptr);
  MemoryTracker t;
  Status error;
  Buffer b = Buffer::Device(&t, MemTag::kGather, 4096, &error);
  if (cuda->device_count() > 0) {
    EXPECT_THAT(error, IsOk());
    EXPECT_EQ(b.tier(), MemTier::kDevice);
  } else {
    EXPECT_TRUE(b.empty());
    EXPECT_THAT(std::string(error.message()), HasSubstr("CUDA error"));  // the runtime's answer, not "link zero::cuda"
  }
}

}  // namespace
}  // namespace zero
