// shard/internal/step.h — the sharded optimizer step: drain, norm, skip/clip decision, the optimizer on this
// rank's shards (compute tier and host tier), parameter refresh, times. defines: ShardedStep.
//
// 1. Retire every queued reduction; release stage-3 units nobody opened; adopt the step's gather order.
// 2. GradStats over this rank's owned, unpadded gradient elements; one all-reduce of {sum of squares,
//    non-finite flag}, so every rank takes the same decision.
// 3. grad_norm = sqrt(sum) / (accumulation_steps × loss_scale); clipping and unscaling fuse into one factor.
// 4. fp16: the LossScaler decides; bf16/fp32: a non-finite step is skipped (or an error, bf16.nonfinite_grads).
// 5. The optimizer runs element-wise on the shard; with offload the host part runs on the host, pipelined
//    with the copy-back of the updated parameters (offload/host_step.h).
// 6. Stages 1-2 (and persistent stage-3 units) all-gather the updated parameters in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "offload/copy_stream.h"
#include "offload/host_step.h"
#include "shard/internal/context.h"
#include "shard/internal/gather.h"
#include "shard/internal/grad_reducer.h"
#include "shard/internal/registration.h"
#include "zero/mixed_precision.h"
#include "zero/optimizer.h"

namespace zero::internal {

// The payload (absl::Status::SetPayload type URL) of the kAborted error with which Step reports, under live
// recovery, that the all-reduce across replica groups failed and the shard group dropped the step.
inline constexpr char kReplicaLostPayload[] = "zero/replica-group-lost";

class ShardedStep {
 public:
  ShardedStep(EngineContext* ctx, GatherScheduler* gathers, GradReducer* reducer, HostCollectives* host,
              CopyStream* copies)
      : ctx_(ctx),
        gathers_(gathers),
        reducer_(reducer),
        host_(host),
        copies_(copies),
        refresh_pool_(ctx->compute, MemTag::kStaging) {}

  // Init: the optimizer (the trainer's, or the config's), the LR schedule and the loss scaler.
  Status Init();
  // Finalize: the copy-back staging the plan lists (offload only); the clock of the first step starts.
  Status Allocate(const StagePlan& plan);
  // The first Step's bus bytes (StepResult) count from here: the end of Finalize.
  void StartCountingBytes();
  StatusOr<StepResult> Run(const StepOptions& options);

  const ElementwiseOptimizer& optimizer() const { return *optimizer_; }
  double loss_scale() const { return scaler_.scale(); }
  int64_t applied_steps() const { return applied_steps_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  const LossScaler& scaler() const { return scaler_; }
  // Checkpoint load: the counters and the scaler as saved (the LR schedule follows from applied_steps).
  void Restore(int64_t applied, int64_t skipped, const LossScaler::State& scaler) {
    applied_steps_ = applied;
    ctx_->applied_steps = applied;
    skipped_steps_ = skipped;
    scaler_.Restore(scaler);
  }

 private:
  Status CheckReady() const;  // no scope open, every unit's micro-steps complete
  Status Drain();             // reductions, copies, stage-3 releases
  // The global norm's two all-reduced numbers over owned elements: {sum of squares, non-finite flag}.
  Status GradNorm(float red[3]);
  // Hybrid sharding: averages each unit's reduced gradient shard across the shard's replicas (one per group), so
  // every group steps with the gradient averaged over all ranks. Nothing without hybrid sharding.
  Status ReduceAcrossReplicas();
  // Whether every rank issued the same collectives so far (advanced::ExtendedCommunicator::IssuedOpsHash) and is at the
  // same step (its count of Step calls, and the StepOptions: step, lr, lr_scale): one all-reduce of 32 floats;
  // kFailedPrecondition naming each rank's step and last ops when not. Collective.
  Status CheckInSync(const StepOptions& options);
  Status ApplyOptimizer(float grad_scale, double lr);
  Status MakeGroupOptimizers();
  // The rank's range [0, range) of unit `u` (global element first_global + i) cut where the parameter group
  // changes; one segment of group -1 without groups.
  struct Segment {
    int64_t begin, end;
    int group;  // -1: the config's optimizer, no lr scale
  };
  std::vector<Segment> Segments(const Unit& u, int64_t first_global, int64_t range) const;
  // The host step of unit `ui`'s host part under the NVMe tier (ctx->nvme), chunk by chunk through the store's
  // pass; the first failure lands in *failed. Returns the copy-back ticket of its last tile.
  CopyStream::Ticket NvmeHostStep(Unit& u, int ui, const ShardUpdate& base, const std::vector<Segment>& segments,
                                  char* param_here, int64_t first_global, uint64_t key, Status* failed);
  const ElementwiseOptimizer& OptimizerOf(int group) const {
    return group < 0 ? *optimizer_ : *group_optimizers_[group];
  }
  double LrScaleOf(int group) const { return group < 0 ? 1.0 : ctx_->opts.param_groups[group].lr_scale; }
  void FinishTimes(StepResult& result);
  void MaybeLog(const StepResult& r) const;

  EngineContext* ctx_;
  GatherScheduler* gathers_;
  GradReducer* reducer_;
  HostCollectives* host_;
  CopyStream* copies_;
  LossScaler scaler_{LossScaler::Options{}};
  std::shared_ptr<const ElementwiseOptimizer> optimizer_;
  std::vector<std::shared_ptr<const ElementwiseOptimizer>> group_optimizers_;  // EngineOptions::param_groups
  std::unique_ptr<LrScheduler> scheduler_;
  int64_t applied_steps_ = 0, skipped_steps_ = 0;
  size_t pipeline_tile_ = 0;
  StagingPair opt_staging_;  // host tier: updated parameters on their way back to the compute tier
  BufferPool refresh_pool_;  // the staging of chunked refreshes (a unit larger than allgather_bucket_size)
  double opt_copy_wait_ms_ = 0, last_copy_busy_ms_ = 0, last_copy_wait_ms_ = 0;
  int64_t last_group_bus_bytes_ = 0, last_replica_bus_bytes_ = 0;  // Communicator::bus_bytes at the last Step
  std::array<int64_t, 2> last_host_bytes_{0, 0};                   // EngineContext::HostBytes at the last Step
  Clock::time_point last_step_end_ = Clock::now();
};

}  // namespace zero::internal
