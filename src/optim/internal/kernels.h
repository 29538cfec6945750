// optim/internal/kernels.h — the element-wise optimizer kernels behind zero/optimizer.h.
//
// Two implementations of every update, with the same operations in the same order:
//   * the fast path (kernels.cc): Google Highway, compiled for several x86/Arm targets and chosen at run time
//     (HWY_DYNAMIC_DISPATCH), templated on the gradient and parameter-copy types so no dtype branch sits in a
//     loop;
//   * the scalar reference (reference.cc): one plain loop per optimizer, written as the torch.optim formula
//     reads, used by the tests.
// Both are compiled with -ffp-contract=off, so the compiler never fuses a*b+c into an FMA on targets that
// have one: results are then bitwise identical across targets and to the reference (NaN payloads aside).
//
// The per-step scalars are derived once, in double (as Python floats are in torch.optim), by MakeAdamScalars /
// MakeSgdScalars and rounded to f32 once; the kernels only do f32 arithmetic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zero/optimizer.h"

namespace zero::optim_internal {

// Per-step constants of Adam/AdamW, each the f32 value torch's CPU kernels see. Per element, in this order
// (torch.optim.Adam/AdamW single-tensor and foreach paths, torch >= 2.0, non-fused CPU arithmetic):
//   g  = grad * grad_scale
//   p  = p * decay                    if apply_decay   (AdamW: param.mul_(1 - lr * wd))
//   g  = g + l2 * p                   if apply_l2      (Adam:  grad = grad.add(param, alpha=wd))
//   m  = lerp(m, g, w)                 (exp_avg.lerp_(grad, 1 - beta1); torch's CPU lerp, w = 1 - beta1:
//                                        w < 0.5: m + w * (g - m), else g - (g - m) * (1 - w). The fast path
//                                        computes base + lerp_coeff * (g - m), base = m or g, lerp_coeff = w or
//                                        w - 1: the same value, since w - 1 == -(1 - w) exactly for w in [0.5, 1])
//   v  = v * beta2;  v = v + (one_minus_beta2 * g) * g                (mul_(beta2).addcmul_(g, g, 1 - beta2))
//   d  = sqrt(v) / bc2_sqrt + eps                                      ((exp_avg_sq.sqrt() / bc2_sqrt).add_(eps))
//   p  = p + (neg_step_size * m) / d                                   (param.addcdiv_(m, d, value=-step_size))
struct AdamScalars {
  float grad_scale = 1.0f;
  bool apply_decay = false;
  float decay = 1.0f;
  bool apply_l2 = false;
  float l2 = 0.0f;
  bool lerp_small = true;              // |w| < 0.5
  float lerp_weight = 0.1f;            // w
  float lerp_one_minus_weight = 0.9f;  // 1 - w, rounded in f32 as torch's lerp does
  float lerp_coeff = 0.1f;             // w if lerp_small else w - 1
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float bc2_sqrt = 1.0f;
  float eps = 1e-8f;
  float neg_step_size = 0.0f;
};

// Per-step constants of SGD (torch.optim.SGD single-tensor path). Per element:
//   g = grad * grad_scale
//   g = g + l2 * p                                  if apply_l2   (grad.add(param, alpha=wd))
//   with momentum (a state buffer b):
//     b = g                                         if first_step (torch clones the gradient)
//     b = b * momentum + one_minus_dampening * g    otherwise     (buf.mul_(momentum).add_(g, alpha=1 - dampening))
//     g = g + momentum * b                          if nesterov   (grad.add(buf, alpha=momentum))
//     g = b                                         otherwise
//   p = p + neg_lr * g                                            (param.add_(grad, alpha=-lr))
struct SgdScalars {
  float grad_scale = 1.0f;
  bool apply_l2 = false;
  float l2 = 0.0f;
  bool use_momentum = false;
  bool first_step = false;
  bool nesterov = false;
  float momentum = 0.0f;
  float one_minus_dampening = 1.0f;
  float neg_lr = 0.0f;
};

AdamScalars MakeAdamScalars(const AdamParams& p, const ShardUpdate& u);
SgdScalars MakeSgdScalars(const SgdParams& p, const ShardUpdate& u);

// The tensors of one tile. `exp_avg`/`exp_avg_sq` (Adam) or `momentum_buffer` (SGD with momentum) are state[0..].
struct TileArgs {
  float* master = nullptr;
  const void* grad = nullptr;
  DType grad_dtype = DType::kF32;
  float* state0 = nullptr;
  float* state1 = nullptr;
  void* param_out = nullptr;  // nullptr: no copy written
  DType param_out_dtype = DType::kBF16;
  size_t n = 0;
};

// Fast path (runtime-dispatched SIMD).
void AdamTile(const AdamScalars& s, const TileArgs& t);
void SgdTile(const SgdScalars& s, const TileArgs& t);

// Scalar reference: the same formulas as plain loops (one element at a time, dtype conversions from zero/dtype.h).
void AdamTileReference(const AdamScalars& s, const TileArgs& t);
void SgdTileReference(const SgdScalars& s, const TileArgs& t);

// Name of the target HWY_DYNAMIC_DISPATCH picks now for these kernels. Which targets they may use is set for all
// host kernels at once: internal::ForceSimdTargetForTest and ZERO_SIMD_TARGET (core/internal/convert_simd.h).
std::string ActiveKernelTarget();

}  // namespace zero::optim_internal
