// Casts between f32, f16 and bf16 on the device. The bit manipulation is that of zero/dtype.h (shared through
// cuda/internal/device_math.cuh), so device and host casts agree bit for bit (tests/cuda/cast_test.cc).
#include <cuda_runtime.h>

#include "cuda/internal/convert.cuh"
#include "cuda/internal/launch.h"

namespace zero::cuda::internal {

namespace {

template <class S, class D>
__global__ void __launch_bounds__(kThreads) ConvertKernel(const void* src, void* dst, VecPlan plan) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t nthreads = static_cast<size_t>(gridDim.x) * blockDim.x;
  ConvertThread<S, D>(src, dst, plan, tid, nthreads);
}

template <class S, class D>
cudaError_t LaunchTyped(const void* src, void* dst, size_t n, cudaStream_t stream) {
  const PlanBuffer bufs[2] = {{src, sizeof(typename S::Elem)}, {dst, sizeof(typename D::Elem)}};
  const VecPlan plan = MakeVecPlan(bufs, 2, n);
  const size_t work = plan.nvec > plan.ScalarCount() ? plan.nvec : plan.ScalarCount();
  if (work == 0) return cudaSuccess;
  int wave = 0;
  if (cudaError_t e = FullWaveBlocks(reinterpret_cast<const void*>(&ConvertKernel<S, D>), kThreads, &wave);
      e != cudaSuccess) {
    return e;
  }
  size_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks > static_cast<size_t>(wave)) blocks = static_cast<size_t>(wave);
  ConvertKernel<S, D><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(src, dst, plan);
  return cudaGetLastError();
}

template <class S>
cudaError_t DispatchDst(const void* src, void* dst, Dt dt, size_t n, cudaStream_t stream) {
  switch (dt) {
    case Dt::kF32: return LaunchTyped<S, F32>(src, dst, n, stream);
    case Dt::kF16: return LaunchTyped<S, F16>(src, dst, n, stream);
    case Dt::kBF16: return LaunchTyped<S, BF16>(src, dst, n, stream);
  }
  return cudaErrorInvalidValue;
}

template <class S, class D>
__global__ void __launch_bounds__(kThreads) AddKernel(const void* src, void* dst, VecPlan plan) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t nthreads = static_cast<size_t>(gridDim.x) * blockDim.x;
  AddThread<S, D>(src, dst, plan, tid, nthreads);
}

__global__ void __launch_bounds__(kThreads) StochasticRoundKernel(const float* src, uint16_t* dst, size_t n,
                                                                  uint64_t mixed_key, int64_t first_index) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t nthreads = static_cast<size_t>(gridDim.x) * blockDim.x;
  StochasticRoundThread(src, dst, n, mixed_key, first_index, tid, nthreads);
}

// One full wave (at most) of `kernel` for `work` thread-items.
cudaError_t Blocks(const void* kernel, size_t work, unsigned* blocks) {
  int wave = 0;
  if (cudaError_t e = FullWaveBlocks(kernel, kThreads, &wave); e != cudaSuccess) return e;
  size_t b = (work + kThreads - 1) / kThreads;
  if (b > static_cast<size_t>(wave)) b = static_cast<size_t>(wave);
  *blocks = static_cast<unsigned>(b);
  return cudaSuccess;
}

template <class S, class D>
cudaError_t LaunchAddTyped(const void* src, void* dst, size_t n, cudaStream_t stream) {
  const PlanBuffer bufs[2] = {{src, sizeof(typename S::Elem)}, {dst, sizeof(typename D::Elem)}};
  const VecPlan plan = MakeVecPlan(bufs, 2, n);
  const size_t work = plan.nvec > plan.ScalarCount() ? plan.nvec : plan.ScalarCount();
  if (work == 0) return cudaSuccess;
  unsigned blocks = 0;
  if (cudaError_t e = Blocks(reinterpret_cast<const void*>(&AddKernel<S, D>), work, &blocks); e != cudaSuccess) {
    return e;
  }
  AddKernel<S, D><<<blocks, kThreads, 0, stream>>>(src, dst, plan);
  return cudaGetLastError();
}

template <class S>
cudaError_t DispatchAddDst(const void* src, void* dst, Dt dt, size_t n, cudaStream_t stream) {
  switch (dt) {
    case Dt::kF32: return LaunchAddTyped<S, F32>(src, dst, n, stream);
    case Dt::kF16: return LaunchAddTyped<S, F16>(src, dst, n, stream);
    case Dt::kBF16: return LaunchAddTyped<S, BF16>(src, dst, n, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchAdd(const void* d_src, Dt st, void* d_dst, Dt dt, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (st) {
    case Dt::kF32: return DispatchAddDst<F32>(d_src, d_dst, dt, n, stream);
    case Dt::kF16: return DispatchAddDst<F16>(d_src, d_dst, dt, n, stream);
    case Dt::kBF16: return DispatchAddDst<BF16>(d_src, d_dst, dt, n, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchStochasticRound(const float* d_src, uint16_t* d_dst, size_t n, uint64_t key, int64_t first_index,
                                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  unsigned blocks = 0;
  if (cudaError_t e = Blocks(reinterpret_cast<const void*>(&StochasticRoundKernel), n, &blocks); e != cudaSuccess) {
    return e;
  }
  StochasticRoundKernel<<<blocks, kThreads, 0, stream>>>(d_src, d_dst, n, SplitMix(key), first_index);
  return cudaGetLastError();
}

cudaError_t LaunchConvert(const void* d_src, Dt st, void* d_dst, Dt dt, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (st == dt) return cudaMemcpyAsync(d_dst, d_src, n * DtSize(st), cudaMemcpyDeviceToDevice, stream);
  switch (st) {
    case Dt::kF32: return DispatchDst<F32>(d_src, d_dst, dt, n, stream);
    case Dt::kF16: return DispatchDst<F16>(d_src, d_dst, dt, n, stream);
    case Dt::kBF16: return DispatchDst<BF16>(d_src, d_dst, dt, n, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace zero::cuda::internal
