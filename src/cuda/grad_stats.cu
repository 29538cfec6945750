// GradStats: sum of squares and non-finite count of scale * grad in one read of the gradient.
//
// Two launches on the caller's stream, no atomics: pass 1 (a grid that depends only on n and the buffer's
// alignment) leaves one partial per block in the caller's workspace, pass 2 (one block) reduces the partials
// in index order. CUB's block reductions are fixed trees, so the same buffer gives the same bits every run.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

#include "cuda/internal/launch.h"

namespace zero::cuda::internal {

namespace {

template <class G>
__global__ void __launch_bounds__(kThreads)
    StatsPartialKernel(const void* grad, float scale, VecPlan plan, double* part_sum, unsigned long long* part_nf) {
  using SumReduce = cub::BlockReduce<double, kThreads>;
  using CountReduce = cub::BlockReduce<unsigned long long, kThreads>;
  __shared__ union {
    typename SumReduce::TempStorage sum;
    typename CountReduce::TempStorage count;
  } tmp;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t nthreads = static_cast<size_t>(gridDim.x) * blockDim.x;
  const StatsPartial acc = GradStatsThread<G>(grad, scale, plan, tid, nthreads);
  const double s = SumReduce(tmp.sum).Sum(acc.sumsq);
  __syncthreads();  // tmp is reused
  const unsigned long long nf = CountReduce(tmp.count).Sum(acc.nonfinite);
  if (threadIdx.x == 0) {
    part_sum[blockIdx.x] = s;
    part_nf[blockIdx.x] = nf;
  }
}

__global__ void __launch_bounds__(kStatsMaxBlocks)
    StatsFinalKernel(const double* part_sum, const unsigned long long* part_nf, int nparts, StatsResult* out,
                     bool accumulate) {
  using SumReduce = cub::BlockReduce<double, kStatsMaxBlocks>;
  using CountReduce = cub::BlockReduce<unsigned long long, kStatsMaxBlocks>;
  __shared__ union {
    typename SumReduce::TempStorage sum;
    typename CountReduce::TempStorage count;
  } tmp;
  const int i = static_cast<int>(threadIdx.x);
  const double s = SumReduce(tmp.sum).Sum(i < nparts ? part_sum[i] : 0.0);
  __syncthreads();
  const unsigned long long nf = CountReduce(tmp.count).Sum(i < nparts ? part_nf[i] : 0ull);
  if (i == 0) {
    if (accumulate) {
      out->sumsq += s;
      out->nonfinite += nf;
    } else {
      out->sumsq = s;
      out->nonfinite = nf;
    }
  }
}

template <class G>
cudaError_t LaunchTyped(const void* grad, size_t n, float scale, StatsResult* out, bool accumulate, void* workspace,
                        cudaStream_t stream) {
  double* part_sum = static_cast<double*>(workspace);
  unsigned long long* part_nf = reinterpret_cast<unsigned long long*>(part_sum + kStatsMaxBlocks);
  int blocks = 0;
  if (n > 0) {
    const PlanBuffer buf{grad, sizeof(typename G::Elem)};
    const VecPlan plan = MakeVecPlan(&buf, 1, n);
    const size_t work = plan.nvec > plan.ScalarCount() ? plan.nvec : plan.ScalarCount();
    const size_t want = (work + kThreads - 1) / kThreads;
    blocks = static_cast<int>(want < static_cast<size_t>(kStatsMaxBlocks) ? want : kStatsMaxBlocks);
    StatsPartialKernel<G><<<blocks, kThreads, 0, stream>>>(grad, scale, plan, part_sum, part_nf);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  StatsFinalKernel<<<1, kStatsMaxBlocks, 0, stream>>>(part_sum, part_nf, blocks, out, accumulate);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGradStats(const void* d_grad, Dt dt, size_t n, float scale, StatsResult* d_out, bool accumulate,
                            void* d_workspace, cudaStream_t stream) {
  switch (dt) {
    case Dt::kF32: return LaunchTyped<F32>(d_grad, n, scale, d_out, accumulate, d_workspace, stream);
    case Dt::kF16: return LaunchTyped<F16>(d_grad, n, scale, d_out, accumulate, d_workspace, stream);
    case Dt::kBF16: return LaunchTyped<BF16>(d_grad, n, scale, d_out, accumulate, d_workspace, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace zero::cuda::internal
