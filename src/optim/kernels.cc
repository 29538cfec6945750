// optim/kernels.cc — the SIMD fast path of the element-wise optimizers (see internal/kernels.h).
//
// Highway compiles this file once per target (foreach_target.h re-includes it) and HWY_DYNAMIC_DISPATCH picks
// the best one the CPU supports at the first call: one binary runs AVX-512 on a server and SSE4 on an old
// laptop. Each kernel is templated on the gradient type and on the parameter-copy type, so the loops contain
// no dtype branch; the flags that vary per step (decoupled decay, L2, lerp form, nesterov, first step) are
// uniform masks (all lanes on or all off) applied with IfThenElse, so the loops contain no branch at all.
//
// The operations and their order are those of the scalar reference (reference.cc) and of torch.optim; the TU
// is compiled with -ffp-contract=off (see CMakeLists.txt) because GCC would otherwise fuse the intrinsics'
// a*b+c into FMAs on AVX2/AVX-512 and the targets would disagree in the last bit.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "optim/kernels.cc"
// SSSE3 would only duplicate SSE4 here; skipping it saves compile time. Machines without SSE4 run EMU128. The
// same target set as core/convert_simd.cc and mixed_precision/grad_stats.cc (one ForceSimdTargetForTest, one
// ZERO_SIMD_TARGET for all three).
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// defines: the per-target ops (must follow foreach_target.h)
#include "core/internal/convert_simd.h"
#include "core/internal/hwy_convert-inl.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "optim/internal/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace zero {
namespace optim_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// What a kernel writes into param_out.
enum class Out { kNone, kF32, kF16, kBF16 };

// dtype conversions: core/internal/hwy_convert-inl.h (bit-for-bit zero/dtype.h, shared with the casts and
// GradStats; tests compare them on every 16-bit pattern)

template <DType kG, class D>
HWY_INLINE hn::Vec<D> LoadGrad(D d, const void* grad, size_t i) {
  return internal::HWY_NAMESPACE::LoadAsF32Vec<kG>(d, grad, i);
}

template <Out kO, class D>
HWY_INLINE void StoreOut(D d, hn::Vec<D> p, void* out, size_t i) {
  if constexpr (kO == Out::kF32) {
    internal::HWY_NAMESPACE::StoreF32VecAs<DType::kF32>(d, p, out, i);
  } else if constexpr (kO == Out::kBF16) {
    internal::HWY_NAMESPACE::StoreF32VecAs<DType::kBF16>(d, p, out, i);
  } else if constexpr (kO == Out::kF16) {
    internal::HWY_NAMESPACE::StoreF32VecAs<DType::kF16>(d, p, out, i);
  }
}

// All lanes set when `on`, none otherwise: a flag applied without a branch.
template <class D>
HWY_INLINE hn::Mask<D> Uniform(D d, bool on) {
  return hn::FirstN(d, on ? hn::Lanes(d) : 0);
}

// Software prefetch distance, in elements (2 KiB of an f32 stream). The hardware prefetchers restart at every
// 4 KiB page boundary, and with 4-5 streams per thread that leaves the memory pipe idle often enough to matter:
// on the dev VM, 64M-param AdamW went from 1.42-1.59 to 1.83-1.85 Gparam/s with 2 threads and from 0.78-0.82 to
// 0.93 with 1 (512 and 1024 tied; 2048 was slower; see bench/results/optim-cpu.md).
constexpr size_t kPrefetchElems = 512;
constexpr size_t kLineElems = 16;  // f32 elements per 64-byte cache line

HWY_INLINE void PrefetchLine(const void* base, size_t i, size_t elem_bytes) {
  hwy::Prefetch(static_cast<const char*>(base) + i * elem_bytes);
}

// Full vectors are processed in blocks of whole cache lines; before each block, the lines kPrefetchElems
// elements ahead in every stream are prefetched. (Written out in each loop rather than passed as a lambda: GCC
// 12 classifies a lambda that only prefetches as a `const` function and deletes the calls.)
HWY_INLINE size_t BlockElems(size_t lanes) { return lanes > kLineElems ? lanes : kLineElems; }

// ------------------------------------------------------------------------------------------------------------
// Adam / AdamW

// The step's scalars as vectors and masks, built once per loop so the loop body only loads and computes (the
// compiler cannot hoist loads through the caller's references: a store to the tile might alias them).
template <class D>
struct AdamVecs {
  AdamVecs(D d, const AdamScalars& s)
      : grad_scale(hn::Set(d, s.grad_scale)),
        decay(hn::Set(d, s.decay)),
        l2(hn::Set(d, s.l2)),
        lerp_coeff(hn::Set(d, s.lerp_coeff)),
        beta2(hn::Set(d, s.beta2)),
        one_minus_beta2(hn::Set(d, s.one_minus_beta2)),
        bc2_sqrt(hn::Set(d, s.bc2_sqrt)),
        eps(hn::Set(d, s.eps)),
        neg_step_size(hn::Set(d, s.neg_step_size)),
        decay_on(Uniform(d, s.apply_decay)),
        l2_on(Uniform(d, s.apply_l2)),
        lerp_small(Uniform(d, s.lerp_small)) {}
  hn::Vec<D> grad_scale, decay, l2, lerp_coeff, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step_size;
  hn::Mask<D> decay_on, l2_on, lerp_small;
};

template <DType kG, Out kO, class D>
HWY_INLINE void AdamElements(D d, const AdamVecs<D>& c, const TileArgs& t, size_t i) {
  auto g = hn::Mul(LoadGrad<kG>(d, t.grad, i), c.grad_scale);
  auto p = hn::LoadU(d, t.master + i);
  p = hn::IfThenElse(c.decay_on, hn::Mul(p, c.decay), p);
  g = hn::IfThenElse(c.l2_on, hn::Add(g, hn::Mul(c.l2, p)), g);
  auto m = hn::LoadU(d, t.state0 + i);
  m = hn::Add(hn::IfThenElse(c.lerp_small, m, g), hn::Mul(c.lerp_coeff, hn::Sub(g, m)));
  auto v = hn::LoadU(d, t.state1 + i);
  v = hn::Mul(v, c.beta2);
  v = hn::Add(v, hn::Mul(hn::Mul(c.one_minus_beta2, g), g));
  const auto denom = hn::Add(hn::Div(hn::Sqrt(v), c.bc2_sqrt), c.eps);
  p = hn::Add(p, hn::Div(hn::Mul(c.neg_step_size, m), denom));
  hn::StoreU(m, d, t.state0 + i);
  hn::StoreU(v, d, t.state1 + i);
  hn::StoreU(p, d, t.master + i);
  StoreOut<kO>(d, p, t.param_out, i);
}

template <DType kG, Out kO>
HWY_NOINLINE void AdamLoop(const AdamScalars& s_in, const TileArgs& t_in) {
  const AdamScalars s = s_in;  // locals: provably not aliased by the tile's stores
  const TileArgs t = t_in;
  const hn::ScalableTag<float> d;
  const AdamVecs<hn::ScalableTag<float>> c(d, s);
  const size_t lanes = hn::Lanes(d), block = BlockElems(lanes);
  size_t i = 0;
  for (; i + kPrefetchElems + block <= t.n; i += block) {
    for (size_t l = 0; l < block; l += kLineElems) {
      const size_t j = i + kPrefetchElems + l;
      PrefetchLine(t.master, j, 4);
      PrefetchLine(t.state0, j, 4);
      PrefetchLine(t.state1, j, 4);
      PrefetchLine(t.grad, j, DTypeSize(kG));
    }
    for (size_t k = 0; k < block; k += lanes) AdamElements<kG, kO>(d, c, t, i + k);
  }
  for (; i + lanes <= t.n; i += lanes) AdamElements<kG, kO>(d, c, t, i);
  // The tail runs the same code on one-lane vectors, so it rounds exactly as the body does.
  const hn::CappedTag<float, 1> d1;
  const AdamVecs<hn::CappedTag<float, 1>> c1(d1, s);
  for (; i < t.n; ++i) AdamElements<kG, kO>(d1, c1, t, i);
}

template <DType kG>
HWY_INLINE void AdamByOut(const AdamScalars& s, const TileArgs& t) {
  if (t.param_out == nullptr) return AdamLoop<kG, Out::kNone>(s, t);
  switch (t.param_out_dtype) {
    case DType::kF32: return AdamLoop<kG, Out::kF32>(s, t);
    case DType::kF16: return AdamLoop<kG, Out::kF16>(s, t);
    case DType::kBF16: return AdamLoop<kG, Out::kBF16>(s, t);
  }
}

void AdamTileImpl(const AdamScalars& s, const TileArgs& t) {
  switch (t.grad_dtype) {
    case DType::kF32: return AdamByOut<DType::kF32>(s, t);
    case DType::kF16: return AdamByOut<DType::kF16>(s, t);
    case DType::kBF16: return AdamByOut<DType::kBF16>(s, t);
  }
}

// ------------------------------------------------------------------------------------------------------------
// SGD

template <class D>
struct SgdVecs {
  SgdVecs(D d, const SgdScalars& s)
      : grad_scale(hn::Set(d, s.grad_scale)),
        l2(hn::Set(d, s.l2)),
        momentum(hn::Set(d, s.momentum)),
        one_minus_dampening(hn::Set(d, s.one_minus_dampening)),
        neg_lr(hn::Set(d, s.neg_lr)),
        l2_on(Uniform(d, s.apply_l2)),
        first_step(Uniform(d, s.first_step)),
        nesterov(Uniform(d, s.nesterov)) {}
  hn::Vec<D> grad_scale, l2, momentum, one_minus_dampening, neg_lr;
  hn::Mask<D> l2_on, first_step, nesterov;
};

template <DType kG, Out kO, bool kMomentum, class D>
HWY_INLINE void SgdElements(D d, const SgdVecs<D>& c, const TileArgs& t, size_t i) {
  auto g = hn::Mul(LoadGrad<kG>(d, t.grad, i), c.grad_scale);
  auto p = hn::LoadU(d, t.master + i);
  g = hn::IfThenElse(c.l2_on, hn::Add(g, hn::Mul(c.l2, p)), g);
  if constexpr (kMomentum) {
    auto b = hn::LoadU(d, t.state0 + i);
    b = hn::IfThenElse(c.first_step, g, hn::Add(hn::Mul(b, c.momentum), hn::Mul(c.one_minus_dampening, g)));
    hn::StoreU(b, d, t.state0 + i);
    g = hn::IfThenElse(c.nesterov, hn::Add(g, hn::Mul(c.momentum, b)), b);
  }
  p = hn::Add(p, hn::Mul(c.neg_lr, g));
  hn::StoreU(p, d, t.master + i);
  StoreOut<kO>(d, p, t.param_out, i);
}

template <DType kG, Out kO, bool kMomentum>
HWY_NOINLINE void SgdLoop(const SgdScalars& s_in, const TileArgs& t_in) {
  const SgdScalars s = s_in;
  const TileArgs t = t_in;
  const hn::ScalableTag<float> d;
  const SgdVecs<hn::ScalableTag<float>> c(d, s);
  const size_t lanes = hn::Lanes(d), block = BlockElems(lanes);
  size_t i = 0;
  for (; i + kPrefetchElems + block <= t.n; i += block) {
    for (size_t l = 0; l < block; l += kLineElems) {
      const size_t j = i + kPrefetchElems + l;
      PrefetchLine(t.master, j, 4);
      if constexpr (kMomentum) PrefetchLine(t.state0, j, 4);
      PrefetchLine(t.grad, j, DTypeSize(kG));
    }
    for (size_t k = 0; k < block; k += lanes) SgdElements<kG, kO, kMomentum>(d, c, t, i + k);
  }
  for (; i + lanes <= t.n; i += lanes) SgdElements<kG, kO, kMomentum>(d, c, t, i);
  const hn::CappedTag<float, 1> d1;
  const SgdVecs<hn::CappedTag<float, 1>> c1(d1, s);
  for (; i < t.n; ++i) SgdElements<kG, kO, kMomentum>(d1, c1, t, i);
}

template <DType kG, bool kMomentum>
HWY_INLINE void SgdByOut(const SgdScalars& s, const TileArgs& t) {
  if (t.param_out == nullptr) return SgdLoop<kG, Out::kNone, kMomentum>(s, t);
  switch (t.param_out_dtype) {
    case DType::kF32: return SgdLoop<kG, Out::kF32, kMomentum>(s, t);
    case DType::kF16: return SgdLoop<kG, Out::kF16, kMomentum>(s, t);
    case DType::kBF16: return SgdLoop<kG, Out::kBF16, kMomentum>(s, t);
  }
}

template <bool kMomentum>
HWY_INLINE void SgdByGrad(const SgdScalars& s, const TileArgs& t) {
  switch (t.grad_dtype) {
    case DType::kF32: return SgdByOut<DType::kF32, kMomentum>(s, t);
    case DType::kF16: return SgdByOut<DType::kF16, kMomentum>(s, t);
    case DType::kBF16: return SgdByOut<DType::kBF16, kMomentum>(s, t);
  }
}

void SgdTileImpl(const SgdScalars& s, const TileArgs& t) {
  if (s.use_momentum) return SgdByGrad<true>(s, t);
  return SgdByGrad<false>(s, t);
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace optim_internal
}  // namespace zero
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace zero {
namespace optim_internal {

HWY_EXPORT(AdamTileImpl);
HWY_EXPORT(SgdTileImpl);
HWY_EXPORT(TargetNameImpl);

// ZERO_SIMD_TARGET (core/internal/convert_simd.h) is applied before the first dispatch of the process.
void AdamTile(const AdamScalars& s, const TileArgs& t) {
  internal::ApplySimdTargetFromEnv();
  HWY_DYNAMIC_DISPATCH(AdamTileImpl)(s, t);
}
void SgdTile(const SgdScalars& s, const TileArgs& t) {
  internal::ApplySimdTargetFromEnv();
  HWY_DYNAMIC_DISPATCH(SgdTileImpl)(s, t);
}

std::string ActiveKernelTarget() {
  internal::ApplySimdTargetFromEnv();
  return HWY_DYNAMIC_DISPATCH(TargetNameImpl)();
}

}  // namespace optim_internal
}  // namespace zero
#endif  // HWY_ONCE
