// examples/torch_lm/model.h — a small transformer language model in libtorch, as a libtorch user writes one: token
// and position embeddings, pre-LayerNorm blocks (causal self-attention, a GELU MLP), a final LayerNorm and a head
// that is its own Linear or tied to the token embedding. Also the synthetic data both the example and
// tests/torch train on, generated from integers alone so every process and thread builds the same batches.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

namespace torch_lm {

struct LMOptions {
  int64_t vocab = 64;
  int64_t seq = 16;
  int64_t dim = 32;
  int64_t heads = 2;
  int64_t layers = 2;
  bool tied = false;  // the head is the token embedding's transpose
};

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(int64_t dim, int64_t heads)
      : heads_(heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        qkv(register_module("qkv", torch::nn::Linear(dim, 3 * dim))),
        proj(register_module("proj", torch::nn::Linear(dim, dim))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        fc(register_module("fc", torch::nn::Linear(dim, 4 * dim))),
        out(register_module("out", torch::nn::Linear(4 * dim, dim))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hd = C / heads_;
    std::vector<torch::Tensor> parts = qkv(ln1(x)).split(C, /*dim=*/2);
    auto heads = [&](const torch::Tensor& t) { return t.view({B, T, heads_, hd}).transpose(1, 2); };
    const torch::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    const torch::Tensor mask = torch::ones({T, T}, torch::kBool).triu(1);
    att = torch::softmax(att.masked_fill(mask, -1e9), -1);
    const torch::Tensor y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
    const torch::Tensor h = x + proj(y);
    return h + out(torch::gelu(fc(ln2(h))));
  }

 private:
  int64_t heads_;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc, out;
};
TORCH_MODULE(Block);

class TransformerLMImpl : public torch::nn::Module {
 public:
  explicit TransformerLMImpl(const LMOptions& o) : o_(o) {
    tok = register_module("tok", torch::nn::Embedding(o.vocab, o.dim));
    pos = register_module("pos", torch::nn::Embedding(o.seq, o.dim));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t l = 0; l < o.layers; ++l) blocks->push_back(Block(o.dim, o.heads));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.dim})));
    if (!o.tied)
      head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(o.dim, o.vocab).bias(false)));
  }

  // The mean cross-entropy of predicting targets[b, t] from idx[b, 0..t].
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets) {
    const int64_t T = idx.size(1);
    torch::Tensor x = tok(idx) + pos(torch::arange(T, torch::kLong));
    for (const auto& b : *blocks) x = b->as<Block>()->forward(x);
    x = ln_f(x);
    const torch::Tensor logits = o_.tied ? torch::matmul(x, tok->weight.t()) : head(x);
    return torch::nn::functional::cross_entropy(logits.view({-1, o_.vocab}), targets.reshape({-1}));
  }

  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};

 private:
  LMOptions o_;
};
TORCH_MODULE(TransformerLM);

// The same model on every rank and thread: torch's generator seeded here, then the module built. The generator is
// process-wide, so thread-ranks take turns (without the lock one rank's draws interleave with another's).
inline TransformerLM MakeModel(const LMOptions& o, uint64_t seed) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  torch::manual_seed(seed);
  return TransformerLM(o);
}

// Sequences [begin, end) of step `step`'s global batch: each an arithmetic progression modulo the vocabulary
// with its own start and stride (the model learns to continue it), from a splitmix64 hash of (step, sequence).
struct Batch {
  torch::Tensor idx, targets;
};
inline Batch MakeBatch(const LMOptions& o, int64_t step, int64_t begin, int64_t end) {
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  const int64_t n = end - begin;
  std::vector<int64_t> tokens(static_cast<size_t>(n * (o.seq + 1)));
  for (int64_t s = 0; s < n; ++s) {
    const uint64_t h = mix(static_cast<uint64_t>(step) * 1000003ULL + static_cast<uint64_t>(begin + s));
    const int64_t start = static_cast<int64_t>(h % static_cast<uint64_t>(o.vocab));
    const int64_t stride = 1 + static_cast<int64_t>((h >> 20) % 3);
    for (int64_t t = 0; t <= o.seq; ++t) tokens[s * (o.seq + 1) + t] = (start + stride * t) % o.vocab;
  }
  const torch::Tensor all = torch::tensor(tokens, torch::kLong).view({n, o.seq + 1});
  return {all.narrow(1, 0, o.seq).clone(), all.narrow(1, 1, o.seq).clone()};
}

// Warmup, then cosine decay to a tenth: the learning rate of step `t` (1-based), as a trainer sets it each step.
inline double ScheduleLr(double peak, int64_t t, int64_t warmup, int64_t total) {
  if (t <= warmup) return peak * static_cast<double>(t) / static_cast<double>(warmup);
  const double p = static_cast<double>(t - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
  return peak * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, p))));
}

// torch.optim's usual two groups: weight decay on the matrices (embeddings too), none on biases and LayerNorms.
inline std::vector<torch::optim::OptimizerParamGroup> TwoGroups(torch::nn::Module& m, double lr, double wd) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : m.named_parameters()) {
    if (!p.value().requires_grad()) continue;
    (p.value().dim() >= 2 ? decay : no_decay).push_back(p.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0)));
  return groups;
}

}  // namespace torch_lm
