// shard/sharded_optimizer.cc — ZeRO stages 0-2 over the trainer's own buffers (zero/sharded_optimizer.h): an
// Engine whose units borrow the trainer's parameter and gradient buffers (the placement plan marks them
// trainer-owned), stepped without scopes.
#include "zero/sharded_optimizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "shard/internal/engine_impl.h"
#include "shard/internal/layout.h"

namespace zero {

using internal::Unit;

StatusOr<UnitId> Engine::Impl::AddTrainerUnit(const std::string& name, std::vector<ParamSpec> tensors, void* params,
                                              void* grads, DType dtype, int64_t capacity) {
  if (params == nullptr || grads == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("FlatBuffers \"", name, "\": params and grads must be given"));
  }
  if (dtype != ctx.cd()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FlatBuffers \"", name, "\": the buffers are ", std::string(DTypeName(dtype)), " but the config computes in ",
        std::string(DTypeName(ctx.cd())), " (fp16.enabled / bf16.enabled choose 16-bit buffers; neither: f32)"));
  }
  ZERO_ASSIGN_OR_RETURN(UnitId id, AddUnit(name, std::move(tensors)));
  Unit& u = ctx.units[id];
  const int64_t need = internal::PaddedNumel(u.layout.numel, ctx.world);
  if (capacity < need) {
    ctx.units.pop_back();
    return absl::InvalidArgumentError(absl::StrCat(
        "FlatBuffers \"", name, "\": capacity ", capacity, " elements, but ", u.layout.numel,
        " parameters at world size ", ctx.world_size,
        ctx.hybrid() ? absl::StrCat(" (sharded in groups of ", ctx.world, ")") : std::string(), " need ", need,
        " (ShardedOptimizer::Capacity): the collectives "
        "move whole shards of ",
        need / ctx.world, " elements"));
  }
  u.trainer_params = params;
  u.trainer_grads = grads;
  return id;
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
  return step.Run(options);
}

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
  // The trainer accumulates its own micro-steps into its gradient buffer: the engine sees one per Step. The
  // config's batch keys were checked above as written.
  cfg.gradient_accumulation_steps = 1;
  cfg.train_batch_size.reset();
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(cfg, std::move(comm), std::move(options)));
  for (FlatBuffers& fb : buffers) {
    ZERO_RETURN_IF_ERROR(
        engine->impl_->AddTrainerUnit(fb.name, std::move(fb.tensors), fb.params, fb.grads, fb.dtype, fb.capacity)
            .status());
  }
  ZERO_RETURN_IF_ERROR(engine->Finalize(nullptr));
  return std::unique_ptr<ShardedOptimizer>(new ShardedOptimizer(std::move(engine)));
}

ShardedOptimizer::ShardedOptimizer(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {}
ShardedOptimizer::~ShardedOptimizer() = default;

Status ShardedOptimizer::GradientsReady(int buffer) { return engine_->impl_->GradientsReady(buffer); }

StatusOr<StepResult> ShardedOptimizer::Step(const StepOptions& options) {
  return engine_->impl_->StepTrainerOwned(options);
}
StatusOr<std::string> ShardedOptimizer::Save(const std::string& dir, const SaveOptions& options) {
  return engine_->Save(dir, options);
}
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
