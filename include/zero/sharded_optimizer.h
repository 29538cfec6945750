// zero/sharded_optimizer.h — ZeRO stages 0-2 over memory the trainer keeps: the path of llm.c's multi-GPU ZeRO-1
// and PyTorch's ZeroRedundancyOptimizer, beside the Engine's scoped API (zero/engine.h).
//
//   // The trainer's own buffers: one flat parameter buffer and one gradient buffer, tensors packed in order,
//   // allocated with room for the padding (ShardedOptimizer::Capacity).
//   const int64_t cap = zero::ShardedOptimizer::Capacity(num_parameters, comm->world_size());
//   float* params = (float*)calloc(cap, 4); float* grads = (float*)calloc(cap, 4);
//   zero::FlatBuffers flat{.params = params, .grads = grads, .capacity = cap,
//                          .tensors = {{"wte", {V, C}}, {"wpe", {T, C}}, ...}};
//   auto opt = zero::ShardedOptimizer::Create(cfg, comm, {flat}).value();   // ranks agree on rank 0's values
//   for (...) {
//     memset(grads, 0, ...); forward(params); backward(grads);             // the trainer's own code, unchanged
//     ZERO_ASSIGN_OR_RETURN(zero::StepResult r, opt->Step());              // replaces its optimizer update
//   }
//
// Step() reduces the gradients (an average all-reduce at stage 0, a reduce-scatter at stages 1-2), computes the
// global norm, clips, runs the optimizer on this rank's shard with fp32 master weights and state (also when the
// trainer's parameters are 16-bit), and all-gathers the updated values back into the trainer's parameter buffer.
// What each rank holds beyond the trainer's own buffers: optimizer state 8Ψ/N (Adam), the fp32 master 4Ψ/N when
// the parameters are 16-bit, and at stage 2 the reduced gradient shard; the trainer's buffers are not counted in
// memory_report(). Stage 3 (parameters sharded between uses) needs scopes: use the Engine; asking this wrapper
// for it is an error that says so.
//
// COLLECTIVE: every rank calls Create and Step together. After Step the trainer's gradient buffer holds the
// reduced gradient at stage 0 (all of it) and stage 1 (this rank's shard; the rest is unspecified); the trainer
// zeroes it before its next backward, as it always did.
//
// ERRORS. Every call returns a Status for the trainer's mistakes, never an abort: buffers that are null, too small
// or of the wrong dtype, a parameter group whose pattern matches no "<FlatBuffers::name>.<tensor>" (the error lists
// the names), a buffer index or tensor name that does not exist (GatherParam, GradientsReady). The aborts left are
// zero's own invariants, as in zero/engine.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zero/checkpoint.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/dtype.h"
#include "zero/engine.h"
#include "zero/memory.h"
#include "zero/status.h"

namespace zero {

// One buffer pair of the trainer: `tensors` are named slices packed in order from element 0 of `params` (and of
// `grads`, same layout). Both buffers hold `capacity` elements of `dtype`, at least Capacity(total, world): the
// elements past the tensors are padding that the collectives move (the trainer never reads them). On the CUDA
// engine (an NCCL communicator) both are device pointers.
struct FlatBuffers {
  void* params = nullptr;
  void* grads = nullptr;
  DType dtype = DType::kF32;
  int64_t capacity = 0;
  std::vector<ParamSpec> tensors;
  std::string name = "flat";  // names the buffer pair in errors and reports
};

class ShardedOptimizer {
 public:
  // Elements a buffer pair of `numel` parameters must hold at `world_size` ranks (a multiple of 32 × world).
  static int64_t Capacity(int64_t numel, int world_size);

  // Validates `config` (stage 0-2; fp16/bf16 need 16-bit buffers of that dtype, fp32 compute needs f32 buffers)
  // and makes every rank's parameter values rank 0's (EngineOptions::initial_value_sync). Collective.
  static StatusOr<std::unique_ptr<ShardedOptimizer>> Create(const Config& config, std::shared_ptr<Communicator> comm,
                                                            std::vector<FlatBuffers> buffers,
                                                            EngineOptions options = {});
  ~ShardedOptimizer();
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  // Hands buffer pair `buffer`'s gradients over as soon as the trainer's backward has finished them (DDP's
  // reducer buckets, at the granularity of the buffer pairs given to Create): its reduction starts at once and
  // runs while the trainer computes the others' gradients; the trainer must not write that gradient buffer again
  // before Step. Optional: Step reduces every pair not handed over. Collective (every rank, same order).
  Status GradientsReady(int buffer);

  // One optimizer step over the gradients the trainer accumulated since the last one. Collective.
  StatusOr<StepResult> Step(const StepOptions& options = {});

  // Checkpoints, as Engine::Save/Load/LoadSafetensors (zero/checkpoint.h): the parameters are read from and
  // written into the trainer's buffers; tensor full names are "<FlatBuffers::name>.<tensor>". Collective.
  StatusOr<std::string> Save(const std::string& dir, const SaveOptions& options = {});
  StatusOr<LoadResult> Load(const std::string& dir, const LoadOptions& options = {});
  Status LoadSafetensors(const std::string& path, const LoadOptions& options = {});

  // This rank's bytes by tag and tier, without the trainer's buffers (see the file comment).
  MemoryReport memory_report() const;
  // The trainer's own buffers the wrapper works in (parameters and gradients, capacity included), reported apart:
  // the trainer's, not the library's.
  int64_t trainer_bytes() const;
  double loss_scale() const;
  int64_t steps() const;
  int rank() const;
  int world_size() const;
  // The CUDA engine's compute stream (EngineOptions::cuda_stream or its own), where Step's work runs on the
  // trainer's device buffers; nullptr on the host engine.
  CUstream_st* cuda_stream() const;
  // The full fp32 master values of one tensor (buffer pair `buffer`, tensor `name`). Collective.
  StatusOr<std::vector<float>> GatherParam(int buffer, const std::string& name);

 private:
  explicit ShardedOptimizer(std::unique_ptr<Engine> engine);
  std::unique_ptr<Engine> engine_;
};

}  // namespace zero
