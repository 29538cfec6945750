// The public, Status-returning face of zero's CUDA kernels (zero/advanced/cuda_kernels.h): argument checks on the
// host, then the absl-free launchers of cuda/internal/launch.h. CUDA errors become Status here and only here.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "cuda/internal/launch.h"
#include "zero/advanced/cuda_kernels.h"

namespace zero::cuda {

namespace in = ::zero::cuda::internal;

static_assert(static_cast<int>(in::Dt::kF32) == static_cast<int>(DType::kF32));
static_assert(static_cast<int>(in::Dt::kF16) == static_cast<int>(DType::kF16));
static_assert(static_cast<int>(in::Dt::kBF16) == static_cast<int>(DType::kBF16));
static_assert(kGradStatsWorkspaceBytes >= in::kStatsWorkspaceBytes);
static_assert(kCopySegmentsPerLaunch == static_cast<size_t>(in::kCopySegmentsPerLaunch));
static_assert(sizeof(GradStatsResult) == sizeof(in::StatsResult));
static_assert(offsetof(GradStatsResult, nonfinite) == offsetof(in::StatsResult, nonfinite));

namespace {

Status LaunchStatus(cudaError_t e, const char* what, size_t n) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, " (n=", n, "): CUDA error ", static_cast<int>(e), " ",
                                          cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

bool ValidDType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// True when [a, a + an) and [b, b + bn) share a byte.
bool Overlaps(const void* a, size_t an, const void* b, size_t bn) {
  if (a == nullptr || b == nullptr || an == 0 || bn == 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}

// Checks the parts of a ShardUpdate both optimizers share and fills the launcher's arguments.
Status PrepareShard(const char* op, const ShardUpdate& u, int states, in::FusedArgs* a, in::Dt* grad_dt,
                    in::OutDt* out_dt) {
  if (u.master == nullptr || u.grad == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": master and grad must be device pointers (n=", u.n, ")"));
  }
  if (!ValidDType(u.grad_dtype)) return absl::InvalidArgumentError(absl::StrCat(op, ": invalid grad_dtype"));
  if (u.param_out != nullptr && !ValidDType(u.param_out_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": invalid param_out_dtype"));
  }
  if (states > 0 && u.state == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": state must point to ", states, " device buffers"));
  }
  for (int s = 0; s < states; ++s) {
    if (u.state[s] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": state[", s, "] is null"));
    }
  }
  if (u.step < 1) return absl::InvalidArgumentError(absl::StrCat(op, ": step must be >= 1, got ", u.step));
  if (!(u.lr >= 0.0f)) return absl::InvalidArgumentError(absl::StrCat(op, ": lr must be >= 0, got ", u.lr));
  if (u.param_out == u.master) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": param_out must not be master (pass param_out = nullptr to update master only)"));
  }
  // The kernel reads and writes each element in one thread, but its 16-byte accesses assume distinct buffers.
  struct Range {
    const char* name;
    const void* p;
    size_t bytes;
  } ranges[5] = {{"master", u.master, u.n * 4},
                 {"grad", u.grad, u.n * DTypeSize(u.grad_dtype)},
                 {"state[0]", states >= 1 ? u.state[0] : nullptr, u.n * 4},
                 {"state[1]", states >= 2 ? u.state[1] : nullptr, u.n * 4},
                 {"param_out", u.param_out, u.param_out ? u.n * DTypeSize(u.param_out_dtype) : 0}};
  for (int i = 0; i < 5; ++i) {
    for (int j = i + 1; j < 5; ++j) {
      if (Overlaps(ranges[i].p, ranges[i].bytes, ranges[j].p, ranges[j].bytes)) {
        return absl::InvalidArgumentError(
            absl::StrCat(op, ": buffers ", ranges[i].name, " and ", ranges[j].name, " overlap (n=", u.n, ")"));
      }
    }
  }
  a->master = u.master;
  a->grad = u.grad;
  a->grad_scale = u.grad_scale;
  a->state[0] = states >= 1 ? u.state[0] : nullptr;
  a->state[1] = states >= 2 ? u.state[1] : nullptr;
  a->param_out = u.param_out;
  *grad_dt = static_cast<in::Dt>(u.grad_dtype);
  *out_dt = u.param_out == nullptr ? in::OutDt::kNone : static_cast<in::OutDt>(u.param_out_dtype);
  a->plan = in::MakeFusedPlan(*a, *grad_dt, *out_dt, states, u.n);
  return absl::OkStatus();
}

}  // namespace

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the "no device" / "no driver" error so later calls don't report it
    return 0;
  }
  return n;
}

Status Convert(const void* d_src, DType st, void* d_dst, DType dt, size_t n, Stream stream) {
  if (n == 0) return absl::OkStatus();
  if (!ValidDType(st) || !ValidDType(dt)) return absl::InvalidArgumentError("Convert: invalid dtype");
  if (d_src == nullptr || d_dst == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("Convert: null pointer (n=", n, ")"));
  }
  return LaunchStatus(in::LaunchConvert(d_src, static_cast<in::Dt>(st), d_dst, static_cast<in::Dt>(dt), n, stream),
                      "Convert", n);
}

Status Add(const void* d_src, DType st, void* d_dst, DType dt, size_t n, Stream stream) {
  if (n == 0) return absl::OkStatus();
  if (!ValidDType(st) || !ValidDType(dt)) return absl::InvalidArgumentError("Add: invalid dtype");
  if (d_src == nullptr || d_dst == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("Add: null pointer (n=", n, ")"));
  }
  return LaunchStatus(in::LaunchAdd(d_src, static_cast<in::Dt>(st), d_dst, static_cast<in::Dt>(dt), n, stream), "Add",
                      n);
}

Status StochasticRoundToBF16(const float* d_src, uint16_t* d_dst, size_t n, uint64_t key, int64_t first_index,
                             Stream stream) {
  if (n == 0) return absl::OkStatus();
  if (d_src == nullptr || d_dst == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("StochasticRoundToBF16: null pointer (n=", n, ")"));
  }
  return LaunchStatus(in::LaunchStochasticRound(d_src, d_dst, n, key, first_index, stream), "StochasticRoundToBF16", n);
}

Status QuantizeInt8(const void* d_x, DType t, size_t n, size_t block, int8_t* d_q, float* d_scales, Stream stream) {
  if (!ValidDType(t)) return absl::InvalidArgumentError("QuantizeInt8: invalid dtype");
  if (block == 0) return absl::InvalidArgumentError("QuantizeInt8: block must be >= 1");
  if (n == 0) return absl::OkStatus();
  if (d_x == nullptr || d_q == nullptr || d_scales == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("QuantizeInt8: null pointer (n=", n, ")"));
  }
  const size_t scale_bytes = in::QuantBlockCount(n, block) * sizeof(float);
  const size_t x_bytes = n * DTypeSize(t);
  if (Overlaps(d_x, x_bytes, d_q, n) || Overlaps(d_x, x_bytes, d_scales, scale_bytes) ||
      Overlaps(d_q, n, d_scales, scale_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("QuantizeInt8: overlapping buffers (n=", n, ")"));
  }
  return LaunchStatus(in::LaunchQuantizeInt8(d_x, static_cast<in::Dt>(t), n, block, d_q, d_scales, stream),
                      "QuantizeInt8", n);
}

Status DequantizeInt8(const int8_t* d_q, const float* d_scales, size_t n, size_t block, void* d_out, DType t,
                      Stream stream) {
  if (!ValidDType(t)) return absl::InvalidArgumentError("DequantizeInt8: invalid dtype");
  if (block == 0) return absl::InvalidArgumentError("DequantizeInt8: block must be >= 1");
  if (n == 0) return absl::OkStatus();
  if (d_q == nullptr || d_scales == nullptr || d_out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("DequantizeInt8: null pointer (n=", n, ")"));
  }
  const size_t scale_bytes = in::QuantBlockCount(n, block) * sizeof(float);
  const size_t out_bytes = n * DTypeSize(t);
  if (Overlaps(d_out, out_bytes, d_q, n) || Overlaps(d_out, out_bytes, d_scales, scale_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("DequantizeInt8: overlapping buffers (n=", n, ")"));
  }
  return LaunchStatus(in::LaunchDequantizeInt8(d_q, d_scales, n, block, d_out, static_cast<in::Dt>(t), stream),
                      "DequantizeInt8", n);
}

Status QuantizeInt4(const float* d_x, size_t n, size_t block, uint8_t* d_q, float* d_scales, float* d_scratch,
                    Stream stream) {
  if (block == 0) return absl::InvalidArgumentError("QuantizeInt4: block must be >= 1");
  if (n == 0) return absl::OkStatus();
  if (d_x == nullptr || d_q == nullptr || d_scales == nullptr || d_scratch == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("QuantizeInt4: null pointer (n=", n, ")"));
  }
  const size_t blocks = in::QuantBlockCount(n, block) * sizeof(float), codes = (n + 1) / 2;
  if (Overlaps(d_x, n * 4, d_q, codes) || Overlaps(d_x, n * 4, d_scales, blocks) ||
      Overlaps(d_x, n * 4, d_scratch, blocks) || Overlaps(d_q, codes, d_scales, blocks) ||
      Overlaps(d_q, codes, d_scratch, blocks) || Overlaps(d_scales, blocks, d_scratch, blocks)) {
    return absl::InvalidArgumentError(absl::StrCat("QuantizeInt4: overlapping buffers (n=", n, ")"));
  }
  return LaunchStatus(in::LaunchQuantizeInt4(d_x, n, block, d_q, d_scales, d_scratch, stream), "QuantizeInt4", n);
}

Status DequantizeInt4(const uint8_t* d_q, const float* d_scales, size_t n, size_t block, float* d_out, Stream stream) {
  if (block == 0) return absl::InvalidArgumentError("DequantizeInt4: block must be >= 1");
  if (n == 0) return absl::OkStatus();
  if (d_q == nullptr || d_scales == nullptr || d_out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("DequantizeInt4: null pointer (n=", n, ")"));
  }
  const size_t blocks = in::QuantBlockCount(n, block) * sizeof(float);
  if (Overlaps(d_out, n * 4, d_q, (n + 1) / 2) || Overlaps(d_out, n * 4, d_scales, blocks)) {
    return absl::InvalidArgumentError(absl::StrCat("DequantizeInt4: overlapping buffers (n=", n, ")"));
  }
  return LaunchStatus(in::LaunchDequantizeInt4(d_q, d_scales, n, block, d_out, stream), "DequantizeInt4", n);
}

Status LocoResidual(const float* d_y, const float* d_sent, float* d_e, float beta, size_t n, Stream stream) {
  if (n == 0) return absl::OkStatus();
  if (d_y == nullptr || d_sent == nullptr || d_e == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("LocoResidual: null pointer (n=", n, ")"));
  }
  if (Overlaps(d_e, n * 4, d_y, n * 4) || Overlaps(d_e, n * 4, d_sent, n * 4)) {
    return absl::InvalidArgumentError(absl::StrCat("LocoResidual: overlapping buffers (n=", n, ")"));
  }
  return LaunchStatus(in::LaunchLocoResidual(d_y, d_sent, d_e, beta, n, stream), "LocoResidual", n);
}

Status Divide(const float* d_src, float* d_dst, float divisor, size_t n, Stream stream) {
  if (n == 0) return absl::OkStatus();
  if (d_src == nullptr || d_dst == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("Divide: null pointer (n=", n, ")"));
  }
  if (d_src != d_dst && Overlaps(d_src, n * 4, d_dst, n * 4)) {
    return absl::InvalidArgumentError(absl::StrCat("Divide: partly overlapping buffers (n=", n, ")"));
  }
  return LaunchStatus(in::LaunchDivide(d_src, d_dst, divisor, n, stream), "Divide", n);
}

Status AdamStep(const ShardUpdate& u, const AdamParams& p, Stream stream) {
  if (!(p.beta1 >= 0.0f && p.beta1 < 1.0f) || !(p.beta2 >= 0.0f && p.beta2 < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamStep: optimizer.params.betas must be in [0, 1), got ", p.beta1, ", ", p.beta2));
  }
  if (!(p.eps >= 0.0f)) return absl::InvalidArgumentError("AdamStep: optimizer.params.eps must be >= 0");
  if (!(p.weight_decay >= 0.0f)) {
    return absl::InvalidArgumentError("AdamStep: optimizer.params.weight_decay must be >= 0");
  }
  if (u.n == 0) return absl::OkStatus();
  in::FusedArgs a;
  in::Dt grad_dt;
  in::OutDt out_dt;
  ZERO_RETURN_IF_ERROR(PrepareShard("AdamStep", u, 2, &a, &grad_dt, &out_dt));
  const in::AdamOp op = in::MakeAdamOp(u.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.decoupled_weight_decay,
                                       p.bias_correction, u.step);
  return LaunchStatus(in::LaunchAdam(a, grad_dt, out_dt, op, stream), "AdamStep launch", u.n);
}

Status SgdStep(const ShardUpdate& u, const SgdParams& p, Stream stream) {
  if (!(p.momentum >= 0.0f)) return absl::InvalidArgumentError("SgdStep: optimizer.params.momentum must be >= 0");
  if (!(p.weight_decay >= 0.0f)) {
    return absl::InvalidArgumentError("SgdStep: optimizer.params.weight_decay must be >= 0");
  }
  if (p.nesterov && (p.momentum <= 0.0f || p.dampening != 0.0f)) {
    return absl::InvalidArgumentError("SgdStep: nesterov requires momentum > 0 and dampening = 0 (as in torch)");
  }
  if (u.n == 0) return absl::OkStatus();
  const int states = p.momentum != 0.0f ? 1 : 0;
  in::FusedArgs a;
  in::Dt grad_dt;
  in::OutDt out_dt;
  ZERO_RETURN_IF_ERROR(PrepareShard("SgdStep", u, states, &a, &grad_dt, &out_dt));
  cudaError_t e;
  if (states == 1) {
    e = in::LaunchSgd(a, grad_dt, out_dt,
                      in::MakeSgdOp<1>(u.lr, p.momentum, p.dampening, p.weight_decay, p.nesterov, u.step), stream);
  } else {
    e = in::LaunchSgd(a, grad_dt, out_dt,
                      in::MakeSgdOp<0>(u.lr, p.momentum, p.dampening, p.weight_decay, p.nesterov, u.step), stream);
  }
  return LaunchStatus(e, "SgdStep launch", u.n);
}

Status GradStats(const void* d_grad, DType dtype, size_t n, float scale, GradStatsResult* d_out, bool accumulate,
                 void* d_workspace, Stream stream) {
  if (!ValidDType(dtype)) return absl::InvalidArgumentError("GradStats: invalid dtype");
  if (d_out == nullptr || d_workspace == nullptr || (n > 0 && d_grad == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("GradStats: null pointer (n=", n, ")"));
  }
  if (reinterpret_cast<uintptr_t>(d_workspace) % 8 != 0 || reinterpret_cast<uintptr_t>(d_out) % 8 != 0) {
    return absl::InvalidArgumentError("GradStats: d_out and d_workspace must be 8-byte aligned");
  }
  return LaunchStatus(in::LaunchGradStats(d_grad, static_cast<in::Dt>(dtype), n, scale,
                                          reinterpret_cast<in::StatsResult*>(d_out), accumulate, d_workspace, stream),
                      "GradStats launch", n);
}

Status BatchCopy(const CopySegment* segments, size_t count, Stream stream) {
  if (count > 0 && segments == nullptr) return absl::InvalidArgumentError("BatchCopy: segments is null");
  in::CopySeg chunk[in::kCopySegmentsPerLaunch];
  size_t total = 0;
  for (size_t begin = 0; begin < count; begin += in::kCopySegmentsPerLaunch) {
    const size_t len = std::min<size_t>(count - begin, in::kCopySegmentsPerLaunch);
    for (size_t i = 0; i < len; ++i) {
      const CopySegment& s = segments[begin + i];
      if (s.bytes > 0 && (s.d_src == nullptr || s.d_dst == nullptr)) {
        return absl::InvalidArgumentError(absl::StrCat("BatchCopy: segment ", begin + i, " has a null pointer"));
      }
      if (Overlaps(s.d_src, s.bytes, s.d_dst, s.bytes)) {
        return absl::InvalidArgumentError(absl::StrCat("BatchCopy: segment ", begin + i, " overlaps itself"));
      }
      chunk[i] = {s.d_src, s.d_dst, s.bytes};
      total += s.bytes;
    }
    ZERO_RETURN_IF_ERROR(
        LaunchStatus(in::LaunchBatchCopy(chunk, static_cast<int>(len), stream), "BatchCopy launch", total));
  }
  return absl::OkStatus();
}

namespace {

// Flatten and Unflatten: the same segments with source and destination swapped.
Status FlatCopy(const char* op, const DeviceSpan* parts, size_t count, unsigned char* flat_dst,
                const unsigned char* flat_src, Stream stream) {
  if (count > 0 && parts == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": parts is null"));
  if (flat_dst == nullptr && flat_src == nullptr && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": the flat buffer is null"));
  }
  in::CopySeg chunk[in::kCopySegmentsPerLaunch];
  size_t offset = 0;
  for (size_t begin = 0; begin < count; begin += in::kCopySegmentsPerLaunch) {
    const size_t len = std::min<size_t>(count - begin, in::kCopySegmentsPerLaunch);
    for (size_t i = 0; i < len; ++i) {
      const DeviceSpan& p = parts[begin + i];
      if (p.bytes > 0 && p.d_ptr == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(op, ": part ", begin + i, " is null"));
      }
      if (flat_dst != nullptr) {
        chunk[i] = {p.d_ptr, flat_dst + offset, p.bytes};
      } else {
        chunk[i] = {flat_src + offset, p.d_ptr, p.bytes};
      }
      offset += p.bytes;
    }
    ZERO_RETURN_IF_ERROR(LaunchStatus(in::LaunchBatchCopy(chunk, static_cast<int>(len), stream), op, offset));
  }
  return absl::OkStatus();
}

}  // namespace

Status Flatten(const DeviceSpan* parts, size_t count, void* d_flat, Stream stream) {
  if (count > 0 && d_flat == nullptr) return absl::InvalidArgumentError("Flatten: d_flat is null");
  return FlatCopy("Flatten", parts, count, static_cast<unsigned char*>(d_flat), nullptr, stream);
}

Status Unflatten(const void* d_flat, const DeviceSpan* parts, size_t count, Stream stream) {
  if (count > 0 && d_flat == nullptr) return absl::InvalidArgumentError("Unflatten: d_flat is null");
  return FlatCopy("Unflatten", parts, count, nullptr, static_cast<const unsigned char*>(d_flat), stream);
}

}  // namespace zero::cuda
