// shard/internal/plan.h — the placement plan: which buffers each unit has on this rank, by stage, precision and
// offload. defines: PlanPolicy, BufferRole, PlannedBuffer, UnitPlan, StagePlan, MakePlan.
//
// A pure function of (config, world size, rank, unit sizes): no threads, no communicator, no memory. The engine
// allocates exactly what the plan lists (shard/engine.cc, Finalize), so its memory report equals the plan's, and
// the ZeRO byte formulas follow from the plan alone (tests/shard/plan_test.cc checks them over every stage ×
// dtype × offload × accumulation mode × world size).
//
// Buffers per unit (cd = compute dtype; Ψ_u = padded unit size, S = Ψ_u / N; "dev" = the compute tier):
//   stage 0: params[Ψ_u] cd, grads[Ψ_u] cd, master[Ψ_u] f32 (mixed only), state[Ψ_u] f32 each
//   stage 1: params[Ψ_u] cd, grads[Ψ_u] cd, master[S] (mixed only), state[S]
//   stage 2: params[Ψ_u] cd, reduced grad shard[S], master[S] (mixed only), state[S]
//   stage 3: params[S] cd (or [Ψ_u] when persistent), reduced grad shard[S], master[S] (mixed), state[S];
//            with hpZ (H > 1) also secondary[Ψ_u / H] cd for each sharded unit (tag kParams)
// With fp32 compute the master IS the parameter shard (params + rank*S, or the stage-3 shard), which is what
// makes the fp32 model-state formulas 16Ψ, 8Ψ+8Ψ/N, 4Ψ+12Ψ/N, 16Ψ/N hold. 16-bit gradients accumulated over
// several micro-steps get an fp32 accumulator (the full one at stage 0, else an fp32 shard). Optimizer offload
// moves the host part [0, host_n) of the shard's reduced gradient, master and state to the host tier (all of it,
// or ratio × S with Twin-Flow); offload_param keeps the stage-3 parameter shards there.
//
// Not in the plan's buffer list: the transient buffers the engine pools (stage-3 gathers, gradient buckets, wire
// copies, chunk staging, the full gradient of low-communication mode while it lives) and the communicator's own
// staging. TruePeakBound bounds them from the config's bucket sizes: with the plan's model state, the bound on
// the true peak (MemoryReport::peak_total) per tier (docs/internals/design.md, "The true peak and its bound").
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "zero/config.h"
#include "zero/dtype.h"
#include "zero/engine.h"
#include "zero/memory.h"
#include "zero/status.h"

namespace zero::internal {

// The config's decisions that shape placement, in one place. Every stage × precision × offload rule the engine
// follows is a predicate here.
struct PlanPolicy {
  int stage = 0;
  int world = 1;
  int rank = 0;
  DType compute = DType::kF32;  // fp16/bf16 mixed precision, else fp32
  DType wire = DType::kF32;     // communication_data_type: f32, or the compute dtype
  int accumulation_steps = 1;
  GradAccumulationMode accumulation_mode = GradAccumulationMode::kLowMemory;
  bool offload_optimizer = false;  // zero_optimization.offload_optimizer.device "cpu", stages 1-3
  // zero_optimization.offload_param.device "cpu" or "nvme", stage 3: the parameter shards are host memory to the
  // step (with "nvme" a staging buffer the shard is read into, updated in, and written back from).
  bool offload_param = false;
  // offload_param.device "nvme" (stage 3): the shards of sharded units live in the NVMe tier (offload/
  // nvme_param_tier.h), read into param_nvme_buffers staging buffers of at most param_nvme_buffer_elems elements
  // (offload_param.buffer_count, buffer_size); param_io_staging_bytes: its I/O engine's (aio.queue_depth ×
  // aio.block_size). Persistent units stay in the compute tier, gathered, as without offload.
  bool param_nvme = false;
  int param_nvme_buffers = 0;
  int64_t param_nvme_buffer_elems = 0;
  int64_t param_io_staging_bytes = 0;
  // offload_optimizer.device "nvme": the host part's fp32 master and optimizer state live in the NVMe tier (files,
  // offload/nvme_store.h), streamed through nvme_buffers staging buffers of one chunk each; the gradient's host part
  // stays in the host tier. io_staging_bytes: the I/O engine's own staging (aio.queue_depth × aio.block_size).
  bool nvme = false;
  int nvme_buffers = 0;
  int64_t io_staging_bytes = 0;
  double offload_ratio = 1.0;  // Twin-Flow: the share of each shard updated on the host
  bool pin_optimizer = false, pin_param = false;
  int64_t persistence_threshold = 0;        // stage3_param_persistence_threshold (elements, per unit)
  int64_t model_persistence_threshold = 0;  // stage3_model_persistence_threshold (elements, in total)
  int64_t sub_group_size = 1;
  int optimizer_states = 0;  // fp32 buffers the optimizer keeps per element (Adam 2, SGD with momentum 1)
  // The transient buffers' bounds (elements): reduce_bucket_size, allgather_bucket_size,
  // stage3_prefetch_bucket_size, stage3_max_live_parameters.
  int64_t reduce_bucket = 0, allgather_bucket = 0, prefetch_bucket = 0, max_live = 0;
  // ZeRO++ qwZ (zero_quantized_weights, stage 3): elements per int8 block of the forward gathers; 0 when off.
  int64_t qwz_block = 0;
  // ZeRO++ hpZ (zero_hpz_partition_size H > 1, stage 3): each sharded unit keeps a secondary copy of its
  // parameters, padded / H elements of the compute dtype, sharded over the H consecutive ranks of the host group
  // (kHpzSecondary); backward gathers it there. 1 when off.
  int hpz = 1;
  // ZeRO++ qgZ (zero_quantized_gradients, stages 1-3): bits per element on the wire (8 or 4; 0 when off), elements
  // per block, and LoCo's error feedback (err_beta, reset_T; qgz_loco false when off). qgz_local: the ranks of one
  // hop-1 group (the host's, ranks_per_host, when the reduction runs in two hops; the world when in one), set by the
  // engine and the estimator from the ranks per host (QgzLocalRanks).
  int qgz_bits = 0;
  int64_t qgz_block = 0;
  bool qgz_loco = false;
  bool qgz_loco_int8 = false;  // the residuals as int8 blocks (QgzResidualLayout), not in the compute dtype
  float loco_beta = 0.8f;
  int64_t loco_reset = 0;
  int qgz_local = 1;
  // zero_optimization.overlap_comm: reductions stay in flight while backward goes on. Without it each is retired
  // as it is issued, so no reduction's buffers outlive the scope that issued it (TruePeakBound).
  bool overlap_comm = true;
  // Stages 2-3 with a bucket per backward scope: the most gradient-bucket elements alive at once (the open
  // scopes' and those of reductions in flight) before a new bucket is taken; reductions in flight are retired
  // first (GradReducer::BeginBackward). Set by MakePlan from the units (0: no such cap), see SavingCaps.
  int64_t bucket_cap = 0;
  // Stage 3: the most elements gathered or in flight at once that prefetch and demand gathers keep to: the
  // smaller of stage3_max_live_parameters and the plan's cap (0: no cap; SavingCaps). The gather pool's own byte
  // cap stays max_live (the config's): a tighter one would free and allocate again, step after step, where units
  // of several sizes take turns in the window.
  int64_t live_cap = 0;
  // Whether stage3_max_live_parameters is DeepSpeed's default (1e9), which binds nothing below 1e9 elements: only
  // then does the plan cap the live window. A value the config chose stands (it is how a trainer asks for
  // prefetch beyond the cap: the window must hold the units open at once and the next one).
  bool default_max_live = false;
  int64_t LiveWindow() const { return live_cap > 0 ? std::min(max_live, live_cap) : max_live; }

  // The config's choices at `world` ranks (the errors of impossible combinations name the keys).
  static StatusOr<PlanPolicy> FromConfig(const Config& cfg, int world, int rank);

  bool mixed() const { return compute != DType::kF32; }
  // 16-bit gradients accumulated over several micro-steps go through an fp32 accumulator, never a 16-bit sum.
  bool Accumulate16() const { return mixed() && accumulation_steps > 1; }
  // Whether a unit's gradient is reduce-scattered after every micro-step into the sharded accumulator (low
  // memory) rather than accumulated in full locally and reduced once after the last micro-step (low
  // communication, FSDP's no_sync). Stage 0 always accumulates locally; stage 1 does too unless it accumulates
  // 16-bit gradients (then an fp32 shard accumulator beats an fp32 copy of the full gradient).
  bool ReduceEveryMicroStep() const {
    if (stage == 0) return false;
    if (stage == 1) return Accumulate16();
    return accumulation_mode == GradAccumulationMode::kLowMemory;
  }
  // fp32 training with the parameter shards on the host: those shards are the master weights (as the
  // parameters are without offload), so no separate host master is kept.
  bool MasterIsHostParams() const { return offload_param && !mixed(); }
  // Elements of a shard of S updated on the host: all of it with offload_optimizer, ratio * S rounded down to
  // whole 32-element blocks with Twin-Flow (ratio < 1), none without offload.
  int64_t HostElems(int64_t S) const;
  // Whether a unit's reduced gradient lands in this rank's slice of its full gradient buffer instead of a
  // gradient shard of its own: stage 1 (unless it accumulates 16-bit gradients in an fp32 shard), and stage 2 for
  // a trainer-owned unit (zero/sharded_optimizer.h), whose full gradient is the trainer's and exists anyway, so
  // a shard beside it would only add S elements (stage 2 then holds what stage 1 holds).
  bool GradInSlice(bool trainer_owned) const {
    return !Accumulate16() && (stage == 1 || (stage == 2 && trainer_owned));
  }
  // The dtype of the reduced gradient shard: the compute dtype when there is nothing to accumulate, else f32.
  DType GradShardDType() const { return (compute == DType::kF32 || accumulation_steps > 1) ? DType::kF32 : compute; }
};

// kHostMaster and kHostState sit in MemTier::kNvme under offload_optimizer.device "nvme" (file regions, not memory).
enum class BufferRole : uint8_t {
  kParams,        // compute dtype: full (stages 0-2, persistent units) or the stage-3 shard (host tier: offload_param)
  kFullGrads,     // compute dtype, full, persistent: stages 0-1
  kAccumFull,     // f32, full: stage 0's accumulator of 16-bit gradients over micro-steps
  kGradShard,     // the reduced gradient's device part [host_n, range)
  kHostGrad,      // the reduced gradient's host part [0, host_n)
  kHostMaster,    // fp32 master of the host part (absent when the host parameter shard is itself the master)
  kMaster,        // fp32 master of the device part, mixed precision only
  kState,         // one optimizer state buffer of the device part (state_index)
  kHostState,     // one optimizer state buffer of the host part (state_index)
  kHpzSecondary,  // hpZ: compute dtype, padded / H: this rank's part of the unit's secondary copy (stage 3)
  kQgzResidual,   // qgZ with LoCo: compute dtype, padded: what quantizing the unit's gradient lost, carried over
  kQgzHostResidual,  // ... and, with two hops, padded / ranks per host: what requantizing the host's sums lost
};
const char* BufferRoleName(BufferRole role);

struct PlannedBuffer {
  BufferRole role;
  int state_index = -1;  // kState / kHostState
  int64_t elems = 0;
  DType dtype = DType::kF32;
  MemTier tier = MemTier::kDevice;  // kDevice: the compute tier; kHost: what offload moved out of it
  MemTag tag = MemTag::kParams;
  bool pinned = false;         // host tier only: page-locked when zero was built with CUDA
  int64_t padding_elems = 0;   // of `elems`, how many are padding this rank holds
  bool trainer_owned = false;  // the trainer's own buffer (zero/sharded_optimizer.h): used, not allocated
  int64_t bytes() const { return elems * static_cast<int64_t>(DTypeSize(dtype)); }
};

// Elements [begin, end) of one shard that the quantized collectives carry exact beside their blocks: qgZ's records
// (f32, shard/internal/qgz.h) and qwZ's messages (the compute dtype, shard/gather.cc).
struct ExactSpan {
  int64_t begin = 0, end = 0;
  bool operator==(const ExactSpan&) const = default;
};
// A parameter as ExactSpans sees it: where it lies in its unit's flat buffer, and its number of dimensions.
struct ExactParam {
  int64_t offset = 0, numel = 0;
  size_t dims = 0;
};

// A quantized collective of a unit above its bucket, in chunks: the collective's chunk per rank (ChunkPerRank of
// allgather_bucket_size for qwZ's gathers, of reduce_bucket_size for qgZ's reductions) rounded down to whole blocks
// (one block where the chunk is smaller; qgZ: a multiple of 8 elements too, so records stay 4-byte aligned), so that
// each chunk quantizes the blocks the whole collective would and the chunked one gives its bits. Chunk k covers
// elements [k·chunk, min(S, (k + 1)·chunk)) of each rank's shard; its message or record (every rank's the same size) is
// that of those elements, then the most exact elements any shard has among them. qwZ: QwzMessageBytes, the exact
// elements in the compute dtype, padded to 4 bytes; the send buffer holds every chunk's message one after another
// (chunk k's at offset[k]), and each chunk's all-gather receives `world` of them. qgZ: QgzRecordBytes, the exact
// elements in f32; offset[k] only sums the records' sizes.
struct QuantChunks {
  int64_t chunk = 0;            // elements per rank (0: the unit is gathered whole)
  int64_t shard = 0;            // the unit's shard: the last chunk ends there
  std::vector<int64_t> offset;  // chunks + 1 entries: chunk k's message is bytes [offset[k], offset[k + 1])
  int64_t largest = 0;          // the largest message
  std::vector<int64_t> exact;   // per chunk: the most exact elements any shard has in it
  int64_t chunks() const { return offset.empty() ? 0 : static_cast<int64_t>(offset.size()) - 1; }
  int64_t bytes(int64_t k) const { return offset[static_cast<size_t>(k) + 1] - offset[static_cast<size_t>(k)]; }
  // Chunk k's first element in each shard, and its elements (the last chunk ends at the shard's end).
  int64_t begin(int64_t k) const { return k * chunk; }
  int64_t elems(int64_t k) const { return std::min(shard, begin(k) + chunk) - begin(k); }
  int64_t total() const { return offset.empty() ? 0 : offset.back(); }
};

struct UnitPlan {
  int64_t numel = 0;            // Ψ_u, unpadded
  int64_t padded = 0;           // numel rounded up to world × 32
  int64_t shard = 0;            // padded / world
  bool persistent = false;      // stage 3: kept gathered (below stage3_param_persistence_threshold)
  bool sharded_params = false;  // stage 3 and not persistent: only the shard is resident between scopes
  bool trainer_owned = false;   // parameters and full gradients are the trainer's buffers (stages 0-2)
  bool frozen = false;          // parameters only: no gradient, master or optimizer state
  int64_t host_n = 0;           // optimizer offload: elements [0, host_n) of the rank's range live on the host
  DType grad_shard_dtype = DType::kF32;
  // qgZ and qwZ: each shard's elements sent exact (ExactSpans), and the most of them any shard has, the slots of
  // the unit's records and messages (QgzUnitRecordBytes, QwzUnitMessageBytes).
  std::vector<std::vector<ExactSpan>> exact_spans;
  int64_t exact_max = 0;
  // qwZ on a unit gathered in chunks (above allgather_bucket_size): its chunks' messages (QwzChunkLayout); empty
  // for a unit gathered whole. qgZ on a unit reduced in chunks (above reduce_bucket_size): its chunks' records
  // (QgzChunkLayout); empty for a unit reduced whole.
  QuantChunks qwz_chunks, qgz_chunks;
  std::vector<PlannedBuffer> buffers;  // in allocation order

  const PlannedBuffer* Find(BufferRole role, int state_index = -1) const;
};

struct StagePlan {
  PlanPolicy policy;
  std::vector<UnitPlan> units;
  // Offload's copy-back staging (offload/host_step.h StagingPair): two host buffers of pipeline_tile elements
  // of the compute dtype, when some unit has a host part and the parameters live in the compute tier.
  size_t pipeline_tile = 0;
  std::vector<PlannedBuffer> staging;
  // The NVMe tier (policy.nvme, some unit with a host part): chunks of nvme_chunk elements (min(sub_group_size,
  // the largest host part) rounded up to 1024) of nvme_fields fp32 values each (the master where the tier keeps it,
  // and each optimizer state); its host staging, allocated by the store (offload/nvme_store.h): nvme_buffers
  // buffers of NvmeStore::SlotBytes, and the I/O engine's staging. None of it grows with the model.
  int64_t nvme_chunk = 0;
  int nvme_fields = 0;
  std::vector<PlannedBuffer> nvme_staging;
  // The parameter tier (policy.param_nvme, some sharded unit): param_slot_elems = min(buffer_size, the largest
  // sharded unit's shard) elements of the compute dtype per staging buffer; its host staging, allocated by the tier
  // (offload/nvme_param_tier.h): param_nvme_buffers buffers of NvmeParamTier::SlotBytes, and its I/O engine's.
  // param_too_large: the first sharded unit whose shard exceeds buffer_size (-1: none; Finalize refuses it).
  int64_t param_slot_elems = 0;
  int param_too_large = -1;
  std::vector<PlannedBuffer> param_staging;

  // The bytes the plan places, by tier and tag (current == peak), and the padding among them: what the
  // engine's own tracker reports right after Finalize. Trainer-owned buffers are not the engine's: not counted.
  MemoryReport Report() const;
};

// The saving holds at any bucket size (issue 31). DeepSpeed's defaults (5e8 elements for the buckets, 1e9
// live parameters, a 5e7 prefetch) bound nothing for a model below those sizes: every unit's gradient bucket
// could be in flight at once at stage 2, and every unit gathered at once at stage 3, which is more than the stage
// saves over the one before. So MakePlan caps both at half of what the stage saves: the buckets alive at once at
// (N - 1) / 2N of the bucketed units' elements (stage 2 holds 1/N of the gradient as shards, so gradient
// memory is at most (N + 1) / 2N of stage 1's, unless the scopes the trainer keeps open need more), and
// stage3_max_live_parameters at (N - 1) / 2N of the sharded units' elements (stage 3 keeps 1/N of the
// parameters, so with the gathers at most (N + 1) / 2N of stage 2's; PlanPolicy::live_cap), the latter only
// where stage3_max_live_parameters is DeepSpeed's default (a value the config chose stands). Neither changes a
// value: reductions and gathers are only retired or issued at other points of the program. The plan's policy
// carries the caps (StagePlan::policy), which the engine then runs by.
void ApplySavingCaps(PlanPolicy* policy, const std::vector<int64_t>& padded, const std::vector<bool>& bucketed,
                     const std::vector<bool>& sharded);

// Lays out units of `numels` elements (registration order) under `policy`. Persistence at stage 3 is decided in
// order, as the engine registers units, against stage3_model_persistence_threshold. Units flagged in
// `trainer_owned` (stages 0-2) use the trainer's parameter and gradient buffers: those are listed, marked, at
// every stage (at stage 2 the trainer's full gradient is what the reduce-scatter reads).
// Units flagged in `frozen` hold their parameters only. `params[i]`, where given, lays out unit i's parameters
// (their numels sum to numels[i]): with qgZ or qwZ its 1-D ones are sent exact (ExactSpans).
StagePlan MakePlan(const PlanPolicy& policy, const std::vector<int64_t>& numels,
                   const std::vector<bool>& trainer_owned = {}, const std::vector<bool>& frozen = {},
                   const std::vector<std::vector<ExactParam>>& params = {});

// qwZ's message per rank for a shard of S elements in blocks of `block`: the blocks' fp32 scales, then the S int8
// codes, padded to 4 bytes (the all-gather moves it as 16-bit words).
inline int64_t QwzMessageBytes(int64_t S, int64_t block) {
  const int64_t blocks = (S + block - 1) / block;
  return (4 * blocks + S + 3) / 4 * 4;
}

// qgZ's record of one shard of S elements: the blocks' fp32 scales, then the codes (S bytes at 8 bits, ceil(S / 2)
// at 4), padded to 2 bytes (the all-to-all moves records as 16-bit words).
inline int64_t QgzRecordBytes(int64_t S, int64_t block, int bits) {
  const int64_t blocks = (S + block - 1) / block;
  const int64_t codes = bits == 8 ? S : (S + 1) / 2;
  return (4 * blocks + codes + 1) / 2 * 2;
}
// Which elements qgZ and qwZ send exact, as DeepSpeed's all_to_all_quant_reduce reduces every 1-D tensor exact: a
// unit's parameters of at most one dimension (biases, norm gains), when the unit also has one of two or more. A
// unit of 1-D parameters only is a trainer's flat buffer, whose shape says nothing of what it holds: it is quantized
// whole. In a block a norm gain's value (about 1) or its gradient would set the scale of the weights beside it.
// Returns the spans of each of the `shards` shards of `shard` elements (shard-local, in order, adjacent ones
// merged); `max_exact`: the most elements any shard has in them.
std::vector<std::vector<ExactSpan>> ExactSpans(const std::vector<ExactParam>& params, int64_t shard, int shards,
                                               int64_t* max_exact);
// A unit's parameters as ExactSpans takes them, one after another as BuildUnitLayout packs them.
std::vector<ExactParam> ExactParams(const std::vector<ParamSpec>& specs);
// The spans' elements (of `elem` bytes, in `shard`) copied one after another to `tail`, and zeroed in `zeroed` (a copy
// of the shard that is quantized next, or the shard itself); returns the end of what was written. UnpackExact puts
// them back over `shard`. The bytes move with copy(dst, src, bytes) and zero(p, bytes): memcpy and memset in host
// memory (PackExact, UnpackExact), a compute tier's stream operations in a device's (qwZ on the CUDA engine).
template <typename Copy, typename Zero>
uint8_t* PackExactWith(const void* shard, void* zeroed, size_t elem, const std::vector<ExactSpan>& spans, uint8_t* tail,
                       Copy copy, Zero zero) {
  for (const ExactSpan& sp : spans) {
    const size_t bytes = static_cast<size_t>(sp.end - sp.begin) * elem, at = static_cast<size_t>(sp.begin) * elem;
    copy(tail, static_cast<const uint8_t*>(shard) + at, bytes);
    zero(static_cast<uint8_t*>(zeroed) + at, bytes);  // 0 bits: 0.0 in every float dtype
    tail += bytes;
  }
  return tail;
}
template <typename Copy>
void UnpackExactWith(const uint8_t* tail, size_t elem, const std::vector<ExactSpan>& spans, void* shard, Copy copy) {
  for (const ExactSpan& sp : spans) {
    const size_t bytes = static_cast<size_t>(sp.end - sp.begin) * elem;
    copy(static_cast<uint8_t*>(shard) + static_cast<size_t>(sp.begin) * elem, tail, bytes);
    tail += bytes;
  }
}
uint8_t* PackExact(const void* shard, void* zeroed, size_t elem, const std::vector<ExactSpan>& spans, uint8_t* tail);
void UnpackExact(const uint8_t* tail, size_t elem, const std::vector<ExactSpan>& spans, void* shard);
// Shard `shard`'s exact spans (none where the plan lists none for the unit).
inline const std::vector<ExactSpan>& ShardSpans(const UnitPlan& u, int64_t shard) {
  static const std::vector<ExactSpan> kNone;
  return static_cast<size_t>(shard) < u.exact_spans.size() ? u.exact_spans[static_cast<size_t>(shard)] : kNone;
}
// A qgZ LoCo residual buffer: `rows` rows of S elements (the unit's shards for the first hop's residual, the host
// partials of this rank's shards for the second's), element a of row r at r·S + a. In the compute dtype, that is
// all. As int8 (PlanPolicy::qgz_loco_int8), the codes are rows·S bytes, then rows·ceil(S / block) f32 scales, row
// r's from index r·ceil(S / block): each row's blocks start at the row's start, as the records' blocks of the same
// elements do, so a part of a row that starts at a multiple of the block (a whole shard, or a chunk) has whole
// blocks of its own. Either way a whole number of compute-dtype elements (S is a multiple of 32), which is how the
// plan and a checkpoint's rank-state sections count it.
struct QgzResidualLayout {
  int64_t rows = 0, S = 0, block = 0;
  bool int8 = false;
  int64_t blocks_per_row() const { return (S + block - 1) / block; }
  int64_t bytes(DType cd) const {
    return int8 ? rows * S + 4 * rows * blocks_per_row() : rows * S * static_cast<int64_t>(DTypeSize(cd));
  }
};
inline QgzResidualLayout QgzResidualOf(const PlanPolicy& p, int64_t rows, int64_t S) {
  return {rows, S, p.qgz_block, p.qgz_loco_int8};
}
// A unit's qgZ record: the quantized shard (QgzRecordBytes), then exact_max f32 values.
inline int64_t QgzUnitRecordBytes(const PlanPolicy& p, const UnitPlan& u) {
  return QgzRecordBytes(u.shard, p.qgz_block, p.qgz_bits) + 4 * u.exact_max;
}
// A unit's qwZ message: the quantized shard (QwzMessageBytes), then exact_max values of the compute dtype, padded to
// 4 bytes; QwzScratchBytes more in the send buffer where a shard has exact elements (the shard with them zeroed,
// which is what is quantized).
inline int64_t QwzUnitMessageBytes(const PlanPolicy& p, const UnitPlan& u) {
  return QwzMessageBytes(u.shard, p.qwz_block) + (u.exact_max * static_cast<int64_t>(DTypeSize(p.compute)) + 3) / 4 * 4;
}
// The layout of a unit's chunked qwZ gather, where ChunkPerRank(padded, world, allgather_bucket) is above 0 (else
// empty): QuantChunks. QgzChunkLayout: its chunked qgZ reduction, where ChunkPerRank(padded, world, reduce_bucket)
// is (QgzOn).
QuantChunks QwzChunkLayout(const PlanPolicy& p, const UnitPlan& u);
QuantChunks QgzChunkLayout(const PlanPolicy& p, const UnitPlan& u);
// The exact spans of `spans` (one shard's) that lie in [a, b), clipped to it and counted from a.
std::vector<ExactSpan> SpansIn(const std::vector<ExactSpan>& spans, int64_t a, int64_t b);
inline int64_t QwzScratchBytes(const PlanPolicy& p, const UnitPlan& u) {
  return u.exact_max > 0 ? u.shard * static_cast<int64_t>(DTypeSize(p.compute)) : 0;
}
// The ranks of qgZ's first hop: the host's (`ranks_per_host`) when the world spans whole hosts of more than one rank
// (two hops: inside each host, then across hosts), else the whole world (one hop); `hybrid`: over the shard group,
// one hop.
inline int QgzLocalRanks(int world, int ranks_per_host, bool hybrid) {
  const bool two = !hybrid && ranks_per_host > 1 && ranks_per_host < world && world % ranks_per_host == 0;
  return two ? ranks_per_host : world;
}

// Chunking: a unit's all-gather or reduce-scatter of more than `bucket` elements (allgather_bucket_size,
// reduce_bucket_size) runs as collectives of ChunkPerRank elements per rank: the largest multiple of 32 (the
// shard alignment) whose `world` blocks fit the bucket, at least 32. 0: the unit fits, one collective carries it.
int64_t ChunkPerRank(int64_t padded, int world, int64_t bucket);

// Whether qgZ quantizes the units' gradient reductions: stages 1-3 with zero_quantized_gradients. A unit above
// reduce_bucket_size is reduced in quantized chunks (UnitPlan::qgz_chunks). A trainer-owned buffer, which the exact
// path cuts into chunks of about an eighth to bound the communicator's staging (ReduceChunkPerRank), is quantized
// whole below the bucket: qgZ's records are its own staging, counted in the bound.
inline bool QgzOn(const PlanPolicy& p) { return p.qgz_bits > 0 && p.stage > 0; }
// The elements of one shard a qgZ part holds: the whole shard, or (a unit in chunks) its largest chunk.
inline int64_t QgzPartElems(const UnitPlan& u) {
  return u.qgz_chunks.chunks() > 0 ? std::min(u.qgz_chunks.chunk, u.shard) : u.shard;
}
// The bytes of one shard's record of that part: the whole shard's (QgzUnitRecordBytes), or the largest chunk's.
inline int64_t QgzPartRecordBytes(const PlanPolicy& p, const UnitPlan& u) {
  return u.qgz_chunks.chunks() > 0 ? u.qgz_chunks.largest : QgzUnitRecordBytes(p, u);
}
// The f32 scratch qgZ's coding uses (QgzFormat::Encode: 3 parts' worth), largest over the units that reduce. Every
// encode and decode runs on the compute tier's one stream and leaves nothing in it for the next, so the reductions
// in flight share one (GradReducer's) rather than hold one each. 0 where qgZ is off.
inline int64_t QgzUnitScratchBytes(const UnitPlan& u) { return u.frozen ? 0 : 3 * QgzPartElems(u) * 4; }
inline int64_t QgzScratchBytes(const PlanPolicy& p, const std::vector<UnitPlan>& units) {
  int64_t largest = 0;
  if (!QgzOn(p)) return 0;
  for (const UnitPlan& u : units) largest = std::max(largest, QgzUnitScratchBytes(u));
  return largest;
}

// The chunk (elements per rank; 0: one collective) a unit's reduce-scatter moves in. ChunkPerRank of
// reduce_bucket_size, except for a trainer-owned unit (ShardedOptimizer) at 2 ranks or more: its reduce-scatter
// reads the trainer's gradient buffer, which is all the gradient memory the trainer needs, and the only transient
// it takes is the communicator's (Gloo's reduce-scatter holds receive buffers of about twice what one op moves).
// Unchunked, that is 8 bytes per element of the unit, more than stage 1 saves (DeepSpeed's 5e8-element default
// bounds nothing below 5e8 elements). So its chunks hold at most kTrainerReduceBucket elements of all ranks
// together (4 MiB of fp32: 8 MiB of Gloo staging; chunks of that size ran at >= 0.9 of Gloo moving the same
// chunks, bench/results/comm-gloo-world4.md; each chunk costs one collective's latency) and about an eighth of
// the unit (never below 1024 elements per rank, where Gloo reads the input where it lies), cut into nearly equal
// multiples of 32; a smaller reduce_bucket_size still wins.
// Chunking moves the same sums (docs/internals/design.md, "Bounded transient buffers"): the results are the same bits.
inline constexpr int64_t kTrainerReduceBucket = int64_t{1} << 20;
int64_t ReduceChunkPerRank(const PlanPolicy& p, int64_t padded, bool trainer_owned);
// Whether `ok` holds for every chunk size of a shard of S elements moved in chunks of `chunk` per rank: the whole
// chunk (S itself when the chunk exceeds it) and, where it does not divide S, the short last one. The engine's
// UnitCollective and the plan's bound both decide with it whether a unit's chunks all move where they lie.
bool EveryChunkSize(int64_t S, int64_t chunk, const std::function<bool(int64_t n)>& ok);

// What the bound needs that the plan cannot know.
struct PeakInputs {
  // Elements of the units a trainer keeps open in scopes at once (the GPT: its root and one block). 0: the
  // largest unit (one scope at a time).
  int64_t open_elems = 0;
  // The trainer's own bytes in the engine's tracker (activations), per tier, at their peak.
  std::array<int64_t, 2> trainer_bytes{};
  // The communicator (advanced::ExtendedCommunicator::cache_bytes, ReduceScatterStagingBytes,
  // AllReduceStagingBytes); empty functions: a communicator that counts no staging.
  int64_t comm_cache_bytes = 0;
  std::function<int64_t(int64_t count, DType dtype, bool destructive)> rs_staging;
  std::function<int64_t(int64_t count, DType dtype)> ar_staging;
  // Whether chunks move where they lie, taking no staging (shard/internal/collective.h): all-gathers
  // (advanced::ExtendedCommunicator::SupportsAllGatherStrided) and reduce-scatters of `count` elements per rank of
  // `dtype` (SupportsReduceScatterStrided); false and an empty function: the copy path.
  bool ag_strided = false;
  std::function<bool(int64_t count, DType dtype)> rs_strided;
  // Hybrid sharding: the replicas' communicator's staging for the gradient shards' all-reduce (an AllReduceStaging
  // function of that communicator); empty: no replicas. Added to the host tier's staging.
  std::function<int64_t(int64_t count, DType dtype)> replica_ar_staging;
};

// The bound on one tier's true peak, by term.
struct PeakTerms {
  int64_t model_state = 0;  // the plan's buffers (what the tracker holds right after Finalize)
  int64_t gathers = 0;      // stage 3: pooled full-unit gather buffers within the live window
  int64_t reductions = 0;   // gradient buckets, wire copies, reduce-scatter outputs, reduction chunk staging, and
                            // the full gradients of low-communication mode
  int64_t full_grads = 0;   // of `reductions`, those full gradients (tagged grads; the rest is tagged buckets)
  int64_t staging = 0;      // all-gather chunk staging (device), the communicator's cached staging (host)
  int64_t trainer = 0;      // PeakInputs::trainer_bytes
  int64_t total() const { return model_state + gathers + reductions + staging + trainer; }
};

// Per tier (index MemTier): model state + the live window + the reductions in flight + the staging bounds + the
// trainer's bytes. A pure function of the plan (its policy carries the bucket sizes) and `in`. It bounds the
// host (Gloo) engine; a CUDA engine also stages host arrays and offload_param's shards on the device, and NCCL's
// own buffers are not tracked.
std::array<PeakTerms, 2> TruePeakBound(const StagePlan& plan, const PeakInputs& in);

}  // namespace zero::internal
