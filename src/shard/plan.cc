// shard/plan.cc — the placement plan (shard/internal/plan.h): stage × precision × offload → buffers per unit.
#include "shard/internal/plan.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "offload/nvme_param_tier.h"
#include "shard/internal/layout.h"

namespace zero::internal {

StatusOr<PlanPolicy> PlanPolicy::FromConfig(const Config& cfg, int world, int rank) {
  PlanPolicy p;
  p.stage = cfg.zero.stage;
  p.world = world;
  p.rank = rank;
  if (cfg.fp16.enabled) {
    p.compute = DType::kF16;
  } else if (cfg.bf16.enabled) {
    p.compute = DType::kBF16;
  }
  if (cfg.communication_data_type.has_value()) {
    ZERO_ASSIGN_OR_RETURN(p.wire, ParseDType(*cfg.communication_data_type));
    if (p.wire != DType::kF32 && p.wire != p.compute) {
      return absl::InvalidArgumentError(absl::StrCat("communication_data_type: \"", *cfg.communication_data_type,
                                                     "\" must be fp32 or the compute dtype (",
                                                     std::string(DTypeName(p.compute)), ")"));
    }
  }
  p.offload_optimizer = cfg.zero.offload_optimizer.device != OffloadDevice::kNone && p.stage >= 1;
  p.nvme = p.offload_optimizer && cfg.zero.offload_optimizer.device == OffloadDevice::kNvme;
  if (p.nvme) {
    if (cfg.zero.offload_optimizer.buffer_count < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("zero_optimization.offload_optimizer.buffer_count: ", cfg.zero.offload_optimizer.buffer_count,
                       " with device \"nvme\"; at least 1 staging buffer is needed"));
    }
    if (cfg.aio.block_size < 4096) {
      return absl::InvalidArgumentError(absl::StrCat("aio.block_size: ", cfg.aio.block_size,
                                                     " with offload_optimizer.device \"nvme\"; at least 4096 (the "
                                                     "O_DIRECT granule)"));
    }
    p.nvme_buffers = static_cast<int>(std::min<int64_t>(cfg.zero.offload_optimizer.buffer_count, 1 << 16));
    p.io_staging_bytes = std::min<int64_t>(cfg.aio.queue_depth, 1 << 16) * cfg.aio.block_size;
  }
  // Below stage 3 there are no parameter shards to offload (Config::Validate refuses offload_param there).
  p.offload_param = cfg.zero.offload_param.device != OffloadDevice::kNone && p.stage == 3;
  p.param_nvme = p.offload_param && cfg.zero.offload_param.device == OffloadDevice::kNvme;
  p.offload_ratio = cfg.zero.offload_optimizer.ratio;
  const char* param_device = p.param_nvme ? "nvme" : "cpu";
  if (p.offload_param && p.offload_optimizer && p.offload_ratio < 1.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.offload_optimizer.ratio: ", p.offload_ratio, " with offload_param.device \"", param_device,
        "\": the device part of a Twin-Flow step updates parameters in device memory, but offload_param keeps "
        "them off the device; use ratio 1 or offload_param.device \"none\""));
  }
  if (p.param_nvme) {
    const OffloadParamConfig& op = cfg.zero.offload_param;
    if (op.buffer_count < 1) {
      return absl::InvalidArgumentError(absl::StrCat("zero_optimization.offload_param.buffer_count: ", op.buffer_count,
                                                     " with device \"nvme\"; at least 1 staging buffer is needed"));
    }
    if (op.buffer_size < 1) {
      return absl::InvalidArgumentError(absl::StrCat("zero_optimization.offload_param.buffer_size: ", op.buffer_size,
                                                     " with device \"nvme\"; at least 1 element"));
    }
    if (cfg.aio.block_size < 4096) {
      return absl::InvalidArgumentError(absl::StrCat("aio.block_size: ", cfg.aio.block_size,
                                                     " with offload_param.device \"nvme\"; at least 4096 (the "
                                                     "O_DIRECT granule)"));
    }
    p.param_nvme_buffers = static_cast<int>(std::min<int64_t>(op.buffer_count, 1 << 16));
    p.param_nvme_buffer_elems = op.buffer_size;
    p.param_io_staging_bytes = std::min<int64_t>(cfg.aio.queue_depth, 1 << 16) * cfg.aio.block_size;
  }
  p.pin_optimizer = cfg.zero.offload_optimizer.pin_memory;
  p.pin_param = cfg.zero.offload_param.pin_memory;
  p.accumulation_steps = cfg.accumulation_steps();
  p.accumulation_mode = cfg.gradient_accumulation_mode;
  p.persistence_threshold = cfg.zero.stage3_param_persistence_threshold;
  p.model_persistence_threshold = cfg.zero.stage3_model_persistence_threshold;
  p.sub_group_size = cfg.zero.sub_group_size;
  p.reduce_bucket = cfg.zero.reduce_bucket_size;
  p.allgather_bucket = cfg.zero.allgather_bucket_size;
  p.prefetch_bucket = cfg.zero.stage3_prefetch_bucket_size;
  p.max_live = cfg.zero.stage3_max_live_parameters;
  p.default_max_live = p.max_live == Config::Default().zero.stage3_max_live_parameters;
  p.overlap_comm = cfg.zero.overlap_comm;
  p.qwz_block = cfg.zero.zero_quantized_weights && p.stage == 3 ? cfg.zero.zero_quantized_weights_block_size : 0;
  if (cfg.zero.zero_quantized_gradients && p.stage >= 1) {
    p.qgz_bits = static_cast<int>(cfg.zero.zero_quantized_gradients_bits);
    p.qgz_block = cfg.zero.zero_quantized_gradients_block_size;
    p.qgz_loco = cfg.zero.zero_quantized_gradients_error_feedback;
    p.qgz_loco_int8 = p.qgz_loco && cfg.zero.zero_quantized_gradients_error_feedback_dtype == QgzResidualDType::kInt8;
    p.loco_beta = static_cast<float>(cfg.zero.zeropp_loco_err_beta);
    p.loco_reset = cfg.zero.zeropp_loco_reset_t;
    p.qgz_local = world;
  }
  const int64_t H = cfg.zero.zero_hpz_partition_size;
  if (H > 1 && p.stage == 3) {
    if (world % H != 0) {
      return absl::InvalidArgumentError(absl::StrCat("zero_optimization.zero_hpz_partition_size: ", H,
                                                     " does not divide the ", world,
                                                     " ranks the model is sharded over"));
    }
    p.hpz = static_cast<int>(H);
  }
  return p;
}

int64_t PlanPolicy::HostElems(int64_t S) const {
  if (!offload_optimizer) return 0;
  if (offload_ratio >= 1.0) return S;
  const int64_t q = kShardAlignElems;
  return static_cast<int64_t>(offload_ratio * static_cast<double>(S)) / q * q;
}

const char* BufferRoleName(BufferRole role) {
  switch (role) {
    case BufferRole::kParams: return "params";
    case BufferRole::kFullGrads: return "full_grads";
    case BufferRole::kAccumFull: return "accum_full";
    case BufferRole::kGradShard: return "grad_shard";
    case BufferRole::kHostGrad: return "host_grad";
    case BufferRole::kHostMaster: return "host_master";
    case BufferRole::kMaster: return "master";
    case BufferRole::kState: return "state";
    case BufferRole::kHostState: return "host_state";
    case BufferRole::kHpzSecondary: return "hpz_secondary";
    case BufferRole::kQgzResidual: return "qgz_residual";
    case BufferRole::kQgzHostResidual: return "qgz_host_residual";
  }
  return "?";
}

const PlannedBuffer* UnitPlan::Find(BufferRole role, int state_index) const {
  for (const auto& b : buffers) {
    if (b.role == role && b.state_index == state_index) return &b;
  }
  return nullptr;
}

namespace {

// One unit's buffers on this rank. `persistent` is decided by the caller (it depends on the units before).
UnitPlan PlanUnit(const PlanPolicy& p, int64_t numel, bool persistent, bool trainer_owned, bool frozen) {
  UnitPlan u;
  u.trainer_owned = trainer_owned;
  u.frozen = frozen;
  u.numel = numel;
  u.padded = PaddedNumel(numel, p.world);
  u.shard = u.padded / p.world;
  u.persistent = persistent;
  u.sharded_params = p.stage == 3 && !persistent;
  const DType cd = p.compute;
  const int64_t owned = std::clamp<int64_t>(numel - static_cast<int64_t>(p.rank) * u.shard, 0, u.shard);
  const int64_t pad_full = u.padded - numel;
  const int64_t pad_shard = u.shard - owned;
  // Optimizer offload splits this rank's range into a host part [0, host_n) and a device part; the padding sits
  // at the end of the shard, so each part's share of it is what lies past the owned elements. A frozen unit has
  // nothing to update.
  u.host_n = frozen ? 0 : p.HostElems(u.shard);
  const int64_t range = p.stage == 0 ? u.padded : u.shard;
  const int64_t n_dev = range - u.host_n;
  const int64_t pad_range = p.stage == 0 ? pad_full : pad_shard;
  const int64_t pad_host = std::max<int64_t>(0, u.host_n - owned);
  const int64_t pad_dev = pad_range - pad_host;
  u.grad_shard_dtype = p.GradShardDType();
  auto add = [&](BufferRole role, int64_t elems, DType dtype, MemTier tier, MemTag tag, bool pinned, int64_t padding,
                 int state_index = -1) {
    u.buffers.push_back(PlannedBuffer{role, state_index, elems, dtype, tier, tag, pinned, padding});
  };
  constexpr MemTier kDev = MemTier::kDevice, kHost = MemTier::kHost;
  // Parameters.
  if (trainer_owned) {
    add(BufferRole::kParams, u.padded, cd, kDev, MemTag::kParams, false, pad_full);
    u.buffers.back().trainer_owned = true;
    if (frozen) return u;
    add(BufferRole::kFullGrads, u.padded, cd, kDev, MemTag::kGrads, false, pad_full);
    u.buffers.back().trainer_owned = true;
  } else if (u.sharded_params) {
    add(BufferRole::kParams, u.shard, cd,
        p.param_nvme      ? MemTier::kNvme
        : p.offload_param ? kHost
                          : kDev,
        MemTag::kParams, p.offload_param && p.pin_param && !p.param_nvme, pad_shard);
    if (p.hpz > 1) {
      // hpZ: this rank's part j = rank mod H of the secondary copy, elements [j·Ψ_u/H, (j+1)·Ψ_u/H).
      const int64_t part = u.padded / p.hpz, j = p.rank % p.hpz;
      const int64_t held = std::clamp<int64_t>(numel - j * part, 0, part);
      add(BufferRole::kHpzSecondary, part, cd, kDev, MemTag::kParams, false, part - held);
    }
  } else {
    add(BufferRole::kParams, u.padded, cd, kDev, MemTag::kParams, false, pad_full);
  }
  if (frozen) return u;
  // qgZ with LoCo: the unit's residuals, zeroed (shard/internal/qgz.h).
  if (p.qgz_loco && QgzOn(p)) {
    const int64_t es = static_cast<int64_t>(DTypeSize(cd));  // the layout's bytes, counted in compute-dtype elements
    add(BufferRole::kQgzResidual, QgzResidualOf(p, p.world, u.shard).bytes(cd) / es, cd, kDev, MemTag::kGrads, false,
        0);
    if (p.qgz_local < p.world) {
      add(BufferRole::kQgzHostResidual, QgzResidualOf(p, p.world / p.qgz_local, u.shard).bytes(cd) / es, cd, kDev,
          MemTag::kGrads, false, 0);
    }
  }
  // Gradients: the trainer-visible full buffer where it persists, and where needed the reduced shard.
  if (p.stage <= 1 && !trainer_owned) add(BufferRole::kFullGrads, u.padded, cd, kDev, MemTag::kGrads, false, pad_full);
  if (p.Accumulate16() && p.stage == 0)
    add(BufferRole::kAccumFull, u.padded, DType::kF32, kDev, MemTag::kGrads, false, pad_full);
  if (p.stage >= 1 && !p.GradInSlice(trainer_owned) && n_dev > 0) {
    add(BufferRole::kGradShard, n_dev, u.grad_shard_dtype, kDev, MemTag::kGrads, false, pad_dev);
  }
  if (u.host_n > 0) {
    add(BufferRole::kHostGrad, u.host_n, u.grad_shard_dtype, kHost, MemTag::kGrads, p.pin_optimizer, pad_host);
    if (!p.MasterIsHostParams()) {
      add(BufferRole::kHostMaster, u.host_n, DType::kF32, p.nvme ? MemTier::kNvme : kHost, MemTag::kMaster,
          p.pin_optimizer && !p.nvme, pad_host);
    }
  }
  if (p.mixed() && n_dev > 0) add(BufferRole::kMaster, n_dev, DType::kF32, kDev, MemTag::kMaster, false, pad_dev);
  // Optimizer state.
  for (int s = 0; s < p.optimizer_states; ++s) {
    if (n_dev > 0) add(BufferRole::kState, n_dev, DType::kF32, kDev, MemTag::kOptimizer, false, pad_dev, s);
    if (u.host_n > 0) {
      add(BufferRole::kHostState, u.host_n, DType::kF32, p.nvme ? MemTier::kNvme : kHost, MemTag::kOptimizer,
          p.pin_optimizer && !p.nvme, pad_host, s);
    }
  }
  return u;
}

}  // namespace

void ApplySavingCaps(PlanPolicy* p, const std::vector<int64_t>& padded, const std::vector<bool>& bucketed,
                     const std::vector<bool>& sharded) {
  int64_t in_buckets = 0, in_shards = 0;
  for (size_t i = 0; i < padded.size(); ++i) {
    if (bucketed[i]) in_buckets += padded[i];
    if (sharded[i]) in_shards += padded[i];
  }
  const int64_t N = p->world;
  if (in_buckets > 0) {
    const int64_t cap = in_buckets * (N - 1) / (2 * N);
    p->bucket_cap = p->bucket_cap > 0 ? std::min(p->bucket_cap, cap) : cap;
  }
  if (in_shards > 0 && p->default_max_live) {
    const int64_t cap = in_shards * (N - 1) / (2 * N);
    p->live_cap = p->live_cap > 0 ? std::min(p->live_cap, cap) : cap;
  }
}

std::vector<std::vector<ExactSpan>> ExactSpans(const std::vector<ExactParam>& params, int64_t shard, int shards,
                                               int64_t* max_exact) {
  std::vector<std::vector<ExactSpan>> spans(static_cast<size_t>(shards));
  *max_exact = 0;
  const bool shaped = std::any_of(params.begin(), params.end(), [](const ExactParam& q) { return q.dims >= 2; });
  if (!shaped || shard <= 0) return spans;
  std::vector<int64_t> count(static_cast<size_t>(shards), 0);
  for (const ExactParam& q : params) {
    if (q.dims >= 2 || q.numel <= 0) continue;
    // The parameter's elements, cut at the shard boundaries (a span may merge with the one before it).
    for (int64_t a = q.offset, end = q.offset + q.numel; a < end;) {
      const int64_t r = a / shard, b = std::min(end, (r + 1) * shard);
      std::vector<ExactSpan>& v = spans[static_cast<size_t>(r)];
      const ExactSpan sp{a - r * shard, b - r * shard};
      if (!v.empty() && v.back().end == sp.begin) {
        v.back().end = sp.end;
      } else {
        v.push_back(sp);
      }
      count[static_cast<size_t>(r)] += b - a;
      a = b;
    }
  }
  *max_exact = *std::max_element(count.begin(), count.end());
  return spans;
}

std::vector<ExactParam> ExactParams(const std::vector<ParamSpec>& specs) {
  std::vector<ExactParam> out;
  int64_t offset = 0;
  for (const ParamSpec& s : specs) {
    out.push_back({offset, s.numel(), s.shape.size()});
    offset += s.numel();
  }
  return out;
}

uint8_t* PackExact(const void* shard, void* zeroed, size_t elem, const std::vector<ExactSpan>& spans, uint8_t* tail) {
  return PackExactWith(
      shard, zeroed, elem, spans, tail, [](void* d, const void* s, size_t n) { std::memcpy(d, s, n); },
      [](void* p, size_t n) { std::memset(p, 0, n); });
}

void UnpackExact(const uint8_t* tail, size_t elem, const std::vector<ExactSpan>& spans, void* shard) {
  UnpackExactWith(tail, elem, spans, shard, [](void* d, const void* s, size_t n) { std::memcpy(d, s, n); });
}

StagePlan MakePlan(const PlanPolicy& policy, const std::vector<int64_t>& numels, const std::vector<bool>& trainer_owned,
                   const std::vector<bool>& frozen, const std::vector<std::vector<ExactParam>>& params) {
  StagePlan plan;
  plan.policy = policy;
  int64_t persistent_total = 0, max_host = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    const int64_t numel = numels[i];
    const bool owned_by_trainer = i < trainer_owned.size() && trainer_owned[i];
    bool persistent = false;
    if (policy.stage == 3 && !owned_by_trainer && numel < policy.persistence_threshold &&
        persistent_total + numel <= policy.model_persistence_threshold) {
      persistent = true;
      persistent_total += numel;
    }
    const bool is_frozen = i < frozen.size() && frozen[i];
    plan.units.push_back(PlanUnit(policy, numel, persistent, owned_by_trainer, is_frozen));
    UnitPlan& u = plan.units.back();
    if (policy.qgz_bits > 0 || policy.qwz_block > 0) {
      u.exact_spans =
          ExactSpans(i < params.size() ? params[i] : std::vector<ExactParam>{}, u.shard, policy.world, &u.exact_max);
      u.qwz_chunks = QwzChunkLayout(policy, u);
      u.qgz_chunks = QgzChunkLayout(policy, u);
    }
    max_host = std::max(max_host, plan.units.back().host_n);
  }
  {
    std::vector<int64_t> padded;
    std::vector<bool> bucketed, sharded;
    for (const UnitPlan& u : plan.units) {
      padded.push_back(u.padded);
      bucketed.push_back(policy.stage >= 2 && policy.ReduceEveryMicroStep() && !u.trainer_owned && !u.frozen);
      sharded.push_back(u.sharded_params);
    }
    ApplySavingCaps(&plan.policy, padded, bucketed, sharded);
  }
  // Double-buffered staging for the host step's copy-back: tiles of min(sub_group_size, 1 M) elements, no larger
  // than the largest host part. With offload_param the parameters are updated where they live: nothing to copy.
  if (max_host > 0 && !policy.offload_param) {
    plan.pipeline_tile = static_cast<size_t>(
        std::min<int64_t>({std::max<int64_t>(policy.sub_group_size, 1), int64_t{1} << 20, max_host}));
    for (int i = 0; i < 2; ++i) {
      plan.staging.push_back(PlannedBuffer{BufferRole::kParams, -1, static_cast<int64_t>(plan.pipeline_tile),
                                           policy.compute, MemTier::kHost, MemTag::kStaging, policy.pin_optimizer, 0});
    }
  }
  // The NVMe tier's staging: buffer_count chunks, each aligned for O_DIRECT (NvmeStore::SlotBytes, in f32
  // elements), and the I/O engine's blocks.
  const int fields = (policy.MasterIsHostParams() ? 0 : 1) + policy.optimizer_states;
  if (policy.nvme && max_host > 0 && fields > 0) {
    constexpr int64_t kChunkAlign = 1024;  // 4 KiB of fp32: every full chunk's fields start on a block
    const int64_t chunk = std::min(std::max<int64_t>(policy.sub_group_size, 1), max_host);
    plan.nvme_chunk = (chunk + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
    plan.nvme_fields = fields;
    const int64_t slot_elems = plan.nvme_chunk * fields + 1024;  // NvmeStore::SlotBytes / 4
    for (int i = 0; i < policy.nvme_buffers; ++i) {
      plan.nvme_staging.push_back(PlannedBuffer{BufferRole::kHostState, -1, slot_elems, DType::kF32, MemTier::kHost,
                                                MemTag::kStaging, policy.pin_optimizer, 0});
    }
    plan.nvme_staging.push_back(PlannedBuffer{BufferRole::kHostState, -1, policy.io_staging_bytes / 4, DType::kF32,
                                              MemTier::kHost, MemTag::kStaging, false, 0});
  }
  // The parameter tier's staging: buffer_count slots of min(buffer_size, the largest sharded shard) elements,
  // each NvmeParamTier::SlotBytes (4-byte words, rounded up to 4 KiB, plus 4 KiB for the alignment), and its I/O
  // engine's blocks.
  if (policy.param_nvme) {
    const int64_t cds = static_cast<int64_t>(DTypeSize(policy.compute));
    int64_t largest = 0;
    for (size_t i = 0; i < plan.units.size(); ++i) {
      const UnitPlan& u = plan.units[i];
      if (!u.sharded_params) continue;
      largest = std::max(largest, u.shard);
      if (u.shard > policy.param_nvme_buffer_elems && plan.param_too_large < 0) {
        plan.param_too_large = static_cast<int>(i);
      }
    }
    if (largest > 0) {
      plan.param_slot_elems = std::min(largest, policy.param_nvme_buffer_elems);
      const int64_t slot_bytes = NvmeParamTier::SlotBytes(plan.param_slot_elems * cds);  // a multiple of 4
      for (int i = 0; i < policy.param_nvme_buffers; ++i) {
        plan.param_staging.push_back(PlannedBuffer{BufferRole::kParams, -1, slot_bytes / 4, DType::kF32, MemTier::kHost,
                                                   MemTag::kStaging, policy.pin_param, 0});
      }
      plan.param_staging.push_back(PlannedBuffer{BufferRole::kParams, -1, policy.param_io_staging_bytes / 4,
                                                 DType::kF32, MemTier::kHost, MemTag::kStaging, false, 0});
    }
  }
  return plan;
}

MemoryReport StagePlan::Report() const {
  MemoryReport r;
  auto count = [&r](const PlannedBuffer& b) {
    if (b.trainer_owned) return;
    MemoryUsage& m = r.usage[static_cast<size_t>(b.tier)][static_cast<size_t>(b.tag)];
    m.current += b.bytes();
    m.peak = m.current;
    r.padding_bytes += b.padding_elems * static_cast<int64_t>(DTypeSize(b.dtype));
  };
  for (const auto& u : units) {
    for (const auto& b : u.buffers) count(b);
  }
  for (const auto& b : staging) count(b);
  for (const auto& b : nvme_staging) count(b);
  for (const auto& b : param_staging) count(b);
  return r;
}

}  // namespace zero::internal

namespace zero::internal {

int64_t ChunkPerRank(int64_t padded, int world, int64_t bucket) {
  if (padded <= bucket) return 0;
  const int64_t q = kShardAlignElems;
  return std::max<int64_t>(q, bucket / world / q * q);
}

std::vector<ExactSpan> SpansIn(const std::vector<ExactSpan>& spans, int64_t a, int64_t b) {
  std::vector<ExactSpan> in;
  for (const ExactSpan& sp : spans) {
    const int64_t lo = std::max(sp.begin, a), hi = std::min(sp.end, b);
    if (lo < hi) in.push_back(ExactSpan{lo - a, hi - a});
  }
  return in;
}

namespace {

// QuantChunks over the collective's `chunk` (0: none) rounded down to a multiple of `granule` (at least one), each
// chunk's bytes bytes(n, exact) for its n elements and the most exact elements any shard has among them.
QuantChunks ChunkLayout(const UnitPlan& u, int64_t chunk, int64_t granule,
                        const std::function<int64_t(int64_t n, int64_t exact)>& bytes) {
  QuantChunks q;
  if (chunk == 0) return q;
  q.chunk = std::max(granule, chunk / granule * granule);
  q.shard = u.shard;
  q.offset.push_back(0);
  for (int64_t k = 0; q.begin(k) < u.shard; ++k) {
    const int64_t a = q.begin(k), b = a + q.elems(k);
    int64_t exact = 0;  // the most elements of [a, b) any shard sends exact
    for (const std::vector<ExactSpan>& spans : u.exact_spans) {
      int64_t n = 0;
      for (const ExactSpan& sp : SpansIn(spans, a, b)) n += sp.end - sp.begin;
      exact = std::max(exact, n);
    }
    const int64_t k_bytes = bytes(b - a, exact);
    q.largest = std::max(q.largest, k_bytes);
    q.offset.push_back(q.offset.back() + k_bytes);
    q.exact.push_back(exact);
  }
  return q;
}

}  // namespace

QuantChunks QwzChunkLayout(const PlanPolicy& p, const UnitPlan& u) {
  if (p.qwz_block <= 0 || !u.sharded_params) return {};
  const int64_t cds = static_cast<int64_t>(DTypeSize(p.compute));
  return ChunkLayout(
      u, ChunkPerRank(u.padded, p.world, p.allgather_bucket), p.qwz_block,
      [&](int64_t n, int64_t exact) { return QwzMessageBytes(n, p.qwz_block) + (exact * cds + 3) / 4 * 4; });
}

QuantChunks QgzChunkLayout(const PlanPolicy& p, const UnitPlan& u) {
  if (!QgzOn(p) || u.frozen) return {};
  // Whole blocks, and a multiple of 8 elements: the records lie back to back in the all-to-alls' buffers, and a
  // record of 8k elements (int8: 8k code bytes; int4: 4k) keeps the next one's f32 scales 4-byte aligned, as a whole
  // shard's record (a multiple of 32 elements) does. A block of 50 would otherwise leave records of 2 mod 4 bytes.
  return ChunkLayout(u, ChunkPerRank(u.padded, p.world, p.reduce_bucket), std::lcm(p.qgz_block, int64_t{8}),
                     [&](int64_t n, int64_t exact) { return QgzRecordBytes(n, p.qgz_block, p.qgz_bits) + 4 * exact; });
}

int64_t ReduceChunkPerRank(const PlanPolicy& p, int64_t padded, bool trainer_owned) {
  const int64_t bucketed = ChunkPerRank(padded, p.world, p.reduce_bucket);
  if (!trainer_owned || p.world < 2) return bucketed;
  const int64_t q = kShardAlignElems, S = padded / p.world;
  constexpr int64_t kMinStrided = 1024;  // Gloo's smallest per-rank block that it reduces where it lies
  const int64_t target =
      std::min(std::max<int64_t>(q, kTrainerReduceBucket / p.world / q * q), std::max<int64_t>(S / 8, kMinStrided));
  if (target >= S || (bucketed > 0 && bucketed <= target)) return bucketed;
  // Chunks of nearly equal size, so that the last is not a sliver, and each of at least kMinStrided elements.
  const int64_t k = std::min((S + target - 1) / target, std::max<int64_t>(1, S / kMinStrided));
  if (k < 2) return bucketed;
  return ((S + k - 1) / k + q - 1) / q * q;
}

bool EveryChunkSize(int64_t S, int64_t chunk, const std::function<bool(int64_t n)>& ok) {
  return ok(std::min(S, chunk)) && (S <= chunk || S % chunk == 0 || ok(S % chunk));
}

namespace {

// A pool of same-sized buffers keeps, per size, as many buffers as were ever in use at once, and never frees them
// (shard/internal/buffer_pool.h). With at most `window` elements in use at once, at most min(n, max(1, window / s))
// of the n units of s elements hold one: one alone may exceed the window (a demand gather, a unit larger than the
// bucket). `units` are (s, bytes of one buffer) pairs, one per unit; the bound sums over the distinct s.
int64_t PoolBound(const std::vector<std::pair<int64_t, int64_t>>& units, int64_t window) {
  std::vector<std::pair<int64_t, int64_t>> sorted = units;
  std::sort(sorted.begin(), sorted.end());
  int64_t bound = 0;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    int64_t bytes = 0;
    while (j < sorted.size() && sorted[j].first == sorted[i].first) bytes = std::max(bytes, sorted[j++].second);
    const int64_t n = static_cast<int64_t>(j - i), s = sorted[i].first;
    bound += bytes * std::min(n, std::max<int64_t>(1, s > 0 ? window / s : n));
    i = j;
  }
  return bound;
}

}  // namespace

std::array<PeakTerms, 2> TruePeakBound(const StagePlan& plan, const PeakInputs& in) {
  const PlanPolicy& p = plan.policy;
  const int N = p.world;
  const int64_t cds = static_cast<int64_t>(DTypeSize(p.compute)), ws = static_cast<int64_t>(DTypeSize(p.wire));
  std::array<PeakTerms, 2> t{};
  PeakTerms& dev = t[static_cast<size_t>(MemTier::kDevice)];
  PeakTerms& host = t[static_cast<size_t>(MemTier::kHost)];
  const MemoryReport model = plan.Report();
  for (size_t tier = 0; tier < 2; ++tier) {
    for (const MemoryUsage& m : model.usage[tier]) t[tier].model_state += m.current;
    t[tier].trainer = in.trainer_bytes[tier];
  }
  int64_t largest = 0;
  for (const UnitPlan& u : plan.units) largest = std::max(largest, u.padded);
  const int64_t open = in.open_elems > 0 ? in.open_elems : largest;

  // Stage 3's live window: at most max(open, min(max_live, open + prefetch)) elements gathered at once
  // (shard/internal/gather.h), and never more than every sharded unit.
  std::vector<std::pair<int64_t, int64_t>> sharded;
  int64_t sharded_total = 0;
  for (const UnitPlan& u : plan.units) {
    if (!u.sharded_params) continue;
    sharded.emplace_back(u.padded, u.padded * cds);
    sharded_total += u.padded;
  }
  // The gather pool keeps, per size, the most buffers of that size in use at once, and never more than the larger
  // of max_live and what is in use (shard/internal/buffer_pool.h).
  const int64_t window = std::min(sharded_total, std::max(open, std::min(p.LiveWindow(), open + p.prefetch_bucket)));
  dev.gathers = std::min(PoolBound(sharded, window), cds * std::max(p.max_live, window));

  // All-gather chunk staging, two buffers of one chunk's `world` blocks: the stage-3 gathers' and the step's
  // refresh of full parameters (stages 1-2, persistent stage-3 units) each keep their own.
  // qwZ's chunked gathers (one at a time, as every chunked gather) stage `world` messages of their largest chunk
  // instead: two buffers of each such size (one where the unit is one chunk), and one send buffer of each unit's
  // size (every chunk's message and the scratch), given back once its chunks are joined.
  bool chunked_gather = false, chunked_refresh = false;
  std::map<int64_t, int64_t> qwz_slots;  // staging bytes -> buffers of that size
  std::set<int64_t> qwz_sends;
  for (const UnitPlan& u : plan.units) {
    if (ChunkPerRank(u.padded, N, p.allgather_bucket) == 0) continue;
    if (u.sharded_params && u.qwz_chunks.chunks() > 0) {
      int64_t& slots = qwz_slots[N * u.qwz_chunks.largest];
      slots = std::max<int64_t>(slots, u.qwz_chunks.chunks() > 1 ? 2 : 1);
      qwz_sends.insert(u.qwz_chunks.total() + QwzScratchBytes(p, u));
    } else if (u.sharded_params) {
      chunked_gather = true;
    }
    if (p.stage >= 1 && !u.sharded_params && !u.frozen) chunked_refresh = true;
  }
  const int64_t ag_chunk =
      std::max<int64_t>(kShardAlignElems, p.allgather_bucket / N / kShardAlignElems * kShardAlignElems);
  dev.staging = in.ag_strided ? 0 : (chunked_gather + chunked_refresh) * 2 * N * ag_chunk * cds;
  for (const auto& [bytes, slots] : qwz_slots) dev.staging += slots * bytes;
  for (int64_t bytes : qwz_sends) dev.staging += bytes;
  // qwZ: each whole gather in flight holds its message and every rank's, (N + 1) messages of QwzUnitMessageBytes
  // (and the send buffer's scratch where the unit has exact elements), in a pool like the gathers'; within the same
  // live window.
  if (p.qwz_block > 0) {
    std::vector<std::pair<int64_t, int64_t>> messages;
    for (const UnitPlan& u : plan.units) {
      if (u.sharded_params && u.qwz_chunks.chunks() == 0) {
        messages.emplace_back(u.padded, (N + 1) * QwzUnitMessageBytes(p, u) + QwzScratchBytes(p, u));
      }
    }
    dev.staging += PoolBound(messages, window);
  }

  // Reductions. Each is issued once the ones in flight and it fit reduce_bucket_size (or it goes alone), so at
  // most q = max(reduce_bucket_size, its unit) gradient elements are in flight, the new one included, beside
  // the open backward scopes' buckets.
  std::vector<std::pair<int64_t, int64_t>> buckets, recvs, wires, fulls, qgzs;
  int64_t grad_total = 0, largest_grad = 0, full_grads = 0;
  // The chunk sizes (per rank) that some unit packs into staging: the staging pool keeps two buffers of each.
  std::vector<int64_t> packed_chunks;
  struct Shape {
    int64_t count;
    bool destructive;
  };
  std::vector<Shape> rs_shapes;
  int64_t ar_need = 0;
  const bool every_micro = p.ReduceEveryMicroStep();
  for (const UnitPlan& u : plan.units) {
    if (u.frozen) continue;
    grad_total += u.padded;
    largest_grad = std::max(largest_grad, u.padded);
    const bool bucket = p.stage >= 2 && every_micro && !u.trainer_owned;
    if (bucket) buckets.emplace_back(u.padded, u.padded * cds);
    if (p.stage >= 2 && !every_micro && !u.trainer_owned) {
      full_grads += u.padded * (cds + (p.Accumulate16() ? 4 : 0));
      fulls.emplace_back(u.padded, u.padded * cds);
    }
    // What the reduction reads (shard/grad_reducer.cc): the fp32 accumulator of 16-bit gradients where one
    // accumulates across micro-steps locally, else the compute-dtype gradient.
    const bool from_accumulator = p.Accumulate16() && !every_micro;
    const DType src = from_accumulator ? DType::kF32 : p.compute;
    const int64_t chunk = p.stage == 0 ? 0 : ReduceChunkPerRank(p, u.padded, u.trainer_owned);
    if (QgzOn(p)) {
      // qgZ (shard/qgz.cc, QgzReduce::Start): an f32 output, and the records both ways of each hop and the
      // partial sums, for the whole shard or (a unit above reduce_bucket_size) its largest chunk; no wire copy,
      // and no reduce-scatter staged by the communicator. The coding's scratch is one for all (below).
      const int64_t M = N / p.qgz_local, R = QgzPartRecordBytes(p, u), S = QgzPartElems(u);
      recvs.emplace_back(u.padded, u.shard * 4);
      qgzs.emplace_back(u.padded, 2 * N * R + (M > 1 ? 2 * M * R : 0) + M * S * 4);
      continue;
    }
    if (src != p.wire && chunk == 0) wires.emplace_back(u.padded, u.padded * ws);
    if (p.stage == 0) {
      if (in.ar_staging) ar_need = std::max(ar_need, in.ar_staging(u.padded, p.wire));
      continue;
    }
    // Where the reduced shard lands: stage 1 in the gradient's own slice unless it accumulates in an fp32 shard;
    // else the gradient shard. A separate output is needed unless the op can write it directly.
    const bool slice = p.GradInSlice(u.trainer_owned);
    const DType dep = slice ? p.compute : u.grad_shard_dtype;
    const bool adds = every_micro && p.accumulation_steps > 1;
    if (dep != p.wire || adds || u.host_n > 0) recvs.emplace_back(u.padded, u.shard * ws);
    if (chunk > 0) {
      // Chunk staging unless every chunk of the unit reads its ranges where they lie (ReduceScatterStrided). Such a
      // chunk runs (on Gloo) the input-reading instance a ReduceScatter of its size runs: a non-destructive shape.
      const auto strided = [&](int64_t n) { return src == p.wire && in.rs_strided && in.rs_strided(n, p.wire); };
      if (!EveryChunkSize(u.shard, chunk, strided)) packed_chunks.push_back(chunk);
      rs_shapes.push_back({chunk, !strided(chunk)});
      if (u.shard % chunk != 0) rs_shapes.push_back({u.shard % chunk, !strided(u.shard % chunk)});
    } else {
      rs_shapes.push_back({u.shard, src != p.wire || bucket});
    }
  }
  // Without overlap_comm a reduction is retired as soon as it is issued: besides the open scopes' buckets (the
  // closing one's among them) one reduction's output and wire copy at a time, per size.
  const int64_t q = p.overlap_comm ? std::min(grad_total, std::max(p.reduce_bucket, largest_grad)) : 0;
  // Low-communication full gradients live from a unit's first backward scope to its reduction: across
  // micro-steps all of them at once; with one micro-step only those open or in flight, as buckets.
  if (p.accumulation_steps == 1) full_grads = PoolBound(fulls, q + open);
  // The buckets alive at once: those of the open scopes and of the reductions in flight, and no more than the
  // cap allows beside the open scopes (a new bucket is taken once reductions in flight were retired to fit it).
  const int64_t bucket_window = p.bucket_cap > 0 ? std::min(q + open, std::max(p.bucket_cap, open)) : q + open;
  dev.reductions = PoolBound(buckets, bucket_window) + PoolBound(recvs, q) + PoolBound(wires, q) + PoolBound(qgzs, q) +
                   QgzScratchBytes(p, plan.units) + full_grads;
  std::sort(packed_chunks.begin(), packed_chunks.end());
  packed_chunks.erase(std::unique(packed_chunks.begin(), packed_chunks.end()), packed_chunks.end());
  for (int64_t chunk : packed_chunks) dev.reductions += 2 * N * chunk * ws;
  dev.full_grads = full_grads;

  // The communicator's staging: at most the larger of its budget and one op's need, and at most what its cache
  // can hold (four reduce-scatter instances, the largest needs, and the scratch of the largest 16-bit all-reduce).
  // (Each distinct shape is an instance of its own; shapes the communicator happens to key alike are counted twice,
  // which only loosens the bound.)
  std::sort(rs_shapes.begin(), rs_shapes.end(), [](const Shape& a, const Shape& b) {
    return std::tie(a.count, a.destructive) < std::tie(b.count, b.destructive);
  });
  rs_shapes.erase(
      std::unique(rs_shapes.begin(), rs_shapes.end(),
                  [](const Shape& a, const Shape& b) { return a.count == b.count && a.destructive == b.destructive; }),
      rs_shapes.end());
  std::vector<int64_t> needs;
  if (in.rs_staging) {
    for (const Shape& sh : rs_shapes) needs.push_back(in.rs_staging(sh.count, p.wire, sh.destructive));
  }
  std::sort(needs.begin(), needs.end(), std::greater<>());
  int64_t most = ar_need, four = ar_need;
  for (size_t i = 0; i < needs.size(); ++i) {
    most = std::max(most, needs[i]);
    if (i < 4) four += needs[i];
  }
  host.staging = std::min(std::max(in.comm_cache_bytes, most), four);
  if (in.replica_ar_staging) {
    // One all-reduce per unit and part at a time; the scratch grows to the largest and stays.
    int64_t replica = 0;
    for (const UnitPlan& u : plan.units) {
      if (u.frozen) continue;
      const int64_t hn = std::min(u.shard, u.host_n);
      replica = std::max({replica, in.replica_ar_staging(hn, u.grad_shard_dtype),
                          in.replica_ar_staging(u.shard - hn, u.grad_shard_dtype)});
    }
    host.staging += replica;
  }
  return t;
}

}  // namespace zero::internal
