// core/internal/quantize.h — blockwise symmetric int8 quantization, the wire format of ZeRO++'s quantized weight
// gather (qwZ) and gradient reduction (qgZ).
//
//   std::vector<int8_t> q(n);
//   std::vector<float> scales(QuantBlocks(n, block));
//   QuantizeInt8(x, DType::kBF16, n, block, q.data(), scales.data());
//   ... send q and scales ...
//   DequantizeInt8(q.data(), scales.data(), n, block, out, DType::kBF16);
//
// Elements [b·block, min((b+1)·block, n)) form block b. Its scale is max|x| / 127 (in f32), and element x becomes
// q = round-to-nearest-even(x · (127 / max|x|)), in [-127, 127] (-128 unused, as DeepSpeed's symmetric int8); the
// value read back is q · scale, rounded to the output type. So the error of each element is at most half a step,
// max|x| / 254, plus the output type's rounding. Special blocks:
//   * every |x| so small that the factor 127 / max|x| overflows (below about 3.7e-37: zeros, subnormals, the
//     smallest normals): scale 0, q 0 — read back as 0 (an error below 3.8e-37); a factor of infinity would code
//     0 · inf = NaN and saturate the rest, which each target's conversion turns into other codes;
//   * a NaN or an infinity in the block: scale NaN, q 0 — the whole block reads back as NaN, so a diverged
//     parameter stays visible instead of being quantized into a finite one.
//
// Every SIMD target gives the scalar reference's bytes (QuantizeInt8Scalar / DequantizeInt8Scalar): the block
// maximum is an integer maximum of |x|'s bits (exact, order-free), the reciprocal and the scale are scalar f32
// divisions, and a product is rounded once (no FMA contraction in this file). Tested on every target this CPU
// runs (tests/core/quantize_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/dtype.h"

namespace zero::internal {

// The scales QuantizeInt8 writes for n elements in blocks of `block` (>= 1).
constexpr size_t QuantBlocks(size_t n, size_t block) { return (n + block - 1) / block; }

// Quantizes x[0, n) (type t) into q[0, n) and scales[0, QuantBlocks(n, block)). block >= 1.
void QuantizeInt8(const void* x, DType t, size_t n, size_t block, int8_t* q, float* scales);
// out[i] = q[i] · scales[i / block], rounded to t.
void DequantizeInt8(const int8_t* q, const float* scales, size_t n, size_t block, void* out, DType t);

// How far ahead of its maximum pass QuantizeInt8's vector kernels prefetch their input, in bytes, into L1 and into L2
// (0: no prefetch at that level). A prefetch moves no result bit, only the speed: each CPU's own hardware prefetchers
// decide what helps (measured per vendor; core/quantize.cc). The process starts with DefaultQuantizePrefetch();
// SetQuantizePrefetch is for a benchmark comparing plans side by side in one process, between quantizes.
struct QuantizePrefetch {
  size_t l1_bytes = 0;
  size_t l2_bytes = 0;
};
// The plans DefaultQuantizePrefetch picks: Intel's (and any CPU not AMD's), AMD's.
inline constexpr QuantizePrefetch kQuantizePrefetchL1L2{.l1_bytes = 4096, .l2_bytes = 16384};
inline constexpr QuantizePrefetch kQuantizePrefetchL1Only{.l1_bytes = 8192, .l2_bytes = 0};
QuantizePrefetch DefaultQuantizePrefetch();
QuantizePrefetch CurrentQuantizePrefetch();
void SetQuantizePrefetch(const QuantizePrefetch& plan);

// The scalar definitions every target matches bit for bit.
void QuantizeInt8Scalar(const void* x, DType t, size_t n, size_t block, int8_t* q, float* scales);
void DequantizeInt8Scalar(const int8_t* q, const float* scales, size_t n, size_t block, void* out, DType t);

// Blockwise symmetric int4, qgZ's optional wire format (zero_quantized_gradients_bits 4), from f32 only: a block's
// scale is max|x| / 7 and x becomes round-to-nearest-even(x · (7 / max|x|)) in [-7, 7], stored as a 4-bit two's
// complement nibble, element 2i in the low nibble of byte i and 2i + 1 in the high one (an odd n leaves the last high
// nibble 0). The special blocks are int8's (scale 0 for a block whose factor 7 / max|x| would overflow, below about
// 2.1e-38; NaN for a block with a NaN or an infinity; codes 0). Scalar: the reduction it serves is bound by the network
// it saves.
constexpr size_t Int4Bytes(size_t n) { return (n + 1) / 2; }
void QuantizeInt4(const float* x, size_t n, size_t block, uint8_t* q, float* scales);
// out[i] = code(i) · scales[i / block].
void DequantizeInt4(const uint8_t* q, const float* scales, size_t n, size_t block, float* out);

}  // namespace zero::internal
