// examples/gpt/train.h — the zero-gpt training loop, one rank of it, on zero's public API only.
//
//   zero::gpt::TrainOptions opt{.model = "tiny", .steps = 20};
//   ZERO_ASSIGN_OR_RETURN(zero::gpt::TrainResult r, zero::gpt::TrainRank(cfg, comm, opt));
//
// Used by the zero-gpt binary (N thread-ranks or one rank per process) and by the engine's end-to-end tests.
//
// Activations (the residual stream, each block's saved activations, the head's, the backward scratch) come
// from a zero::Checkpointer's arena and are reported as MemTag::kActivations in the DEVICE tier — where they
// would live on an accelerator — although the host engine keeps them in host memory; checkpoints are in the
// device tier too, or in the host tier with activation_checkpointing.cpu_checkpointing (docs/guide/recompute.md).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/elastic.h"
#include "zero/engine.h"
#include "zero/memory.h"
#include "zero/recompute.h"
#include "zero/status.h"

namespace zero::gpt {

struct TrainOptions {
  std::string model = "tiny";  // "tiny" | "small"
  int64_t steps = 20;
  uint64_t seed = 1234;      // model init and data order
  int seq = 0;               // tokens per sequence; 0 = the model's max_seq
  int local_world_size = 1;  // ranks sharing this host's cores (BLAS and optimizer threads are divided)
  int blas_threads = 0;      // OpenBLAS threads; 0 = hardware threads / local_world_size
  std::string data_file;     // optional corpus file instead of the system texts
  // A budget for the engine's host tier in bytes (MemoryTracker::SetLimit before Finalize; 0: none): to run as on a
  // machine with less host memory, e.g. to see a model whose optimizer state does not fit under CPU offload train
  // with the NVMe tier (offload_optimizer.device "nvme").
  int64_t host_limit = 0;
  // Recompute every block's activations in backward (zero::Checkpointer; every k-th block when the config's
  // activation_checkpointing.number_checkpoints is below the layer count, checkpoints in the host tier with
  // cpu_checkpointing). false: nothing is recomputed.
  bool recompute = false;
  // Checkpoints (zero/checkpoint.h). `steps` is the step to stop at, so a resumed run stops where the
  // uninterrupted one does.
  std::string save_dir;    // save here every `save_every` steps and after the last step (empty: never)
  int64_t save_every = 0;  // 0: only after the last step
  // Asynchronous saves (SaveOptions::async): each Save returns once staged; the run waits for the last one at
  // its end (Engine::WaitForSave).
  bool save_async = false;
  SaveOptions::WriterPriority save_priority = SaveOptions::WriterPriority::kIdle;  // the background writer's
  int64_t save_bytes_per_s = 0;     // the background write's rate (SaveOptions::max_write_bytes_per_s; 0: the disk's)
  bool save_qgz_residuals = false;  // ZeRO++ qgZ's residuals in the checkpoints (SaveOptions::save_qgz_residuals)
  // Load its latest checkpoint after Finalize and continue from it; a folder with no checkpoint at all: start
  // (ResumeCheckpointTag: complete checkpoints without a usable `latest` are an error naming the newest).
  std::string resume_dir;
  std::string init_from;                        // initial weights from this safetensors file, by "unit.param" name
  std::map<std::string, std::string> init_map;  // this model's names to the file's (LoadOptions::name_map)
  // CUDA path (train_cuda.h): the device ordinal to run on; -1 = the calling thread's current device.
  int device = -1;
  // Live recovery (zero/elastic.h): the rank's replica groups; TrainRank's communicator is then group_comm().
  // The run joins them after Finalize, lets them admit groups at every step boundary, runs a step again after
  // another group was lost, and reads its data as the rank of the current epoch's world.
  ReplicaGroups* live = nullptr;
};

struct StepLog {
  int64_t step = 0;
  double loss = 0;  // mean over ranks and micro-steps
  double grad_norm = 0;
  double step_ms = 0;
  double cpu_ms = 0;  // CPU time of the whole process during the step (every thread-rank, BLAS and Gloo threads)
  double tokens_per_s = 0;
  bool skipped = false;
  bool save_in_flight = false;  // an asynchronous save was being written in the background when the step began
  // Rank 0's bytes sent in the step (StepResult): within its shard group, and across replicas (hybrid sharding).
  int64_t group_bytes = 0, replica_bytes = 0;
  // The data cursor after the step: global samples trained so far (ByteDataset), what a resume goes on from.
  int64_t samples = 0;
  // Rank 0's bytes sent in the step by destination: to ranks of its host, to other hosts (StepResult).
  int64_t intra_host_bytes = 0, inter_host_bytes = 0;
};

struct TrainResult {
  std::vector<StepLog> steps;
  int64_t first_step = 0;          // where this run began (a resumed run: the checkpoint's next step)
  std::vector<std::string> saved;  // checkpoint tags written, in order
  std::vector<double> save_ms;     // how long each Save call held the trainer, in the same order
  double save_wait_ms = 0;         // the final WaitForSave (save_async)
  int64_t params = 0;
  MemoryReport memory;                  // this rank's
  std::vector<MemoryReport> all_ranks;  // every rank's (gathered), in rank order
  // Final full parameters (fp32, unit by unit in registration order: root, h.0, ...), when requested.
  std::vector<float> final_params;
  // Stage-3 gather statistics of this rank (zero/advanced/engine_stats.h).
  int64_t prefetch_gathers = 0;
  int64_t demand_gathers = 0;
  int64_t peak_live_elements = 0;
  // The NVMe tier's counters of this rank (zero/advanced/engine_stats.h; zeros without the tier).
  int64_t nvme_step_bytes_read = 0, nvme_step_bytes_written = 0;
  double nvme_io_busy_ms = 0, nvme_wait_ms = 0;
  // The NVMe parameter tier (offload_param.device "nvme"): bytes its gathers and steps moved.
  int64_t nvme_param_step_bytes_read = 0, nvme_param_step_bytes_written = 0;
  // This rank's activation figures (zero::Checkpointer::stats): peaks of the arena and of the checkpoints,
  // forwards and recomputes run.
  RecomputeStats recompute;
  // The placement plan's bound on this rank's true peak, per tier (MemTier index; Engine::TruePeakBound).
  std::array<PeakBound, 2> peak_bound{};
  // Live recovery: the decisions this rank took part in (ReplicaGroups::history), and the steps it ran again
  // after another group was lost.
  std::vector<Membership> live_history;
  int64_t live_redone_steps = 0;
};

// Trains one rank. `on_step` (rank 0 only, may be empty) is called after every step. Collective.
StatusOr<TrainResult> TrainRank(const Config& config, std::shared_ptr<Communicator> comm, const TrainOptions& options,
                                const std::function<void(const StepLog&)>& on_step = {},
                                bool collect_final_params = false);

}  // namespace zero::gpt
