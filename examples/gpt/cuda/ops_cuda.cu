// The GPT's layer ops on the device: ops_impl.h's compositions run by the device executor, plus the one seam
// where CUDA and cuBLAS error codes become Status.
#include <limits>

#include "absl/strings/str_cat.h"
#include "gpt/cuda/device_exec.cuh"
#include "gpt/cuda/ops_cuda.h"
#include "gpt/cuda/ops_impl.h"

namespace zero::gpt::cuda {

// ---- error seam ------------------------------------------------------------------------------------------

namespace internal {

Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", cublasGetStatusName(s), " (", cublasGetStatusString(s), ")");
  switch (s) {
    case CUBLAS_STATUS_INVALID_VALUE: return absl::InvalidArgumentError(msg);
    case CUBLAS_STATUS_ALLOC_FAILED: return absl::ResourceExhaustedError(msg);
    case CUBLAS_STATUS_NOT_INITIALIZED: return absl::FailedPreconditionError(msg);
    default: return absl::InternalError(msg);
  }
}

// ---- GEMM ------------------------------------------------------------------------------------------------

Status DeviceExec::Gemm(const body::GemmCall& g) {
  if (handle_ == nullptr) return absl::InvalidArgumentError("GEMM needs a cublasHandle_t, got null");
  // The handle's settings decide what cuBLAS does with this call; check the three that would silently change
  // the results or race: the stream (GEMMs must be ordered with this executor's kernels), the pointer mode
  // (alpha and beta live on the host), and the math mode (TF32 would round the inputs to 10 mantissa bits).
  cudaStream_t handle_stream = nullptr;
  ZERO_RETURN_IF_ERROR(CublasStatus(cublasGetStream(handle_, &handle_stream), "cublasGetStream"));
  if (handle_stream != stream_) {
    return absl::FailedPreconditionError("cuBLAS handle is bound to another stream (call cublasSetStream first)");
  }
  cublasPointerMode_t pointer_mode;
  ZERO_RETURN_IF_ERROR(CublasStatus(cublasGetPointerMode(handle_, &pointer_mode), "cublasGetPointerMode"));
  if (pointer_mode != CUBLAS_POINTER_MODE_HOST) {
    return absl::FailedPreconditionError("cuBLAS handle must be in CUBLAS_POINTER_MODE_HOST");
  }
  cublasMath_t math_mode;
  ZERO_RETURN_IF_ERROR(CublasStatus(cublasGetMathMode(handle_, &math_mode), "cublasGetMathMode"));
  const int base_mode = static_cast<int>(math_mode) & 0xF;
  if (base_mode != CUBLAS_DEFAULT_MATH && base_mode != CUBLAS_PEDANTIC_MATH) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuBLAS handle math mode ", static_cast<int>(math_mode),
                     " may use TF32; use CUBLAS_DEFAULT_MATH or CUBLAS_PEDANTIC_MATH"));
  }
  for (int64_t d : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batch}) {
    if (d < 0 || d > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("GEMM dimension ", d, " outside [0, 2^31)"));
    }
  }
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  const int lda = static_cast<int>(g.lda), ldb = static_cast<int>(g.ldb), ldc = static_cast<int>(g.ldc);
  if (g.batch == 1) {
    return CublasStatus(cublasSgemm(handle_, ta, tb, m, n, k, &g.alpha, g.a, lda, g.b, ldb, &g.beta, g.c, ldc),
                        "cublasSgemm");
  }
  return CublasStatus(cublasSgemmStridedBatched(handle_, ta, tb, m, n, k, &g.alpha, g.a, lda, g.stride_a, g.b, ldb,
                                                g.stride_b, &g.beta, g.c, ldc, g.stride_c, static_cast<int>(g.batch)),
                      "cublasSgemmStridedBatched");
}

}  // namespace internal

// ---- public ops ------------------------------------------------------------------------------------------

using internal::DeviceExec;

Status MatmulForward(const float* d_x, const float* d_w, const float* d_b, int64_t N, int64_t IC, int64_t OC,
                     float* d_y, cublasHandle_t handle, cudaStream_t stream) {
  DeviceExec ex(handle, stream);
  return impl::MatmulForward(ex, d_x, d_w, d_b, N, IC, OC, d_y);
}

Status MatmulBackward(const float* d_dy, const float* d_x, const float* d_w, int64_t N, int64_t IC, int64_t OC,
                      float* d_dx, float* d_dw, float* d_db, cublasHandle_t handle, cudaStream_t stream) {
  DeviceExec ex(handle, stream);
  return impl::MatmulBackward(ex, d_dy, d_x, d_w, N, IC, OC, d_dx, d_dw, d_db);
}

Status TiedHeadForward(const float* d_x, const float* d_wte, int64_t N, int64_t C, int64_t V, float* d_logits,
                       cublasHandle_t handle, cudaStream_t stream) {
  DeviceExec ex(handle, stream);
  return impl::TiedHeadForward(ex, d_x, d_wte, N, C, V, d_logits);
}

Status TiedHeadBackward(const float* d_dlogits, const float* d_x, const float* d_wte, int64_t N, int64_t C, int64_t V,
                        float* d_dx, float* d_dwte, cublasHandle_t handle, cudaStream_t stream) {
  DeviceExec ex(handle, stream);
  return impl::TiedHeadBackward(ex, d_dlogits, d_x, d_wte, N, C, V, d_dx, d_dwte);
}

Status LayerNormForward(const float* d_x, const float* d_w, const float* d_b, int64_t N, int64_t C, float* d_y,
                        float* d_mean, float* d_rstd, cudaStream_t stream) {
  DeviceExec ex(nullptr, stream);
  return impl::LayerNormForward(ex, d_x, d_w, d_b, N, C, d_y, d_mean, d_rstd);
}

Status LayerNormBackward(const float* d_dy, const float* d_x, const float* d_w, const float* d_mean,
                         const float* d_rstd, int64_t N, int64_t C, float* d_dx, float* d_dw, float* d_db,
                         cudaStream_t stream) {
  DeviceExec ex(nullptr, stream);
  return impl::LayerNormBackward(ex, d_dy, d_x, d_w, d_mean, d_rstd, N, C, d_dx, d_dw, d_db);
}

Status GeluForward(const float* d_x, int64_t n, float* d_y, cudaStream_t stream) {
  DeviceExec ex(nullptr, stream);
  return impl::GeluForward(ex, d_x, n, d_y);
}

Status GeluBackward(const float* d_dy, const float* d_x, int64_t n, float* d_dx, cudaStream_t stream) {
  DeviceExec ex(nullptr, stream);
  return impl::GeluBackward(ex, d_dy, d_x, n, d_dx);
}

Status ResidualForward(const float* d_a, const float* d_b, int64_t n, float* d_y, cudaStream_t stream) {
  DeviceExec ex(nullptr, stream);
  return impl::ResidualForward(ex, d_a, d_b, n, d_y);
}

Status AttentionForward(const float* d_qkv, int B, int T, int C, int NH, float* d_att, float* d_y,
                        cublasHandle_t handle, cudaStream_t stream) {
  DeviceExec ex(handle, stream);
  return impl::AttentionForward(ex, d_qkv, B, T, C, NH, d_att, d_y);
}

Status AttentionBackward(const float* d_dy, const float* d_qkv, const float* d_att, int B, int T, int C, int NH,
                         float* d_dqkv, float* d_scratch, cublasHandle_t handle, cudaStream_t stream) {
  DeviceExec ex(handle, stream);
  return impl::AttentionBackward(ex, d_dy, d_qkv, d_att, B, T, C, NH, d_dqkv, d_scratch);
}

Status SoftmaxCrossEntropyForward(const float* d_logits, const int32_t* d_targets, int64_t N, int64_t V, float* d_probs,
                                  float* d_loss, double* d_row_loss, cudaStream_t stream) {
  DeviceExec ex(nullptr, stream);
  return impl::SoftmaxCrossEntropyForward(ex, d_logits, d_targets, N, V, d_probs, d_loss, d_row_loss);
}

Status SoftmaxCrossEntropyBackward(const float* d_probs, const int32_t* d_targets, int64_t N, int64_t V,
                                   float* d_dlogits, cudaStream_t stream) {
  DeviceExec ex(nullptr, stream);
  return impl::SoftmaxCrossEntropyBackward(ex, d_probs, d_targets, N, V, d_dlogits);
}

}  // namespace zero::gpt::cuda
