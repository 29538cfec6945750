// shard/internal/context.h — what the engine's components share: the config's decisions, the communicator,
// the compute tier, the units and the error and timing state of the current step. defines: EngineContext.
//
// The Engine (shard/engine.cc) owns one; the gather scheduler, the gradient reducer and the step hold a
// pointer to it. Not thread-safe, like the Engine.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
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
  EngineContext(const Config& c, std::shared_ptr<Communicator> cm, EngineOptions o)
      : cfg(c), comm(std::move(cm)), opts(std::move(o)), rank(comm->rank()), world(comm->world_size()) {
    // The communicator's staging joins this engine's per-tier totals from before the engine's first byte, so
    // peak_total is the high-water mark of both (Engine::memory_report); the link ends before `tracker` dies.
    if (MemoryTracker* staging = comm->memory_tracker()) staging->CountAlsoIn(&tracker);
  }
  ~EngineContext() {
    if (MemoryTracker* staging = comm->memory_tracker()) staging->StopCountingIn(&tracker);
  }
  EngineContext(const EngineContext&) = delete;
  EngineContext& operator=(const EngineContext&) = delete;

  Config cfg;
  std::shared_ptr<Communicator> comm;
  EngineOptions opts;
  int rank, world;
  PlanPolicy policy;  // the config's placement decisions (shard/internal/plan.h)
  int threads = 1;    // this rank's optimizer threads
  MemoryTracker tracker;
  std::unique_ptr<ComputeTier> compute;  // before anything that allocates through it
  std::vector<Unit> units;
  bool finalized = false;
  int64_t applied_steps = 0;       // kept by the step (ShardedStep) for the fault-injection hook's step filter
  Status deferred;                 // an error of a scope's close or a prefetch, reported by the next public call
  StepTimes times;                 // of the step in progress
  std::vector<Buffer> quarantine;  // buffers of collectives whose wait failed (see Quarantine)

  int stage() const { return policy.stage; }
  DType cd() const { return policy.compute; }
  bool mixed() const { return policy.mixed(); }
  int ga() const { return policy.accumulation_steps; }
  CUstream_st* stream() const { return compute->stream(); }

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
  // The tier the trainer computes in (reported as "device"), or the host tier (offload), as a plan lists it.
  Buffer Allocate(const PlannedBuffer& b) {
    const size_t bytes = static_cast<size_t>(b.bytes());
    if (b.tier == MemTier::kDevice) return compute->Alloc(b.tag, bytes);
    return b.pinned ? Buffer::Pinned(&tracker, b.tag, bytes) : Buffer::Host(&tracker, b.tag, bytes);
  }
};

}  // namespace zero::internal
