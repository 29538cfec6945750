// GradStats against a double-precision host reference. Tolerance: squares are formed and summed in f32 in
// groups of eight, so each group's relative error is at most 8 * 2^-24 ~= 4.8e-7 and, all terms being
// positive, so is the total's: |got - ref| <= 1e-6 * ref (+ 1e-38 * n for squares that underflow in f32).
// The non-finite count must be exact; the result must be bit-identical run after run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "support/status_matchers.h"
#include "zero/advanced/cuda_kernels.h"

namespace zero {
namespace {

using ::zero::testing::StatusIs;

using testing_cuda::DeviceBuffer;
using testing_cuda::EdgeValues;

class CudaGradStatsTest : public testing_cuda::GpuTest {};

struct Ref {
  double sumsq = 0.0;
  uint64_t nonfinite = 0;
};

Ref Reference(const void* g, DType t, size_t n, float scale) {
  Ref r;
  for (size_t i = 0; i < n; ++i) {
    const float x = LoadAsF32(g, t, i) * scale;
    if (std::isfinite(x)) {
      r.sumsq += static_cast<double>(x) * static_cast<double>(x);
    } else {
      ++r.nonfinite;
    }
  }
  return r;
}

// Runs GradStats on `host` (n elements of t, copied to the device at element offset `mis`) with d_out poisoned.
::testing::AssertionResult RunStats(const std::vector<unsigned char>& host, DType t, size_t n, size_t mis, float scale,
                                    GradStatsResult* out) {
  const size_t es = DTypeSize(t);
  DeviceBuffer grad((n + mis) * es + 16), result(sizeof(GradStatsResult)), workspace(cuda::kGradStatsWorkspaceBytes);
  if (grad.Upload(host.data(), n * es, mis * es) != cudaSuccess) return ::testing::AssertionFailure() << "upload";
  if (result.Poison() != cudaSuccess || workspace.Poison() != cudaSuccess) {
    return ::testing::AssertionFailure() << "poison";
  }
  const Status s = cuda::GradStats(grad.get() + mis * es, t, n, scale, reinterpret_cast<GradStatsResult*>(result.get()),
                                   /*accumulate=*/false, workspace.get(), nullptr);
  if (!s.ok()) return ::testing::AssertionFailure() << s;
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    return ::testing::AssertionFailure() << cudaGetErrorString(e);
  }
  if (result.Download(out, sizeof(*out)) != cudaSuccess) return ::testing::AssertionFailure() << "download";
  return ::testing::AssertionSuccess();
}

TEST_F(CudaGradStatsTest, MatchesReferenceOnRandomInputs) {
  const uint32_t seed = testing_cuda::FreshSeed();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (size_t n : {0u, 1u, 7u, 8u, 9u, 100u, 4099u, 300000u, (1u << 22) + 3}) {
      for (size_t mis : {0u, 1u, 3u}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(t) << " n=" << n << " mis=" << mis << " seed=" << seed);
        std::vector<float> g(n);
        for (auto& x : g) x = 100.0f * normal(rng);
        std::vector<unsigned char> bytes(n * DTypeSize(t) + 1);
        ConvertBuffer(g.data(), DType::kF32, bytes.data(), t, n);
        const float scale = 1.0f / 64;
        const Ref ref = Reference(bytes.data(), t, n, scale);
        GradStatsResult got;
        ASSERT_TRUE(RunStats(bytes, t, n, mis, scale, &got));
        EXPECT_EQ(got.nonfinite, ref.nonfinite);
        EXPECT_NEAR(got.sumsq, ref.sumsq, 1e-6 * ref.sumsq + 1e-38 * static_cast<double>(n));
        if (n == 0) {
          EXPECT_EQ(got.sumsq, 0.0);  // written, not left poisoned
        }
      }
    }
  }
}

TEST_F(CudaGradStatsTest, CountsEveryNonFiniteValueWherever) {
  const uint32_t seed = testing_cuda::FreshSeed();
  std::mt19937 rng(seed);
  const size_t n = 10007;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (size_t mis : {0u, 5u}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " mis=" << mis << " seed=" << seed);
      std::vector<float> g(n);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (auto& x : g) x = u(rng);
      // Non-finite values at the first and last element (scalar head/tail), inside vectors, and at random.
      g[0] = std::numeric_limits<float>::infinity();
      g[n - 1] = std::numeric_limits<float>::quiet_NaN();
      g[8] = -std::numeric_limits<float>::infinity();
      g[15] = std::numeric_limits<float>::quiet_NaN();
      for (int k = 0; k < 20; ++k) g[std::uniform_int_distribution<size_t>(0, n - 1)(rng)] = EdgeValues()[k % 3];
      // Edge values that are finite must not count: subnormals, zeros, the largest finite of the type.
      g[100] = 1e-40f;
      g[101] = -0.0f;
      g[102] = t == DType::kF16    ? 65504.0f
               : t == DType::kBF16 ? BF16ToF32(0x7F7F)  // bf16's largest finite (FLT_MAX rounds to inf)
                                   : std::numeric_limits<float>::max();
      std::vector<unsigned char> bytes(n * DTypeSize(t));
      ConvertBuffer(g.data(), DType::kF32, bytes.data(), t, n);
      const Ref ref = Reference(bytes.data(), t, n, 1.0f);
      GradStatsResult got;
      ASSERT_TRUE(RunStats(bytes, t, n, mis, 1.0f, &got));
      EXPECT_EQ(got.nonfinite, ref.nonfinite);
      EXPECT_GE(ref.nonfinite, 4u);
      EXPECT_FALSE(std::isfinite(got.sumsq));  // the caller skips the step; the sum is meaningless then
    }
  }
  // Unscaling can overflow: the largest finite value times 2 is inf and counts.
  std::vector<float> g = {std::numeric_limits<float>::max(), 1.0f, 2.0f};
  std::vector<unsigned char> bytes(g.size() * 4);
  std::memcpy(bytes.data(), g.data(), bytes.size());
  GradStatsResult got;
  ASSERT_TRUE(RunStats(bytes, DType::kF32, g.size(), 0, 2.0f, &got));
  EXPECT_EQ(got.nonfinite, 1u);
}

TEST_F(CudaGradStatsTest, SubnormalsAndLargeValues) {
  // Subnormal inputs: squares underflow in f32; the result stays finite, within the absolute tolerance.
  std::vector<float> g(1000, 1e-40f);
  g[3] = 3.0f;
  g[999] = 4.0f;
  std::vector<unsigned char> bytes(g.size() * 4);
  std::memcpy(bytes.data(), g.data(), bytes.size());
  GradStatsResult got;
  ASSERT_TRUE(RunStats(bytes, DType::kF32, g.size(), 0, 1.0f, &got));
  EXPECT_EQ(got.nonfinite, 0u);
  EXPECT_NEAR(got.sumsq, 25.0, 1e-6 * 25.0);
}

TEST_F(CudaGradStatsTest, DeterministicAndAccumulates) {
  const uint32_t seed = testing_cuda::FreshSeed();
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t n = (1u << 21) + 11;
  std::vector<float> a(n), b(n);
  for (auto& x : a) x = normal(rng);
  for (auto& x : b) x = 3.0f * normal(rng);
  DeviceBuffer da(n * 4), db(n * 4), out(sizeof(GradStatsResult)), ws(cuda::kGradStatsWorkspaceBytes);
  ZERO_ASSERT_CUDA(da.Upload(a.data(), n * 4));
  ZERO_ASSERT_CUDA(db.Upload(b.data(), n * 4));
  auto* d_out = reinterpret_cast<GradStatsResult*>(out.get());
  // Same input, same bits: five runs.
  GradStatsResult first{};
  for (int run = 0; run < 5; ++run) {
    ZERO_ASSERT_CUDA(out.Poison());
    ASSERT_OK(cuda::GradStats(da.get(), DType::kF32, n, 1.0f, d_out, false, ws.get(), nullptr));
    GradStatsResult r;
    ZERO_ASSERT_CUDA(out.Download(&r, sizeof(r)));
    if (run == 0) {
      first = r;
    } else {
      ASSERT_EQ(std::memcmp(&r.sumsq, &first.sumsq, sizeof(double)), 0) << "run " << run;
    }
  }
  // Accumulate: a then b into one result equals the sum of the two.
  ASSERT_OK(cuda::GradStats(da.get(), DType::kF32, n, 1.0f, d_out, false, ws.get(), nullptr));
  ASSERT_OK(cuda::GradStats(db.get(), DType::kF32, n, 1.0f, d_out, true, ws.get(), nullptr));
  GradStatsResult both;
  ZERO_ASSERT_CUDA(out.Download(&both, sizeof(both)));
  const Ref ra = Reference(a.data(), DType::kF32, n, 1.0f);
  const Ref rb = Reference(b.data(), DType::kF32, n, 1.0f);
  EXPECT_NEAR(both.sumsq, ra.sumsq + rb.sumsq, 1e-6 * (ra.sumsq + rb.sumsq));
  EXPECT_EQ(both.nonfinite, 0u);
}

TEST_F(CudaGradStatsTest, RejectsBadArguments) {
  DeviceBuffer ws(cuda::kGradStatsWorkspaceBytes), out(sizeof(GradStatsResult));
  auto* d_out = reinterpret_cast<GradStatsResult*>(out.get());
  EXPECT_THAT(cuda::GradStats(nullptr, DType::kF32, 10, 1.0f, d_out, false, ws.get(), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(cuda::GradStats(ws.get(), DType::kF32, 10, 1.0f, d_out, false, nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(cuda::GradStats(ws.get(), DType::kF32, 10, 1.0f, d_out, false, ws.get() + 4, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace zero
