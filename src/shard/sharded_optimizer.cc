// shard/sharded_optimizer.cc — ZeRO stages 0-2 over the trainer's own buffers (zero/sharded_optimizer.h): an
// Engine whose units borrow the trainer's parameter and gradient buffers (the placement plan marks them
// trainer-owned), stepped without scopes.
#include "zero/sharded_optimizer.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/internal/config_schema.h"
#include "core/internal/status_util.h"
#include "shard/internal/engine_impl.h"
#include "shard/internal/layout.h"

namespace zero {

using internal::Unit;

namespace {

// "FlatBuffers[2] \"blocks\"": how the errors name a buffer pair, by its place in Create's list and its name.
std::string PairName(int index, const std::string& name) {
  return absl::StrCat("FlatBuffers[", index, "] \"", name, "\"");
}

// The Engine's word for what the wrapper calls a buffer pair: "unit"/"units" as whole words become "buffer pair"/
// "buffer pairs" (a unit's name, quoted, stays as it is).
std::string UnitsAsPairs(const std::string& msg) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::string out;
  for (size_t i = 0; i < msg.size();) {
    if ((i == 0 || !word(msg[i - 1])) && msg.compare(i, 4, "unit") == 0) {
      size_t j = i + 4;
      const bool plural = j < msg.size() && msg[j] == 's';
      if (plural) ++j;
      if (j >= msg.size() || !word(msg[j])) {
        out += plural ? "buffer pairs" : "buffer pair";
        i = j;
        continue;
      }
    }
    out += msg[i++];
  }
  return out;
}

}  // namespace

StatusOr<UnitId> Engine::Impl::AddTrainerUnit(FlatBuffers fb, int index) {
  const std::string pair = PairName(index, fb.name);
  if (fb.params == nullptr) return absl::InvalidArgumentError(absl::StrCat(pair, ": params is null"));
  if (fb.dtype != ctx.cd()) {
    return absl::InvalidArgumentError(absl::StrCat(
        pair, ": the buffers are ", std::string(DTypeName(fb.dtype)), " but the config computes in ",
        std::string(DTypeName(ctx.cd())), " (fp16.enabled / bf16.enabled choose 16-bit buffers; neither: f32)"));
  }
  if (fb.name.empty()) return absl::InvalidArgumentError(absl::StrCat(pair, ": the name is empty"));
  if (FindUnit(fb.name) >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(pair,
                                                   ": another buffer pair has this name (they name the pairs in "
                                                   "errors, reports and, unless bare_names, checkpoints)"));
  }
  StatusOr<UnitId> added = AddUnit(fb.name, std::move(fb.tensors));
  if (!added.ok()) {  // the layout's own checks (names unique, shapes positive), in the wrapper's words
    std::string msg(added.status().message());
    if (absl::StartsWith(msg, "AddUnit")) msg = msg.substr(msg.find(':') + 1);
    return internal::Reworded(added.status(), absl::StrCat(pair, ":", msg));
  }
  Unit& u = ctx.units[*added];
  const int64_t need = internal::PaddedNumel(u.layout.numel, ctx.world);
  if (fb.capacity < need) {
    ctx.units.pop_back();
    return absl::InvalidArgumentError(absl::StrCat(
        pair, ": capacity ", fb.capacity, " elements, but ", u.layout.numel, " parameters at world size ",
        ctx.world_size, ctx.hybrid() ? absl::StrCat(" (sharded in groups of ", ctx.world, ")") : std::string(),
        " need ", need,
        " (ShardedOptimizer::Capacity): the collectives "
        "move whole shards of ",
        need / ctx.world, " elements"));
  }
  u.trainer_params = fb.params;
  u.trainer_grads = fb.grads;
  u.bare_names = fb.bare_names;
  return *added;
}

Status Engine::Impl::CheckTrainerGrads() const {
  std::map<std::string, size_t> owner;  // full name -> pair: bare names must not collide across pairs
  for (size_t i = 0; i < ctx.units.size(); ++i) {
    const Unit& u = ctx.units[i];
    for (const internal::ParamSlot& slot : u.layout.params) {
      const auto [it, fresh] = owner.emplace(u.FullName(slot), i);
      if (!fresh) {
        return absl::InvalidArgumentError(absl::StrCat(
            PairName(static_cast<int>(i), u.name()), ": tensor full name \"", it->first, "\" is also ",
            PairName(static_cast<int>(it->second), ctx.units[it->second].name()),
            "'s; checkpoints and parameter groups need every full name once (bare_names pairs keep the names as "
            "given)"));
      }
    }
    if (u.trainer_params != nullptr && u.trainer_grads == nullptr && !u.frozen) {
      return absl::InvalidArgumentError(
          absl::StrCat(PairName(static_cast<int>(i), u.name()),
                       ": grads is null, which only a frozen pair may be (a ParamGroup with frozen = true "
                       "matching all its tensors); a trainable pair needs the buffer its gradients are reduced in"));
    }
  }
  return absl::OkStatus();
}

// The trainer rewrote buffer pair `id`'s parameters (loaded them from its own files, say): its values become the
// master's again, agreed across ranks as at Create (CopyIn, one tensor at a time).
Status Engine::Impl::ReloadTrainerParams(UnitId id) {
  if (id < 0 || id >= static_cast<UnitId>(ctx.units.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReloadParams: no buffer pair ", id, " (", ctx.units.size(), " given to Create)"));
  }
  ZERO_RETURN_IF_ERROR(ctx.TakeDeferredError());
  // Only the parameters (and the master) are written: a reduction in flight works in the gradient buffer.
  const Unit& u = ctx.units[id];
  for (const internal::ParamSlot& slot : u.layout.params) {
    std::vector<float> values(static_cast<size_t>(slot.numel));
    ReadTrainerValues(u, slot, values.data());
    ZERO_RETURN_IF_ERROR(CopyIn(id, slot.spec.name, values.data()));
  }
  return absl::OkStatus();
}

Status Engine::Impl::ReduceTrainerUnit(UnitId id) {
  Unit& u = ctx.units[id];
  u.backward_count = 1;  // the trainer accumulated its micro-steps itself
  if (u.frozen) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(reducer.ReduceTrainerOwned(u));
  return reducer.RetireCompleted();  // never waits: what finished lands, the rest overlaps the trainer's work
}

Status Engine::Impl::GradientsReady(UnitId id) {
  if (!ctx.finalized) return absl::FailedPreconditionError("GradientsReady: call Finalize first");
  ZERO_RETURN_IF_ERROR(ctx.TakeDeferredError());
  if (id < 0 || id >= static_cast<UnitId>(ctx.units.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("GradientsReady: no buffer pair ", id, " (", ctx.units.size(), " given to Create)"));
  }
  if (ctx.units[id].backward_count != 0) {
    return absl::FailedPreconditionError(absl::StrCat("GradientsReady(", id, "): the gradients of buffer pair \"",
                                                      ctx.units[id].name(), "\" were already handed over this step"));
  }
  return ReduceTrainerUnit(id);
}

StatusOr<StepResult> Engine::Impl::StepTrainerOwned(const StepOptions& options) {
  if (!ctx.finalized) return absl::FailedPreconditionError("Step: call Finalize first");
  ZERO_RETURN_IF_ERROR(ctx.TakeDeferredError());
  for (UnitId id = 0; id < static_cast<UnitId>(ctx.units.size()); ++id) {
    if (ctx.units[id].backward_count == 0) ZERO_RETURN_IF_ERROR(ReduceTrainerUnit(id));  // not handed over
  }
  ZERO_ASSIGN_OR_RETURN(StepResult r, step.Run(options));
  PollSave();
  return r;
}

namespace {

// No two buffers of the pairs may share memory: the same buffer given twice (as two pairs, or as one pair's params
// and grads) would be reduced into and updated twice over with no error. Sizes are the capacities as given (that
// they hold enough is checked per pair); the dtype is the pair's.
Status CheckDisjoint(const std::vector<FlatBuffers>& buffers, int world_size) {
  struct Extent {
    uintptr_t begin, end;
    std::string what;
  };
  std::vector<Extent> extents;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const FlatBuffers& fb = buffers[i];
    const uintptr_t bytes =
        static_cast<uintptr_t>(std::max<int64_t>(fb.capacity, 1)) * static_cast<uintptr_t>(DTypeSize(fb.dtype));
    const std::string pair = PairName(static_cast<int>(i), fb.name);
    if (fb.params != nullptr) {
      extents.push_back({reinterpret_cast<uintptr_t>(fb.params), reinterpret_cast<uintptr_t>(fb.params) + bytes,
                         absl::StrCat(pair, "'s params")});
    }
    if (fb.grads != nullptr) {
      extents.push_back({reinterpret_cast<uintptr_t>(fb.grads), reinterpret_cast<uintptr_t>(fb.grads) + bytes,
                         absl::StrCat(pair, "'s grads")});
    }
  }
  for (size_t a = 0; a < extents.size(); ++a) {
    for (size_t b = a + 1; b < extents.size(); ++b) {
      if (extents[a].begin < extents[b].end && extents[b].begin < extents[a].end) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ShardedOptimizer::Create: ", extents[b].what, " overlap ", extents[a].what,
            " (each buffer is given once, of capacity elements; ShardedOptimizer::Capacity(n, ", world_size, "))"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t ShardedOptimizer::Capacity(int64_t numel, int world_size) { return internal::PaddedNumel(numel, world_size); }

StatusOr<std::unique_ptr<ShardedOptimizer>> ShardedOptimizer::Create(const Config& config,
                                                                     std::shared_ptr<Communicator> comm,
                                                                     std::vector<FlatBuffers> buffers,
                                                                     EngineOptions options) {
  if (comm == nullptr) return absl::InvalidArgumentError("ShardedOptimizer::Create: communicator is null");
  // The config's own rules first, so that a value set in code (stage 7) gets the JSON's message.
  Config cfg = config;
  ZERO_RETURN_IF_ERROR(cfg.Validate(comm->world_size()));
  if (config.zero.stage > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.stage: ", config.zero.stage,
        " with ShardedOptimizer: stage 3 shards the parameters "
        "between uses, which needs the Engine's scoped API (Engine::Forward/Backward gather a unit when it is "
        "used); the trainer-owned wrapper does stages 0-2"));
  }
  if (buffers.empty()) return absl::InvalidArgumentError("ShardedOptimizer::Create: no FlatBuffers given");
  ZERO_RETURN_IF_ERROR(CheckDisjoint(buffers, comm->world_size()));
  // The trainer accumulates its own micro-steps into its gradient buffer: the engine sees one per Step. The
  // config's batch keys were checked above as written.
  // (Its micro-batch as the keys give it, whichever of the three were written: a config of train_batch_size alone
  // derived micro and accumulation, which a plain reset of the two would leave to be derived from nothing.)
  cfg = internal::WithTrainerAccumulation(cfg);
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(cfg, std::move(comm), std::move(options)));
  for (size_t i = 0; i < buffers.size(); ++i) {
    ZERO_RETURN_IF_ERROR(engine->impl_->AddTrainerUnit(std::move(buffers[i]), static_cast<int>(i)).status());
  }
  if (Status s = engine->Finalize(nullptr); !s.ok()) {
    // Finalize speaks of units; here they are the trainer's buffer pairs.
    std::string msg(s.message());
    if (absl::StartsWith(msg, "Finalize: ")) msg = msg.substr(10);
    if (absl::StartsWith(msg, "Finalize ")) msg = msg.substr(9);
    return internal::Reworded(s, absl::StrCat("ShardedOptimizer::Create: ", UnitsAsPairs(msg)));
  }
  return std::unique_ptr<ShardedOptimizer>(new ShardedOptimizer(std::move(engine)));
}

ShardedOptimizer::ShardedOptimizer(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {}
ShardedOptimizer::~ShardedOptimizer() = default;

Status ShardedOptimizer::GradientsReady(int buffer) { return engine_->impl_->GradientsReady(buffer); }
Status ShardedOptimizer::ReloadParams(int buffer) { return engine_->impl_->ReloadTrainerParams(buffer); }

StatusOr<StepResult> ShardedOptimizer::Step(const StepOptions& options) {
  return engine_->impl_->StepTrainerOwned(options);
}
StatusOr<std::string> ShardedOptimizer::Save(const std::string& dir, const SaveOptions& options) {
  return engine_->Save(dir, options);
}
Status ShardedOptimizer::WaitForSave() { return engine_->WaitForSave(); }
bool ShardedOptimizer::save_in_flight() const { return engine_->save_in_flight(); }
StatusOr<LoadResult> ShardedOptimizer::Load(const std::string& dir, const LoadOptions& options) {
  return engine_->Load(dir, options);
}
Status ShardedOptimizer::LoadSafetensors(const std::string& path, const LoadOptions& options) {
  return engine_->LoadSafetensors(path, options);
}
MemoryReport ShardedOptimizer::memory_report() const { return engine_->memory_report(); }
int64_t ShardedOptimizer::trainer_bytes() const {
  int64_t bytes = 0;
  for (const Unit& u : engine_->impl_->ctx.units) bytes += static_cast<int64_t>(u.params.size() + u.full_grads.size());
  return bytes;
}
double ShardedOptimizer::loss_scale() const { return engine_->loss_scale(); }
int64_t ShardedOptimizer::steps() const { return engine_->steps(); }
int ShardedOptimizer::rank() const { return engine_->rank(); }
CUstream_st* ShardedOptimizer::cuda_stream() const { return engine_->cuda_stream(); }
int ShardedOptimizer::world_size() const { return engine_->world_size(); }
StatusOr<std::vector<float>> ShardedOptimizer::GatherParam(int buffer, const std::string& name) {
  return engine_->GatherParam(buffer, name);
}

}  // namespace zero
