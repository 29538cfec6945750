// Fused AdamW / Adam / SGD on the device against the host optimizer (zero::MakeAdam / MakeSgd, whose scalar
// reference follows torch.optim): bit for bit (NaN payloads aside), on fresh random inputs with edge values,
// aligned and misaligned buffers, every output poisoned before the run and every element checked, and the
// bytes around each buffer checked untouched.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "support/status_matchers.h"
#include "test_kernels.h"
#include "zero/advanced/cuda_kernels.h"
#include "zero/optimizer.h"

namespace zero {
namespace {

using testing_cuda::DeviceBuffer;
using testing_cuda::EdgeValues;
using testing_cuda::SameElement;

class CudaOptimTest : public testing_cuda::GpuTest {};

// Where each buffer sits: element offsets from a 256-byte-aligned allocation.
struct Layout {
  size_t fp32 = 0;  // master and states
  size_t grad = 0;
  size_t out = 0;
};

struct Case {
  size_t n;
  DType grad_dtype;
  int out;  // -1: no write-back, else a DType value
  Layout layout;
};

constexpr size_t kGuardElems = 16;  // poisoned elements before and after each buffer, checked afterwards

// One device buffer of `n` elements of `esize` bytes at element offset `off` with guards on both sides.
struct Slot {
  DeviceBuffer buf;
  size_t esize;
  size_t off;
  size_t n;
  Slot(size_t n_, size_t esize_, size_t off_)
      : buf((n_ + off_ + 2 * kGuardElems) * esize_ + 16), esize(esize_), off(off_), n(n_) {}
  unsigned char* data() const { return buf.get() + (kGuardElems + off) * esize; }
  // Guard bytes still hold the poison.
  ::testing::AssertionResult GuardsIntact() const {
    std::vector<unsigned char> all(buf.bytes());
    if (buf.Download(all.data(), all.size()) != cudaSuccess) return ::testing::AssertionFailure() << "download";
    const size_t begin = (kGuardElems + off) * esize;
    const size_t end = begin + n * esize;
    for (size_t i = 0; i < all.size(); ++i) {
      if ((i < begin || i >= end) && all[i] != 0xA5) {
        return ::testing::AssertionFailure() << "byte " << i << " outside [" << begin << ", " << end << ") written";
      }
    }
    return ::testing::AssertionSuccess();
  }
};

template <class Apply>
void RunCase(const Case& c, int states, const ElementwiseOptimizer& host, Apply device_step, float grad_scale,
             uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "n=" << c.n << " grad=" << DTypeName(c.grad_dtype) << " out=" << c.out
                                    << " layout=" << c.layout.fp32 << "/" << c.layout.grad << "/" << c.layout.out
                                    << " seed=" << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 31);
  std::uniform_int_distribution<size_t> edge(0, EdgeValues().size() - 1);
  const size_t n = c.n;
  std::vector<float> master(n), s0(n), s1(n), g32(n);
  for (size_t i = 0; i < n; ++i) {
    master[i] = normal(rng);
    s0[i] = 0.1f * normal(rng);
    s1[i] = 0.01f * std::abs(normal(rng));
    g32[i] = 0.5f * normal(rng);
    if (pick(rng) == 0) g32[i] = EdgeValues()[edge(rng)];
    if (pick(rng) == 0) master[i] = EdgeValues()[3 + edge(rng) % (EdgeValues().size() - 3)];  // finite edges
  }
  const DType out_dtype = c.out < 0 ? DType::kBF16 : static_cast<DType>(c.out);
  const size_t gsize = DTypeSize(c.grad_dtype);
  const size_t osize = DTypeSize(out_dtype);
  std::vector<unsigned char> g_bytes(n * gsize);
  ConvertBuffer(g32.data(), DType::kF32, g_bytes.data(), c.grad_dtype, n);

  Slot dm(n, 4, c.layout.fp32), d0(n, 4, c.layout.fp32), d1(n, 4, c.layout.fp32), dg(n, gsize, c.layout.grad),
      dout(n, osize, c.layout.out);
  for (Slot* s : {&dm, &d0, &d1, &dg, &dout}) ZERO_ASSERT_CUDA(s->buf.Poison());
  ZERO_ASSERT_CUDA(cudaMemcpy(dm.data(), master.data(), n * 4, cudaMemcpyHostToDevice));
  ZERO_ASSERT_CUDA(cudaMemcpy(d0.data(), s0.data(), n * 4, cudaMemcpyHostToDevice));
  ZERO_ASSERT_CUDA(cudaMemcpy(d1.data(), s1.data(), n * 4, cudaMemcpyHostToDevice));
  ZERO_ASSERT_CUDA(cudaMemcpy(dg.data(), g_bytes.data(), n * gsize, cudaMemcpyHostToDevice));

  std::vector<float> hm = master, h0 = s0, h1 = s1;
  std::vector<unsigned char> hout(n * osize, 0xA5);
  float* hstate[2] = {h0.data(), h1.data()};
  float* dstate[2] = {reinterpret_cast<float*>(d0.data()), reinterpret_cast<float*>(d1.data())};
  for (int64_t step = 1; step <= 3; ++step) {
    ShardUpdate u;
    u.master = hm.data();
    u.grad = g_bytes.data();
    u.grad_dtype = c.grad_dtype;
    u.grad_scale = grad_scale;
    u.state = hstate;
    u.param_out = c.out < 0 ? nullptr : hout.data();
    u.param_out_dtype = out_dtype;
    u.n = n;
    u.step = step;
    u.lr = 1e-2 * static_cast<double>(step);
    host.Update(u);

    ShardUpdate d = u;
    d.master = reinterpret_cast<float*>(dm.data());
    d.grad = dg.data();
    d.state = states > 0 ? dstate : nullptr;
    d.param_out = c.out < 0 ? nullptr : dout.data();
    ASSERT_OK(device_step(d));
  }
  ZERO_ASSERT_CUDA(cudaDeviceSynchronize());
  ZERO_ASSERT_CUDA(cudaGetLastError());

  std::vector<float> em(n), e0(n), e1(n);
  std::vector<unsigned char> eout(n * osize);
  ZERO_ASSERT_CUDA(cudaMemcpy(em.data(), dm.data(), n * 4, cudaMemcpyDeviceToHost));
  ZERO_ASSERT_CUDA(cudaMemcpy(e0.data(), d0.data(), n * 4, cudaMemcpyDeviceToHost));
  ZERO_ASSERT_CUDA(cudaMemcpy(e1.data(), d1.data(), n * 4, cudaMemcpyDeviceToHost));
  ZERO_ASSERT_CUDA(cudaMemcpy(eout.data(), dout.data(), n * osize, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(SameElement(em.data(), hm.data(), DType::kF32, i))
        << "master i=" << i << " " << em[i] << " vs " << hm[i];
    if (states >= 1) {
      ASSERT_TRUE(SameElement(e0.data(), h0.data(), DType::kF32, i))
          << "state0 i=" << i << " " << e0[i] << " vs " << h0[i];
    }
    if (states >= 2) {
      ASSERT_TRUE(SameElement(e1.data(), h1.data(), DType::kF32, i))
          << "state1 i=" << i << " " << e1[i] << " vs " << h1[i];
    }
    if (c.out >= 0) {
      ASSERT_TRUE(SameElement(eout.data(), hout.data(), out_dtype, i)) << "param_out i=" << i;
    }
  }
  // Untouched: guards of every buffer, the unused state buffers entirely, param_out when not requested.
  for (const Slot* s : {&dm, &dg}) EXPECT_TRUE(s->GuardsIntact());
  if (states >= 1) {
    EXPECT_TRUE(d0.GuardsIntact());
  }
  if (states >= 2) {
    EXPECT_TRUE(d1.GuardsIntact());
  }
  if (c.out >= 0) {
    EXPECT_TRUE(dout.GuardsIntact());
  } else {
    for (unsigned char b : eout) ASSERT_EQ(b, 0xA5) << "param_out written although not requested";
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const Layout layouts[] = {
      {0, 0, 0},  // all 16-byte aligned: vector body
      {1, 1, 1},  // all shifted by one element: scalar head, then vector body
      {0, 3, 5},  // misaligned relative to each other: 16-bit buffers force the scalar fallback
      {2, 0, 0},
  };
  for (DType g : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int out : {-1, 0, 1, 2}) {
      for (const Layout& l : layouts) {
        for (size_t n : {1u, 7u, 8u, 9u, 1000u}) cases.push_back({n, g, out, l});
      }
      if (out != 1) cases.push_back({(size_t{1} << 20) + 5, g, out, layouts[0]});  // many blocks, grid-stride
      if (out == 1) cases.push_back({(size_t{1} << 18) + 3, g, out, layouts[2]});  // scalar fallback at size
    }
  }
  return cases;
}

TEST_F(CudaOptimTest, AdamMatchesHostBitForBit) {
  const uint32_t seed0 = testing_cuda::FreshSeed();
  uint32_t seed = seed0;
  struct Variant {
    bool decoupled;
    bool bias_correction;
    double beta1;
    double weight_decay;
  };
  for (const Variant& v : {Variant{true, true, 0.9, 0.01}, Variant{false, true, 0.9, 0.01},
                           Variant{true, false, 0.9, 0.0}, Variant{true, true, 0.3, 0.1}}) {
    AdamParams p;
    p.beta1 = v.beta1;
    p.weight_decay = v.weight_decay;
    p.decoupled_weight_decay = v.decoupled;
    p.bias_correction = v.bias_correction;
    SCOPED_TRACE(::testing::Message() << "decoupled=" << v.decoupled << " bias_correction=" << v.bias_correction
                                      << " beta1=" << v.beta1 << " wd=" << v.weight_decay);
    auto host = MakeAdam(p);
    for (const Case& c : Cases()) {
      RunCase(
          c, 2, *host, [&](const ShardUpdate& u) { return cuda::AdamStep(u, p, nullptr); }, 1.0f / 1024, seed++);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(CudaOptimTest, SgdMatchesHostBitForBit) {
  uint32_t seed = testing_cuda::FreshSeed();
  struct Variant {
    double momentum, dampening, weight_decay;
    bool nesterov;
  };
  for (const Variant& v : {Variant{0.0, 0.0, 0.0, false}, Variant{0.0, 0.0, 1e-4, false},
                           Variant{0.9, 0.1, 1e-4, false}, Variant{0.9, 0.0, 0.0, true}}) {
    SgdParams p;
    p.momentum = v.momentum;
    p.dampening = v.dampening;
    p.weight_decay = v.weight_decay;
    p.nesterov = v.nesterov;
    SCOPED_TRACE(::testing::Message() << "momentum=" << v.momentum << " dampening=" << v.dampening
                                      << " wd=" << v.weight_decay << " nesterov=" << v.nesterov);
    auto host = MakeSgd(p);
    const int states = v.momentum != 0.0 ? 1 : 0;
    for (const Case& c : Cases()) {
      RunCase(
          c, states, *host, [&](const ShardUpdate& u) { return cuda::SgdStep(u, p, nullptr); }, 2.0f, seed++);
      if (HasFatalFailure()) return;
    }
  }
}

// Every variant of the fused step that zero-bench-gpu times (the first version and each tiled variant, on a
// full wave and on a one-pass grid) gives the host optimizer's bits too: AdamW on the bench's dtype pairs plus
// f16 -> f32, aligned, shifted and mutually misaligned buffers, and a size at which the full-wave grid's
// blocks loop over several tiles each.
TEST_F(CudaOptimTest, EveryBenchVariantMatchesHostBitForBit) {
  uint32_t seed = testing_cuda::FreshSeed();
  AdamParams p;
  p.weight_decay = 0.01;
  auto host = MakeAdam(p);
  struct Pair {
    DType grad;
    int out;
    bool big;  // also the multi-tile size
  };
  const Layout layouts[] = {{0, 0, 0}, {1, 1, 1}, {0, 3, 5}};
  for (int variant = 0; variant < testing_cuda::FusedVariantCount(); ++variant) {
    for (bool one_pass : {false, true}) {
      if (variant == 0 && one_pass) continue;  // the first version has one grid
      SCOPED_TRACE(::testing::Message() << "variant " << testing_cuda::FusedVariantName(variant)
                                        << (one_pass ? ", one pass" : ", full wave"));
      auto step = [&](const ShardUpdate& u) -> absl::Status {
        namespace in = ::zero::cuda::internal;
        in::FusedArgs a;
        a.master = u.master;
        a.grad = u.grad;
        a.grad_scale = u.grad_scale;
        a.state[0] = u.state[0];
        a.state[1] = u.state[1];
        a.param_out = u.param_out;
        const in::Dt gdt = static_cast<in::Dt>(u.grad_dtype);
        const in::OutDt odt = u.param_out == nullptr ? in::OutDt::kNone : static_cast<in::OutDt>(u.param_out_dtype);
        a.plan = in::MakeFusedPlan(a, gdt, odt, 2, u.n);
        const in::AdamOp op = in::MakeAdamOp(u.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.decoupled_weight_decay,
                                             p.bias_correction, u.step);
        const cudaError_t e = testing_cuda::LaunchAdamVariant(variant, one_pass, a, gdt, odt, op, nullptr);
        if (e != cudaSuccess) return absl::InternalError(cudaGetErrorString(e));
        return absl::OkStatus();
      };
      for (const Pair& pr : {Pair{DType::kF32, -1, true}, Pair{DType::kBF16, static_cast<int>(DType::kBF16), true},
                             Pair{DType::kF32, static_cast<int>(DType::kBF16), false},
                             Pair{DType::kF16, static_cast<int>(DType::kF32), false}}) {
        for (const Layout& l : layouts) RunCase({1003, pr.grad, pr.out, l}, 2, *host, step, 1.0f / 1024, seed++);
        if (pr.big) RunCase({(size_t{1} << 21) + 5, pr.grad, pr.out, layouts[0]}, 2, *host, step, 1.0f / 1024, seed++);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The step is stream-ordered: on a non-default stream it runs after earlier work on that stream, and the
// host sees its results only after joining the stream.
TEST_F(CudaOptimTest, RunsOnTheGivenStream) {
  cudaStream_t stream;
  ZERO_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t n = 4096;
  DeviceBuffer master(n * 4), grad(n * 4), m(n * 4), v(n * 4);
  std::vector<float> ones(n, 1.0f);
  ZERO_ASSERT_CUDA(cudaMemsetAsync(m.get(), 0, n * 4, stream));
  ZERO_ASSERT_CUDA(cudaMemsetAsync(v.get(), 0, n * 4, stream));
  ZERO_ASSERT_CUDA(cudaMemcpyAsync(master.get(), ones.data(), n * 4, cudaMemcpyHostToDevice, stream));
  ZERO_ASSERT_CUDA(cudaMemcpyAsync(grad.get(), ones.data(), n * 4, cudaMemcpyHostToDevice, stream));
  float* states[2] = {reinterpret_cast<float*>(m.get()), reinterpret_cast<float*>(v.get())};
  ShardUpdate u;
  u.master = reinterpret_cast<float*>(master.get());
  u.grad = grad.get();
  u.grad_dtype = DType::kF32;
  u.state = states;
  u.param_out = nullptr;
  u.n = n;
  u.step = 1;
  u.lr = 0.5;
  AdamParams p;
  ASSERT_OK(cuda::AdamStep(u, p, stream));
  ZERO_ASSERT_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> out(n);
  ZERO_ASSERT_CUDA(master.Download(out.data(), n * 4));
  // Step 1 of Adam with g = 1: m_hat = v_hat^(1/2) = 1, so p = 1 - lr * 1 / (1 + eps) ~= 0.5.
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(out[i], 0.5f, 1e-6f) << i;
  ZERO_ASSERT_CUDA(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace zero
