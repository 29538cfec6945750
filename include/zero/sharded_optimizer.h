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
// Stage 3 (parameters sharded between uses) needs scopes: use the Engine; asking this wrapper for it is an error
// that says so.
//
// WHAT EACH RANK HOLDS beyond the trainer's own buffers (Ψ = Capacity elements, N ranks, Adam; memory_report()
// counts exactly these, the trainer's buffers are trainer_bytes()):
//   stage 0   optimizer state 8Ψ in full (the trainer's fp32 buffer is the master); the gradient is averaged by
//             an all-reduce in place in the trainer's buffer, which stages nothing (a 16-bit buffer: its fp32
//             wire copy, 4Ψ).
//   stage 1   optimizer state 8Ψ/N; the reduce-scatter reads the trainer's gradient buffer and writes this
//             rank's slice of it; the updated shard is all-gathered in place into the trainer's parameter buffer.
//   stage 2   the same bytes as stage 1: the trainer's full gradient buffer exists anyway, so the reduced shard
//             lands in its slice instead of a gradient shard of its own (which would add 4Ψ/N). In this wrapper
//             stage 2 never pays over stage 1; it pays in the Engine, where the full gradient of a unit lives only
//             while its backward scope is open (docs/internals/design.md, "What each rank holds").
//   16-bit buffers add the fp32 master of the shard, 4Ψ/N (stage 0: 4Ψ); optimizer offload moves the shard's
//   state, master and gradient copy to the host tier.
// Transient, at any setting: the reduce-scatter moves in chunks of at most 1 Mi elements of all ranks together
// and about an eighth of the buffer (internal::ReduceChunkPerRank; a smaller reduce_bucket_size still wins), read
// where they lie in the trainer's buffer, so the communicator's staging (Gloo's receive buffers, about twice a
// chunk) is at most 8 MiB and about Ψ bytes, where one collective over the buffer held 8Ψ; the results are the
// same bits. Save and Load stream through one piece of at most 1 MiB and an eighth of the buffer. So at DeepSpeed's
// default buckets stage 1 holds less than stage 0 at every N >= 2 (bench/results/memory-defaults.md,
// tests/shard/memory_report_test.cc).
//
// COLLECTIVE: every rank calls Create and Step together. After Step the trainer's gradient buffer is all zeros:
// Step reduces in it (stage 0: the average all-reduce in place; stages 1-2: this rank's slice receives the reduced
// shard) and clears it for the next backward, as the Engine clears its own gradient buffers. (torch's
// optimizer.step() leaves .grad alone; a trainer that zeroes the buffer before its backward anyway loses nothing.)
// Read the reduced gradient's norm from StepResult::grad_norm.
//
// ERRORS. Every call returns a Status for the trainer's mistakes, never an abort: buffers that are null, too small
// or of the wrong dtype, a parameter group whose pattern matches no "<FlatBuffers::name>.<tensor>" (the error lists
// the names), a buffer index or tensor name that does not exist (GatherParam, GradientsReady). The aborts left are
// zero's own invariants, as in zero/engine.h.
//
// LIFETIME AND THREADS: the trainer's buffers must outlive the ShardedOptimizer (it reads and writes them in every
// collective call); it keeps the communicator alive itself. Not thread-safe: one thread per ShardedOptimizer.
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
// engine (an NCCL communicator) both are device pointers. No two buffers of the pairs given to Create may
// overlap (the same buffer twice is an error, not a double update). A frozen pair (a ParamGroup with frozen =
// true over all its tensors) may leave `grads` null: it gets no gradient.
struct FlatBuffers {
  void* params = nullptr;
  void* grads = nullptr;
  DType dtype = DType::kF32;
  int64_t capacity = 0;
  std::vector<ParamSpec> tensors;
  std::string name = "flat";  // names the buffer pair in errors and reports; unique among the pairs
  // The tensors' full names (checkpoints, parameter groups) are their own names instead of "<name>.<tensor>":
  // for a trainer whose names are already unique across pairs (zero/torch.h: "blocks.0.attn.weight").
  bool bare_names = false;
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
  // reducer buckets, at the granularity of the buffer pairs given to Create): its reduction starts at once and,
  // with zero_optimization.overlap_comm true, runs while the trainer computes the others' gradients (at most
  // reduce_bucket_size elements in flight: a hand-over beyond that first waits for the oldest); with overlap_comm
  // false (DeepSpeed's default at stages 0-2) it returns when the reduction is done. The trainer must not write that
  // gradient buffer again before Step. Optional: Step reduces every pair not handed over. Collective (every rank,
  // same order).
  Status GradientsReady(int buffer);

  // The trainer rewrote buffer pair `buffer`'s parameters itself (read its own checkpoint into it, say): they
  // become the optimizer's values again (the fp32 master of 16-bit buffers is re-read from them), the ranks
  // agreeing on rank 0's as at Create; the optimizer state is kept. It touches no gradient (a reduction already
  // handed over goes on). Collective.
  Status ReloadParams(int buffer);

  // One optimizer step over the gradients the trainer accumulated since the last one. Collective.
  StatusOr<StepResult> Step(const StepOptions& options = {});

  // Checkpoints, as Engine::Save/Load/LoadSafetensors (zero/checkpoint.h): the parameters are read from and
  // written into the trainer's buffers; tensor full names are "<FlatBuffers::name>.<tensor>". Collective.
  StatusOr<std::string> Save(const std::string& dir, const SaveOptions& options = {});
  Status WaitForSave();  // as Engine::WaitForSave (SaveOptions::async)
  bool save_in_flight() const;
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
