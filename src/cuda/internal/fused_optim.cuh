// The fused optimizer step (AdamW / Adam with L2 / SGD with momentum and Nesterov) as a per-thread body that
// the CUDA kernel in src/cuda/optim.cu runs on the device and tests/cuda/emulation_test.cc runs on the CPU.
//
// One pass per element: read the gradient (f32/f16/bf16) and multiply it by grad_scale, read fp32 master
// and state, update them in place, and optionally write the new parameter as f32/f16/bf16. The operations,
// their order and the per-step scalars are exactly those of the host kernels (src/optim/internal/kernels.h,
// which follow torch.optim's single-tensor path), each rounded once (FMul/FAdd/...: no FMA contraction), so
// device and host results are identical bit for bit (NaN payloads aside).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/internal/device_math.cuh"

namespace zero::cuda::internal {

// Device pointers and the vector plan for one shard. state[0..1] are the optimizer's fp32 state buffers
// (Adam: exp_avg, exp_avg_sq; SGD with momentum: momentum_buffer).
struct FusedArgs {
  float* master = nullptr;
  const void* grad = nullptr;
  float grad_scale = 1.0f;
  float* state[2] = {nullptr, nullptr};
  void* param_out = nullptr;
  VecPlan plan;
};

// Adam/AdamW scalars for one step (MakeAdamOp). Per element:
//   p = p * decay                          if apply_decay  (AdamW: param.mul_(1 - lr * wd))
//   g = g + l2 * p                         if apply_l2     (Adam:  grad = grad.add(param, alpha=wd))
//   m = w < 0.5 ? m + w * (g - m) : g - (g - m) * (1 - w)  (exp_avg.lerp_(grad, w = 1 - beta1))
//   v = v * beta2;  v = v + (one_minus_beta2 * g) * g      (exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2))
//   d = sqrt(v) / bc2_sqrt + eps                           ((exp_avg_sq.sqrt() / bc2_sqrt).add_(eps))
//   p = p + (neg_step_size * m) / d                        (param.addcdiv_(exp_avg, denom, value=-step_size))
struct AdamOp {
  static constexpr int kStates = 2;
  bool apply_decay = false;
  float decay = 1.0f;
  bool apply_l2 = false;
  float l2 = 0.0f;
  bool lerp_small = true;
  float lerp_weight = 0.1f;
  float lerp_one_minus_weight = 0.9f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float bc2_sqrt = 1.0f;
  float eps = 1e-8f;
  float neg_step_size = 0.0f;

  ZERO_HD void Apply(float& p, float g, float (&s)[2]) const {
    if (apply_decay) p = FMul(p, decay);
    if (apply_l2) g = FAdd(g, FMul(l2, p));
    float m = s[0];
    m = lerp_small ? FAdd(m, FMul(lerp_weight, FSub(g, m))) : FSub(g, FMul(FSub(g, m), lerp_one_minus_weight));
    float v = FMul(s[1], beta2);
    v = FAdd(v, FMul(FMul(one_minus_beta2, g), g));
    const float denom = FAdd(FDiv(FSqrt(v), bc2_sqrt), eps);
    p = FAdd(p, FDiv(FMul(neg_step_size, m), denom));
    s[0] = m;
    s[1] = v;
  }
};

// SGD scalars for one step (MakeSgdOp); kStates is 1 with momentum, 0 without. Per element:
//   g = g + l2 * p                                  if apply_l2   (grad.add(param, alpha=weight_decay))
//   with momentum (buffer b):
//     b = g                                         on the first step (torch clones the gradient)
//     b = b * momentum + one_minus_dampening * g    otherwise          (buf.mul_(momentum).add_(g, alpha=1 - damp))
//     g = nesterov ? g + momentum * b : b
//   p = p + neg_lr * g                                                 (param.add_(grad, alpha=-lr))
template <int kStatesT>
struct SgdOp {
  static constexpr int kStates = kStatesT;
  bool apply_l2 = false;
  float l2 = 0.0f;
  bool first_step = false;
  bool nesterov = false;
  float momentum = 0.0f;
  float one_minus_dampening = 1.0f;
  float neg_lr = 0.0f;

  ZERO_HD void Apply(float& p, float g, float (&s)[2]) const {
    if (apply_l2) g = FAdd(g, FMul(l2, p));
    if constexpr (kStates == 1) {
      const float b = first_step ? g : FAdd(FMul(s[0], momentum), FMul(one_minus_dampening, g));
      s[0] = b;
      g = nesterov ? FAdd(g, FMul(momentum, b)) : b;
    }
    p = FAdd(p, FMul(neg_lr, g));
  }
};

// The per-step scalars, formed in double (Python floats in torch.optim) and rounded to f32 once — the same
// derivation as the host's MakeAdamScalars / MakeSgdScalars.
inline AdamOp MakeAdamOp(double lr, double beta1, double beta2, double eps, double weight_decay, bool decoupled,
                         bool bias_correction, int64_t step) {
  AdamOp op;
  op.apply_decay = decoupled && weight_decay != 0.0;
  op.decay = static_cast<float>(1.0 - lr * weight_decay);
  op.apply_l2 = !decoupled && weight_decay != 0.0;
  op.l2 = static_cast<float>(weight_decay);
  const float w = static_cast<float>(1.0 - beta1);
  op.lerp_weight = w;
  op.lerp_one_minus_weight = 1.0f - w;  // rounded in f32, as torch's lerp does
  op.lerp_small = std::abs(w) < 0.5f;
  op.beta2 = static_cast<float>(beta2);
  op.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  op.eps = static_cast<float>(eps);
  double step_size = lr;
  double bc2_sqrt = 1.0;
  if (bias_correction) {
    const double t = static_cast<double>(step);
    step_size = lr / (1.0 - std::pow(beta1, t));
    bc2_sqrt = std::sqrt(1.0 - std::pow(beta2, t));
  }
  op.neg_step_size = static_cast<float>(-step_size);
  op.bc2_sqrt = static_cast<float>(bc2_sqrt);
  return op;
}

template <int kStates>
SgdOp<kStates> MakeSgdOp(double lr, double momentum, double dampening, double weight_decay, bool nesterov,
                         int64_t step) {
  SgdOp<kStates> op;
  op.apply_l2 = weight_decay != 0.0;
  op.l2 = static_cast<float>(weight_decay);
  op.first_step = step <= 1;
  op.nesterov = nesterov;
  op.momentum = static_cast<float>(momentum);
  op.one_minus_dampening = static_cast<float>(1.0 - dampening);
  op.neg_lr = static_cast<float>(-lr);
  return op;
}

// The scalar head and tail of the plan (elements outside the vector body), one element at a time, for thread
// `tid` of `nthreads` (grid-stride). Shared by every variant of the step.
template <class G, class P, class Op>
ZERO_HD void FusedStepScalars(const FusedArgs& a, const Op& op, size_t tid, size_t nthreads) {
  constexpr int kS = Op::kStates;
  const VecPlan& plan = a.plan;
  const size_t scalar_count = plan.ScalarCount();
  for (size_t k = tid; k < scalar_count; k += nthreads) {
    const size_t e = plan.ScalarIndex(k);
    float p = a.master[e];
    float s[2] = {kS >= 1 ? a.state[0][e] : 0.f, kS >= 2 ? a.state[1][e] : 0.f};
    op.Apply(p, FMul(LoadOne<G>(a.grad, e), a.grad_scale), s);
    a.master[e] = p;
    if constexpr (kS >= 1) a.state[0][e] = s[0];
    if constexpr (kS >= 2) a.state[1][e] = s[1];
    if constexpr (!std::is_same_v<P, NoOut>) StoreOne<P>(a.param_out, e, p);
  }
}

// The first version of the step (kept for comparison in zero-bench-gpu, and as its host reference): thread
// `tid` of `nthreads` grid-strides over the 8-wide vector body, one 8-element vector per iteration (f32 as two
// 16-byte accesses per thread), then over the scalar head and tail. G is the gradient type, P the write-back
// type (NoOut for none).
template <class G, class P, class Op>
ZERO_HD void FusedStepThread(const FusedArgs& a, const Op& op, size_t tid, size_t nthreads) {
  constexpr int kS = Op::kStates;
  const VecPlan& plan = a.plan;
  for (size_t k = tid; k < plan.nvec; k += nthreads) {
    const size_t e = plan.head + 8 * k;
    float p[8], g[8], s0[8], s1[8];
    // All loads first: seven (f32 grad: eight) independent 16-byte loads in flight per thread.
    Load8<F32>(a.master, e, p);
    Load8<G>(a.grad, e, g);
    if constexpr (kS >= 1) Load8<F32>(a.state[0], e, s0);
    if constexpr (kS >= 2) Load8<F32>(a.state[1], e, s1);
    ZERO_UNROLL
    for (int j = 0; j < 8; ++j) {
      float s[2] = {kS >= 1 ? s0[j] : 0.f, kS >= 2 ? s1[j] : 0.f};
      op.Apply(p[j], FMul(g[j], a.grad_scale), s);
      if constexpr (kS >= 1) s0[j] = s[0];
      if constexpr (kS >= 2) s1[j] = s[1];
    }
    Store8<F32>(a.master, e, p);
    if constexpr (kS >= 1) Store8<F32>(a.state[0], e, s0);
    if constexpr (kS >= 2) Store8<F32>(a.state[1], e, s1);
    if constexpr (!std::is_same_v<P, NoOut>) Store8<P>(a.param_out, e, p);
  }
  FusedStepScalars<G, P, Op>(a, op, tid, nthreads);
}

// ---------------------------------------------------------------------------------------------------------
// The tiled step: the production kernel and the alternatives zero-bench-gpu times against it. All variants
// compute every element with the same Op::Apply as above (so the same bits); they differ only in which thread
// touches which element, how wide each access is, and the cache hint on it.

// How a thread's elements lie in memory. A "unit" is the group of consecutive elements one thread loads from
// each buffer with one access per 16 bytes.
enum class FusedLayout : uint8_t {
  // 8 elements per unit: f32 as two 16-byte accesses (32 bytes per thread, so each of a warp's two f32
  // instructions touches every other 16 bytes of 1 KiB), f16/bf16 as one 16-byte access. The first version's.
  kVec8 = 0,
  // 4 elements per unit: f32 as one 16-byte access, f16/bf16 as one 8-byte access; each warp instruction
  // covers 512 (f32) or 256 (16-bit) contiguous bytes, whole 32-byte sectors only.
  kQuad = 1,
};

// kStreaming: ld.global.cs / st.global.cs (evict-first in L1 and L2): every byte is touched exactly once.
// kStreamingPf256: the same, and the loads also ask L2 to fetch the whole 256-byte block from DRAM on a miss
// (ld.global.cs.L2::256B; a prefetch-size hint, sm_75 and newer).
enum class CacheHint : uint8_t { kDefault = 0, kStreaming = 1, kStreamingPf256 = 2 };

// One variant: layout, units per thread per iteration (all loaded before any math), cache hint.
template <FusedLayout kLayoutT, int kUnitsT, CacheHint kHintT>
struct FusedVariant {
  static constexpr FusedLayout kLayout = kLayoutT;
  static constexpr int kUnits = kUnitsT;
  static constexpr CacheHint kHint = kHintT;
  static constexpr int kUnitElems = kLayoutT == FusedLayout::kVec8 ? 8 : 4;
  static constexpr int kElemsPerThread = kUnitsT * kUnitElems;  // per buffer, per iteration
};

// The variant src/cuda/optim.cu launches, and on which grid (FusedGrid, fused_kernel.cuh): on an H200 it moved
// 0.96-0.98 of the copy bandwidth against 0.81-0.84 for the first version (docs/internals/cuda.md, "Fused step
// variants").
using FusedProductionVariant = FusedVariant<FusedLayout::kQuad, 4, CacheHint::kStreaming>;
inline constexpr bool kProductionOnePass = true;

// Calls f(V{}) for every tiled variant zero-bench-gpu times (the production one among them), in its order; the
// CPU emulation test and the GPU test check each against the host optimizer. 8 or 16 elements per thread per
// iteration (more needs over 128 registers with Adam: one block per SM), both layouts, the three hints.
template <class F>
void ForEachFusedVariant(F&& f) {
  f(FusedVariant<FusedLayout::kVec8, 1, CacheHint::kStreaming>{});
  f(FusedVariant<FusedLayout::kVec8, 2, CacheHint::kDefault>{});
  f(FusedVariant<FusedLayout::kVec8, 2, CacheHint::kStreaming>{});
  f(FusedVariant<FusedLayout::kQuad, 2, CacheHint::kDefault>{});
  f(FusedVariant<FusedLayout::kQuad, 2, CacheHint::kStreaming>{});
  f(FusedVariant<FusedLayout::kQuad, 4, CacheHint::kDefault>{});
  f(FusedProductionVariant{});
  f(FusedVariant<FusedLayout::kQuad, 2, CacheHint::kStreamingPf256>{});
  f(FusedVariant<FusedLayout::kQuad, 4, CacheHint::kStreamingPf256>{});
}

// A 16- or 8-byte vector access (V: float4, uint4, uint2) at an address aligned to its size, with hint H on the
// device (the host, in the CPU emulation, has no caches to hint).
template <CacheHint H, class V>
ZERO_HD V LoadVec(const void* p) {
#ifdef __CUDA_ARCH__
  if constexpr (H == CacheHint::kStreaming) return __ldcs(static_cast<const V*>(p));
  if constexpr (H == CacheHint::kStreamingPf256) {
    V r;
    if constexpr (std::is_same_v<V, float4>) {
      asm volatile("ld.global.cs.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];"
                   : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w)
                   : "l"(p));
    } else if constexpr (std::is_same_v<V, uint4>) {
      asm volatile("ld.global.cs.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                   : "l"(p));
    } else {
      static_assert(std::is_same_v<V, uint2>, "float4, uint4 or uint2");
      asm volatile("ld.global.cs.L2::256B.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    }
    return r;
  }
#endif
  return *static_cast<const V*>(p);
}

// Stores take no prefetch hint: kStreamingPf256 stores as kStreaming.
template <CacheHint H, class V>
ZERO_HD void StoreVec(void* p, const V& v) {
#ifdef __CUDA_ARCH__
  if constexpr (H != CacheHint::kDefault) {
    __stcs(static_cast<V*>(p), v);
    return;
  }
#endif
  *static_cast<V*>(p) = v;
}

// Loads elements [i, i + kE) of a T buffer as f32 (kE = 8 or 4). Alignment: 16 bytes for f32 and for eight
// 16-bit elements, 8 bytes for four (VecPlan's head makes element head + 4k so for every buffer).
template <class T, int kE, CacheHint H>
ZERO_HD void LoadUnit(const void* p, size_t i, float (&v)[kE]) {
  static_assert(kE == 8 || kE == 4, "units are 8 or 4 elements");
  if constexpr (T::kDt == Dt::kF32) {
    const float* f = static_cast<const float*>(p) + i;
    ZERO_UNROLL
    for (int q = 0; q < kE / 4; ++q) {
      const float4 x = LoadVec<H, float4>(f + 4 * q);
      v[4 * q] = x.x;
      v[4 * q + 1] = x.y;
      v[4 * q + 2] = x.z;
      v[4 * q + 3] = x.w;
    }
  } else {
    const uint16_t* h = static_cast<const uint16_t*>(p) + i;
    uint32_t w[kE / 2];
    if constexpr (kE == 8) {
      const uint4 u = LoadVec<H, uint4>(h);
      w[0] = u.x;
      w[1] = u.y;
      w[2] = u.z;
      w[3] = u.w;
    } else {
      const uint2 u = LoadVec<H, uint2>(h);
      w[0] = u.x;
      w[1] = u.y;
    }
    UnpackHalves<T, kE / 2>(w, v);  // element 2k in the low half of word k, as Load8
  }
}

// Stores kE f32 values as elements [i, i + kE) of a T buffer (alignment as LoadUnit).
template <class T, int kE, CacheHint H>
ZERO_HD void StoreUnit(void* p, size_t i, const float (&v)[kE]) {
  static_assert(kE == 8 || kE == 4, "units are 8 or 4 elements");
  if constexpr (T::kDt == Dt::kF32) {
    float* f = static_cast<float*>(p) + i;
    ZERO_UNROLL
    for (int q = 0; q < kE / 4; ++q) {
      StoreVec<H>(f + 4 * q, make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]));
    }
  } else {
    uint32_t w[kE / 2];
    PackHalves<T, kE / 2>(v, w);
    uint16_t* h = static_cast<uint16_t*>(p) + i;
    if constexpr (kE == 8) {
      StoreVec<H>(h, make_uint4(w[0], w[1], w[2], w[3]));
    } else {
      StoreVec<H>(h, make_uint2(w[0], w[1]));
    }
  }
}

// kN units of one thread: unit j is elements [e0 + j * stride, e0 + j * stride + kE). Every load of every
// unit is issued before the first use (kN x 4 independent accesses in flight with Adam; 2 per f32 buffer
// and unit for kVec8), then each unit's math and stores.
template <class G, class P, class Op, class V, int kN>
ZERO_HD void FusedStepUnits(const FusedArgs& a, const Op& op, size_t e0, size_t stride) {
  constexpr int kE = V::kUnitElems;
  constexpr int kS = Op::kStates;
  constexpr CacheHint H = V::kHint;
  float p[kN][kE], g[kN][kE], s0[kN][kE], s1[kN][kE];
  ZERO_UNROLL
  for (int j = 0; j < kN; ++j) {
    const size_t e = e0 + j * stride;
    LoadUnit<F32, kE, H>(a.master, e, p[j]);
    LoadUnit<G, kE, H>(a.grad, e, g[j]);
    if constexpr (kS >= 1) LoadUnit<F32, kE, H>(a.state[0], e, s0[j]);
    if constexpr (kS >= 2) LoadUnit<F32, kE, H>(a.state[1], e, s1[j]);
  }
  // Unit by unit: its math, then its stores, so its registers are free before the next unit's math.
  ZERO_UNROLL
  for (int j = 0; j < kN; ++j) {
    ZERO_UNROLL
    for (int k = 0; k < kE; ++k) {
      float s[2] = {kS >= 1 ? s0[j][k] : 0.f, kS >= 2 ? s1[j][k] : 0.f};
      op.Apply(p[j][k], FMul(g[j][k], a.grad_scale), s);
      if constexpr (kS >= 1) s0[j][k] = s[0];
      if constexpr (kS >= 2) s1[j][k] = s[1];
    }
    const size_t e = e0 + j * stride;
    StoreUnit<F32, kE, H>(a.master, e, p[j]);
    if constexpr (kS >= 1) StoreUnit<F32, kE, H>(a.state[0], e, s0[j]);
    if constexpr (kS >= 2) StoreUnit<F32, kE, H>(a.state[1], e, s1[j]);
    if constexpr (!std::is_same_v<P, NoOut>) StoreUnit<P, kE, H>(a.param_out, e, p[j]);
  }
}

// Thread `thread` of block `block` (of `nblocks` blocks of `block_threads` threads) under variant V. The vector
// body is cut into tiles of block_threads x V::kUnits units; blocks take tiles in turn (tile t, t + nblocks,
// ...), and in a tile thread i owns units i, i + block_threads, ... (so each warp instruction is contiguous).
// The units left over after the last whole tile go one at a time to all threads of the grid, then the scalar
// head and tail. Correct for any grid shape; the launch picks the shape (src/cuda/internal/fused_kernel.cuh).
template <class G, class P, class Op, class V>
ZERO_HD void FusedStepTiledThread(const FusedArgs& a, const Op& op, size_t block, size_t nblocks, size_t thread,
                                  size_t block_threads) {
  constexpr int kE = V::kUnitElems;
  constexpr int kU = V::kUnits;
  const VecPlan& plan = a.plan;
  const size_t units = plan.nvec * (8 / kE);
  const size_t tile = block_threads * kU;
  const size_t tiles = units / tile;
  for (size_t t = block; t < tiles; t += nblocks) {
    FusedStepUnits<G, P, Op, V, kU>(a, op, plan.head + kE * (t * tile + thread), kE * block_threads);
  }
  const size_t tid = block * block_threads + thread;
  const size_t nthreads = nblocks * block_threads;
  for (size_t k = tiles * tile + tid; k < units; k += nthreads) {
    FusedStepUnits<G, P, Op, V, 1>(a, op, plan.head + kE * k, 0);
  }
  FusedStepScalars<G, P, Op>(a, op, tid, nthreads);
}

}  // namespace zero::cuda::internal
