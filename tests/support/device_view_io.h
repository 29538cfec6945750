// tests/support/device_view_io.h — how a test trainer reaches a CUDA engine's views: copies on the engine's stream
// (tests linking the CUDA runtime only).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "support/synthetic_trainer.h"
#include "zero/dtype.h"
#include "zero/engine.h"

namespace zero::testing {

inline ViewIo DeviceViewIo(const Engine& e) {
  ViewIo io;
  io.read = [&e](const TensorView& v, std::vector<unsigned char>* out) {
    out->resize(static_cast<size_t>(v.numel) * DTypeSize(v.dtype));
    ASSERT_EQ(cudaMemcpyAsync(out->data(), v.data, out->size(), cudaMemcpyDeviceToHost, e.cuda_stream()), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(e.cuda_stream()), cudaSuccess);
  };
  io.write = [&e](const std::vector<unsigned char>& in, const TensorView& v) {
    ASSERT_EQ(cudaMemcpyAsync(v.data, in.data(), in.size(), cudaMemcpyHostToDevice, e.cuda_stream()), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(e.cuda_stream()), cudaSuccess);
  };
  return io;
}

}  // namespace zero::testing
