// Internal test hooks of the Gloo communicator. Not for production code.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zero::internal {

// Gloo's ReduceScatterHalvingDoubling takes an `int` count and computes byte sizes in `int`, so the Gloo
// communicator splits a reduce-scatter into chunks of at most this many elements in total (all ranks'
// blocks together). The default is INT_MAX / sizeof(float); tests lower it to exercise the chunked path.
// Must be set before the communicators are created and identically on all ranks. 0 restores the default.
void SetGlooReduceScatterChunkLimitForTesting(size_t max_total_elements);
size_t GlooReduceScatterChunkLimit();

// A cached reduce-scatter instance is rebuilt every this many uses (default 4096) to drop the send buffers
// that retargeting retired. Tests lower it to exercise the rebuild; same rules as above. 0 restores the default.
void SetGlooReduceScatterRebuildEveryForTesting(uint64_t uses);
uint64_t GlooReduceScatterRebuildEvery();

}  // namespace zero::internal
