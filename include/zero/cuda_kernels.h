// zero/cuda_kernels.h — device kernels the engine and trainers call on the CUDA path (ZERO_HAVE_CUDA only).
//
//   zero::cuda::Convert(d_src, zero::DType::kF32, d_dst, zero::DType::kBF16, n, stream);
//
// All functions are stream-ordered: they enqueue work on `stream` and return at once (no host
// synchronization). Pointers are device pointers (d_ prefix). Errors from the launch are returned as
// kInternal with the CUDA error string.
#pragma once

#include <cstddef>

#include "zero/dtype.h"
#include "zero/features.h"
#include "zero/status.h"

struct CUstream_st;  // cudaStream_t without including CUDA headers.

namespace zero::cuda {

using Stream = CUstream_st*;

// Returns the number of visible CUDA devices, or 0 when there is no driver or no device (never an error, so
// tests can GTEST_SKIP on 0).
int DeviceCount();

// Element-wise conversion between f32, f16 and bf16 (round to nearest even), identical bit for bit to the
// host ConvertBuffer in zero/dtype.h.
[[nodiscard]] Status Convert(const void* d_src, DType src_type, void* d_dst, DType dst_type, size_t n,
                             Stream stream);

}  // namespace zero::cuda
