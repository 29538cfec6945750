// shard/regroup.cc — live recovery's hooks into the engine (zero/elastic.h): another job-wide communicator and
// replica group between steps, and the copy of a healthy replica group's state to the others.
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shard/internal/agree.h"
#include "shard/internal/engine_impl.h"
#include "zero/advanced/communicator_ext.h"
#include "zero/logging.h"

namespace zero {

Status Engine::Impl::Regroup(std::shared_ptr<Communicator> world) {
  ZERO_RETURN_IF_ERROR(CheckCheckpointable("ReplicaGroups: regroup"));
  const int G = ctx.world;
  if (world == nullptr || world->world_size() % G != 0 || world->rank() % G != ctx.rank) {
    return absl::InternalError(absl::StrCat("Regroup: the job-wide communicator (rank ", world ? world->rank() : -1,
                                            " of ", world ? world->world_size() : 0, ") does not hold shard rank ",
                                            ctx.rank, " of a group of ", G));
  }
  // The same config at the new world size: the batch keys and elastic_batch's learning-rate factor follow the
  // world; the accumulation steps are the trainer's loop and cannot change under it.
  Config cfg = ctx.cfg;
  ZERO_RETURN_IF_ERROR(cfg.Validate(world->world_size()));
  if (cfg.accumulation_steps() != ctx.ga()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "live recovery at world size ", world->world_size(), ": gradient_accumulation_steps would be ",
        cfg.accumulation_steps(), ", not ", ctx.ga(),
        " (train_batch_size is kept at every world size); use elastic_batch.policy \"keep_micro\", or give "
        "train_micro_batch_size_per_gpu and gradient_accumulation_steps without train_batch_size"));
  }
  std::shared_ptr<Communicator> replica;
  if (world->world_size() > G) {
    ZERO_ASSIGN_OR_RETURN(replica, world->Split(world->rank() % G, world->rank()));
  }
  ctx.ReplaceJobComms(std::move(world), std::move(replica));
  world_host.set_comm(ctx.world_comm.get());
  ctx.cfg = cfg;
  SetLogRank(ctx.world_rank);
  step.StartCountingBytes();
  // A restarted group must run what the others run: the config and the registration, checked as at Finalize.
  ZERO_RETURN_IF_ERROR(internal::CheckConfigAgrees(world_host, ctx.cfg));
  std::vector<internal::UnitLayout> layouts;
  for (const auto& u : ctx.units) layouts.push_back(u.layout);
  return internal::CheckRegistrationAgrees(world_host, ctx.world_size, layouts);
}

void Engine::Impl::DropJobComms() {
  // Their peers include the lost group's ranks: they close without waiting for them.
  for (Communicator* c : ctx.Comms()) {
    if (c == ctx.comm.get()) continue;
    if (advanced::ExtendedCommunicator* x = advanced::Extended(*c)) x->Abandon();
  }
  ctx.ReplaceJobComms(ctx.comm, nullptr);
  world_host.set_comm(ctx.world_comm.get());
  SetLogRank(ctx.world_rank);
  step.StartCountingBytes();
}

Status Engine::Impl::BroadcastState(int root) {
  ZERO_RETURN_IF_ERROR(CheckCheckpointable("ReplicaGroups: state copy"));
  if (!ctx.hybrid()) return absl::OkStatus();
  if (ctx.compute->device()) {
    return absl::UnimplementedError(
        "live recovery's state copy on the CUDA engine: the host-tier buffers cannot travel over NCCL");
  }
  if (ctx.nvme) {
    return absl::UnimplementedError(
        "live recovery's state copy with zero_optimization.offload_optimizer.device \"nvme\": not implemented (the "
        "state in the NVMe tier's files is not copied); use \"cpu\" or a checkpoint restart");
  }
  if (ctx.param_nvme) {
    return absl::UnimplementedError(
        "live recovery's state copy with zero_optimization.offload_param.device \"nvme\": not implemented (the "
        "parameter shards in the NVMe tier's files are not copied); use \"cpu\" or a checkpoint restart");
  }
  Communicator& rc = *ctx.replica_comm;
  CommLabel label(&rc, "ReplicaGroups: state copy from a healthy replica group");
  // A broadcast is a copy, so the buffers travel as 2-byte words whatever they hold (every buffer is a whole
  // number of 16-bit elements).
  auto copy = [&](Buffer& b) -> Status {
    if (b.empty()) return absl::OkStatus();
    return rc.Broadcast(b.data(), b.size() / 2, DType::kF16, root).Wait();
  };
  for (auto& u : ctx.units) {
    ZERO_RETURN_IF_ERROR(copy(u.params));
    ZERO_RETURN_IF_ERROR(copy(u.master));
    ZERO_RETURN_IF_ERROR(copy(u.host_master));
    for (Buffer& b : u.state) ZERO_RETURN_IF_ERROR(copy(b));
    for (Buffer& b : u.host_state) ZERO_RETURN_IF_ERROR(copy(b));
  }
  // The step's counters (the schedule's position, Adam's bias correction) and the loss scaler.
  const LossScaler::State sc = step.scaler().state();
  int64_t words[6] = {step.applied_steps(), step.skipped_steps(), 0,
                      sc.hysteresis,        sc.iteration,         sc.last_overflow_iteration};
  std::memcpy(&words[2], &sc.scale, sizeof(double));
  ZERO_RETURN_IF_ERROR(rc.Broadcast(words, sizeof(words) / 2, DType::kF16, root).Wait());
  LossScaler::State got = sc;
  std::memcpy(&got.scale, &words[2], sizeof(double));
  got.hysteresis = static_cast<int>(words[3]);
  got.iteration = words[4];
  got.last_overflow_iteration = words[5];
  step.Restore(words[0], words[1], got);
  ctx.applied_steps = words[0];
  return absl::OkStatus();
}

}  // namespace zero
