// Device helpers for the GPU tests (compiled by nvcc; the tests themselves are plain C++).
#include <cuda_runtime.h>

#include "test_kernels.h"

namespace zero::testing_cuda {

namespace {

// Spins until *flag != 0 (written by the host into mapped pinned memory) or max_ns have passed, so a test can
// hold a stream busy for exactly as long as it needs, independent of timing. The timeout only guards
// against a broken test hanging the GPU.
__global__ void SpinUntilFlagKernel(const volatile int* flag, unsigned long long max_ns) {
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (*flag == 0) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > max_ns) break;
    __nanosleep(1000);
  }
}

}  // namespace

cudaError_t LaunchSpinUntilFlag(const volatile int* d_flag, unsigned long long max_ns, cudaStream_t stream) {
  SpinUntilFlagKernel<<<1, 1, 0, stream>>>(d_flag, max_ns);
  return cudaGetLastError();
}

}  // namespace zero::testing_cuda
