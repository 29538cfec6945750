// The per-thread parts of blockwise int8 quantization (ZeRO++'s qwZ wire format; the host kernels and the scalar
// reference are core/internal/quantize.h), shared by src/cuda/quantize.cu and the CPU emulation test
// (tests/cuda/quantize_emulation_test.cc).
//
// Layout: quantization block b is elements [b·block, min((b+1)·block, n)); one CUDA block handles one
// quantization block at a time (grid-stride over blocks). A block's elements split into a vector body and at
// most 2·(V − 1) scalar elements around it (QuantSpanOf): the body is whole 16-byte vectors of the input (or of
// the dequantized output) — V = 4 f32 or 8 f16/bf16 elements — whose codes are a V-byte word, so every body
// access is one 16-byte access of the wide buffer and one 4- or 8-byte access of the codes. Thread t takes
// vectors t, t + nthreads, ... (consecutive threads, consecutive 16 bytes: each warp instruction covers 512
// contiguous bytes), the scalar elements strided by the thread count. When the buffers' addresses admit no
// common vector boundary (QuantVecPhase: pointers offset against each other, or not aligned to their element),
// every element is scalar: correct, slower.
//
// Quantize reads its input once: each thread keeps its first C vectors (C × 16 bytes; C = 4 or 8, the launch
// shape's: launch.h's QuantShape) in registers through the block's max reduction and codes them from there, so a
// block of threads · C · V elements or fewer is read from memory once (production: 4096 f32 on 256 threads × 4,
// 4096 bf16/f16 on 64 threads × 8); only vectors beyond that (larger blocks, smaller CUDA blocks) are read a
// second time. The threads'
// partial maxima are reduced to the block's maximum, every thread derives the same scale from it, and the threads code
// their elements.
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
//     even (StoreOne, or PackHalves for a vector: the same conversions). Subnormals are neither flushed on input
//     nor output: the kernels are not compiled with -ftz (no fast-math in src/cuda/CMakeLists.txt), and the _rn
//     intrinsics never flush.
// The vector and the scalar paths call the same per-element functions (QuantizeOneInt8, FMul, F32ToBF16 /
// F32ToF16, BF16ToF32 / F16ToF32), so which path an element takes never changes its bits.
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

// The largest |x| bits among the elements begin + tid, begin + tid + nthreads, ... below end (the scalar path:
// the elements outside a block's vector body, or a whole block when there is none). 16-bit types
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

// The reference's ScaleOfBits (src/core/quantize.cc): NaN/inf -> (NaN, 0); every |x| below FLT_MIN, or so small
// that levels / m overflows (below about 3.7e-37 for int8's 127 levels, 2.1e-38 for int4's 7) -> (0, 0); else
// (m / levels, levels / m), each one correctly rounded f32 division.
ZERO_HD QuantScale QuantScaleOfBits(uint32_t max_f32_bits, float levels = 127.0f) {
  if (max_f32_bits > kQuantMaxFiniteBits) return {FromBits(0x7FC00000u), 0.0f};
  if (max_f32_bits < kQuantMinNormalBits) return {0.0f, 0.0f};
  const float m = FromBits(max_f32_bits);
  const float inv = FDiv(levels, m);
  if (Bits(inv) > kQuantMaxFiniteBits) return {0.0f, 0.0f};  // the factor overflows: zeros, as the reference
  return {FDiv(m, levels), inv};
}

// The reference's QuantizeOne: round-to-nearest-even(x · inv) clamped to [-levels, levels]; 0 when inv is 0.
ZERO_HD int QuantizeOneLevels(float x, float inv, int levels) {
  if (inv == 0.0f) return 0;
#ifdef __CUDA_ARCH__
  // cvt.rni: round to nearest even, like nearbyint under the default rounding mode. |x · inv| <= levels (up to one
  // rounding), so the int never saturates; the clamp is the reference's, kept for the same bits in every case.
  int r = __float2int_rn(__fmul_rn(x, inv));
#else
  int r = static_cast<int>(std::nearbyint(x * inv));  // -ffp-contract=off in the test: one rounded product
#endif
  r = r < -levels ? -levels : r;
  r = r > levels ? levels : r;
  return r;
}
ZERO_HD int8_t QuantizeOneInt8(float x, float inv) { return static_cast<int8_t>(QuantizeOneLevels(x, inv, 127)); }

// Quantizes the elements begin + tid, begin + tid + nthreads, ... below end with the block's factor (the scalar
// path: the elements outside a block's vector body, or a whole block when there is none).
template <class T>
ZERO_HD void QuantizeThread(const void* x, size_t begin, size_t end, float inv, int8_t* q, size_t tid,
                            size_t nthreads) {
  for (size_t i = begin + tid; i < end; i += nthreads) q[i] = QuantizeOneInt8(LoadOne<T>(x, i), inv);
}

// out[i] = D(float(q[i]) · scale) for the elements begin + tid, begin + tid + nthreads, ... below end (one
// block, one scale: no division per element to find it; the scalar path, as QuantizeThread). A NaN scale reads
// back NaN, a zero scale zeros.
template <class D>
ZERO_HD void DequantizeThread(const int8_t* q, float scale, size_t begin, size_t end, void* out, size_t tid,
                              size_t nthreads) {
  for (size_t i = begin + tid; i < end; i += nthreads) StoreOne<D>(out, i, FMul(static_cast<float>(q[i]), scale));
}

// ---------------------------------------------------------------------------------------------------------
// The vector body.

// Elements per 16-byte vector of T (4 f32, 8 f16/bf16); their codes are a kQuantVec<T>-byte word.
template <class T>
inline constexpr size_t kQuantVec = 16 / sizeof(typename T::Elem);

// The default of C, the vectors per thread that quantize keeps in registers between the max pass and the coding
// pass (and that dequantize loads before its first store). The kernels are instantiated for C = 4 and 8; the
// launch shape picks one (launch.h's QuantShape: production 4 for f32, 8 for 16-bit types).
inline constexpr int kQuantCached = 4;

// The vector phase of a launch: the h in [0, V) such that element h of `wide` (elements of `elem_size` bytes,
// V = 16 / elem_size of them per vector) is 16-byte aligned and code h is V-byte aligned; then every element
// i ≡ h (mod V) starts a vector of both buffers. V when there is none (the buffers are offset against each other,
// or `wide` is not aligned to its element size): the launch is all scalar. cudaMalloc's buffers give 0.
inline size_t QuantVecPhase(const void* wide, size_t elem_size, const void* codes) {
  const size_t v = 16 / elem_size;
  const auto a = reinterpret_cast<uintptr_t>(wide);
  const auto c = reinterpret_cast<uintptr_t>(codes);
  if (a % elem_size != 0) return v;
  for (size_t h = 0; h < v; ++h) {
    if ((a + h * elem_size) % 16 == 0 && (c + h) % v == 0) return h;
  }
  return v;
}

// A quantization block [begin, end) split by a phase: scalar elements [begin, body), vectors body + k·V for
// k < nvec, scalar elements [tail, end). No phase (phase >= V) or no whole vector: everything scalar.
struct QuantSpan {
  size_t body;
  size_t nvec;
  size_t tail;
};

template <class T>
ZERO_HD QuantSpan QuantSpanOf(size_t begin, size_t end, size_t phase) {
  constexpr size_t kV = kQuantVec<T>;
  if (phase < kV) {
    const size_t body = begin + (phase + kV - begin % kV) % kV;  // the first element >= begin that is ≡ phase
    if (body < end && end - body >= kV) {
      const size_t nvec = (end - body) / kV;
      return {body, nvec, body + nvec * kV};
    }
  }
  return {end, 0, end};
}

// 16 bytes of elements [i, i + V) of T (element i 16-byte aligned), as four words.
template <class T>
ZERO_HD void QuantLoadVec(const void* x, size_t i, uint32_t (&w)[4]) {
  const char* p = static_cast<const char*>(x) + i * sizeof(typename T::Elem);
#ifdef __CUDA_ARCH__
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  w[0] = u.x;
  w[1] = u.y;
  w[2] = u.z;
  w[3] = u.w;
#else
  std::memcpy(w, p, 16);
#endif
}

// The largest |x| bits of a vector, as QuantMaxThread compares them (16-bit types on their own bits).
template <class T>
ZERO_HD uint32_t QuantVecMax(const uint32_t (&w)[4]) {
  uint32_t m = 0;
  ZERO_UNROLL
  for (int k = 0; k < 4; ++k) {
    if constexpr (T::kDt == Dt::kF32) {
      const uint32_t a = w[k] & kQuantAbsMask;
      m = a > m ? a : m;
    } else {
      const uint32_t lo = w[k] & 0x7FFFu;
      const uint32_t hi = (w[k] >> 16) & 0x7FFFu;
      m = lo > m ? lo : m;
      m = hi > m ? hi : m;
    }
  }
  return m;
}

// The vector's elements as f32, as LoadOne converts them.
template <class T>
ZERO_HD void QuantVecValues(const uint32_t (&w)[4], float (&v)[kQuantVec<T>]) {
  if constexpr (T::kDt == Dt::kF32) {
    ZERO_UNROLL
    for (int k = 0; k < 4; ++k) v[k] = FromBits(w[k]);
  } else {
    UnpackHalves<T, 4>(w, v);
  }
}

// Four codes as one word, code 0 in the low byte (little-endian memory order, as the device and x86 hosts).
ZERO_HD uint32_t QuantPack4(int8_t c0, int8_t c1, int8_t c2, int8_t c3) {
  return static_cast<uint32_t>(static_cast<uint8_t>(c0)) | (static_cast<uint32_t>(static_cast<uint8_t>(c1)) << 8) |
         (static_cast<uint32_t>(static_cast<uint8_t>(c2)) << 16) |
         (static_cast<uint32_t>(static_cast<uint8_t>(c3)) << 24);
}

// Codes [i, i + V) from a vector of input, stored as one V-byte word (code i V-byte aligned).
template <class T>
ZERO_HD void QuantCodeVec(const uint32_t (&w)[4], float inv, int8_t* q, size_t i) {
  constexpr size_t kV = kQuantVec<T>;
  float v[kV];
  QuantVecValues<T>(w, v);
  uint32_t c[kV / 4];
  ZERO_UNROLL
  for (size_t k = 0; k < kV / 4; ++k) {
    c[k] = QuantPack4(QuantizeOneInt8(v[4 * k], inv), QuantizeOneInt8(v[4 * k + 1], inv),
                      QuantizeOneInt8(v[4 * k + 2], inv), QuantizeOneInt8(v[4 * k + 3], inv));
  }
#ifdef __CUDA_ARCH__
  if constexpr (kV == 4) {
    *reinterpret_cast<uint32_t*>(q + i) = c[0];
  } else {
    *reinterpret_cast<uint2*>(q + i) = make_uint2(c[0], c[1]);
  }
#else
  std::memcpy(q + i, c, kV);
#endif
}

// One thread's share of quantize: the cached vectors, filled by the max pass and coded by the coding pass.
template <class T, int C = kQuantCached>
struct QuantRegs {
  uint32_t w[C][4];
};

// The max pass: loads vectors tid, tid + nthreads, ... (the first C into `r`, all their loads issued before the
// first is used) and the scalar elements, and returns the largest |x| bits among them (16-bit types: their own
// bits, widened by QuantMaxAsF32Bits after the reduction).
template <class T, int C>
ZERO_HD uint32_t QuantMaxPass(const void* x, size_t begin, size_t end, const QuantSpan& s, QuantRegs<T, C>& r,
                              size_t tid, size_t nthreads) {
  constexpr size_t kV = kQuantVec<T>;
  ZERO_UNROLL
  for (int c = 0; c < C; ++c) {
    const size_t v = tid + static_cast<size_t>(c) * nthreads;
    if (v < s.nvec) QuantLoadVec<T>(x, s.body + v * kV, r.w[c]);
  }
  uint32_t m = 0;
  ZERO_UNROLL
  for (int c = 0; c < C; ++c) {
    if (tid + static_cast<size_t>(c) * nthreads < s.nvec) {
      const uint32_t a = QuantVecMax<T>(r.w[c]);
      m = a > m ? a : m;
    }
  }
  for (size_t v = tid + C * nthreads; v < s.nvec; v += nthreads) {
    uint32_t w[4];
    QuantLoadVec<T>(x, s.body + v * kV, w);
    const uint32_t a = QuantVecMax<T>(w);
    m = a > m ? a : m;
  }
  const uint32_t head = QuantMaxThread<T>(x, begin, s.body, tid, nthreads);
  const uint32_t tail = QuantMaxThread<T>(x, s.tail, end, tid, nthreads);
  m = head > m ? head : m;
  return tail > m ? tail : m;
}

// The coding pass, with the block's factor: the cached vectors from registers, the others read again, the
// scalar elements one at a time.
template <class T, int C>
ZERO_HD void QuantCodePass(const void* x, size_t begin, size_t end, const QuantSpan& s, const QuantRegs<T, C>& r,
                           float inv, int8_t* q, size_t tid, size_t nthreads) {
  constexpr size_t kV = kQuantVec<T>;
  ZERO_UNROLL
  for (int c = 0; c < C; ++c) {
    const size_t v = tid + static_cast<size_t>(c) * nthreads;
    if (v < s.nvec) QuantCodeVec<T>(r.w[c], inv, q, s.body + v * kV);
  }
  for (size_t v = tid + C * nthreads; v < s.nvec; v += nthreads) {
    uint32_t w[4];
    QuantLoadVec<T>(x, s.body + v * kV, w);
    QuantCodeVec<T>(w, inv, q, s.body + v * kV);
  }
  QuantizeThread<T>(x, begin, s.body, inv, q, tid, nthreads);
  QuantizeThread<T>(x, s.tail, end, inv, q, tid, nthreads);
}

// Dequantize's share of one thread in one block: vectors tid, tid + nthreads, ... C at a time (their code loads
// issued before the first store), then the scalar elements. The span is QuantSpanOf<D> with the phase of (out,
// codes).
template <class D, int C = kQuantCached>
ZERO_HD void DequantizeSpanThread(const int8_t* q, float scale, size_t begin, size_t end, const QuantSpan& s, void* out,
                                  size_t tid, size_t nthreads) {
  constexpr size_t kV = kQuantVec<D>;
  for (size_t v0 = tid; v0 < s.nvec; v0 += C * nthreads) {
    uint32_t c[C][kV / 4];
    ZERO_UNROLL
    for (int u = 0; u < C; ++u) {
      const size_t v = v0 + static_cast<size_t>(u) * nthreads;
      if (v >= s.nvec) continue;
      const int8_t* p = q + s.body + v * kV;
#ifdef __CUDA_ARCH__
      if constexpr (kV == 4) {
        c[u][0] = *reinterpret_cast<const uint32_t*>(p);
      } else {
        const uint2 t = *reinterpret_cast<const uint2*>(p);
        c[u][0] = t.x;
        c[u][1] = t.y;
      }
#else
      std::memcpy(c[u], p, kV);
#endif
    }
    ZERO_UNROLL
    for (int u = 0; u < C; ++u) {
      const size_t v = v0 + static_cast<size_t>(u) * nthreads;
      if (v >= s.nvec) continue;
      float f[kV];
      ZERO_UNROLL
      for (size_t k = 0; k < kV; ++k) {
        const auto code = static_cast<int8_t>(static_cast<uint8_t>(c[u][k / 4] >> (8 * (k % 4))));
        f[k] = FMul(static_cast<float>(code), scale);
      }
      char* o = static_cast<char*>(out) + (s.body + v * kV) * sizeof(typename D::Elem);
      uint32_t w[4];
      if constexpr (D::kDt == Dt::kF32) {
        ZERO_UNROLL
        for (int k = 0; k < 4; ++k) w[k] = Bits(f[k]);
      } else {
        PackHalves<D, 4>(f, w);
      }
#ifdef __CUDA_ARCH__
      *reinterpret_cast<uint4*>(o) = make_uint4(w[0], w[1], w[2], w[3]);
#else
      std::memcpy(o, w, 16);
#endif
    }
  }
  DequantizeThread<D>(q, scale, begin, s.body, out, tid, nthreads);
  DequantizeThread<D>(q, scale, s.tail, end, out, tid, nthreads);
}

}  // namespace zero::cuda::internal
