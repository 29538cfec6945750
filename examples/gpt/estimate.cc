// examples/gpt/estimate.cc — the reference GPT's units and its own bytes for zero::Estimate (estimate.h).
#include "estimate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gpt/cuda/model_impl.h"  // ActivationViews::Bytes: the CUDA trainer's one activation block (host code)

namespace zero::gpt {

namespace {

int64_t RoundUp64(int64_t n) { return (n + 63) / 64 * 64; }

// The engine's padding rule (docs/internals/design.md, "Units and the flat layout"): a multiple of 32 x world elements.
int64_t Padded(int64_t numel, int world) {
  const int64_t q = int64_t{32} * world;
  return (numel + q - 1) / q * q;
}

// The estimate's largest sums, bounded in double precision before they are computed in int64: the parameters
// (at most 32 bytes each in any tier: master, gradients, two optimizer states, 16-bit copies) and every layer's
// activations, the head's and the scratch (the carvers' element counts in model.cc, 4 bytes each, over-counted).
// Past 2^62 bytes some int64 sum could wrap: zero-estimate printed negative byte counts for a 100000-layer shape.
Status CheckRepresentable(const GptConfig& m, int B, int T) {
  constexpr double kLimit = 4611686018427387904.0;  // 2^62
  const double C = m.channels, L = m.layers, V = m.vocab, H = m.heads, N = double(B) * T;
  const double params = V * C + double(m.max_seq) * C + 2 * C + L * (12 * C * C + 13 * C);
  const double acts =
      4 * ((L + 2) * (24 * N * C + 4 * N + double(B) * H * T * T + double(T) * T) + N * (3 * C + V + 3) + 2 * N * C) +
      64 * 32 * (L + 2);
  if (32 * params > kLimit || acts > kLimit) {
    return absl::OutOfRangeError(absl::StrFormat(
        "a GPT of %d layers, hidden %d, %d heads, vocab %d, sequence %d, micro-batch %d has %.3g parameters and "
        "%.3g bytes of activations: beyond 2^62 bytes, where this estimate's 64-bit byte counts could overflow",
        m.layers, m.channels, m.heads, m.vocab, T, B, params, acts));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<zero::ParamSpec> ToEngineSpecs(const std::vector<ParamSpec>& specs) {
  std::vector<zero::ParamSpec> out;
  for (const auto& s : specs) out.push_back({s.name, s.shape});
  return out;
}

std::vector<EstimateUnit> EstimateUnits(const GptConfig& model) {
  std::vector<EstimateUnit> units;
  const std::vector<ParamSpec> root = RootParams(model), block = BlockParams(model);
  units.push_back({.name = kRootUnit, .numel = UnitNumel(root), .scopes_per_pass = 1, .params = ToEngineSpecs(root)});
  for (int l = 0; l < model.layers; ++l) {
    units.push_back({.name = BlockUnitName(l), .numel = UnitNumel(block), .params = ToEngineSpecs(block)});
  }
  return units;
}

// train.cc's pass, allocation by allocation: x and dx at the bottom of the arena; per block in forward its saved
// activations (kept; or, checkpointed, allocated during its forward and released at its end, its input copied
// into the checkpoint store); the head's; then per block in reverse its backward scratch, and for a checkpointed
// block first its discarded output and rebuilt activations; each block's memory freed after its backward. The
// arena rounds every allocation up to 64 bytes, as does the store.
ActivationPeak GptActivationPeak(const GptConfig& model, int B, int T, const CheckpointerOptions& ckpt) {
  const int64_t S = RoundUp64(static_cast<int64_t>(B) * T * model.channels * static_cast<int64_t>(sizeof(float)));
  const auto A = static_cast<int64_t>(BlockActs::Bytes(model, B, T));
  const auto H = static_cast<int64_t>(HeadActs::Bytes(model, B, T));
  const auto Sc = static_cast<int64_t>(BlockScratch::Bytes(model, B, T));
  const int L = model.layers;
  int64_t used = 2 * S, peak = used;
  for (int l = 0; l < L; ++l) {
    if (ckpt.policy.Checkpoints(l)) {
      peak = std::max(peak, used + A);
    } else {
      used += A;
      peak = std::max(peak, used);
    }
  }
  peak = std::max(peak, used + H);
  for (int l = L - 1; l >= 0; --l) {
    if (ckpt.policy.Checkpoints(l)) {
      peak = std::max(peak, used + S + A + Sc);
    } else {
      peak = std::max(peak, used + Sc);
      used -= A;
    }
  }
  ActivationPeak p;
  p.arena = peak;
  const int64_t count = ckpt.policy.Count(L);
  // The contiguous store is reserved whole at the first checkpoint: checkpoint_slots (or the count) of them.
  const int64_t slots = ckpt.contiguous_checkpoints && count > 0
                            ? std::max<int64_t>(count, ckpt.checkpoint_slots > 0 ? ckpt.checkpoint_slots : count)
                            : count;
  p.checkpoints = slots * S;
  p.checkpoint_tier = ckpt.cpu_checkpointing ? MemTier::kHost : ckpt.compute_tier;
  return p;
}

StatusOr<EstimateOptions> GptEstimateOptions(const Config& config, const GptConfig& model, int seq, int world,
                                             bool recompute, Backend backend) {
  ZERO_RETURN_IF_ERROR(ValidateConfig(model));
  if (world < 1) return absl::InvalidArgumentError(absl::StrCat("world must be >= 1, got ", world));
  const int T = seq > 0 ? seq : model.max_seq;
  if (T > model.max_seq) {
    return absl::InvalidArgumentError(absl::StrCat("--seq ", T, " exceeds the model's max_seq ", model.max_seq));
  }
  Config cfg = config;
  ZERO_RETURN_IF_ERROR(cfg.Validate(world));  // derives the micro-batch where the config gives the global batch
  const int B = static_cast<int>(cfg.micro_batch());
  ZERO_RETURN_IF_ERROR(CheckRepresentable(model, B, T));
  const bool mixed = cfg.fp16.enabled || cfg.bf16.enabled;
  EstimateOptions o;
  o.world = world;
  o.backend = backend;
  const int64_t root = UnitNumel(RootParams(model)), block = UnitNumel(BlockParams(model));
  o.open_elements = Padded(root, world) + Padded(block, world);  // the root's scope spans the pass, one block's opens
  if (backend == Backend::kNccl) {
    // train_cuda.cc: every layer's activations in one device block (no recomputation on that path), the tokens
    // and targets of a micro-step, the device loss and the host copy of the micro-steps' losses, and under
    // fp16/bf16 DeviceUnitWork's fp32 weights and gradients of the root and a block, on the device.
    if (recompute) {
      return absl::InvalidArgumentError("--recompute: activation recomputation is not offered on the CUDA path yet");
    }
    const int64_t tokens = int64_t{4} * B * T;
    o.trainer.push_back({MemTag::kActivations, MemTier::kDevice,
                         static_cast<int64_t>(cuda::ActivationViews::Bytes(model, B, T)) + 2 * tokens});
    o.trainer.push_back({MemTag::kStaging, MemTier::kDevice, 4 + (mixed ? 8 * (root + block) : 0)});
    o.trainer.push_back({MemTag::kStaging, MemTier::kHost, 4 * cfg.accumulation_steps()});
    return o;
  }
  ZERO_ASSIGN_OR_RETURN(CheckpointerOptions ckpt, CheckpointerOptions::FromConfig(cfg, model.layers, recompute));
  const ActivationPeak acts = GptActivationPeak(model, B, T, ckpt);
  o.trainer.push_back({MemTag::kActivations, ckpt.compute_tier, acts.arena});
  if (acts.checkpoints > 0) o.trainer.push_back({MemTag::kActivations, acts.checkpoint_tier, acts.checkpoints});
  // train.cc's UnitWork: under fp16/bf16 an fp32 copy of the weights and one of the gradients, for the root and
  // for a block, in the host tier.
  if (mixed) o.trainer.push_back({MemTag::kStaging, MemTier::kHost, 8 * (root + block)});
  return o;
}

StatusOr<RankEstimate> EstimateGpt(const Config& config, const GptConfig& model, int seq, int world, bool recompute,
                                   Backend backend) {
  ZERO_ASSIGN_OR_RETURN(EstimateOptions o, GptEstimateOptions(config, model, seq, world, recompute, backend));
  return Estimate(config, EstimateUnits(model), o);
}

StatusOr<int> LargestLayersThatFit(const Config& config, const GptConfig& model, int seq, int world, bool recompute,
                                   Backend backend, int64_t device_bytes) {
  auto fits = [&](int layers) -> StatusOr<bool> {
    GptConfig m = model;
    m.layers = layers;
    StatusOr<RankEstimate> e = EstimateGpt(config, m, seq, world, recompute, backend);
    if (absl::IsOutOfRange(e.status())) return false;  // past 2^62 bytes: no device holds it
    ZERO_RETURN_IF_ERROR(e.status());
    return e->memory.PeakTotal(MemTier::kDevice) <= device_bytes;
  };
  // Every term grows with the block count (model state, the gathers and buckets pools, the kept activations), so
  // the answer is found by doubling, then bisection.
  constexpr int kMaxLayers = kMaxFitLayers;
  ZERO_ASSIGN_OR_RETURN(bool one, fits(1));
  if (!one) return 0;
  int lo = 1, hi = 2;  // fits(lo), and hi is to be tried
  while (hi <= kMaxLayers) {
    ZERO_ASSIGN_OR_RETURN(bool ok, fits(hi));
    if (!ok) break;
    lo = hi;
    hi *= 2;
  }
  if (hi > kMaxLayers) return lo;
  while (hi - lo > 1) {  // fits(lo), !fits(hi)
    const int mid = lo + (hi - lo) / 2;
    ZERO_ASSIGN_OR_RETURN(bool ok, fits(mid));
    (ok ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace zero::gpt
