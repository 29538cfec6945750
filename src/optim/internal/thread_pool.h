// optim/internal/thread_pool.h — a small process-wide pool of worker threads for element-wise loops.
//
//   ParallelFor(n_tiles, /*threads=*/4, [&](size_t tile) { Update(tile); });
//
// The caller is one of the `threads` and always works too, so a call never waits for a free worker and calls
// from many threads at once (N thread-ranks in one process) cannot deadlock; idle pool threads help whichever
// calls are pending. Tiles are claimed dynamically, so which thread runs a tile varies: `body` must be
// independent per tile (element-wise updates are).
#pragma once

#include <cstddef>
#include <functional>

namespace zero::optim_internal {

// Runs body(i) for every i in [0, n_items) on at most `threads` threads (the caller included; threads < 1 is 1)
// and returns when all have finished. Thread-safe; may be called concurrently from any number of threads.
void ParallelFor(size_t n_items, int threads, const std::function<void(size_t)>& body);

}  // namespace zero::optim_internal
