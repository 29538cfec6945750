// ZeRO++ qgZ's element kernels on a device (label `gpu`; skipped without one) against the host tier's scalar
// references: int4 codes and scales byte for byte and read-back values bit for bit (core/internal/quantize.h's
// QuantizeInt4 / DequantizeInt4), LoCo's residual step and the division bit for bit (shard/internal/compute.h's
// LocoResidualOnHost / DivideOnHost), on random values, ties, an outlier, zeros, subnormals, NaN and infinities,
// odd lengths and odd blocks; outputs poisoned first. What the CPU emulation (qgz_emulation_test.cc) cannot prove:
// the device's own _rn intrinsics, the shuffle reduction and the launches.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/internal/quantize.h"
#include "cuda_test_util.h"
#include "shard/internal/compute.h"
#include "support/status_matchers.h"
#include "zero/advanced/cuda_kernels.h"

namespace zero {
namespace {

using testing_cuda::DeviceBuffer;

class CudaQgzKernelsTest : public testing_cuda::GpuTest {};

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<float> Values(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = normal(rng);
  for (size_t i = 0; i + 40 < n; i += 97) x[i] = static_cast<float>(static_cast<int>(i % 15) - 7) * 0.5f;  // ties
  if (n > 3072) {
    x[100] = 1e4f;
    for (size_t i = 200; i < 240; ++i) x[i] = 0.0f;
    for (size_t i = 240; i < 260; ++i) x[i] = std::numeric_limits<float>::denorm_min() * static_cast<float>(i);
    x[270] = std::numeric_limits<float>::quiet_NaN();
    x[290] = -std::numeric_limits<float>::infinity();
    for (size_t i = 2048; i < 3072; ++i) x[i] = (i & 1) ? 2e-38f : -1.5e-38f;  // 7 / max overflows: zeros
  }
  return x;
}

TEST_F(CudaQgzKernelsTest, Int4MatchesTheHostReference) {
  std::mt19937 rng(testing_cuda::FreshSeed());
  for (size_t block : {size_t{7}, size_t{37}, size_t{1024}}) {
    for (size_t n : {size_t{1}, size_t{1001}, size_t{(1 << 20) + 3}}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << ", block " << block);
      const std::vector<float> x = Values(n, rng);
      const size_t nb = (n + block - 1) / block, bytes = (n + 1) / 2;
      std::vector<uint8_t> ref_q(bytes), q(bytes);
      std::vector<float> ref_s(nb), s(nb), ref_back(n), back(n);
      internal::QuantizeInt4(x.data(), n, block, ref_q.data(), ref_s.data());
      internal::DequantizeInt4(ref_q.data(), ref_s.data(), n, block, ref_back.data());
      DeviceBuffer dx(n * 4), dq(bytes), ds(nb * 4), dinv(nb * 4), dback(n * 4);
      ZERO_ASSERT_CUDA(dx.Upload(x.data(), n * 4));
      ZERO_ASSERT_CUDA(dq.Poison());
      ZERO_ASSERT_CUDA(ds.Poison());
      ZERO_ASSERT_CUDA(dback.Poison());
      auto* ps = reinterpret_cast<float*>(ds.get());
      ASSERT_OK(cuda::QuantizeInt4(reinterpret_cast<float*>(dx.get()), n, block, dq.get(), ps,
                                   reinterpret_cast<float*>(dinv.get()), nullptr));
      ASSERT_OK(cuda::DequantizeInt4(dq.get(), ps, n, block, reinterpret_cast<float*>(dback.get()), nullptr));
      ZERO_ASSERT_CUDA(cudaDeviceSynchronize());
      ZERO_ASSERT_CUDA(dq.Download(q.data(), bytes));
      ZERO_ASSERT_CUDA(ds.Download(s.data(), nb * 4));
      ZERO_ASSERT_CUDA(dback.Download(back.data(), n * 4));
      ASSERT_EQ(q, ref_q);
      for (size_t b = 0; b < nb; ++b) ASSERT_TRUE(testing_cuda::SameFloat(s[b], ref_s[b])) << "scale " << b;
      for (size_t i = 0; i < n; ++i) ASSERT_TRUE(testing_cuda::SameFloat(back[i], ref_back[i])) << "element " << i;
    }
  }
}

TEST_F(CudaQgzKernelsTest, LocoResidualAndDivideMatchTheHostReference) {
  std::mt19937 rng(testing_cuda::FreshSeed());
  const size_t n = (1 << 20) + 5;
  std::vector<float> y = Values(n, rng), sent(n), e0(n), src = Values(n, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    sent[i] = std::isfinite(y[i]) ? y[i] + 0.01f * normal(rng) : 0.0f;
    e0[i] = 0.001f * normal(rng);
  }
  y[7] = 3e38f;
  sent[7] = -3e38f;  // the difference overflows
  DeviceBuffer dy(n * 4), dsent(n * 4), de(n * 4), dsrc(n * 4), dout(n * 4);
  ZERO_ASSERT_CUDA(dy.Upload(y.data(), n * 4));
  ZERO_ASSERT_CUDA(dsent.Upload(sent.data(), n * 4));
  ZERO_ASSERT_CUDA(dsrc.Upload(src.data(), n * 4));
  for (float beta : {0.8f, 0.0f}) {
    std::vector<float> ref = e0, got(n);
    internal::LocoResidualOnHost(y.data(), sent.data(), ref.data(), beta, static_cast<int64_t>(n));
    ZERO_ASSERT_CUDA(de.Upload(e0.data(), n * 4));
    ASSERT_OK(cuda::LocoResidual(reinterpret_cast<float*>(dy.get()), reinterpret_cast<float*>(dsent.get()),
                                 reinterpret_cast<float*>(de.get()), beta, n, nullptr));
    ZERO_ASSERT_CUDA(cudaDeviceSynchronize());
    ZERO_ASSERT_CUDA(de.Download(got.data(), n * 4));
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(Bits(got[i]), Bits(ref[i])) << "beta " << beta << ", element " << i;
  }
  for (float divisor : {4.0f, 3.0f}) {
    std::vector<float> ref(n), got(n);
    internal::DivideOnHost(src.data(), ref.data(), static_cast<int64_t>(n), divisor);
    ZERO_ASSERT_CUDA(dout.Poison());
    ASSERT_OK(
        cuda::Divide(reinterpret_cast<float*>(dsrc.get()), reinterpret_cast<float*>(dout.get()), divisor, n, nullptr));
    ZERO_ASSERT_CUDA(cudaDeviceSynchronize());
    ZERO_ASSERT_CUDA(dout.Download(got.data(), n * 4));
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(testing_cuda::SameFloat(got[i], ref[i])) << divisor << ", " << i;
  }
}

}  // namespace
}  // namespace zero
