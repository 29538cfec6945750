// Element math shared by the device kernels and by their CPU emulation test: dtype conversions (bit for bit
// the same as zero/dtype.h), 8-element vector loads and stores, and the alignment plan that splits a range
// into a scalar head, a 16-byte-vector body and a scalar tail.
//
// Everything here is __host__ __device__ and free of absl and of zero's public headers on purpose: the
// kernels must compile standalone (`nvcc -I src src/cuda/*.cu bench/gpu/gpu_bench.cu`) on a machine that has
// only the CUDA toolkit, and the same code must run on the CPU so the kernels' indexing can be tested in CI,
// where there is no GPU.
#pragma once

#include <cuda_runtime.h>  // defines: __host__/__device__ for host compilers, float4, uint4

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#define ZERO_HD __host__ __device__ __forceinline__
#ifdef __CUDACC__
#define ZERO_UNROLL _Pragma("unroll")
#else
#define ZERO_UNROLL
#endif

namespace zero::cuda::internal {

// Element types, with the same values as zero::DType (checked by a static_assert in src/cuda/kernels.cc).
enum class Dt : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

ZERO_HD size_t DtSize(Dt t) { return t == Dt::kF32 ? 4 : 2; }

// ---------------------------------------------------------------------------------------------------------
// Bit casts and conversions.

ZERO_HD uint32_t Bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

ZERO_HD float FromBits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Exact: a bf16 is the top half of an f32.
ZERO_HD float BF16ToF32(uint32_t h) { return FromBits(h << 16); }

// Round to nearest even; NaN stays a (quiet) NaN with its sign; overflow gives inf.
ZERO_HD uint16_t F32ToBF16(float f) {
  uint32_t u = Bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

ZERO_HD uint16_t F32ToF16(float f) {
  uint32_t x = Bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) {
    return static_cast<uint16_t>(sign | 0x7C00u | (x > 0x7F800000u ? (0x0200u | ((x >> 13) & 0x3FFu)) : 0u));
  }
  if (x >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (x < 0x38800000u) {
    // Adding 0.5 puts the half-subnormal ulp (2^-24) at the float's own ulp: the FPU rounds to nearest even.
#ifdef __CUDA_ARCH__
    const float shifted = __fadd_rn(FromBits(x), 0.5f);  // _rn: never fused, never flushed
#else
    const float shifted = FromBits(x) + 0.5f;
#endif
    return static_cast<uint16_t>(sign | (Bits(shifted) - 0x3F000000u));
  }
  const uint32_t mant_odd = (x >> 13) & 1u;
  x += (static_cast<uint32_t>(15 - 127) << 23) + 0xFFFu + mant_odd;
  return static_cast<uint16_t>(sign | (x >> 13));
}

ZERO_HD float F16ToF32(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return FromBits(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
#ifdef __CUDA_ARCH__
    const float mag = __fmul_rn(static_cast<float>(mant), 5.9604644775390625e-8f);
#else
    const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
#endif
    return FromBits(sign | Bits(mag));
  }
  return FromBits(sign | ((exp + 112u) << 23) | (mant << 13));
}

// f32 arithmetic with one rounding per operation, never fused into an FMA: the device code uses the _rn
// intrinsics (which the compiler does not contract); host code compiled with -ffp-contract=off does the same.
// Written this way, the optimizer kernels reproduce the host reference (src/optim) bit for bit.
ZERO_HD float FMul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
ZERO_HD float FAdd(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
ZERO_HD float FSub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
ZERO_HD float FDiv(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
ZERO_HD float FSqrt(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

ZERO_HD bool IsNonFinite(float f) { return (Bits(f) & 0x7F800000u) == 0x7F800000u; }

// ---------------------------------------------------------------------------------------------------------
// Type tags: the kernels are templates over the gradient type and the parameter write-back type, so the
// vector loads and stores have their width fixed at compile time.

struct F32 {
  static constexpr Dt kDt = Dt::kF32;
  using Elem = float;
};
struct F16 {
  static constexpr Dt kDt = Dt::kF16;
  using Elem = uint16_t;
};
struct BF16 {
  static constexpr Dt kDt = Dt::kBF16;
  using Elem = uint16_t;
};
struct NoOut {};  // no parameter write-back

template <class T>
ZERO_HD float LoadOne(const void* p, size_t i) {
  if constexpr (T::kDt == Dt::kF32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (T::kDt == Dt::kF16) {
    return F16ToF32(static_cast<const uint16_t*>(p)[i]);
  } else {
    return BF16ToF32(static_cast<const uint16_t*>(p)[i]);
  }
}

template <class T>
ZERO_HD void StoreOne(void* p, size_t i, float v) {
  if constexpr (T::kDt == Dt::kF32) {
    static_cast<float*>(p)[i] = v;
  } else if constexpr (T::kDt == Dt::kF16) {
    static_cast<uint16_t*>(p)[i] = F32ToF16(v);
  } else {
    static_cast<uint16_t*>(p)[i] = F32ToBF16(v);
  }
}

// 16-bit T (f16/bf16) <-> f32 for kWords 32-bit words of two halves each: element 2k in the low half of word k.
// Shared by Load8/Store8 and the tiled fused step's LoadUnit/StoreUnit so both round identically.
template <class T, int kWords>
ZERO_HD void UnpackHalves(const uint32_t (&w)[kWords], float (&v)[2 * kWords]) {
  ZERO_UNROLL
  for (int k = 0; k < kWords; ++k) {
    if constexpr (T::kDt == Dt::kBF16) {
      v[2 * k] = FromBits(w[k] << 16);
      v[2 * k + 1] = FromBits(w[k] & 0xFFFF0000u);
    } else {
      v[2 * k] = F16ToF32(w[k] & 0xFFFFu);
      v[2 * k + 1] = F16ToF32(w[k] >> 16);
    }
  }
}

template <class T, int kWords>
ZERO_HD void PackHalves(const float (&v)[2 * kWords], uint32_t (&w)[kWords]) {
  ZERO_UNROLL
  for (int k = 0; k < kWords; ++k) {
    uint32_t lo, hi;
    if constexpr (T::kDt == Dt::kBF16) {
      lo = F32ToBF16(v[2 * k]);
      hi = F32ToBF16(v[2 * k + 1]);
    } else {
      lo = F32ToF16(v[2 * k]);
      hi = F32ToF16(v[2 * k + 1]);
    }
    w[k] = lo | (hi << 16);
  }
}

// Loads elements [i, i + 8) as f32. Requires the address of element i to be 16-byte aligned (VecPlan).
// f32: two 16-byte loads; f16/bf16: one 16-byte load of eight halves (element 0 in the low half of .x).
template <class T>
ZERO_HD void Load8(const void* p, size_t i, float (&v)[8]) {
  if constexpr (T::kDt == Dt::kF32) {
    const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    const float4 a = q[0];
    const float4 b = q[1];
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
    v[4] = b.x;
    v[5] = b.y;
    v[6] = b.z;
    v[7] = b.w;
  } else {
    const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p) + i);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    UnpackHalves<T, 4>(w, v);
  }
}

// Stores eight f32 values as elements [i, i + 8) of a T buffer (16-byte aligned, see Load8).
template <class T>
ZERO_HD void Store8(void* p, size_t i, const float (&v)[8]) {
  if constexpr (T::kDt == Dt::kF32) {
    float4* q = reinterpret_cast<float4*>(static_cast<float*>(p) + i);
    q[0] = make_float4(v[0], v[1], v[2], v[3]);
    q[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    uint32_t w[4];
    PackHalves<T, 4>(v, w);
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p) + i) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// ---------------------------------------------------------------------------------------------------------
// The alignment plan: elements [0, head) and [head + 8 * nvec, n) are processed one at a time, the body
// [head, head + 8 * nvec) eight at a time with 16-byte accesses. `head` (< 8) is chosen so that every
// buffer's element `head` is 16-byte aligned; when no such head exists (buffers misaligned relative to each
// other, or not even aligned to their element size), head = n and nvec = 0: all scalar, still correct.
struct VecPlan {
  size_t n = 0;
  size_t head = 0;
  size_t nvec = 0;

  ZERO_HD size_t VecEnd() const { return head + 8 * nvec; }
  // Number of elements outside the vector body.
  ZERO_HD size_t ScalarCount() const { return head + (n - VecEnd()); }
  // The element index of the k-th scalar element (k < ScalarCount()).
  ZERO_HD size_t ScalarIndex(size_t k) const { return k < head ? k : VecEnd() + (k - head); }
};

// One buffer of the plan: its address and element size (nullptr entries are ignored).
struct PlanBuffer {
  const void* ptr;
  size_t elem_size;
};

inline VecPlan MakeVecPlan(const PlanBuffer* bufs, int count, size_t n) {
  VecPlan plan;
  plan.n = n;
  plan.head = n;
  plan.nvec = 0;
  for (size_t h = 0; h < 8 && h < n; ++h) {
    bool ok = true;
    for (int b = 0; b < count && ok; ++b) {
      if (bufs[b].ptr == nullptr) continue;
      const uintptr_t a = reinterpret_cast<uintptr_t>(bufs[b].ptr);
      ok = a % bufs[b].elem_size == 0 && (a + h * bufs[b].elem_size) % 16 == 0;
    }
    if (ok) {
      plan.head = h;
      plan.nvec = (n - h) / 8;
      return plan;
    }
  }
  return plan;
}

}  // namespace zero::cuda::internal
