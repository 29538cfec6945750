// Helpers for the GPU tests: skip without a device, checked CUDA calls, owned device buffers, fresh seeds.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "zero/advanced/cuda_kernels.h"
#include "zero/dtype.h"

namespace zero::testing_cuda {

// Every GPU test derives from this: no device, no test (CI has none).
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

#define ZERO_ASSERT_CUDA(expr)                                                                            \
  do {                                                                                                    \
    const cudaError_t _e = (expr);                                                                        \
    ASSERT_EQ(_e, cudaSuccess) << #expr << ": " << cudaGetErrorName(_e) << " " << cudaGetErrorString(_e); \
  } while (0)

// An owned device allocation (plain cudaMalloc: the tests of the kernels should not depend on the pool).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0 && cudaMalloc(&ptr_, bytes) != cudaSuccess) {
      ptr_ = nullptr;
      ADD_FAILURE() << "cudaMalloc(" << bytes << ") failed";
    }
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(ptr_); }
  size_t bytes() const { return bytes_; }
  // Fills every byte with 0xA5 so an element the kernel fails to write is caught.
  cudaError_t Poison() { return cudaMemset(ptr_, 0xA5, bytes_); }
  cudaError_t Upload(const void* src, size_t n, size_t offset = 0) {
    return cudaMemcpy(get() + offset, src, n, cudaMemcpyHostToDevice);
  }
  cudaError_t Download(void* dst, size_t n, size_t offset = 0) const {
    return cudaMemcpy(dst, get() + offset, n, cudaMemcpyDeviceToHost);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// A fresh seed per run (inputs must differ between runs), printed so a failure can be replayed with
// ZERO_TEST_SEED=<seed>.
inline uint32_t FreshSeed() {
  if (const char* s = std::getenv("ZERO_TEST_SEED")) return static_cast<uint32_t>(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

// Edge values every kernel must get right: infinities, NaN, subnormals, the largest finite, signed zeros.
inline const std::vector<float>& EdgeValues() {
  static const std::vector<float> v = {std::numeric_limits<float>::infinity(),
                                       -std::numeric_limits<float>::infinity(),
                                       std::numeric_limits<float>::quiet_NaN(),
                                       1e-40f,
                                       -3e-42f,
                                       std::numeric_limits<float>::denorm_min(),
                                       std::numeric_limits<float>::max(),
                                       -std::numeric_limits<float>::max(),
                                       0.0f,
                                       -0.0f,
                                       std::numeric_limits<float>::min()};
  return v;
}

inline bool SameFloat(float a, float b) { return (std::isnan(a) && std::isnan(b)) || FloatBits(a) == FloatBits(b); }

// Element i of a buffer of type t, as f32 bits compared with NaN == NaN.
inline bool SameElement(const void* a, const void* b, DType t, size_t i) {
  return SameFloat(LoadAsF32(a, t, i), LoadAsF32(b, t, i)) &&
         (std::isnan(LoadAsF32(a, t, i)) ||
          std::memcmp(static_cast<const char*>(a) + i * DTypeSize(t), static_cast<const char*>(b) + i * DTypeSize(t),
                      DTypeSize(t)) == 0);
}

}  // namespace zero::testing_cuda
