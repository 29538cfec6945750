#include "core/internal/cuda_backend.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "zero/features.h"

namespace zero::internal {

namespace {
// Constant-initialized, so a registration that runs during static initialization (in any order relative to
// this file's) finds it ready.
std::atomic<const CudaBackend*> g_backend{nullptr};
}  // namespace

void RegisterCudaBackend(const CudaBackend* backend) { g_backend.store(backend, std::memory_order_release); }

const CudaBackend* GetCudaBackend() { return g_backend.load(std::memory_order_acquire); }

Status CudaNotLinkedError(const std::string& what) {
#if ZERO_HAVE_CUDA
  return absl::UnimplementedError(absl::StrCat(
      what,
      ": the CUDA path is not linked into this program: link zero::cuda (find_package(zero COMPONENTS cuda), "
      "target_link_libraries(<target> zero::cuda))"));
#else
  return absl::UnimplementedError(
      absl::StrCat(what, ": zero was built without CUDA (ZERO_ENABLE_CUDA=OFF or no nvcc)"));
#endif
}

}  // namespace zero::internal
