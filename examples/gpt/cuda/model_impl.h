// examples/gpt/cuda/model_impl.h — the GPT's phases (model.h) composed from the ops of ops_impl.h against an
// executor, plus the activation views of the device path. model_cuda.cu instantiates the phases with the device
// executor; the emulation test (tests/gpt/cuda_ops_emulation_test.cc) with a host one, on host memory, and
// compares the whole forward / backward with GptModel in CI.
//
//   ActivationViews acts;                       // carved out of one allocation (DeviceActivations owns one)
//   acts.Bind(cfg, B, T, memory);
//   ZERO_RETURN_IF_ERROR(impl::EmbeddingForward(ex, cfg, rw, tokens, B, T, acts.x));
//   for (l...) ZERO_RETURN_IF_ERROR(impl::BlockForward(ex, cfg, bw[l], acts.x, acts.x, &acts.blocks[l]));
//   ZERO_RETURN_IF_ERROR(impl::HeadForward(ex, cfg, rw, acts.x, targets, &acts.head));   // loss: *acts.head.loss
//
// Each phase issues the same ops in the same order as its CPU counterpart in model.cc, with the same aliasing
// (x_out may alias x_in, dx_in may alias dx_out); gradients accumulate (+=), activation gradients are written.
// Shape errors are kInvalidArgument (the CPU phases abort on them with ZERO_CHECK).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpt/cuda/ops_impl.h"
#include "gpt/model.h"
#include "zero/status.h"

namespace zero::gpt::cuda {

// ---- activation views ------------------------------------------------------------------------------------

// Temporaries of BlockBackward (as model.h's BlockScratch, except datt: every (b, h) at once, since the batched
// attention GEMMs process all of them in one go).
struct DeviceBlockScratch {
  int B = 0;
  int T = 0;
  float* dln = nullptr;   // [B*T, C]
  float* dqkv = nullptr;  // [B*T, 3C]
  float* dfch = nullptr;  // [B*T, 4C]
  float* datt = nullptr;  // [B, heads, T, T]
};

// What HeadBackward needs from HeadForward (model.h's views, as HeadActs) plus the loss, which stays on the
// device.
struct DeviceHeadActs : HeadActViews {
  double* row_loss = nullptr;  // [B*T] per-row cross-entropy (summed in row order into *loss)
  float* loss = nullptr;       // [1] mean cross-entropy of the last HeadForward
};

// Every activation buffer of one model for one (B, T), as views into one block of memory the caller owns (or
// DeviceActivations does). Move-only, like the BlockActs it holds.
struct ActivationViews {
  // Alignment of every view (cudaMalloc returns 256-byte-aligned memory).
  static constexpr size_t kAlign = 256;

  // Bytes Bind needs: layers x BlockActs::Bytes, the scratch, the head and the two [B*T, C] streams.
  static size_t Bytes(const GptConfig& cfg, int B, int T) { return Carve(cfg, B, T, nullptr, nullptr); }

  // Points the views into `memory` (Bytes(cfg, B, T) bytes, kAlign-aligned, not owned; host or device memory,
  // it is never dereferenced here).
  void Bind(const GptConfig& cfg, int batch, int seq, void* memory) {
    Carve(cfg, batch, seq, static_cast<std::byte*>(memory), this);
  }

  int B = 0;
  int T = 0;
  std::vector<BlockActs> blocks;  // one per layer
  DeviceBlockScratch scratch;
  DeviceHeadActs head;
  float* x = nullptr;   // [B*T, C] residual stream
  float* dx = nullptr;  // [B*T, C] its gradient

 private:
  static size_t Round(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

  // Lays the views out from `base` (nullptr: only measures). Returns the bytes used.
  static size_t Carve(const GptConfig& cfg, int B, int T, std::byte* base, ActivationViews* v) {
    const int64_t N = static_cast<int64_t>(B) * T;
    const int64_t C = cfg.channels;
    size_t off = 0;
    auto take = [&](size_t bytes) -> std::byte* {
      std::byte* p = base == nullptr ? nullptr : base + off;
      off += Round(bytes);
      return p;
    };
    auto f32 = [&](int64_t n) { return reinterpret_cast<float*>(take(sizeof(float) * n)); };
    if (v != nullptr) {
      v->B = B;
      v->T = T;
      v->blocks.clear();
      v->blocks.resize(cfg.layers);
    }
    const size_t block_bytes = BlockActs::Bytes(cfg, B, T);
    for (int l = 0; l < cfg.layers; ++l) {
      std::byte* p = take(block_bytes);
      if (v != nullptr) v->blocks[l].Bind(cfg, B, T, p);
    }
    DeviceBlockScratch s;
    s.B = B;
    s.T = T;
    s.dln = f32(N * C);
    s.dqkv = f32(N * 3 * C);
    s.dfch = f32(N * 4 * C);
    s.datt = f32(static_cast<int64_t>(B) * cfg.heads * T * T);
    DeviceHeadActs h;
    h.B = B;
    h.T = T;
    h.x_in = f32(N * C);
    h.lnf = f32(N * C);
    h.lnf_mean = f32(N);
    h.lnf_rstd = f32(N);
    h.probs = f32(N * cfg.vocab);
    h.dlnf = f32(N * C);
    h.targets = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * N));
    h.row_loss = reinterpret_cast<double*>(take(sizeof(double) * N));
    h.loss = f32(1);
    float* x = f32(N * C);
    float* dx = f32(N * C);
    if (v != nullptr) {
      v->scratch = s;
      v->head = h;
      v->x = x;
      v->dx = dx;
    }
    return off;
  }
};

namespace impl {

// ---- checks ----------------------------------------------------------------------------------------------

inline Status CheckShape(const GptConfig& cfg, int B, int T) {
  ZERO_RETURN_IF_ERROR(ValidateConfig(cfg));
  if (B < 1 || T < 1 || T > cfg.max_seq) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPT (B, T) = (", B, ", ", T, "): need B >= 1 and 1 <= T <= max_seq = ", cfg.max_seq));
  }
  return absl::OkStatus();
}

template <class Acts>
Status CheckActs(const char* phase, const Acts* a) {
  if (a == nullptr || a->x_in == nullptr || a->B < 1) {
    return absl::InvalidArgumentError(absl::StrCat(phase, ": activations not bound"));
  }
  return absl::OkStatus();
}

// ---- phases ----------------------------------------------------------------------------------------------

// x_out[b*T + t, :] = wte[tokens[b*T + t], :] + wpe[t, :].
template <class Ex>
Status EmbeddingForward(Ex& ex, const GptConfig& cfg, const RootWeights& w, const int32_t* tokens, int B, int T,
                        float* x_out) {
  ZERO_RETURN_IF_ERROR(CheckShape(cfg, B, T));
  ZERO_RETURN_IF_ERROR(CheckPointers("EmbeddingForward", {w.wte, w.wpe, tokens, x_out}));
  const int64_t N = static_cast<int64_t>(B) * T;
  return ex.Grid(body::EmbeddingForwardOp{w.wte, w.wpe, tokens, N, T, cfg.channels, cfg.vocab, x_out});
}

// r = x + proj(attn(ln1(x)));  out = r + fc_proj(gelu(fc(ln2(r)))). x_out may alias x_in.
template <class Ex>
Status BlockForward(Ex& ex, const GptConfig& cfg, const BlockWeights& w, const float* x_in, float* x_out,
                    BlockActs* acts) {
  ZERO_RETURN_IF_ERROR(CheckActs("BlockForward", acts));
  const int B = acts->B;
  const int T = acts->T;
  ZERO_RETURN_IF_ERROR(CheckShape(cfg, B, T));
  ZERO_RETURN_IF_ERROR(CheckPointers("BlockForward", {x_in, x_out}));
  const int64_t N = static_cast<int64_t>(B) * T;
  const int64_t C = cfg.channels;
  // Keep a copy of the input: layernorm 1's backward needs it, and the copy lets x_out alias x_in.
  if (acts->x_in != x_in) ZERO_RETURN_IF_ERROR(ex.Copy(acts->x_in, x_in, sizeof(float) * N * C));
  const float* x = acts->x_in;
  ZERO_RETURN_IF_ERROR(LayerNormForward(ex, x, w.ln1_w, w.ln1_b, N, C, acts->ln1, acts->ln1_mean, acts->ln1_rstd));
  ZERO_RETURN_IF_ERROR(MatmulForward(ex, acts->ln1, w.qkv_w, w.qkv_b, N, C, 3 * C, acts->qkv));
  ZERO_RETURN_IF_ERROR(AttentionForward(ex, acts->qkv, B, T, cfg.channels, cfg.heads, acts->att, acts->atty));
  ZERO_RETURN_IF_ERROR(MatmulForward(ex, acts->atty, w.attn_proj_w, w.attn_proj_b, N, C, C, acts->residual2));
  ZERO_RETURN_IF_ERROR(ResidualForward(ex, acts->residual2, x, N * C, acts->residual2));
  ZERO_RETURN_IF_ERROR(
      LayerNormForward(ex, acts->residual2, w.ln2_w, w.ln2_b, N, C, acts->ln2, acts->ln2_mean, acts->ln2_rstd));
  ZERO_RETURN_IF_ERROR(MatmulForward(ex, acts->ln2, w.fc_w, w.fc_b, N, C, 4 * C, acts->fch));
  ZERO_RETURN_IF_ERROR(GeluForward(ex, acts->fch, N * 4 * C, acts->fch_gelu));
  ZERO_RETURN_IF_ERROR(MatmulForward(ex, acts->fch_gelu, w.fc_proj_w, w.fc_proj_b, N, 4 * C, C, x_out));
  return ResidualForward(ex, x_out, acts->residual2, N * C, x_out);
}

// Final layernorm, tied LM head, softmax cross-entropy: the mean loss lands in *acts->loss (device memory).
template <class Ex>
Status HeadForward(Ex& ex, const GptConfig& cfg, const RootWeights& w, const float* x, const int32_t* targets,
                   DeviceHeadActs* acts) {
  ZERO_RETURN_IF_ERROR(CheckActs("HeadForward", acts));
  ZERO_RETURN_IF_ERROR(CheckShape(cfg, acts->B, acts->T));
  ZERO_RETURN_IF_ERROR(CheckPointers("HeadForward", {w.wte, w.lnf_w, w.lnf_b, x, targets}));
  const int64_t N = static_cast<int64_t>(acts->B) * acts->T;
  const int64_t C = cfg.channels;
  if (acts->x_in != x) ZERO_RETURN_IF_ERROR(ex.Copy(acts->x_in, x, sizeof(float) * N * C));
  ZERO_RETURN_IF_ERROR(ex.Copy(acts->targets, targets, sizeof(int32_t) * N));
  ZERO_RETURN_IF_ERROR(
      LayerNormForward(ex, acts->x_in, w.lnf_w, w.lnf_b, N, C, acts->lnf, acts->lnf_mean, acts->lnf_rstd));
  ZERO_RETURN_IF_ERROR(TiedHeadForward(ex, acts->lnf, w.wte, N, C, cfg.vocab, acts->probs));
  return SoftmaxCrossEntropyForward(ex, acts->probs, acts->targets, N, cfg.vocab, acts->probs, acts->loss,
                                    acts->row_loss);
}

// Accumulates into g.wte (LM-head half), g.lnf_w, g.lnf_b; writes dx. Consumes acts->probs (dlogits in place).
template <class Ex>
Status HeadBackward(Ex& ex, const GptConfig& cfg, const RootWeights& w, const RootGrads& g, DeviceHeadActs* acts,
                    float* dx) {
  ZERO_RETURN_IF_ERROR(CheckActs("HeadBackward", acts));
  ZERO_RETURN_IF_ERROR(CheckShape(cfg, acts->B, acts->T));
  ZERO_RETURN_IF_ERROR(CheckPointers("HeadBackward", {w.wte, w.lnf_w, g.wte, g.lnf_w, g.lnf_b, dx}));
  const int64_t N = static_cast<int64_t>(acts->B) * acts->T;
  const int64_t C = cfg.channels;
  float* dlogits = acts->probs;
  ZERO_RETURN_IF_ERROR(SoftmaxCrossEntropyBackward(ex, acts->probs, acts->targets, N, cfg.vocab, dlogits));
  ZERO_RETURN_IF_ERROR(TiedHeadBackward(ex, dlogits, acts->lnf, w.wte, N, C, cfg.vocab, acts->dlnf, g.wte));
  ZERO_RETURN_IF_ERROR(ex.Zero(dx, sizeof(float) * N * C));  // layernorm backward accumulates
  return LayerNormBackward(ex, acts->dlnf, acts->x_in, w.lnf_w, acts->lnf_mean, acts->lnf_rstd, N, C, dx, g.lnf_w,
                           g.lnf_b);
}

// Accumulates into every field of g; writes dx_in from dx_out (dx_in may alias dx_out).
template <class Ex>
Status BlockBackward(Ex& ex, const GptConfig& cfg, const BlockWeights& w, const BlockGrads& g, const BlockActs& acts,
                     const float* dx_out, float* dx_in, DeviceBlockScratch* scratch) {
  ZERO_RETURN_IF_ERROR(CheckActs("BlockBackward", &acts));
  if (scratch == nullptr || scratch->dln == nullptr || scratch->B != acts.B || scratch->T != acts.T) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockBackward: scratch not bound for (B, T) = (", acts.B, ", ", acts.T, ")"));
  }
  const int B = acts.B;
  const int T = acts.T;
  ZERO_RETURN_IF_ERROR(CheckShape(cfg, B, T));
  ZERO_RETURN_IF_ERROR(CheckPointers("BlockBackward", {dx_out, dx_in}));
  const int64_t N = static_cast<int64_t>(B) * T;
  const int64_t C = cfg.channels;
  // dx_in doubles as the gradient of the residual stream (see model.cc).
  float* dres = dx_in;
  if (dx_in != dx_out) ZERO_RETURN_IF_ERROR(ex.Copy(dres, dx_out, sizeof(float) * N * C));
  // MLP branch.
  ZERO_RETURN_IF_ERROR(
      MatmulBackward(ex, dres, acts.fch_gelu, w.fc_proj_w, N, 4 * C, C, scratch->dfch, g.fc_proj_w, g.fc_proj_b));
  ZERO_RETURN_IF_ERROR(GeluBackward(ex, scratch->dfch, acts.fch, N * 4 * C, scratch->dfch));
  ZERO_RETURN_IF_ERROR(MatmulBackward(ex, scratch->dfch, acts.ln2, w.fc_w, N, C, 4 * C, scratch->dln, g.fc_w, g.fc_b));
  ZERO_RETURN_IF_ERROR(LayerNormBackward(ex, scratch->dln, acts.residual2, w.ln2_w, acts.ln2_mean, acts.ln2_rstd, N, C,
                                         dres, g.ln2_w, g.ln2_b));
  // Attention branch: dln holds d(atty) first, then d(ln1).
  ZERO_RETURN_IF_ERROR(
      MatmulBackward(ex, dres, acts.atty, w.attn_proj_w, N, C, C, scratch->dln, g.attn_proj_w, g.attn_proj_b));
  ZERO_RETURN_IF_ERROR(AttentionBackward(ex, scratch->dln, acts.qkv, acts.att, B, T, cfg.channels, cfg.heads,
                                         scratch->dqkv, scratch->datt));
  ZERO_RETURN_IF_ERROR(
      MatmulBackward(ex, scratch->dqkv, acts.ln1, w.qkv_w, N, C, 3 * C, scratch->dln, g.qkv_w, g.qkv_b));
  return LayerNormBackward(ex, scratch->dln, acts.x_in, w.ln1_w, acts.ln1_mean, acts.ln1_rstd, N, C, dres, g.ln1_w,
                           g.ln1_b);
}

// g.wte[tokens[i]] += dx[i] (embedding half of the tied gradient), g.wpe[t] += dx[b*T + t]; rows in order.
template <class Ex>
Status EmbeddingBackward(Ex& ex, const GptConfig& cfg, const RootGrads& g, const int32_t* tokens, int B, int T,
                         const float* dx) {
  ZERO_RETURN_IF_ERROR(CheckShape(cfg, B, T));
  ZERO_RETURN_IF_ERROR(CheckPointers("EmbeddingBackward", {g.wte, g.wpe, tokens, dx}));
  const int64_t N = static_cast<int64_t>(B) * T;
  ZERO_RETURN_IF_ERROR(ex.Grid(body::EmbeddingBackwardWteOp{dx, tokens, N, cfg.channels, cfg.vocab, g.wte}));
  return ex.Grid(body::EmbeddingBackwardWpeOp{dx, B, T, cfg.channels, g.wpe});
}

}  // namespace impl
}  // namespace zero::gpt::cuda
