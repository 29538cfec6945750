// optim/reference.cc — the scalar reference of the optimizer kernels: plain loops, one element at a time, each
// line one torch.optim tensor operation in torch's order (see internal/kernels.h). The tests require the SIMD
// fast path to reproduce these results bit for bit; the file is compiled with -ffp-contract=off so the
// compiler cannot fuse a*b+c either.

#include <cmath>
#include <cstddef>

#include "optim/internal/kernels.h"
#include "zero/dtype.h"

namespace zero::optim_internal {

void AdamTileReference(const AdamScalars& s, const TileArgs& t) {
  for (size_t i = 0; i < t.n; ++i) {
    float g = LoadAsF32(t.grad, t.grad_dtype, i) * s.grad_scale;
    float p = t.master[i];
    if (s.apply_decay) p = p * s.decay;  // param.mul_(1 - lr * weight_decay)
    if (s.apply_l2) g = g + s.l2 * p;    // grad = grad.add(param, alpha=weight_decay)
    float m = t.state0[i];
    // exp_avg.lerp_(grad, 1 - beta1), torch's CPU lerp
    m = s.lerp_small ? m + s.lerp_weight * (g - m) : g - (g - m) * s.lerp_one_minus_weight;
    float v = t.state1[i];
    v = v * s.beta2;                          // exp_avg_sq.mul_(beta2)
    v = v + s.one_minus_beta2 * g * g;        // .addcmul_(grad, grad, value=1 - beta2)
    float denom = std::sqrt(v) / s.bc2_sqrt;  // exp_avg_sq.sqrt() / bias_correction2_sqrt
    denom = denom + s.eps;                    // .add_(eps)
    p = p + s.neg_step_size * m / denom;      // param.addcdiv_(exp_avg, denom, value=-step_size)
    t.state0[i] = m;
    t.state1[i] = v;
    t.master[i] = p;
    if (t.param_out != nullptr) StoreFromF32(t.param_out, t.param_out_dtype, i, p);
  }
}

void SgdTileReference(const SgdScalars& s, const TileArgs& t) {
  for (size_t i = 0; i < t.n; ++i) {
    float g = LoadAsF32(t.grad, t.grad_dtype, i) * s.grad_scale;
    float p = t.master[i];
    if (s.apply_l2) g = g + s.l2 * p;  // grad = grad.add(param, alpha=weight_decay)
    if (s.use_momentum) {
      float b = t.state0[i];
      if (s.first_step) {
        b = g;  // buf = torch.clone(grad).detach()
      } else {
        b = b * s.momentum + s.one_minus_dampening * g;  // buf.mul_(momentum).add_(grad, alpha=1 - dampening)
      }
      t.state0[i] = b;
      g = s.nesterov ? g + s.momentum * b : b;  // grad = grad.add(buf, alpha=momentum) or grad = buf
    }
    p = p + s.neg_lr * g;  // param.add_(grad, alpha=-lr)
    t.master[i] = p;
    if (t.param_out != nullptr) StoreFromF32(t.param_out, t.param_out_dtype, i, p);
  }
}

}  // namespace zero::optim_internal
