// The per-thread parts of blockwise int8 quantization (ZeRO++'s qwZ wire format; the host kernels and the scalar
// reference are core/internal/quantize.h), shared by src/cuda/quantize.cu and the CPU emulation test
// (tests/cuda/quantize_emulation_test.cc).
//
// Layout: quantization block b is elements [b·block, min((b+1)·block, n)); one CUDA block handles one
// quantization block at a time (grid-stride over blocks). Its threads take the block's elements strided by the
// thread count (consecutive threads, consecutive elements: coalesced), each keeps the largest |x| bits it saw,
// the CUDA block reduces those to the block's maximum, every thread derives the same scale from it, and the
// threads quantize their elements. A CUDA block per quantization block (not a warp) because ZeRO++'s blocks are
// thousands of elements: 256 threads give each thread a handful of elements and keep enough loads in flight.
//
// Bit-for-bit the host reference, by construction:
//   * the maximum is an integer maximum of bit patterns: exact, and order-free, so any reduction tree and any
//     thread order give the same value (deterministic without a fixed tree);
//   * the scale and the factor are single f32 divisions with round to nearest (FDiv: __fdiv_rn on the device,
//     so neither nvcc's -prec-div=false nor fast-math could substitute an approximate reciprocal);
//   * x · factor is one rounded product (FMul: __fmul_rn, which nvcc never contracts into an FMA), then
//     rounded to the nearest even integer (__float2int_rn on the device; std::nearbyint under the default
//     rounding mode on the host, as the reference);
//   * dequantize is float(q) · scale (exact conversion, one __fmul_rn) stored with dtype.h's round to nearest
//     even (StoreOne). Subnormals are neither flushed on input nor output: the kernels are not compiled with
//     -ftz (no fast-math in src/cuda/CMakeLists.txt), and the _rn intrinsics never flush.
#pragma once

#include "cuda/internal/device_math.cuh"

namespace zero::cuda::internal {

inline constexpr uint32_t kQuantAbsMask = 0x7FFFFFFFu;
inline constexpr uint32_t kQuantMinNormalBits = 0x00800000u;  // FLT_MIN
inline constexpr uint32_t kQuantMaxFiniteBits = 0x7F7FFFFFu;  // FLT_MAX

ZERO_HD size_t QuantBlockCount(size_t n, size_t block) { return (n + block - 1) / block; }

// A block's scale (written out) and the factor its elements are multiplied by (0: the block quantizes to zeros).
struct QuantScale {
  float scale;
  float inv;
};

// The largest |x| bits among the elements begin + tid, begin + tid + nthreads, ... below end. 16-bit types
// compare their own bits (|x|'s patterns order as the values, NaN and infinity above every finite one) and are
// widened once, after the reduction (QuantMaxAsF32Bits): the same maximum as the reference's per-element f32
// conversion, since that conversion is exact and monotonic.
template <class T>
ZERO_HD uint32_t QuantMaxThread(const void* x, size_t begin, size_t end, size_t tid, size_t nthreads) {
  uint32_t m = 0;
  if constexpr (T::kDt == Dt::kF32) {
    const uint32_t* p = static_cast<const uint32_t*>(x);
    for (size_t i = begin + tid; i < end; i += nthreads) {
      const uint32_t a = p[i] & kQuantAbsMask;
      m = a > m ? a : m;
    }
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(x);
    for (size_t i = begin + tid; i < end; i += nthreads) {
      const uint32_t a = p[i] & 0x7FFFu;
      m = a > m ? a : m;
    }
  }
  return m;
}

// The block maximum (QuantMaxThread's reduced) as f32 bits.
template <class T>
ZERO_HD uint32_t QuantMaxAsF32Bits(uint32_t m) {
  if constexpr (T::kDt == Dt::kF32) {
    return m;
  } else if constexpr (T::kDt == Dt::kF16) {
    return Bits(F16ToF32(m));
  } else {
    return m << 16;
  }
}

// The reference's ScaleOfBits (src/core/quantize.cc): NaN/inf -> (NaN, 0); every |x| below FLT_MIN -> (0, 0)
// (no division by a subnormal, which would overflow); else (m / 127, 127 / m), each one correctly rounded f32
// division.
ZERO_HD QuantScale QuantScaleOfBits(uint32_t max_f32_bits) {
  if (max_f32_bits > kQuantMaxFiniteBits) return {FromBits(0x7FC00000u), 0.0f};
  if (max_f32_bits < kQuantMinNormalBits) return {0.0f, 0.0f};
  const float m = FromBits(max_f32_bits);
  return {FDiv(m, 127.0f), FDiv(127.0f, m)};
}

// The reference's QuantizeOne: round-to-nearest-even(x · inv) clamped to [-127, 127]; 0 when inv is 0.
ZERO_HD int8_t QuantizeOneInt8(float x, float inv) {
  if (inv == 0.0f) return 0;
#ifdef __CUDA_ARCH__
  // cvt.rni: round to nearest even, like nearbyint under the default rounding mode. |x · inv| <= 127 (up to one
  // rounding), so the int never saturates; the clamp is the reference's, kept for the same bits in every case.
  int r = __float2int_rn(__fmul_rn(x, inv));
#else
  int r = static_cast<int>(std::nearbyint(x * inv));  // -ffp-contract=off in the test: one rounded product
#endif
  r = r < -127 ? -127 : r;
  r = r > 127 ? 127 : r;
  return static_cast<int8_t>(r);
}

// Quantizes the elements begin + tid, begin + tid + nthreads, ... below end with the block's factor.
template <class T>
ZERO_HD void QuantizeThread(const void* x, size_t begin, size_t end, float inv, int8_t* q, size_t tid,
                            size_t nthreads) {
  for (size_t i = begin + tid; i < end; i += nthreads) q[i] = QuantizeOneInt8(LoadOne<T>(x, i), inv);
}

// out[i] = D(float(q[i]) · scale) for the elements begin + tid, begin + tid + nthreads, ... below end (one
// block, one scale: no division per element to find it). A NaN scale reads back NaN, a zero scale zeros.
template <class D>
ZERO_HD void DequantizeThread(const int8_t* q, float scale, size_t begin, size_t end, void* out, size_t tid,
                              size_t nthreads) {
  for (size_t i = begin + tid; i < end; i += nthreads) StoreOne<D>(out, i, FMul(static_cast<float>(q[i]), scale));
}

}  // namespace zero::cuda::internal
