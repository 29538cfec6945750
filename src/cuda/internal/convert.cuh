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
