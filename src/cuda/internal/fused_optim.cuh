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

// Processes the elements of thread `tid` of `nthreads` (grid-stride): first the 8-wide vector body, then
// the scalar head and tail. G is the gradient type, P the write-back type (NoOut for none).
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

}  // namespace zero::cuda::internal
