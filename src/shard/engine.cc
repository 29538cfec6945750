// shard/engine.cc — the Engine facade: creation, registration, Finalize's placement, scopes, views, reports.
//
// The engine is a handful of components over one shared context (shard/internal/context.h):
//   plan.h          the placement plan: stage × precision × offload → this rank's buffers per unit (pure)
//   unit.h          a unit: layout, buffers, state machine, views
//   registration.h  host-array collectives; every rank registered the same units
//   gather.h        stage-3 gathers, release and prefetch by the recorded order
//   grad_reducer.h  gradient buffers, the reduction queue, where results land (offload's copy stream included)
//   step.h          norm, skip/clip, the optimizer on the shards (compute and host tier), parameter refresh
//   values.cc       values in and out: initial values, CopyIn, GatherParam
// This file wires them to the public API (zero/engine.h); docs/internals/design.md describes the whole.
#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/internal/convert_simd.h"
#include "core/internal/fault.h"
#include "shard/internal/agree.h"
#include "shard/internal/engine_impl.h"
#include "zero/advanced/communicator_ext.h"
#include "zero/advanced/engine_stats.h"
#include "zero/logging.h"

namespace zero {

using internal::Unit;
using internal::UnitStatus;

namespace {

// Ranks per host (EngineOptions::local_world_size): the option, else what the launcher says (LOCAL_WORLD_SIZE,
// OMPI_COMM_WORLD_LOCAL_SIZE, Slurm's tasks on this node: Communicator::LaunchedLocalWorldSize), else 1.
int RanksPerHost(const EngineOptions& o) {
  if (o.local_world_size > 0) return o.local_world_size;
  const int n = Communicator::LaunchedLocalWorldSize();
  return n > 0 ? n : 1;
}

}  // namespace

Engine::Impl::Impl(const Config& cfg, std::shared_ptr<Communicator> comm, std::shared_ptr<Communicator> shard,
                   std::shared_ptr<Communicator> replica, EngineOptions opts, std::shared_ptr<Communicator> hpz,
                   std::shared_ptr<Communicator> qgz_host, std::shared_ptr<Communicator> qgz_across)
    : ctx(cfg, std::move(comm), std::move(shard), std::move(replica), std::move(opts), std::move(hpz),
          std::move(qgz_host), std::move(qgz_across)),
      host(ctx.comm.get(), ctx.compute),
      world_host(ctx.world_comm.get(), ctx.compute),
      gathers(&ctx),
      reducer(&ctx, &copies),
      step(&ctx, &gathers, &reducer, &host, &copies) {}

Status Engine::Impl::Init() {
  ctx.compute = internal::MakeGlooEngineCompute(&ctx.tracker);
  ZERO_ASSIGN_OR_RETURN(ctx.policy, internal::PlanPolicy::FromConfig(ctx.cfg, ctx.world, ctx.rank));
  ctx.ranks_per_host = RanksPerHost(ctx.opts);
  if (ctx.policy.offload_optimizer || ctx.policy.offload_param) {
    ZERO_LOG_ONCE(INFO) << "offload to cpu on the host (Gloo) engine: the compute tier is host memory too, so the "
                           "copy stream's copies are memcpys; the tiers are kept and reported apart";
  }
  if (ctx.comm->backend() == Backend::kNccl) ZERO_RETURN_IF_ERROR(InitDevice());
  if (ctx.policy.qgz_bits > 0) {
    const advanced::ExtendedCommunicator* x = advanced::Extended(*ctx.qgz_intra());
    if (x == nullptr || !x->SupportsAllToAll()) {
      return absl::UnimplementedError(absl::StrCat(
          "zero_optimization.zero_quantized_gradients: the communicator of rank ", ctx.world_rank,
          " has no all-to-all (advanced::ExtendedCommunicator::SupportsAllToAll), which the quantized reduction "
          "moves its records with"));
    }
    ctx.policy.qgz_local = ctx.qgz_host != nullptr ? ctx.qgz_host->world_size() : ctx.world;
    const int per_host = ctx.ranks_per_host;
    ZERO_LOG_ONCE(INFO) << "zero_quantized_gradients: int" << ctx.policy.qgz_bits << " blocks of "
                        << ctx.policy.qgz_block << ", "
                        << (ctx.qgz_host != nullptr
                                ? absl::StrCat("two hops (inside each host of ", ctx.policy.qgz_local,
                                               " ranks, then across ", ctx.world / ctx.policy.qgz_local, " hosts)")
                                : absl::StrCat("one hop over ", ctx.world, " ranks",
                                               ctx.hybrid() ? " (the shard group of mics_shard_size)"
                                               : per_host > 1 && ctx.world % per_host != 0
                                                   ? absl::StrCat(" (they are not whole hosts of ", per_host, " ranks)")
                                                   : ""))
                        << ", LoCo error feedback "
                        << (ctx.policy.qgz_loco
                                ? absl::StrCat("on (err_beta ", ctx.policy.loco_beta, ", reset_T ",
                                               ctx.policy.loco_reset,
                                               ctx.policy.qgz_loco_int8 ? ", residuals in int8 blocks" : "", ")")
                                : std::string("off"));
  }
  ZERO_RETURN_IF_ERROR(internal::CheckConfigAgrees(world_host, ctx.cfg));
  // The config (the same on every rank, checked above) decides whether every rank checks the hosts or none does.
  const bool hpz = ctx.policy.hpz > 1;
  const bool qgz = ctx.policy.qgz_bits > 0 && !ctx.hybrid();
  // Hybrid shard groups of one rank (mics_shard_size 1: plain data parallelism) cannot span hosts.
  const bool hybrid = ctx.hybrid() && ctx.cfg.zero.mics_shard_size > 1;
  if (hpz || qgz || hybrid) {
    std::vector<internal::HostPlace> places;
    const internal::MachineId machine = internal::ThisHost(internal::ProcessEnv());
    ZERO_RETURN_IF_ERROR(internal::CheckHostLayoutAgrees(
        world_host,
        internal::LaunchedHostPlace(*ctx.world_comm, ctx.opts.local_world_size, ctx.ranks_per_host, machine), hpz, qgz,
        hybrid, &places));
    // Shard groups that straddle hosts work, and so do host groups whose ranks run on different machines: both
    // are said, not refused.
    if (hybrid && ctx.world_rank == 0) {
      const std::string straddle = internal::HybridStraddleWarning(places, ctx.cfg.zero.mics_shard_size);
      if (!straddle.empty()) {
        ZERO_LOG(WARNING) << straddle;
      }
    }
    ZERO_ASSIGN_OR_RETURN(const std::string across,
                          internal::MachinesWarning(world_host, places, ctx.policy.hpz, qgz,
                                                    hybrid ? ctx.cfg.zero.mics_shard_size : 0, machine));
    if (!across.empty() && ctx.world_rank == 0) {
      ZERO_LOG(WARNING) << across;
    }
  }
  ZERO_RETURN_IF_ERROR(step.Init());
  ctx.policy.optimizer_states = static_cast<int>(step.optimizer().StateNames().size());
  // The host's cores are shared by its ranks: each rank's optimizer takes its share (the update is element-wise
  // in tiles, so the thread count moves no bit).
  ctx.threads = ctx.opts.cpu_threads > 0
                    ? ctx.opts.cpu_threads
                    : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ctx.ranks_per_host);
  SetLogRank(ctx.world_rank);
  const ElementwiseOptimizer& opt = step.optimizer();
  if (ctx.compute->device() && BuiltinAdamParams(opt) == nullptr && BuiltinSgdParams(opt) == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "EngineOptions::optimizer \"", opt.Name(),
        "\" with an NCCL communicator: a trainer's own "
        "ElementwiseOptimizer updates host memory; the CUDA engine runs the built-in Adam/AdamW/SGD (give the "
        "config's \"optimizer\" section instead)"));
  }
  return absl::OkStatus();
}

// The CUDA engine: an NCCL communicator computes in device memory on the trainer's stream.
Status Engine::Impl::InitDevice() {
  int device = ctx.opts.cuda_device;
  const int comm_device = ctx.comm->cuda_device();
  if (device < 0) {
    device = comm_device;
  } else if (comm_device >= 0 && device != comm_device) {
    return absl::InvalidArgumentError(absl::StrCat("EngineOptions::cuda_device ", device,
                                                   " differs from the NCCL communicator's device ", comm_device));
  }
  ZERO_ASSIGN_OR_RETURN(ctx.compute, internal::MakeCudaCompute(&ctx.tracker, device, ctx.opts.cuda_stream));
  return absl::OkStatus();
}

StatusOr<UnitId> Engine::Impl::AddUnit(const std::string& name, std::vector<ParamSpec> params) {
  if (ctx.finalized) {
    return absl::FailedPreconditionError(absl::StrCat("AddUnit(\"", name, "\"): the engine is already finalized"));
  }
  if (name.empty()) return absl::InvalidArgumentError("AddUnit: unit name is empty");
  if (FindUnit(name) >= 0) return absl::InvalidArgumentError(absl::StrCat("AddUnit: unit \"", name, "\" exists"));
  Unit u;
  ZERO_ASSIGN_OR_RETURN(u.layout, internal::BuildUnitLayout(name, params));
  u.specs = std::move(params);
  ctx.units.push_back(std::move(u));
  return static_cast<UnitId>(ctx.units.size() - 1);
}

UnitId Engine::Impl::FindUnit(const std::string& name) const {
  for (size_t i = 0; i < ctx.units.size(); ++i) {
    if (ctx.units[i].name() == name) return static_cast<UnitId>(i);
  }
  return -1;
}

internal::StagePlan Engine::Impl::Plan() const {
  std::vector<int64_t> numels;
  std::vector<bool> trainer_owned, frozen;
  std::vector<std::vector<internal::ExactParam>> params;
  for (const auto& u : ctx.units) {
    numels.push_back(u.layout.numel);
    trainer_owned.push_back(u.trainer_params != nullptr);
    frozen.push_back(u.frozen);
    params.push_back(internal::ExactParams(u.specs));
  }
  return internal::MakePlan(ctx.policy, numels, trainer_owned, frozen, params);
}

Status Engine::Impl::Finalize(const ParamInit& init) {
  if (ctx.finalized) return absl::FailedPreconditionError("Finalize: already finalized");
  if (ctx.units.empty()) return absl::FailedPreconditionError("Finalize: no units registered");
  std::vector<internal::UnitLayout> layouts;
  for (const auto& u : ctx.units) layouts.push_back(u.layout);
  internal::MaybeInjectFault("finalize", ctx.world_rank, 0);
  ZERO_RETURN_IF_ERROR(internal::CheckRegistrationAgrees(world_host, ctx.world_size, layouts));
  ZERO_RETURN_IF_ERROR(ResolveGroups());
  ZERO_RETURN_IF_ERROR(CheckTrainerGrads());
  // Allocate exactly what the plan lists (shard/internal/plan.h). A buffer that cannot be had (the allocator's
  // failure, or the tracker's budget) ends Finalize on every rank: the ranks agree on the outcome, so the others
  // do not go on into the initial values' collectives and wait there for this one until the timeout.
  const internal::StagePlan plan = Plan();
  ctx.policy = plan.policy;  // with the caps that keep the saving at any bucket size (ApplySavingCaps)
  ctx.qgz_scratch_bytes = internal::QgzScratchBytes(plan.policy, plan.units);
  if (ctx.policy.qgz_bits > 0 || ctx.policy.qwz_block > 0) {  // what they send exact (internal::ExactSpans), once
    int64_t exact = 0, most = 0;
    int with = 0;
    for (const internal::UnitPlan& up : plan.units) {
      int64_t n = 0;
      for (const auto& shard : up.exact_spans) {
        for (const internal::ExactSpan& sp : shard) n += sp.end - sp.begin;
      }
      exact += n;
      with += n > 0 ? 1 : 0;
      most = std::max(most, up.exact_max);
    }
    if (exact > 0) {
      ZERO_LOG_ONCE(INFO) << (ctx.policy.qgz_bits > 0 ? "zero_quantized_gradients" : "")
                          << (ctx.policy.qgz_bits > 0 && ctx.policy.qwz_block > 0 ? ", " : "")
                          << (ctx.policy.qwz_block > 0 ? "zero_quantized_weights" : "") << ": " << exact
                          << " elements of 1-D parameters (biases, norm gains) in " << with
                          << " units are sent exact beside the quantized blocks, as DeepSpeed's qgZ reduces 1-D "
                          << "tensors (at most " << most << " per shard)";
    }
  }
  if (ctx.policy.qgz_loco) {
    // LoCo's residuals are each rank's whole gradient again, not a shard: at scale the largest model-state term, so
    // the log says what they take and how to drop them.
    int64_t residual = 0;
    for (const internal::UnitPlan& up : plan.units) {
      for (const internal::PlannedBuffer& b : up.buffers) {
        if (b.role == internal::BufferRole::kQgzResidual || b.role == internal::BufferRole::kQgzHostResidual) {
          residual += b.bytes();
        }
      }
    }
    if (residual > 0) {
      ZERO_LOG_ONCE(INFO) << "zero_quantized_gradients: LoCo's error-feedback residuals take " << residual
                          << " bytes per rank (the whole gradient this rank sends, "
                          << (ctx.policy.qgz_loco_int8 ? "as int8 blocks" : "in the compute dtype")
                          << ", and with two hops its host partials'); zero_quantized_gradients_error_feedback false "
                          << "drops them"
                          << (ctx.policy.qgz_loco_int8 ? ""
                                                       : ", zero_quantized_gradients_error_feedback_dtype \"int8\" "
                                                         "keeps them in about 1 byte per element");
    }
  }
  Status allocated = [&]() -> Status {
    for (size_t i = 0; i < ctx.units.size(); ++i) {
      Unit& u = ctx.units[i];
      u.plan = plan.units[i];
      u.layout.padded = u.plan.padded;
      u.layout.shard = u.plan.shard;
      num_params_ += u.layout.numel;
      u.state.resize(ctx.policy.optimizer_states);
      for (const internal::PlannedBuffer& b : u.plan.buffers) {
        Buffer buf;
        if (b.tier == MemTier::kNvme) {
          // A region of the NVMe tier's file (the store, created below), counted where it lives.
          ctx.tracker.Add(MemTier::kNvme, b.tag, b.bytes());
          ctx.tracker.AddPadding(b.padding_elems * static_cast<int64_t>(DTypeSize(b.dtype)));
          continue;
        }
        if (b.trainer_owned) {
          void* mine = b.role == internal::BufferRole::kParams ? u.trainer_params : u.trainer_grads;
          buf = Buffer::Borrow(mine, static_cast<size_t>(b.bytes()), b.tag, b.tier);
        } else {
          Status s;
          buf = ctx.Allocate(b, &s);
          if (!s.ok()) {
            return Status(s.code(), absl::StrCat("Finalize on rank ", ctx.world_rank, ": unit ", u.name(), " (", i + 1,
                                                 " of ", ctx.units.size(), "), its ", internal::BufferRoleName(b.role),
                                                 " (", b.bytes(), " bytes): ", s.message()));
          }
          ctx.tracker.AddPadding(b.padding_elems * static_cast<int64_t>(DTypeSize(b.dtype)));
        }
        using R = internal::BufferRole;
        switch (b.role) {
          case R::kParams: u.params = std::move(buf); break;
          case R::kFullGrads: u.full_grads = std::move(buf); break;
          case R::kAccumFull: u.accum_full = std::move(buf); break;
          case R::kGradShard: u.grad_shard = std::move(buf); break;
          case R::kHostGrad: u.host_grad = std::move(buf); break;
          case R::kHostMaster: u.host_master = std::move(buf); break;
          case R::kMaster: u.master = std::move(buf); break;
          case R::kState: u.state[b.state_index] = std::move(buf); break;
          case R::kHostState: u.host_state.push_back(std::move(buf)); break;
          case R::kHpzSecondary: u.hpz_secondary = std::move(buf); break;
          case R::kQgzResidual:  // the residuals start at zero
            u.qgz_residual = std::move(buf);
            ctx.compute->Zero(u.qgz_residual.data(), u.qgz_residual.size());
            break;
          case R::kQgzHostResidual:
            u.qgz_host_residual = std::move(buf);
            ctx.compute->Zero(u.qgz_host_residual.data(), u.qgz_host_residual.size());
            break;
        }
      }
      u.status = u.sharded_params() ? UnitStatus::kNotAvailable : UnitStatus::kAvailable;
    }
    if (plan.nvme_chunk > 0) ZERO_RETURN_IF_ERROR(CreateNvmeStore(plan));
    if (plan.param_slot_elems > 0) ZERO_RETURN_IF_ERROR(CreateNvmeParamTier(plan));
    if (Status s = step.Allocate(plan); !s.ok()) {
      return Status(s.code(), absl::StrCat("Finalize on rank ", ctx.world_rank, ": ", s.message()));
    }
    return ctx.compute->status();
  }();
  ZERO_RETURN_IF_ERROR(AgreeOnStatus(allocated, "Finalize").status());
  LogUnshardedUnits(plan);
  ctx.finalized = true;
  ZERO_RETURN_IF_ERROR(InitialValues(init));
  step.StartCountingBytes();
  return absl::OkStatus();
}

// offload_optimizer.device "nvme": the store holding each unit's host-part master and optimizer state (its file
// under nvme_path, its staging buffers and I/O engine counted in the host tier as the plan lists them).
Status Engine::Impl::CreateNvmeStore(const internal::StagePlan& plan) {
  const Config& cfg = ctx.cfg;
  if (ctx.compute->device()) {
    return absl::UnimplementedError(
        "zero_optimization.offload_optimizer.device \"nvme\": not implemented on the CUDA engine (the host engine "
        "has it); use \"cpu\"");
  }
  internal::NvmeOptions o;
  o.dir = cfg.zero.offload_optimizer.nvme_path;
  o.rank = ctx.world_rank;
  o.fields = plan.nvme_fields;
  o.chunk_elems = plan.nvme_chunk;
  o.buffer_count = ctx.policy.nvme_buffers;
  o.pipeline_read = cfg.zero.offload_optimizer.pipeline_read;
  o.pipeline_write = cfg.zero.offload_optimizer.pipeline_write;
  o.pinned = ctx.policy.pin_optimizer;
  o.io = io::IoOptionsFromConfig(cfg);
  o.tracker = &ctx.tracker;
  std::vector<int64_t> host_n;
  for (const Unit& u : ctx.units) host_n.push_back(u.host_n());
  auto store = internal::NvmeStore::Create(o, host_n);
  if (!store.ok()) {
    return Status(store.status().code(), absl::StrCat("zero_optimization.offload_optimizer.nvme_path \"", o.dir,
                                                      "\" (rank ", ctx.world_rank, "): ", store.status().message()));
  }
  ctx.nvme = std::move(*store);
  ZERO_LOG(DEBUG) << "rank " << ctx.world_rank << ": NVMe tier in " << ctx.nvme->path() << " ("
                  << io::IoBackendName(ctx.nvme->io().backend().backend) << ": " << ctx.nvme->io().backend().reason
                  << "), chunks of " << plan.nvme_chunk << " elements";
  return absl::OkStatus();
}

// offload_param.device "nvme": the sharded units' parameter shards in a file under offload_param.nvme_path, read
// into the tier's buffer_count staging buffers (offload/nvme_param_tier.h), counted in the host tier as the plan
// lists them. A shard larger than buffer_size is refused, as DeepSpeed's parameter swapper refuses it: a buffer
// holds a whole shard, since the all-gather reads the shard from it.
Status Engine::Impl::CreateNvmeParamTier(const internal::StagePlan& plan) {
  const Config& cfg = ctx.cfg;
  if (ctx.compute->device()) {
    return absl::UnimplementedError(
        "zero_optimization.offload_param.device \"nvme\": not implemented on the CUDA engine (the host engine "
        "has it); use \"cpu\"");
  }
  if (plan.param_too_large >= 0) {
    const Unit& u = ctx.units[static_cast<size_t>(plan.param_too_large)];
    return absl::InvalidArgumentError(
        absl::StrCat("zero_optimization.offload_param.buffer_size: ", cfg.zero.offload_param.buffer_size,
                     " elements with device \"nvme\", but unit ", u.name(), "'s parameter shard on rank ",
                     ctx.world_rank, " is ", u.plan.shard, " elements (", u.layout.numel, " parameters over ",
                     ctx.world, " ranks); a staging buffer holds a whole shard: raise buffer_size to at least ",
                     u.plan.shard, " or register smaller units"));
  }
  internal::NvmeOptions o;
  o.dir = cfg.zero.offload_param.nvme_path;
  o.rank = ctx.world_rank;
  o.buffer_count = ctx.policy.param_nvme_buffers;
  o.pinned = ctx.policy.pin_param;
  o.io = io::IoOptionsFromConfig(cfg);
  o.tracker = &ctx.tracker;
  const int64_t cds = static_cast<int64_t>(DTypeSize(ctx.cd()));
  std::vector<int64_t> shard_bytes;
  for (const Unit& u : ctx.units) shard_bytes.push_back(u.sharded_params() ? u.plan.shard * cds : 0);
  auto tier = internal::NvmeParamTier::Create(o, shard_bytes, plan.param_slot_elems * cds);
  if (!tier.ok()) {
    return Status(tier.status().code(), absl::StrCat("zero_optimization.offload_param.nvme_path \"", o.dir, "\" (rank ",
                                                     ctx.world_rank, "): ", tier.status().message()));
  }
  ctx.param_nvme = std::move(*tier);
  ZERO_LOG(DEBUG) << "rank " << ctx.world_rank << ": NVMe parameter tier in " << ctx.param_nvme->path() << " ("
                  << io::IoBackendName(ctx.param_nvme->io().backend().backend) << "), " << ctx.policy.param_nvme_buffers
                  << " buffers of " << plan.param_slot_elems << " elements";
  return absl::OkStatus();
}

// Every parameter's group; a unit is frozen when its parameters are, and then all of them must be (one flat
// buffer has one gradient). The same registration on every rank gives the same answer, so an error here is
// every rank's.
Status Engine::Impl::ResolveGroups() {
  const std::vector<ParamGroup>& groups = ctx.opts.param_groups;
  for (Unit& u : ctx.units) {
    u.param_group.clear();
    int frozen = 0;
    const internal::ParamSlot* first_trainable = nullptr;
    const internal::ParamSlot* first_frozen = nullptr;
    for (const auto& slot : u.layout.params) {
      const int g = internal::MatchGroup(groups, u.FullName(slot));
      u.param_group.push_back(g);
      const bool f = g >= 0 && groups[g].frozen;
      frozen += f;
      if (f && first_frozen == nullptr) first_frozen = &slot;
      if (!f && first_trainable == nullptr) first_trainable = &slot;
    }
    if (frozen > 0 && first_trainable != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("EngineOptions::param_groups: unit ", u.name(),
                                                     " mixes frozen parameter ", first_frozen->spec.name,
                                                     " with trainable parameter ", first_trainable->spec.name,
                                                     "; a unit is one flat buffer with one gradient, "
                                                     "so register frozen parameters in units of their own"));
    }
    u.frozen = frozen > 0;
  }
  return CheckGroupsMatch();
}

// A group whose pattern fits no parameter is a typo or a stale name far more often than an intent, and would
// otherwise train silently without the group's settings: refuse it, naming the pattern and the full names it
// could have matched (the ranks registered the same names, so every rank fails alike).
Status Engine::Impl::CheckGroupsMatch() const {
  const std::vector<ParamGroup>& groups = ctx.opts.param_groups;
  if (groups.empty()) return absl::OkStatus();
  std::vector<std::string> names;
  bool trainer_owned = false;
  for (const Unit& u : ctx.units) {
    trainer_owned |= u.trainer_params != nullptr;
    for (const auto& slot : u.layout.params) names.push_back(u.FullName(slot));
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const bool any = std::any_of(names.begin(), names.end(),
                                 [&](const std::string& n) { return internal::GlobMatch(groups[g].match, n); });
    if (any) continue;
    constexpr size_t kShown = 20;
    std::vector<std::string> shown(names.begin(), names.begin() + std::min(names.size(), kShown));
    std::string listed = absl::StrJoin(shown, ", ");
    if (names.size() > kShown) absl::StrAppend(&listed, ", ... (", names.size(), " names in all)");
    return absl::InvalidArgumentError(absl::StrCat(
        "EngineOptions::param_groups[", g, "]: pattern \"", groups[g].match, "\" matches no parameter on rank ",
        ctx.world_rank, "; the full names are ", trainer_owned ? "\"<FlatBuffers::name>.<tensor>\"" : "\"unit.param\"",
        " ('*' any run, '?' one character, '|' between alternatives): ", listed));
  }
  return absl::OkStatus();
}

// Stage 3 keeps units below stage3_param_persistence_threshold gathered: say which, and what it costs, once —
// a trainer that registered its model as small units would otherwise not see that nothing is sharded. And a unit
// holding most of the model is gathered whole: say so too.
void Engine::Impl::LogUnshardedUnits(const internal::StagePlan& plan) const {
  if (ctx.stage() != 3 || ctx.world_rank != 0) return;
  std::vector<std::string> names;
  int64_t elems = 0, count = 0;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    if (!plan.units[i].persistent) continue;
    elems += plan.units[i].padded;
    if (++count <= 6) names.push_back(ctx.units[i].name());
  }
  // The one-unit trap: at stage 3 a unit that holds most of the model is gathered whole in every scope, so the
  // gather (and, in backward, the gradient bucket) is about as large as the unsharded model.
  int64_t total = 0, largest = 0;
  size_t largest_at = 0;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    total += plan.units[i].padded;
    if (!plan.units[i].persistent && plan.units[i].padded > largest) {
      largest = plan.units[i].padded;
      largest_at = i;
    }
  }
  // (Three quarters of the model in one unit of several tensors: a model registered whole, not a layer that
  // happens to dominate, like a two-layer MLP's first layer.)
  if (ctx.world > 1 && largest * 4 > total * 3 && ctx.units[largest_at].layout.params.size() >= 4) {
    const int64_t bytes = largest * static_cast<int64_t>(DTypeSize(ctx.cd()));
    ZERO_LOG(WARNING) << "stage 3: unit " << ctx.units[largest_at].name() << " holds " << (100 * largest / total)
                      << " % of the parameters (" << largest << " elements): every Forward/Backward scope gathers it "
                      << "whole, so each rank's peak holds all " << bytes << " bytes of it (and a gradient bucket as "
                      << "large in backward) beside its shard; registered as k units of one layer each, the gather "
                      << "working set is about 1/k of that (stage3_max_live_parameters bounds it)";
  }
  if (count == 0) return;
  if (count > 6) names.push_back("...");
  ZERO_LOG(INFO) << "stage 3: " << count << " of " << plan.units.size() << " units (" << elems
                 << " parameter elements, " << elems * static_cast<int64_t>(DTypeSize(ctx.cd()))
                 << " bytes) are below stage3_param_persistence_threshold ("
                 << ctx.cfg.zero.stage3_param_persistence_threshold
                 << ") and stay gathered on every rank, as at stage 2: " << absl::StrJoin(names, ", ");
}

Status Engine::Impl::CheckUnit(UnitId id, const char* what) const {
  if (!ctx.finalized) return absl::FailedPreconditionError(absl::StrCat(what, ": call Finalize first"));
  if (id < 0 || id >= static_cast<int>(ctx.units.size())) {
    return absl::InvalidArgumentError(absl::StrCat(what, " on rank ", ctx.world_rank, ": no unit with id ", id, " (",
                                                   ctx.units.size(),
                                                   " registered; Engine::FindUnit gives -1 for an "
                                                   "unknown name)"));
  }
  return absl::OkStatus();
}

StatusOr<UnitScope> Engine::Impl::Open(Engine* engine, UnitId id, bool backward) {
  ZERO_RETURN_IF_ERROR(CheckUnit(id, backward ? "Backward" : "Forward"));
  ZERO_RETURN_IF_ERROR(ctx.TakeDeferredError());
  Unit& u = ctx.units[id];
  if (u.scope_open) {
    return absl::FailedPreconditionError(
        absl::StrCat(backward ? "Backward" : "Forward", "(", u.name(), "): unit ", u.name(), " is already open in a ",
                     u.scope_backward ? "backward" : "forward", " scope (gathering twice); close that scope first"));
  }
  if (backward && u.backward_count >= ctx.ga()) {
    return absl::FailedPreconditionError(absl::StrCat("Backward(", u.name(), "): the unit already ran ",
                                                      u.backward_count,
                                                      " backward passes and "
                                                      "gradient_accumulation_steps is ",
                                                      ctx.ga(), "; call Step()"));
  }
  if (u.sharded_params()) ZERO_RETURN_IF_ERROR(gathers.Acquire(id, step.applied_steps(), backward));
  u.scope_open = true;
  u.scope_backward = backward;
  if (backward) ZERO_RETURN_IF_ERROR(reducer.BeginBackward(id));
  return UnitScope(engine, id, backward);
}

Status Engine::Impl::Close(UnitId id, bool backward) {
  Unit& u = ctx.units[id];
  // Only an open UnitScope closes, and it closes once (UnitScope::open_): a mismatch is our bug.
  ZERO_CHECK(u.scope_open && u.scope_backward == backward) << "unit " << u.name();
  u.scope_open = false;
  Status s;
  if (backward) s = reducer.Reduce(u);
  if (u.sharded_params()) gathers.Release(u);
  // Retire the reductions that have finished meanwhile and advance chunked collectives (never blocking).
  if (s.ok()) s = reducer.RetireCompleted();
  gathers.Poll();
  return s;
}

StatusOr<StepResult> Engine::Impl::Step(const StepOptions& options) {
  if (!ctx.finalized) return absl::FailedPreconditionError("Step: call Finalize first");
  ZERO_RETURN_IF_ERROR(ctx.TakeDeferredError());
  ZERO_ASSIGN_OR_RETURN(StepResult r, step.Run(options));
  PollSave();
  return r;
}

StatusOr<TensorView> Engine::Impl::ParamView(UnitId id, const std::string& name) const {
  ZERO_RETURN_IF_ERROR(CheckUnit(id, "Param"));
  const Unit& u = ctx.units[id];
  const internal::ParamSlot* slot = u.Slot(name);
  if (slot == nullptr) return UnknownParam("Engine::Param", u, name);
  if (u.status != UnitStatus::kAvailable) {
    return absl::FailedPreconditionError(absl::StrCat("Engine::Param(\"", name, "\") on rank ", ctx.world_rank,
                                                      ": unit ", u.name(), " is ", internal::UnitStatusName(u.status),
                                                      " (released or not gathered): open a Forward or Backward "
                                                      "scope to read parameter ",
                                                      name));
  }
  return u.View(*slot, u.ParamBase(), ctx.cd(), ctx.world_rank, /*grad=*/false);
}

Status Engine::Impl::UnknownParam(const char* what, const Unit& u, const std::string& name) const {
  return absl::InvalidArgumentError(absl::StrCat(what, "(\"", name, "\") on rank ", ctx.world_rank, ": unit ", u.name(),
                                                 " has no parameter \"", name, "\"; its parameters are ",
                                                 u.ParamNames()));
}

// The checks of a scope's Grad/GradBase beyond the scope being open: a backward scope of a trainable unit.
Status Engine::Impl::CheckScopeGrad(const Unit& u, bool scope_backward, const char* what,
                                    const std::string& name) const {
  const std::string call = name.empty() ? absl::StrCat(what, "()") : absl::StrCat(what, "(\"", name, "\")");
  if (!scope_backward) {
    return absl::FailedPreconditionError(absl::StrCat(call, " on rank ", ctx.world_rank, ": unit ", u.name(),
                                                      " is open in a forward scope, which has no gradient; "
                                                      "gradients are written in a Backward scope"));
  }
  if (u.frozen) {
    return absl::FailedPreconditionError(
        absl::StrCat(call, " on rank ", ctx.world_rank, ": unit ", u.name(),
                     " is frozen (EngineOptions::param_groups): it has no gradient; its Backward scope only keeps its "
                     "parameters gathered"));
  }
  return absl::OkStatus();
}

StatusOr<TensorView> Engine::Impl::ScopeView(UnitId id, bool scope_backward, const std::string& name, bool grad) const {
  const Unit& u = ctx.units[id];
  // A UnitScope exists only for a unit the engine holds open (Open/Close pair them): our invariant.
  ZERO_CHECK(u.scope_open && u.scope_backward == scope_backward) << "unit " << u.name();
  const char* what = grad ? "UnitScope::Grad" : "UnitScope::Param";
  const internal::ParamSlot* slot = u.Slot(name);
  if (slot == nullptr) return UnknownParam(what, u, name);
  if (grad) ZERO_RETURN_IF_ERROR(CheckScopeGrad(u, scope_backward, what, name));
  void* base = grad ? u.GradBase() : u.ParamBase();
  ZERO_CHECK(base != nullptr) << "unit " << u.name() << (grad ? ": no gradient buffer" : ": no parameters")
                              << " in an open " << (scope_backward ? "backward" : "forward") << " scope";
  return u.View(*slot, base, ctx.cd(), ctx.world_rank, grad);
}

StatusOr<void*> Engine::Impl::ScopeBase(UnitId id, bool scope_backward, bool grad) const {
  const Unit& u = ctx.units[id];
  ZERO_CHECK(u.scope_open && u.scope_backward == scope_backward) << "unit " << u.name();
  if (grad) ZERO_RETURN_IF_ERROR(CheckScopeGrad(u, scope_backward, "UnitScope::GradBase", ""));
  void* base = grad ? u.GradBase() : u.ParamBase();
  ZERO_CHECK(base != nullptr) << "unit " << u.name() << (grad ? ": no gradient buffer" : ": no parameters")
                              << " in an open " << (scope_backward ? "backward" : "forward") << " scope";
  return base;
}

const Unit* Engine::Impl::UnitOrNull(UnitId id) const {
  return id >= 0 && id < static_cast<int>(ctx.units.size()) ? &ctx.units[id] : nullptr;
}

Engine::Impl::~Impl() = default;

// ---- TensorView ----

Status TensorView::WrongDType(const char* wanted) const {
  const std::string what = absl::StrCat(is_grad ? "gradient " : "parameter ", unit ? *unit : std::string("?"), ".",
                                        param ? *param : std::string("?"));
  std::string hint;
  if (dtype != DType::kF32) {
    hint =
        " (the config's bf16/fp16 section makes the compute dtype 16-bit: read it as uint16_t and convert with "
        "zero/dtype.h)";
  }
  return absl::InvalidArgumentError(absl::StrCat("TensorView::As: ", what,
                                                 rank >= 0 ? absl::StrCat(" on rank ", rank) : "", " is ",
                                                 std::string(DTypeName(dtype)), ", not ", wanted, hint));
}

// ---- UnitScope ----

UnitScope::UnitScope(UnitScope&& o) noexcept { *this = std::move(o); }
UnitScope& UnitScope::operator=(UnitScope&& o) noexcept {
  if (this != &o) {
    (void)Close();
    engine_ = o.engine_;  // kept by `o` too, so that its errors still name the unit and the rank
    unit_ = o.unit_;
    backward_ = o.backward_;
    open_ = std::exchange(o.open_, false);
  }
  return *this;
}
UnitScope::~UnitScope() { (void)Close(); }

Status UnitScope::Close() {
  if (!open_) return absl::OkStatus();
  open_ = false;
  Status s = engine_->CloseScope(unit_, backward_);
  engine_->impl_->ctx.Defer(s);
  return s;
}

Status UnitScope::CheckOpen(const char* what, const std::string& name) const {
  if (open_) return absl::OkStatus();
  const std::string call = name.empty() ? absl::StrCat(what, "()") : absl::StrCat(what, "(\"", name, "\")");
  if (engine_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        call, ": the scope holds no unit (default-constructed); assign it from Engine::Forward or Engine::Backward"));
  }
  return absl::FailedPreconditionError(absl::StrCat(call, " on rank ", engine_->rank(), ": the ",
                                                    backward_ ? "backward" : "forward", " scope of unit ",
                                                    engine_->impl_->ctx.units[unit_].name(),
                                                    " is closed (Close() was called, or it was moved from); open a "
                                                    "new scope with Engine::Forward or Engine::Backward"));
}

StatusOr<TensorView> UnitScope::Param(const std::string& name) const {
  ZERO_RETURN_IF_ERROR(CheckOpen("UnitScope::Param", name));
  return engine_->impl_->ScopeView(unit_, backward_, name, /*grad=*/false);
}
StatusOr<TensorView> UnitScope::Grad(const std::string& name) const {
  ZERO_RETURN_IF_ERROR(CheckOpen("UnitScope::Grad", name));
  return engine_->impl_->ScopeView(unit_, backward_, name, /*grad=*/true);
}
StatusOr<void*> UnitScope::ParamBase() const {
  ZERO_RETURN_IF_ERROR(CheckOpen("UnitScope::ParamBase", ""));
  return engine_->impl_->ScopeBase(unit_, backward_, /*grad=*/false);
}
StatusOr<void*> UnitScope::GradBase() const {
  ZERO_RETURN_IF_ERROR(CheckOpen("UnitScope::GradBase", ""));
  return engine_->impl_->ScopeBase(unit_, backward_, /*grad=*/true);
}
void* UnitScope::param_base() const {
  if (!open_) return nullptr;
  return engine_->impl_->ctx.units[unit_].ParamBase();
}
void* UnitScope::grad_base() const {
  if (!open_ || !backward_) return nullptr;
  return engine_->impl_->ctx.units[unit_].GradBase();  // nullptr for a frozen unit
}

// ---- Engine ----

StatusOr<std::unique_ptr<Engine>> Engine::Create(const Config& config, std::shared_ptr<Communicator> comm,
                                                 EngineOptions options) {
  if (comm == nullptr) return absl::InvalidArgumentError("Engine::Create: communicator is null");
  Config cfg = config;
  ZERO_RETURN_IF_ERROR(cfg.Validate(comm->world_size()));
  ZERO_RETURN_IF_ERROR(internal::CheckTimeoutAgrees(cfg, *comm));
  ZERO_RETURN_IF_ERROR(internal::SimdTargetEnvStatus());  // before any kernel, which could only abort
  // Hybrid sharding (docs/internals/design.md): groups of G consecutive ranks shard the model; the ranks at the same
  // place in each group (a shard's replicas) all-reduce its gradient. Both splits are collective on `comm`.
  std::shared_ptr<Communicator> shard, replica;
  const int world = comm->world_size(), rank = comm->rank();
  const int64_t G = cfg.zero.mics_shard_size;
  if (G > 0 && G < world) {
    ZERO_ASSIGN_OR_RETURN(shard, comm->Split(static_cast<int>(rank / G), rank));
    ZERO_ASSIGN_OR_RETURN(replica, comm->Split(static_cast<int>(rank % G), rank));
  }
  // hpZ: the host group, H consecutive ranks inside one host (Config::Validate checked stage 3, H | world, no
  // hybrid sharding, no offload_param). Every rank decides from the same config and options (a rank whose ranks
  // per host differ would split differently: its host count is in the error of the other ranks' first op).
  std::shared_ptr<Communicator> hpz;
  const int64_t H = cfg.zero.zero_hpz_partition_size;
  if (H > 1 && cfg.zero.stage == 3) {
    const int per_host = RanksPerHost(options);
    if (per_host % H != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("zero_optimization.zero_hpz_partition_size: ", H, " does not divide the ", per_host,
                       " ranks per host (EngineOptions::local_world_size, else the launcher's LOCAL_WORLD_SIZE, "
                       "OMPI_COMM_WORLD_LOCAL_SIZE or Slurm tasks per node, else 1) on rank ",
                       rank, ": the secondary copy's group must lie inside one host"));
    }
    ZERO_ASSIGN_OR_RETURN(hpz, comm->Split(static_cast<int>(rank / H), rank));
  }
  // qgZ in two hops (shard/internal/qgz.h): the host's ranks, and the ranks of the same local index across hosts,
  // where the world is whole hosts of more than one rank; else one hop over the shard communicator.
  std::shared_ptr<Communicator> qgz_host, qgz_across;
  if (cfg.zero.zero_quantized_gradients && cfg.zero.stage >= 1 && shard == nullptr) {
    const int L = internal::QgzLocalRanks(world, RanksPerHost(options), /*hybrid=*/false);
    if (L < world) {
      ZERO_ASSIGN_OR_RETURN(qgz_host, comm->Split(rank / L, rank));
      ZERO_ASSIGN_OR_RETURN(qgz_across, comm->Split(rank % L, rank));
    }
  }
  auto impl = std::make_unique<Impl>(cfg, std::move(comm), std::move(shard), std::move(replica), std::move(options),
                                     std::move(hpz), std::move(qgz_host), std::move(qgz_across));
  ZERO_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() {
  if (!impl_) return;
  bool unfinished = impl_->reducer.WaitAllForShutdown();
  for (auto& u : impl_->ctx.units) {
    unfinished |= !u.gather_op.WaitInFlight();
  }
  for (auto& b : impl_->ctx.quarantine) unfinished |= !b.empty();
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
StatusOr<StepResult> Engine::Step(const StepOptions& options) { return impl_->Step(options); }
StatusOr<TensorView> Engine::Param(UnitId unit, const std::string& name) const { return impl_->ParamView(unit, name); }
StatusOr<std::vector<float>> Engine::GatherParam(UnitId unit, const std::string& name) {
  return impl_->GatherParam(unit, name);
}
double Engine::loss_scale() const { return impl_->step.loss_scale(); }
StatusOr<std::string> Engine::Save(const std::string& dir, const SaveOptions& options) {
  return impl_->Save(dir, options);
}
Status Engine::WaitForSave() { return impl_->WaitForSave(); }
bool Engine::save_in_flight() const { return impl_->async_save.in_flight; }
StatusOr<LoadResult> Engine::Load(const std::string& dir, const LoadOptions& options) {
  return impl_->Load(dir, options);
}
Status Engine::LoadSafetensors(const std::string& path, const LoadOptions& options) {
  return impl_->LoadSafetensors(path, options);
}
int64_t Engine::steps() const { return impl_->step.applied_steps(); }
int Engine::rank() const { return impl_->ctx.world_rank; }
int Engine::world_size() const { return impl_->ctx.world_size; }
int Engine::shard_group_size() const { return impl_->ctx.world; }
const Config& Engine::config() const { return impl_->ctx.cfg; }
Communicator& Engine::comm() { return *impl_->ctx.comm; }
CUstream_st* Engine::cuda_stream() const { return impl_->ctx.stream(); }
bool Engine::on_device() const { return impl_->ctx.compute->device(); }
int64_t Engine::num_params() const { return impl_->num_params_; }
MemoryReport Engine::memory_report() const {
  // The engine's own allocations plus its communicators' staging buffers (the shard group's, and under hybrid
  // sharding the world's and the replicas'). A communicator's tracker counts into the engine's while the engine
  // lives (EngineContext), per tier and per tag, so every figure is a high-water mark of bytes alive at once and
  // no tag's peak exceeds its tier's peak_total. A communicator that reports memory without a tracker is added:
  // its peaks then only bound the combined figures from above.
  MemoryReport r = impl_->ctx.tracker.ReportWithLinked();
  for (Communicator* comm : impl_->ctx.Comms()) {
    if (comm->memory_tracker() != nullptr) continue;
    const MemoryReport c = comm->memory_report();
    for (size_t t = 0; t < r.usage.size(); ++t) {
      for (size_t g = 0; g < r.usage[t].size(); ++g) {
        r.usage[t][g].current += c.usage[t][g].current;
        r.usage[t][g].peak += c.usage[t][g].peak;
        r.peak_total[t] += c.usage[t][g].peak;
      }
    }
  }
  return r;
}
MemoryTracker& Engine::memory_tracker() { return impl_->ctx.tracker; }
std::string Engine::UnitState(UnitId unit) const {
  const Unit* u = impl_->UnitOrNull(unit);
  return u != nullptr ? internal::UnitStatusName(u->status) : "NO_SUCH_UNIT";
}
UnitId Engine::FindUnit(const std::string& name) const { return impl_->FindUnit(name); }
const std::vector<ParamSpec>& Engine::UnitParams(UnitId unit) const {
  static const std::vector<ParamSpec> kNone;
  const Unit* u = impl_->UnitOrNull(unit);
  return u != nullptr ? u->specs : kNone;
}
advanced::EngineStats advanced::Stats(const Engine& engine) {
  const auto& gathers = engine.impl_->gathers;
  EngineStats s{.prefetch_gathers = gathers.prefetch_gathers(),
                .demand_gathers = gathers.demand_gathers(),
                .peak_live_elements = gathers.peak_live_elements(),
                .qwz_chunk_gathers = gathers.qwz_chunk_gathers(),
                .qgz_chunk_reductions = engine.impl_->reducer.qgz_chunk_reductions()};
  if (const internal::NvmeStore* nvme = engine.impl_->ctx.nvme.get()) {
    s.nvme_step_bytes_read = nvme->pass_bytes_read();
    s.nvme_step_bytes_written = nvme->pass_bytes_written();
    s.nvme_io_busy_ms = nvme->io_busy_ms();
    s.nvme_wait_ms = nvme->wait_ms();
  }
  if (const internal::NvmeParamTier* tier = engine.impl_->ctx.param_nvme.get()) {
    s.nvme_param_step_bytes_read = tier->step_bytes_read();
    s.nvme_param_step_bytes_written = tier->step_bytes_written();
  }
  return s;
}
PeakBound Engine::TruePeakBound(MemTier tier, const PeakBoundOptions& options) const {
  internal::PeakInputs in;
  in.open_elems = options.open_elements;
  in.trainer_bytes[static_cast<size_t>(MemTier::kHost)] = options.trainer_host_bytes;
  in.trainer_bytes[static_cast<size_t>(MemTier::kDevice)] = options.trainer_device_bytes;
  // A plain Communicator (a trainer's own) counts no staging and has no strided collectives: the defaults.
  if (const advanced::ExtendedCommunicator* comm = advanced::Extended(*impl_->ctx.comm); comm != nullptr) {
    in.comm_cache_bytes = comm->cache_bytes();
    in.rs_staging = [comm](int64_t count, DType dtype, bool destructive) {
      return comm->ReduceScatterStagingBytes(static_cast<size_t>(count), dtype, destructive);
    };
    in.ar_staging = [comm](int64_t count, DType dtype) {
      return comm->AllReduceStagingBytes(static_cast<size_t>(count), dtype);
    };
    in.ag_strided = comm->SupportsAllGatherStrided();
    in.rs_strided = [comm](int64_t count, DType dtype) {
      return comm->SupportsReduceScatterStrided(static_cast<size_t>(count), dtype);
    };
  }
  if (impl_->ctx.hybrid()) {
    if (const advanced::ExtendedCommunicator* replicas = advanced::Extended(*impl_->ctx.replica_comm);
        replicas != nullptr) {
      in.replica_ar_staging = [replicas](int64_t count, DType dtype) {
        return replicas->AllReduceStagingBytes(static_cast<size_t>(count), dtype);
      };
    }
  }
  if (tier == MemTier::kNvme) {
    // The NVMe tier holds the plan's file regions and nothing transient: its bound is its model state.
    return PeakBound{impl_->Plan().Report().Current(MemTier::kNvme), 0, 0, 0, 0};
  }
  const internal::PeakTerms t = internal::TruePeakBound(impl_->Plan(), in)[static_cast<size_t>(tier)];
  return PeakBound{t.model_state, t.gathers, t.reductions, t.staging, t.trainer};
}

}  // namespace zero
