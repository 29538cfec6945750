// zero/estimate.h — what each rank will hold and send, predicted before a run starts: zero::Estimate.
//
//   std::vector<zero::EstimateUnit> units = {{.name = "embed", .numel = 51'000'000, .scopes_per_pass = 1}};
//   for (int l = 0; l < 48; ++l) units.push_back({.name = "h." + std::to_string(l), .numel = 12'600'000});
//   zero::EstimateOptions o{.world = 64};
//   o.trainer = {{zero::MemTag::kActivations, zero::MemTier::kDevice, activation_bytes}};
//   ZERO_ASSIGN_OR_RETURN(zero::RankEstimate e, zero::Estimate(cfg, units, o));
//   e.memory.Get(zero::MemTier::kDevice, zero::MemTag::kOptimizer).peak;   // bytes per rank
//   e.memory.PeakTotal(zero::MemTier::kDevice);                            // all tags alive at once
//
// The estimate is built on the placement plan the engine allocates by (src/shard/internal/plan.h: MakePlan) and
// the plan's bound on the true peak (TruePeakBound), the same functions the engine calls, so the two cannot
// disagree on model state: parameters, gradients, master weights and optimizer state are the engine's exactly
// (tests/shard/estimate_test.cc compares them with measured runs byte for byte). The transient buffers are the
// pools' largest: the stage-3 gathers the live window allows (stage3_max_live_parameters,
// stage3_prefetch_bucket_size and the units open at once), the gradient buckets, wire copies and reduce-scatter
// outputs reduce_bucket_size allows in flight, the chunk staging, the communicator's cached staging. The engine
// reaches those where its pools fill, which is the steady state; with overlap_comm, how many reductions are still
// in flight when the next unit opens depends on how fast they complete, so measured buckets can stay below.
//
// What the library cannot know is the trainer's own memory: its activations (which depend on its model code and
// its recomputation) and whatever else it allocates through the engine's tracker. The trainer passes them in
// (EstimateOptions::trainer); the reference GPT's are computed next to it (examples/gpt/estimate.h), from how it
// allocates.
//
// Communication: per step, the collectives the engine issues for the model's data (stage-3 gathers, gradient
// reductions, the refresh of full parameters after the update), with the elements each carries and the bytes a
// rank sends under a bandwidth-optimal algorithm. The engine's small control all-reduces (the gradient norm, the
// desync check: tens of bytes) are not listed.
//
// Estimate is a pure function of its arguments: it allocates no training memory, issues no collective and may
// run in any thread, or in a process that is no rank (zero-estimate). Its errors are listed at Estimate.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/dtype.h"
#include "zero/engine.h"
#include "zero/memory.h"
#include "zero/status.h"

namespace zero {

// One unit as the trainer will register it (Engine::AddUnit), in registration order.
struct EstimateUnit {
  std::string name;
  int64_t numel = 0;    // parameters in the unit (unpadded)
  bool frozen = false;  // a frozen parameter group's unit: parameters only
  // Scopes the trainer opens on the unit per micro-step: 2 for a unit opened in forward and again in backward,
  // 1 for a unit held open across the whole pass (the reference GPT's root unit). At stage 3 each scope of a
  // sharded unit is one gather.
  int scopes_per_pass = 2;
  // Optional: the unit's parameters as Engine::AddUnit will get them (names, shapes, in order). Only ZeRO++
  // (zero_quantized_gradients, zero_quantized_weights) reads them: it sends a unit's 1-D parameters exact beside its
  // quantized blocks, and how many of them land in one shard sizes every record and message. Without them the
  // estimate counts none. When given, numel is their sum (0 there means "their sum"; another value is an error).
  std::vector<ParamSpec> params;
};

// Bytes the trainer allocates through the engine's tracker (Engine::memory_tracker()), at their peak.
struct TrainerBytes {
  MemTag tag = MemTag::kActivations;
  MemTier tier = MemTier::kDevice;
  int64_t bytes = 0;
};

struct EstimateOptions {
  int world = 1;
  int rank = 0;  // whose padding is reported (every rank's buffers have the same sizes)
  // Hybrid sharding: ranks per shard group, as zero_optimization.mics_shard_size (which it overrides); 0: the
  // config's mics_shard_size, else the whole world. Must divide `world`.
  int shard_group = 0;
  // Ranks per host (EngineOptions::local_world_size), for intra_host_bytes / inter_host_bytes; 0: 1.
  int ranks_per_host = 0;
  // The communicators run in check mode (CommOptions::check_order, ZERO_COMM_CHECK): each op is preceded by an
  // all-gather of its 32-byte fingerprint, which intra_host_bytes / inter_host_bytes then include.
  bool check_order = false;
  // kGloo: the host engine, whose communicator's staging is tracked (host tier). kNccl: the CUDA engine; NCCL's
  // own buffers are not tracked, so no staging is counted for them.
  Backend backend = Backend::kGloo;
  // The Gloo communicator's cache budget (CommOptions::cache_bytes); negative: CommOptions' default.
  int64_t comm_cache_bytes = -1;
  // Elements of the units the trainer keeps open at once (the reference GPT: its root unit and one block);
  // 0: the largest unit, one scope at a time.
  int64_t open_elements = 0;
  // The trainer's own bytes in the engine's tracker (activations, its own staging), at their peak.
  std::vector<TrainerBytes> trainer;
  // fp32 state buffers per element of the optimizer (Adam 2, SGD with momentum 1); negative: the config's
  // "optimizer" section decides, as in the engine.
  int optimizer_states = -1;
  // Asynchronous checkpoints (SaveOptions::async, zero-gpt --save-async): the staging the engine keeps from the
  // first asynchronous save on, counted in the host tier under kStaging and in peak_total: this rank's whole rank
  // file (its part of every saved stream, the 64-byte header) plus 4 KiB of alignment, and the I/O engine's
  // aio.queue_depth buffers of aio.block_size. Ranks outside the first shard group (hybrid sharding) write
  // nothing and hold none.
  bool async_save = false;
};

enum class CollectiveKind : uint8_t { kAllGather, kReduceScatter, kAllReduce, kAllToAll };
// "all_gather", "reduce_scatter", "all_reduce", "all_to_all" (qgZ's quantized gradient records)
const char* CollectiveKindName(CollectiveKind kind);

// One kind of collective the engine issues every step, summed over the units.
struct CollectiveEstimate {
  std::string what;  // "stage-3 gathers", "hpZ backward gathers", "gradient reduce-scatter", "gradient all-reduce",
                     // "parameter refresh", "gradient all-reduce across replicas", "qgZ all-to-all" (the
                     // first hop, or the only one), "qgZ across hosts" (the second: 16-bit words of the records)
  CollectiveKind kind = CollectiveKind::kAllGather;
  DType dtype = DType::kF32;
  int64_t calls = 0;     // per step: one per unit and occasion (a unit moved in chunks still counts once)
  int64_t elements = 0;  // per step: the calls' count arguments summed (a shard per rank; a whole unit for all-reduce)
  // Bytes one rank sends per step under a bandwidth-optimal algorithm (NCCL's ring; Gloo's halving-doubling at a
  // power-of-two world): (N-1) shards per all-gather and reduce-scatter, 2(N-1)/N of the buffer per all-reduce;
  // qwZ's forward gathers their int8 messages, hpZ's backward gathers (H-1) parts of padded / H in the host group.
  int64_t bytes_sent = 0;
};

struct RankEstimate {
  // Per tier and tag, the predicted peak in both `current` and `peak` (the engine's pools keep their bytes, so
  // after the first step what is held equals the peak); per tier, `peak_total` is the bound on the true peak (all
  // tags alive at once, the communicator's staging included), as Engine::TruePeakBound gives it. Tags and tiers
  // are those of Engine::memory_report(), the communicator's staging under kStaging in the host tier.
  MemoryReport memory;
  // The same figures if every reduction completed before the next scope opened. With overlap_comm, where between
  // `floor` and `memory` a run's buckets (and one micro-step's low-communication gradients) land depends on how
  // fast its reductions complete; without it the two are equal.
  MemoryReport floor;
  // Of `memory`, what Finalize allocates (the plan's buffers: model state, and offload's copy-back staging),
  // held from Finalize to the end of the run.
  MemoryReport planned;
  std::array<PeakBound, 2> peak_bound{};  // the bound by term (MemTier index)
  int64_t params = 0;                     // Ψ: the units' elements, unpadded
  int64_t padded = 0;                     // the same, each unit padded to whole shards
  int persistent_units = 0;               // stage 3: units kept gathered (stage3_param_persistence_threshold)
  int micro_steps = 1;                    // gradient_accumulation_steps
  int shard_group = 1;                    // the ranks one copy of the model is sharded over (hybrid: G)
  std::vector<CollectiveEstimate> comm;   // per step
  // Of the bytes `rank` sends per step, those to ranks of its host and to other hosts (EstimateOptions::
  // ranks_per_host), as StepResult counts them on the host engine: every collective of the step, the norm and
  // desync check included, message by message under Gloo's algorithms (Communicator::bytes_sent_to_ranks).
  int64_t intra_host_bytes = 0;
  int64_t inter_host_bytes = 0;

  int64_t BytesSentPerStep() const;
  // {"params": {"tier": "device", "bytes": N}, ..., "peak_total": {"host": N, "device": N}}: one entry per tag
  // with bytes, named as zero-gpt --json names the tags of its memory report ("params@device" for the device part
  // of a tag present in both tiers), with "min_bytes" (from `floor`) where that differs.
  std::string MemoryJson() const;
  // [{"what": .., "kind": .., "dtype": .., "calls": .., "elements": .., "bytes_sent": ..}, ...]
  std::string CommJson() const;
};

// What a rank of a run at options.world ranks will hold and send per step: `config` as the engine would take it
// (validated at that world size), `units` in registration order. Errors: kInvalidArgument naming the option or
// the unit, the config's own errors (naming the key), kUnimplemented for what the engine does not do.
StatusOr<RankEstimate> Estimate(const Config& config, const std::vector<EstimateUnit>& units,
                                const EstimateOptions& options);

}  // namespace zero
