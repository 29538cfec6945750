// zero/advanced/cuda_kernels.h — device kernels the engine and trainers call on the CUDA path (ZERO_HAVE_CUDA only;
// link zero::cuda). A building block, not the trainer's API (the CUDA engine calls these itself): signatures may
// change between minor versions (docs/design.md, "Which headers are stable").
//
//   // One fused AdamW step on a device shard: bf16 gradient in, fp32 master/m/v updated, bf16 params out.
//   zero::ShardUpdate u{.master = d_master, .grad = d_grad16, .grad_dtype = zero::DType::kBF16,
//                       .grad_scale = 1.f / loss_scale, .state = states /* host array {d_m, d_v} */,
//                       .param_out = d_param16, .param_out_dtype = zero::DType::kBF16, .n = n, .step = t, .lr = lr};
//   ZERO_RETURN_IF_ERROR(zero::cuda::AdamStep(u, adam_params, stream));
//
//   // Overflow check and global-norm input in one read of the gradient.
//   ZERO_RETURN_IF_ERROR(zero::cuda::GradStats(d_grad16, zero::DType::kBF16, n, 1.f / loss_scale, d_stats,
//                                               /*accumulate=*/false, d_workspace, stream));
//
// Conventions (NCCL/CUB): device pointers carry a d_ prefix, the stream comes last, and every function here is
// stream-ordered: it enqueues work on `stream` and returns at once, without synchronizing the host or the
// device (nothing here has Sync or Wait in its name). Arguments are checked on the host (kInvalidArgument);
// a failed launch returns kInternal with the CUDA error string. Results are valid once the stream reaches
// the enqueued work: join it with an event before reading them on another stream or on the host.
// Tolerances of every kernel against the host reference are listed in docs/internals/cuda.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/dtype.h"
#include "zero/features.h"
#include "zero/mixed_precision.h"
#include "zero/optimizer.h"
#include "zero/status.h"

struct CUstream_st;  // cudaStream_t without including CUDA headers.

namespace zero::cuda {

using Stream = CUstream_st*;

// Returns the number of visible CUDA devices, or 0 when there is no driver or no device (never an error, so
// tests can GTEST_SKIP on 0).
int DeviceCount();

// Element-wise conversion between f32, f16 and bf16 (round to nearest even), identical bit for bit to the
// host ConvertBuffer in zero/dtype.h. Same types: a device-to-device copy.
[[nodiscard]] Status Convert(const void* d_src, DType src_type, void* d_dst, DType dst_type, size_t n, Stream stream);

// d_dst[i] = dst_type(d_dst[i] + d_src[i]): the sum in f32, rounded once (round to nearest even), identical bit
// for bit to the host engine's landing of a gradient by addition. Used to add a reduced shard to an
// accumulator and to accumulate 16-bit gradients in fp32. The buffers must not overlap.
[[nodiscard]] Status Add(const void* d_src, DType src_type, void* d_dst, DType dst_type, size_t n, Stream stream);

// zero::StochasticRoundToBF16 (zero/mixed_precision.h) on the device, bit for bit: the same (key, first_index)
// give the same bf16 values as the host.
[[nodiscard]] Status StochasticRoundToBF16(const float* d_src, uint16_t* d_dst, size_t n, uint64_t key,
                                           int64_t first_index, Stream stream);

// ---- blockwise int8 quantization (ZeRO++'s qwZ wire format) ------------------------------------------------
//
// Elements [b·block, min((b+1)·block, n)) form block b; its scale is max|x| / 127 (f32) and element x becomes
// round-to-nearest-even(x · (127 / max|x|)) in [-127, 127]. A block whose |x| are all so small that 127 / max|x|
// overflows (below about 3.7e-37) gets scale 0 and codes 0; a block holding a NaN or an infinity gets scale NaN and
// codes 0, so it reads back NaN. Identical bit for bit to the host's blockwise quantization (the same codes and scales;
// dequantized values equal, NaN payloads aside), deterministic, one launch, no workspace. The buffers must not overlap.

// d_q gets n int8 codes, d_scales ceil(n / block) fp32 scales, from d_x (n elements of x_type). block >= 1.
[[nodiscard]] Status QuantizeInt8(const void* d_x, DType x_type, size_t n, size_t block, int8_t* d_q, float* d_scales,
                                  Stream stream);

// d_out[i] = out_type(float(d_q[i]) · d_scales[i / block]), rounded to nearest even. block >= 1.
[[nodiscard]] Status DequantizeInt8(const int8_t* d_q, const float* d_scales, size_t n, size_t block, void* d_out,
                                    DType out_type, Stream stream);

// ---- ZeRO++ qgZ's element work (its gradient records; the int8 ones use the two functions above) -----------
//
// int4 codes: block b's scale is max|x| / 7 and x becomes round-to-nearest-even(x · (7 / max|x|)) in [-7, 7], two's
// complement in a nibble, element 2k in the low half of byte k and 2k + 1 in the high one; a block whose factor
// 7 / max|x| overflows (below about 2.1e-38) and a non-finite block as for int8. Identical bit for bit to the host's
// int4 quantization. Two launches; d_scratch holds ceil(n / block) floats. The buffers must not overlap.

// d_q gets (n + 1) / 2 bytes, d_scales ceil(n / block) fp32 scales, from d_x (n f32 elements). block >= 1.
[[nodiscard]] Status QuantizeInt4(const float* d_x, size_t n, size_t block, uint8_t* d_q, float* d_scales,
                                  float* d_scratch, Stream stream);

// d_out[i] = float(code i) · d_scales[i / block] (f32). block >= 1.
[[nodiscard]] Status DequantizeInt4(const uint8_t* d_q, const float* d_scales, size_t n, size_t block, float* d_out,
                                    Stream stream);

// LoCo's error feedback step: d_e[i] = β·d_e[i] + (1 − β)·(d_y[i] − d_sent[i]) in f32, each operation rounded once
// (no FMA), 0 where the result is not finite. The host engine's step bit for bit.
[[nodiscard]] Status LocoResidual(const float* d_y, const float* d_sent, float* d_e, float beta, size_t n,
                                  Stream stream);

// d_dst[i] = d_src[i] / divisor (f32, correctly rounded); d_dst may be d_src.
[[nodiscard]] Status Divide(const float* d_src, float* d_dst, float divisor, size_t n, Stream stream);

// ---- fused optimizer steps -------------------------------------------------------------------------------
//
// One pass over the shard `u`: g = grad[i] * u.grad_scale (grad in f32, f16 or bf16), then the update of
// torch.optim.AdamW / Adam / SGD on the fp32 master u.master[i] and the fp32 state, in place, and (when
// u.param_out is not null) the new parameter written to u.param_out as u.param_out_dtype (f32, f16 or bf16,
// rounded to nearest even). All buffers are device memory of u.n elements; u.state is a HOST array of device
// pointers (the engine's state buffers, zeroed before the first step). u.step is the 1-based count of applied
// steps; u.lr the learning rate for this step. Buffers may have any alignment (16-byte-aligned buffers take
// the vectorized path; see docs/internals/cuda.md), must not overlap, and param_out must not be master.

// Adam/AdamW (p.decoupled_weight_decay): u.state = {exp_avg, exp_avg_sq}.
[[nodiscard]] Status AdamStep(const ShardUpdate& u, const AdamParams& p, Stream stream);

// SGD with optional momentum, dampening, Nesterov and L2 weight decay: u.state = {momentum_buffer} when
// p.momentum != 0 (on step 1 the buffer is set to the gradient, as torch does), unused otherwise.
[[nodiscard]] Status SgdStep(const ShardUpdate& u, const SgdParams& p, Stream stream);

// ---- gradient statistics ---------------------------------------------------------------------------------

// GradStats leaves a zero::GradStatsResult (zero/mixed_precision.h, the host GradStats' result) in device memory:
// sumsq is the sum over i of (scale * grad[i])^2, nonfinite the number of i with scale * grad[i] inf or NaN.

// Bytes of device scratch GradStats needs (independent of n), 8-byte aligned.
inline constexpr size_t kGradStatsWorkspaceBytes = 16 * 1024;

// Reads d_grad (n elements of `dtype`) once and writes, or with `accumulate` adds to, *d_out: the sum of
// squares of scale * grad (squares in f32 per group of 8, summed in double) and the count of non-finite
// scaled values: the loss scaler's overflow check and the global-norm clip's input in one pass. Several
// buffers (a rank's shards of all units) accumulate into one result by calling this in sequence on one
// stream. Deterministic: the same buffer gives the same bits on every run (the reduction order depends only on
// n and the buffer's alignment, never on the device or timing; two launches on `stream`). d_workspace
// (kGradStatsWorkspaceBytes) may be reused once the call's work has run on `stream`; concurrent calls need distinct
// workspaces and results.
[[nodiscard]] Status GradStats(const void* d_grad, DType dtype, size_t n, float scale, GradStatsResult* d_out,
                               bool accumulate, void* d_workspace, Stream stream);

// ---- batched copies --------------------------------------------------------------------------------------

// One device-to-device copy of `bytes` bytes.
struct CopySegment {
  const void* d_src = nullptr;
  void* d_dst = nullptr;
  size_t bytes = 0;
};

// A piece of device memory (one tensor of a unit).
struct DeviceSpan {
  void* d_ptr = nullptr;
  size_t bytes = 0;
};

// Segments copied per kernel launch; longer lists take ceil(count / kCopySegmentsPerLaunch) launches.
inline constexpr size_t kCopySegmentsPerLaunch = 256;

// Copies every segment (any alignment, any size, zero allowed) with one kernel launch per
// kCopySegmentsPerLaunch segments. Segments must not overlap each other's destinations or their own source.
[[nodiscard]] Status BatchCopy(const CopySegment* segments, size_t count, Stream stream);

// Gathers parts[0..count) into d_flat back to back (part i at the sum of the bytes of parts before it).
[[nodiscard]] Status Flatten(const DeviceSpan* parts, size_t count, void* d_flat, Stream stream);

// The inverse of Flatten: scatters d_flat back into parts[0..count).
[[nodiscard]] Status Unflatten(const void* d_flat, const DeviceSpan* parts, size_t count, Stream stream);

}  // namespace zero::cuda
