// examples/gpt/train_common.h — pieces the host (train.cc) and CUDA (train_cuda.cc) training loops share.
#pragma once

#include <array>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "data.h"
#include "model.h"
#include "train.h"
#include "zero/communicator.h"
#include "zero/engine.h"
#include "zero/memory.h"
#include "zero/status.h"

namespace zero::gpt::internal {

// CPU time of this process so far: unlike wall time, it does not grow while other tenants of a shared machine
// hold the cores.
double ProcessCpuMs();
// An all-gather of n floats per rank between host arrays (a Gloo communicator directly; NCCL through device
// copies). Collective.
using HostAllGather = std::function<Status(const float* send, float* recv, size_t n)>;
// Gathers every rank's memory report (int64 counters carried bit-exactly through f32 all-gather slots).
StatusOr<std::vector<MemoryReport>> GatherReports(int world, const MemoryReport& mine, const HostAllGather& all_gather);

// The model's units in an engine: the root (embeddings, final layernorm, tied head) and one per block.
struct GptUnits {
  UnitId root = -1;
  std::vector<UnitId> blocks;
};
// What both training loops start from: the engine (created with `engine_options`, the model's units registered
// and finalized with their seeded initial values), the run's shape from the engine's resolved config, and the
// byte corpus of the options (their seed and data file). Collective.
struct GptRun {
  std::unique_ptr<Engine> engine;
  int micro_batch = 0;
  int accumulation_steps = 0;
  DType dtype = DType::kF32;  // the compute dtype the engine hands out (fp16/bf16/f32)
  GptUnits units;
  ByteDataset data;
  int64_t first_step = 0;  // the step to start at: 0, or the resumed checkpoint's next step
  // The data cursor (ByteDataset): global samples trained before first_step — the resumed checkpoint's, which
  // need not be first_step × this run's global batch when the world or the batch changed at the restart.
  int64_t first_sample = 0;
};
StatusOr<GptRun> OpenRun(const Config& config, std::shared_ptr<Communicator> comm, const EngineOptions& engine_options,
                         const GptConfig& mc, const TrainOptions& options);
// After step `next_step - 1`, with `samples` global samples trained in all (and the data's key stride): saves a
// checkpoint tagged "step-<next_step>" to options.save_dir when save_every divides next_step or it is the last step,
// and records the tag and the time the call took (asynchronously with options.save_async). Collective.
Status MaybeSave(Engine& engine, const TrainOptions& options, int64_t next_step, int64_t samples, int64_t stride,
                 TrainResult* result);
// The asynchronous save still in flight at the end of a run, waited for (its time in save_wait_ms). Collective.
Status WaitForLastSave(Engine& engine, TrainResult* result);
// When a step started (wall clock and this process's CPU time), for its StepLog.
struct StepClock {
  std::chrono::steady_clock::time_point wall = std::chrono::steady_clock::now();
  double cpu_ms = ProcessCpuMs();
  bool save_in_flight = false;  // an asynchronous save was being written when the step began
};
// Appends step `step`'s log (loss already averaged over ranks; `tokens` = tokens of the step over all ranks;
// `samples` = global samples trained up to and including it) and hands it to `on_step` on rank 0.
void RecordStep(int64_t step, float loss, const StepResult& r, const StepClock& started, double tokens, int64_t samples,
                int rank, const std::function<void(const StepLog&)>& on_step, TrainResult* result);
// The engine's end-of-run figures: memory report, gather counts, peak live parameter elements.
// `trainer_bytes`: the trainer's own bytes in the engine's tracker beside its activations, per tier (MemTier index).
void RecordEngineStats(const Engine& engine, const GptUnits& units, TrainResult* result,
                       std::array<int64_t, 2> trainer_bytes = {});
// Every final parameter in fp32, unit by unit in registration order (the master weights). Collective.
StatusOr<std::vector<float>> FinalParams(Engine& engine, const GptUnits& units);

}  // namespace zero::gpt::internal
