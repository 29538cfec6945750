// zero-flat-trainer: a complete small trainer in the style of llm.c's train_gpt2.c, and the same trainer on
// zero::ShardedOptimizer. One malloc'd parameter buffer and one gradient buffer, each tensor stacked across layers
// as [L, ...], pointers into the buffers computed once; the model is a residual MLP classifier (per layer: a
// layernorm, fc, GELU, proj and a residual add) on a synthetic task whose batches depend only on the seed.
//
//   zero-flat-trainer --steps 20                        # the trainer's own AdamW, one process, the whole batch
//   zero-flat-trainer --zero --world 4 --stage 2 --json # ShardedOptimizer, 4 thread-ranks (Gloo), 1/4 batch each
//   zero-run -n 4 -- zero-flat-trainer --zero           # one rank per process
//
// Without --zero the trainer runs alone on the whole global batch: --world must be 1 (and the launcher's world
// too: torchrun's, OpenMPI's or Slurm's). With --zero each of N ranks takes its 1/N slice of the same global batch,
// computes the mean loss over its slice into the gradient buffer and calls Step(), which averages the gradients over
// the ranks: the run equals the single-process one up to rounding (tests/examples/flat_trainer_test.cc checks it).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "zero/checkpoint.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/sharded_optimizer.h"
#include "zero/status.h"

namespace {

// ----------------------------------------------------------------------------------------------------------------
// The model: sizes, the parameter tensors in buffer order, the activations.

struct ModelConfig {
  int in = 16;        // D: input features
  int channels = 32;  // C: the residual stream
  int hidden = 64;    // H: the MLP's hidden width
  int layers = 4;     // L
  int classes = 8;    // K
};
constexpr int kBatch = 32;  // the global batch (samples per step), split over the ranks with --zero

// AdamW's hyperparameters. The embedded config of --zero is written from these, so both paths use the same.
struct AdamW {
  double lr = 3e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.1;
  bool decay_2d_only = false;  // llm.c's rule: decay only the weight matrices (--decay-2d; a ParamGroup on --zero)
};

struct ParameterTensors {
  float* wi;     // (C, D) input projection
  float* bi;     // (C)
  float* lnw;    // (L, C) layernorm
  float* lnb;    // (L, C)
  float* fcw;    // (L, H, C)
  float* fcb;    // (L, H)
  float* projw;  // (L, C, H)
  float* projb;  // (L, C)
  float* lnfw;   // (C) final layernorm
  float* lnfb;   // (C)
  float* wo;     // (K, C) classifier head
  float* bo;     // (K)
};
constexpr int kNumParamTensors = sizeof(ParameterTensors) / sizeof(float*);

// The tensors in the order of ParameterTensors; `matrix` marks weight matrices (what --decay-2d decays).
struct TensorInfo {
  zero::ParamSpec spec;
  bool matrix;
};
std::vector<TensorInfo> ParamTensors(const ModelConfig& c) {
  const int64_t D = c.in, C = c.channels, H = c.hidden, L = c.layers, K = c.classes;
  return {{{"wi", {C, D}}, true},       {{"bi", {C}}, false},       {{"lnw", {L, C}}, false},
          {{"lnb", {L, C}}, false},     {{"fcw", {L, H, C}}, true}, {{"fcb", {L, H}}, false},
          {{"projw", {L, C, H}}, true}, {{"projb", {L, C}}, false}, {{"lnfw", {C}}, false},
          {{"lnfb", {C}}, false},       {{"wo", {K, C}}, true},     {{"bo", {K}}, false}};
}

// Activations of one slice of B samples (and, in a second instance, their gradients, as llm.c keeps them).
struct ActivationTensors {
  float* res;       // (L+1, B, C) the residual stream before each layer and after the last
  float* ln;        // (L, B, C)
  float* ln_mean;   // (L, B)
  float* ln_rstd;   // (L, B)
  float* fch;       // (L, B, H)
  float* fch_gelu;  // (L, B, H)
  float* lnf;       // (B, C)
  float* lnf_mean;  // (B)
  float* lnf_rstd;  // (B)
  float* logits;    // (B, K)
  float* probs;     // (B, K)
};
constexpr int kNumActTensors = sizeof(ActivationTensors) / sizeof(float*);

// Points the n pointers of `tensors` (a struct of float*) at consecutive slices of ONE zeroed buffer of at least
// `capacity` floats: llm.c's malloc_and_point_parameters. The zeroed padding past the tensors stays unread.
float* MallocAndPoint(void* tensors, const size_t* sizes, int n, size_t capacity, size_t* total) {
  *total = 0;
  for (int i = 0; i < n; ++i) *total += sizes[i];
  float* mem = static_cast<float*>(std::calloc(std::max(*total, capacity), sizeof(float)));
  float** ptrs = static_cast<float**>(tensors);
  size_t off = 0;
  for (int i = 0; i < n; ++i) {
    ptrs[i] = mem + off;
    off += sizes[i];
  }
  return mem;
}

// ----------------------------------------------------------------------------------------------------------------
// Forward and backward passes in plain loops (llm.c's layers; weights are (out, in), rows of `inp` are samples).

void MatmulForward(float* out, const float* inp, const float* w, const float* bias, int B, int C, int OC) {
  for (int b = 0; b < B; ++b) {
    for (int o = 0; o < OC; ++o) {
      float val = bias[o];
      for (int i = 0; i < C; ++i) val += inp[b * C + i] * w[o * C + i];
      out[b * OC + o] = val;
    }
  }
}

void MatmulBackward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w, int B,
                    int C, int OC) {
  for (int b = 0; b < B; ++b) {
    for (int o = 0; o < OC; ++o) {
      const float d = dout[b * OC + o];
      dbias[o] += d;
      for (int i = 0; i < C; ++i) {
        dw[o * C + i] += inp[b * C + i] * d;
        if (dinp != nullptr) dinp[b * C + i] += w[o * C + i] * d;
      }
    }
  }
}

void LayernormForward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* bias, int B,
                      int C) {
  for (int b = 0; b < B; ++b) {
    const float* x = inp + b * C;
    float m = 0, v = 0;
    for (int i = 0; i < C; ++i) m += x[i];
    m /= C;
    for (int i = 0; i < C; ++i) v += (x[i] - m) * (x[i] - m);
    const float s = 1.0f / std::sqrt(v / C + 1e-5f);
    for (int i = 0; i < C; ++i) out[b * C + i] = (x[i] - m) * s * w[i] + bias[i];
    mean[b] = m;
    rstd[b] = s;
  }
}

void LayernormBackward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                       const float* mean, const float* rstd, int B, int C) {
  for (int b = 0; b < B; ++b) {
    const float *x = inp + b * C, *dy = dout + b * C;
    float dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int i = 0; i < C; ++i) {
      const float norm = (x[i] - mean[b]) * rstd[b];
      dnorm_mean += w[i] * dy[i];
      dnorm_norm_mean += w[i] * dy[i] * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int i = 0; i < C; ++i) {
      const float norm = (x[i] - mean[b]) * rstd[b];
      dbias[i] += dy[i];
      dw[i] += norm * dy[i];
      dinp[b * C + i] += (w[i] * dy[i] - dnorm_mean - norm * dnorm_norm_mean) * rstd[b];
    }
  }
}

const float kGeluScale = std::sqrt(2.0f / static_cast<float>(M_PI));

void GeluForward(float* out, const float* inp, int n) {
  for (int i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + 0.044715f * x * x * x)));
  }
}

void GeluBackward(float* dinp, const float* inp, const float* dout, int n) {
  for (int i = 0; i < n; ++i) {
    const float x = inp[i], arg = kGeluScale * (x + 0.044715f * x * x * x);
    const float th = std::tanh(arg), ch = std::cosh(arg);
    const float local =
        0.5f * (1.0f + th) + x * 0.5f * (1.0f / (ch * ch)) * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += local * dout[i];
  }
}

struct Model {
  ModelConfig config;
  ParameterTensors params;
  ParameterTensors grads;
  float* params_memory = nullptr;
  float* grads_memory = nullptr;
  size_t num_parameters = 0;
  ActivationTensors acts;
  ActivationTensors grad_acts;
  float* acts_memory = nullptr;
  float* grad_acts_memory = nullptr;
  size_t num_activations = 0;
  float* m_memory = nullptr;  // AdamW's moments (the trainer's own loop only)
  float* v_memory = nullptr;

  // The buffers are freed however Train returns (an error, say a --resume that does not load, returns early).
  Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  ~Model() {
    for (float* mem : {params_memory, grads_memory, acts_memory, grad_acts_memory, m_memory, v_memory}) std::free(mem);
  }
};

// The mean cross-entropy over the B samples of `x` (B, D) with labels `y`; keeps the activations for Backward.
float Forward(Model* model, const float* x, const int* y, int B) {
  const ModelConfig& c = model->config;
  const int D = c.in, C = c.channels, H = c.hidden, L = c.layers, K = c.classes;
  const ParameterTensors& p = model->params;
  ActivationTensors& a = model->acts;
  MatmulForward(a.res, x, p.wi, p.bi, B, D, C);
  for (int l = 0; l < L; ++l) {
    const float* res = a.res + l * B * C;
    float* res_next = a.res + (l + 1) * B * C;
    float *ln = a.ln + l * B * C, *fch = a.fch + l * B * H, *fch_gelu = a.fch_gelu + l * B * H;
    LayernormForward(ln, a.ln_mean + l * B, a.ln_rstd + l * B, res, p.lnw + l * C, p.lnb + l * C, B, C);
    MatmulForward(fch, ln, p.fcw + l * H * C, p.fcb + l * H, B, C, H);
    GeluForward(fch_gelu, fch, B * H);
    MatmulForward(res_next, fch_gelu, p.projw + l * C * H, p.projb + l * C, B, H, C);
    for (int i = 0; i < B * C; ++i) res_next[i] += res[i];
  }
  LayernormForward(a.lnf, a.lnf_mean, a.lnf_rstd, a.res + L * B * C, p.lnfw, p.lnfb, B, C);
  MatmulForward(a.logits, a.lnf, p.wo, p.bo, B, C, K);
  double loss = 0;
  for (int b = 0; b < B; ++b) {
    const float* logit = a.logits + b * K;
    float* prob = a.probs + b * K;
    const float maxv = *std::max_element(logit, logit + K);
    float sum = 0;
    for (int k = 0; k < K; ++k) sum += prob[k] = std::exp(logit[k] - maxv);
    for (int k = 0; k < K; ++k) prob[k] /= sum;
    loss -= std::log(prob[y[b]]);
  }
  return static_cast<float>(loss / B);
}

// Adds the gradient of Forward's mean loss to model->grads (the caller zeroes them first, as llm.c's zero_grad).
void Backward(Model* model, const float* x, const int* y, int B) {
  const ModelConfig& c = model->config;
  const int C = c.channels, H = c.hidden, L = c.layers, K = c.classes, D = c.in;
  const ParameterTensors &p = model->params, &g = model->grads;
  const ActivationTensors& a = model->acts;
  ActivationTensors& d = model->grad_acts;
  std::memset(model->grad_acts_memory, 0, model->num_activations * sizeof(float));
  for (int b = 0; b < B; ++b) {
    for (int k = 0; k < K; ++k) d.logits[b * K + k] = (a.probs[b * K + k] - (k == y[b] ? 1.0f : 0.0f)) / B;
  }
  MatmulBackward(d.lnf, g.wo, g.bo, d.logits, a.lnf, p.wo, B, C, K);
  LayernormBackward(d.res + L * B * C, g.lnfw, g.lnfb, d.lnf, a.res + L * B * C, p.lnfw, a.lnf_mean, a.lnf_rstd, B, C);
  for (int l = L - 1; l >= 0; --l) {
    const float* dres_next = d.res + (l + 1) * B * C;
    float* dres = d.res + l * B * C;
    for (int i = 0; i < B * C; ++i) dres[i] += dres_next[i];  // the residual path
    MatmulBackward(d.fch_gelu + l * B * H, g.projw + l * C * H, g.projb + l * C, dres_next, a.fch_gelu + l * B * H,
                   p.projw + l * C * H, B, H, C);
    GeluBackward(d.fch + l * B * H, a.fch + l * B * H, d.fch_gelu + l * B * H, B * H);
    MatmulBackward(d.ln + l * B * C, g.fcw + l * H * C, g.fcb + l * H, d.fch + l * B * H, a.ln + l * B * C,
                   p.fcw + l * H * C, B, C, H);
    LayernormBackward(dres, g.lnw + l * C, g.lnb + l * C, d.ln + l * B * C, a.res + l * B * C, p.lnw + l * C,
                      a.ln_mean + l * B, a.ln_rstd + l * B, B, C);
  }
  MatmulBackward(nullptr, g.wi, g.bi, d.res, x, p.wi, B, D, C);
}

// llm.c's AdamW update over every parameter, its math written in the order torch.optim.AdamW computes it (zero's
// kernels follow torch: src/optim/reference.cc), so that the --zero run agrees with this one to rounding.
void AdamWUpdate(Model* model, const AdamW& h, int t) {
  const size_t n = model->num_parameters;
  if (model->m_memory == nullptr) {
    model->m_memory = static_cast<float*>(std::calloc(n, sizeof(float)));
    model->v_memory = static_cast<float*>(std::calloc(n, sizeof(float)));
  }
  // The scalars in double, rounded to float once, as torch does.
  const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay), w1 = static_cast<float>(1.0 - h.beta1);
  const float b2 = static_cast<float>(h.beta2), omb2 = static_cast<float>(1.0 - h.beta2);
  const float neg_step = static_cast<float>(-h.lr / (1.0 - std::pow(h.beta1, t)));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(h.beta2, t))), eps = static_cast<float>(h.eps);
  float *params = model->params_memory, *grads = model->grads_memory, *m = model->m_memory, *v = model->v_memory;
  size_t begin = 0;
  for (const TensorInfo& ti : ParamTensors(model->config)) {
    const size_t end = begin + ti.spec.numel();
    const bool decays = h.weight_decay != 0.0 && (ti.matrix || !h.decay_2d_only);
    for (size_t i = begin; i < end; ++i) {
      const float g = grads[i];
      float p = params[i];
      if (decays) p = p * decay;
      m[i] = m[i] + w1 * (g - m[i]);  // torch's lerp for a weight below 0.5
      v[i] = v[i] * b2;
      v[i] = v[i] + omb2 * g * g;
      const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      params[i] = p + neg_step * m[i] / denom;
    }
    begin = end;
  }
}

// ----------------------------------------------------------------------------------------------------------------
// Data: the global batch of step `step` is a function of (seed, step) alone. Sample i's inputs are uniform in [-1, 1)
// from a hash of (seed, step, i), so a rank builds just its slice; its label is the argmax of a fixed random
// teacher's scores over tanh(3x), a task the model learns in a few hundred steps.

uint64_t SplitMix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
float UniformPm1(uint64_t key) { return static_cast<float>(SplitMix64(key) >> 40) * (2.0f / 16777216.0f) - 1.0f; }

void MakeBatch(const ModelConfig& c, uint64_t seed, int step, int first, int n, float* x, int* y) {
  for (int s = 0; s < n; ++s) {
    const uint64_t key = SplitMix64(seed ^ SplitMix64((static_cast<uint64_t>(step) << 32) | (first + s)));
    for (int i = 0; i < c.in; ++i) x[s * c.in + i] = UniformPm1(key + i);
    float best = -1e30f;
    for (int k = 0; k < c.classes; ++k) {
      float score = 0;
      for (int i = 0; i < c.in; ++i)
        score += UniformPm1(SplitMix64(seed) + k * c.in + i) * std::tanh(3 * x[s * c.in + i]);
      if (score > best) best = score, y[s] = k;
    }
  }
}

// Matrices uniform in ±1/sqrt(fan_in) (torch's nn.Linear), biases 0, layernorm weights 1: a function of the seed.
void InitParameters(Model* model, uint64_t seed) {
  size_t off = 0;
  for (const TensorInfo& ti : ParamTensors(model->config)) {
    const int64_t n = ti.spec.numel(), fan_in = ti.spec.shape.back();
    const bool ln_weight = ti.spec.name == "lnw" || ti.spec.name == "lnfw";
    for (int64_t i = 0; i < n; ++i) {
      float* p = model->params_memory + off + i;
      *p = ti.matrix ? UniformPm1(SplitMix64(seed + 1) + off + i) / std::sqrt(static_cast<float>(fan_in))
                     : (ln_weight ? 1.0f : 0.0f);
    }
    off += n;
  }
}

// ----------------------------------------------------------------------------------------------------------------
// The training loop: the trainer's own AdamW (comm == nullptr), or ShardedOptimizer over `comm`.

struct Flags {
  bool zero = false;
  std::string config_path;
  int stage = -1;
  int world = 1;
  int steps = 20;
  uint64_t seed = 1234;
  bool json = false;
  bool decay_2d = false;
  std::string save_dir, resume_dir;  // --zero only: ShardedOptimizer's checkpoints (zero/checkpoint.h)
  int save_every = 0;
};

zero::Status Train(const Flags& flags, const AdamW& hp, const zero::Config& cfg,
                   std::shared_ptr<zero::Communicator> comm) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->world_size() : 1;
  Model model;
  const ModelConfig& c = model.config;
  const std::vector<TensorInfo> tensors = ParamTensors(c);
  size_t sizes[kNumParamTensors];
  size_t num_parameters = 0;
  for (int i = 0; i < kNumParamTensors; ++i) num_parameters += sizes[i] = tensors[i].spec.numel();
  // --zero: the collectives move blocks of 1/world of each buffer, so both hold Capacity() elements.
  const size_t cap = comm ? zero::ShardedOptimizer::Capacity(num_parameters, world) : num_parameters;
  model.params_memory = MallocAndPoint(&model.params, sizes, kNumParamTensors, cap, &model.num_parameters);
  model.grads_memory = MallocAndPoint(&model.grads, sizes, kNumParamTensors, cap, &model.num_parameters);
  InitParameters(&model, flags.seed);
  // --zero: the optimizer learns the buffers' layout and keeps its 1/world shard of the AdamW state.
  std::unique_ptr<zero::ShardedOptimizer> opt;
  if (comm) {
    std::vector<zero::ParamSpec> specs;
    for (const TensorInfo& ti : tensors) specs.push_back(ti.spec);
    zero::FlatBuffers flat{.params = model.params_memory,
                           .grads = model.grads_memory,
                           .capacity = static_cast<int64_t>(cap),
                           .tensors = specs};
    zero::EngineOptions options;
    if (hp.decay_2d_only) {  // llm.c's rule as a parameter group: no decay on biases and layernorm parameters
      zero::ParamGroup no_decay{.match = "", .weight_decay = 0.0};
      for (const TensorInfo& ti : tensors) {
        if (!ti.matrix) absl::StrAppend(&no_decay.match, no_decay.match.empty() ? "" : "|", "flat.", ti.spec.name);
      }
      // A model of matrices only has nothing to exempt (and a pattern that matches nothing is an error).
      if (!no_decay.match.empty()) options.param_groups.push_back(no_decay);
    }
    ZERO_ASSIGN_OR_RETURN(opt, zero::ShardedOptimizer::Create(cfg, comm, {flat}, options));
  }

  const int B = kBatch / world, first = rank * B;  // this rank's slice of the global batch (all of it: world 1)
  const size_t L = c.layers, C = c.channels, H = c.hidden, K = c.classes, N = B;  // as in ActivationTensors
  const size_t act_sizes[kNumActTensors] = {(L + 1) * N * C, L * N * C, L * N, L * N, L * N * H, L * N * H,
                                            N * C,           N,         N,     N * K, N * K};
  model.acts_memory = MallocAndPoint(&model.acts, act_sizes, kNumActTensors, 0, &model.num_activations);
  model.grad_acts_memory = MallocAndPoint(&model.grad_acts, act_sizes, kNumActTensors, 0, &model.num_activations);
  std::vector<float> x(size_t(B) * c.in);
  std::vector<int> y(B);

  if (rank == 0 && !flags.json) {
    std::printf("%zu parameters in one buffer; %s\n", num_parameters,
                comm ? absl::StrCat("ShardedOptimizer at stage ", cfg.zero.stage, " over ", world, " ranks, ", B,
                                    " samples each")
                           .c_str()
                     : absl::StrCat("the trainer's own AdamW on the whole batch of ", B, " samples").c_str());
  }
  // --resume: the parameters (into the trainer's buffer), the AdamW state, the step count; the data position is
  // the trainer's own state, saved beside them.
  int first_step = 1;
  if (opt != nullptr && !flags.resume_dir.empty()) {
    // As zero-gpt: "nothing yet" only where DIR holds no checkpoint at all, and next_step checked inside Load
    // (1-based here: the step to run next), so that a bad value fails every rank at once.
    zero::StatusOr<std::string> tag = zero::ResumeCheckpointTag(flags.resume_dir);
    if (!tag.ok() && !absl::IsNotFound(tag.status())) {
      return absl::Status(tag.status().code(), absl::StrCat("--resume: ", tag.status().message()));
    }
    if (tag.ok()) {
      constexpr int64_t kMaxStep = int64_t{1} << 30;  // first_step is an int
      zero::LoadOptions lo;
      lo.tag = *tag;
      lo.check_trainer_state = [](const zero::TrainerState& ts) {
        return zero::TrainerStateInt(ts, "next_step", 1, kMaxStep).status();
      };
      zero::StatusOr<zero::LoadResult> r = opt->Load(flags.resume_dir, lo);
      if (!r.ok()) return absl::Status(r.status().code(), absl::StrCat("--resume: ", r.status().message()));
      ZERO_ASSIGN_OR_RETURN(const int64_t next, zero::TrainerStateInt(r->trainer_state, "next_step", 1, kMaxStep));
      first_step = static_cast<int>(next);
      if (rank == 0 && !flags.json) std::printf("resumed from %s at step %d\n", r->tag.c_str(), first_step);
    }
  }
  for (int step = first_step; step <= flags.steps; ++step) {
    MakeBatch(c, flags.seed, step, first, B, x.data(), y.data());
    std::memset(model.grads_memory, 0, model.num_parameters * sizeof(float));
    float loss = Forward(&model, x.data(), y.data(), B);  // the mean over this rank's slice
    Backward(&model, x.data(), y.data(), B);
    if (comm) {  // --zero: average the gradients over the ranks, AdamW on this rank's shard, gather the values
      ZERO_RETURN_IF_ERROR(opt->Step().status());
      ZERO_RETURN_IF_ERROR(comm->AllReduce(&loss, 1, zero::DType::kF32, zero::ReduceOp::kAvg).Wait());
    } else {
      AdamWUpdate(&model, hp, step);
    }
    if (opt != nullptr && !flags.save_dir.empty() &&
        ((flags.save_every > 0 && step % flags.save_every == 0) || step == flags.steps)) {
      ZERO_RETURN_IF_ERROR(opt->Save(flags.save_dir, {.tag = absl::StrFormat("step-%08d", step),
                                                      .trainer_state = {{"next_step", absl::StrCat(step + 1)}}})
                               .status());
    }
    if (rank != 0) continue;
    if (flags.json) {
      std::printf("{\"step\": %d, \"loss\": %.9g}\n", step, loss);
    } else {
      std::printf("step %4d  loss %.6f\n", step, loss);
    }
    std::fflush(stdout);
  }
  if (opt != nullptr && flags.json) {  // every rank's bytes beyond the trainer's buffers, by tag, and its true peak
    std::printf("{\"rank\": %d, \"trainer_bytes\": %lld, \"memory\": %s}\n", rank,
                static_cast<long long>(opt->trainer_bytes()), opt->memory_report().ToJson().c_str());
    std::fflush(stdout);
  }
  if (opt != nullptr && rank == 0 && !flags.json) {
    // The padding that makes every rank's block the same size lies in the trainer's buffers and in the shards of
    // the ranks whose block reaches past the parameters; the report's padding line counts only zero's share of
    // it on rank 0 (often none), so the buffers' own padding is said here.
    const long long padded = static_cast<long long>(cap);
    std::printf(
        "the trainer's two buffers: %lld bytes (its own: %lld elements each for %lld parameters, %lld of "
        "them padding, so that each of the %d ranks' blocks is %lld); rank 0 holds beyond them:\n%s",
        static_cast<long long>(opt->trainer_bytes()), padded, static_cast<long long>(num_parameters),
        padded - static_cast<long long>(num_parameters), world, padded / world,
        opt->memory_report().ToString().c_str());
  }
  return zero::OkStatus();
}

// ----------------------------------------------------------------------------------------------------------------
// Flags, the config, the ranks.

void Usage() {
  std::fprintf(
      stdout,
      "usage: zero-flat-trainer [--zero] [--config FILE] [--stage 0-2] [--world N] [--steps K] [--seed S]\n"
      "                         [--decay-2d] [--json] [--save DIR [--save-every K]] [--resume DIR]\n"
      "  --zero       zero::ShardedOptimizer instead of the trainer's own AdamW; --world N runs N ranks as\n"
      "               threads (Gloo over loopback), a launcher (zero-run) one rank per process\n"
      "  --config FILE  the optimizer's config (default: embedded, AdamW as the trainer's own, stage 1,\n"
      "               no clipping, fp32); the batch keys are the trainer's (global batch %d)\n"
      "  --decay-2d   llm.c's rule: weight decay on the weight matrices only (with --zero: a parameter group)\n"
      "  --json       one {\"step\", \"loss\"} line per step; with --zero then each rank's memory report\n"
      "               ({\"rank\", \"trainer_bytes\", \"memory\": tags and peak_total, beyond the trainer's buffers})\n"
      "  --save DIR   (--zero) save a checkpoint every --save-every steps and after the last; --resume DIR\n"
      "               continues from DIR's latest (any world size; none there: start; complete checkpoints\n"
      "               without a usable `latest`: an error naming the newest); --steps K is the step to stop at\n",
      kBatch);
}

// What ParseFlags found: run, print the usage to stdout (--help), or a usage error (already said on stderr).
enum class Parsed { kRun, kHelp, kUsageError };

Parsed ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    // A flag's value is read only once the flag is known, so an unknown last flag is named as unknown.
    const bool has_value = i + 1 < argc;
    const char* v = has_value ? argv[i + 1] : "";
    bool takes_value = true;
    if (a == "--zero") {
      f->zero = true, takes_value = false;
    } else if (a == "--json") {
      f->json = true, takes_value = false;
    } else if (a == "--decay-2d") {
      f->decay_2d = true, takes_value = false;
    } else if (a == "--help" || a == "-h") {
      return Parsed::kHelp;
    } else if (a == "--config") {
      f->config_path = v;
    } else if (a == "--stage") {
      f->stage = std::atoi(v);
    } else if (a == "--world") {
      f->world = std::atoi(v);
    } else if (a == "--steps") {
      f->steps = std::atoi(v);
    } else if (a == "--seed") {
      f->seed = std::strtoull(v, nullptr, 10);
    } else if (a == "--save") {
      f->save_dir = v;
    } else if (a == "--save-every") {
      f->save_every = std::atoi(v);
    } else if (a == "--resume") {
      f->resume_dir = v;
    } else {
      std::fprintf(stderr, "zero-flat-trainer: unknown flag %s (zero-flat-trainer --help for usage)\n", a.c_str());
      return Parsed::kUsageError;
    }
    if (takes_value && !has_value) {
      std::fprintf(stderr, "zero-flat-trainer: %s needs a value (zero-flat-trainer --help for usage)\n", a.c_str());
      return Parsed::kUsageError;
    }
    if (takes_value) ++i;
  }
  if ((!f->save_dir.empty() || !f->resume_dir.empty()) && !f->zero) {
    std::fprintf(stderr, "zero-flat-trainer: --save and --resume need --zero (ShardedOptimizer's checkpoints)\n");
    return Parsed::kUsageError;
  }
  if (f->world >= 1 && f->steps >= 0) return Parsed::kRun;
  std::fprintf(stderr,
               "zero-flat-trainer: --world must be at least 1 and --steps at least 0 (zero-flat-trainer --help for "
               "usage)\n");
  return Parsed::kUsageError;
}

// The embedded default config: the trainer's own AdamW, written out in full precision.
std::string DefaultConfigJson(const AdamW& hp, int stage) {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                R"({"gradient_clipping": 0.0, "zero_optimization": {"stage": %d},
                    "optimizer": {"type": "AdamW", "params": {"lr": %.17g, "betas": [%.17g, %.17g], "eps": %.17g,
                                  "weight_decay": %.17g}}})",
                stage, hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay);
  return buf;
}

// The config of both paths: the embedded default or FILE, --stage over it. Without --zero the trainer's own loop
// takes the config's AdamW hyperparameters and refuses what it does not implement.
zero::Status MakeConfig(const Flags& f, int world, AdamW* hp, zero::Config* cfg) {
  hp->decay_2d_only = f.decay_2d;
  if (kBatch % world != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the global batch ", kBatch, " does not split over ", world, " ranks"));
  }
  ZERO_ASSIGN_OR_RETURN(*cfg, f.config_path.empty() ? zero::Config::FromJsonString(DefaultConfigJson(*hp, 1))
                                                    : zero::Config::FromJsonFile(f.config_path));
  if (f.stage >= 0) cfg->zero.stage = f.stage;
  // The trainer's batch governs: one step is one global batch, each rank's micro-batch its slice.
  cfg->train_batch_size = kBatch;
  cfg->train_micro_batch_size_per_gpu = kBatch / world;
  cfg->gradient_accumulation_steps = 1;
  if (!cfg->optimizer.has_value() || cfg->optimizer->type == "SGD" || !cfg->optimizer->adam_w_mode ||
      !cfg->optimizer->bias_correction) {
    return absl::InvalidArgumentError("the config's optimizer must be AdamW (with bias_correction), as the trainer's");
  }
  hp->lr = cfg->optimizer->lr;
  hp->beta1 = cfg->optimizer->beta1;
  hp->beta2 = cfg->optimizer->beta2;
  hp->eps = cfg->optimizer->eps;
  hp->weight_decay = cfg->optimizer->weight_decay;
  if (!f.zero &&
      (cfg->gradient_clipping != 0.0 || !cfg->scheduler.type.empty() || cfg->fp16.enabled || cfg->bf16.enabled)) {
    return absl::InvalidArgumentError(
        "the trainer's own loop has no gradient clipping, lr schedule or 16-bit precision: use --zero for those");
  }
  return zero::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  switch (ParseFlags(argc, argv, &flags)) {
    case Parsed::kHelp: Usage(); return 0;
    case Parsed::kUsageError: return 2;
    case Parsed::kRun: break;
  }
  const bool launched = zero::Communicator::Launched();
  if (!flags.zero && flags.world != 1) {
    std::fprintf(stderr,
                 "zero-flat-trainer: without --zero the trainer runs alone on the whole batch: use --world 1 "
                 "(or --zero to split the batch over ranks)\n");
    return 2;
  }
  // Any launcher's world (torchrun's WORLD_SIZE, OpenMPI's, Slurm's): N copies of the lone trainer would each train
  // the whole batch and write the same files. A launch whose variables do not read (world 0) is refused too.
  if (const int launched_world = zero::Communicator::LaunchedWorldSize();
      !flags.zero && launched && launched_world != 1) {
    std::fprintf(stderr,
                 "zero-flat-trainer: without --zero the trainer runs alone on the whole batch, but a launcher started "
                 "it as one of %s: start one process, or use --zero to split the batch over the ranks\n",
                 launched_world > 1 ? (std::to_string(launched_world) + " ranks").c_str()
                                    : "several ranks (its variables do not read: --zero says why)");
    return 2;
  }
  std::vector<zero::Status> results;
  if (!flags.zero || launched) {
    std::shared_ptr<zero::Communicator> comm;
    if (flags.zero) {
      // The communicator's timeout is the config's comm_timeout_s (read here; MakeConfig reports a bad file).
      zero::Config for_comm;
      if (!flags.config_path.empty()) {
        if (auto c = zero::Config::FromJsonFile(flags.config_path); c.ok()) for_comm = *c;
      }
      auto c = zero::Communicator::FromEnv(zero::Backend::kGloo, for_comm);
      if (!c.ok()) results.push_back(c.status());
      else comm = std::move(*c);
    }
    AdamW hp;
    zero::Config cfg;
    if (results.empty()) {
      zero::Status s = MakeConfig(flags, comm ? comm->world_size() : 1, &hp, &cfg);
      results.push_back(s.ok() ? Train(flags, hp, cfg, comm) : s);
    }
  } else {
    results.resize(flags.world);
    auto store = zero::Store::Hash();
    std::vector<std::thread> threads;
    for (int r = 0; r < flags.world; ++r) {
      threads.emplace_back([&, r] {
        AdamW hp;
        zero::Config cfg;
        results[r] = MakeConfig(flags, flags.world, &hp, &cfg);
        if (!results[r].ok()) return;
        zero::CommOptions copt;
        copt.timeout = absl::Seconds(cfg.comm_timeout_s);
        copt.hostname = "127.0.0.1";
        auto comm = zero::Communicator::CreateGloo(store, r, flags.world, copt);
        results[r] = comm.ok() ? Train(flags, hp, cfg, std::move(*comm)) : comm.status();
      });
    }
    for (auto& t : threads) t.join();
  }
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].ok()) continue;
    const std::string who = results.size() > 1 ? absl::StrCat("rank ", r, ": ") : "";
    std::fprintf(stderr, "zero-flat-trainer: %s%s\n", who.c_str(), zero::ErrorText(results[r]).c_str());
    return 1;
  }
  return 0;
}
