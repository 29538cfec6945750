// examples/gpt/estimate.h — the reference GPT as zero::Estimate (zero/estimate.h) sees it: its units as TrainRank
// registers and opens them, and the bytes the trainer itself puts in the engine's tracker.
//
//   zero::Config cfg = ...;                       // as zero-gpt takes it (micro-batch, stage, bf16, ...)
//   ZERO_ASSIGN_OR_RETURN(zero::RankEstimate e,
//                         zero::gpt::EstimateGpt(cfg, zero::gpt::GptConfig::Small(), /*seq=*/128, /*world=*/4,
//                                                /*recompute=*/true));
//
// Why this lives beside the GPT and not in the library: activations are the trainer's. The library plans and
// bounds every byte the engine allocates, but how many activation bytes a model keeps depends on its code — which
// tensors its forward saves, its attention (this GPT materializes the B x heads x T x T probabilities), its
// dtype (fp32 here), what it puts in the arena — and on its recomputation. So zero::Estimate takes the trainer's
// bytes as an input (EstimateOptions::trainer), and this file computes them for this GPT from the same sizes its
// allocations use (BlockActs::Bytes, HeadActs::Bytes, BlockScratch::Bytes, in train.cc's order), checked against
// measured runs by tests/shard/estimate_test.cc. Another trainer supplies its own.
#pragma once

#include <cstdint>
#include <vector>

#include "model.h"
#include "zero/config.h"
#include "zero/estimate.h"
#include "zero/recompute.h"
#include "zero/status.h"

namespace zero::gpt {

// The model's parameter specs as the engine's (Engine::AddUnit, EstimateUnit::params).
std::vector<zero::ParamSpec> ToEngineSpecs(const std::vector<ParamSpec>& specs);

// The units TrainRank registers, in order: the root (embeddings, final layernorm, tied head; held open in one
// Backward scope for the whole pass) and one per block (a Forward and a Backward scope per pass).
std::vector<EstimateUnit> EstimateUnits(const GptConfig& model);

// Peak activation bytes of one rank of TrainRank at micro-batch B and sequence T under the recomputation policy
// `ckpt` (CheckpointerOptions::FromConfig(config, layers, recompute)): the Checkpointer's arena (the residual
// stream and its gradient, each kept block's saved activations, the head's, the backward scratch, and for a
// recomputed block its rebuilt activations and discarded output) and its checkpoint store (the saved block
// inputs), each at its high-water mark. From the second pass on the arena holds its peak as one block, so the two
// add up in the tracker when they share a tier.
struct ActivationPeak {
  int64_t arena = 0;        // in ckpt.compute_tier
  int64_t checkpoints = 0;  // in the host tier with cpu_checkpointing, else the compute tier
  MemTier checkpoint_tier = MemTier::kDevice;
};
ActivationPeak GptActivationPeak(const GptConfig& model, int B, int T, const CheckpointerOptions& ckpt);

// zero::Estimate's options for one rank of zero-gpt at `world` ranks: the root and one block open at once, and the
// trainer's bytes. kGloo: TrainRank on the host engine (train.cc) — the activations above and, with 16-bit
// compute, fp32 copies of the root's and a block's weights and gradients (host tier, tagged staging). kNccl:
// TrainRankCuda (train_cuda.cc) — every layer's activations in one device block (that path has no recomputation:
// `recompute` is kInvalidArgument, as there), the fp32 copies on the device. Computed from the trainers' own size
// functions; the CUDA one is not measured here (no GPU in CI). `config` as the engine takes it.
StatusOr<EstimateOptions> GptEstimateOptions(const Config& config, const GptConfig& model, int seq, int world,
                                             bool recompute, Backend backend = Backend::kGloo);

// The whole estimate of one rank of zero-gpt: `seq` tokens per sequence (0: the model's max_seq), the micro-batch
// from `config`. A shape whose parameters or activations would pass 2^62 bytes (where the int64 sums could
// overflow) is kOutOfRange naming the sizes, before any integer arithmetic on them.
StatusOr<RankEstimate> EstimateGpt(const Config& config, const GptConfig& model, int seq, int world, bool recompute,
                                   Backend backend = Backend::kGloo);

// Where LargestLayersThatFit stops searching: as many units as it would estimate (one per block), and the most
// blocks zero-estimate takes.
inline constexpr int kMaxFitLayers = 1 << 16;

// The most blocks a model of `model`'s other dimensions may have for one rank's device tier (the bound on its
// true peak, all tags at once) to stay within `device_bytes`; 0 when not even one block fits; kMaxFitLayers when
// that many fit (the search stops there: the answer is "at least", and the caller says so). A block count whose
// estimate would overflow 64-bit byte counts does not fit.
StatusOr<int> LargestLayersThatFit(const Config& config, const GptConfig& model, int seq, int world, bool recompute,
                                   Backend backend, int64_t device_bytes);

}  // namespace zero::gpt
