// comm/internal/gloo_staging.h — the host staging one op of the Gloo communicator holds, without a communicator.
//
// The Gloo communicator's ReduceScatterStagingBytes / AllReduceStagingBytes call these with its own world size,
// so a caller that has no communicator yet (zero::Estimate, which predicts a run before it starts) gets exactly
// the figures a Gloo communicator of `world` ranks would report.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/dtype.h"

namespace zero::internal {

// Bytes a Gloo ReduceScatter (ReduceScatterDestructive if `destructive`) of `count` elements per rank holds while
// it runs, at `world` ranks: Gloo's receive buffers in the cached instance, and the staged input copy unless the
// op reduces in the caller's buffer.
int64_t GlooReduceScatterStagingBytes(int world, size_t count, DType dtype, bool destructive);
// Bytes a Gloo AllReduce of `count` elements holds while it runs: the f32 scratch of a 16-bit reduction.
int64_t GlooAllReduceStagingBytes(int world, size_t count, DType dtype);
// Whether a Gloo communicator of `world` ranks has ReduceScatterStrided for `count` elements per rank of `dtype`
// (Communicator::SupportsReduceScatterStrided). Every Gloo communicator has AllGatherStrided.
bool GlooSupportsReduceScatterStrided(int world, size_t count, DType dtype);

}  // namespace zero::internal
