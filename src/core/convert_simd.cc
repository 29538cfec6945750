// core/convert_simd.cc — vectorized f32 <-> f16/bf16 casts (see internal/convert_simd.h), bit-identical to the
// scalar conversions in zero/dtype.h on every target.
//
// Highway compiles this file once per target (foreach_target.h re-includes it) and HWY_DYNAMIC_DISPATCH picks
// the best the CPU supports at the first call. The per-element work is in core/internal/hwy_convert-inl.h,
// shared with the optimizer kernels and GradStats; this file only has the loops. The tail (n not a multiple of
// the vector length) runs the same code on one-lane vectors, so it rounds exactly as the body does.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/convert_simd.cc"
// The same target set as optim/kernels.cc and mixed_precision/grad_stats.cc (ForceSimdTargetForTest relies on
// it). SSSE3 would only duplicate SSE4; machines without SSE4 run the SCALAR fallback.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// defines: the per-target ops (must follow foreach_target.h)
#include "core/internal/convert_simd.h"
#include "core/internal/hwy_convert-inl.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace zero {
namespace internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <DType kS, DType kD>
HWY_NOINLINE void ConvertLoop(const void* src, void* dst, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  // Software prefetch of the source 4 KiB ahead (as GradStats): the hardware prefetchers stop at each page. One
  // thread, 128 Mi elements: f32 -> bf16 9.1-9.4 -> 10.7-11.8 GB/s (read + write bytes), f32 -> f16 10.5-10.8
  // -> 11.5-11.6; the 16-bit -> f32 casts, bound by their 4-byte stores, did not change. Clamped to the element
  // being read, so no address past the buffer is formed.
  constexpr size_t kAhead = 4096 / DTypeSize(kS);
  // Two vectors per iteration: the loads of the second overlap the first's conversion on the 16-bit paths.
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    const size_t ahead_i = i + kAhead + 2 * lanes <= n ? i + kAhead : i;
    const char* ahead = static_cast<const char*>(src) + ahead_i * DTypeSize(kS);
    for (size_t off = 0; off < 2 * lanes * DTypeSize(kS); off += 64) hwy::Prefetch(ahead + off);
    const auto a = LoadAsF32Vec<kS>(d, src, i);
    const auto b = LoadAsF32Vec<kS>(d, src, i + lanes);
    StoreF32VecAs<kD>(d, a, dst, i);
    StoreF32VecAs<kD>(d, b, dst, i + lanes);
  }
  for (; i + lanes <= n; i += lanes) StoreF32VecAs<kD>(d, LoadAsF32Vec<kS>(d, src, i), dst, i);
  const hn::CappedTag<float, 1> d1;
  for (; i < n; ++i) StoreF32VecAs<kD>(d1, LoadAsF32Vec<kS>(d1, src, i), dst, i);
}

template <DType kS>
HWY_INLINE void ConvertTo(const void* src, void* dst, DType dt, size_t n) {
  switch (dt) {
    case DType::kF32: return ConvertLoop<kS, DType::kF32>(src, dst, n);
    case DType::kF16: return ConvertLoop<kS, DType::kF16>(src, dst, n);
    case DType::kBF16: return ConvertLoop<kS, DType::kBF16>(src, dst, n);
  }
}

// Same-type pairs never reach here (ConvertBuffer memcpys them); they would still be correct (a copy through
// f32 is exact for every type, NaN payloads included, since f32 -> f32 is a plain load and store).
void ConvertSimdImpl(const void* src, DType st, void* dst, DType dt, size_t n) {
  switch (st) {
    case DType::kF32: return ConvertTo<DType::kF32>(src, dst, dt, n);
    case DType::kF16: return ConvertTo<DType::kF16>(src, dst, dt, n);
    case DType::kBF16: return ConvertTo<DType::kBF16>(src, dst, dt, n);
  }
}

const char* SimdTargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace internal
}  // namespace zero
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace zero::internal {

HWY_EXPORT(ConvertSimdImpl);
HWY_EXPORT(SimdTargetNameImpl);

void ConvertSimd(const void* src, DType st, void* dst, DType dt, size_t n) {
  HWY_DYNAMIC_DISPATCH(ConvertSimdImpl)(src, st, dst, dt, n);
}

std::vector<SimdTarget> AvailableSimdTargets() {
  std::vector<SimdTarget> out;
  for (int64_t bits : hwy::SupportedAndGeneratedTargets()) out.push_back({bits, hwy::TargetName(bits)});
  return out;
}

std::string ActiveSimdTarget() { return HWY_DYNAMIC_DISPATCH(SimdTargetNameImpl)(); }

void ForceSimdTargetForTest(int64_t bits) {
  hwy::SetSupportedTargetsForTest(bits);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

}  // namespace zero::internal
#endif  // HWY_ONCE
