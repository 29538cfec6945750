// zero/dtype.h — element types of parameters, gradients and wire buffers, with bit-exact conversions.
//
//   uint16_t h = zero::F32ToBF16(1.0f / 3);   // round to nearest, ties to even; NaN stays NaN
//   float f = zero::BF16ToF32(h);            // exact
//   zero::ConvertBuffer(src, zero::DType::kF32, dst, zero::DType::kBF16, n);
//
// The conversions are inline and branch-light so the element-wise kernels (casts, optimizer write-back)
// can call them in vectorizable loops. They do not depend on the FPU rounding mode except that the f16
// subnormal path relies on the default round-to-nearest-even and no flush-to-zero (zero never sets either).
//
// Pure functions of their arguments: thread-safe, and without errors (every bit pattern has a defined result).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "zero/status.h"

namespace zero {

enum class DType : uint8_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
};

// Bytes per element: 4 for f32, 2 for f16 and bf16.
constexpr size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }

// "f32", "f16", "bf16".
std::string_view DTypeName(DType t);

// Accepts our names and the spellings DeepSpeed configs use ("fp32", "float32", "fp16", "float16", "half",
// "bf16", "bfloat16"); kInvalidArgument otherwise.
StatusOr<DType> ParseDType(std::string_view name);

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// f32 -> bf16, round to nearest even. NaN keeps its sign and becomes a quiet NaN; overflow gives inf.
inline uint16_t F32ToBF16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float BF16ToF32(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// f32 -> IEEE binary16, round to nearest even, including into and out of the subnormal range.
inline uint16_t F32ToF16(float f) {
  uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) {  // inf stays inf; NaN stays (quiet) NaN with its top payload bits
    return static_cast<uint16_t>(sign | 0x7C00u | (x > 0x7F800000u ? (0x0200u | ((x >> 13) & 0x3FFu)) : 0u));
  }
  if (x >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (x < 0x38800000u) {
    // Below the smallest normal half (2^-14): adding 0.5 puts the value's half-subnormal ulp (2^-24) at the
    // float's own ulp, so the FPU performs the round-to-nearest-even for us.
    float shifted = BitsToFloat(x) + 0.5f;
    return static_cast<uint16_t>(sign | (FloatBits(shifted) - 0x3F000000u));
  }
  const uint32_t mant_odd = (x >> 13) & 1u;
  x += (static_cast<uint32_t>(15 - 127) << 23) + 0xFFFu + mant_odd;
  return static_cast<uint16_t>(sign | (x >> 13));
}

// IEEE binary16 -> f32, exact.
inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return BitsToFloat(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    // Subnormal (or zero): mant * 2^-24 is exact in f32.
    float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return BitsToFloat(sign | FloatBits(mag));
  }
  return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Loads element i of a buffer of type t as f32.
inline float LoadAsF32(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return BF16ToF32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.f;
}

// Stores f32 value v as element i of a buffer of type t (round to nearest even for 16-bit types).
inline void StoreFromF32(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = F32ToF16(v); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = F32ToBF16(v); break;
  }
}

// Converts n elements between host buffers (any pair of types; same type is a memcpy). The buffers must not
// overlap unless they are identical and the types equal.
void ConvertBuffer(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

}  // namespace zero
