// Casts between f32, f16 and bf16 on the device. The bit manipulation is the same as zero/dtype.h so device
// and host casts agree bit for bit (tested against the host reference in tests/cuda).
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "zero/cuda_kernels.h"

namespace zero::cuda {

namespace {

__device__ __forceinline__ uint16_t DevF32ToBF16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ float DevBF16ToF32(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

__device__ __forceinline__ uint16_t DevF32ToF16(float f) {
  uint32_t x = __float_as_uint(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) {
    return static_cast<uint16_t>(sign | 0x7C00u | (x > 0x7F800000u ? (0x0200u | ((x >> 13) & 0x3FFu)) : 0u));
  }
  if (x >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (x < 0x38800000u) {
    float shifted = __fadd_rn(__uint_as_float(x), 0.5f);  // _rn: no FMA contraction, no FTZ surprises
    return static_cast<uint16_t>(sign | (__float_as_uint(shifted) - 0x3F000000u));
  }
  const uint32_t mant_odd = (x >> 13) & 1u;
  x += (static_cast<uint32_t>(15 - 127) << 23) + 0xFFFu + mant_odd;
  return static_cast<uint16_t>(sign | (x >> 13));
}

__device__ __forceinline__ float DevF16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return __uint_as_float(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) return __uint_as_float(sign | __float_as_uint(__fmul_rn(static_cast<float>(mant), 5.9604644775390625e-8f)));
  return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

__device__ __forceinline__ float DevLoad(const void* p, DType t, size_t i) {
  if (t == DType::kF32) return static_cast<const float*>(p)[i];
  uint16_t h = static_cast<const uint16_t*>(p)[i];
  return t == DType::kF16 ? DevF16ToF32(h) : DevBF16ToF32(h);
}

__device__ __forceinline__ void DevStore(void* p, DType t, size_t i, float v) {
  if (t == DType::kF32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] = t == DType::kF16 ? DevF32ToF16(v) : DevF32ToBF16(v);
  }
}

__global__ void ConvertKernel(const void* src, DType st, void* dst, DType dt, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    DevStore(dst, dt, i, DevLoad(src, st, i));
  }
}

}  // namespace

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

Status Convert(const void* d_src, DType st, void* d_dst, DType dt, size_t n, Stream stream) {
  if (n == 0) return absl::OkStatus();
  if (st == dt) {
    cudaError_t e = cudaMemcpyAsync(d_dst, d_src, n * DTypeSize(st), cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess) return absl::InternalError(absl::StrCat("cudaMemcpyAsync: ", cudaGetErrorString(e)));
    return absl::OkStatus();
  }
  constexpr int kThreads = 256;
  size_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 65535u * 16u) blocks = 65535u * 16u;
  ConvertKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(d_src, st, d_dst, dt, n);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return absl::InternalError(absl::StrCat("Convert kernel launch: ", cudaGetErrorString(e)));
  return absl::OkStatus();
}

}  // namespace zero::cuda
