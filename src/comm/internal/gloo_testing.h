// Internal test hooks of the Gloo communicator. Not for production code.
#pragma once

#include <cstddef>

namespace zero::internal {

// Gloo's ReduceScatterHalvingDoubling takes an `int` count and computes byte sizes in `int`, so the Gloo
// communicator splits a reduce-scatter into chunks of at most this many elements in total (all ranks'
// blocks together). The default is INT_MAX / sizeof(float); tests lower it to exercise the chunked path.
// Must be set before the communicators are created and identically on all ranks. 0 restores the default.
void SetGlooReduceScatterChunkLimitForTesting(size_t max_total_elements);
size_t GlooReduceScatterChunkLimit();

}  // namespace zero::internal
