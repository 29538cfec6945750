// The per-thread part of GradStats (sum of squares and non-finite count of scale * grad), shared by the
// kernel in src/cuda/grad_stats.cu and the CPU emulation test. The block and grid reductions live in the
// .cu file (CUB); their order is fixed, so the result is deterministic for a given buffer (see docs/internals/cuda.md).
#pragma once

#include "cuda/internal/device_math.cuh"

namespace zero::cuda::internal {

struct StatsPartial {
  double sumsq = 0.0;
  unsigned long long nonfinite = 0;
};

// Squares are formed and summed in f32 per group of eight (one vector, in element order) and each group's
// sum is added to a double accumulator, so a thread's rounding error stays at f32 level per group while the
// long sums are double. Non-finite values of scale * g are counted.
template <class G>
ZERO_HD void AddGroup8(const float (&g)[8], float scale, StatsPartial& acc) {
  float s = 0.f;
  unsigned nf = 0;
  ZERO_UNROLL
  for (int j = 0; j < 8; ++j) {
    const float x = g[j] * scale;
    nf += IsNonFinite(x) ? 1u : 0u;
    s += x * x;
  }
  acc.sumsq += static_cast<double>(s);
  acc.nonfinite += nf;
}

// Thread `tid` of `nthreads` (grid-stride). Four vectors per iteration are loaded before any is used, so each
// thread keeps four 16-byte loads in flight.
template <class G>
ZERO_HD StatsPartial GradStatsThread(const void* grad, float scale, const VecPlan& plan, size_t tid, size_t nthreads) {
  StatsPartial acc;
  size_t k = tid;
  for (; k + 3 * nthreads < plan.nvec; k += 4 * nthreads) {
    float g[4][8];
    ZERO_UNROLL
    for (int u = 0; u < 4; ++u) Load8<G>(grad, plan.head + 8 * (k + u * nthreads), g[u]);
    ZERO_UNROLL
    for (int u = 0; u < 4; ++u) AddGroup8<G>(g[u], scale, acc);
  }
  for (; k < plan.nvec; k += nthreads) {
    float g[8];
    Load8<G>(grad, plan.head + 8 * k, g);
    AddGroup8<G>(g, scale, acc);
  }
  const size_t scalar_count = plan.ScalarCount();
  for (size_t s = tid; s < scalar_count; s += nthreads) {
    const float x = LoadOne<G>(grad, plan.ScalarIndex(s)) * scale;
    acc.nonfinite += IsNonFinite(x) ? 1u : 0u;
    acc.sumsq += static_cast<double>(x * x);
  }
  return acc;
}

}  // namespace zero::cuda::internal
