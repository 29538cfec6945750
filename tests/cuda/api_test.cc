// The CUDA API's host-side contract, checked without a GPU: bad arguments are kInvalidArgument before any CUDA
// call, and on a machine without a device the calls fail with a Status instead of crashing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "support/status_matchers.h"
#include "zero/advanced/cuda_kernels.h"
#include "zero/advanced/device_memory.h"

namespace zero {
namespace {

using ::testing::IsEmpty;
using ::testing::Not;
using ::zero::testing::StatusIs;

// Fake device addresses: the checks under test never dereference them.
float* Fake(uintptr_t a) { return reinterpret_cast<float*>(a); }

ShardUpdate ValidShard(float** states) {
  ShardUpdate u;
  u.master = Fake(0x10000);
  u.grad = Fake(0x20000);
  u.grad_dtype = DType::kBF16;
  states[0] = Fake(0x30000);
  states[1] = Fake(0x40000);
  u.state = states;
  u.param_out = Fake(0x50000);
  u.param_out_dtype = DType::kBF16;
  u.n = 1024;
  u.step = 1;
  u.lr = 1e-3;
  return u;
}

TEST(CudaApiTest, OptimizerArgumentsAreChecked) {
  float* states[2];
  const AdamParams adam;
  auto expect_invalid = [&](ShardUpdate u, const char* what) {
    const Status s = cuda::AdamStep(u, adam, nullptr);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument)) << what;
  };
  ShardUpdate u = ValidShard(states);
  u.master = nullptr;
  expect_invalid(u, "null master");
  u = ValidShard(states);
  u.grad = nullptr;
  expect_invalid(u, "null grad");
  u = ValidShard(states);
  u.state = nullptr;
  expect_invalid(u, "null state array");
  u = ValidShard(states);
  states[1] = nullptr;
  expect_invalid(u, "null state[1]");
  u = ValidShard(states);
  u.step = 0;
  expect_invalid(u, "step 0");
  u = ValidShard(states);
  u.lr = -1;
  expect_invalid(u, "negative lr");
  u = ValidShard(states);
  u.param_out = u.master;
  expect_invalid(u, "param_out == master");
  u = ValidShard(states);
  u.grad = Fake(0x10000 + 1024);  // inside master's 4 KiB
  expect_invalid(u, "overlap");
  u = ValidShard(states);
  u.grad_dtype = static_cast<DType>(7);
  expect_invalid(u, "bad dtype");

  AdamParams bad = adam;
  bad.beta1 = 1.0;
  EXPECT_THAT(cuda::AdamStep(ValidShard(states), bad, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  SgdParams nesterov;
  nesterov.nesterov = true;  // needs momentum > 0
  EXPECT_THAT(cuda::SgdStep(ValidShard(states), nesterov, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));

  // n == 0 is a no-op, whatever the pointers.
  ShardUpdate empty;
  empty.n = 0;
  EXPECT_OK(cuda::AdamStep(empty, adam, nullptr));
  EXPECT_OK(cuda::SgdStep(empty, SgdParams{}, nullptr));
}

TEST(CudaApiTest, OtherArgumentsAreChecked) {
  auto* out = reinterpret_cast<GradStatsResult*>(0x1000);
  EXPECT_THAT(cuda::GradStats(nullptr, DType::kF32, 4, 1.0f, out, false, Fake(0x2000), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(cuda::GradStats(Fake(0x3000), DType::kF32, 4, 1.0f, out, false, Fake(0x2000 + 4), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  cuda::CopySegment seg{nullptr, Fake(0x1000), 8};
  EXPECT_THAT(cuda::BatchCopy(&seg, 1, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_OK(cuda::BatchCopy(nullptr, 0, nullptr));
  cuda::DeviceSpan part{Fake(0x1000), 8};
  EXPECT_THAT(cuda::Flatten(&part, 1, nullptr, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(cuda::Unflatten(nullptr, &part, 1, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(cuda::Convert(nullptr, DType::kF32, Fake(0x1000), DType::kBF16, 4, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  DevicePoolOptions bad;
  bad.max_fit_ratio = 0.5;
  EXPECT_THAT(DevicePool::Create(nullptr, bad), StatusIs(absl::StatusCode::kInvalidArgument));
}

// The quantize kernels' arguments: dtype, block >= 1, null and overlapping buffers; n == 0 is a no-op.
TEST(CudaApiTest, QuantizeArgumentsAreChecked) {
  auto* q = reinterpret_cast<int8_t*>(0x10000);
  float* s = Fake(0x20000);
  float* x = Fake(0x30000);
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(cuda::QuantizeInt8(x, DType::kF32, 16, 0, q, s, nullptr), StatusIs(kInvalid));
  EXPECT_THAT(cuda::QuantizeInt8(x, static_cast<DType>(9), 16, 4, q, s, nullptr), StatusIs(kInvalid));
  EXPECT_THAT(cuda::QuantizeInt8(nullptr, DType::kF32, 16, 4, q, s, nullptr), StatusIs(kInvalid));
  EXPECT_THAT(cuda::QuantizeInt8(x, DType::kF32, 16, 4, nullptr, s, nullptr), StatusIs(kInvalid));
  EXPECT_THAT(cuda::QuantizeInt8(x, DType::kF32, 16, 4, q, nullptr, nullptr), StatusIs(kInvalid));
  // Codes over the input's last bytes; scales over the codes.
  EXPECT_THAT(cuda::QuantizeInt8(x, DType::kF32, 16, 4, reinterpret_cast<int8_t*>(x) + 60, s, nullptr),
              StatusIs(kInvalid));
  EXPECT_THAT(cuda::QuantizeInt8(x, DType::kF32, 16, 4, q, reinterpret_cast<float*>(q + 12), nullptr),
              StatusIs(kInvalid));
  EXPECT_OK(cuda::QuantizeInt8(nullptr, DType::kF32, 0, 4, nullptr, nullptr, nullptr));
  EXPECT_THAT(cuda::DequantizeInt8(q, s, 16, 0, x, DType::kBF16, nullptr), StatusIs(kInvalid));
  EXPECT_THAT(cuda::DequantizeInt8(q, s, 16, 4, nullptr, DType::kBF16, nullptr), StatusIs(kInvalid));
  EXPECT_THAT(cuda::DequantizeInt8(q, s, 16, 4, x, static_cast<DType>(9), nullptr), StatusIs(kInvalid));
  EXPECT_THAT(cuda::DequantizeInt8(q, s, 16, 4, Fake(0x20000 - 8), DType::kF32, nullptr), StatusIs(kInvalid));
  EXPECT_OK(cuda::DequantizeInt8(nullptr, nullptr, 0, 4, nullptr, DType::kF32, nullptr));
}

// qgZ's kernels' arguments: block >= 1, null and overlapping buffers; n == 0 is a no-op; Divide may run in place.
TEST(CudaApiTest, QgzKernelArgumentsAreChecked) {
  auto* q = reinterpret_cast<uint8_t*>(0x10000);
  float* s = Fake(0x20000);
  float* x = Fake(0x30000);
  float* w = Fake(0x40000);
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(cuda::QuantizeInt4(x, 16, 0, q, s, w, nullptr), StatusIs(kInvalid));
  EXPECT_THAT(cuda::QuantizeInt4(x, 16, 4, q, s, nullptr, nullptr), StatusIs(kInvalid));
  EXPECT_THAT(cuda::QuantizeInt4(x, 16, 4, reinterpret_cast<uint8_t*>(x) + 60, s, w, nullptr), StatusIs(kInvalid));
  EXPECT_THAT(cuda::QuantizeInt4(x, 16, 4, q, s, s + 2, nullptr), StatusIs(kInvalid));  // scratch over the scales
  EXPECT_OK(cuda::QuantizeInt4(nullptr, 0, 4, nullptr, nullptr, nullptr, nullptr));
  EXPECT_THAT(cuda::DequantizeInt4(q, s, 16, 0, x, nullptr), StatusIs(kInvalid));
  EXPECT_THAT(cuda::DequantizeInt4(q, s, 16, 4, Fake(0x20000 - 8), nullptr), StatusIs(kInvalid));
  EXPECT_THAT(cuda::LocoResidual(x, s, nullptr, 0.8f, 16, nullptr), StatusIs(kInvalid));
  EXPECT_THAT(cuda::LocoResidual(x, s, x + 8, 0.8f, 16, nullptr), StatusIs(kInvalid));
  EXPECT_THAT(cuda::Divide(x, x + 1, 4.0f, 16, nullptr), StatusIs(kInvalid));
  EXPECT_THAT(cuda::Divide(nullptr, x, 4.0f, 16, nullptr), StatusIs(kInvalid));
  EXPECT_OK(cuda::Divide(nullptr, nullptr, 4.0f, 0, nullptr));
}

// Without a device, well-formed calls fail with a Status (the launch cannot happen) instead of crashing.
TEST(CudaApiTest, WithoutDeviceCallsFailCleanly) {
  if (cuda::DeviceCount() > 0) GTEST_SKIP() << "a device is present (the fake pointers would be used)";
  float* states[2];
  const Status s = cuda::AdamStep(ValidShard(states), AdamParams{}, nullptr);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInternal, Not(IsEmpty())));
  auto pool = DevicePool::Create(nullptr);
  EXPECT_THAT(pool, StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace zero
