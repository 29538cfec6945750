// shard/step.cc — the sharded optimizer step (shard/internal/step.h).
#include "shard/internal/step.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/internal/fault.h"
#include "shard/internal/registration.h"
#include "zero/advanced/communicator_ext.h"
#include "zero/logging.h"

namespace zero::internal {

Status ShardedStep::Init() {
  const Config& cfg = ctx_->cfg;
  scaler_ = LossScaler::FromConfig(cfg.fp16);
  if (ctx_->opts.optimizer) {
    optimizer_ = ctx_->opts.optimizer;
  } else if (cfg.optimizer.has_value()) {
    ZERO_ASSIGN_OR_RETURN(auto opt, MakeOptimizer(*cfg.optimizer));
    optimizer_ = std::move(opt);
  } else {
    return absl::InvalidArgumentError(
        "optimizer: the config has no \"optimizer\" section and EngineOptions::optimizer is null; give one");
  }
  ZERO_RETURN_IF_ERROR(MakeGroupOptimizers());
  const double base_lr = cfg.optimizer.has_value() ? cfg.optimizer->lr : 1e-3;
  ZERO_ASSIGN_OR_RETURN(scheduler_, MakeLrScheduler(cfg.scheduler, base_lr));
  return absl::OkStatus();
}

// One optimizer per parameter group: the config's (or the trainer's) with the group's hyperparameters. The built-in
// kernels take their hyperparameters per object, so a group costs nothing per step.
Status ShardedStep::MakeGroupOptimizers() {
  const std::vector<ParamGroup>& groups = ctx_->opts.param_groups;
  group_optimizers_.clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    const ParamGroup& pg = groups[g];
    const bool changes_math = pg.weight_decay || pg.beta1 || pg.beta2 || pg.eps;
    if (const AdamParams* a = BuiltinAdamParams(*optimizer_); a != nullptr && changes_math) {
      AdamParams p = *a;
      p.weight_decay = pg.weight_decay.value_or(p.weight_decay);
      p.beta1 = pg.beta1.value_or(p.beta1);
      p.beta2 = pg.beta2.value_or(p.beta2);
      p.eps = pg.eps.value_or(p.eps);
      group_optimizers_.push_back(MakeAdam(p));
    } else if (const SgdParams* s = BuiltinSgdParams(*optimizer_); s != nullptr && changes_math) {
      if (pg.beta1 || pg.beta2 || pg.eps) {
        return absl::InvalidArgumentError(absl::StrCat("EngineOptions::param_groups[", g, "] (\"", pg.match,
                                                       "\"): betas and eps are Adam's; the optimizer is SGD"));
      }
      SgdParams p = *s;
      p.weight_decay = pg.weight_decay.value_or(p.weight_decay);
      group_optimizers_.push_back(MakeSgd(p));
    } else if (changes_math) {
      return absl::UnimplementedError(
          absl::StrCat("EngineOptions::param_groups[", g, "] (\"", pg.match,
                       "\"): weight_decay, betas and eps per group need the "
                       "built-in Adam/AdamW/SGD; with the trainer's own ElementwiseOptimizer \"",
                       optimizer_->Name(), "\" a group can set lr_scale and frozen only"));
    } else {
      group_optimizers_.push_back(optimizer_);
    }
  }
  return absl::OkStatus();
}

std::vector<ShardedStep::Segment> ShardedStep::Segments(const Unit& u, int64_t first_global, int64_t range) const {
  std::vector<Segment> out;
  auto add = [&out](int64_t b, int64_t e, int g) {
    if (b >= e) return;
    if (!out.empty() && out.back().group == g && out.back().end == b) {
      out.back().end = e;
    } else {
      out.push_back({b, e, g});
    }
  };
  if (ctx_->opts.param_groups.empty()) {
    add(0, range, -1);
    return out;
  }
  // Parameters in registration order tile [0, numel); the padding after them takes the config's optimizer.
  int64_t covered = 0;
  for (size_t i = 0; i < u.layout.params.size(); ++i) {
    const auto& slot = u.layout.params[i];
    const int64_t b = std::max<int64_t>(slot.offset - first_global, 0);
    const int64_t e = std::min<int64_t>(slot.offset + slot.numel - first_global, range);
    if (b < e) add(b, e, u.param_group[i]);
    covered = std::max(covered, e);
  }
  add(std::max<int64_t>(covered, 0), range, -1);
  return out;
}

Status ShardedStep::Allocate(const StagePlan& plan) {
  pipeline_tile_ = plan.pipeline_tile;
  last_step_end_ = Clock::now();
  for (size_t i = 0; i < plan.staging.size(); ++i) {
    Status s;
    opt_staging_.buffers[i] = ctx_->Allocate(plan.staging[i], &s);
    if (!s.ok()) return Status(s.code(), absl::StrCat("offload copy-back staging buffer ", i, ": ", s.message()));
  }
  return absl::OkStatus();
}

Status ShardedStep::CheckReady() const {
  for (const auto& u : ctx_->units) {
    if (u.scope_open) {
      return absl::FailedPreconditionError(absl::StrCat("Step: unit ", u.name(), " still has an open ",
                                                        u.scope_backward ? "backward" : "forward",
                                                        " scope (gradients outstanding); close it first"));
    }
    if (u.frozen) continue;  // no gradient to wait for
    if (u.backward_count != 0 && u.backward_count != ctx_->ga()) {
      return absl::FailedPreconditionError(absl::StrCat("Step: unit ", u.name(), " ran ", u.backward_count,
                                                        " backward passes since the last Step but "
                                                        "gradient_accumulation_steps is ",
                                                        ctx_->ga(), " (gradients outstanding)"));
    }
    if (u.backward_count == 0 && !ctx_->cfg.zero.ignore_unused_parameters) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Step: unit ", u.name(), " received no gradient and zero_optimization.ignore_unused_parameters is false"));
    }
  }
  return absl::OkStatus();
}

Status ShardedStep::Drain() {
  if (ctx_->compute->device()) {
    // The scopes joined collectives with stream waits, which do not notice a dead or hung peer; this host wait
    // does (within comm_timeout_s, aborting the communicator), before anything below synchronizes a stream that
    // would sit behind a hung collective forever. Every communicator the step used has its own stream (hpZ's
    // backward gathers run on the host group's alone, and a step may end without another op on the shard group's
    // behind them), so each is fenced.
    const EngineContext& c = *ctx_;
    for (Communicator* cm : c.Comms()) {
      Work fence = cm->Fence();
      if (Status s = fence.Wait(); !s.ok()) {
        const char* which = cm == c.hpz_comm.get()       ? " on hpZ's host group"
                            : cm == c.replica_comm.get() ? " on the replicas' communicator"
                            : cm == c.qgz_host.get()     ? " on qgZ's communicator inside the host"
                            : cm == c.qgz_across.get()   ? " on qgZ's communicator across hosts"
                            : cm != c.comm.get()         ? " on the world's communicator"
                                                         : "";
        return absl::Status(s.code(),
                            absl::StrCat("Step: waiting for this step's collectives", which, ": ", s.message()));
      }
    }
  }
  ZERO_RETURN_IF_ERROR(reducer_->Drain());
  // Stage 3: release prefetched units nobody opened; adopt this step's order for the next one.
  if (ctx_->stage() == 3) ZERO_RETURN_IF_ERROR(gathers_->EndStep());
  return absl::OkStatus();
}

Status ShardedStep::GradNorm(float red[3]) {
  EngineContext& c = *ctx_;
  double local = 0.0;
  uint64_t local_nonfinite = 0;
  for (auto& u : c.units) {
    if (u.frozen) continue;
    // Stage 0 holds the whole (already averaged) gradient on every rank: each rank sums its shard's range so the
    // all-reduce adds every element exactly once, as at the other stages.
    auto [g, gt] = reducer_->OptGrad(u);
    const int64_t begin = c.stage() == 0 ? static_cast<int64_t>(c.rank) * u.layout.shard : 0;
    const int64_t owned = u.layout.OwnedElems(c.rank);
    const int64_t on_host = std::min(owned, u.host_n());
    // One read-only pass per tier: sum of squares (in double) and the inf/NaN count (zero/mixed_precision.h):
    // the host part here, the compute-tier part through the compute tier (a kernel on a device).
    if (on_host > 0) {
      const GradStatsResult gs = GradStats(u.host_grad.data(), u.grad_shard_dtype(), static_cast<size_t>(on_host));
      local += gs.sumsq;
      local_nonfinite += gs.nonfinite;
    }
    c.compute->AddGradStats(static_cast<const char*>(g) + begin * DTypeSize(gt), gt, owned - on_host);
  }
  const GradStatsResult dev = c.compute->TakeGradStatsSync();
  ZERO_RETURN_IF_ERROR(c.compute->status());
  local += dev.sumsq;
  local_nonfinite += dev.nonfinite;
  red[0] = static_cast<float>(local);
  red[1] = local_nonfinite > 0 ? 1.0f : 0.0f;
  // red[2] is the caller's: whether this rank's all-reduce across replica groups failed (live recovery).
  CommLabel label(c.comm.get(), "Step: gradient norm");
  MaybeInjectFault("step.norm", c.world_rank, applied_steps_);
  return host_->AllReduceSum(red, 3);
}

void ShardedStep::StartCountingBytes() {
  last_group_bus_bytes_ = ctx_->comm->bus_bytes();
  if (ctx_->hybrid()) last_replica_bus_bytes_ = ctx_->replica_comm->bus_bytes();
  last_host_bytes_ = ctx_->HostBytes();
}

Status ShardedStep::ReduceAcrossReplicas() {
  EngineContext& c = *ctx_;
  if (!c.hybrid()) return absl::OkStatus();
  const auto t0 = Clock::now();
  Communicator& rc = *c.replica_comm;
  // The device part [host_n, S) where the optimizer reads it (OptGrad), the host part [0, host_n) in the host
  // tier; padding is zero on every replica, so whole shards are averaged.
  for (auto& u : c.units) {
    if (u.frozen) continue;
    CommLabel label(&rc, absl::StrCat("Step: gradient all-reduce across replicas of unit ", u.name()));
    MaybeInjectFault("step.replicas", c.world_rank, applied_steps_);
    const int64_t S = u.layout.shard, hn = std::min(S, u.host_n());
    if (hn > 0) {
      if (c.compute->device()) {
        return absl::UnimplementedError(
            "zero_optimization.mics_shard_size with offload_optimizer on the CUDA engine: the host part of a "
            "gradient shard cannot be all-reduced over NCCL");
      }
      ZERO_RETURN_IF_ERROR(
          rc.AllReduce(u.host_grad.data(), static_cast<size_t>(hn), u.grad_shard_dtype(), ReduceOp::kAvg).Wait());
    }
    if (S > hn) {
      auto [g, gt] = reducer_->OptGrad(u);
      Work w = rc.AllReduce(g, static_cast<size_t>(S - hn), gt, ReduceOp::kAvg, c.stream());
      ZERO_RETURN_IF_ERROR(c.compute->Join(w));
    }
  }
  c.times.reduce_wait_ms += MsSince(t0);
  return c.compute->status();
}

Status ShardedStep::CheckInSync(const StepOptions& options) {
  EngineContext& c = *ctx_;
  if (c.world == 1) return absl::OkStatus();
  // Where this rank is: its count of Step calls and what the trainer says of this step. A rank that skipped a
  // Step issues the same ops per Step as the others, so the ops alone cannot tell; the trainer's step number
  // (StepOptions::step) or learning rate can, and must be equal on every rank anyway.
  const int64_t call = applied_steps_ + skipped_steps_ + 1;
  const std::string where = absl::StrCat("Step call ", call, ", StepOptions::step ",
                                         options.step ? absl::StrCat(*options.step) : std::string("unset"), ", lr ",
                                         options.lr ? absl::StrCat(*options.lr) : std::string("from the schedule"),
                                         ", lr_scale ", options.lr_scale);
  // The running hash of every op each rank issued, with `where` folded in, compared through a sum: per 4-bit
  // digit d of the hash, the ranks' sum of d and of d² (integers far below 2^24, so f32 sums are exact in any
  // order). All ranks' digits are equal exactly when world · Σd² == (Σd)² (Cauchy-Schwarz), so every rank
  // learns whether the hashes agree from one small all-reduce, whatever the world size.
  // A trainer's own Communicator keeps no op hash (0 on every rank): only the step numbers are then compared.
  const advanced::ExtendedCommunicator* x = advanced::Extended(*c.comm);
  const uint64_t h = (x != nullptr ? x->IssuedOpsHash() : 0) ^ (Fnv1a64(where) * 0x9E3779B97F4A7C15ull);
  float digits[32];
  for (int k = 0; k < 16; ++k) {
    const float d = static_cast<float>((h >> (4 * k)) & 0xF);
    digits[k] = d;
    digits[16 + k] = d * d;
  }
  {
    CommLabel label(c.comm.get(), "Step: desync check");
    ZERO_RETURN_IF_ERROR(host_->AllReduceSum(digits, 32));
  }
  bool agree = true;
  for (int k = 0; k < 16; ++k) {
    agree = agree && static_cast<double>(c.world) * digits[16 + k] == static_cast<double>(digits[k]) * digits[k];
  }
  if (agree) return absl::OkStatus();
  // They do not: every rank knows it. Say what each issued (the last ops; the collectives still line up here).
  std::string mine = absl::StrCat(absl::Hex(h, absl::kZeroPad16), "\n", where);
  for (const std::string& op : c.comm->RecentOps()) absl::StrAppend(&mine, "\n", op);
  ZERO_ASSIGN_OR_RETURN(auto all, host_->AllGatherStrings(mine));
  std::vector<std::vector<std::string>> lines(c.world);
  bool same_step = true;
  for (int r = 0; r < c.world; ++r) {
    lines[r] = absl::StrSplit(all[r], '\n');
    if (lines[r].size() < 2) lines[r].resize(2);
    same_step = same_step && lines[r][1] == lines[0][1];
  }
  std::string msg =
      same_step ? absl::StrCat("Step ", call,
                               ": the ranks issued different collectives since they last agreed (every rank must open "
                               "the same units in the same order and call Step together; a trainer bug such as "
                               "another unit order, a skipped Step or another shape).")
                : absl::StrCat("Step ", call,
                               ": the ranks are not at the same step (a rank skipped or added a Step, or the ranks "
                               "give Step different StepOptions): every rank must call Step together, with the same "
                               "step, lr and lr_scale.");
  absl::StrAppend(&msg, " Each rank's step, issued-ops hash and last ops:");
  for (int r = 0; r < c.world; ++r) {
    absl::StrAppend(&msg, "\n  rank ", r, ": ", lines[r][1], " (hash ", lines[r][0], "):");
    for (size_t i = 2; i < lines[r].size(); ++i) absl::StrAppend(&msg, "\n    ", lines[r][i]);
  }
  return absl::FailedPreconditionError(msg);
}

StatusOr<StepResult> ShardedStep::Run(const StepOptions& options) {
  EngineContext& c = *ctx_;
  ZERO_RETURN_IF_ERROR(CheckReady());
  ZERO_RETURN_IF_ERROR(Drain());
  // Under live recovery a failed all-reduce across replica groups (another group lost a rank) is this shard
  // group's to agree on: the ranks whose all-reduce went through must not apply a step the others cannot. The
  // failure is a third entry of the norm's all-reduce, within the shard group, which is intact.
  const Status replicas = ReduceAcrossReplicas();
  if (!replicas.ok() && !c.live_recovery) return replicas;
  if (!replicas.ok()) {
    // Only this rank's all-reduce may still be running (a timeout): the communicator goes, and with it its
    // thread, before anything touches the gradients it was reducing.
    ZERO_LOG(WARNING) << "step " << applied_steps_ << ": the gradient all-reduce across replica groups failed ("
                      << replicas.message() << "); the shard group drops the step";
    if (advanced::ExtendedCommunicator* x = advanced::Extended(*c.replica_comm)) x->Abandon();
    c.replica_comm.reset();
  }

  const auto t_norm = Clock::now();
  ZERO_RETURN_IF_ERROR(CheckInSync(options));
  float red[3];
  red[2] = replicas.ok() ? 0.0f : 1.0f;
  ZERO_RETURN_IF_ERROR(GradNorm(red));
  if (red[2] != 0.0f) {
    // Nothing was applied on any rank of this group: the step is dropped, as a skipped step is but without
    // counting it or touching the loss scale, and the trainer runs it again once the groups are re-formed.
    reducer_->ZeroGrads();
    c.times = StepTimes{};
    Status lost = absl::AbortedError(absl::StrCat(
        "step ", applied_steps_, ": the gradient all-reduce across replica groups failed on ",
        replicas.ok() ? "another rank of this shard group" : absl::StrCat("this rank: ", replicas.message()),
        "; the step was dropped on every rank of the group (zero/elastic.h: ReplicaGroups::Recover)"));
    lost.SetPayload(kReplicaLostPayload, absl::Cord("1"));
    return lost;
  }
  const bool nonfinite = red[1] != 0.0f || !std::isfinite(red[0]);
  c.times.norm_ms += MsSince(t_norm);
  StepResult result;
  const double scale = scaler_.scale();
  result.loss_scale = scale;
  const double inv = 1.0 / (static_cast<double>(c.ga()) * scale);
  result.grad_norm = nonfinite ? std::numeric_limits<double>::infinity() : std::sqrt(static_cast<double>(red[0])) * inv;
  // elastic_batch: keep_micro at another world than the reference scales the rate by its rule (else 1).
  result.lr =
      options.lr.value_or(scheduler_->LrAt(applied_steps_)) * options.lr_scale * c.cfg.elastic_batch.lr_multiplier;
  // The decision: every rank saw the same all-reduced flag, so every rank's scaler decides alike.
  if (c.cfg.fp16.enabled) {
    ZERO_RETURN_IF_ERROR(scaler_.Update(nonfinite).status());
  } else if (nonfinite && c.cfg.bf16.enabled && c.cfg.bf16.nonfinite_grads == NonFinitePolicy::kError) {
    return absl::DataLossError(absl::StrCat("step ", applied_steps_,
                                            ": non-finite gradients on some rank (bf16.nonfinite_grads is \"error\")"));
  }
  if (nonfinite) {
    ++skipped_steps_;
    ZERO_LOG(WARNING) << "step " << applied_steps_ << ": non-finite gradients on some rank; step skipped ("
                      << skipped_steps_ << " skipped so far"
                      << (c.cfg.fp16.enabled ? absl::StrCat(", loss scale now ", scaler_.scale()) : std::string())
                      << ")";
    result.skipped = true;
  } else {
    double coef = 1.0;
    if (c.cfg.gradient_clipping > 0 && result.grad_norm > c.cfg.gradient_clipping) {
      coef = c.cfg.gradient_clipping / (result.grad_norm + 1e-6);
    }
    ZERO_RETURN_IF_ERROR(ApplyOptimizer(static_cast<float>(coef * inv), result.lr));
    ++applied_steps_;
    ctx_->applied_steps = applied_steps_;
  }
  reducer_->ZeroGrads();
  result.step = applied_steps_;
  const int64_t group_bytes = c.comm->bus_bytes();
  result.shard_group_bus_bytes = group_bytes - std::exchange(last_group_bus_bytes_, group_bytes);
  if (c.hybrid()) {
    const int64_t replica_bytes = c.replica_comm->bus_bytes();
    result.replica_bus_bytes = replica_bytes - std::exchange(last_replica_bus_bytes_, replica_bytes);
  }
  const std::array<int64_t, 2> host_bytes = c.HostBytes();
  result.intra_host_bytes = host_bytes[0] - last_host_bytes_[0];
  result.inter_host_bytes = host_bytes[1] - last_host_bytes_[1];
  last_host_bytes_ = host_bytes;
  FinishTimes(result);
  ZERO_RETURN_IF_ERROR(c.compute->status());
  MaybeLog(result);
  c.times = StepTimes{};
  last_step_end_ = Clock::now();
  return result;
}

void ShardedStep::FinishTimes(StepResult& result) {
  StepTimes& t = ctx_->times;
  const double busy = copies_->busy_ms(), waited = copies_->wait_ms();
  t.offload_copy_ms = busy - last_copy_busy_ms_;
  t.offload_wait_ms = waited - last_copy_wait_ms_;
  last_copy_busy_ms_ = busy;
  last_copy_wait_ms_ = waited;
  t.total_ms = MsSince(last_step_end_);
  // The optimizer's own waits for a staging buffer are inside optimizer_ms already.
  const double outside_opt_wait = std::max(0.0, t.offload_wait_ms - opt_copy_wait_ms_);
  t.compute_ms = std::max(0.0, t.total_ms - t.gather_wait_ms - t.reduce_wait_ms - t.norm_ms - t.optimizer_ms -
                                   t.allgather_ms - outside_opt_wait);
  opt_copy_wait_ms_ = 0;
  result.times = t;
}

Status ShardedStep::ApplyOptimizer(float grad_scale, double lr) {
  EngineContext& c = *ctx_;
  MaybeInjectFault("step.optimizer", c.world_rank, applied_steps_);
  const int stage = c.stage(), rank = c.rank;
  const DType cd = c.cd();
  std::vector<UnitCollective> gathers;
  size_t chunked = SIZE_MAX;  // the chunked refresh in `gathers` that may be in flight (one at a time)
  Status failed;              // the first refresh that failed
  const size_t cds = DTypeSize(cd);
  const bool stochastic = cd == DType::kBF16 && c.cfg.bf16.stochastic_rounding;
  const size_t opt_tile = static_cast<size_t>(std::max<int64_t>(c.cfg.zero.sub_group_size, 1));
  const auto t_opt = Clock::now();
  const double wait_before = copies_->wait_ms();
  // Stages 1-2 all-gather each unit's updated slice once it is back in the compute tier. With offload the gather
  // of unit k is issued after unit k+1's host step, so unit k's last copy runs during that step instead of being
  // waited for at once (units keep their order, so every rank issues the same sequence).
  int deferred_unit = -1;
  CopyStream::Ticket deferred_copy = 0;
  // The NVMe tier: one pass over the host parts of every unit with one, in unit order, so the disk reads the next
  // unit's first chunks while this unit's last ones are updated (offload/nvme_store.h). A failed read or write ends
  // the host steps (the step's all-gathers still run, every rank issuing the same ones) and fails the step.
  Status nvme_failed;
  if (c.nvme) {
    std::vector<int> on_disk;
    for (size_t ui = 0; ui < c.units.size(); ++ui) {
      if (!c.units[ui].frozen && c.units[ui].host_n() > 0) on_disk.push_back(static_cast<int>(ui));
    }
    nvme_failed = c.nvme->BeginPass(on_disk);
  }
  auto issue_deferred_gather = [&] {
    if (deferred_unit < 0) return;
    Unit& d = c.units[deferred_unit];
    const int64_t dS = d.layout.shard;
    char* slice = static_cast<char*>(d.params.data()) + static_cast<int64_t>(rank) * dS * cds;
    copies_->Wait(deferred_copy);  // this rank's updated slice is back in the compute tier
    CommLabel label(c.comm.get(), absl::StrCat("Step: parameter refresh of unit ", d.name()));
    MaybeInjectFault("step.refresh", c.world_rank, applied_steps_);
    const int64_t chunk = ChunkPerRank(d.layout.padded, c.world, c.cfg.zero.allgather_bucket_size);
    if (chunk == 0) {
      gathers.emplace_back(ctx_, c.comm->AllGather(slice, d.params.data(), dS, cd, c.stream()));  // in place
    } else {
      if (chunked != SIZE_MAX) {  // its staging is this one's
        Status s = gathers[chunked].Join();
        if (!s.ok() && failed.ok()) failed = s;
        gathers[chunked].ReleaseStaging();
      }
      chunked = gathers.size();
      gathers.push_back(UnitCollective::AllGather(ctx_, &refresh_pool_, slice, d.params.data(), dS, chunk, cd));
    }
    deferred_unit = -1;
  };
  // offload_param "nvme": each sharded unit's shard is read into a staging buffer of the parameter tier (only in
  // fp32, where it is the master: under mixed precision the update writes all of it from the master), updated
  // there as under offload_param "cpu", and written back. A failed read or write fails the step (the update still
  // runs, on zeros, so that the optimizer tier's pass stays in order; a shard that failed is not written back).
  Status param_failed;
  for (size_t ui = 0; ui < c.units.size(); ++ui) {
    Unit& u = c.units[ui];
    if (u.frozen) continue;  // nothing to update, nothing to refresh
    ParamStage staged(c, u, static_cast<int>(ui));
    bool commit = ParamStage::InTier(c, u);
    if (commit) {
      if (Status s = staged.Begin(/*read=*/!c.mixed(), /*in_step=*/true); !s.ok()) {
        if (param_failed.ok())
          param_failed = Status(s.code(), absl::StrCat("reading unit ", u.name(), "'s shard: ", s.message()));
        commit = false;
        ZERO_RETURN_IF_ERROR(staged.Begin(/*read=*/false, /*in_step=*/true));
        std::memset(u.params.data(), 0, u.params.size());
      }
    }
    const int64_t S = u.layout.shard;
    const int64_t offset = stage == 0 || u.sharded_params() ? 0 : static_cast<int64_t>(rank) * S;
    char* param_here = static_cast<char*>(u.params.data()) + offset * cds;  // this rank's part, compute dtype
    // Counter-based randomness keyed by (seed, step, unit, global element): reproducible at any world size.
    const uint64_t key = c.cfg.seed ^ (static_cast<uint64_t>(applied_steps_ + 1) * 0x9E3779B97F4A7C15ull) ^
                         (static_cast<uint64_t>(ui) << 40);
    const int64_t first_global = stage == 0 ? 0 : static_cast<int64_t>(rank) * S;
    const int64_t range = stage == 0 ? u.layout.padded : S;
    const int64_t hn = u.host_n(), n_dev = range - hn;
    const std::vector<Segment> segments = Segments(u, first_global, range);
    ShardUpdate base;
    base.grad_scale = grad_scale;
    base.step = applied_steps_ + 1;
    base.lr = lr;
    base.param_out_dtype = cd;
    base.unit = static_cast<int>(ui);
    // The device part [host_n, range): the optimizer over compute-tier buffers (all of it without offload).
    if (n_dev > 0) {
      ShardUpdate up = base;
      char* params_dev = param_here + hn * cds;
      std::vector<float*> states;
      for (auto& b : u.state) states.push_back(b.as<float>());
      up.state = states.data();
      std::tie(up.grad, up.grad_dtype) = reducer_->OptGrad(u);
      up.n = n_dev;
      up.first_element = first_global + hn;
      if (c.mixed()) {
        up.master = u.master.as<float>();
        up.param_out = stochastic ? nullptr : params_dev;  // fused 16-bit write-back (round to nearest even)
      } else {
        up.master = reinterpret_cast<float*>(params_dev);  // fp32: the parameters are the master
      }
      // One update per parameter-group segment of [host_n, range) (the whole part without groups).
      for (const Segment& seg : segments) {
        const int64_t b = std::max(seg.begin, hn), e = seg.end;
        if (b >= e) continue;
        std::vector<float*> part_states(states.size());
        ShardUpdate part = up.Slice(b - hn, e - b, states.size(), part_states.data());
        part.lr = lr * LrScaleOf(seg.group);
        part.group = seg.group;
        c.compute->Update(OptimizerOf(seg.group), part, c.threads, opt_tile);
      }
      if (stochastic) {
        c.compute->StochasticRound(up.master, reinterpret_cast<uint16_t*>(params_dev), up.n, key, first_global + hn);
      }
    }
    // The host part [0, host_n): the optimizer over host-tier buffers, the updated parameters streamed back to
    // the compute tier tile by tile (offload/host_step.h).
    CopyStream::Ticket copied = 0;
    if (hn > 0 && c.nvme) {
      copied = NvmeHostStep(u, static_cast<int>(ui), base, segments, param_here, first_global, key, &nvme_failed);
    } else if (hn > 0) {
      HostStep hs;
      hs.u = base;
      std::vector<float*> states;
      for (auto& b : u.host_state) states.push_back(b.as<float>());
      hs.u.state = states.data();
      hs.u.grad = u.host_grad.data();
      hs.u.grad_dtype = u.grad_shard_dtype();
      hs.u.n = hn;
      hs.u.first_element = first_global;
      if (c.policy.MasterIsHostParams()) {
        hs.u.master = reinterpret_cast<float*>(param_here);  // fp32 host shard: the parameters are the master
      } else {
        hs.u.master = u.host_master.as<float>();
        hs.u.param_out_dtype = cd;  // f32 when computing in fp32: a plain copy of the updated master
        if (c.policy.offload_param) {
          hs.param_host = param_here;  // the parameters live on the host: written in place, nothing to copy
        } else {
          hs.u.param_out = param_here;
        }
      }
      if (c.compute->device()) {
        hs.copy_to_compute = [t = c.compute.get()](void* d, const void* src, size_t b) {
          t->CopyInOnCopyStream(d, src, b);
        };
      }
      hs.threads = c.threads;
      hs.optimizer_tile = opt_tile;
      hs.pipeline_tile = pipeline_tile_;
      hs.stochastic = stochastic;
      hs.stochastic_key = key;
      // One host step per parameter-group segment of [0, host_n) (the whole part without groups).
      for (const Segment& seg : segments) {
        const int64_t b = seg.begin, e = std::min(seg.end, hn);
        if (b >= e) continue;
        HostStep part = hs;
        std::vector<float*> part_states(states.size());
        part.u = hs.u.Slice(b, e - b, states.size(), part_states.data());
        if (hs.param_host != nullptr) part.param_host = static_cast<char*>(hs.param_host) + b * cds;
        part.u.lr = lr * LrScaleOf(seg.group);
        part.u.group = seg.group;
        copied = RunHostStep(OptimizerOf(seg.group), part, *copies_, opt_staging_);
      }
    }
    if (commit) {
      copies_->Wait(copied);  // (nothing is copied back with offload_param: the update wrote the slot in place)
      if (Status s = staged.Commit(); !s.ok() && param_failed.ok()) param_failed = s;
    }
    if (stage >= 1 && !u.sharded_params()) {
      issue_deferred_gather();  // the previous unit's
      deferred_unit = static_cast<int>(ui);
      deferred_copy = copied;
      if (copied == 0) issue_deferred_gather();  // nothing to wait for: refresh at once
    }
  }
  issue_deferred_gather();
  if (c.nvme) {
    const Status ended = c.nvme->EndPass();
    if (nvme_failed.ok()) nvme_failed = ended;
  }
  copies_->Sync();  // stage 3: the next forward's gathers read the copied-back shards
  opt_copy_wait_ms_ += copies_->wait_ms() - wait_before;
  c.times.optimizer_ms += MsSince(t_opt);
  const auto t_ag = Clock::now();
  for (auto& g : gathers) {
    Status s = g.Join();
    g.ReleaseStaging();
    if (!s.ok() && failed.ok()) failed = s;
  }
  if (!failed.ok()) {
    return absl::Status(failed.code(), absl::StrCat("all-gather of updated parameters: ", failed.message()));
  }
  if (!nvme_failed.ok()) {
    return absl::Status(nvme_failed.code(), absl::StrCat("step ", applied_steps_ + 1,
                                                         ": the NVMe tier (zero_optimization.offload_optimizer."
                                                         "nvme_path): ",
                                                         nvme_failed.message()));
  }
  if (!param_failed.ok()) {
    return absl::Status(param_failed.code(),
                        absl::StrCat("step ", applied_steps_ + 1, " on rank ", c.world_rank,
                                     ": the NVMe parameter tier (zero_optimization.offload_param.nvme_path): ",
                                     param_failed.message()));
  }
  c.times.allgather_ms += MsSince(t_ag);
  return absl::OkStatus();
}

// The host part of unit `ui` under the NVMe tier: chunk by chunk as the store's pass hands them over (their master
// and state read into a staging buffer), the same host step as with CPU offload on each (so the same bits: the
// update is element-wise and keyed by global element), then the chunk written back.
CopyStream::Ticket ShardedStep::NvmeHostStep(Unit& u, int ui, const ShardUpdate& base,
                                             const std::vector<Segment>& segments, char* param_here,
                                             int64_t first_global, uint64_t key, Status* failed) {
  EngineContext& c = *ctx_;
  const DType cd = c.cd();
  const size_t cds = DTypeSize(cd), gsz = DTypeSize(u.grad_shard_dtype());
  const size_t nst = static_cast<size_t>(c.policy.optimizer_states);
  const bool own_master = !c.policy.MasterIsHostParams();
  const int64_t hn = u.host_n();
  CopyStream::Ticket copied = 0;
  for (int64_t cb = 0; cb < hn && failed->ok(); cb += c.nvme->chunk_elems()) {
    StatusOr<NvmeStore::Chunk> chunk = c.nvme->Acquire();
    if (!chunk.ok()) {
      *failed = chunk.status();
      break;
    }
    ZERO_CHECK(chunk->unit == ui && chunk->begin == cb) << "NVMe pass out of order at unit " << u.name();
    const int64_t ce = cb + chunk->n;
    // The update of [cb, ce), its master and state in the chunk's staging buffer.
    HostStep hs;
    hs.u = base;
    std::vector<float*> states(nst);
    for (size_t k = 0; k < nst; ++k) states[k] = chunk->field[(own_master ? 1 : 0) + k];
    hs.u.state = states.data();
    hs.u.grad = static_cast<const char*>(u.host_grad.data()) + cb * gsz;
    hs.u.grad_dtype = u.grad_shard_dtype();
    hs.u.n = static_cast<size_t>(chunk->n);
    hs.u.first_element = first_global + cb;
    if (!own_master) {
      hs.u.master = reinterpret_cast<float*>(param_here) + cb;  // fp32 host shard: the parameters are the master
    } else {
      hs.u.master = chunk->field[0];
      hs.u.param_out_dtype = cd;
      if (c.policy.offload_param) {
        hs.param_host = param_here + cb * cds;
      } else {
        hs.u.param_out = param_here + cb * cds;
      }
    }
    if (c.compute->device()) {
      hs.copy_to_compute = [t = c.compute.get()](void* d, const void* src, size_t b) {
        t->CopyInOnCopyStream(d, src, b);
      };
    }
    hs.threads = c.threads;
    hs.optimizer_tile = static_cast<size_t>(std::max<int64_t>(c.cfg.zero.sub_group_size, 1));
    hs.pipeline_tile = pipeline_tile_;
    hs.stochastic = cd == DType::kBF16 && c.cfg.bf16.stochastic_rounding;
    hs.stochastic_key = key;
    for (const Segment& seg : segments) {
      const int64_t b = std::max(seg.begin, cb), e = std::min({seg.end, hn, ce});
      if (b >= e) continue;
      HostStep part = hs;
      std::vector<float*> part_states(nst);
      part.u = hs.u.Slice(static_cast<size_t>(b - cb), static_cast<size_t>(e - b), nst, part_states.data());
      if (hs.param_host != nullptr) part.param_host = static_cast<char*>(hs.param_host) + (b - cb) * cds;
      part.u.lr = base.lr * LrScaleOf(seg.group);
      part.u.group = seg.group;
      copied = RunHostStep(OptimizerOf(seg.group), part, *copies_, opt_staging_);
    }
    if (Status s = c.nvme->Release(); !s.ok()) *failed = s;
  }
  return copied;
}

// steps_per_print: a progress line from rank 0; with wall_clock_breakdown, where the time went.
void ShardedStep::MaybeLog(const StepResult& r) const {
  const Config& cfg = ctx_->cfg;
  const int64_t every = cfg.steps_per_print.value_or(0);
  const int64_t n = applied_steps_ + skipped_steps_;
  if (ctx_->world_rank != 0 || every <= 0 || n % every != 0) return;
  std::string line = absl::StrCat("step ", n, ": lr ", r.lr, ", grad_norm ", r.grad_norm, ", loss_scale ", r.loss_scale,
                                  ", skipped ", skipped_steps_);
  if (cfg.wall_clock_breakdown) {
    const StepTimes& t = r.times;
    absl::StrAppend(&line, " | ms: total ", t.total_ms, ", compute ", t.compute_ms, ", gather_wait ", t.gather_wait_ms,
                    ", reduce_wait ", t.reduce_wait_ms, ", norm ", t.norm_ms, ", optimizer ", t.optimizer_ms,
                    ", allgather ", t.allgather_ms);
    if (ctx_->policy.offload_optimizer || ctx_->policy.offload_param) {
      absl::StrAppend(&line, " | offload ms: copy stream busy ", t.offload_copy_ms, " (overlapped), waited ",
                      t.offload_wait_ms);
    }
  }
  ZERO_LOG(INFO) << line;
}

}  // namespace zero::internal
