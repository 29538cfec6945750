#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "support/status_matchers.h"
#include "zero/advanced/cuda_kernels.h"
#include "zero/dtype.h"

namespace zero {
namespace {

// Device casts agree bit for bit with the host reference on every 16-bit pattern and on random f32 inputs.
TEST(CudaCastTest, MatchesHostBitForBit) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const size_t n = (1u << 20) + 65536 + 3;
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> src(n);
  for (size_t i = 0; i < n; ++i) src[i] = BitsToFloat(bits(rng));
  for (uint32_t i = 0; i < 65536; ++i) src[i] = F16ToF32(static_cast<uint16_t>(i));  // every half pattern
  for (DType t : {DType::kF16, DType::kBF16}) {
    float* d_src = nullptr;
    uint16_t* d_mid = nullptr;
    float* d_back = nullptr;
    ASSERT_EQ(cudaMalloc(&d_src, n * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_mid, n * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_back, n * 4), cudaSuccess);
    ASSERT_EQ(cudaMemset(d_mid, 0xA5, n * 2), cudaSuccess);  // poison
    ASSERT_EQ(cudaMemset(d_back, 0xA5, n * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_src, src.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_OK(cuda::Convert(d_src, DType::kF32, d_mid, t, n, nullptr));
    ASSERT_OK(cuda::Convert(d_mid, t, d_back, DType::kF32, n, nullptr));
    std::vector<uint16_t> mid(n);
    std::vector<float> back(n);
    ASSERT_EQ(cudaMemcpy(mid.data(), d_mid, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(back.data(), d_back, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<uint16_t> ref(n);
    std::vector<float> ref_back(n);
    ConvertBuffer(src.data(), DType::kF32, ref.data(), t, n);
    ConvertBuffer(ref.data(), t, ref_back.data(), DType::kF32, n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(mid[i], ref[i]) << "dtype " << DTypeName(t) << " i=" << i;
      ASSERT_EQ(FloatBits(back[i]), FloatBits(ref_back[i])) << i;
    }
    cudaFree(d_src);
    cudaFree(d_mid);
    cudaFree(d_back);
  }
}

}  // namespace
}  // namespace zero
