// The blockwise int8 quantize / dequantize kernels on a device (label `gpu`; skipped without one) against the
// host's scalar reference (core/internal/quantize.h): codes and scales byte for byte, dequantized values bit for
// bit (NaN compared as NaN: the device's NaN payload is its own), for f32, bf16 and f16, on blocks of random
// values, ties, an outlier, constants, zeros, subnormals, NaN and infinities; outputs poisoned and the bytes just
// past them checked untouched; also with the buffers offset from cudaMalloc's alignment (the kernels' vector
// bodies at another phase, or none: the scalar fallback), and on the other launch shapes the bench measures
// (threads per CUDA block, vectors cached per thread: launch.h's QuantShape). This is what the CPU emulation
// (quantize_emulation_test.cc) cannot prove: the device's own __fdiv_rn / __fmul_rn / __float2int_rn, the warp-shuffle
// reduction and the launches.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/internal/quantize.h"
#include "cuda/internal/launch.h"
#include "cuda_test_util.h"
#include "support/status_matchers.h"
#include "zero/advanced/cuda_kernels.h"

namespace zero {
namespace {

using testing_cuda::DeviceBuffer;
using testing_cuda::SameElement;
using testing_cuda::SameFloat;

class CudaQuantizeTest : public testing_cuda::GpuTest {};

constexpr size_t kGuardBytes = 64;

// n values whose blocks cycle through the special kinds (the emulation test's, more compactly).
std::vector<float> Input(size_t n, size_t block, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t begin = 0, b = 0; begin < n; begin += block, ++b) {
    const size_t end = std::min(n, begin + block);
    for (size_t i = begin; i < end; ++i) {
      const size_t k = i - begin;
      float v = normal(rng);
      switch (b % 10) {
        case 1: v = k == 0 ? 127.0f : (static_cast<float>(k % 126) + 0.5f) * ((k & 1) ? -1.0f : 1.0f); break;  // ties
        case 2: v = k == (end - begin) / 2 ? 1e4f : v; break;
        case 3: v = 0.37f; break;
        case 4: v = (k & 1) ? -0.0f : 0.0f; break;
        case 5: v = (k & 1) ? 1e-40f : -3e-42f; break;
        case 6: v = k == end - begin - 1 ? std::numeric_limits<float>::quiet_NaN() : v; break;
        case 7: v = k == 0 ? std::numeric_limits<float>::infinity() : v; break;
        case 8: v = k == (end - begin) / 3 ? -std::numeric_limits<float>::infinity() : v; break;
        case 9: v = (k & 1) ? 2e-37f : -1.5e-38f; break;  // normal, but 127 / max overflows: zeros
        default: break;
      }
      x[i] = v;
    }
  }
  return x;
}

// The bytes before `offset` and the kGuardBytes after offset + data_bytes still hold Poison()'s 0xA5.
bool GuardIntact(const DeviceBuffer& d, size_t offset, size_t data_bytes) {
  std::vector<unsigned char> g(offset + kGuardBytes);
  if (offset > 0 && d.Download(g.data(), offset, 0) != cudaSuccess) return false;
  if (d.Download(g.data() + offset, kGuardBytes, offset + data_bytes) != cudaSuccess) return false;
  return std::all_of(g.begin(), g.end(), [](unsigned char c) { return c == 0xA5; });
}

// One quantize + dequantize round trip against the scalar reference. The input and the dequantized output start
// `x_off` elements and the codes `q_off` bytes past cudaMalloc's alignment: equal offsets (in elements) keep a
// common 16-byte vector boundary at another phase; different ones leave none, and the kernels go all scalar.
// `shape`: null for the public API (production shape), else the internal launchers on that shape.
void CheckCase(DType t, size_t block, size_t n, size_t x_off, size_t q_off, std::mt19937& rng,
               const cuda::internal::QuantShape* shape = nullptr) {
  namespace in = ::zero::cuda::internal;
  const std::string where =
      std::string(DTypeName(t)) + " block=" + std::to_string(block) + " n=" + std::to_string(n) + " x+" +
      std::to_string(x_off) + " q+" + std::to_string(q_off) +
      (shape ? " shape " + std::to_string(shape->max_threads) + "x" + std::to_string(shape->cached) : std::string());
  const auto quantize = [&](const void* x, int8_t* q, float* s) -> bool {
    if (shape == nullptr) return cuda::QuantizeInt8(x, t, n, block, q, s, nullptr).ok();
    return in::LaunchQuantizeInt8Shaped(x, static_cast<in::Dt>(t), n, block, *shape, q, s, nullptr) == cudaSuccess;
  };
  const auto dequantize = [&](const int8_t* q, const float* s, void* out) -> bool {
    if (shape == nullptr) return cuda::DequantizeInt8(q, s, n, block, out, t, nullptr).ok();
    return in::LaunchDequantizeInt8Shaped(q, s, n, block, *shape, out, static_cast<in::Dt>(t), nullptr) == cudaSuccess;
  };
  const size_t nb = internal::QuantBlocks(n, block), es = DTypeSize(t);
  const size_t xo = x_off * es;
  const std::vector<float> xf = Input(n, block, rng);
  std::vector<unsigned char> x(n * es);
  ConvertBuffer(xf.data(), DType::kF32, x.data(), t, n);
  std::vector<int8_t> ref_q(n);
  std::vector<float> ref_s(nb);
  internal::QuantizeInt8Scalar(x.data(), t, n, block, ref_q.data(), ref_s.data());
  std::vector<unsigned char> ref_out(n * es);
  internal::DequantizeInt8Scalar(ref_q.data(), ref_s.data(), n, block, ref_out.data(), t);

  DeviceBuffer d_x(xo + n * es), d_q(q_off + n + kGuardBytes), d_s(nb * 4 + kGuardBytes),
      d_out(xo + n * es + kGuardBytes);
  ZERO_ASSERT_CUDA(d_x.Upload(x.data(), x.size(), xo));
  ZERO_ASSERT_CUDA(d_q.Poison());
  ZERO_ASSERT_CUDA(d_s.Poison());
  ZERO_ASSERT_CUDA(d_out.Poison());
  auto* q = reinterpret_cast<int8_t*>(d_q.get() + q_off);
  auto* s = reinterpret_cast<float*>(d_s.get());
  ASSERT_TRUE(quantize(d_x.get() + xo, q, s)) << where;
  // Dequantize the device's own codes: the whole round trip on the device.
  ASSERT_TRUE(dequantize(q, s, d_out.get() + xo)) << where;
  ZERO_ASSERT_CUDA(cudaDeviceSynchronize());

  std::vector<int8_t> got_q(n);
  std::vector<float> got_s(nb);
  std::vector<unsigned char> got_out(n * es);
  ZERO_ASSERT_CUDA(d_q.Download(got_q.data(), n, q_off));
  ZERO_ASSERT_CUDA(d_s.Download(got_s.data(), nb * 4));
  ZERO_ASSERT_CUDA(d_out.Download(got_out.data(), n * es, xo));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got_q[i], ref_q[i]) << where << " code " << i;
  for (size_t b = 0; b < nb; ++b) ASSERT_TRUE(SameFloat(got_s[b], ref_s[b])) << where << " scale " << b;
  for (size_t i = 0; i < n; ++i) ASSERT_TRUE(SameElement(got_out.data(), ref_out.data(), t, i)) << where << " " << i;
  EXPECT_TRUE(GuardIntact(d_q, q_off, n)) << where;
  EXPECT_TRUE(GuardIntact(d_s, 0, nb * 4)) << where;
  EXPECT_TRUE(GuardIntact(d_out, xo, n * es)) << where;

  // Deterministic: a second run gives the same bytes.
  ASSERT_TRUE(quantize(d_x.get() + xo, q, s)) << where;
  ZERO_ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<int8_t> again_q(n);
  ZERO_ASSERT_CUDA(d_q.Download(again_q.data(), n, q_off));
  ASSERT_EQ(std::memcmp(again_q.data(), got_q.data(), n), 0) << where;
}

TEST_F(CudaQuantizeTest, MatchesScalarReferenceBitForBit) {
  std::mt19937 rng(testing_cuda::FreshSeed());
  struct Case {
    size_t block, n;
  };
  // Block sizes that are and are not multiples of the 4- and 8-element vectors (1, 3, 4097, 5000 ≡ 8 mod 16),
  // lengths that are not, and 2^22 + 5 elements.
  const Case cases[] = {{1, 19},
                        {3, 100},
                        {32, 32 * 50 + 7},
                        {64, 64 * 20 + 33},
                        {4096, 4095},
                        {4096, 9 * 4096 * 3 + 7},
                        {4097, 4097 * 10 + 3},
                        {5000, 5000 * 19 + 4999},
                        {4096, (size_t{1} << 22) + 5}};
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Case& c : cases) {
      CheckCase(t, c.block, c.n, 0, 0, rng);
      if (HasFatalFailure()) return;
    }
  }
}

// Buffers off cudaMalloc's alignment (the API takes any element-aligned pointer): a common vector boundary at
// another phase (same offsets), none (different offsets: every element scalar).
TEST_F(CudaQuantizeTest, OffsetBuffersMatchScalarReferenceBitForBit) {
  std::mt19937 rng(testing_cuda::FreshSeed());
  struct Case {
    size_t block, n, x_off, q_off;
  };
  const Case cases[] = {{64, 64 * 20 + 33, 1, 1},
                        {4097, 4097 * 5 + 3, 3, 3},
                        {5000, 5000 * 4 + 11, 2, 2},
                        {4096, 4096 * 4 + 1, 1, 0},
                        {4096, 4096 * 3, 0, 5}};
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Case& c : cases) {
      CheckCase(t, c.block, c.n, c.x_off, c.q_off, rng);
      if (HasFatalFailure()) return;
    }
  }
}

// The bench's other launch shapes (the f32 shape on 16-bit types, 128 and 64 threads, 8 cached vectors), through
// the internal launchers: whichever the bench measures, its bits are the reference's. Blocks 4096 (every vector
// in registers, or re-read past them on 32 threads × 4), 4097 and 5000 (scalar heads), and offset buffers.
TEST_F(CudaQuantizeTest, EveryBenchShapeMatchesScalarReferenceBitForBit) {
  std::mt19937 rng(testing_cuda::FreshSeed());
  const cuda::internal::QuantShape shapes[] = {{256, 4}, {128, 4}, {128, 8}, {64, 8}, {32, 4}};
  struct Case {
    size_t block, n, x_off, q_off;
  };
  const Case cases[] = {
      {4096, 4096 * 27 + 7, 0, 0}, {4097, 4097 * 10 + 3, 0, 0}, {5000, 5000 * 4 + 11, 2, 2}, {64, 64 * 20 + 33, 1, 0}};
  for (const cuda::internal::QuantShape& shape : shapes) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (const Case& c : cases) {
        CheckCase(t, c.block, c.n, c.x_off, c.q_off, rng, &shape);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_F(CudaQuantizeTest, InvalidShapeIsRefused) {
  namespace in = ::zero::cuda::internal;
  DeviceBuffer d_x(64 * 4), d_q(64), d_s(4);
  auto* q = reinterpret_cast<int8_t*>(d_q.get());
  auto* s = reinterpret_cast<float*>(d_s.get());
  EXPECT_EQ(in::LaunchQuantizeInt8Shaped(d_x.get(), in::Dt::kF32, 64, 64, {96 + 1, 4}, q, s, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(in::LaunchDequantizeInt8Shaped(q, s, 64, 64, {128, 5}, d_x.get(), in::Dt::kBF16, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace zero
