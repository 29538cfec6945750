// examples/gpt/train_cuda.h — the zero-gpt training loop on a CUDA device (ZERO_HAVE_CUDA builds).
//
//   auto comm = zero::Communicator::CreateNccl(store, rank, world, {}).value();      // or FromEnv(kNccl)
//   ZERO_ASSIGN_OR_RETURN(zero::gpt::TrainResult r, zero::gpt::TrainRankCuda(cfg, comm, opt));
//
// The same loop as TrainRank (train.h) — the same units, data order, init, phases and scopes — with the model's
// math on the device (gpt/cuda/model_cuda.h: cuBLAS matmuls plus simple kernels, fp32) and the engine on its
// CUDA tier (an NCCL communicator: parameters, gradients, master and optimizer state in device memory, or in
// the host tier with offload). Under bf16/fp16 the trainer computes on an fp32 copy of the 16-bit weights and
// adds its fp32 gradients, times the loss scale, into the 16-bit gradient buffers, as TrainRank does.
//
// Everything runs on one stream (the engine's compute stream): the model's kernels, the engine's, and the
// collectives' inputs; the host waits once per step, inside Engine::Step (the gradient statistics), and for
// the loss read-back after it. StepLog::cpu_ms is the host's CPU time. Activation recomputation is not offered
// here (options.recompute is rejected).
#pragma once

#include <functional>
#include <memory>

#include "train.h"

namespace zero::gpt {

// Trains one rank on the CUDA device current on the calling thread; `comm` must be an NCCL communicator.
// kInvalidArgument for a Gloo communicator or options.recompute; kUnimplemented without CUDA. Collective.
StatusOr<TrainResult> TrainRankCuda(const Config& config, std::shared_ptr<Communicator> comm,
                                    const TrainOptions& options,
                                    const std::function<void(const StepLog&)>& on_step = {},
                                    bool collect_final_params = false);

}  // namespace zero::gpt
