// Device helpers for the GPU tests (compiled by nvcc; the tests themselves are plain C++).
#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/internal/fused_kernel.cuh"
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

namespace {

namespace in = ::zero::cuda::internal;

// Calls f(tag) with the gradient and write-back type tags of (grad, out); false when the pair is not one of
// LaunchAdamVariant's.
template <class F>
bool WithTypes(in::Dt grad, in::OutDt out, F&& f) {
  if (grad == in::Dt::kF32 && out == in::OutDt::kNone) {
    f(in::F32{}, in::NoOut{});
  } else if (grad == in::Dt::kBF16 && out == in::OutDt::kBF16) {
    f(in::BF16{}, in::BF16{});
  } else if (grad == in::Dt::kF32 && out == in::OutDt::kBF16) {
    f(in::F32{}, in::BF16{});
  } else if (grad == in::Dt::kF16 && out == in::OutDt::kF32) {
    f(in::F16{}, in::F32{});
  } else {
    return false;
  }
  return true;
}

}  // namespace

int FusedVariantCount() {
  int count = 1;
  in::ForEachFusedVariant([&](auto) { ++count; });
  return count;
}

std::string FusedVariantName(int variant) {
  if (variant == 0) return "v1";
  std::string name;
  int i = 0;
  in::ForEachFusedVariant([&](auto v) {
    using V = decltype(v);
    if (++i != variant) return;
    const char* hint = V::kHint == in::CacheHint::kDefault     ? ""
                       : V::kHint == in::CacheHint::kStreaming ? " cs"
                                                               : " cs+L2::256B";
    name =
        std::string(V::kLayout == in::FusedLayout::kVec8 ? "vec8" : "quad") + " x" + std::to_string(V::kUnits) + hint;
  });
  return name;
}

cudaError_t LaunchAdamVariant(int variant, bool one_pass, const in::FusedArgs& a, in::Dt grad, in::OutDt out,
                              const in::AdamOp& op, cudaStream_t stream) {
  cudaError_t result = cudaErrorInvalidValue;
  const bool known = WithTypes(grad, out, [&](auto gtag, auto ptag) {
    using G = decltype(gtag);
    using P = decltype(ptag);
    if (variant == 0) {
      result = in::LaunchFusedV1<G, P, in::AdamOp>(a, op, stream);
      return;
    }
    int i = 0;
    in::ForEachFusedVariant([&](auto v) {
      if (++i != variant) return;
      result = in::LaunchFusedTiled<G, P, in::AdamOp, decltype(v)>(
          a, op, one_pass ? in::FusedGrid::kOnePass : in::FusedGrid::kFullWave, stream);
    });
  });
  return known ? result : cudaErrorInvalidValue;
}

cudaError_t LaunchSpinUntilFlag(const volatile int* d_flag, unsigned long long max_ns, cudaStream_t stream) {
  SpinUntilFlagKernel<<<1, 1, 0, stream>>>(d_flag, max_ns);
  return cudaGetLastError();
}

}  // namespace zero::testing_cuda
