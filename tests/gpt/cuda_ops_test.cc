// The GPT's CUDA path on a device (label `gpu`; every test skips without one): each op of ops_cuda.h against its
// CPU namesake in gpt/ops.h on random inputs, outputs poisoned with NaN first, and one whole Tiny-GPT forward +
// backward with model_cuda.h against GptModel. Tolerances and their reasons: tests/gpt/cuda_check.h.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "gpt/cuda/model_cuda.h"
#include "gpt/cuda/ops_cuda.h"
#include "gpt/cuda_check.h"
#include "gpt/model.h"
#include "gpt/ops.h"
#include "support/status_matchers.h"
#include "zero/advanced/cuda_kernels.h"

namespace zero::gpt {
namespace {

using ::zero::testing::StatusIs;

namespace gc = ::zero::gpt::cuda;
using cuda_testing::AbsGemm;
using cuda_testing::Bitwise;
using cuda_testing::kAttentionRel;
using cuda_testing::kElementwiseRel;
using cuda_testing::NormwiseClose;
using cuda_testing::RandomFloats;
using cuda_testing::RandomIds;
using cuda_testing::WithinGemmBound;

// An owned device array of n T's (plain cudaMalloc).
template <class T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    if (cudaMalloc(&p_, std::max<size_t>(1, n) * sizeof(T)) != cudaSuccess) {
      p_ = nullptr;
      ADD_FAILURE() << "cudaMalloc of " << n << " elements failed";
    }
  }
  explicit Dev(const std::vector<T>& host) : Dev(host.size()) { Upload(host); }
  ~Dev() {
    if (p_ != nullptr) cudaFree(p_);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;

  T* get() const { return p_; }
  void Upload(const std::vector<T>& host) {
    EXPECT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  // All bits set: a NaN for float, so an element a kernel does not write fails every comparison.
  void Poison() { EXPECT_EQ(cudaMemset(p_, 0xFF, n_ * sizeof(T)), cudaSuccess); }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

class GptCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (zero::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    // A blocking stream: the helpers' plain cudaMemcpy / cudaMemset run on the legacy default stream, and a
    // blocking stream is ordered with it (a pageable upload may return before its DMA lands).
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasSetStream(handle_, stream_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    if (handle_ != nullptr) cublasDestroy(handle_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  void Sync() {
    const cudaError_t e = cudaStreamSynchronize(stream_);
    ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
  }

  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
};

// ---------------------------------------------------------------------------------------------------------
// Ops.

struct GemmShape {
  int64_t N, IC, OC;
};

TEST_F(GptCudaTest, MatmulAndTiedHeadMatchTheCpuOpsWithinTheGemmBound) {
  std::mt19937_64 rng(101);
  for (const GemmShape s : {GemmShape{1, 1, 1}, {1, 5, 7}, {7, 3, 1}, {33, 64, 192}, {5, 256, 64}, {257, 384, 1536}}) {
    const int64_t N = s.N, IC = s.IC, OC = s.OC;
    SCOPED_TRACE(::testing::Message() << "N=" << N << " IC=" << IC << " OC=" << OC);
    const auto x = RandomFloats(rng, N * IC, 1.0f), w = RandomFloats(rng, IC * OC, 0.5f),
               b = RandomFloats(rng, OC, 1.0f);
    const auto dy = RandomFloats(rng, N * OC, 1.0f);
    const auto dw0 = RandomFloats(rng, IC * OC, 1.0f), db0 = RandomFloats(rng, OC, 1.0f);
    std::vector<float> y(N * OC), dx(N * IC), dw = dw0, db = db0;
    ops::MatmulForward(x.data(), w.data(), b.data(), N, IC, OC, y.data());
    ops::MatmulBackward(dy.data(), x.data(), w.data(), N, IC, OC, dx.data(), dw.data(), db.data());

    Dev<float> d_x(x), d_w(w), d_b(b), d_dy(dy), d_y(N * OC), d_dx(N * IC), d_dw(dw0), d_db(db0);
    d_y.Poison();
    d_dx.Poison();
    ASSERT_OK(gc::MatmulForward(d_x.get(), d_w.get(), d_b.get(), N, IC, OC, d_y.get(), handle_, stream_));
    ASSERT_OK(gc::MatmulBackward(d_dy.get(), d_x.get(), d_w.get(), N, IC, OC, d_dx.get(), d_dw.get(), d_db.get(),
                                 handle_, stream_));
    Sync();
    EXPECT_TRUE(WithinGemmBound(d_y.Download().data(), y.data(),
                                AbsGemm(false, false, N, OC, IC, x.data(), IC, w.data(), OC, b.data(), 0), N, OC, OC,
                                IC));
    EXPECT_TRUE(WithinGemmBound(d_dx.Download().data(), dx.data(),
                                AbsGemm(false, true, N, IC, OC, dy.data(), OC, w.data(), OC), N, IC, IC, OC));
    EXPECT_TRUE(WithinGemmBound(d_dw.Download().data(), dw.data(),
                                AbsGemm(true, false, IC, OC, N, x.data(), IC, dy.data(), OC, dw0.data(), OC), IC, OC,
                                OC, N));
    EXPECT_TRUE(Bitwise(d_db.Download(), db)) << "db: double sums in row order, like the CPU";

    const int64_t C = IC, V = OC;
    const auto wte = RandomFloats(rng, V * C, 0.5f), dlogits = RandomFloats(rng, N * V, 1.0f);
    const auto dwte0 = RandomFloats(rng, V * C, 1.0f);
    std::vector<float> logits(N * V), hdx(N * C), dwte = dwte0;
    ops::TiedHeadForward(x.data(), wte.data(), N, C, V, logits.data());
    ops::TiedHeadBackward(dlogits.data(), x.data(), wte.data(), N, C, V, hdx.data(), dwte.data());
    Dev<float> d_wte(wte), d_dlogits(dlogits), d_logits(N * V), d_hdx(N * C), d_dwte(dwte0);
    d_logits.Poison();
    d_hdx.Poison();
    ASSERT_OK(gc::TiedHeadForward(d_x.get(), d_wte.get(), N, C, V, d_logits.get(), handle_, stream_));
    ASSERT_OK(gc::TiedHeadBackward(d_dlogits.get(), d_x.get(), d_wte.get(), N, C, V, d_hdx.get(), d_dwte.get(), handle_,
                                   stream_));
    Sync();
    EXPECT_TRUE(WithinGemmBound(d_logits.Download().data(), logits.data(),
                                AbsGemm(false, true, N, V, C, x.data(), C, wte.data(), C), N, V, V, C));
    EXPECT_TRUE(WithinGemmBound(d_hdx.Download().data(), hdx.data(),
                                AbsGemm(false, false, N, C, V, dlogits.data(), V, wte.data(), C), N, C, C, V));
    EXPECT_TRUE(WithinGemmBound(d_dwte.Download().data(), dwte.data(),
                                AbsGemm(true, false, V, C, N, dlogits.data(), V, x.data(), C, dwte0.data(), C), V, C, C,
                                N));
  }
}

TEST_F(GptCudaTest, LayerNormGeluResidualMatchTheCpuOps) {
  std::mt19937_64 rng(102);
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {1, 7}, {33, 65}, {257, 384}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C);
    const auto x = RandomFloats(rng, N * C, 2.0f, 0.5f), w = RandomFloats(rng, C, 1.0f), b = RandomFloats(rng, C, 1.0f);
    const auto dy = RandomFloats(rng, N * C, 1.0f), dx0 = RandomFloats(rng, N * C, 1.0f);
    const auto dw0 = RandomFloats(rng, C, 1.0f), db0 = RandomFloats(rng, C, 1.0f);
    std::vector<float> y(N * C), mean(N), rstd(N), dx = dx0, dw = dw0, db = db0;
    ops::LayerNormForward(x.data(), w.data(), b.data(), N, C, y.data(), mean.data(), rstd.data());
    ops::LayerNormBackward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C, dx.data(), dw.data(),
                           db.data());
    Dev<float> d_x(x), d_w(w), d_b(b), d_y(N * C), d_mean(N), d_rstd(N), d_dy(dy), d_dx(dx0), d_dw(dw0), d_db(db0);
    d_y.Poison();
    d_mean.Poison();
    d_rstd.Poison();
    ASSERT_OK(
        gc::LayerNormForward(d_x.get(), d_w.get(), d_b.get(), N, C, d_y.get(), d_mean.get(), d_rstd.get(), stream_));
    // Backward from the CPU's statistics, so it is compared on its own.
    Dev<float> d_cmean(mean), d_crstd(rstd);
    ASSERT_OK(gc::LayerNormBackward(d_dy.get(), d_x.get(), d_w.get(), d_cmean.get(), d_crstd.get(), N, C, d_dx.get(),
                                    d_dw.get(), d_db.get(), stream_));
    Sync();
    EXPECT_TRUE(NormwiseClose(d_y.Download(), y, kElementwiseRel)) << "y";
    EXPECT_TRUE(NormwiseClose(d_mean.Download(), mean, kElementwiseRel)) << "mean";
    EXPECT_TRUE(NormwiseClose(d_rstd.Download(), rstd, kElementwiseRel)) << "rstd";
    EXPECT_TRUE(NormwiseClose(d_dx.Download(), dx, kElementwiseRel)) << "dx";
    EXPECT_TRUE(NormwiseClose(d_dw.Download(), dw, kElementwiseRel)) << "dw";
    EXPECT_TRUE(NormwiseClose(d_db.Download(), db, kElementwiseRel)) << "db";
  }
  for (int64_t n : {1, 7, 100000}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const auto x = RandomFloats(rng, n, 3.0f), dy = RandomFloats(rng, n, 1.0f), other = RandomFloats(rng, n, 1.0f);
    std::vector<float> y(n), dx(n), sum(n);
    ops::GeluForward(x.data(), n, y.data());
    ops::GeluBackward(dy.data(), x.data(), n, dx.data());
    ops::ResidualForward(x.data(), other.data(), n, sum.data());
    Dev<float> d_x(x), d_dy(dy), d_other(other), d_y(n), d_dx(n), d_sum(n);
    d_y.Poison();
    d_dx.Poison();
    d_sum.Poison();
    ASSERT_OK(gc::GeluForward(d_x.get(), n, d_y.get(), stream_));
    ASSERT_OK(gc::GeluBackward(d_dy.get(), d_x.get(), n, d_dx.get(), stream_));
    ASSERT_OK(gc::ResidualForward(d_x.get(), d_other.get(), n, d_sum.get(), stream_));
    Sync();
    EXPECT_TRUE(NormwiseClose(d_y.Download(), y, kElementwiseRel)) << "gelu";
    EXPECT_TRUE(NormwiseClose(d_dx.Download(), dx, kElementwiseRel)) << "gelu'";
    EXPECT_TRUE(Bitwise(d_sum.Download(), sum)) << "residual: one add";
  }
}

TEST_F(GptCudaTest, SoftmaxCrossEntropyMatchesTheCpuOp) {
  std::mt19937_64 rng(103);
  for (auto [N, V] : {std::pair<int64_t, int64_t>{1, 1}, {7, 5}, {33, 256}, {1000, 256}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " V=" << V);
    const auto logits = RandomFloats(rng, N * V, 3.0f);
    const auto targets = RandomIds(rng, N, static_cast<int32_t>(V));
    std::vector<float> probs(N * V), dlogits(N * V);
    const float loss = ops::SoftmaxCrossEntropyForward(logits.data(), targets.data(), N, V, probs.data());
    ops::SoftmaxCrossEntropyBackward(probs.data(), targets.data(), N, V, dlogits.data());
    Dev<float> d_logits(logits), d_probs(N * V), d_loss(1), d_dlogits(N * V);
    Dev<int32_t> d_targets(targets);
    Dev<double> d_row_loss(N);
    d_probs.Poison();
    d_loss.Poison();
    d_dlogits.Poison();
    ASSERT_OK(gc::SoftmaxCrossEntropyForward(d_logits.get(), d_targets.get(), N, V, d_probs.get(), d_loss.get(),
                                             d_row_loss.get(), stream_));
    ASSERT_OK(gc::SoftmaxCrossEntropyBackward(d_probs.get(), d_targets.get(), N, V, d_dlogits.get(), stream_));
    Sync();
    EXPECT_TRUE(NormwiseClose(d_probs.Download(), probs, kElementwiseRel)) << "probs";
    EXPECT_TRUE(NormwiseClose(d_loss.Download(), {loss}, kElementwiseRel)) << "loss";
    EXPECT_TRUE(NormwiseClose(d_dlogits.Download(), dlogits, kElementwiseRel)) << "dlogits";
  }
}

TEST_F(GptCudaTest, AttentionMatchesTheCpuOp) {
  std::mt19937_64 rng(104);
  struct Shape {
    int B, T, C, NH;
  };
  for (const Shape s :
       {Shape{1, 1, 4, 2}, {2, 5, 6, 3}, {1, 7, 15, 3}, {3, 4, 8, 1}, {2, 20, 64, 2}, {4, 128, 384, 6}}) {
    const int B = s.B, T = s.T, C = s.C, NH = s.NH;
    SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T << " C=" << C << " NH=" << NH);
    const int64_t n_qkv = static_cast<int64_t>(B) * T * 3 * C, n_y = static_cast<int64_t>(B) * T * C;
    const int64_t n_att = static_cast<int64_t>(B) * NH * T * T;
    const auto qkv = RandomFloats(rng, n_qkv, 1.0f), dy = RandomFloats(rng, n_y, 1.0f);
    std::vector<float> att(n_att), y(n_y), dqkv(n_qkv), scratch(static_cast<size_t>(T) * T);
    ops::AttentionForward(qkv.data(), B, T, C, NH, att.data(), y.data());
    ops::AttentionBackward(dy.data(), qkv.data(), att.data(), B, T, C, NH, dqkv.data(), scratch.data());
    Dev<float> d_qkv(qkv), d_dy(dy), d_att(n_att), d_y(n_y), d_cpu_att(att), d_dqkv(n_qkv), d_scratch(n_att);
    d_att.Poison();
    d_y.Poison();
    d_dqkv.Poison();
    d_scratch.Poison();
    ASSERT_OK(gc::AttentionForward(d_qkv.get(), B, T, C, NH, d_att.get(), d_y.get(), handle_, stream_));
    ASSERT_OK(gc::AttentionBackward(d_dy.get(), d_qkv.get(), d_cpu_att.get(), B, T, C, NH, d_dqkv.get(),
                                    d_scratch.get(), handle_, stream_));
    Sync();
    const auto got_att = d_att.Download();
    EXPECT_TRUE(NormwiseClose(got_att, att, kAttentionRel)) << "att";
    for (int64_t r = 0; r < static_cast<int64_t>(B) * NH * T; ++r) {
      for (int64_t j = r % T + 1; j < T; ++j) ASSERT_EQ(got_att[r * T + j], 0.0f) << "above the diagonal";
    }
    EXPECT_TRUE(NormwiseClose(d_y.Download(), y, kAttentionRel)) << "y";
    EXPECT_TRUE(NormwiseClose(d_dqkv.Download(), dqkv, kAttentionRel)) << "dqkv";
  }
}

TEST_F(GptCudaTest, HandleOnAnotherStreamOrInTf32ModeIsRefused) {
  Dev<float> d(64);
  ASSERT_EQ(cublasSetMathMode(handle_, CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
  EXPECT_THAT(gc::TiedHeadForward(d.get(), d.get() + 16, 2, 2, 2, d.get() + 32, handle_, stream_),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_EQ(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(handle_, nullptr), CUBLAS_STATUS_SUCCESS);
  EXPECT_THAT(gc::TiedHeadForward(d.get(), d.get() + 16, 2, 2, 2, d.get() + 32, handle_, stream_),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_EQ(cublasSetStream(handle_, stream_), CUBLAS_STATUS_SUCCESS);
  EXPECT_OK(gc::TiedHeadForward(d.get(), d.get() + 16, 2, 2, 2, d.get() + 32, handle_, stream_));
  Sync();
}

// ---------------------------------------------------------------------------------------------------------
// Phases: embeddings alone (bitwise), then the whole model.

TEST_F(GptCudaTest, EmbeddingsAreBitwiseTheCpuPhases) {
  std::mt19937_64 rng(105);
  const GptConfig cfg = GptConfig::Tiny();
  const int B = 3, T = 20;
  const int64_t N = B * T, V = cfg.vocab, C = cfg.channels;
  const auto wte = RandomFloats(rng, V * C, 1.0f), wpe = RandomFloats(rng, cfg.max_seq * C, 1.0f);
  const auto dwte0 = RandomFloats(rng, V * C, 1.0f), dwpe0 = RandomFloats(rng, cfg.max_seq * C, 1.0f);
  auto tokens = RandomIds(rng, N, 8);  // few distinct ids: many repeats to accumulate
  const auto dx = RandomFloats(rng, N * C, 1.0f);
  RootWeights rw;
  rw.wte = wte.data();
  rw.wpe = wpe.data();
  std::vector<float> x(N * C), dwte = dwte0, dwpe = dwpe0;
  EmbeddingForward(cfg, rw, tokens.data(), B, T, x.data());
  RootGrads rg;
  rg.wte = dwte.data();
  rg.wpe = dwpe.data();
  EmbeddingBackward(cfg, rg, tokens.data(), B, T, dx.data());

  Dev<float> d_wte(wte), d_wpe(wpe), d_x(N * C), d_dwte(dwte0), d_dwpe(dwpe0), d_dx(dx);
  Dev<int32_t> d_tokens(tokens);
  d_x.Poison();
  RootWeights drw;
  drw.wte = d_wte.get();
  drw.wpe = d_wpe.get();
  RootGrads drg;
  drg.wte = d_dwte.get();
  drg.wpe = d_dwpe.get();
  ASSERT_OK(gc::EmbeddingForward(cfg, drw, d_tokens.get(), B, T, d_x.get(), stream_));
  ASSERT_OK(gc::EmbeddingBackward(cfg, drg, d_tokens.get(), B, T, d_dx.get(), stream_));
  Sync();
  EXPECT_TRUE(Bitwise(d_x.Download(), x));
  EXPECT_TRUE(Bitwise(d_dwte.Download(), dwte));
  EXPECT_TRUE(Bitwise(d_dwpe.Download(), dwpe));
}

struct DeviceRun {
  float loss = 0.0f;
  float sync_loss = 0.0f;
  std::vector<std::vector<float>> grads;
};

// One forward + backward of `model`'s parameters on the device, with the phase API (residual stream in place).
// `steps` passes without zeroing the gradients (they accumulate, as GptModel's do across calls).
void RunDeviceModel(const GptModel& model, const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                    int B, int T, cublasHandle_t handle, cudaStream_t stream, DeviceRun* run, int steps = 1) {
  const GptConfig& cfg = model.config();
  std::vector<std::unique_ptr<Dev<float>>> params, grads;
  for (int u = 0; u < model.num_units(); ++u) {
    params.push_back(
        std::make_unique<Dev<float>>(std::vector<float>(model.params(u), model.params(u) + model.unit_numel(u))));
    grads.push_back(std::make_unique<Dev<float>>(std::vector<float>(model.unit_numel(u), 0.0f)));
  }
  auto acts = gc::DeviceActivations::Create(cfg, B, T);
  ASSERT_OK(acts);
  // NaN everywhere: a phase reading an activation nobody wrote poisons the gradients.
  ASSERT_EQ(cudaMemset(acts->data(), 0xFF, acts->bytes()), cudaSuccess);
  Dev<int32_t> d_tokens(tokens), d_targets(targets);
  const RootWeights rw = RootWeightsFromFlat(cfg, params[0]->get());
  const RootGrads rg = RootGradsFromFlat(cfg, grads[0]->get());
  for (int step = 0; step < steps; ++step) {
    ASSERT_OK(gc::EmbeddingForward(cfg, rw, d_tokens.get(), B, T, acts->x, stream));
    for (int l = 0; l < cfg.layers; ++l) {
      ASSERT_OK(gc::BlockForward(cfg, BlockWeightsFromFlat(cfg, params[l + 1]->get()), acts->x, acts->x,
                                 &acts->blocks[l], handle, stream));
    }
    // Forward of the head twice: the async variant (loss left on the device), then the Sync one, which must agree.
    ASSERT_OK(gc::HeadForward(cfg, rw, acts->x, d_targets.get(), &acts->head, handle, stream));
    ASSERT_EQ(cudaMemcpyAsync(&run->loss, acts->head.loss, sizeof(float), cudaMemcpyDeviceToHost, stream), cudaSuccess);
    auto loss = gc::HeadForwardSync(cfg, rw, acts->x, d_targets.get(), &acts->head, handle, stream);
    ASSERT_OK(loss);
    run->sync_loss = *loss;
    ASSERT_OK(gc::HeadBackward(cfg, rw, rg, &acts->head, acts->dx, handle, stream));
    for (int l = cfg.layers - 1; l >= 0; --l) {
      ASSERT_OK(gc::BlockBackward(cfg, BlockWeightsFromFlat(cfg, params[l + 1]->get()),
                                  BlockGradsFromFlat(cfg, grads[l + 1]->get()), acts->blocks[l], acts->dx, acts->dx,
                                  &acts->scratch, handle, stream));
    }
    ASSERT_OK(gc::EmbeddingBackward(cfg, rg, d_tokens.get(), B, T, acts->dx, stream));
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  run->grads.clear();
  for (auto& g : grads) run->grads.push_back(g->Download());
}

TEST_F(GptCudaTest, WholeTinyGptForwardBackwardMatchesGptModelAndIsDeterministic) {
  const GptConfig cfg = GptConfig::Tiny();
  auto model = GptModel::Create(cfg, 106);
  ASSERT_OK(model);
  std::mt19937_64 rng(106);
  for (auto [B, T] : {std::pair<int, int>{3, 20}, {1, 1}, {4, cfg.max_seq}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T);
    const auto tokens = RandomIds(rng, static_cast<size_t>(B) * T, cfg.vocab);
    const auto targets = RandomIds(rng, static_cast<size_t>(B) * T, cfg.vocab);
    model->ZeroGrads();
    auto cpu_loss = model->ForwardBackward(tokens.data(), targets.data(), B, T);
    ASSERT_OK(cpu_loss);
    DeviceRun run, again;
    RunDeviceModel(*model, tokens, targets, B, T, handle_, stream_, &run);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_EQ(cuda_testing::Bits(run.loss), cuda_testing::Bits(run.sync_loss));
    double worst = 0.0;
    cuda_testing::ExpectModelMatches(*model, *cpu_loss, run.loss, run.grads, &worst);
    std::printf(
        "[ device ] Tiny GPT B=%d T=%d: loss %.7f vs CPU %.7f, worst gradient normwise error %.3g "
        "(tolerance %.3g)\n",
        B, T, run.loss, *cpu_loss, worst, cuda_testing::kModelGradRel);
    RunDeviceModel(*model, tokens, targets, B, T, handle_, stream_, &again);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_EQ(cuda_testing::Bits(again.loss), cuda_testing::Bits(run.loss)) << "not deterministic";
    for (int u = 0; u < model->num_units(); ++u) {
      EXPECT_TRUE(Bitwise(again.grads[u], run.grads[u])) << "unit " << u << " not deterministic";
    }
    // Two steps without zeroing: every gradient must accumulate.
    auto cpu_loss2 = model->ForwardBackward(tokens.data(), targets.data(), B, T);
    ASSERT_OK(cpu_loss2);
    DeviceRun two;
    RunDeviceModel(*model, tokens, targets, B, T, handle_, stream_, &two, 2);
    ASSERT_FALSE(HasFatalFailure());
    cuda_testing::ExpectModelMatches(*model, *cpu_loss2, two.loss, two.grads, nullptr);
  }
}

}  // namespace
}  // namespace zero::gpt
