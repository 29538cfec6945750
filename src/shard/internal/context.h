// shard/internal/context.h — what the engine's components share: the config's decisions, the communicator,
// the compute tier, the units and the error and timing state of the current step. defines: EngineContext.
//
// The Engine (shard/engine.cc) owns one; the gather scheduler, the gradient reducer and the step hold a
// pointer to it. Not thread-safe, like the Engine.
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "offload/nvme_param_tier.h"
#include "offload/nvme_store.h"
#include "shard/internal/compute.h"
#include "shard/internal/plan.h"
#include "shard/internal/unit.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/memory.h"

namespace zero::internal {

using Clock = std::chrono::steady_clock;
inline double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct EngineContext {
  // `world`: the trainer's communicator; `shard`/`replica`: hybrid sharding's groups (Engine::Create splits
  // them), or null: the engine shards across `world`.
  EngineContext(const Config& c, std::shared_ptr<Communicator> w, std::shared_ptr<Communicator> shard,
                std::shared_ptr<Communicator> replica, EngineOptions o, std::shared_ptr<Communicator> hpz = nullptr,
                std::shared_ptr<Communicator> qgz_host = nullptr, std::shared_ptr<Communicator> qgz_across = nullptr)
      : cfg(c),
        comm(shard != nullptr ? std::move(shard) : w),
        world_comm(std::move(w)),
        replica_comm(std::move(replica)),
        hpz_comm(std::move(hpz)),
        qgz_host(std::move(qgz_host)),
        qgz_across(std::move(qgz_across)),
        opts(std::move(o)),
        rank(comm->rank()),
        world(comm->world_size()),
        world_rank(world_comm->rank()),
        world_size(world_comm->world_size()) {
    // The communicators' staging joins this engine's per-tier totals from before the engine's first byte, so
    // peak_total is the high-water mark of all of it (Engine::memory_report); the links end before `tracker` dies.
    for (Communicator* c : Comms()) {
      if (MemoryTracker* staging = c->memory_tracker()) staging->CountAlsoIn(&tracker);
    }
  }
  ~EngineContext() {
    for (Communicator* c : Comms()) {
      if (MemoryTracker* staging = c->memory_tracker()) staging->StopCountingIn(&tracker);
    }
  }
  EngineContext(const EngineContext&) = delete;
  EngineContext& operator=(const EngineContext&) = delete;

  // The distinct communicators: the shard group's, the world's (when hybrid), the replicas', hpZ's host group.
  std::vector<Communicator*> Comms() const {
    std::vector<Communicator*> v{comm.get()};
    if (world_comm != comm) v.push_back(world_comm.get());
    if (replica_comm != nullptr) v.push_back(replica_comm.get());
    if (hpz_comm != nullptr) v.push_back(hpz_comm.get());
    if (qgz_host != nullptr) v.push_back(qgz_host.get());
    if (qgz_across != nullptr) v.push_back(qgz_across.get());
    return v;
  }
  bool hybrid() const { return replica_comm != nullptr; }
  // The bytes this rank has sent so far over the distinct communicators (Communicator::bytes_sent_to_ranks) to
  // ranks of its own host (host_bytes[0]) and of other hosts ([1]). A host is `ranks_per_host` consecutive world
  // ranks; a communicator's rank i is the world rank its split made it: the shard group's g·G + i (hybrid), the
  // replicas' i·G + rank % G, the hpZ group's (world rank / H)·H + i. Communicators that do not count add 0.
  std::array<int64_t, 2> HostBytes() const {
    std::array<int64_t, 2> out{0, 0};
    const int G = world, host = world_rank / ranks_per_host;
    auto add = [&](const Communicator* c, auto world_rank_of) {
      if (c == nullptr) return;
      const std::vector<int64_t> sent = c->bytes_sent_to_ranks();
      for (size_t i = 0; i < sent.size(); ++i) {
        out[world_rank_of(static_cast<int>(i)) / ranks_per_host == host ? 0 : 1] += sent[i];
      }
    };
    if (hybrid()) {
      add(comm.get(), [&](int i) { return world_rank / G * G + i; });
      add(world_comm.get(), [](int i) { return i; });
      add(replica_comm.get(), [&](int i) { return i * G + world_rank % G; });
    } else {
      add(comm.get(), [](int i) { return i; });
    }
    if (hpz_comm != nullptr) {
      const int H = hpz_comm->world_size();
      add(hpz_comm.get(), [&](int i) { return world_rank / H * H + i; });
    }
    if (qgz_host != nullptr) {  // qgZ's two hops: the host's L ranks, then the M ranks of this local index
      const int L = qgz_host->world_size();
      add(qgz_host.get(), [&](int i) { return world_rank / L * L + i; });
      add(qgz_across.get(), [&](int i) { return i * L + world_rank % L; });
    }
    return out;
  }
  // Live recovery (zero/elastic.h) puts another job-wide communicator and replica group in place between steps:
  // the staging of the communicators that leave stops counting in `tracker`, that of those that come starts.
  void ReplaceJobComms(std::shared_ptr<Communicator> world, std::shared_ptr<Communicator> replica) {
    for (Communicator* c : Comms()) {
      if (c == comm.get()) continue;
      if (MemoryTracker* staging = c->memory_tracker()) staging->StopCountingIn(&tracker);
    }
    world_comm = std::move(world);
    replica_comm = std::move(replica);
    for (Communicator* c : Comms()) {
      if (c == comm.get()) continue;
      if (MemoryTracker* staging = c->memory_tracker()) staging->CountAlsoIn(&tracker);
    }
    world_rank = world_comm->rank();
    world_size = world_comm->world_size();
  }

  Config cfg;
  // The communicator the engine shards over (gathers, reduce-scatters, the step's norm): the shard group's under
  // hybrid sharding, else the trainer's. `rank` and `world` are this rank's place in it: which shard it holds.
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<Communicator> world_comm;    // the trainer's: agreement at Finalize and in checkpoints
  std::shared_ptr<Communicator> replica_comm;  // hybrid: the ranks holding the same shard, one per group
  // hpZ (zero_hpz_partition_size H > 1): the H consecutive ranks of this rank's host group, over which the
  // secondary copy of each unit is sharded and the backward gathers run; null otherwise.
  std::shared_ptr<Communicator> hpz_comm;
  // qgZ in two hops (shard/internal/qgz.h): the ranks of this rank's host, and the ranks of the same local index
  // on every host; both null in one hop, which runs over `comm`.
  std::shared_ptr<Communicator> qgz_host, qgz_across;
  Communicator* qgz_intra() const { return qgz_host != nullptr ? qgz_host.get() : comm.get(); }
  // Ranks per host (StepResult::intra_host_bytes): EngineOptions::local_world_size, else the launcher's
  // (Communicator::LaunchedLocalWorldSize), else 1 (every rank a host of its own: all traffic counts as across hosts).
  int ranks_per_host = 1;
  EngineOptions opts;
  int rank, world;
  int world_rank, world_size;     // the trainer's rank and world size (logs, fault hooks, Engine::rank)
  PlanPolicy policy;              // the config's placement decisions (shard/internal/plan.h)
  int64_t qgz_scratch_bytes = 0;  // the plan's QgzScratchBytes: qgZ's one coding scratch (GradReducer), as bounded
  int threads = 1;                // this rank's optimizer threads
  MemoryTracker tracker;
  std::unique_ptr<ComputeTier> compute;  // before anything that allocates through it
  std::vector<Unit> units;
  // offload_optimizer.device "nvme": the host parts' master and optimizer state (Finalize creates it; null
  // otherwise). Unit i's region is the store's unit i.
  std::unique_ptr<NvmeStore> nvme;
  // offload_param.device "nvme": the sharded units' parameter shards (Finalize creates it when some unit is
  // sharded; null otherwise). Such a unit's `params` is empty but while a ParamStage (below) holds it.
  std::unique_ptr<NvmeParamTier> param_nvme;
  bool finalized = false;
  // Live recovery (zero/elastic.h): a failed gradient all-reduce across replica groups does not end the step
  // with an error on this rank alone; the shard group agrees to drop the step (ShardedStep::Run).
  bool live_recovery = false;
  int64_t applied_steps = 0;       // kept by the step (ShardedStep) for the fault-injection hook's step filter
  Status deferred;                 // an error of a scope's close or a prefetch, reported by the next public call
  StepTimes times;                 // of the step in progress
  std::vector<Buffer> quarantine;  // buffers of collectives whose wait failed (see Quarantine)

  int stage() const { return policy.stage; }
  DType cd() const { return policy.compute; }
  bool mixed() const { return policy.mixed(); }
  int ga() const { return policy.accumulation_steps; }
  CUstream_st* stream() const { return compute->stream(); }

  // hpZ: the parameters change outside a step (CopyIn, Load): no secondary copy stays valid for a backward.
  void StaleSecondaries() {
    for (Unit& u : units) u.hpz_fresh = false;
  }
  void Defer(const Status& s) {
    if (deferred.ok() && !s.ok()) deferred = s;
  }
  // Returns and clears the deferred error; compute-tier failures are sticky (a CUDA error is not cleared).
  Status TakeDeferredError() {
    Status s = deferred;
    deferred = absl::OkStatus();
    return s.ok() ? compute->status() : s;
  }
  // Keeps a buffer that a failed collective may still be using out of every pool; such buffers are never freed
  // (~Engine leaks them if their ops still have not completed), so a broken communicator cannot turn into a
  // use-after-free.
  void Quarantine(Buffer b) {
    if (!b.empty()) quarantine.push_back(std::move(b));
  }
  // A failed compute-tier allocation (a device out of memory) is returned before any collective gets a null
  // buffer: an NCCL error would abort the communicator for every rank.
  Status AllocStatus(const Buffer& b, size_t bytes, const char* what, const Unit& u) const {
    if (!b.empty() || bytes == 0) return absl::OkStatus();
    Status s = compute->status();
    return absl::ResourceExhaustedError(absl::StrCat(what, " of unit ", u.name(), " (", bytes,
                                                     " bytes): ", s.ok() ? "allocation failed" : s.message()));
  }
  // The tier the trainer computes in (reported as "device"), or the host tier (offload), as a plan lists it. On
  // failure (the allocator's, or the tracker's budget) an empty buffer and *error says which tier and bytes.
  Buffer Allocate(const PlannedBuffer& b, Status* error) {
    const size_t bytes = static_cast<size_t>(b.bytes());
    if (b.tier == MemTier::kDevice) {
      Buffer buf = compute->Alloc(b.tag, bytes);
      if (buf.empty() && bytes > 0) *error = compute->status();
      return buf;
    }
    return b.pinned ? Buffer::Pinned(&tracker, b.tag, bytes, error)
                    : Buffer::Host(&tracker, b.tag, bytes, MemTier::kHost, error);
  }
};

// A sharded unit's parameter shard in the NVMe parameter tier, made its `params` for a while: Begin takes a slot of
// the tier's pool and reads the shard into it when `read`; Commit writes it back; the destructor empties `params`
// and returns the slot. With every slot held by a gather in flight (CopyIn, GatherParam or a checkpoint between a
// prefetch and its scope) the shard goes through a temporary host buffer instead, tagged staging. Without the tier,
// or for a unit not in it, nothing happens and `params` is the shard itself.
class ParamStage {
 public:
  ParamStage(EngineContext& ctx, Unit& u, int ui) : ctx_(ctx), u_(u), ui_(ui) {}
  ~ParamStage() { End(); }
  ParamStage(const ParamStage&) = delete;
  ParamStage& operator=(const ParamStage&) = delete;

  static bool InTier(const EngineContext& ctx, const Unit& u) { return ctx.param_nvme && u.sharded_params(); }
  // `in_step`: the bytes count as the steps' (zero/advanced/engine_stats.h).
  Status Begin(bool read, bool in_step) {
    if (!InTier(ctx_, u_)) return absl::OkStatus();
    const size_t bytes = static_cast<size_t>(u_.plan.shard) * DTypeSize(ctx_.cd());
    in_step_ = in_step;
    if (ctx_.param_nvme->free_slots() == 0) {
      Status err;
      temp_ = Buffer::Host(&ctx_.tracker, MemTag::kStaging, bytes, MemTier::kHost, &err);
      if (!err.ok()) {
        return Status(err.code(), absl::StrCat("unit ", u_.name(), ": staging its NVMe-tier parameter shard on rank ",
                                               ctx_.world_rank, ": ", err.message()));
      }
      if (read) {
        if (Status s = ctx_.param_nvme->Read(ui_, temp_.data(), in_step); !s.ok()) {
          temp_.Reset();
          return s;
        }
      }
      u_.params = Buffer::Borrow(temp_.data(), bytes, MemTag::kStaging, MemTier::kHost);
      return absl::OkStatus();
    }
    ZERO_ASSIGN_OR_RETURN(slot_, ctx_.param_nvme->Take(ui_, read, in_step));
    u_.params = Buffer::Borrow(ctx_.param_nvme->data(slot_), bytes, MemTag::kStaging, MemTier::kHost);
    return absl::OkStatus();
  }
  Status Commit() {
    if (slot_ < 0 && temp_.empty()) return absl::OkStatus();
    Status s = slot_ >= 0 ? ctx_.param_nvme->Write(ui_, slot_, in_step_)
                          : ctx_.param_nvme->WriteFrom(ui_, temp_.data(), in_step_);
    if (!s.ok()) {
      return Status(s.code(), absl::StrCat("unit ", u_.name(),
                                           "'s parameter shard (zero_optimization.offload_param."
                                           "nvme_path) on rank ",
                                           ctx_.world_rank, ": ", s.message()));
    }
    return s;
  }
  void End() {
    if (slot_ < 0 && temp_.empty()) return;
    u_.params = Buffer();
    temp_.Reset();
    if (slot_ >= 0) ctx_.param_nvme->Give(slot_);
    slot_ = -1;
  }

 private:
  EngineContext& ctx_;
  Unit& u_;
  const int ui_;
  int slot_ = -1;
  Buffer temp_;  // no slot was free
  bool in_step_ = false;
};

}  // namespace zero::internal
