// optim/optimizers.cc — the built-in ElementwiseOptimizers (Adam/AdamW, SGD), their factories, and
// ParallelUpdate.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "optim/internal/kernels.h"
#include "optim/internal/thread_pool.h"
#include "zero/optimizer.h"
#include "zero/status.h"

namespace zero {
namespace optim_internal {

// The scalars are formed as torch.optim forms them from Python floats: in double, then rounded to f32 once
// where the tensor op receives them (a CPU f32 kernel casts its Scalar argument to float).
AdamScalars MakeAdamScalars(const AdamParams& p, const ShardUpdate& u) {
  AdamScalars s;
  s.grad_scale = u.grad_scale;
  s.apply_decay = p.decoupled_weight_decay && p.weight_decay != 0.0;
  s.decay = static_cast<float>(1.0 - u.lr * p.weight_decay);
  s.apply_l2 = !p.decoupled_weight_decay && p.weight_decay != 0.0;
  s.l2 = static_cast<float>(p.weight_decay);
  const float w = static_cast<float>(1.0 - p.beta1);
  s.lerp_weight = w;
  s.lerp_one_minus_weight = 1.0f - w;
  s.lerp_small = std::abs(w) < 0.5f;
  s.lerp_coeff = s.lerp_small ? w : w - 1.0f;
  s.beta2 = static_cast<float>(p.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - p.beta2);
  s.eps = static_cast<float>(p.eps);
  const double step = static_cast<double>(u.step);
  double step_size = u.lr;
  double bc2_sqrt = 1.0;
  if (p.bias_correction) {
    const double bias_correction1 = 1.0 - std::pow(p.beta1, step);
    const double bias_correction2 = 1.0 - std::pow(p.beta2, step);
    step_size = u.lr / bias_correction1;
    bc2_sqrt = std::sqrt(bias_correction2);
  }
  s.neg_step_size = static_cast<float>(-step_size);
  s.bc2_sqrt = static_cast<float>(bc2_sqrt);
  return s;
}

SgdScalars MakeSgdScalars(const SgdParams& p, const ShardUpdate& u) {
  SgdScalars s;
  s.grad_scale = u.grad_scale;
  s.apply_l2 = p.weight_decay != 0.0;
  s.l2 = static_cast<float>(p.weight_decay);
  s.use_momentum = p.momentum != 0.0;
  s.first_step = u.step <= 1;
  s.nesterov = p.nesterov;
  s.momentum = static_cast<float>(p.momentum);
  s.one_minus_dampening = static_cast<float>(1.0 - p.dampening);
  s.neg_lr = static_cast<float>(-u.lr);
  return s;
}

}  // namespace optim_internal

namespace {

using optim_internal::TileArgs;

TileArgs ToTileArgs(const ShardUpdate& u, size_t n_states) {
  ZERO_CHECK(u.master != nullptr) << "ShardUpdate.master is null (n=" << u.n << ")";
  ZERO_CHECK(u.grad != nullptr) << "ShardUpdate.grad is null (n=" << u.n << ")";
  TileArgs t;
  t.master = u.master;
  t.grad = u.grad;
  t.grad_dtype = u.grad_dtype;
  if (n_states > 0) {
    ZERO_CHECK(u.state != nullptr) << "ShardUpdate.state is null but the optimizer has " << n_states << " states";
    t.state0 = u.state[0];
    ZERO_CHECK(t.state0 != nullptr);
    if (n_states > 1) {
      t.state1 = u.state[1];
      ZERO_CHECK(t.state1 != nullptr);
    }
  }
  t.param_out = u.param_out;
  t.param_out_dtype = u.param_out_dtype;
  t.n = u.n;
  return t;
}

class AdamOptimizer final : public ElementwiseOptimizer {
 public:
  explicit AdamOptimizer(const AdamParams& p) : p_(p) {}
  std::string Name() const override { return p_.decoupled_weight_decay ? "AdamW" : "Adam"; }
  std::vector<std::string> StateNames() const override { return {"exp_avg", "exp_avg_sq"}; }
  void Update(const ShardUpdate& u) const override {
    if (u.n == 0) return;
    ZERO_CHECK_GE(u.step, 1) << "ShardUpdate.step is 1-based";
    optim_internal::AdamTile(optim_internal::MakeAdamScalars(p_, u), ToTileArgs(u, 2));
  }
  const AdamParams& params() const { return p_; }

 private:
  AdamParams p_;
};

class SgdOptimizer final : public ElementwiseOptimizer {
 public:
  explicit SgdOptimizer(const SgdParams& p) : p_(p) {}
  std::string Name() const override { return "SGD"; }
  // torch keeps a momentum buffer only when momentum != 0; so do we.
  std::vector<std::string> StateNames() const override {
    if (p_.momentum == 0.0) return {};
    return {"momentum_buffer"};
  }
  void Update(const ShardUpdate& u) const override {
    if (u.n == 0) return;
    ZERO_CHECK_GE(u.step, 1) << "ShardUpdate.step is 1-based";
    optim_internal::SgdTile(optim_internal::MakeSgdScalars(p_, u), ToTileArgs(u, p_.momentum == 0.0 ? 0 : 1));
  }
  const SgdParams& params() const { return p_; }

 private:
  SgdParams p_;
};

Status Invalid(const std::string& key, double value, const std::string& rule) {
  return absl::InvalidArgumentError(absl::StrCat(key, ": ", rule, ", got ", value));
}

// Elements below which extra threads cost more (wake-up, a few microseconds) than they save.
constexpr size_t kMinElemsPerThread = 1 << 15;
// Tile boundaries are rounded to this many elements (256 bytes of f32) so tiles start cache-line aligned
// when the shard does.
constexpr size_t kTileAlign = 64;

}  // namespace

std::unique_ptr<ElementwiseOptimizer> MakeAdam(const AdamParams& p) { return std::make_unique<AdamOptimizer>(p); }

std::unique_ptr<ElementwiseOptimizer> MakeSgd(const SgdParams& p) { return std::make_unique<SgdOptimizer>(p); }

const AdamParams* BuiltinAdamParams(const ElementwiseOptimizer& opt) {
  const auto* a = dynamic_cast<const AdamOptimizer*>(&opt);
  return a != nullptr ? &a->params() : nullptr;
}
const SgdParams* BuiltinSgdParams(const ElementwiseOptimizer& opt) {
  const auto* s = dynamic_cast<const SgdOptimizer*>(&opt);
  return s != nullptr ? &s->params() : nullptr;
}

StatusOr<std::unique_ptr<ElementwiseOptimizer>> MakeOptimizer(const OptimizerConfig& cfg) {
  const std::string type = absl::AsciiStrToLower(cfg.type);
  // torch.optim's own argument checks, reported with the DeepSpeed config key.
  if (!(cfg.lr >= 0.0)) return Invalid("optimizer.params.lr", cfg.lr, "must be >= 0");
  if (!(cfg.weight_decay >= 0.0)) return Invalid("optimizer.params.weight_decay", cfg.weight_decay, "must be >= 0");
  if (type == "adam" || type == "adamw") {
    if (!(cfg.eps >= 0.0)) return Invalid("optimizer.params.eps", cfg.eps, "must be >= 0");
    if (!(cfg.beta1 >= 0.0 && cfg.beta1 < 1.0)) {
      return Invalid("optimizer.params.betas[0]", cfg.beta1, "must be in [0, 1)");
    }
    if (!(cfg.beta2 >= 0.0 && cfg.beta2 < 1.0)) {
      return Invalid("optimizer.params.betas[1]", cfg.beta2, "must be in [0, 1)");
    }
    AdamParams p;
    p.beta1 = cfg.beta1;
    p.beta2 = cfg.beta2;
    p.eps = cfg.eps;
    p.weight_decay = cfg.weight_decay;
    // DeepSpeed: "Adam" is AdamW unless adam_w_mode is false; "AdamW" is always decoupled.
    p.decoupled_weight_decay = type == "adamw" || cfg.adam_w_mode;
    p.bias_correction = cfg.bias_correction;
    return MakeAdam(p);
  }
  if (type == "sgd") {
    if (!(cfg.momentum >= 0.0)) return Invalid("optimizer.params.momentum", cfg.momentum, "must be >= 0");
    if (cfg.nesterov && (cfg.momentum <= 0.0 || cfg.dampening != 0.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer.params.nesterov: Nesterov momentum requires momentum > 0 and dampening == 0, got "
                       "momentum ",
                       cfg.momentum, " and dampening ", cfg.dampening));
    }
    SgdParams p;
    p.momentum = cfg.momentum;
    p.dampening = cfg.dampening;
    p.weight_decay = cfg.weight_decay;
    p.nesterov = cfg.nesterov;
    return MakeSgd(p);
  }
  return absl::InvalidArgumentError(absl::StrCat("optimizer.type: unknown optimizer \"", cfg.type,
                                                 "\"; zero implements Adam, AdamW and SGD (or plug in your own "
                                                 "ElementwiseOptimizer)"));
}

ShardUpdate ShardUpdate::Slice(size_t begin, size_t count, size_t n_states, float** states) const {
  ShardUpdate part = *this;
  part.master = master + begin;
  part.grad = static_cast<const char*>(grad) + begin * DTypeSize(grad_dtype);
  for (size_t k = 0; k < n_states; ++k) states[k] = state[k] + begin;
  if (n_states > 0) part.state = states;
  if (param_out != nullptr) part.param_out = static_cast<char*>(param_out) + begin * DTypeSize(param_out_dtype);
  part.n = count;
  part.first_element = first_element + static_cast<int64_t>(begin);
  return part;
}

Status ValidateShardUpdate(const ElementwiseOptimizer& opt, const ShardUpdate& u) {
  if (u.n == 0) return absl::OkStatus();
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(opt.Name(), ": ShardUpdate (n=", u.n, ") ", why));
  };
  if (u.master == nullptr) return bad("master is null");
  if (u.grad == nullptr) return bad("grad is null");
  if (u.step < 1) return bad(absl::StrCat("step is ", u.step, "; it is 1-based"));
  const std::vector<std::string> states = opt.StateNames();
  if (!states.empty() && u.state == nullptr)
    return bad(absl::StrCat("state is null but the optimizer has ", states.size(), " states"));
  for (size_t i = 0; i < states.size(); ++i) {
    if (u.state[i] == nullptr) return bad(absl::StrCat("state[", i, "] (", states[i], ") is null"));
  }
  return absl::OkStatus();
}

void ParallelUpdate(const ElementwiseOptimizer& opt, const ShardUpdate& u, int threads, size_t tile_elems) {
  if (u.n == 0) return;
  threads = std::max(threads, 1);
  if (tile_elems == 0 || tile_elems > u.n) tile_elems = u.n;
  // Use no more threads than the shard keeps busy, and give each at least one contiguous tile (the hardware
  // prefetchers like long streams): tiles are at most n / threads elements.
  threads =
      static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), std::max<size_t>(1, u.n / kMinElemsPerThread)));
  size_t tile = tile_elems;
  if (threads > 1) {
    const size_t per_thread = (u.n + threads - 1) / threads;
    tile = std::min(tile, (per_thread + kTileAlign - 1) / kTileAlign * kTileAlign);
  }
  const size_t n_tiles = (u.n + tile - 1) / tile;
  const size_t n_states = opt.StateNames().size();
  if (n_states > 0) ZERO_CHECK(u.state != nullptr) << opt.Name() << ": ShardUpdate.state is null";
  if (n_tiles == 1) {
    opt.Update(u);
    return;
  }
  // Per-tile state pointer arrays, one slice each, so workers write only their own.
  std::vector<float*> states(n_tiles * n_states);
  optim_internal::ParallelFor(n_tiles, threads, [&](size_t t) {
    const size_t begin = t * tile;
    opt.Update(u.Slice(begin, std::min(tile, u.n - begin), n_states, states.data() + t * n_states));
  });
}

}  // namespace zero
