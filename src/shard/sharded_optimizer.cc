// shard/sharded_optimizer.cc — ZeRO stages 0-2 over the trainer's own buffers (zero/sharded_optimizer.h): an
// Engine whose units borrow the trainer's parameter and gradient buffers (the placement plan marks them
// trainer-owned), stepped without scopes.
#include "zero/sharded_optimizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "shard/internal/engine_impl.h"
#include "shard/internal/layout.h"

namespace zero {

int64_t ShardedOptimizer::Capacity(int64_t numel, int world_size) {
  return internal::PaddedNumel(numel, world_size);
}

StatusOr<std::unique_ptr<ShardedOptimizer>> ShardedOptimizer::Create(const Config& config,
                                                                      std::shared_ptr<Communicator> comm,
                                                                      std::vector<FlatBuffers> buffers,
                                                                      EngineOptions options) {
  if (comm == nullptr) return absl::InvalidArgumentError("ShardedOptimizer::Create: communicator is null");
  if (config.zero.stage > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.stage: ", config.zero.stage, " with ShardedOptimizer: stage 3 shards the parameters "
        "between uses, which needs the Engine's scoped API (Engine::Forward/Backward gather a unit when it is "
        "used); the trainer-owned wrapper does stages 0-2"));
  }
  if (buffers.empty()) return absl::InvalidArgumentError("ShardedOptimizer::Create: no FlatBuffers given");
  // The trainer accumulates its own micro-steps into its gradient buffer: the engine sees one per Step. The
  // config's batch keys are checked first as written.
  Config cfg = config;
  ZERO_RETURN_IF_ERROR(cfg.Validate(comm->world_size()));
  cfg.gradient_accumulation_steps = 1;
  cfg.train_batch_size.reset();
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(cfg, std::move(comm), std::move(options)));
  for (FlatBuffers& fb : buffers) {
    ZERO_RETURN_IF_ERROR(engine->impl_
                             ->AddTrainerUnit(fb.name, std::move(fb.tensors), fb.params, fb.grads, fb.dtype,
                                              fb.capacity)
                             .status());
  }
  ZERO_RETURN_IF_ERROR(engine->Finalize(nullptr));
  return std::unique_ptr<ShardedOptimizer>(new ShardedOptimizer(std::move(engine)));
}

ShardedOptimizer::ShardedOptimizer(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {}
ShardedOptimizer::~ShardedOptimizer() = default;

StatusOr<StepResult> ShardedOptimizer::Step(const StepOptions& options) {
  return engine_->impl_->StepTrainerOwned(options);
}
MemoryReport ShardedOptimizer::memory_report() const { return engine_->memory_report(); }
double ShardedOptimizer::loss_scale() const { return engine_->loss_scale(); }
int64_t ShardedOptimizer::steps() const { return engine_->steps(); }
int ShardedOptimizer::rank() const { return engine_->rank(); }
int ShardedOptimizer::world_size() const { return engine_->world_size(); }
StatusOr<std::vector<float>> ShardedOptimizer::GatherParam(int buffer, const std::string& name) {
  return engine_->GatherParam(buffer, name);
}

}  // namespace zero
