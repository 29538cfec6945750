// The per-thread body of the dtype conversion kernel (src/cuda/cast.cu), shared with the CPU emulation test.
#pragma once

#include "cuda/internal/device_math.cuh"

namespace zero::cuda::internal {

// Converts the elements of thread `tid` of `nthreads`: 8-wide 16-byte accesses over the plan's body, one at a
// time over its head and tail. Bit for bit the host ConvertBuffer (the conversions are those of dtype.h).
template <class S, class D>
ZERO_HD void ConvertThread(const void* src, void* dst, const VecPlan& plan, size_t tid, size_t nthreads) {
  for (size_t k = tid; k < plan.nvec; k += nthreads) {
    float v[8];
    Load8<S>(src, plan.head + 8 * k, v);
    Store8<D>(dst, plan.head + 8 * k, v);
  }
  const size_t scalar_count = plan.ScalarCount();
  for (size_t k = tid; k < scalar_count; k += nthreads) {
    const size_t e = plan.ScalarIndex(k);
    StoreOne<D>(dst, e, LoadOne<S>(src, e));
  }
}

}  // namespace zero::cuda::internal

namespace zero::cuda::internal {

// dst[i] = D(dst[i] + src[i]) for the elements of thread `tid`: the sum in f32 (one _rn add), rounded once to
// D. The engine's "land by adding" of a reduced gradient shard and its fp32 accumulation of 16-bit gradients;
// bit for bit the host engine's LandOnHost(..., add=true) (src/shard/host_compute.cc).
template <class S, class D>
ZERO_HD void AddThread(const void* src, void* dst, const VecPlan& plan, size_t tid, size_t nthreads) {
  for (size_t k = tid; k < plan.nvec; k += nthreads) {
    float a[8], b[8];
    Load8<D>(dst, plan.head + 8 * k, a);
    Load8<S>(src, plan.head + 8 * k, b);
    ZERO_UNROLL
    for (int j = 0; j < 8; ++j) a[j] = FAdd(a[j], b[j]);
    Store8<D>(dst, plan.head + 8 * k, a);
  }
  const size_t scalar_count = plan.ScalarCount();
  for (size_t k = tid; k < scalar_count; k += nthreads) {
    const size_t e = plan.ScalarIndex(k);
    StoreOne<D>(dst, e, FAdd(LoadOne<D>(dst, e), LoadOne<S>(src, e)));
  }
}

// splitmix64's finalizer, as in src/mixed_precision/stochastic_rounding.cc (the host's StochasticRoundToBF16).
ZERO_HD uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Stochastic rounding of fp32 to bf16 for the elements of thread `tid`, bit for bit the host's
// StochasticRoundToBF16(src, dst, n, key, first_index) with mixed_key = SplitMix(key): 16 random bits of
// SplitMix(mixed_key ^ (first_index + i)) are added below the kept 16 and the sum truncated; inf/NaN round to
// nearest even.
ZERO_HD void StochasticRoundThread(const float* src, uint16_t* dst, size_t n, uint64_t mixed_key, int64_t first_index,
                                   size_t tid, size_t nthreads) {
  for (size_t i = tid; i < n; i += nthreads) {
    const uint32_t u = Bits(src[i]);
    if ((u & 0x7F800000u) == 0x7F800000u) {
      dst[i] = F32ToBF16(src[i]);
      continue;
    }
    const uint32_t r =
        static_cast<uint32_t>(SplitMix(mixed_key ^ static_cast<uint64_t>(first_index + static_cast<int64_t>(i)))) &
        0xFFFFu;
    dst[i] = static_cast<uint16_t>((u + r) >> 16);
  }
}

}  // namespace zero::cuda::internal
