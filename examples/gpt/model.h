// examples/gpt/model.h — a GPT-2-style decoder-only transformer on the CPU, forward and backward, cut into the
// units a sharding engine gathers one at a time.
//
// Single process, whole model (the reference the sharded trainer is compared against):
//
//   zero::gpt::SetBlasThreads(1);
//   ZERO_ASSIGN_OR_RETURN(zero::gpt::GptModel model, zero::gpt::GptModel::Create(zero::gpt::GptConfig::Tiny(), 1));
//   model.ZeroGrads();
//   ZERO_ASSIGN_OR_RETURN(float loss, model.ForwardBackward(tokens, targets, B, T));
//   // model.grads(u) now holds dL/dparams of unit u (L = mean cross-entropy over the B*T tokens)
//
// Per phase, the way a trainer drives it with one unit gathered at a time (FSDP's root-module pattern: the
// root unit is needed by the first and the last phase of forward AND backward, since the LM head is tied to
// wte, so it stays gathered across the whole step):
//
//   RootWeights rw = RootWeightsFromFlat(cfg, root_params);        // or ...FromLookup(engine view lookup)
//   EmbeddingForward(cfg, rw, tokens, B, T, x);                    // x: [B*T, C] residual stream
//   for (l = 0..L-1) BlockForward(cfg, BlockWeightsFromFlat(cfg, block_params[l]), x, x, &acts[l]);
//   float loss = HeadForward(cfg, rw, x, targets, &head);
//   HeadBackward(cfg, rw, root_grads, &head, dx);                  // root grads +=, dx written
//   for (l = L-1..0) BlockBackward(cfg, bw[l], bg[l], acts[l], dx, dx, &scratch);
//   EmbeddingBackward(cfg, root_grads, tokens, B, T, dx);          // wte gets its second contribution
//
// Parameter layout (each unit is one flat buffer, its parameters packed contiguously in the order of
// RootParams / BlockParams, no padding between them):
// - root "root":   wte [V, C], wpe [max_seq, C], lnf_w [C], lnf_b [C]
// - block "h.<i>": ln1_w [C], ln1_b [C], qkv_w [C, 3C], qkv_b [3C], attn_proj_w [C, C], attn_proj_b [C],
//                  ln2_w [C], ln2_b [C], fc_w [C, 4C], fc_b [4C], fc_proj_w [4C, C], fc_proj_b [C]
// Linear weights are stored [in, out] row-major, so a layer is y = x W + b (one sgemm without transposes);
// this is the transpose of PyTorch's nn.Linear.weight. qkv_w's output columns are q | k | v, each split into
// `heads` heads of C / heads channels. The LM head is wte itself: logits = lnf(x) wte^T.
//
// Gradients: every backward function ACCUMULATES (+=) into parameter gradients (the caller / engine zeroes
// them once per step), and WRITES (=) activation gradients. Loss and gradients are of the MEAN cross-entropy
// over the B*T tokens of the call.
//
// Threads and determinism: the math runs on the calling thread plus OpenBLAS's threads (SetBlasThreads).
// With a fixed BLAS thread count the results are bit-identical run after run. OpenBLAS's thread count is one
// process-wide setting, and concurrent multithreaded calls from several application threads serialize inside
// OpenBLAS; so with N ranks as N threads in one process, use SetBlasThreads(1) and let the rank threads
// provide the parallelism. Functions here are otherwise thread-compatible: distinct calls on distinct buffers
// may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zero/status.h"

namespace zero::gpt {

// ---- configuration ---------------------------------------------------------------------------------------

// Model shape. vocab is 256 for the byte-level corpus (data.h).
struct GptConfig {
  int vocab = 256;    // V: token ids lie in [0, vocab)
  int max_seq = 32;   // longest sequence T the position table wpe covers
  int layers = 2;     // number of transformer blocks ("h.0" .. "h.<layers-1>")
  int heads = 2;      // attention heads; must divide channels
  int channels = 64;  // C: width of the residual stream

  // ~0.12 M parameters: seq 32, 2 layers, 2 heads, 64 channels. For tests.
  static GptConfig Tiny();
  // ~10.8 M parameters: seq 128, 6 layers, 6 heads, 384 channels. For benchmarks.
  static GptConfig Small();
  // Looks a preset up by name ("tiny", "small"); kInvalidArgument names the unknown value.
  static absl::StatusOr<GptConfig> FromName(const std::string& name);

  int head_size() const { return channels / heads; }
};

// OK when every field is positive and heads divides channels; otherwise kInvalidArgument naming the field.
[[nodiscard]] absl::Status ValidateConfig(const GptConfig& cfg);

// ---- parameters and units --------------------------------------------------------------------------------

// One parameter of a unit: its name inside the unit and its shape (row-major).
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;

  int64_t numel() const;
};

// Name of the unit holding the embeddings, the final layernorm and (tied) the LM head.
inline constexpr char kRootUnit[] = "root";
// "h.<layer>": the name of block `layer`'s unit.
std::string BlockUnitName(int layer);

// The root unit's parameters in packing order: wte, wpe, lnf_w, lnf_b.
std::vector<ParamSpec> RootParams(const GptConfig& cfg);
// A block unit's parameters in packing order (see the file comment); the same for every block.
std::vector<ParamSpec> BlockParams(const GptConfig& cfg);
// Sum of numel() over `specs`: the element count of a unit's flat buffer.
int64_t UnitNumel(const std::vector<ParamSpec>& specs);
// Total parameter count of the model (root + layers blocks).
int64_t NumParams(const GptConfig& cfg);

// Fills out[0, numel) with the initial value of parameter `spec` of unit `unit`, GPT-2 style: layernorm
// weights 1, biases 0, attn_proj_w and fc_proj_w ~ N(0, 0.02 / sqrt(2 * layers)), every other weight
// ~ N(0, 0.02). Element i is a pure function of (seed, unit, spec.name, i) — a counter-based generator, no
// sequential state — so the values do not depend on world size or on how a unit is sharded.
// kInvalidArgument when `unit` is not "root" / "h.<i>" with i < cfg.layers, or `spec` (name and shape) is not
// one of that unit's parameters.
[[nodiscard]] absl::Status InitParam(uint64_t seed, const GptConfig& cfg, const std::string& unit,
                                     const ParamSpec& spec, float* out);

// Like InitParam but fills only elements [begin, begin + count) of the parameter into out[0, count): a shard
// that holds part of a parameter initializes just that part, with the same values. kOutOfRange when the range
// does not lie inside the parameter.
[[nodiscard]] absl::Status InitParamSlice(uint64_t seed, const GptConfig& cfg, const std::string& unit,
                                          const ParamSpec& spec, int64_t begin, int64_t count, float* out);

// ---- parameter views -------------------------------------------------------------------------------------

// Pointers to the root unit's parameters (T = const float for weights, float for gradients).
template <typename T>
struct RootView {
  T* wte = nullptr;    // [V, C]
  T* wpe = nullptr;    // [max_seq, C]
  T* lnf_w = nullptr;  // [C]
  T* lnf_b = nullptr;  // [C]
};
using RootWeights = RootView<const float>;
using RootGrads = RootView<float>;

// Pointers to one block's parameters; shapes as in the file comment.
template <typename T>
struct BlockView {
  T* ln1_w = nullptr;
  T* ln1_b = nullptr;
  T* qkv_w = nullptr;
  T* qkv_b = nullptr;
  T* attn_proj_w = nullptr;
  T* attn_proj_b = nullptr;
  T* ln2_w = nullptr;
  T* ln2_b = nullptr;
  T* fc_w = nullptr;
  T* fc_b = nullptr;
  T* fc_proj_w = nullptr;
  T* fc_proj_b = nullptr;
};
using BlockWeights = BlockView<const float>;
using BlockGrads = BlockView<float>;

// Views into a unit's flat buffer `base` whose parameters are packed in spec order without padding (the
// layout the engine guarantees within a unit). `base` must hold UnitNumel(...) floats; not owned.
RootWeights RootWeightsFromFlat(const GptConfig& cfg, const float* base);
RootGrads RootGradsFromFlat(const GptConfig& cfg, float* base);
BlockWeights BlockWeightsFromFlat(const GptConfig& cfg, const float* base);
BlockGrads BlockGradsFromFlat(const GptConfig& cfg, float* base);

// Resolves a parameter name of the unit (e.g. "qkv_w") to a pointer; nullptr when it has none.
using ParamLookup = std::function<float*(const std::string& name)>;

// Views whose pointers come from `lookup`, called once per parameter name; kNotFound names the first
// parameter for which it returned nullptr.
absl::StatusOr<RootWeights> RootWeightsFromLookup(const ParamLookup& lookup);
absl::StatusOr<RootGrads> RootGradsFromLookup(const ParamLookup& lookup);
absl::StatusOr<BlockWeights> BlockWeightsFromLookup(const ParamLookup& lookup);
absl::StatusOr<BlockGrads> BlockGradsFromLookup(const ParamLookup& lookup);

// ---- activations -----------------------------------------------------------------------------------------

// Everything BlockBackward needs from BlockForward for one block and one (B, T). The memory is one block
// carved into views (each view 64-byte aligned relative to the base); it is either owned (Allocate) or the
// caller's (Bind: e.g. from an engine allocator tagged "activations"). Move-only; moving keeps the views valid.
struct BlockActs {
  // Bytes of one block's saved activations at (B, T): 16 B*T*C floats + B*heads*T*T floats + 2*2*B*T floats
  // (layernorm statistics), each view rounded up to 64 bytes.
  static size_t Bytes(const GptConfig& cfg, int B, int T);

  BlockActs() = default;
  BlockActs(BlockActs&&) = default;
  BlockActs& operator=(BlockActs&&) = default;
  BlockActs(const BlockActs&) = delete;
  BlockActs& operator=(const BlockActs&) = delete;

  // Allocates and owns Bytes(cfg, B, T) bytes (contents unspecified until BlockForward writes them).
  void Allocate(const GptConfig& cfg, int B, int T);
  // Carves the views out of caller memory of at least Bytes(cfg, B, T) bytes, 64-byte aligned; the caller
  // keeps it alive while these acts are used. Drops any owned memory.
  void Bind(const GptConfig& cfg, int B, int T, void* memory);

  int B = 0;
  int T = 0;
  float* x_in = nullptr;       // [B*T, C] copy of the block input (layernorm 1 backward needs it)
  float* ln1 = nullptr;        // [B*T, C]
  float* ln1_mean = nullptr;   // [B*T]
  float* ln1_rstd = nullptr;   // [B*T]
  float* qkv = nullptr;        // [B*T, 3C]
  float* att = nullptr;        // [B, heads, T, T] softmax probabilities
  float* atty = nullptr;       // [B*T, C] attention output before the projection
  float* residual2 = nullptr;  // [B*T, C] x_in + attention branch
  float* ln2 = nullptr;        // [B*T, C]
  float* ln2_mean = nullptr;   // [B*T]
  float* ln2_rstd = nullptr;   // [B*T]
  float* fch = nullptr;        // [B*T, 4C] MLP hidden before GELU
  float* fch_gelu = nullptr;   // [B*T, 4C] after GELU

 private:
  std::unique_ptr<std::byte[]> owned_;
};

// BlockActs::Bytes, under the name the trainer's memory report uses.
size_t BlockActivationBytes(const GptConfig& cfg, int B, int T);

// Temporaries of BlockBackward, reused by every block (one per rank). Same ownership model as BlockActs.
struct BlockScratch {
  // 8 B*T*C floats (dln, dqkv, dfch) + T*T floats (attention), each rounded up to 64 bytes.
  static size_t Bytes(const GptConfig& cfg, int B, int T);

  BlockScratch() = default;
  BlockScratch(BlockScratch&&) = default;
  BlockScratch& operator=(BlockScratch&&) = default;
  BlockScratch(const BlockScratch&) = delete;
  BlockScratch& operator=(const BlockScratch&) = delete;

  void Allocate(const GptConfig& cfg, int B, int T);
  void Bind(const GptConfig& cfg, int B, int T, void* memory);

  int B = 0;
  int T = 0;
  float* dln = nullptr;   // [B*T, C] gradient of a layernorm output, and of the attention output before it
  float* dqkv = nullptr;  // [B*T, 3C]
  float* dfch = nullptr;  // [B*T, 4C]
  float* datt = nullptr;  // [T, T]

 private:
  std::unique_ptr<std::byte[]> owned_;
};

// The head's saved activations as views (shared by HeadActs and the CUDA path's DeviceHeadActs).
struct HeadActViews {
  int B = 0;
  int T = 0;
  float* x_in = nullptr;       // [B*T, C] copy of the input of the final layernorm
  float* lnf = nullptr;        // [B*T, C]
  float* lnf_mean = nullptr;   // [B*T]
  float* lnf_rstd = nullptr;   // [B*T]
  float* probs = nullptr;      // [B*T, V] softmax of the logits (dlogits after HeadBackward)
  float* dlnf = nullptr;       // [B*T, C] backward temporary
  int32_t* targets = nullptr;  // [B*T] copy of the targets
};

// What HeadBackward needs from HeadForward. Same ownership model as BlockActs. HeadBackward turns `probs`
// into dlogits in place, so one HeadForward is followed by at most one HeadBackward.
struct HeadActs : HeadActViews {
  // 3 B*T*C floats + B*T*V floats + 2 B*T floats + B*T int32 targets, each rounded up to 64 bytes.
  static size_t Bytes(const GptConfig& cfg, int B, int T);

  HeadActs() = default;
  HeadActs(HeadActs&&) = default;
  HeadActs& operator=(HeadActs&&) = default;
  HeadActs(const HeadActs&) = delete;
  HeadActs& operator=(const HeadActs&) = delete;

  void Allocate(const GptConfig& cfg, int B, int T);
  void Bind(const GptConfig& cfg, int B, int T, void* memory);

 private:
  std::unique_ptr<std::byte[]> owned_;
};

// ---- phases ----------------------------------------------------------------------------------------------
// Preconditions (checked with ZERO_CHECK, i.e. a caller bug aborts): B >= 1, 1 <= T <= cfg.max_seq, token and
// target ids in [0, cfg.vocab), acts / scratch allocated for the same (B, T) as the call.

// x_out[b*T + t, :] = wte[tokens[b*T + t], :] + wpe[t, :]. tokens is [B, T] row-major.
void EmbeddingForward(const GptConfig& cfg, const RootWeights& w, const int32_t* tokens, int B, int T, float* x_out);

// One transformer block, pre-layernorm GPT-2 style:
//   r = x + proj(attn(ln1(x)));  out = r + fc_proj(gelu(fc(ln2(r))))
// B and T are acts->B / acts->T. x_out may alias x_in (the block keeps its own copy of the input).
void BlockForward(const GptConfig& cfg, const BlockWeights& w, const float* x_in, float* x_out, BlockActs* acts);

// Final layernorm, tied LM head (logits = lnf(x) wte^T) and softmax cross-entropy against targets [B, T].
// Returns the mean loss over the B*T tokens; saves what HeadBackward needs (including a copy of targets).
float HeadForward(const GptConfig& cfg, const RootWeights& w, const float* x, const int32_t* targets, HeadActs* acts);

// Backward of HeadForward: accumulates into g.wte (the LM-head half of the tied gradient), g.lnf_w, g.lnf_b
// and writes dx [B*T, C] = dL/dx. Consumes acts->probs (see HeadActs).
void HeadBackward(const GptConfig& cfg, const RootWeights& w, const RootGrads& g, HeadActs* acts, float* dx);

// Backward of BlockForward: accumulates into every field of g and writes dx_in = dL/dx_in given
// dx_out = dL/dx_out. dx_in may alias dx_out.
void BlockBackward(const GptConfig& cfg, const BlockWeights& w, const BlockGrads& g, const BlockActs& acts,
                   const float* dx_out, float* dx_in, BlockScratch* scratch);

// Backward of EmbeddingForward: g.wte[tokens[i]] += dx[i] (the embedding half of the tied gradient) and
// g.wpe[t] += dx[b*T + t]. Rows are visited in a fixed order, so repeated tokens accumulate deterministically.
void EmbeddingBackward(const GptConfig& cfg, const RootGrads& g, const int32_t* tokens, int B, int T, const float* dx);

// ---- BLAS threads ----------------------------------------------------------------------------------------

// Sets OpenBLAS's thread count for the whole process (openblas_set_num_threads); n >= 1.
void SetBlasThreads(int n);
// OpenBLAS's current thread count.
int BlasThreads();
// The CPU kernel set OpenBLAS picked at load time (e.g. "SkylakeX", "Haswell"). OpenBLAS 0.3.21 (Debian 12)
// does not recognize recent CPUs (e.g. Intel family 6 model 207) and falls back to "Prescott", SSE3 kernels
// 3-5x slower; the only remedy is the environment variable OPENBLAS_CORETYPE (e.g. Haswell or SkylakeX, which
// the CPU must support), read when the library loads, so it must be set before the process starts.
std::string BlasCoreName();

// ---- the whole model in one process ----------------------------------------------------------------------

// Owns full (unsharded) parameters and gradients, one flat buffer each, units packed back to back in the order
// root, h.0, ..., h.<L-1>; activations are (re)allocated on demand for the (B, T) of the call. The
// single-process reference for the sharded trainer, and the model of the tests. Not thread-safe.
class GptModel {
 public:
  // Builds the model with every parameter initialized by InitParam(seed, ...); grads zeroed.
  // kInvalidArgument when cfg is invalid.
  static absl::StatusOr<GptModel> Create(const GptConfig& cfg, uint64_t seed);

  GptModel(GptModel&&) = default;
  GptModel& operator=(GptModel&&) = default;

  const GptConfig& config() const { return cfg_; }
  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  // "root", "h.0", ..., in packing order.
  const std::vector<std::string>& unit_names() const { return unit_names_; }
  int num_units() const { return static_cast<int>(unit_names_.size()); }
  // Flat buffers of unit `u` (index into unit_names()), unit_numel(u) floats each.
  float* params(int u) { return params_.data() + unit_offset_[u]; }
  const float* params(int u) const { return params_.data() + unit_offset_[u]; }
  float* grads(int u) { return grads_.data() + unit_offset_[u]; }
  const float* grads(int u) const { return grads_.data() + unit_offset_[u]; }
  int64_t unit_numel(int u) const { return unit_offset_[u + 1] - unit_offset_[u]; }
  // The whole flat parameter / gradient buffers (num_params() floats).
  float* all_params() { return params_.data(); }
  float* all_grads() { return grads_.data(); }
  const float* all_grads() const { return grads_.data(); }

  // Pointer to one parameter (or its gradient) by unit and name; kNotFound names what is missing.
  absl::StatusOr<float*> Param(const std::string& unit, const std::string& name);
  absl::StatusOr<float*> Grad(const std::string& unit, const std::string& name);

  void ZeroGrads();

  // Mean cross-entropy of predicting targets [B, T] from tokens [B, T]; no gradients. kInvalidArgument for
  // B < 1, T outside [1, max_seq] or an id outside [0, vocab).
  absl::StatusOr<float> Forward(const int32_t* tokens, const int32_t* targets, int B, int T);
  // Forward then backward: ACCUMULATES the gradient of the mean loss into grads() (call ZeroGrads() first for
  // a fresh gradient) and returns the loss. Errors as Forward.
  absl::StatusOr<float> ForwardBackward(const int32_t* tokens, const int32_t* targets, int B, int T);

  // Bytes of the activation, head and scratch buffers currently allocated.
  size_t activation_bytes() const;

 private:
  GptModel() = default;
  absl::Status Validate(const int32_t* tokens, const int32_t* targets, int B, int T) const;
  void EnsureActivations(int B, int T);
  float RunForward(const int32_t* tokens, const int32_t* targets);

  GptConfig cfg_;
  std::vector<std::string> unit_names_;
  std::vector<int64_t> unit_offset_;  // num_units + 1 entries
  std::vector<float> params_;
  std::vector<float> grads_;
  int act_B_ = 0;
  int act_T_ = 0;
  std::vector<BlockActs> block_acts_;
  HeadActs head_acts_;
  BlockScratch scratch_;
  std::vector<float> x_;   // [B*T, C] residual stream
  std::vector<float> dx_;  // [B*T, C] its gradient
};

}  // namespace zero::gpt
