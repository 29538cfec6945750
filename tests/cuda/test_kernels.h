// Device helpers for the GPU tests (implemented in test_kernels.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "cuda/internal/launch.h"

namespace zero::testing_cuda {

// The fused-step variants zero-bench-gpu times (src/cuda/internal/fused_kernel.cuh), so the GPU test can check
// each against the host optimizer: variant 0 is the first version, 1.. FusedVariantCount() - 1 the tiled
// variants of ForEachFusedVariant, in order.
int FusedVariantCount();
std::string FusedVariantName(int variant);

// One Adam/AdamW step with fused-step variant `variant` (on a one-pass grid when `one_pass`, else a full wave;
// the first version always takes a full wave). Implemented for the (gradient, write-back) pairs the bench
// times plus f16 -> f32: (f32, none), (bf16, bf16), (f32, bf16), (f16, f32); others return
// cudaErrorInvalidValue.
cudaError_t LaunchAdamVariant(int variant, bool one_pass, const cuda::internal::FusedArgs& a, cuda::internal::Dt grad,
                              cuda::internal::OutDt out, const cuda::internal::AdamOp& op, cudaStream_t stream);

// Enqueues a one-thread kernel on `stream` that runs until *d_flag becomes non-zero (d_flag: the device
// address of mapped pinned host memory) or max_ns nanoseconds have passed.
cudaError_t LaunchSpinUntilFlag(const volatile int* d_flag, unsigned long long max_ns, cudaStream_t stream);

// A flag in mapped pinned memory that the host sets and a device kernel polls. Set() releases the kernel.
class HostFlag {
 public:
  HostFlag() {
    void* h = nullptr;
    void* d = nullptr;
    if (cudaHostAlloc(&h, sizeof(int), cudaHostAllocMapped) == cudaSuccess) {
      host_ = static_cast<volatile int*>(h);
      *host_ = 0;
      if (cudaHostGetDevicePointer(&d, h, 0) == cudaSuccess) device_ = static_cast<volatile int*>(d);
    }
  }
  ~HostFlag() {
    Set();  // never leave a kernel spinning
    if (host_) cudaFreeHost(const_cast<int*>(host_));
  }
  HostFlag(const HostFlag&) = delete;
  HostFlag& operator=(const HostFlag&) = delete;
  bool ok() const { return device_ != nullptr; }
  void Set() {
    if (host_) *host_ = 1;
  }
  const volatile int* device() const { return device_; }

 private:
  volatile int* host_ = nullptr;
  volatile int* device_ = nullptr;
};

}  // namespace zero::testing_cuda
