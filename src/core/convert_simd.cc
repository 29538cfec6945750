// core/convert_simd.cc — vectorized f32 <-> f16/bf16 casts (see internal/convert_simd.h), bit-identical to the
// scalar conversions in zero/dtype.h on every target.
//
// Highway compiles this file once per target (foreach_target.h re-includes it) and HWY_DYNAMIC_DISPATCH picks
// the best the CPU supports at the first call. The per-element work is in core/internal/hwy_convert-inl.h,
// shared with the optimizer kernels and GradStats; this file only has the loops. The tail (n not a multiple of
// the vector length) runs the same code on one-lane vectors, so it rounds exactly as the body does.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/internal/convert_simd.h"
#include "core/internal/hwy_convert-inl.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "zero/logging.h"
#include "zero/status.h"

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

// A copy whose stores bypass the cache (see CopyStreaming in internal/convert_simd.h): memcpy up to the first
// vector-aligned destination byte, whole vectors streamed, memcpy for the rest, then a fence so the bytes are
// visible to other threads (and to a device reading the memory) once this returns.
void CopyStreamingImpl(void* dst, const void* src, size_t bytes) {
#if HWY_TARGET == HWY_SCALAR
  std::memcpy(dst, src, bytes);
#else
  const hn::ScalableTag<uint8_t> d;
  const size_t L = hn::Lanes(d);
  auto* o = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
  const size_t head = std::min(bytes, (L - reinterpret_cast<uintptr_t>(o) % L) % L);
  std::memcpy(o, in, head);
  size_t i = head;
  for (; i + 4 * L <= bytes; i += 4 * L) {
    const auto a = hn::LoadU(d, in + i), b = hn::LoadU(d, in + i + L);
    const auto c = hn::LoadU(d, in + i + 2 * L), e = hn::LoadU(d, in + i + 3 * L);
    hn::Stream(a, d, o + i);
    hn::Stream(b, d, o + i + L);
    hn::Stream(c, d, o + i + 2 * L);
    hn::Stream(e, d, o + i + 3 * L);
  }
  for (; i + L <= bytes; i += L) hn::Stream(hn::LoadU(d, in + i), d, o + i);
  std::memcpy(o + i, in + i, bytes - i);
  hwy::FlushStream();
#endif
}

const char* SimdTargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace internal
}  // namespace zero
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace zero::internal {

HWY_EXPORT(ConvertSimdImpl);
HWY_EXPORT(CopyStreamingImpl);
HWY_EXPORT(SimdTargetNameImpl);

namespace {

// hwy::SupportedTargets() without the side effect Highway 1.0.3 gives it: when no test mock is set, it points
// dispatch at every target it detects (ignoring DisableTargets) before it returns the allowed ones, so dispatch
// would run AVX3 under ZERO_SIMD_TARGET=AVX2 after any call. Pointing dispatch at what it returns undoes that.
int64_t SupportedTargets() {
  const int64_t supported = hwy::SupportedTargets();
  hwy::GetChosenTarget().Update(supported);
  return supported;
}

std::vector<SimdTarget> TargetsOf(int64_t supported) {
  std::vector<SimdTarget> out;
  // Lower bits are better targets (Highway's order), so this lists best first.
  for (int64_t t = supported & HWY_TARGETS; t != 0; t &= t - 1) {
    const int64_t bit = t & ~(t - 1);
    out.push_back({bit, hwy::TargetName(bit)});
  }
  return out;
}

std::string Names(const std::vector<SimdTarget>& targets) {
  std::string s;
  for (const SimdTarget& t : targets) absl::StrAppend(&s, s.empty() ? "" : ", ", t.name);
  return s;
}

struct ProcessTargets {
  std::vector<SimdTarget> cpu;  // compiled in and runnable here, before any restriction
  int64_t env_bits = 0;         // ZERO_SIMD_TARGET's target; 0 when unset
  absl::Status env;             // ZERO_SIMD_TARGET's error, if its value names no target offered here
};

ProcessTargets Choose() {
  ProcessTargets p;
  // Nothing has restricted Highway yet: every path to a dispatch, and ForceSimdTargetForTest, comes here first.
  p.cpu = TargetsOf(SupportedTargets());
  const char* v = std::getenv("ZERO_SIMD_TARGET");
  if (v != nullptr && *v != '\0') {
    absl::StatusOr<SimdTarget> t = SimdTargetFromName(v, p.cpu);
    if (!t.ok()) {
      // Kept for SimdTargetEnvStatus (Engine::Create returns it); a kernel dispatched anyway stops the process.
      p.env = absl::InvalidArgumentError(absl::StrCat("ZERO_SIMD_TARGET=", t.status().message()));
      return p;
    }
    p.env_bits = t->bits;
    // DisableTargets, not the test mock: ForceSimdTargetForTest's SetSupportedTargetsForTest then composes with
    // it (Highway intersects the two), and its reset (0) keeps this restriction.
    hwy::DisableTargets(~p.env_bits);
    SupportedTargets();  // DisableTargets alone leaves the choice SupportedTargets() made above in place
  }
  ZERO_LOG(DEBUG) << "SIMD target of the host kernels: "
                  << (p.env_bits != 0 ? absl::StrCat(hwy::TargetName(p.env_bits), " (ZERO_SIMD_TARGET)")
                                      : absl::StrCat(p.cpu.empty() ? "?" : p.cpu.front().name,
                                                     " (the best this CPU offers; ZERO_SIMD_TARGET unset)"))
                  << "; offered here: " << Names(p.cpu);
  return p;
}

const ProcessTargets& Targets() {
  static const ProcessTargets* const p = new ProcessTargets(Choose());  // never destroyed: kernels may run late
  return *p;
}

}  // namespace

void ApplySimdTargetFromEnv() {
  const ProcessTargets& p = Targets();
  if (!p.env.ok()) {
    // No Status can reach the caller of a kernel; running another target than the one asked for would be a
    // silent wrong answer (docs/internals/design.md, "SIMD targets and tolerances"). Engine::Create and
    // ShardedOptimizer::Create return this error before any kernel runs; this is for kernels used without them.
    std::fprintf(stderr, "zero: %s\n", std::string(p.env.message()).c_str());
    std::fflush(stderr);
    std::abort();
  }
}

absl::Status SimdTargetEnvStatus() { return Targets().env; }

std::vector<SimdTarget> CpuSimdTargets() { return Targets().cpu; }

absl::StatusOr<SimdTarget> SimdTargetFromName(absl::string_view name, const std::vector<SimdTarget>& offered) {
  for (const SimdTarget& t : offered) {
    if (absl::EqualsIgnoreCase(t.name, name)) return t;
  }
  // A Highway name this build or CPU lacks (AVX3 on an AVX2 machine; SSSE3, which the build leaves out) reads
  // differently from a typo.
  bool known = false;
  for (int bit = 0; bit < 63; ++bit) known |= absl::EqualsIgnoreCase(hwy::TargetName(int64_t{1} << bit), name);
  return absl::InvalidArgumentError(
      absl::StrCat(name, known ? " is not a target this build runs on this CPU" : " is not a Highway SIMD target name",
                   "; this CPU offers: ", Names(offered)));
}

std::vector<SimdTarget> AvailableSimdTargets() {
  ApplySimdTargetFromEnv();
  return TargetsOf(SupportedTargets());
}

void ConvertSimd(const void* src, DType st, void* dst, DType dt, size_t n) {
  ApplySimdTargetFromEnv();
  HWY_DYNAMIC_DISPATCH(ConvertSimdImpl)(src, st, dst, dt, n);
}

void CopyStreaming(void* dst, const void* src, size_t bytes) {
  ApplySimdTargetFromEnv();
  HWY_DYNAMIC_DISPATCH(CopyStreamingImpl)(dst, src, bytes);
}

std::string ActiveSimdTarget() {
  ApplySimdTargetFromEnv();
  return HWY_DYNAMIC_DISPATCH(SimdTargetNameImpl)();
}

void ForceSimdTargetForTest(int64_t bits) {
  const ProcessTargets& p = Targets();
  // Outside ZERO_SIMD_TARGET's restriction Highway would fall back to its static target without a word.
  ZERO_CHECK(bits == 0 || p.env_bits == 0 || bits == p.env_bits)
      << "ForceSimdTargetForTest(" << hwy::TargetName(bits)
      << ") under ZERO_SIMD_TARGET=" << hwy::TargetName(p.env_bits)
      << ": loop over AvailableSimdTargets(), which honours it";
  hwy::SetSupportedTargetsForTest(bits);
  SupportedTargets();
}

}  // namespace zero::internal
#endif  // HWY_ONCE
