// core/internal/hwy_convert-inl.h — per-target Highway helpers that load f16/bf16/f32 into f32 vectors and
// store f32 vectors back, bit for bit as zero/dtype.h's scalar conversions do.
//
// Used by every Highway translation unit that touches 16-bit data (core/convert_simd.cc,
// mixed_precision/grad_stats.cc, optim/kernels.cc). Include it after "hwy/foreach_target.h":
//
//   #define HWY_TARGET_INCLUDE "my/kernels.cc"
//   #include "hwy/foreach_target.h"
//   #include "hwy/highway.h"
//   #include "core/internal/hwy_convert-inl.h"
//   ...
//   namespace zero::internal::HWY_NAMESPACE { ... }
//   const auto v = zero::internal::HWY_NAMESPACE::LoadAsF32Vec<DType::kBF16>(d, src, i);
//
// Equality with dtype.h (round to nearest even, NaN stays a quiet NaN with its sign and top payload bits,
// subnormals exact, overflow to inf) is tested on every 16-bit pattern and every rounding boundary by
// tests/core/convert_simd_test.cc, on every target this CPU runs. Hardware conversions are used where they
// match dtype.h: F16C's vcvtps2ph for f32 -> f16 (immediate rounding 0: nearest even, independent of MXCSR; NaN
// quieting as dtype.h), and F16C's vcvtph2ps for f16 -> f32 with one fix-up (it quiets signalling NaNs; dtype.h
// keeps the payload as is). Not used: Highway 1.0.3's software f32 -> f16 DemoteTo (targets without F16C)
// truncates instead of rounding, and AVX512-BF16's vcvtneps2bf16 flushes subnormals.
//
// Not a normal header: Highway's per-target include guard below lets foreach_target.h compile it once per
// target, each time into that target's namespace.

#include <cstddef>
#include <cstdint>

#include "zero/dtype.h"

// Per-target include guard (Highway's idiom: toggled by every foreach_target.h pass).
#if defined(ZERO_CORE_INTERNAL_HWY_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ZERO_CORE_INTERNAL_HWY_CONVERT_INL_H_
#undef ZERO_CORE_INTERNAL_HWY_CONVERT_INL_H_
#else
#define ZERO_CORE_INTERNAL_HWY_CONVERT_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace zero {
namespace internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// bf16 -> f32: the bf16 bits are the f32's upper half (exact, NaN payloads kept).
template <class DF>
HWY_INLINE hn::Vec<DF> LoadBF16(DF df, const uint16_t* p) {
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> d16;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
}

// f16 -> f32, exact; a NaN keeps its payload unchanged (a signalling NaN stays signalling, as in dtype.h).
// Without F16C: integer rebiasing, subnormals through an exact int -> float conversion.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadF16(DF df, const uint16_t* p) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
  // F16C's vcvtph2ps, then undo its one difference from dtype.h: it sets the quiet bit (f32 bit 22, which is
  // f16 mantissa bit 9 moved up) of a signalling NaN, i.e. of |h| in (0x7C00, 0x7E00).
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> d16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto hw = hn::BitCast(du, hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p))));
  const auto mag = hn::BitCast(di, hn::And(hn::PromoteTo(du, hn::LoadU(d16, p)), hn::Set(du, 0x7FFFu)));
  const auto snan = hn::And(mag > hn::Set(di, 0x7C00), hn::Set(di, 0x7E00) > mag);
  return hn::BitCast(df, hn::Xor(hw, hn::IfThenElseZero(hn::RebindMask(du, snan), hn::Set(du, 0x00400000u))));
#else
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> d16;
  const auto h = hn::PromoteTo(du, hn::LoadU(d16, p));
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const auto exp = hn::And(hn::ShiftRight<10>(h), hn::Set(du, 0x1Fu));
  const auto mant = hn::And(h, hn::Set(du, 0x3FFu));
  const auto mant13 = hn::ShiftLeft<13>(mant);
  const auto normal = hn::Or(hn::ShiftLeft<23>(hn::Add(exp, hn::Set(du, 112u))), mant13);
  const auto inf_nan = hn::Or(hn::Set(du, 0x7F800000u), mant13);
  // Subnormal or zero: mant * 2^-24 is exact in f32.
  const auto sub =
      hn::BitCast(du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, mant)), hn::Set(df, 5.9604644775390625e-8f)));
  auto mag = hn::IfThenElse(exp == hn::Set(du, 0x1Fu), inf_nan, normal);
  mag = hn::IfThenElse(exp == hn::Zero(du), sub, mag);
  return hn::BitCast(df, hn::Or(sign, mag));
#endif
}

// f16 -> f32 for readers that need only each element's value, not NaN payloads (GradStats): on F16C targets
// vcvtph2ps alone, which is exact for every non-NaN input and gives a NaN for every NaN, but quiets signalling
// ones; LoadF16's fix-up for that costs GradStats about 30% in cache. Nothing it returns may be stored.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadF16Value(DF df, const uint16_t* p) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#else
  return LoadF16(df, p);
#endif
}

// Narrows 32-bit lanes holding values <= 0xFFFF to u16 and stores them.
template <class DF, class VU>
HWY_INLINE void StoreLow16(DF, VU h, uint16_t* p) {
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> d16;
  hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, h)), d16, p);
}

// f32 -> bf16, round to nearest even; NaN -> quiet NaN with its sign and top payload bits.
template <class DF>
HWY_INLINE void StoreBF16(DF df, hn::Vec<DF> f, uint16_t* p) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto bits = hn::BitCast(du, f);
  const auto mag = hn::BitCast(di, hn::And(bits, hn::Set(du, 0x7FFFFFFFu)));  // >= 0: signed compares are exact
  const auto is_nan = hn::RebindMask(du, mag > hn::Set(di, 0x7F800000));
  const auto rounded = hn::ShiftRight<16>(
      hn::Add(hn::Add(bits, hn::Set(du, 0x7FFFu)), hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u))));
  const auto quiet_nan = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x40u));
  StoreLow16(df, hn::IfThenElse(is_nan, quiet_nan, rounded), p);
}

// f32 -> f16, round to nearest even into and out of the subnormal range, >= 65520 to inf, NaN -> quiet NaN.
template <class DF>
HWY_INLINE void StoreF16(DF df, hn::Vec<DF> f, uint16_t* p) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
  // F16C (every AVX2 and AVX-512 CPU): vcvtps2ph with immediate rounding = nearest even, as dtype.h.
  const hn::Rebind<hwy::float16_t, DF> dh;
  hn::StoreU(hn::DemoteTo(dh, f), dh, reinterpret_cast<hwy::float16_t*>(p));
#else
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto bits = hn::BitCast(du, f);
  const auto sign = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 0x8000u));
  const auto x = hn::And(bits, hn::Set(du, 0x7FFFFFFFu));
  const auto xi = hn::BitCast(di, x);  // >= 0: signed compares are exact
  // Normal half: rebias the exponent and round to nearest even at bit 13 (x + (15-127)<<23 + 0xFFF + odd).
  const auto odd = hn::And(hn::ShiftRight<13>(x), hn::Set(du, 1u));
  const auto normal = hn::ShiftRight<13>(hn::Add(hn::Add(x, hn::Set(du, 0xC8000FFFu)), odd));
  // Below 2^-14: adding 0.5f makes the FPU round at the half-subnormal ulp (as dtype.h does).
  const auto sub = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, x), hn::Set(df, 0.5f))), hn::Set(du, 0x3F000000u));
  const auto nan_bits = hn::Or(hn::Set(du, 0x0200u), hn::And(hn::ShiftRight<13>(x), hn::Set(du, 0x3FFu)));
  const auto inf_nan =
      hn::Or(hn::Set(du, 0x7C00u), hn::IfThenElseZero(hn::RebindMask(du, xi > hn::Set(di, 0x7F800000)), nan_bits));
  auto mag = hn::IfThenElse(hn::RebindMask(du, xi < hn::Set(di, 0x38800000)), sub, normal);
  mag = hn::IfThenElse(hn::RebindMask(du, xi > hn::Set(di, 0x477FEFFF)), hn::Set(du, 0x7C00u), mag);  // >= 65520
  mag = hn::IfThenElse(hn::RebindMask(du, xi > hn::Set(di, 0x7F7FFFFF)), inf_nan, mag);               // inf, NaN
  StoreLow16(df, hn::Or(sign, mag), p);
#endif
}

// Elements [i, i + Lanes(d)) of a buffer of type kT, as f32. The dtype is a template argument so the callers'
// loops contain no dtype branch.
template <DType kT, class DF>
HWY_INLINE hn::Vec<DF> LoadAsF32Vec(DF df, const void* p, size_t i) {
  if constexpr (kT == DType::kF32) {
    return hn::LoadU(df, static_cast<const float*>(p) + i);
  } else if constexpr (kT == DType::kBF16) {
    return LoadBF16(df, static_cast<const uint16_t*>(p) + i);
  } else {
    return LoadF16(df, static_cast<const uint16_t*>(p) + i);
  }
}

// Stores v as elements [i, i + Lanes(d)) of a buffer of type kT.
template <DType kT, class DF>
HWY_INLINE void StoreF32VecAs(DF df, hn::Vec<DF> v, void* p, size_t i) {
  if constexpr (kT == DType::kF32) {
    hn::StoreU(v, df, static_cast<float*>(p) + i);
  } else if constexpr (kT == DType::kBF16) {
    StoreBF16(df, v, static_cast<uint16_t*>(p) + i);
  } else {
    StoreF16(df, v, static_cast<uint16_t*>(p) + i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace internal
}  // namespace zero
HWY_AFTER_NAMESPACE();

#endif  // ZERO_CORE_INTERNAL_HWY_CONVERT_INL_H_
