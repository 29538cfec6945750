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

// On worlds that are not a power of two, rank `rank` sleeps this long in every reduce-scatter before it waits
// for the data of the next smaller binary block (if it receives any), so that the sender can finish its run
// and start the next one meanwhile. Tests use it to show that the sender waits until that data was reduced.
// A negative `rank` (the default) turns it off.
void SetGlooReduceScatterFoldDelayForTesting(int rank, int64_t microseconds);

}  // namespace zero::internal
