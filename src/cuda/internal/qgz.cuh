// The per-thread parts of ZeRO++ qgZ's element work on the device (the compute tier's QuantizeInt4, DequantizeInt4,
// LocoResidual and Divide: shard/internal/compute.h), shared by src/cuda/qgz.cu and the CPU emulation test
// (tests/cuda/qgz_emulation_test.cc). qgZ's int8 records use quantize.cuh's kernels on f32 input.
//
// int4 (core/internal/quantize.h's QuantizeInt4 / DequantizeInt4, the scalar reference): block b is elements
// [b·block, min((b+1)·block, n)); its scale is max|x| / 7 and element x becomes round-to-nearest-even(x · (7 / max|x|))
// clamped to [-7, 7], stored as a nibble, element 2k in the low half of byte k and 2k + 1 in the high half. Two
// passes: the first reduces each block's maximum (one CUDA block per quantization block, as quantize.cu) and writes
// its scale and its factor (the factor into a scratch array the second pass reads); the second writes every byte
// whole from its two elements, each with its own block's factor, so a byte whose elements lie in two blocks (odd
// block sizes) needs no read-modify-write and no atomics.
//
// Bit for bit the reference, by construction, as quantize.cuh says for int8: the maximum is an integer max of bit
// patterns (order-free), the scale and the factor single correctly rounded divisions (FDiv), x · factor one rounded
// product (FMul) rounded to the nearest even integer (__float2int_rn; std::nearbyint under the default rounding mode
// on the host), dequantize float(code) · scale (FMul). LoCo's step is β·e + (1 − β)·(y − sent), every operation
// rounded once (FMul, FSub, FAdd: never contracted into an FMA; the host reference is compiled with
// -ffp-contract=off), a non-finite result stored as 0; the division one FDiv.
#pragma once

#include "cuda/internal/quantize.cuh"

namespace zero::cuda::internal {

// The reference's int4 scale and nibble: quantize.cuh's int8 rule with 7 levels, the code in 4-bit two's complement.
ZERO_HD QuantScale Int4ScaleOfBits(uint32_t max_f32_bits) { return QuantScaleOfBits(max_f32_bits, 7.0f); }
ZERO_HD uint8_t QuantizeOneInt4(float x, float inv) { return static_cast<uint8_t>(QuantizeOneLevels(x, inv, 7) & 0xF); }

// Bytes k = tid, tid + nthreads, ... below Int4Bytes(n): elements 2k and 2k + 1 (0 past n), each with the factor of
// its own block (`inv`, one per block, the first pass's).
ZERO_HD void Int4CodesThread(const float* x, size_t n, size_t block, const float* inv, uint8_t* q, size_t tid,
                             size_t nthreads) {
  const size_t bytes = (n + 1) / 2;
  for (size_t k = tid; k < bytes; k += nthreads) {
    const size_t i = 2 * k;
    uint8_t b = QuantizeOneInt4(x[i], inv[i / block]);
    if (i + 1 < n) b = static_cast<uint8_t>(b | (QuantizeOneInt4(x[i + 1], inv[(i + 1) / block]) << 4));
    q[k] = b;
  }
}

// out[i] = float(code i) · scale of its block, for i = tid, tid + nthreads, ... below n.
ZERO_HD void DequantizeInt4Thread(const uint8_t* q, const float* scales, size_t n, size_t block, float* out, size_t tid,
                                  size_t nthreads) {
  for (size_t i = tid; i < n; i += nthreads) {
    const int nibble = (q[i / 2] >> ((i & 1) ? 4 : 0)) & 0xF;
    const int code = nibble >= 8 ? nibble - 16 : nibble;  // sign-extend
    out[i] = FMul(static_cast<float>(code), scales[i / block]);
  }
}

// LoCo: e[i] = β·e[i] + keep·(y[i] − sent[i]) (keep = 1 − β, computed once by the caller as the reference does),
// 0 where that is not finite.
ZERO_HD void LocoResidualThread(const float* y, const float* sent, float* e, float beta, float keep, size_t n,
                                size_t tid, size_t nthreads) {
  for (size_t i = tid; i < n; i += nthreads) {
    const float next = FAdd(FMul(beta, e[i]), FMul(keep, FSub(y[i], sent[i])));
    e[i] = (Bits(next) & 0x7F800000u) == 0x7F800000u ? 0.0f : next;
  }
}

ZERO_HD void DivideThread(const float* src, float* dst, float divisor, size_t n, size_t tid, size_t nthreads) {
  for (size_t i = tid; i < n; i += nthreads) dst[i] = FDiv(src[i], divisor);
}

}  // namespace zero::cuda::internal
