// The offloaded optimizer step over a host-tier range of a shard, pipelined with the copy-back of the updated
// parameters to the compute tier. defines: HostStep, RunHostStep.
//
//   tile k:  [optimizer threads: host master/state/grad tile k -> staging[k % 2]]
//            [copy stream:       staging[k % 2] -> compute-tier parameters, tile k]
//
// Before tile k+2 reuses staging[k % 2] the copy of tile k must have finished, so at most two tiles are in
// flight and the copy of tile k overlaps the update of tile k+1 (double buffering, as DeepSpeed's
// ZeRO-Offload overlaps its CPU Adam with the fp16 copy to the GPU). The arithmetic is the ordinary
// ParallelUpdate's, element for element, so the result is bitwise the non-offloaded step's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "offload/copy_stream.h"
#include "zero/memory.h"
#include "zero/optimizer.h"

namespace zero::internal {

struct HostStep {
  // The update of the whole host range. `u.param_out` is the compute-tier destination of the updated
  // parameters (u.param_out_dtype), or nullptr when the parameters need no copy (their master is updated).
  ShardUpdate u;
  // Where the updated parameters go directly, skipping the staging copy (offload_param: the parameters
  // themselves live in the host tier). Exclusive with u.param_out.
  void* param_host = nullptr;
  int threads = 1;
  size_t optimizer_tile = 1 << 20;  // ParallelUpdate's tile (sub_group_size)
  size_t pipeline_tile = 1 << 20;   // elements per staged copy
  // bf16 stochastic rounding instead of the fused round-to-nearest write-back, keyed by `stochastic_key` and each
  // element's global index (u.first_element for element 0; zero/mixed_precision.h StochasticRoundToBF16).
  bool stochastic = false;
  uint64_t stochastic_key = 0;
  // Runs on the copy stream's worker: copies `bytes` of staged host parameters into the compute tier and
  // returns when they are there (a device's H2D copy). Empty: memcpy (the host engine's compute tier is DRAM).
  std::function<void(void* dst, const void* host_src, size_t bytes)> copy_to_compute;
};

// Two host staging buffers and the copy each is waiting on. Shared by consecutive steps (units): a buffer is
// reused only once the copy that reads it has run, across calls too.
struct StagingPair {
  Buffer buffers[2];  // each at least pipeline_tile * DTypeSize(param_out_dtype) bytes
  CopyStream::Ticket busy[2] = {0, 0};
  int next = 0;
};

// Runs the step; returns the copy-stream ticket of the last copy (0 when nothing was copied). Blocks only on
// the copy stream for a staging buffer's reuse (counted in its wait time).
CopyStream::Ticket RunHostStep(const ElementwiseOptimizer& opt, const HostStep& step, CopyStream& copies,
                               StagingPair& staging);

}  // namespace zero::internal
