// mixed_precision/grad_stats.cc — zero::GradStats: overflow count and sum of squares of a gradient shard in one
// read-only pass (see zero/mixed_precision.h for the contract).
//
// Highway compiles this file once per target (foreach_target.h re-includes it); HWY_DYNAMIC_DISPATCH picks the
// best the CPU supports. The summation order is the same on every target, so the result is too:
//   * element i goes to partial sum (slot) i mod kSlots, in index order;
//   * a target with L f32 lanes reads kSlots elements as kSlots / L f32 vectors and widens each to two double
//     vectors (lower and upper half), so it keeps 2 * kSlots / L double accumulators whose lane j of
//     accumulator a is slot a * L / 2 + j: AVX-512 4 x 8 doubles, AVX2 8 x 4, SSE4 16 x 2 (the SCALAR fallback
//     runs a scalar loop over the same slots);
//   * the tail (fewer than kSlots elements) is added to the same slots by scalar code, then the slots are
//     summed in a fixed pairwise tree.
// The squares are exact in double (24-bit significands, exponents far from double's limits), so a fused
// multiply-add and a multiply-then-add give the same sum: targets with and without FMA agree too.
// 32 slots leave each AVX2/AVX-512 accumulator chain enough independent work to hide the add latency.

#include <cstddef>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "mixed_precision/grad_stats.cc"
// The same target set as core/convert_simd.cc and optim/kernels.cc (ForceSimdTargetForTest relies on it).
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// defines: the per-target ops (must follow foreach_target.h)
#include "core/internal/convert_simd.h"
#include "core/internal/hwy_convert-inl.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "zero/dtype.h"
#include "zero/mixed_precision.h"

#ifndef ZERO_MIXED_PRECISION_GRAD_STATS_SHARED_
#define ZERO_MIXED_PRECISION_GRAD_STATS_SHARED_
namespace zero::internal {

constexpr size_t kSlots = 32;

// The non-finite test on f32 bits: |x| above the largest finite value.
inline bool NonFiniteBits(uint32_t bits) { return (bits & 0x7FFFFFFFu) > 0x7F7FFFFFu; }

// Elements [i, n) in scalar code, into the same slots as the vector loop (i must be a multiple of kSlots
// where the vector loop stopped, or 0).
inline void GradStatsScalar(const void* g, DType t, size_t i, size_t n, double* slots, uint64_t* nonfinite) {
  for (; i < n; ++i) {
    const float x = LoadAsF32(g, t, i);
    *nonfinite += NonFiniteBits(FloatBits(x)) ? 1 : 0;
    const double d = x;
    slots[i % kSlots] += d * d;
  }
}

inline GradStatsResult FinishSlots(double* slots, uint64_t nonfinite) {
  for (size_t w = kSlots / 2; w > 0; w /= 2) {
    for (size_t j = 0; j < w; ++j) slots[j] += slots[j + w];
  }
  return {slots[0], nonfinite};
}

}  // namespace zero::internal
#endif  // ZERO_MIXED_PRECISION_GRAD_STATS_SHARED_

HWY_BEFORE_NAMESPACE();
namespace zero {
namespace internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_HAVE_SCALABLE || HWY_TARGET == HWY_SCALAR
// Scalable vectors cannot live in arrays and one-lane vectors have no halves: these targets (none of them x86)
// run the scalar loop, which adds in the same order.
template <DType kT>
HWY_NOINLINE GradStatsResult GradStatsLoop(const void* g, size_t n) {
  double slots[kSlots] = {};
  uint64_t nonfinite = 0;
  GradStatsScalar(g, kT, 0, n, slots, &nonfinite);
  return FinishSlots(slots, nonfinite);
}
#else
// Elements [i, i + Lanes(df)) as f32 values. f16 skips LoadF16's signalling-NaN fix-up: a NaN's payload never
// reaches the result (any NaN makes the sum NaN and counts once).
template <DType kT, class DF>
HWY_INLINE hn::Vec<DF> LoadValues(DF df, const void* g, size_t i) {
  if constexpr (kT == DType::kF16) return LoadF16Value(df, static_cast<const uint16_t*>(g) + i);
  return LoadAsF32Vec<kT>(df, g, i);
}

template <DType kT>
HWY_NOINLINE GradStatsResult GradStatsLoop(const void* g, size_t n) {
  const hn::CappedTag<float, kSlots> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Half<decltype(df)> dfh;
  const hn::Rebind<double, decltype(dfh)> dd;
  constexpr size_t kLanes = hn::MaxLanes(df);
  constexpr size_t kVecs = kSlots / kLanes;  // f32 vectors per block of kSlots elements
  static_assert(kVecs * kLanes == kSlots, "lane count must divide the slot count");
  hn::Vec<decltype(dd)> acc[2 * kVecs];
  for (auto& a : acc) a = hn::Zero(dd);
  // Per-lane u32 counts are folded into the u64 total every kChunk elements, long before they could wrap.
  constexpr size_t kChunk = size_t{1} << 24;
  // Software prefetch 4 KiB ahead: the hardware prefetchers stop at each 4 KiB page, and this loop issues enough
  // work per cache line that it otherwise leaves DRAM idle between pages. Measured (zero-bench-host-kernels, one
  // thread, 512 MiB of f32): 6.6 GB/s without, 8.8 with, against 9.0 for a plain read-only pass; 2 KiB ahead
  // gave 7.8. Clamped to the element being read, so no address past the shard is formed.
  constexpr size_t kPrefetchElems = 4096 / DTypeSize(kT);
  const auto abs_mask = hn::Set(du, 0x7FFFFFFFu);
  const auto max_finite = hn::Set(di, 0x7F7FFFFF);
  uint64_t nonfinite = 0;
  size_t i = 0;
  const size_t body_end = n - n % kSlots;
  while (i < body_end) {
    const size_t chunk_end = body_end - i > kChunk ? i + kChunk : body_end;
    auto count = hn::Zero(du);
    for (; i < chunk_end; i += kSlots) {
      const size_t ahead_i = i + kPrefetchElems + kSlots <= n ? i + kPrefetchElems : i;
      const char* ahead = static_cast<const char*>(g) + ahead_i * DTypeSize(kT);
      for (size_t off = 0; off < kSlots * DTypeSize(kT); off += 64) hwy::Prefetch(ahead + off);
      for (size_t k = 0; k < kVecs; ++k) {
        const auto v = LoadValues<kT>(df, g, i + k * kLanes);
        // |x| > largest finite, as signed integers (|x| has its sign bit clear): true lanes are all-ones, -1.
        const auto bad = hn::BitCast(di, hn::And(hn::BitCast(du, v), abs_mask)) > max_finite;
        count = hn::Sub(count, hn::BitCast(du, hn::VecFromMask(di, bad)));
        const auto lo = hn::PromoteTo(dd, hn::LowerHalf(dfh, v));
        const auto hi = hn::PromoteTo(dd, hn::UpperHalf(dfh, v));
        acc[2 * k] = hn::MulAdd(lo, lo, acc[2 * k]);
        acc[2 * k + 1] = hn::MulAdd(hi, hi, acc[2 * k + 1]);
      }
    }
    nonfinite += hn::GetLane(hn::SumOfLanes(du, count));
  }
  double slots[kSlots];
  for (size_t a = 0; a < 2 * kVecs; ++a) hn::StoreU(acc[a], dd, slots + a * hn::Lanes(dd));
  GradStatsScalar(g, kT, i, n, slots, &nonfinite);
  return FinishSlots(slots, nonfinite);
}
#endif

GradStatsResult GradStatsImpl(const void* g, DType t, size_t n) {
  switch (t) {
    case DType::kF32: return GradStatsLoop<DType::kF32>(g, n);
    case DType::kF16: return GradStatsLoop<DType::kF16>(g, n);
    case DType::kBF16: return GradStatsLoop<DType::kBF16>(g, n);
  }
  return {};
}

}  // namespace HWY_NAMESPACE
}  // namespace internal
}  // namespace zero
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace zero {

namespace internal {
HWY_EXPORT(GradStatsImpl);
// HWY_DYNAMIC_DISPATCH pastes tokens onto the name, so it must be called unqualified, from this namespace.
static GradStatsResult DispatchGradStats(const void* g, DType t, size_t n) {
  return HWY_DYNAMIC_DISPATCH(GradStatsImpl)(g, t, n);
}
}  // namespace internal

GradStatsResult GradStats(const void* g, DType t, size_t n) {
  if (n == 0) return {};
  internal::ApplySimdTargetFromEnv();  // ZERO_SIMD_TARGET, before the process's first dispatch
  return internal::DispatchGradStats(g, t, n);
}

}  // namespace zero
#endif  // HWY_ONCE
