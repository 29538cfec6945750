// core/quantize.cc — blockwise int8 quantization (core/internal/quantize.h).
//
// Highway compiles this file once per target (foreach_target.h re-includes it); HWY_DYNAMIC_DISPATCH picks the
// best the CPU supports. Per block, two passes: the integer maximum of |x|'s bits (one vector accumulator), then
// x · (127 / max) rounded to the nearest even integer (cvtps2dq under the default MXCSR, as std::nearbyint in the
// scalar reference) and narrowed to int8. The second pass reads the block from cache: a block is at most a few
// tens of KiB, so each element comes from memory once.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/quantize.cc"
// The same target set as core/convert_simd.cc (ForceSimdTargetForTest relies on it).
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// defines: the per-target ops (must follow foreach_target.h)
#include "core/internal/convert_simd.h"
#include "core/internal/hwy_convert-inl.h"
#include "core/internal/quantize.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "zero/dtype.h"

#ifndef ZERO_CORE_QUANTIZE_SHARED_
#define ZERO_CORE_QUANTIZE_SHARED_
namespace zero::internal {

constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kMinNormalBits = 0x00800000u;  // FLT_MIN
constexpr uint32_t kMaxFiniteBits = 0x7F7FFFFFu;  // FLT_MAX

// A block's scale (written out) and the factor its elements are multiplied by (0: the block quantizes to zeros),
// from the largest |x| bits of the block. For finite non-negative floats the bit patterns order as the values, and
// every NaN or infinity is above FLT_MAX's pattern.
struct BlockScale {
  float scale;
  float inv;
};
inline BlockScale ScaleOfBits(uint32_t max_bits) {
  if (max_bits > kMaxFiniteBits) return {std::numeric_limits<float>::quiet_NaN(), 0.0f};
  if (max_bits < kMinNormalBits) return {0.0f, 0.0f};
  const float m = BitsToFloat(max_bits);
  return {m / 127.0f, 127.0f / m};
}

inline int8_t QuantizeOne(float x, float inv) {
  if (inv == 0.0f) return 0;
  const float r = std::nearbyint(x * inv);  // |x · inv| <= 127 rounds to at most 127
  return static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
}

}  // namespace zero::internal
#endif  // ZERO_CORE_QUANTIZE_SHARED_

HWY_BEFORE_NAMESPACE();
namespace zero {
namespace internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_SCALAR
// One-lane vectors: the scalar reference is this target's loop.
void QuantizeImpl(const void* x, DType t, size_t n, size_t block, int8_t* q, float* scales) {
  QuantizeInt8Scalar(x, t, n, block, q, scales);
}
void DequantizeImpl(const int8_t* q, const float* scales, size_t n, size_t block, void* out, DType t) {
  DequantizeInt8Scalar(q, scales, n, block, out, t);
}
#else
// The largest |x| of elements [begin, end), as f32 bits. 16-bit types compare their own bits: |x|'s bit patterns
// order as the values in f16 and bf16 too (NaN and infinity above every finite one), and the conversion to f32 is
// exact and keeps that order, so converting only the largest gives the f32 maximum the scalar reference finds.
template <DType kT>
HWY_INLINE uint32_t MaxAbsBits(const void* x, size_t begin, size_t end) {
  if constexpr (kT == DType::kF32) {
    const hn::ScalableTag<uint32_t> du;
    const size_t L = hn::Lanes(du);
    const auto* p = static_cast<const uint32_t*>(x);
    const auto abs_mask = hn::Set(du, kAbsMask);
    auto vmax = hn::Zero(du);
    size_t i = begin;
    for (; i + L <= end; i += L) vmax = hn::Max(vmax, hn::And(hn::LoadU(du, p + i), abs_mask));
    uint32_t m = hn::GetLane(hn::MaxOfLanes(du, vmax));
    for (; i < end; ++i) m = std::max(m, p[i] & kAbsMask);
    return m;
  } else {
    const hn::ScalableTag<uint16_t> du;
    const size_t L = hn::Lanes(du);
    const auto* p = static_cast<const uint16_t*>(x);
    const auto abs_mask = hn::Set(du, uint16_t{0x7FFF});
    auto vmax = hn::Zero(du);
    size_t i = begin;
    for (; i + L <= end; i += L) vmax = hn::Max(vmax, hn::And(hn::LoadU(du, p + i), abs_mask));
    uint16_t m = hn::GetLane(hn::MaxOfLanes(du, vmax));
    for (; i < end; ++i) m = std::max<uint16_t>(m, p[i] & 0x7FFF);
    return FloatBits(LoadAsF32(&m, kT, 0));
  }
}

// Dequantized outputs of at least this many bytes are written with non-temporal stores (where aligned): they cannot
// stay in cache anyway, and an ordinary store first reads each line it writes (a read-for-ownership), for f32 half
// as much traffic again (measured: 0.40 -> 0.95 of memcpy). Smaller outputs stay in cache for whoever reads them
// next (the forward reads the gathered parameters at once). Quantize's codes are stored as usual: streaming them,
// four vectors at a time through a stack buffer, measured slower (0.45-0.50 against 0.57 of memcpy).
constexpr size_t kStreamBytes = size_t{4} << 20;

template <DType kT>
HWY_NOINLINE void QuantizeLoop(const void* x, size_t n, size_t block, int8_t* q, float* scales) {
  constexpr size_t kElemBytes = kT == DType::kF32 ? 4 : 2;
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const size_t L = hn::Lanes(df);
  for (size_t b = 0, begin = 0; begin < n; ++b, begin += block) {
    const size_t end = std::min(n, begin + block);
    const BlockScale s = ScaleOfBits(MaxAbsBits<kT>(x, begin, end));
    size_t i;
    scales[b] = s.scale;
    if (s.inv == 0.0f) {
      std::fill(q + begin, q + end, int8_t{0});
      continue;
    }
    const auto inv = hn::Set(df, s.inv);
    const auto lo = hn::Set(di, -127), hi = hn::Set(di, 127);
    // This pass reads the block from L1, leaving the memory idle; the next block's maximum pass reads memory, with
    // the core idle. Prefetching the next block (into L2) during this pass overlaps the two, and the next maximum
    // pass reads from cache: a line of the next block for each line of this one done.
    const char* next = static_cast<const char*>(x) + end * kElemBytes;
    const size_t next_bytes = std::min(n - end, block) * kElemBytes;
    size_t line = 0;
    for (i = begin; i + L <= end; i += L) {
      for (; line < next_bytes && line <= (i - begin) * kElemBytes; line += 64) __builtin_prefetch(next + line, 0, 2);
      const auto r = hn::NearestInt(hn::Mul(LoadAsF32Vec<kT>(df, x, i), inv));
      hn::StoreU(hn::DemoteTo(d8, hn::Min(hn::Max(r, lo), hi)), d8, q + i);
    }
    for (; i < end; ++i) q[i] = QuantizeOne(LoadAsF32(x, kT, i), s.inv);
  }
}

template <DType kT>
HWY_NOINLINE void DequantizeLoop(const int8_t* q, const float* scales, size_t n, size_t block, void* out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const size_t L = hn::Lanes(df);
  // f32 out only: its values are whole vectors. 16-bit outputs are half vectors; streaming them through a stack
  // buffer measured slower (bf16: 0.30 against 0.46 of memcpy), so they are stored as usual.
  const bool stream = kT == DType::kF32 && n * 4 >= kStreamBytes;
  for (size_t b = 0, begin = 0; begin < n; ++b, begin += block) {
    const size_t end = std::min(n, begin + block);
    const float scale = scales[b];
    const auto vs = hn::Set(df, scale);
    auto values = [&](size_t k) { return hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, q + k))), vs); };
    size_t i = begin;
    if constexpr (kT == DType::kF32) {
      if (stream) {
        // One at a time up to the first element on a vector boundary, then whole vectors streamed.
        float* const o = static_cast<float*>(out);
        for (; i < end && reinterpret_cast<uintptr_t>(o + i) % (L * 4) != 0; ++i)
          o[i] = static_cast<float>(q[i]) * scale;
        if (reinterpret_cast<uintptr_t>(o + i) % (L * 4) == 0) {
          for (; i + L <= end; i += L) hn::Stream(values(i), df, o + i);
        }
      }
    }
    for (; i + L <= end; i += L) StoreF32VecAs<kT>(df, values(i), out, i);
    for (; i < end; ++i) StoreFromF32(out, kT, i, static_cast<float>(q[i]) * scale);
  }
  if (stream) hwy::FlushStream();  // the values are visible before the caller (or another thread) reads them
}

void QuantizeImpl(const void* x, DType t, size_t n, size_t block, int8_t* q, float* scales) {
  switch (t) {
    case DType::kF32: return QuantizeLoop<DType::kF32>(x, n, block, q, scales);
    case DType::kF16: return QuantizeLoop<DType::kF16>(x, n, block, q, scales);
    case DType::kBF16: return QuantizeLoop<DType::kBF16>(x, n, block, q, scales);
  }
}
void DequantizeImpl(const int8_t* q, const float* scales, size_t n, size_t block, void* out, DType t) {
  switch (t) {
    case DType::kF32: return DequantizeLoop<DType::kF32>(q, scales, n, block, out);
    case DType::kF16: return DequantizeLoop<DType::kF16>(q, scales, n, block, out);
    case DType::kBF16: return DequantizeLoop<DType::kBF16>(q, scales, n, block, out);
  }
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace internal
}  // namespace zero
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace zero::internal {

HWY_EXPORT(QuantizeImpl);
HWY_EXPORT(DequantizeImpl);

void QuantizeInt8Scalar(const void* x, DType t, size_t n, size_t block, int8_t* q, float* scales) {
  for (size_t b = 0, begin = 0; begin < n; ++b, begin += block) {
    const size_t end = std::min(n, begin + block);
    uint32_t max_bits = 0;
    for (size_t i = begin; i < end; ++i) max_bits = std::max(max_bits, FloatBits(LoadAsF32(x, t, i)) & kAbsMask);
    const BlockScale s = ScaleOfBits(max_bits);
    scales[b] = s.scale;
    for (size_t i = begin; i < end; ++i) q[i] = QuantizeOne(LoadAsF32(x, t, i), s.inv);
  }
}

void DequantizeInt8Scalar(const int8_t* q, const float* scales, size_t n, size_t block, void* out, DType t) {
  for (size_t i = 0; i < n; ++i) StoreFromF32(out, t, i, static_cast<float>(q[i]) * scales[i / block]);
}

void QuantizeInt8(const void* x, DType t, size_t n, size_t block, int8_t* q, float* scales) {
  if (n == 0) return;
  ApplySimdTargetFromEnv();  // ZERO_SIMD_TARGET, before the process's first dispatch
  HWY_DYNAMIC_DISPATCH(QuantizeImpl)(x, t, n, block, q, scales);
}

void DequantizeInt8(const int8_t* q, const float* scales, size_t n, size_t block, void* out, DType t) {
  if (n == 0) return;
  ApplySimdTargetFromEnv();
  HWY_DYNAMIC_DISPATCH(DequantizeImpl)(q, scales, n, block, out, t);
}

}  // namespace zero::internal
#endif  // HWY_ONCE
