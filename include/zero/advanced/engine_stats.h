// zero/advanced/engine_stats.h — the engine's stage-3 gather counters, for tests and reports that check the
// prefetcher and the live-parameter window. Not the trainer's API: what is counted may change between minor
// versions (docs/design.md, "Which headers are stable").
//
//   const zero::advanced::EngineStats s = zero::advanced::Stats(*engine);
//   EXPECT_LE(s.peak_live_elements, cfg.zero.stage3_max_live_parameters);
//
// Stats reads counters the engine keeps anyway; it issues no collective and may be called whenever the Engine
// itself may be (one thread per Engine), at any point of its life. The counts are this rank's, since Create.
#pragma once

#include <cstdint>

#include "zero/engine.h"

namespace zero::advanced {

struct EngineStats {
  int64_t prefetch_gathers = 0;  // all-gathers of a unit issued ahead by the prefetcher
  int64_t demand_gathers = 0;    // all-gathers issued when a scope opened on a unit not in flight
  // Largest number of non-persistent parameter elements gathered (AVAILABLE or INFLIGHT) at once.
  int64_t peak_live_elements = 0;
  // qwZ: all-gathers of one chunk's int8 messages, for units above allgather_bucket_size (gathered in chunks).
  int64_t qwz_chunk_gathers = 0;
  // qgZ: reductions of one chunk (its quantized all-to-alls), for units above reduce_bucket_size.
  int64_t qgz_chunk_reductions = 0;
  // The NVMe tier (offload_optimizer.device "nvme"; zeros without it): bytes the steps' passes read and wrote
  // (initial values and checkpoints not included), the milliseconds its disk worker spent moving them, and those
  // the steps spent waiting for it (a read not there yet, a write without pipeline_write).
  int64_t nvme_step_bytes_read = 0;
  int64_t nvme_step_bytes_written = 0;
  double nvme_io_busy_ms = 0;
  double nvme_wait_ms = 0;
  // The parameter tier (offload_param.device "nvme"; zeros without it): bytes its gathers and steps read and
  // wrote (initial values, GatherParam and checkpoints not included). Each gather of a unit reads its shard once;
  // each applied step writes every trainable sharded unit's shard once and, in fp32 (the shard is the master),
  // reads it once first.
  int64_t nvme_param_step_bytes_read = 0;
  int64_t nvme_param_step_bytes_written = 0;
};

EngineStats Stats(const Engine& engine);

}  // namespace zero::advanced
