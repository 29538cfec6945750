// The sharding engine: units of flat parameters, ZeRO stages 0-3, gradient reduction, the sharded step.
//
// Buffers per unit and stage (cd = compute dtype; Ψ_u = padded unit size, S = Ψ_u / N):
//   stage 0: params[Ψ_u] cd, grads[Ψ_u] cd, master[Ψ_u] f32 (mixed only), state[Ψ_u] f32 each
//   stage 1: params[Ψ_u] cd, grads[Ψ_u] cd, master[S] (mixed only), state[S]
//   stage 2: params[Ψ_u] cd, grad accumulator[S] f32, master[S] (mixed only), state[S]
//   stage 3: params[S] cd (or [Ψ_u] when persistent), grad accumulator[S] f32, master[S] (mixed), state[S]
// With fp32 compute the master IS the parameter shard (params + rank*S, or the stage-3 shard), which is what
// makes the fp32 model-state formulas 16Ψ, 8Ψ+8Ψ/N, 4Ψ+12Ψ/N, 16Ψ/N hold.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "offload/copy_stream.h"
#include "offload/host_step.h"
#include "shard/internal/compute.h"
#include "shard/internal/layout.h"
#include "zero/engine.h"
#include "zero/logging.h"
#include "zero/mixed_precision.h"

namespace zero {

namespace internal {

std::string DescribeRegistration(const std::vector<UnitLayout>& units) {
  std::string out;
  for (const auto& u : units) {
    for (const auto& p : u.params) {
      absl::StrAppend(&out, "unit ", u.name, " param ", p.spec.name, " shape [", absl::StrJoin(p.spec.shape, ","),
                      "]\n");
    }
    if (u.params.empty()) absl::StrAppend(&out, "unit ", u.name, " (no params)\n");
  }
  return out;
}

uint64_t Fnv1a64(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace internal

namespace {

using internal::ParamSlot;
using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
using internal::UnitLayout;

enum class UnitStatus { kNotAvailable, kInflight, kAvailable };

const char* StatusName(UnitStatus s) {
  switch (s) {
    case UnitStatus::kNotAvailable: return "NOT_AVAILABLE";
    case UnitStatus::kInflight: return "INFLIGHT";
    case UnitStatus::kAvailable: return "AVAILABLE";
  }
  return "?";
}

// A free list of same-sized compute-tier buffers under one tag; buffers stay allocated (and counted) while
// pooled, so the steady state allocates nothing (on a device: no cudaMalloc/cudaFree). Reuse needs no event:
// every compute-tier use of a buffer is ordered on the compute tier's one stream (shard/internal/compute.h),
// and a collective's use of it is joined into that stream before the buffer comes back here.
class BufferPool {
 public:
  BufferPool(const std::unique_ptr<internal::ComputeTier>& compute, MemTag tag) : compute_(compute), tag_(tag) {}
  Buffer Take(size_t bytes, bool zero) {
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      Buffer b = std::move(it->second);
      free_.erase(it);
      if (zero) compute_->Zero(b.data(), bytes);
      return b;
    }
    return compute_->Alloc(tag_, bytes);  // zero-filled
  }
  void Give(Buffer b) {
    if (!b.empty()) free_.emplace(b.size(), std::move(b));
  }
  bool Has(size_t bytes) const { return free_.count(bytes) > 0; }

 private:
  const std::unique_ptr<internal::ComputeTier>& compute_;
  MemTag tag_;
  std::multimap<size_t, Buffer> free_;
};

}  // namespace

struct UnitRuntime {
  UnitLayout layout;
  std::vector<ParamSpec> specs;  // registration order
  bool persistent = false;  // stage 3: kept gathered (small units)
  Buffer params;            // compute dtype: full (stages 0-2, persistent) or shard (stage 3)
  Buffer full_grads;        // compute dtype, full: stages 0-1 always; stages 2-3 low-communication mode
  Buffer grad_shard;        // stages 2-3 (and stage 1 when accumulating 16-bit grads): the reduced shard
  DType grad_shard_dtype = DType::kF32;
  Buffer accum_full;        // f32, full: 16-bit grads accumulated over micro-steps before one reduction
  Buffer master;            // f32 master weights, mixed precision only (full at stage 0, else the shard)
  std::vector<Buffer> state;
  // Optimizer offload: elements [0, host_n) of this rank's shard are updated on the host from host-tier
  // buffers; grad_shard/master/state above then hold only the device part [host_n, shard) (Twin-Flow when
  // 0 < host_n < shard). host_n is 0 without offload.
  int64_t host_n = 0;
  Buffer host_grad;    // the reduced gradient of [0, host_n) (grad_shard_dtype), landed by the copy stream
  Buffer host_master;  // fp32 master of [0, host_n) (absent when the host parameter shard is itself the master)
  std::vector<Buffer> host_state;
  // State machine.
  UnitStatus status = UnitStatus::kNotAvailable;
  Buffer gather;  // stage 3: the full parameters while INFLIGHT/AVAILABLE
  Buffer stage_in;  // CUDA engine with offload_param: the host shard copied to the device for its gather
  Work gather_work;
  bool scope_open = false;
  bool scope_backward = false;
  Buffer bucket;  // the full gradient buffer of an open backward scope (stages 2-3, low-memory mode)
  int backward_count = 0;

  bool sharded_params(int stage) const { return stage == 3 && !persistent; }
};

class Engine::Impl {
 public:
  Impl(const Config& cfg, std::shared_ptr<Communicator> comm, EngineOptions opts)
      : cfg_(cfg),
        comm_(std::move(comm)),
        opts_(std::move(opts)),
        stage_(cfg.zero.stage),
        rank_(comm_->rank()),
        world_(comm_->world_size()),
        compute_(internal::MakeGlooEngineCompute(&tracker_)),
        gather_pool_(compute_, MemTag::kGather),
        bucket_pool_(compute_, MemTag::kBuckets),
        wire_pool_(compute_, MemTag::kBuckets) {}

  // The tier the trainer computes in (reported as "device"): the GPU's memory on the NCCL engine; on the Gloo
  // engine host DRAM, so the report separates it from what offload moves to the host tier.
  Buffer Compute(MemTag tag, size_t bytes) { return compute_->Alloc(tag, bytes); }
  CUstream_st* stream() const { return compute_->stream(); }
  Buffer HostTier(MemTag tag, size_t bytes, bool pinned) {
    return pinned ? Buffer::Pinned(&tracker_, tag, bytes) : Buffer::Host(&tracker_, tag, bytes);
  }

  Status Init() {
    if (cfg_.fp16.enabled) {
      cd_ = DType::kF16;
    } else if (cfg_.bf16.enabled) {
      cd_ = DType::kBF16;
    }
    comm_dtype_ = DType::kF32;
    if (cfg_.communication_data_type.has_value()) {
      ZERO_ASSIGN_OR_RETURN(comm_dtype_, ParseDType(*cfg_.communication_data_type));
      if (comm_dtype_ != DType::kF32 && comm_dtype_ != cd_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "communication_data_type: \"", *cfg_.communication_data_type, "\" must be fp32 or the compute dtype (",
            std::string(DTypeName(cd_)), ")"));
      }
    }
    scaler_ = LossScaler::FromConfig(cfg_.fp16);
    if (cfg_.zero.offload_optimizer.device == OffloadDevice::kNvme ||
        cfg_.zero.offload_param.device == OffloadDevice::kNvme) {
      return absl::UnimplementedError("zero_optimization.offload_*.device \"nvme\": not implemented in zero");
    }
    off_opt_ = cfg_.zero.offload_optimizer.device == OffloadDevice::kCpu && stage_ >= 1;
    off_param_ = cfg_.zero.offload_param.device == OffloadDevice::kCpu && stage_ == 3;
    if (off_param_ && off_opt_ && cfg_.zero.offload_optimizer.ratio < 1.0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "zero_optimization.offload_optimizer.ratio: ", cfg_.zero.offload_optimizer.ratio,
          " with offload_param.device \"cpu\": the device part of a Twin-Flow step updates parameters in device "
          "memory, but offload_param keeps them on the host; use ratio 1 or offload_param.device \"none\""));
    }
    if (off_opt_ || off_param_) {
      ZERO_LOG_ONCE(INFO) << "offload to cpu on the host (Gloo) engine: the compute tier is host memory too, so "
                             "the copy stream's copies are memcpys; the tiers are kept and reported apart";
    }
    ga_ = cfg_.accumulation_steps();
    if (comm_->backend() == Backend::kNccl) ZERO_RETURN_IF_ERROR(InitDevice());
    if (opts_.optimizer) {
      optimizer_ = opts_.optimizer;
    } else if (cfg_.optimizer.has_value()) {
      ZERO_ASSIGN_OR_RETURN(auto opt, MakeOptimizer(*cfg_.optimizer));
      optimizer_ = std::move(opt);
    } else {
      return absl::InvalidArgumentError(
          "optimizer: the config has no \"optimizer\" section and EngineOptions::optimizer is null; give one");
    }
    const double base_lr = cfg_.optimizer.has_value() ? cfg_.optimizer->lr : 1e-3;
    ZERO_ASSIGN_OR_RETURN(scheduler_, MakeLrScheduler(cfg_.scheduler, base_lr));
    int local = opts_.local_world_size > 0 ? opts_.local_world_size : 1;
    threads_ = opts_.cpu_threads > 0
                   ? opts_.cpu_threads
                   : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local);
    SetLogRank(rank_);
    if (compute_->device() && BuiltinAdamParams(*optimizer_) == nullptr && BuiltinSgdParams(*optimizer_) == nullptr) {
      return absl::UnimplementedError(absl::StrCat(
          "EngineOptions::optimizer \"", optimizer_->Name(), "\" with an NCCL communicator: a trainer's own "
          "ElementwiseOptimizer updates host memory; the CUDA engine runs the built-in Adam/AdamW/SGD (give the "
          "config's \"optimizer\" section instead)"));
    }
    return absl::OkStatus();
  }

  // The CUDA engine: an NCCL communicator computes in device memory on the trainer's stream.
  Status InitDevice() {
    int device = opts_.cuda_device;
    const int comm_device = comm_->cuda_device();
    if (device < 0) {
      device = comm_device;
    } else if (comm_device >= 0 && device != comm_device) {
      return absl::InvalidArgumentError(absl::StrCat("EngineOptions::cuda_device ", device,
                                                     " differs from the NCCL communicator's device ", comm_device));
    }
    ZERO_ASSIGN_OR_RETURN(compute_, internal::MakeCudaCompute(&tracker_, device, opts_.cuda_stream));
    return absl::OkStatus();
  }

  // ---- registration ----

  StatusOr<UnitId> AddUnit(const std::string& name, std::vector<ParamSpec> params) {
    if (finalized_) {
      return absl::FailedPreconditionError(absl::StrCat("AddUnit(\"", name, "\"): the engine is already finalized"));
    }
    if (name.empty()) return absl::InvalidArgumentError("AddUnit: unit name is empty");
    if (FindUnit(name) >= 0) return absl::InvalidArgumentError(absl::StrCat("AddUnit: unit \"", name, "\" exists"));
    UnitRuntime u;
    u.layout.name = name;
    int64_t offset = 0;
    for (auto& p : params) {
      if (p.name.empty()) return absl::InvalidArgumentError(absl::StrCat("unit ", name, ": a parameter has no name"));
      if (u.layout.index.count(p.name)) {
        return absl::InvalidArgumentError(absl::StrCat("unit ", name, ": parameter \"", p.name, "\" registered twice"));
      }
      for (int64_t d : p.shape) {
        if (d <= 0) {
          return absl::InvalidArgumentError(absl::StrCat("unit ", name, " param ", p.name, ": shape [",
                                                         absl::StrJoin(p.shape, ","), "] has a non-positive dim"));
        }
      }
      ParamSlot slot{p, offset, p.numel()};
      offset += slot.numel;
      u.layout.index[p.name] = static_cast<int>(u.layout.params.size());
      u.layout.params.push_back(std::move(slot));
    }
    u.layout.numel = offset;
    u.specs = std::move(params);
    units_.push_back(std::move(u));
    return static_cast<UnitId>(units_.size() - 1);
  }

  UnitId FindUnit(const std::string& name) const {
    for (size_t i = 0; i < units_.size(); ++i) {
      if (units_[i].layout.name == name) return static_cast<UnitId>(i);
    }
    return -1;
  }

  // Collectives over small host arrays (registration check, the norm, GatherParam). The NCCL communicator
  // reads device memory only, so on the CUDA engine they go through compute-tier copies; both wait.
  Status HostAllGather(const float* send, float* recv, size_t n) {
    if (!compute_->device()) return comm_->AllGather(send, recv, n, DType::kF32).Wait();
    Buffer ds = compute_->Alloc(MemTag::kStaging, n * 4), dr = compute_->Alloc(MemTag::kStaging, n * world_ * 4);
    ZERO_RETURN_IF_ERROR(compute_->status());
    compute_->CopyFromHostSync(ds.data(), send, n * 4);
    ZERO_RETURN_IF_ERROR(comm_->AllGather(ds.data(), dr.data(), n, DType::kF32, stream()).Wait());
    compute_->CopyToHostSync(recv, dr.data(), n * world_ * 4);
    return compute_->status();
  }
  // Every step (the norm): the device scratch is kept, so the steady state allocates nothing.
  Status HostAllReduceSum(float* buf, size_t n) {
    if (!compute_->device()) return comm_->AllReduce(buf, n, DType::kF32, ReduceOp::kSum).Wait();
    if (reduce_scratch_.size() < n * 4) reduce_scratch_ = compute_->Alloc(MemTag::kStaging, n * 4);
    ZERO_RETURN_IF_ERROR(compute_->status());
    compute_->CopyFromHostSync(reduce_scratch_.data(), buf, n * 4);
    ZERO_RETURN_IF_ERROR(comm_->AllReduce(reduce_scratch_.data(), n, DType::kF32, ReduceOp::kSum, stream()).Wait());
    compute_->CopyToHostSync(buf, reduce_scratch_.data(), n * 4);
    return compute_->status();
  }
  // Writes n fp32 host values as `dtype` at `dst`, inside buffer `in` (compute or host tier).
  void ToCompute(const float* values, const Buffer& in, void* dst, DType dtype, int64_t n) {
    if (n <= 0) return;
    if (!compute_->device() || in.tier() == MemTier::kHost) {
      ConvertBuffer(values, DType::kF32, dst, dtype, n);
      return;
    }
    std::vector<unsigned char> tmp(n * DTypeSize(dtype));
    ConvertBuffer(values, DType::kF32, tmp.data(), dtype, n);
    compute_->CopyFromHostSync(dst, tmp.data(), tmp.size());
  }

  // AllGather of arbitrary bytes through f32 slots (all-gather is a copy, so any bit pattern survives).
  StatusOr<std::vector<std::string>> AllGatherStrings(const std::string& mine) {
    std::vector<float> len_send(1), len_recv(world_);
    uint32_t len = static_cast<uint32_t>(mine.size());
    std::memcpy(len_send.data(), &len, 4);
    ZERO_RETURN_IF_ERROR(HostAllGather(len_send.data(), len_recv.data(), 1));
    uint32_t max_len = 0;
    std::vector<uint32_t> lens(world_);
    for (int r = 0; r < world_; ++r) {
      std::memcpy(&lens[r], &len_recv[r], 4);
      max_len = std::max(max_len, lens[r]);
    }
    const size_t slots = (max_len + 3) / 4;
    std::vector<float> send(slots), recv(slots * world_);
    std::memcpy(send.data(), mine.data(), mine.size());
    if (slots > 0) ZERO_RETURN_IF_ERROR(HostAllGather(send.data(), recv.data(), slots));
    std::vector<std::string> out(world_);
    for (int r = 0; r < world_; ++r) {
      out[r].assign(reinterpret_cast<const char*>(recv.data() + r * slots), lens[r]);
    }
    return out;
  }

  Status CheckRegistrationAgrees() {
    std::vector<UnitLayout> layouts;
    for (auto& u : units_) layouts.push_back(u.layout);
    const std::string desc = internal::DescribeRegistration(layouts);
    const uint64_t h = internal::Fnv1a64(desc);
    std::vector<float> send(2), recv(2 * world_);
    std::memcpy(send.data(), &h, 8);
    ZERO_RETURN_IF_ERROR(HostAllGather(send.data(), recv.data(), 2));
    bool all_same = true;
    for (int r = 0; r < world_; ++r) {
      uint64_t hr;
      std::memcpy(&hr, recv.data() + 2 * r, 8);
      all_same &= hr == h;
    }
    if (all_same) return absl::OkStatus();
    // Name the first difference against rank 0's registration.
    ZERO_ASSIGN_OR_RETURN(auto all, AllGatherStrings(desc));
    for (int r = 1; r < world_; ++r) {
      if (all[r] == all[0]) continue;
      std::vector<std::string> a = absl::StrSplit(all[0], '\n'), b = absl::StrSplit(all[r], '\n');
      size_t i = 0;
      while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
      const std::string a_line = i < a.size() && !a[i].empty() ? a[i] : "(nothing)";
      const std::string b_line = i < b.size() && !b[i].empty() ? b[i] : "(nothing)";
      return absl::InvalidArgumentError(absl::StrCat("Finalize: ranks registered different units: rank 0 has \"",
                                                     a_line, "\" where rank ", r, " has \"", b_line, "\""));
    }
    return absl::InternalError("Finalize: registration hashes differ but descriptions agree");
  }

  Status Finalize(const ParamInit& init) {
    if (finalized_) return absl::FailedPreconditionError("Finalize: already finalized");
    if (units_.empty()) return absl::FailedPreconditionError("Finalize: no units registered");
    ZERO_RETURN_IF_ERROR(CheckRegistrationAgrees());
    const size_t cds = DTypeSize(cd_);
    int64_t persistent_total = 0;
    for (auto& u : units_) {
      auto& L = u.layout;
      L.padded = internal::PaddedNumel(L.numel, world_);
      L.shard = L.padded / world_;
      num_params_ += L.numel;
      if (stage_ == 3 && L.numel < cfg_.zero.stage3_param_persistence_threshold &&
          persistent_total + L.numel <= cfg_.zero.stage3_model_persistence_threshold) {
        u.persistent = true;
        persistent_total += L.numel;
      }
      const int64_t pad_full = L.padded - L.numel;
      const int64_t pad_shard = L.shard - L.OwnedElems(rank_);
      // Optimizer offload splits this rank's range into a host part [0, host_n) and a device part; the padding
      // sits at the end of the shard, so each part's share of it is what lies past the owned elements.
      u.host_n = HostElems(L.shard);
      const int64_t range = stage_ == 0 ? L.padded : L.shard;
      const int64_t n_dev = range - u.host_n;
      const int64_t pad_range = stage_ == 0 ? pad_full : pad_shard;
      const int64_t pad_host = std::max<int64_t>(0, u.host_n - L.OwnedElems(rank_));
      const int64_t pad_dev = pad_range - pad_host;
      const bool pin_opt = cfg_.zero.offload_optimizer.pin_memory;
      // Parameters.
      if (u.sharded_params(stage_)) {
        u.params = off_param_ ? HostTier(MemTag::kParams, L.shard * cds, cfg_.zero.offload_param.pin_memory)
                              : Compute(MemTag::kParams, L.shard * cds);
        tracker_.AddPadding(pad_shard * cds);
      } else {
        u.params = Compute(MemTag::kParams, L.padded * cds);
        tracker_.AddPadding(pad_full * cds);
      }
      // Gradients (see the file comment): the trainer-visible buffer and, where needed, the reduced shard.
      if (stage_ <= 1) {
        u.full_grads = Compute(MemTag::kGrads, L.padded * cds);
        tracker_.AddPadding(pad_full * cds);
      }
      if (Accumulate16()) {
        if (stage_ == 0) {
          u.accum_full = Compute(MemTag::kGrads, L.padded * 4);
          tracker_.AddPadding(pad_full * 4);
        }
      }
      u.grad_shard_dtype = (cd_ == DType::kF32 || ga_ > 1) ? DType::kF32 : cd_;
      const size_t gsz = DTypeSize(u.grad_shard_dtype);
      if ((stage_ >= 2 || (stage_ == 1 && Accumulate16())) && n_dev > 0) {
        u.grad_shard = Compute(MemTag::kGrads, n_dev * gsz);
        tracker_.AddPadding(pad_dev * gsz);
      }
      if (u.host_n > 0) {
        u.host_grad = HostTier(MemTag::kGrads, u.host_n * gsz, pin_opt);
        tracker_.AddPadding(pad_host * gsz);
        // The host master: fp32 values of the host part, unless the host parameter shard already is them.
        if (!MasterIsHostParams()) {
          u.host_master = HostTier(MemTag::kMaster, u.host_n * 4, pin_opt);
          tracker_.AddPadding(pad_host * 4);
        }
      }
      if (mixed() && n_dev > 0) {
        u.master = Compute(MemTag::kMaster, n_dev * 4);
        tracker_.AddPadding(pad_dev * 4);
      }
      // Optimizer state.
      for (size_t s = 0; s < optimizer_->StateNames().size(); ++s) {
        u.state.push_back(n_dev > 0 ? Compute(MemTag::kOptimizer, n_dev * 4) : Buffer());
        if (n_dev > 0) tracker_.AddPadding(pad_dev * 4);
        if (u.host_n > 0) {
          u.host_state.push_back(HostTier(MemTag::kOptimizer, u.host_n * 4, pin_opt));
          tracker_.AddPadding(pad_host * 4);
        }
      }
      u.status = u.sharded_params(stage_) ? UnitStatus::kNotAvailable : UnitStatus::kAvailable;
    }
    // Double-buffered staging for the host step's copy-back: tiles of min(sub_group_size, 1 M) elements, no
    // larger than the largest host part.
    int64_t max_host = 0;
    for (const auto& u : units_) max_host = std::max(max_host, u.host_n);
    if (max_host > 0 && !off_param_) {
      pipeline_tile_ = static_cast<size_t>(
          std::min<int64_t>({std::max<int64_t>(cfg_.zero.sub_group_size, 1), int64_t{1} << 20, max_host}));
      for (auto& b : opt_staging_.buffers) {
        b = HostTier(MemTag::kStaging, pipeline_tile_ * cds, cfg_.zero.offload_optimizer.pin_memory);
      }
    }
    ZERO_RETURN_IF_ERROR(compute_->status());
    finalized_ = true;
    last_step_end_ = Clock::now();
    // Initial values: every rank evaluates each parameter in full and keeps its part.
    for (size_t ui = 0; ui < units_.size(); ++ui) {
      for (const auto& slot : units_[ui].layout.params) {
        std::vector<float> values(slot.numel);
        if (init) init(units_[ui].layout.name, slot.spec, values.data());
        ZERO_RETURN_IF_ERROR(CopyIn(static_cast<UnitId>(ui), slot.spec.name, values.data()));
      }
    }
    return absl::OkStatus();
  }

  Status CopyIn(UnitId id, const std::string& name, const float* values) {
    ZERO_RETURN_IF_ERROR(CheckUnit(id, "CopyIn"));
    UnitRuntime& u = units_[id];
    auto it = u.layout.index.find(name);
    if (it == u.layout.index.end()) {
      return absl::InvalidArgumentError(absl::StrCat("CopyIn: unit ", u.layout.name, " has no parameter \"", name, "\""));
    }
    const ParamSlot& slot = u.layout.params[it->second];
    const size_t cds = DTypeSize(cd_);
    if (!u.sharded_params(stage_)) {
      ToCompute(values, u.params, static_cast<char*>(u.params.data()) + slot.offset * cds, cd_, slot.numel);
    }
    // The part of [offset, offset+numel) in this rank's shard: the stage-3 parameter shard and the master shard.
    const int64_t s_begin = static_cast<int64_t>(rank_) * u.layout.shard, s_end = s_begin + u.layout.shard;
    const int64_t lo = std::max(s_begin, slot.offset), hi = std::min(s_end, slot.offset + slot.numel);
    if (u.sharded_params(stage_) && lo < hi) {
      ToCompute(values + (lo - slot.offset), u.params, static_cast<char*>(u.params.data()) + (lo - s_begin) * cds, cd_,
                hi - lo);
    }
    // The master keeps the exact fp32 values, not the rounded 16-bit copy.
    if (stage_ == 0) {
      if (mixed()) ToCompute(values, u.master, u.master.as<float>() + slot.offset, DType::kF32, slot.numel);
    } else if (lo < hi) {
      const float* v = values + (lo - slot.offset);
      const int64_t i0 = lo - s_begin, i1 = hi - s_begin;  // range within this rank's shard
      const int64_t h_end = std::min(i1, u.host_n);          // host part [0, host_n)
      if (!u.host_master.empty() && i0 < h_end) std::memcpy(u.host_master.as<float>() + i0, v, (h_end - i0) * 4);
      const int64_t d_begin = std::max(i0, u.host_n);        // device part [host_n, shard)
      if (mixed() && d_begin < i1) {
        ToCompute(v + (d_begin - i0), u.master, u.master.as<float>() + (d_begin - u.host_n), DType::kF32, i1 - d_begin);
      }
    }
    return compute_->status();
  }

  // ---- scopes, gathers, prefetch ----

  Status CheckUnit(UnitId id, const char* what) const {
    if (!finalized_) return absl::FailedPreconditionError(absl::StrCat(what, ": call Finalize first"));
    if (id < 0 || id >= static_cast<int>(units_.size())) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": no unit with id ", id));
    }
    return absl::OkStatus();
  }

  Status TakeDeferredError() {
    Status s = deferred_;
    deferred_ = absl::OkStatus();
    return s.ok() ? compute_->status() : s;  // compute-tier failures are sticky (a CUDA error is not cleared)
  }

  void UpdateLive(int64_t delta) {
    live_elems_ += delta;
    peak_live_ = std::max(peak_live_, live_elems_);
  }

  // Issues the all-gather of a sharded unit into a pooled full buffer (NOT_AVAILABLE -> INFLIGHT).
  // A failed compute-tier allocation (a device out of memory) is returned before any collective gets a null
  // buffer: an NCCL error would abort the communicator for every rank.
  Status AllocStatus(const Buffer& b, size_t bytes, const char* what, const UnitRuntime& u) {
    if (!b.empty() || bytes == 0) return absl::OkStatus();
    Status s = compute_->status();
    return absl::ResourceExhaustedError(absl::StrCat(what, " of unit ", u.layout.name, " (", bytes,
                                                     " bytes): ", s.ok() ? "allocation failed" : s.message()));
  }

  Status IssueGather(UnitRuntime& u) {
    ZERO_CHECK(u.status == UnitStatus::kNotAvailable) << "unit " << u.layout.name;
    const size_t cds = DTypeSize(cd_);
    u.gather = gather_pool_.Take(u.layout.padded * cds, /*zero=*/false);
    ZERO_RETURN_IF_ERROR(AllocStatus(u.gather, u.layout.padded * cds, "gather buffer", u));
    // With offload_param the shard is in the host tier and the all-gather reads it from there: on the host
    // engine the transport reads host memory directly, so staging the shard into the compute tier is part of
    // the (prefetched, asynchronous) gather. NCCL reads device memory: the CUDA engine first copies the shard
    // H2D on the compute stream, which the all-gather then waits for (its producer stream).
    const void* send = u.params.data();
    if (compute_->device() && u.params.tier() == MemTier::kHost) {
      u.stage_in = stage_pool_.Take(u.params.size(), /*zero=*/false);
      if (Status s = AllocStatus(u.stage_in, u.params.size(), "parameter stage-in buffer", u); !s.ok()) {
        gather_pool_.Give(std::move(u.gather));
        return s;
      }
      compute_->CopyFromHost(u.stage_in.data(), send, u.params.size());
      send = u.stage_in.data();
    }
    u.gather_work = comm_->AllGather(send, u.gather.data(), u.layout.shard, cd_, stream());
    u.status = UnitStatus::kInflight;
    UpdateLive(u.layout.padded);
    return absl::OkStatus();
  }

  Status WaitGather(UnitRuntime& u) {
    ZERO_CHECK(u.status == UnitStatus::kInflight);
    const auto t0 = Clock::now();
    Status s = compute_->Join(u.gather_work);  // the host waits; a device stream-waits
    times_.gather_wait_ms += MsSince(t0);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("gathering unit ", u.layout.name, ": ", s.message()));
    }
    stage_pool_.Give(std::move(u.stage_in));  // the gather is joined into the compute stream
    u.status = UnitStatus::kAvailable;
    return absl::OkStatus();
  }

  void ReleaseGather(UnitRuntime& u) {
    ZERO_CHECK(u.status != UnitStatus::kNotAvailable);
    bool failed = false;
    if (u.status == UnitStatus::kInflight) {
      Status s = compute_->Join(u.gather_work);  // never reuse a buffer an op is still writing
      failed = !s.ok();
      if (failed && deferred_.ok()) deferred_ = s;
    }
    if (failed && !u.gather_work.IsCompleted()) {
      Quarantine(std::move(u.gather));  // the wait failed: the all-gather may still write into it
      Quarantine(std::move(u.stage_in));
    }
    stage_pool_.Give(std::move(u.stage_in));
    gather_pool_.Give(std::move(u.gather));
    u.status = UnitStatus::kNotAvailable;
    UpdateLive(-u.layout.padded);
  }

  void Prefetch() {
    int64_t inflight = 0;
    for (const auto& u : units_) {
      if (u.status == UnitStatus::kInflight) inflight += u.layout.padded;
    }
    for (size_t j = order_pos_; j < order_.size(); ++j) {
      UnitRuntime& v = units_[order_[j]];
      if (v.status != UnitStatus::kNotAvailable) continue;
      if (inflight + v.layout.padded > cfg_.zero.stage3_prefetch_bucket_size) break;
      if (live_elems_ + v.layout.padded > cfg_.zero.stage3_max_live_parameters) break;
      if (Status s = IssueGather(v); !s.ok()) {  // reported by the next call; prefetch stops here
        if (deferred_.ok()) deferred_ = s;
        break;
      }
      inflight += v.layout.padded;
      ++prefetch_gathers_;
    }
  }

  StatusOr<UnitScope> Open(Engine* engine, UnitId id, bool backward) {
    ZERO_RETURN_IF_ERROR(CheckUnit(id, backward ? "Backward" : "Forward"));
    ZERO_RETURN_IF_ERROR(TakeDeferredError());
    UnitRuntime& u = units_[id];
    if (u.scope_open) {
      return absl::FailedPreconditionError(absl::StrCat(
          backward ? "Backward" : "Forward", "(", u.layout.name, "): unit ", u.layout.name, " is already open in a ",
          u.scope_backward ? "backward" : "forward", " scope (gathering twice); close that scope first"));
    }
    if (backward && u.backward_count >= ga_) {
      return absl::FailedPreconditionError(absl::StrCat("Backward(", u.layout.name, "): the unit already ran ",
                                                        u.backward_count, " backward passes and gradient_accumulation_steps is ",
                                                        ga_, "; call Step()"));
    }
    if (u.sharded_params(stage_)) {
      // Recorded order: this step's sequence; prefetch only while the step follows the recorded one.
      if (order_valid_ && !order_broken_) {
        if (order_pos_ < order_.size() && order_[order_pos_] == id) {
          ++order_pos_;
        } else {
          order_broken_ = true;
          ZERO_LOG_ONCE(WARNING) << "unit gather order changed at step " << applied_steps_ << " (expected "
                                 << (order_pos_ < order_.size() ? units_[order_[order_pos_]].layout.name : "<end>")
                                 << ", got " << u.layout.name
                                 << "); prefetch pauses and the order is re-recorded this step";
        }
      }
      this_step_order_.push_back(id);
      if (u.status == UnitStatus::kNotAvailable) {
        ZERO_RETURN_IF_ERROR(IssueGather(u));
        ++demand_gathers_;
      }
      ZERO_RETURN_IF_ERROR(WaitGather(u));
      if (order_valid_ && !order_broken_) Prefetch();
    }
    u.scope_open = true;
    u.scope_backward = backward;
    if (backward) {
      // A reduction of this unit's previous micro-step may still read its gradient buffer.
      ZERO_RETURN_IF_ERROR(RetireUnit(id));
      ++u.backward_count;
      ZERO_RETURN_IF_ERROR(PrepareGradBuffer(u));
    }
    return UnitScope(engine, id, backward);
  }

  bool mixed() const { return cd_ != DType::kF32; }
  // Elements of a shard of S updated on the host: all of it with offload_optimizer, ratio * S rounded down to
  // whole 32-element blocks with Twin-Flow (ratio < 1, stage 3), none without offload.
  int64_t HostElems(int64_t S) const {
    if (!off_opt_) return 0;
    const double r = cfg_.zero.offload_optimizer.ratio;
    if (r >= 1.0) return S;
    const int64_t q = internal::kShardAlignElems;
    return static_cast<int64_t>(r * static_cast<double>(S)) / q * q;
  }
  // fp32 training with the parameter shards on the host: those shards are the master weights (as the
  // parameters are without offload), so no separate host master is kept.
  bool MasterIsHostParams() const { return off_param_ && !mixed(); }
  // 16-bit gradients accumulated over several micro-steps go through an fp32 accumulator, never a 16-bit sum.
  bool Accumulate16() const { return mixed() && ga_ > 1; }

  // Whether a unit's gradient is reduce-scattered after every micro-step into the sharded accumulator (low
  // memory) rather than accumulated in full locally and reduced once after the last micro-step (low
  // communication, FSDP's no_sync). Stage 0 always accumulates locally; stage 1 does too unless it accumulates
  // 16-bit gradients (then an fp32 shard accumulator beats an fp32 copy of the full gradient).
  bool ReduceEveryMicroStep() const {
    if (stage_ == 0) return false;
    if (stage_ == 1) return Accumulate16();
    return cfg_.gradient_accumulation_mode == GradAccumulationMode::kLowMemory;
  }

  Status PrepareGradBuffer(UnitRuntime& u) {
    const size_t bytes = u.layout.padded * DTypeSize(cd_);
    if (stage_ <= 1) return absl::OkStatus();  // persistent full_grads, zeroed at Step
    if (ReduceEveryMicroStep()) {
      u.bucket = bucket_pool_.Take(bytes, /*zero=*/true);
      return AllocStatus(u.bucket, bytes, "gradient bucket", u);
    }
    if (u.full_grads.empty()) {
      u.full_grads = TakeFull(bytes);  // low-communication: lives until reduced
      return AllocStatus(u.full_grads, bytes, "full gradient", u);
    }
    return absl::OkStatus();
  }

  // Full gradients that live only until reduced (low-communication mode, the fp32 accumulator of stages 2-3):
  // freed on the host, so the report shows them gone; pooled on a device, where freeing would synchronize it.
  Buffer TakeFull(size_t bytes) {
    return compute_->device() ? full_pool_.Take(bytes, /*zero=*/true) : Compute(MemTag::kGrads, bytes);
  }
  void FreeFull(Buffer& b) {
    if (compute_->device()) {
      full_pool_.Give(std::move(b));
    } else {
      b.Reset();
    }
  }

  void* GradBase(const UnitRuntime& u) const {
    if (!u.bucket.empty()) return u.bucket.data();
    return u.full_grads.data();
  }
  void* ParamBase(const UnitRuntime& u) const {
    return u.sharded_params(stage_) ? u.gather.data() : u.params.data();
  }

  Status Close(UnitId id, bool backward) {
    UnitRuntime& u = units_[id];
    ZERO_CHECK(u.scope_open && u.scope_backward == backward) << "unit " << u.layout.name;
    u.scope_open = false;
    Status s;
    if (backward) s = ReduceUnit(u);
    if (u.sharded_params(stage_)) ReleaseGather(u);
    // Retire the reductions that have finished meanwhile (never blocking): their buckets go back to the pool
    // and, with offload, their shards start streaming to the host while backward goes on.
    if (s.ok()) s = RetireCompleted();
    return s;
  }

  // ---- gradient reduction ----

  // Where a reduced gradient lands: stored (converted to `dtype`) or added to what is there.
  struct Deposit {
    void* ptr = nullptr;
    DType dtype = DType::kF32;
    bool add = false;
  };

  struct PendingReduce {
    UnitId unit = -1;
    Work work;
    Buffer bucket;        // the trainer's gradient bucket (stages 2-3), returned to the pool when done
    Buffer staging;       // the input converted to the wire dtype
    Buffer recv;          // reduce-scatter output before it is deposited
    const void* result = nullptr;  // what to deposit (nullptr: the op wrote the deposit directly)
    DType result_dtype = DType::kF32;
    int64_t result_elems = 0;
    Deposit dep;
    void* zero_after = nullptr;  // a buffer the op reads that must be zeroed once it is done
    size_t zero_bytes = 0;
    bool free_full_after = false;  // low-communication mode: the full gradient lived only until reduced
    int64_t elems = 0;
  };

  // Issues the reduction of `src` (the unit's full padded gradient, `src_dtype`): an average all-reduce whose
  // result is deposited in full, or an average reduce-scatter whose shard is deposited. The wire dtype is
  // communication_data_type (fp32 unless set), so 16-bit gradients are widened once before the reduction.
  Status IssueReduce(UnitRuntime& u, void* src, DType src_dtype, bool allreduce, Deposit dep, PendingReduce p) {
    ReleaseHeld();
    const int64_t n = u.layout.padded, S = u.layout.shard;
    p.unit = static_cast<UnitId>(&u - units_.data());
    p.dep = dep;
    p.elems = n;
    void* send = src;
    if (src_dtype != comm_dtype_) {
      p.staging = wire_pool_.Take(n * DTypeSize(comm_dtype_), false);
      ZERO_RETURN_IF_ERROR(AllocStatus(p.staging, n * DTypeSize(comm_dtype_), "wire-dtype copy of the gradient", u));
      compute_->Convert(src, src_dtype, p.staging.data(), comm_dtype_, n);
      send = p.staging.data();
      if (p.zero_after == src) {  // the op reads the staging copy: the source can be reused at once
        compute_->Zero(p.zero_after, p.zero_bytes);
        p.zero_after = nullptr;
      }
    }
    if (allreduce) {
      p.work = comm_->AllReduce(send, n, comm_dtype_, ReduceOp::kAvg, stream());
      p.result = send == dep.ptr ? nullptr : send;
      p.result_elems = n;
    } else {
      void* recv;
      if (dep.dtype == comm_dtype_ && !dep.add && u.host_n == 0) {
        recv = dep.ptr;
        p.result = nullptr;
      } else {
        ReclaimHeld(S * DTypeSize(comm_dtype_));
        p.recv = bucket_pool_.Take(S * DTypeSize(comm_dtype_), false);
        ZERO_RETURN_IF_ERROR(AllocStatus(p.recv, S * DTypeSize(comm_dtype_), "reduce-scatter output", u));
        recv = p.recv.data();
        p.result = recv;
      }
      p.result_elems = S;
      // A pooled bucket or staging copy is scratch: let the backend reduce in it instead of copying it first.
      const bool scratch = !p.staging.empty() || (!p.bucket.empty() && send == p.bucket.data());
      p.work = scratch ? comm_->ReduceScatterDestructive(send, recv, S, comm_dtype_, ReduceOp::kAvg, stream())
                       : comm_->ReduceScatter(send, recv, S, comm_dtype_, ReduceOp::kAvg, stream());
    }
    p.result_dtype = comm_dtype_;
    // Bound the gradient bytes in flight by reduce_bucket_size (elements), then queue.
    while (!pending_.empty() && pending_elems_ + p.elems > cfg_.zero.reduce_bucket_size) {
      ZERO_RETURN_IF_ERROR(RetireOldest());
    }
    pending_elems_ += p.elems;
    pending_.push_back(std::move(p));
    if (!cfg_.zero.overlap_comm) {
      while (!pending_.empty()) ZERO_RETURN_IF_ERROR(RetireOldest());
    }
    return absl::OkStatus();
  }

  Status ReduceUnit(UnitRuntime& u) {
    const bool last_micro = u.backward_count == ga_;
    const int64_t S = u.layout.shard;
    const size_t cds = DTypeSize(cd_);
    void* G = GradBase(u);
    PendingReduce p;
    if (ReduceEveryMicroStep()) {
      Deposit dep{u.grad_shard.data(), u.grad_shard_dtype, /*add=*/u.backward_count > 1};
      if (stage_ == 1) {  // the persistent full gradient is read by the op, then zeroed for the next micro-step
        p.zero_after = G;
        p.zero_bytes = u.layout.padded * cds;
      } else {
        p.bucket = std::move(u.bucket);
      }
      return IssueReduce(u, G, cd_, /*allreduce=*/false, dep, std::move(p));
    }
    // Accumulate locally; reduce once after the last micro-step.
    void* src = G;
    DType src_dtype = cd_;
    if (Accumulate16()) {
      if (u.accum_full.empty()) u.accum_full = TakeFull(u.layout.padded * 4);
      float* acc = u.accum_full.as<float>();
      compute_->Land(G, cd_, acc, DType::kF32, u.layout.padded, /*add=*/true);
      compute_->Zero(G, u.layout.padded * cds);
      src = acc;
      src_dtype = DType::kF32;
    }
    if (!last_micro) return absl::OkStatus();
    if (stage_ == 0) {
      return IssueReduce(u, src, src_dtype, /*allreduce=*/true, Deposit{src, src_dtype, false}, std::move(p));
    }
    if (stage_ == 1) {
      Deposit dep{static_cast<char*>(G) + static_cast<int64_t>(rank_) * S * cds, cd_, false};
      return IssueReduce(u, src, src_dtype, false, dep, std::move(p));
    }
    p.free_full_after = true;
    return IssueReduce(u, src, src_dtype, false, Deposit{u.grad_shard.data(), u.grad_shard_dtype, false}, std::move(p));
  }

  Status RetireOldest() {
    PendingReduce p = std::move(pending_.front());
    pending_.pop_front();
    pending_elems_ -= p.elems;
    UnitRuntime& u = units_[p.unit];
    const auto t0 = Clock::now();
    Status s = compute_->Join(p.work);  // the host waits; a device stream-waits
    times_.reduce_wait_ms += MsSince(t0);
    if (!s.ok() && !p.work.IsCompleted()) {
      // The wait failed (timeout, dead peer) with the op still running: its buffers must outlive it.
      for (Buffer* b : {&p.bucket, &p.recv, &p.staging}) Quarantine(std::move(*b));
    }
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("reducing gradients of unit ", u.layout.name, ": ", s.message()));
    }
    if (p.result != nullptr) {
      // A reduce-scatter's host part [0, host_n) streams to the host tier on the copy stream while backward
      // goes on; the device part [host_n, shard) lands here. An all-reduce (stage 0) has no host part.
      const int64_t hn = u.host_n;  // > 0 only at stages 1-3, which reduce-scatter
      const size_t rs = DTypeSize(p.result_dtype);
      compute_->Land(static_cast<const char*>(p.result) + hn * rs, p.result_dtype, p.dep.ptr, p.dep.dtype,
                     p.result_elems - hn, p.dep.add);
      if (hn > 0) {
        const void* src = p.result;
        const DType sdt = p.result_dtype, ddt = u.grad_shard_dtype;
        void* dst = u.host_grad.data();
        const bool add = p.dep.add;
        // On a device the task's D2H copy waits for the compute stream, which has joined the reduction.
        const auto ticket = copies_.Enqueue(compute_->LandOnHostTask(src, sdt, dst, ddt, hn, add));
        held_.emplace_back(ticket, std::move(p.recv));  // the copy reads it: back to the pool once it ran
      }
    }
    if (p.zero_after != nullptr) compute_->Zero(p.zero_after, p.zero_bytes);
    if (p.free_full_after) {
      FreeFull(u.full_grads);
      FreeFull(u.accum_full);
    }
    bucket_pool_.Give(std::move(p.bucket));
    bucket_pool_.Give(std::move(p.recv));
    wire_pool_.Give(std::move(p.staging));
    return absl::OkStatus();
  }

  // Keeps a buffer that a failed collective may still be using out of every pool; such buffers are never freed
  // (~Engine leaks them if their ops still have not completed), so a broken communicator cannot turn into a
  // use-after-free.
  void Quarantine(Buffer b) {
    if (!b.empty()) quarantine_.push_back(std::move(b));
  }

  // Retires queued reductions from the front for as long as they have completed; never waits.
  Status RetireCompleted() {
    while (!pending_.empty() && pending_.front().work.IsCompleted()) ZERO_RETURN_IF_ERROR(RetireOldest());
    return absl::OkStatus();
  }

  // Before allocating a reduce-scatter output of `bytes`: if none is pooled but one is held by a copy to the
  // host tier, wait for that copy instead of allocating (so offload's steady state allocates nothing, however
  // the copy stream and the compute keep pace).
  void ReclaimHeld(size_t bytes) {
    ReleaseHeld();
    if (bucket_pool_.Has(bytes)) return;
    for (const auto& [ticket, buffer] : held_) {
      if (buffer.size() != bytes) continue;
      const internal::CopyStream::Ticket t = ticket;
      copies_.Wait(t);  // FIFO: every earlier copy ran too
      ReleaseHeld();    // (invalidates the iteration: done)
      return;
    }
  }

  // Returns to their pool the reduction buffers whose copy to the host tier has run.
  void ReleaseHeld() {
    while (!held_.empty() && copies_.Done(held_.front().first)) {
      bucket_pool_.Give(std::move(held_.front().second));
      held_.pop_front();
    }
  }

  // Retires queued reductions up to and including the last one of `unit` (FIFO order is kept).
  Status RetireUnit(UnitId unit) {
    size_t last = pending_.size();
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (pending_[i].unit == unit) last = i;
    }
    if (last == pending_.size()) return absl::OkStatus();
    for (size_t i = 0; i <= last; ++i) ZERO_RETURN_IF_ERROR(RetireOldest());
    return absl::OkStatus();
  }

  // The gradient the device-tier optimizer reads for this rank (the whole unit at stage 0; else the device
  // part [host_n, shard) of the shard, which is all of it without offload), and its dtype.
  std::pair<void*, DType> OptGrad(UnitRuntime& u) {
    const size_t cds = DTypeSize(cd_);
    if (stage_ == 0) {
      return Accumulate16() ? std::make_pair(u.accum_full.data(), DType::kF32) : std::make_pair(u.full_grads.data(), cd_);
    }
    if (stage_ == 1 && !Accumulate16()) {
      return {static_cast<char*>(u.full_grads.data()) + (static_cast<int64_t>(rank_) * u.layout.shard + u.host_n) * cds,
              cd_};
    }
    return {u.grad_shard.data(), u.grad_shard_dtype};
  }

  // ---- the step ----

  // steps_per_print: a progress line from rank 0; with wall_clock_breakdown, where the time went.
  void MaybeLog(const StepResult& r) {
    const int64_t every = cfg_.steps_per_print.value_or(0);
    const int64_t n = applied_steps_ + skipped_steps_;
    if (rank_ != 0 || every <= 0 || n % every != 0) return;
    std::string line = absl::StrCat("step ", n, ": lr ", r.lr, ", grad_norm ", r.grad_norm, ", loss_scale ",
                                    r.loss_scale, ", skipped ", skipped_steps_);
    if (cfg_.wall_clock_breakdown) {
      const StepTimes& t = r.times;
      absl::StrAppend(&line, " | ms: total ", t.total_ms, ", compute ", t.compute_ms, ", gather_wait ",
                      t.gather_wait_ms, ", reduce_wait ", t.reduce_wait_ms, ", norm ", t.norm_ms, ", optimizer ",
                      t.optimizer_ms, ", allgather ", t.allgather_ms);
      if (off_opt_ || off_param_) {
        absl::StrAppend(&line, " | offload ms: copy stream busy ", t.offload_copy_ms, " (overlapped), waited ",
                        t.offload_wait_ms);
      }
    }
    ZERO_LOG(INFO) << line;
  }

  StatusOr<StepResult> Step() {
    if (!finalized_) return absl::FailedPreconditionError("Step: call Finalize first");
    ZERO_RETURN_IF_ERROR(TakeDeferredError());
    for (auto& u : units_) {
      if (u.scope_open) {
        return absl::FailedPreconditionError(absl::StrCat("Step: unit ", u.layout.name, " still has an open ",
                                                          u.scope_backward ? "backward" : "forward",
                                                          " scope (gradients outstanding); close it first"));
      }
      if (u.backward_count != 0 && u.backward_count != ga_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "Step: unit ", u.layout.name, " ran ", u.backward_count, " backward passes since the last Step but "
            "gradient_accumulation_steps is ", ga_, " (gradients outstanding)"));
      }
      if (u.backward_count == 0 && !cfg_.zero.ignore_unused_parameters) {
        return absl::FailedPreconditionError(absl::StrCat(
            "Step: unit ", u.layout.name, " received no gradient and zero_optimization.ignore_unused_parameters "
            "is false"));
      }
    }
    if (compute_->device()) {
      // The scopes joined collectives with stream waits, which do not notice a dead or hung peer; this host
      // wait does (within comm_timeout_s, aborting the communicator), before anything below synchronizes a
      // stream that would sit behind a hung collective forever.
      Work fence = comm_->Fence();
      if (Status s = fence.Wait(); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("Step: waiting for this step's collectives: ", s.message()));
      }
    }
    while (!pending_.empty()) ZERO_RETURN_IF_ERROR(RetireOldest());
    copies_.Sync();  // every host-tier gradient has landed
    ReleaseHeld();
    // Stage 3: release prefetched units nobody opened; adopt this step's order for the next one.
    if (stage_ == 3) {
      for (auto& u : units_) {
        if (u.sharded_params(stage_) && u.status != UnitStatus::kNotAvailable) ReleaseGather(u);
      }
      if (!order_valid_ || order_broken_ || this_step_order_ != order_) {
        order_ = this_step_order_;
      }
      order_valid_ = !order_.empty();
      order_broken_ = false;
      order_pos_ = 0;
      this_step_order_.clear();
      ZERO_RETURN_IF_ERROR(TakeDeferredError());
    }

    // Global norm over owned elements: one all-reduce of {sum of squares, non-finite flag}.
    const auto t_norm = Clock::now();
    double local = 0.0;
    uint64_t local_nonfinite = 0;
    for (auto& u : units_) {
      // Stage 0 holds the whole (already averaged) gradient on every rank: each rank sums its shard's range so
      // the all-reduce adds every element exactly once, as at the other stages.
      auto [g, gt] = OptGrad(u);
      const int64_t begin = stage_ == 0 ? static_cast<int64_t>(rank_) * u.layout.shard : 0;
      const int64_t owned = u.layout.OwnedElems(rank_);
      const int64_t on_host = std::min(owned, u.host_n);
      // One read-only pass per tier: sum of squares (in double) and the inf/NaN count (zero/mixed_precision.h):
      // the host part here, the compute-tier part through the compute tier (a kernel on a device).
      if (on_host > 0) {
        const GradStatsResult gs = GradStats(u.host_grad.data(), u.grad_shard_dtype, static_cast<size_t>(on_host));
        local += gs.sumsq;
        local_nonfinite += gs.nonfinite;
      }
      compute_->AddGradStats(static_cast<const char*>(g) + begin * DTypeSize(gt), gt, owned - on_host);
    }
    const GradStatsResult dev = compute_->TakeGradStatsSync();
    ZERO_RETURN_IF_ERROR(compute_->status());
    local += dev.sumsq;
    local_nonfinite += dev.nonfinite;
    float red[2] = {static_cast<float>(local), local_nonfinite > 0 ? 1.0f : 0.0f};
    ZERO_RETURN_IF_ERROR(HostAllReduceSum(red, 2));
    const bool nonfinite = red[1] != 0.0f || !std::isfinite(red[0]);
    times_.norm_ms += MsSince(t_norm);
    StepResult result;
    const double scale = scaler_.scale();
    result.loss_scale = scale;
    const double inv = 1.0 / (static_cast<double>(ga_) * scale);
    result.grad_norm = nonfinite ? std::numeric_limits<double>::infinity() : std::sqrt(static_cast<double>(red[0])) * inv;
    result.lr = scheduler_->LrAt(applied_steps_);
    if (cfg_.fp16.enabled) {
      // Every rank saw the same all-reduced flag, so every rank's scaler takes the same decision.
      ZERO_RETURN_IF_ERROR(scaler_.Update(nonfinite).status());
    } else if (nonfinite && cfg_.bf16.enabled && cfg_.bf16.nonfinite_grads == NonFinitePolicy::kError) {
      return absl::DataLossError(absl::StrCat("step ", applied_steps_,
                                              ": non-finite gradients on some rank (bf16.nonfinite_grads is \"error\")"));
    }
    if (nonfinite) {
      ++skipped_steps_;
      ZERO_LOG(WARNING) << "step " << applied_steps_ << ": non-finite gradients on some rank; step skipped ("
                        << skipped_steps_ << " skipped so far"
                        << (cfg_.fp16.enabled ? absl::StrCat(", loss scale now ", scaler_.scale()) : std::string())
                        << ")";
      result.skipped = true;
    } else {
      double coef = 1.0;
      if (cfg_.gradient_clipping > 0 && result.grad_norm > cfg_.gradient_clipping) {
        coef = cfg_.gradient_clipping / (result.grad_norm + 1e-6);
      }
      ZERO_RETURN_IF_ERROR(ApplyOptimizer(static_cast<float>(coef * inv), result.lr));
      ++applied_steps_;
    }
    // Zero gradients for the next step.
    for (auto& u : units_) {
      for (Buffer* b : {&u.full_grads, &u.grad_shard, &u.accum_full}) {
        if (!b->empty()) compute_->Zero(b->data(), b->size());
      }
      if (!u.host_grad.empty()) std::memset(u.host_grad.data(), 0, u.host_grad.size());
      u.backward_count = 0;
    }
    result.step = applied_steps_;
    const double busy = copies_.busy_ms(), waited = copies_.wait_ms();
    times_.offload_copy_ms = busy - last_copy_busy_ms_;
    times_.offload_wait_ms = waited - last_copy_wait_ms_;
    last_copy_busy_ms_ = busy;
    last_copy_wait_ms_ = waited;
    times_.total_ms = MsSince(last_step_end_);
    // The optimizer's own waits for a staging buffer are inside optimizer_ms already.
    const double outside_opt_wait = std::max(0.0, times_.offload_wait_ms - opt_copy_wait_ms_);
    times_.compute_ms = std::max(0.0, times_.total_ms - times_.gather_wait_ms - times_.reduce_wait_ms - times_.norm_ms -
                                          times_.optimizer_ms - times_.allgather_ms -
                                          outside_opt_wait);
    opt_copy_wait_ms_ = 0;
    result.times = times_;
    ZERO_RETURN_IF_ERROR(compute_->status());
    MaybeLog(result);
    times_ = StepTimes{};
    last_step_end_ = Clock::now();
    return result;
  }

  Status ApplyOptimizer(float grad_scale, double lr) {
    std::vector<Work> gathers;
    const size_t cds = DTypeSize(cd_);
    const bool stochastic = cd_ == DType::kBF16 && cfg_.bf16.stochastic_rounding;
    const size_t opt_tile = static_cast<size_t>(std::max<int64_t>(cfg_.zero.sub_group_size, 1));
    const auto t_opt = Clock::now();
    const double wait_before = copies_.wait_ms();
    // Stages 1-2 all-gather each unit's updated slice once it is back in the compute tier. With offload the
    // gather of unit k is issued after unit k+1's host step, so unit k's last copy runs during that step
    // instead of being waited for at once (units keep their order, so every rank issues the same sequence).
    int deferred_unit = -1;
    internal::CopyStream::Ticket deferred_copy = 0;
    auto issue_deferred_gather = [&] {
      if (deferred_unit < 0) return;
      UnitRuntime& d = units_[deferred_unit];
      const int64_t dS = d.layout.shard;
      char* slice = static_cast<char*>(d.params.data()) + static_cast<int64_t>(rank_) * dS * cds;
      copies_.Wait(deferred_copy);  // this rank's updated slice is back in the compute tier
      gathers.push_back(comm_->AllGather(slice, d.params.data(), dS, cd_, stream()));  // refresh in place
      deferred_unit = -1;
    };
    for (size_t ui = 0; ui < units_.size(); ++ui) {
      UnitRuntime& u = units_[ui];
      const int64_t S = u.layout.shard;
      const int64_t offset = stage_ == 0 || u.sharded_params(stage_) ? 0 : static_cast<int64_t>(rank_) * S;
      char* param_here = static_cast<char*>(u.params.data()) + offset * cds;  // this rank's part, compute dtype
      // Counter-based randomness keyed by (seed, step, unit, global element): reproducible at any world size.
      const uint64_t key = cfg_.seed ^ (static_cast<uint64_t>(applied_steps_ + 1) * 0x9E3779B97F4A7C15ull) ^
                           (static_cast<uint64_t>(ui) << 40);
      const int64_t first_global = stage_ == 0 ? 0 : static_cast<int64_t>(rank_) * S;
      const int64_t hn = u.host_n, n_dev = (stage_ == 0 ? u.layout.padded : S) - hn;
      ShardUpdate base;
      base.grad_scale = grad_scale;
      base.step = applied_steps_ + 1;
      base.lr = lr;
      base.param_out_dtype = cd_;
      // The device part [host_n, range): the optimizer over compute-tier buffers (all of it without offload).
      if (n_dev > 0) {
        ShardUpdate up = base;
        char* params_dev = param_here + hn * cds;
        std::vector<float*> states;
        for (auto& b : u.state) states.push_back(b.as<float>());
        up.state = states.data();
        std::tie(up.grad, up.grad_dtype) = OptGrad(u);
        up.n = n_dev;
        if (mixed()) {
          up.master = u.master.as<float>();
          up.param_out = stochastic ? nullptr : params_dev;  // fused 16-bit write-back (round to nearest even)
        } else {
          up.master = reinterpret_cast<float*>(params_dev);  // fp32: the parameters are the master
        }
        compute_->Update(*optimizer_, up, threads_, opt_tile);
        if (stochastic) {
          compute_->StochasticRound(up.master, reinterpret_cast<uint16_t*>(params_dev), up.n, key, first_global + hn);
        }
      }
      // The host part [0, host_n): the optimizer over host-tier buffers, the updated parameters streamed back
      // to the compute tier tile by tile (offload/host_step.h).
      internal::CopyStream::Ticket copied = 0;
      if (hn > 0) {
        internal::HostStep hs;
        hs.u = base;
        std::vector<float*> states;
        for (auto& b : u.host_state) states.push_back(b.as<float>());
        hs.u.state = states.data();
        hs.u.grad = u.host_grad.data();
        hs.u.grad_dtype = u.grad_shard_dtype;
        hs.u.n = hn;
        if (MasterIsHostParams()) {
          hs.u.master = reinterpret_cast<float*>(param_here);  // fp32 host shard: the parameters are the master
        } else {
          hs.u.master = u.host_master.as<float>();
          hs.u.param_out_dtype = cd_;  // f32 when computing in fp32: a plain copy of the updated master
          if (off_param_) {
            hs.param_host = param_here;  // the parameters live on the host: written in place, nothing to copy
          } else {
            hs.u.param_out = param_here;
          }
        }
        if (compute_->device()) {
          hs.copy_to_compute = [c = compute_.get()](void* d, const void* src, size_t b) {
            c->CopyInOnCopyStream(d, src, b);
          };
        }
        hs.threads = threads_;
        hs.optimizer_tile = opt_tile;
        hs.pipeline_tile = pipeline_tile_;
        hs.stochastic = stochastic;
        hs.stochastic_key = key;
        hs.first_index = first_global;
        copied = internal::RunHostStep(*optimizer_, hs, copies_, opt_staging_);
      }
      if (stage_ >= 1 && !u.sharded_params(stage_)) {
        issue_deferred_gather();  // the previous unit's
        deferred_unit = static_cast<int>(ui);
        deferred_copy = copied;
        if (copied == 0) issue_deferred_gather();  // nothing to wait for: refresh at once
      }
    }
    issue_deferred_gather();
    copies_.Sync();  // stage 3: the next forward's gathers read the copied-back shards
    opt_copy_wait_ms_ += copies_.wait_ms() - wait_before;
    times_.optimizer_ms += MsSince(t_opt);
    const auto t_ag = Clock::now();
    for (size_t i = 0; i < gathers.size(); ++i) {
      Status s = compute_->Join(gathers[i]);
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("all-gather of updated parameters: ", s.message()));
    }
    times_.allgather_ms += MsSince(t_ag);
    return absl::OkStatus();
  }

  StatusOr<TensorView> ParamView(UnitId id, const std::string& name) const {
    ZERO_RETURN_IF_ERROR(CheckUnit(id, "Param"));
    const UnitRuntime& u = units_[id];
    auto it = u.layout.index.find(name);
    if (it == u.layout.index.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unit ", u.layout.name, " has no parameter \"", name, "\""));
    }
    if (u.status != UnitStatus::kAvailable) {
      return absl::FailedPreconditionError(absl::StrCat("unit ", u.layout.name, " is ", StatusName(u.status),
                                                        " (released or not gathered): open a Forward or Backward "
                                                        "scope to read parameter ", name));
    }
    const ParamSlot& slot = u.layout.params[it->second];
    TensorView v;
    v.data = static_cast<char*>(ParamBase(u)) + slot.offset * DTypeSize(cd_);
    v.dtype = cd_;
    v.numel = slot.numel;
    v.shape = &slot.spec.shape;
    return v;
  }

  TensorView ScopeView(UnitId id, const std::string& name, bool grad) const {
    const UnitRuntime& u = units_[id];
    auto it = u.layout.index.find(name);
    ZERO_CHECK(it != u.layout.index.end()) << "unit " << u.layout.name << " has no parameter " << name;
    ZERO_CHECK(u.scope_open) << "unit " << u.layout.name << " scope is closed";
    const ParamSlot& slot = u.layout.params[it->second];
    TensorView v;
    void* base = grad ? GradBase(u) : ParamBase(u);
    ZERO_CHECK(base != nullptr) << "unit " << u.layout.name << (grad ? ": grad() outside a backward scope" : "");
    v.data = static_cast<char*>(base) + slot.offset * DTypeSize(cd_);
    v.dtype = cd_;
    v.numel = slot.numel;
    v.shape = &slot.spec.shape;
    return v;
  }

  StatusOr<std::vector<float>> GatherParam(UnitId id, const std::string& name) {
    ZERO_RETURN_IF_ERROR(CheckUnit(id, "GatherParam"));
    UnitRuntime& u = units_[id];
    auto it = u.layout.index.find(name);
    if (it == u.layout.index.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unit ", u.layout.name, " has no parameter \"", name, "\""));
    }
    const ParamSlot& slot = u.layout.params[it->second];
    // The fp32 master: the master buffer under mixed precision (with offload: its host part, then its
    // compute-tier part), else the parameters themselves; this rank's part is read into host memory first.
    const bool full_here = stage_ == 0 || (!mixed() && !u.sharded_params(stage_));
    const int64_t S = u.layout.shard;
    std::vector<float> mine(full_here ? u.layout.padded : S);
    auto fetch = [&](float* dst, const Buffer& b, int64_t n) {
      if (n <= 0) return;
      if (b.tier() == MemTier::kHost) {
        std::memcpy(dst, b.data(), n * 4);
      } else {
        compute_->CopyToHostSync(dst, b.data(), n * 4);
      }
    };
    if (mixed()) {
      if (full_here) {
        fetch(mine.data(), u.master, u.layout.padded);
      } else {
        fetch(mine.data(), u.host_master, u.host_n);
        fetch(mine.data() + u.host_n, u.master, S - u.host_n);
      }
    } else {
      fetch(mine.data(), u.params, full_here ? u.layout.padded : S);  // stage 3: the parameter shard
    }
    ZERO_RETURN_IF_ERROR(compute_->status());
    std::vector<float> full;
    if (full_here) {
      full = std::move(mine);
    } else {
      full.resize(u.layout.padded);
      ZERO_RETURN_IF_ERROR(HostAllGather(mine.data(), full.data(), S));
    }
    return std::vector<float>(full.begin() + slot.offset, full.begin() + slot.offset + slot.numel);
  }

  // ---- state ----
  Config cfg_;
  std::shared_ptr<Communicator> comm_;
  EngineOptions opts_;
  int stage_;
  int rank_, world_;
  DType cd_ = DType::kF32;
  DType comm_dtype_ = DType::kF32;
  LossScaler scaler_{LossScaler::Options{}};
  int ga_ = 1;
  int threads_ = 1;
  MemoryTracker tracker_;
  std::unique_ptr<internal::ComputeTier> compute_;  // before the pools, which allocate through it
  // wire_pool_: a bucket converted to the wire dtype (communication_data_type) before its reduction.
  BufferPool gather_pool_, bucket_pool_, wire_pool_;
  BufferPool full_pool_{compute_, MemTag::kGrads};  // CUDA engine only: see TakeFull
  BufferPool stage_pool_{compute_, MemTag::kStaging};  // CUDA engine with offload_param: see IssueGather
  Buffer reduce_scratch_;  // CUDA engine: the norm's all-reduce (see HostAllReduceSum)
  std::shared_ptr<const ElementwiseOptimizer> optimizer_;
  std::unique_ptr<LrScheduler> scheduler_;
  std::vector<UnitRuntime> units_;
  bool finalized_ = false;
  int64_t num_params_ = 0;
  Status deferred_;
  std::deque<PendingReduce> pending_;
  int64_t pending_elems_ = 0;
  // Prefetch by recorded order (stage 3).
  std::vector<UnitId> order_, this_step_order_;
  bool order_valid_ = false, order_broken_ = false;
  size_t order_pos_ = 0;
  int64_t live_elems_ = 0, peak_live_ = 0;
  int64_t prefetch_gathers_ = 0, demand_gathers_ = 0;
  int64_t applied_steps_ = 0, skipped_steps_ = 0;
  StepTimes times_;
  Clock::time_point last_step_end_ = Clock::now();
  // Offload (docs/design.md, "Offload").
  bool off_opt_ = false, off_param_ = false;
  size_t pipeline_tile_ = 0;
  internal::StagingPair opt_staging_;  // host tier: updated parameters on their way back to the compute tier
  std::deque<std::pair<uint64_t, Buffer>> held_;  // reduce buckets a queued copy still reads
  double opt_copy_wait_ms_ = 0, last_copy_busy_ms_ = 0, last_copy_wait_ms_ = 0;
  std::vector<Buffer> quarantine_;  // buffers of collectives whose wait failed (see Quarantine)
  // Last member: destroyed first, so its worker finishes every queued copy while the buffers still exist.
  internal::CopyStream copies_;
};

// ---- UnitScope ----

UnitScope::UnitScope(UnitScope&& o) noexcept { *this = std::move(o); }
UnitScope& UnitScope::operator=(UnitScope&& o) noexcept {
  if (this != &o) {
    (void)Close();
    engine_ = std::exchange(o.engine_, nullptr);
    unit_ = o.unit_;
    backward_ = o.backward_;
  }
  return *this;
}
UnitScope::~UnitScope() { (void)Close(); }

Status UnitScope::Close() {
  if (engine_ == nullptr) return absl::OkStatus();
  Engine* e = std::exchange(engine_, nullptr);
  Status s = e->CloseScope(unit_, backward_);
  if (!s.ok() && e->impl_->deferred_.ok()) e->impl_->deferred_ = s;
  return s;
}
TensorView UnitScope::param(const std::string& name) const {
  ZERO_CHECK(engine_ != nullptr) << "param() on a closed scope";
  return engine_->impl_->ScopeView(unit_, name, false);
}
TensorView UnitScope::grad(const std::string& name) const {
  ZERO_CHECK(engine_ != nullptr && backward_) << "grad() needs an open backward scope";
  return engine_->impl_->ScopeView(unit_, name, true);
}
void* UnitScope::param_base() const {
  ZERO_CHECK(engine_ != nullptr);
  return engine_->impl_->ParamBase(engine_->impl_->units_[unit_]);
}
void* UnitScope::grad_base() const {
  ZERO_CHECK(engine_ != nullptr && backward_);
  return engine_->impl_->GradBase(engine_->impl_->units_[unit_]);
}

// ---- Engine ----

StatusOr<std::unique_ptr<Engine>> Engine::Create(const Config& config, std::shared_ptr<Communicator> comm,
                                                 EngineOptions options) {
  if (comm == nullptr) return absl::InvalidArgumentError("Engine::Create: communicator is null");
  Config cfg = config;
  ZERO_RETURN_IF_ERROR(cfg.Validate(comm->world_size()));
  auto impl = std::make_unique<Impl>(cfg, std::move(comm), std::move(options));
  ZERO_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() {
  if (!impl_) return;
  bool unfinished = false;
  for (auto& p : impl_->pending_) {
    (void)p.work.Wait();
    unfinished |= !p.work.IsCompleted();
  }
  for (auto& u : impl_->units_) {
    if (u.status == UnitStatus::kInflight) (void)u.gather_work.Wait();
    unfinished |= !u.gather_work.IsCompleted();
  }
  for (auto& b : impl_->quarantine_) unfinished |= !b.empty();
  if (unfinished) {
    // A collective that failed to complete may still read or write engine buffers from the communication
    // thread: leak the engine's state rather than free memory under it (the communicator is broken anyway).
    ZERO_LOG(ERROR) << "Engine destroyed with collectives that did not complete; leaking its buffers";
    (void)impl_.release();
  }
}

StatusOr<UnitId> Engine::AddUnit(const std::string& name, std::vector<ParamSpec> params) {
  return impl_->AddUnit(name, std::move(params));
}
Status Engine::Finalize(const ParamInit& init) { return impl_->Finalize(init); }
Status Engine::CopyIn(UnitId unit, const std::string& param, const float* values) {
  return impl_->CopyIn(unit, param, values);
}
StatusOr<UnitScope> Engine::Forward(UnitId unit) { return impl_->Open(this, unit, false); }
StatusOr<UnitScope> Engine::Backward(UnitId unit) { return impl_->Open(this, unit, true); }
Status Engine::CloseScope(UnitId unit, bool backward) { return impl_->Close(unit, backward); }
StatusOr<StepResult> Engine::Step() { return impl_->Step(); }
StatusOr<TensorView> Engine::Param(UnitId unit, const std::string& name) const { return impl_->ParamView(unit, name); }
StatusOr<std::vector<float>> Engine::GatherParam(UnitId unit, const std::string& name) {
  return impl_->GatherParam(unit, name);
}
double Engine::loss_scale() const { return impl_->scaler_.scale(); }
int64_t Engine::steps() const { return impl_->applied_steps_; }
int Engine::rank() const { return impl_->rank_; }
int Engine::world_size() const { return impl_->world_; }
const Config& Engine::config() const { return impl_->cfg_; }
Communicator& Engine::comm() { return *impl_->comm_; }
CUstream_st* Engine::cuda_stream() const { return impl_->stream(); }
bool Engine::on_device() const { return impl_->compute_->device(); }
int64_t Engine::num_params() const { return impl_->num_params_; }
MemoryReport Engine::memory_report() const {
  // The engine's own allocations plus the communicator's staging buffers. The two peaks are added, so the
  // staging peak is an upper bound of the combined high-water mark.
  MemoryReport r = impl_->tracker_.Report();
  const MemoryReport c = impl_->comm_->memory_report();
  for (size_t t = 0; t < r.usage.size(); ++t) {
    for (size_t g = 0; g < r.usage[t].size(); ++g) {
      r.usage[t][g].current += c.usage[t][g].current;
      r.usage[t][g].peak += c.usage[t][g].peak;
    }
  }
  return r;
}
MemoryTracker& Engine::memory_tracker() { return impl_->tracker_; }
std::string Engine::UnitState(UnitId unit) const { return StatusName(impl_->units_.at(unit).status); }
UnitId Engine::FindUnit(const std::string& name) const { return impl_->FindUnit(name); }
const std::vector<ParamSpec>& Engine::UnitParams(UnitId unit) const {
  return impl_->units_.at(unit).specs;
}
int64_t Engine::prefetch_gathers() const { return impl_->prefetch_gathers_; }
int64_t Engine::demand_gathers() const { return impl_->demand_gathers_; }
int64_t Engine::peak_live_elements() const { return impl_->peak_live_; }

}  // namespace zero
