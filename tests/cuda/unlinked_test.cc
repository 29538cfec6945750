// A program that links zero::zero alone (no zero::cuda), in every build: the CPU library reaches the CUDA path
// only through core/internal/cuda_backend.h, so here every CUDA seam answers with a clear Status (never a crash,
// never a CUDA call): CreateNccl, FromEnv(kNccl), the CUDA engine's tier, device buffers; pinned buffers are
// pageable host memory, as on a machine without a device. linked_test.cc is the counterpart with zero::cuda.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/internal/cuda_backend.h"
#include "shard/internal/compute.h"
#include "support/status_matchers.h"
#include "zero/communicator.h"
#include "zero/features.h"
#include "zero/memory.h"

namespace zero {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::zero::testing::IsOk;
using ::zero::testing::StatusIs;

// What every seam says: link zero::cuda where this build has it, "built without CUDA" where it has not.
::testing::Matcher<const std::string&> NotLinkedMessage() {
  return ZERO_HAVE_CUDA ? HasSubstr("link zero::cuda (find_package(zero COMPONENTS cuda)")
                        : HasSubstr("zero was built without CUDA");
}

TEST(CudaUnlinked, NoBackendIsRegistered) { EXPECT_EQ(internal::GetCudaBackend(), nullptr); }

TEST(CudaUnlinked, CreateNcclIsUnimplementedNamingTheComponent) {
  auto c = Communicator::CreateNccl(Store::Hash(), 0, 1, {});
  EXPECT_THAT(c.status(), StatusIs(absl::StatusCode::kUnimplemented,
                                   AllOf(HasSubstr("CreateNccl (rank 0 of 1)"), NotLinkedMessage())));
}

TEST(CudaUnlinked, FromEnvNcclIsUnimplementedNamingTheComponent) {
  // No launcher variables in the test's environment: world size 1, a hash store, then CreateNccl.
  auto c = Communicator::FromEnv(Backend::kNccl);
  EXPECT_THAT(c.status(), StatusIs(absl::StatusCode::kUnimplemented, NotLinkedMessage()));
}

TEST(CudaUnlinked, CudaEngineTierIsUnimplemented) {
  MemoryTracker t;
  auto tier = internal::MakeCudaCompute(&t, 0, nullptr);
  EXPECT_THAT(tier.status(),
              StatusIs(absl::StatusCode::kUnimplemented, AllOf(HasSubstr("the CUDA engine"), NotLinkedMessage())));
}

TEST(CudaUnlinked, DeviceBufferIsUnimplementedNamingTagAndSize) {
  MemoryTracker t;
  Status error;
  Buffer b = Buffer::Device(&t, MemTag::kGather, 1 << 20, &error);
  EXPECT_TRUE(b.empty());
  EXPECT_THAT(error, StatusIs(absl::StatusCode::kUnimplemented,
                              AllOf(HasSubstr("1048576 bytes"), HasSubstr("gather"), NotLinkedMessage())));
  EXPECT_EQ(t.allocations(MemTier::kDevice), 0);
  // Without `error`, no exception and no crash either: an empty buffer.
  EXPECT_TRUE(Buffer::Device(&t, MemTag::kGather, 64, nullptr).empty());
}

TEST(CudaUnlinked, PinnedBufferIsPageableHostMemory) {
  MemoryTracker t;
  Status error;
  {
    Buffer b = Buffer::Pinned(&t, MemTag::kStaging, 4096, &error);
    ASSERT_THAT(error, IsOk());
    ASSERT_FALSE(b.empty());
    EXPECT_EQ(b.tier(), MemTier::kHost);
    EXPECT_EQ(t.Report().Get(MemTier::kHost, MemTag::kStaging).current, 4096);
    b.as<char>()[4095] = 1;  // writable
  }                          // freed as host memory (std::free): no CUDA call on the way out either
  EXPECT_EQ(t.Report().Get(MemTier::kHost, MemTag::kStaging).current, 0);
}

}  // namespace
}  // namespace zero
