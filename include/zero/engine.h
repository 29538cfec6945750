// zero/engine.h — the Engine a trainer links in: units of flat parameters, sharded by ZeRO stage 0-3.
//
//   auto cfg = zero::Config::FromJsonFile("ds_config.json").value();
//   auto comm = zero::Communicator::FromEnv(zero::Backend::kGloo, cfg).value();  // cfg.comm_timeout_s
//   auto engine = zero::Engine::Create(cfg, std::move(comm)).value();
//   zero::UnitId fc = engine->AddUnit("fc", {{"w", {784, 128}}, {"b", {128}}}).value();
//   ZERO_RETURN_IF_ERROR(engine->Finalize(init));          // partition, allocate, init, ranks agree
//   for (...) {
//     {
//       ZERO_ASSIGN_OR_RETURN(zero::UnitScope u, engine->Forward(fc));   // released at scope end
//       ZERO_ASSIGN_OR_RETURN(const float* w, u.Param<float>("w"));     // checked: name, scope, dtype
//       forward(w, ...);
//     }
//     {
//       ZERO_ASSIGN_OR_RETURN(zero::UnitScope u, engine->Backward(fc));  // grads reduced at scope end
//       ZERO_ASSIGN_OR_RETURN(float* gw, u.Grad<float>("w"));
//       backward(..., gw);
//     }
//     ZERO_ASSIGN_OR_RETURN(zero::StepResult r, engine->Step());        // clip, optimizer on shards
//   }
//
// The trainer never owns parameter memory: it asks the engine for views inside Forward/Backward scopes (RAII,
// like DeepSpeed's GatheredParameters / FSDP's summon_full_params). Each unit is one flat buffer padded so every
// rank's shard has the same size, aligned to 128 bytes; a parameter may straddle shards.
//
// COLLECTIVE ORDER: every rank must open and close scopes for the same units in the same order and call Step()
// the same number of times (the engine's collectives follow the trainer's calls). Not thread-safe: one thread
// per Engine (tests run N ranks as N threads, each with its own Engine).
//
// Unit states (DeepSpeed's vocabulary): NOT_AVAILABLE (only the shard is present) -> INFLIGHT (all-gather
// issued, e.g. by prefetch) -> AVAILABLE (full parameters present). Misuse is an error naming the unit:
// opening a second scope on a unit that is already open ("gathering twice"), reading a released unit through
// Engine::Param, stepping while a backward scope is open or with a unit's gradient only partly accumulated,
// adding units after Finalize.
//
// ERRORS AND ABORTS. A mistake in the trainer's calls is a Status, never an abort: an unknown unit id or
// parameter name (kInvalidArgument, naming the unit's parameters), a view typed as the wrong dtype
// (TensorView::As, kInvalidArgument), and scope misuse (kFailedPrecondition): Grad in a forward scope or on a
// frozen unit, any use of a closed, moved-from or default-constructed scope, Engine::Param on a unit that is not
// gathered. The messages name the unit, the parameter, the dtype and the rank. The only aborts (ZERO_CHECK) left
// behind this header are broken invariants of the engine itself (a scope whose unit the engine does not hold
// open, a gather issued for a unit in the wrong state); they print file:line and are zero's bugs. The unchecked fast
// paths are plain data: TensorView::data and UnitScope::param_base()/grad_base(), which return nullptr where there is
// no such buffer.
//
// WHAT EACH RANK HOLDS (fp32 Adam, Ψ elements, N ranks; docs/internals/design.md, "What each rank holds"): stage 0 the
// parameters, the gradient and the optimizer state in full, 16Ψ bytes, and nothing staged; stage 1 the optimizer
// state of its shard only, 8Ψ + 8Ψ/N, plus the communicator's cached reduce-scatter (Gloo's receive buffers,
// about 8 bytes per element of the largest unit, or of a chunk when units exceed reduce_bucket_size); stage 2
// also the gradient as a shard, 4Ψ + 12Ψ/N, plus the buckets of the backward scopes open and of the reductions
// in flight, which the plan caps at (N - 1)/2N of the gradient beside the open scopes (PlanPolicy::bucket_cap),
// so stage 2 pays over stage 1 unless the units the trainer keeps open at once hold (N - 1)/N of the model or
// more; stage 3 also the parameters as a shard, 16Ψ/N, plus the gathered units, which
// stage3_max_live_parameters bounds (left at its default, the plan caps it at (N - 1)/2N of the sharded units;
// units below stage3_param_persistence_threshold stay gathered, as at stage 2). With DeepSpeed's defaults each stage
// of the reference GPT holds less than the one before (bench/results/memory-defaults.md). A model registered as
// one unit keeps all of it open in its backward scope: there stage 1 is the stage that pays.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "zero/checkpoint.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/dtype.h"
#include "zero/memory.h"
#include "zero/optimizer.h"
#include "zero/status.h"

struct CUstream_st;  // cudaStream_t without including CUDA headers.

namespace zero {

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

using UnitId = int;

// A view of one parameter's or gradient's full (unsharded) values inside an open scope. On the CUDA engine
// (Engine::on_device()) `data` is device memory, valid for work on Engine::cuda_stream(); As<T>() only types it.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t numel = 0;
  const std::vector<int64_t>* shape = nullptr;
  // What the view is of, for error messages: pointers into the engine's registration (valid while the engine
  // lives; null in a view made by hand), the rank, and whether it is a gradient.
  const std::string* unit = nullptr;
  const std::string* param = nullptr;
  int rank = -1;
  bool is_grad = false;

  // `data` typed, checked against the view's dtype: T = float for an f32 view, T = uint16_t for a bf16 or f16
  // view (the bits; zero/dtype.h converts). kInvalidArgument naming the unit, the parameter, both dtypes and the
  // rank otherwise. (static_cast<T*>(data) is the unchecked form.)
  template <typename T>
  StatusOr<T*> As() const {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, uint16_t> || std::is_same_v<T, const float> ||
                      std::is_same_v<T, const uint16_t>,
                  "TensorView::As<T>: T is float or uint16_t");
    constexpr bool kWantF32 = std::is_same_v<std::remove_const_t<T>, float>;
    if ((dtype == DType::kF32) != kWantF32) return WrongDType(kWantF32 ? "float (f32)" : "uint16_t (bf16/f16)");
    return static_cast<T*>(data);
  }

 private:
  Status WrongDType(const char* wanted) const;
};

// Fills one parameter's full initial values (fp32). It must depend only on (unit, param) — e.g. seed an RNG from
// their names — so values are identical whatever the world size and stage. Called on every rank for every
// parameter at Finalize; each rank keeps its shard.
using ParamInit = std::function<void(const std::string& unit, const ParamSpec& param, float* values)>;

// Where the wall time between two Step() returns went, in milliseconds (wall_clock_breakdown logs it).
struct StepTimes {
  double total_ms = 0;        // since the previous Step() returned (or Finalize)
  double compute_ms = 0;      // the trainer's own work: total minus every engine wait and the step below
  double gather_wait_ms = 0;  // blocked on parameter all-gathers (stage 3; less with prefetch)
  double reduce_wait_ms = 0;  // blocked on gradient reductions
  double norm_ms = 0;         // gradient norm and non-finite check, including its all-reduce
  double optimizer_ms = 0;    // the optimizer on this rank's shards
  double allgather_ms = 0;    // refreshing full parameters after the update (stages 1-2)
  // Offload (zero_optimization.offload_*): the copy stream's busy time (gradients landing in the host tier,
  // updated parameters copied back) runs beside the rest, so it is not part of total_ms's sum; the time the
  // trainer's thread was blocked on it is. optimizer_ms includes the host step's waits for a staging buffer.
  double offload_copy_ms = 0;  // copy stream busy (overlapped with backward and the host optimizer)
  double offload_wait_ms = 0;  // blocked on the copy stream (inside optimizer_ms, or before the norm)
};

// Overrides for one Step, for trainers that compute their own learning rate.
struct StepOptions {
  std::optional<double> lr;  // this step's learning rate instead of the config's schedule
  double lr_scale = 1.0;     // multiplies the learning rate (the schedule's or `lr`)
  // The trainer's number of this step (its loop counter). Step's desync check compares it, with lr, lr_scale and
  // the count of Step calls, across ranks: a rank that skipped or repeated a Step then fails on every rank at
  // that Step, naming each rank's step (docs/internals/design.md, "Failures and desync"). Without it a skipped Step
  // whose ops match the others' (ShardedOptimizer issues the same ops every Step) shows only when a rank runs out of
  // steps and leaves.
  std::optional<int64_t> step;
};

struct StepResult {
  bool skipped = false;     // the step was skipped (non-finite gradients); master weights untouched
  double grad_norm = 0.0;   // global L2 norm of the averaged, unscaled gradient, before clipping
  double lr = 0.0;          // learning rate applied (or that would have been, if skipped)
  double loss_scale = 1.0;  // the loss scale used for this step's gradients
  int64_t step = 0;         // number of applied steps after this call
  StepTimes times;
  // The bytes this rank sent since the previous Step returned (or Finalize), as Communicator::bus_bytes counts
  // them: within its shard group (every collective of full sharding: gathers, reduce-scatters, the norm) and
  // across the replicas of its shard (hybrid sharding's gradient all-reduce; 0 without hybrid sharding). hpZ's
  // backward gathers run in the host group and are counted only in intra_host_bytes / inter_host_bytes below.
  int64_t shard_group_bus_bytes = 0;
  int64_t replica_bus_bytes = 0;
  // The same bytes by where they go: to ranks of this rank's host, and to ranks of other hosts, summed over
  // every communicator the engine uses (shard group, replicas, hpZ group, the trainer's). A host is
  // EngineOptions::local_world_size consecutive ranks (else Communicator::LaunchedLocalWorldSize, else 1). Counted
  // message by message from the algorithms the Gloo communicator runs (Communicator::bytes_sent_to_ranks): what
  // the library sends, without protocol headers, not measured on the wire; 0 and 0 on NCCL, which does not count.
  int64_t intra_host_bytes = 0;
  int64_t inter_host_bytes = 0;
};

// How Finalize and CopyIn make the ranks agree on a parameter's values. Every rank evaluates the values itself;
// a forgotten seed (torch's process-wide generator, a rank-dependent RNG) would otherwise train a different
// model on every rank, and at stage 3 a patchwork of the ranks' shards. PyTorch DDP broadcasts rank 0's
// parameters when it wraps a model; FSDP's sync_module_states does the same.
enum class InitialValueSync {
  // Default: a 64-bit hash of each rank's values per parameter is all-gathered (8 bytes per parameter and rank,
  // one exchange per 16 MiB of parameters); where any rank's differs, rank 0's values are broadcast and every
  // rank keeps its part of them. The parameters that differed are logged once.
  kFromRank0,
  // The same hash check, but a difference is an error (kFailedPrecondition) on every rank, naming the first
  // differing parameter and the ranks whose values are not rank 0's.
  kRequireEqual,
  // No check and no collective: for trainers that guarantee agreement (CopyIn is then local to the rank).
  kTrust,
};

// Per-parameter hyperparameters, torch.optim's parameter groups, chosen by name: the first group whose `match`
// fits a parameter's full name applies to it; a parameter no group fits uses the config's "optimizer" section as
// it is. The full names are "unit.param" on the Engine (AddUnit's unit name, ParamSpec::name) and
// "<FlatBuffers::name>.<tensor>" on ShardedOptimizer ("flat.wte" by default) — the names checkpoints use. No
// weight decay on biases and norm weights is one line:
//   options.param_groups = {{.match = "*.b|*bias|*ln*|*norm*", .weight_decay = 0.0}};
// A group whose pattern fits no parameter at all is an error at Finalize (ShardedOptimizer::Create), naming the
// pattern and listing the full names it could have matched: a typo would otherwise train without the group.
// Frozen parameters get no gradient reduction, master, optimizer state or update (a frozen base under trainable
// adapters); they must fill whole units, since a unit is one flat buffer with one gradient.
struct ParamGroup {
  // Glob patterns over the full names above ('*' any run, '?' one character), alternatives separated by '|'.
  std::string match;
  std::optional<double> weight_decay, beta1, beta2, eps;  // unset: the config's value
  double lr_scale = 1.0;                                  // multiplies the step's learning rate for these parameters
  bool frozen = false;
};

struct EngineOptions {
  // Threads for this rank's optimizer step (0 = hardware threads / ranks on this host, at least 1).
  int cpu_threads = 0;
  // Ranks sharing this host's cores (N thread-ranks in one process, or the launcher's count). Also the host of
  // StepResult::intra_host_bytes, zero_hpz_partition_size and qgZ's two hops: ranks are laid out host by host,
  // each host this many consecutive ranks (0: Communicator::LaunchedLocalWorldSize, from LOCAL_WORLD_SIZE,
  // OMPI_COMM_WORLD_LOCAL_SIZE or Slurm's tasks per node; else 1). Where it is the launcher's count and hpZ, qgZ
  // or hybrid sharding is on, Create checks that OpenMPI or Slurm numbered the ranks host by host.
  int local_world_size = 0;
  // A trainer's own element-wise optimizer; when null, the config's "optimizer" section is used. (Host engine
  // only: the CUDA engine runs the built-in Adam/AdamW/SGD.)
  std::shared_ptr<const ElementwiseOptimizer> optimizer;
  // The CUDA engine (an NCCL communicator): the trainer's compute stream. The engine enqueues all its
  // compute-tier work there and orders collectives against it by events; the trainer runs its forward and
  // backward kernels on it. nullptr: the engine creates a non-blocking stream (Engine::cuda_stream()).
  CUstream_st* cuda_stream = nullptr;
  // The CUDA engine's device ordinal: -1 = the NCCL communicator's (Communicator::cuda_device); another value
  // must equal it. Engine::Create makes it the calling thread's current device; call the engine, and launch
  // the trainer's kernels, from a thread with that device current.
  int cuda_device = -1;
  // Finalize's and CopyIn's agreement on parameter values across ranks (see InitialValueSync).
  InitialValueSync initial_value_sync = InitialValueSync::kFromRank0;
  // Parameter groups (see ParamGroup). With a trainer's own ElementwiseOptimizer only lr_scale and frozen apply.
  std::vector<ParamGroup> param_groups;
};

// The bound the placement plan gives on one tier of this rank's true peak (MemoryReport::peak_total), by term
// (docs/internals/design.md, "The true peak and its bound"). It holds for the host (Gloo) engine at any point of
// training; the measured true peak reaches it where every pool fills (tests/shard/true_peak_test.cc).
struct PeakBound {
  int64_t model_state = 0;  // the plan's buffers: parameters, gradients, master, optimizer state, offload staging
  int64_t gathers = 0;      // stage 3: full-unit gather buffers within the live window (stage3_max_live_parameters,
                            // stage3_prefetch_bucket_size, the units open at once)
  int64_t reductions = 0;   // gradient buckets, wire copies and reduce-scatter outputs within reduce_bucket_size and
                            // the open backward scopes; reduction chunk staging; low-communication full gradients
  int64_t staging = 0;      // all-gather chunk staging (allgather_bucket_size); the communicator's cached staging
                            // (CommOptions::cache_bytes and the largest op's own)
  int64_t trainer = 0;      // PeakBoundOptions' trainer bytes
  int64_t total() const { return model_state + gathers + reductions + staging + trainer; }
};

struct PeakBoundOptions {
  // Elements of the units the trainer keeps open in scopes at once (the reference GPT: its root unit, open for
  // the whole pass, and one block). 0: the largest unit, one scope at a time.
  int64_t open_elements = 0;
  // The trainer's own bytes in Engine::memory_tracker() (its activations), per tier, at their peak.
  int64_t trainer_host_bytes = 0, trainer_device_bytes = 0;
};

class Engine;

// RAII scope over one unit's full parameters (and, in a backward scope, its full gradient). Move-only.
// Destroying it releases the unit (stage 3) and, for a backward scope, hands the gradient to the engine for
// reduction. Errors from that hand-off are reported by the next Engine call. A scope must not outlive its Engine.
//
// Every accessor is checked and returns a Status for the trainer's mistakes (see "ERRORS AND ABORTS" above):
// an unknown name is kInvalidArgument listing the unit's parameters; a closed scope (Close() called, moved
// from, default-constructed), Grad in a forward scope and Grad on a frozen unit are kFailedPrecondition.
class UnitScope {
 public:
  UnitScope() = default;
  UnitScope(UnitScope&& o) noexcept;
  UnitScope& operator=(UnitScope&& o) noexcept;
  UnitScope(const UnitScope&) = delete;
  UnitScope& operator=(const UnitScope&) = delete;
  ~UnitScope();

  // The full parameter `name` (compute dtype: f32, or bf16/f16 under mixed precision).
  StatusOr<TensorView> Param(const std::string& name) const;
  // Backward scopes only: the parameter's gradient buffer (compute dtype). The trainer ACCUMULATES into it
  // (+=); it is zero at the first backward of each unit in each micro-step.
  StatusOr<TensorView> Grad(const std::string& name) const;
  // Param / Grad typed in one call (TensorView::As): Param<float>("w") is the f32 values, Grad<uint16_t>("w")
  // a bf16/f16 gradient's bits; a dtype other than the engine's compute dtype is kInvalidArgument.
  template <typename T>
  StatusOr<T*> Param(const std::string& name) const {
    StatusOr<TensorView> v = Param(name);
    if (!v.ok()) return v.status();
    return v->template As<T>();
  }
  template <typename T>
  StatusOr<T*> Grad(const std::string& name) const {
    StatusOr<TensorView> v = Grad(name);
    if (!v.ok()) return v.status();
    return v->template As<T>();
  }
  // Base of the unit's flat parameter / gradient buffer (parameters packed in registration order), checked as
  // Param / Grad are.
  StatusOr<void*> ParamBase() const;
  StatusOr<void*> GradBase() const;
  // The same bases unchecked, for a trainer's inner loop: nullptr on a closed scope, and for grad_base() also
  // in a forward scope or on a frozen unit (never an abort).
  void* param_base() const;
  void* grad_base() const;
  // True until the scope is closed (Close(), destruction, moved from).
  bool open() const { return open_; }
  // Ends the scope now (same as destruction) and returns any error. Closing a closed scope is a no-op (OK).
  Status Close();

 private:
  friend class Engine;
  UnitScope(Engine* engine, UnitId unit, bool backward)
      : engine_(engine), unit_(unit), backward_(backward), open_(true) {}
  // OK when the scope is open, else the kFailedPrecondition that `what` on it gets.
  Status CheckOpen(const char* what, const std::string& name) const;
  // The engine stays set after the scope closes, so errors on a closed scope can name the unit and rank.
  Engine* engine_ = nullptr;
  UnitId unit_ = -1;
  bool backward_ = false;
  bool open_ = false;
};

class ShardedOptimizer;
class ReplicaGroups;
class Engine;

namespace advanced {
struct EngineStats;
EngineStats Stats(const Engine& engine);
}  // namespace advanced

class Engine {
 public:
  // Validates `config` for the communicator's world size (every field against its key's rule, as in the JSON;
  // batch sizes, no "auto" left), refuses a communicator whose timeout is not the config's comm_timeout_s
  // (docs/internals/comm.md, "Timeouts and failures"), and checks that every rank's config is the same
  // (kFailedPrecondition naming the first differing key; collective). The engine keeps the communicator for its
  // lifetime.
  static StatusOr<std::unique_ptr<Engine>> Create(const Config& config, std::shared_ptr<Communicator> comm,
                                                  EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Registers a unit (≈ one transformer block). Parameter names are unique within the unit; shapes positive.
  StatusOr<UnitId> AddUnit(const std::string& name, std::vector<ParamSpec> params);

  // Lays out and pads every unit, allocates this rank's state, evaluates `init`, and checks that every rank
  // registered the same units, names, shapes and order (a hash exchange, then the first difference is named).
  // The ranks then agree on every parameter's values as EngineOptions::initial_value_sync says (by default
  // rank 0's values win). Collective.
  Status Finalize(const ParamInit& init);

  // Copies a full parameter's values (fp32, numel elements) in after Finalize; each rank keeps its part. The
  // ranks agree on the values as in Finalize, so it is collective (every rank, same order) unless
  // initial_value_sync is kTrust.
  Status CopyIn(UnitId unit, const std::string& param, const float* values);

  // Opens a forward scope: gathers the unit if it is sharded (stage 3), waiting for a prefetch if one is in
  // flight, and prefetches ahead by the recorded order. Collective (all ranks, same order).
  StatusOr<UnitScope> Forward(UnitId unit);
  // Opens a backward scope: like Forward, plus a gradient buffer. Closing it reduces the gradient (all-reduce at
  // stage 0, reduce-scatter otherwise), overlapped with the trainer's next work. Collective.
  StatusOr<UnitScope> Backward(UnitId unit);

  // Waits for outstanding reductions, computes the global gradient norm, checks for non-finite gradients
  // (agreed across ranks), clips, runs the optimizer on this rank's shards, refreshes parameters, advances the
  // LR schedule (not on skipped steps); `options` can set this step's learning rate instead. Collective. On
  // the CUDA engine the host waits here, and only here in a training step: for the step's collectives
  // (Communicator::Fence, which notices a dead peer), for the gradient statistics (16 bytes that decide
  // skipping and clipping on the host, as DeepSpeed's overflow check does) and the norm's 2-float all-reduce,
  // and, with offload, for the copy stream. Forward/Backward and scope closes never block the host there
  // (collectives are joined with Work::WaitStream), except while the engine's pools fill in the first steps
  // (cudaMalloc) and, with offload_param, for a shard in pageable memory (pin_memory false) staged in before
  // its gather.
  StatusOr<StepResult> Step(const StepOptions& options = {});

  // Checked access to a parameter of an AVAILABLE unit outside a scope (kFailedPrecondition naming the unit if
  // it is released or in flight; kInvalidArgument for an unknown unit id or parameter name).
  StatusOr<TensorView> Param(UnitId unit, const std::string& name) const;

  // The full fp32 values of one parameter, assembled from all shards (master weights). Collective.
  StatusOr<std::vector<float>> GatherParam(UnitId unit, const std::string& name);

  // Checkpoints (zero/checkpoint.h). Save writes this rank's part of every unit, its optimizer state and the
  // run's counters under DIR/<tag>/, and, once every rank's file is durable, rank 0 writes meta.json and makes
  // <tag> DIR's latest; it returns the tag. It is refused inside a gradient-accumulation cycle and when
  // DIR/<tag> already holds a checkpoint. A failure on any rank fails Save on every rank and leaves the
  // previous checkpoint current. Collective.
  StatusOr<std::string> Save(const std::string& dir, const SaveOptions& options = {});
  // Waits for the asynchronous save in flight (SaveOptions::async), if any, and makes it DIR's latest once every
  // rank's file is durable; returns its error, or that of one a Step found failed, on every rank. Call it
  // before the engine is destroyed: a save still in flight then is written but never made `latest`. Collective.
  Status WaitForSave();
  // Whether an asynchronous save is in flight (started, not yet agreed complete). The same on every rank.
  bool save_in_flight() const;
  // Replaces the parameters, master weights, optimizer state, step count and loss scaler with a checkpoint's,
  // saved at any world size and stage, by the Engine or the ShardedOptimizer (parameters matched by full name
  // "unit.param", LoadOptions::name_map). After Finalize, between Steps. The run then continues exactly as the
  // saved one would have (bit for bit at the same world size). On an error every rank fails, and the engine's
  // values are unspecified until a Load succeeds. Collective.
  StatusOr<LoadResult> Load(const std::string& dir, const LoadOptions& options = {});
  // Parameter values (and the master weights) from a safetensors file by full name "unit.param" (through
  // options.name_map; options.strict: the file may hold no other tensor). After Finalize; optimizer state and
  // step count are untouched. Every rank reads the file. Collective.
  Status LoadSafetensors(const std::string& path, const LoadOptions& options = {});

  // The loss scale the trainer multiplies its loss by (1 unless fp16 is enabled).
  double loss_scale() const;
  int64_t steps() const;
  // This rank and the world size of the communicator the engine was created with.
  int rank() const;
  int world_size() const;
  // The ranks one copy of the model is sharded over: zero_optimization.mics_shard_size under hybrid sharding,
  // else world_size().
  int shard_group_size() const;
  const Config& config() const;
  Communicator& comm();
  // The CUDA engine's compute stream (EngineOptions::cuda_stream or its own); nullptr on the host engine.
  CUstream_st* cuda_stream() const;
  // True when the engine computes in device memory (an NCCL communicator): views are device pointers.
  bool on_device() const;
  // Total registered (unpadded) parameter count Ψ.
  int64_t num_params() const;
  // This rank's bytes by tag and tier, the communicator's staging included. The device tier is the compute
  // tier (on the host engine: host DRAM the CPU computes in); the host tier is what offload moved out of it
  // (zero_optimization.offload_optimizer: master, optimizer state, reduced gradient shard; offload_param:
  // stage-3 parameter shards) plus staging. See docs/internals/design.md, "Tiers" and "Offload". Its peak_total, and
  // each tag's peak, is the high-water mark of the engine's and the communicator's bytes alive at once, counted since
  // the engine was created (MemoryTracker::CountAlsoIn, ReportWithLinked): no tag's peak exceeds its tier's
  // peak_total, after Save, Load and offload too. memory_tracker().ResetPeaks() resets them.
  MemoryReport memory_report() const;
  MemoryTracker& memory_tracker();
  // "NOT_AVAILABLE", "INFLIGHT" or "AVAILABLE"; "NO_SUCH_UNIT" for an id no unit has.
  std::string UnitState(UnitId unit) const;
  UnitId FindUnit(const std::string& name) const;  // -1 if absent
  // A unit's parameters in registration order; empty for an id no unit has (FindUnit's -1 included).
  const std::vector<ParamSpec>& UnitParams(UnitId unit) const;
  // The bound on `tier` of memory_report().peak_total, from the placement plan, the config's bucket sizes and the
  // communicator's staging (see PeakBound). After Finalize. MemTier::kNvme: the NVMe tier's regions (model state).
  PeakBound TruePeakBound(MemTier tier, const PeakBoundOptions& options = {}) const;

 private:
  class Impl;
  friend class UnitScope;
  friend class ShardedOptimizer;  // an Engine over the trainer's buffers (zero/sharded_optimizer.h)
  friend class ReplicaGroups;     // live recovery regroups the engine between steps (zero/elastic.h)
  friend advanced::EngineStats advanced::Stats(const Engine& engine);  // zero/advanced/engine_stats.h
  explicit Engine(std::unique_ptr<Impl> impl);
  Status CloseScope(UnitId unit, bool backward);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero
