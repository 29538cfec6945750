// shard/internal/unit.h — one registered unit on this rank: its layout, its buffers and its state machine.
// defines: UnitStatus, UnitStatusName, Unit, BuildUnitLayout.
//
// States follow DeepSpeed: NOT_AVAILABLE (only the shard is resident) -> INFLIGHT (all-gather issued) ->
// AVAILABLE (full parameters present). Units that are not sharded (stages 0-2, persistent stage-3 units) are
// AVAILABLE from Finalize on. The engine's components move a unit between states: the gather scheduler
// (shard/internal/gather.h) for parameters, the gradient reducer (shard/internal/grad_reducer.h) for its
// gradient buffers, the step (shard/internal/step.h) for its optimizer buffers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shard/internal/collective.h"
#include "shard/internal/layout.h"
#include "shard/internal/plan.h"
#include "zero/engine.h"
#include "zero/memory.h"
#include "zero/work.h"

namespace zero::internal {

enum class UnitStatus { kNotAvailable, kInflight, kAvailable };
const char* UnitStatusName(UnitStatus s);  // "NOT_AVAILABLE", "INFLIGHT", "AVAILABLE"

struct Unit {
  UnitLayout layout;
  std::vector<ParamSpec> specs;  // registration order
  UnitPlan plan;                 // set at Finalize (shard/internal/plan.h)
  // A trainer-owned unit (zero/sharded_optimizer.h): the trainer's buffers, which `params` and `full_grads`
  // borrow at Finalize.
  void* trainer_params = nullptr;
  void* trainer_grads = nullptr;
  // Parameter groups (EngineOptions::param_groups), resolved at Finalize: each parameter's group index (-1: the
  // config's optimizer), and whether the whole unit is frozen (no gradient, master, state or update).
  std::vector<int> param_group;
  bool frozen = false;
  // The parameters' full names are their own, not "unit.param" (a FlatBuffers pair with an empty name).
  bool bare_names = false;

  // Model state, allocated at Finalize as the plan lists (BufferRole names the same buffers).
  Buffer params;              // compute dtype: full (stages 0-2, persistent) or shard (stage 3)
  Buffer full_grads;          // compute dtype, full: stages 0-1 always; stages 2-3 low-communication mode (transient)
  Buffer grad_shard;          // the reduced shard's device part (stages 2-3; stage 1 when accumulating 16-bit grads)
  Buffer accum_full;          // f32, full: 16-bit grads accumulated over micro-steps before one reduction
  Buffer master;              // f32 master weights of the device part, mixed precision only
  std::vector<Buffer> state;  // one per optimizer state (empty buffers when the device part is empty)
  // Optimizer offload: elements [0, host_n) of this rank's shard are updated on the host from host-tier
  // buffers; grad_shard/master/state above then hold only the device part [host_n, shard) (Twin-Flow when
  // 0 < host_n < shard).
  Buffer host_grad;    // the reduced gradient of [0, host_n) (grad_shard_dtype), landed by the copy stream
  Buffer host_master;  // fp32 master of [0, host_n) (absent when the host parameter shard is itself the master)
  std::vector<Buffer> host_state;
  // hpZ (zero_hpz_partition_size H > 1): this rank's part of the unit's secondary copy, elements
  // [j·padded/H, (j+1)·padded/H) of the gathered parameters (j = rank mod H), copied from every forward gather
  // when it is waited for; hpz_fresh from then until the step ends (GatherScheduler::EndStep), while the backward
  // gathers all-gather it inside the host group instead of gathering the shards over all ranks.
  Buffer hpz_secondary;
  bool hpz_fresh = false;
  // qgZ with LoCo error feedback (shard/internal/qgz.h): the residual of the whole gradient (padded, compute dtype)
  // and, with two hops, of this rank's host partials (padded / ranks per host); qgz_rounds counts the unit's
  // quantized reductions (reset_T).
  Buffer qgz_residual, qgz_host_residual;
  int64_t qgz_rounds = 0;

  // State machine.
  UnitStatus status = UnitStatus::kNotAvailable;
  Buffer gather;             // stage 3: the full parameters while INFLIGHT/AVAILABLE
  Buffer stage_in;           // CUDA engine with offload_param: the host shard copied to the device for its gather
  int param_slot = -1;       // offload_param "nvme": the tier's slot the shard was read into for its gather
  UnitCollective gather_op;  // its all-gather (shard/internal/collective.h)
  // qwZ (zero_quantized_weights): a gather moves this rank's shard as int8 blocks (qwz_send) into every rank's
  // (qwz_recv), dequantized into `gather` when it is waited for; a unit gathered in chunks takes no qwz_recv (its
  // chunks land in the gather's staging and are dequantized as each completes).
  bool gather_backward = false;  // the gather in flight or available was issued for a backward scope
  bool gather_hpz = false;       // ... and runs inside the host group, from the secondary copy (hpZ)
  Buffer qwz_send, qwz_recv;
  bool scope_open = false;
  bool scope_backward = false;
  Buffer bucket;  // the full gradient buffer of an open backward scope (stages 2-3, low-memory mode)
  int backward_count = 0;

  bool sharded_params() const { return plan.sharded_params; }
  int64_t host_n() const { return plan.host_n; }
  DType grad_shard_dtype() const { return plan.grad_shard_dtype; }
  const std::string& name() const { return layout.name; }
  // The full name of `slot` in checkpoints, parameter groups and errors (ckpt::FullParamName).
  std::string FullName(const ParamSlot& slot) const;
  // The parameter named `name`, or nullptr.
  const ParamSlot* Slot(const std::string& name) const;
  // Where the trainer reads the full parameters and writes the gradient (nullptr outside a backward scope).
  void* ParamBase() const { return sharded_params() ? gather.data() : params.data(); }
  void* GradBase() const { return bucket.empty() ? full_grads.data() : bucket.data(); }
  // A view of `slot` inside this unit's flat buffer of `dtype` starting at `base`, labelled for errors with the
  // unit, the parameter, `rank` and whether it is a gradient.
  TensorView View(const ParamSlot& slot, void* base, DType dtype, int rank, bool grad) const;
  // "w, b, ln_w" — the unit's parameter names for an error about a name it does not have (the first 16, then
  // how many more).
  std::string ParamNames() const;
};

// Whether `name` fits `pattern`: globs ('*' any run, '?' one character) separated by '|'.
bool GlobMatch(const std::string& pattern, const std::string& name);
// The first group whose pattern fits "unit.param" (-1: none).
int MatchGroup(const std::vector<ParamGroup>& groups, const std::string& full_name);

// The layout of a unit as registered (names unique, shapes positive), before padding: the errors name the unit
// and the parameter.
StatusOr<UnitLayout> BuildUnitLayout(const std::string& name, const std::vector<ParamSpec>& params);

}  // namespace zero::internal
