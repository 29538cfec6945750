// shard/internal/buffer_pool.h — a free list of same-sized compute-tier buffers under one tag. defines: BufferPool.
//
// Buffers stay allocated (and counted) while pooled, so the steady state allocates nothing (on a device: no
// cudaMalloc/cudaFree). Reuse needs no event: every compute-tier use of a buffer is ordered on the compute
// tier's one stream (shard/internal/compute.h), and a collective's use of it is joined into that stream before
// the buffer comes back here.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <utility>

#include "shard/internal/compute.h"
#include "zero/memory.h"

namespace zero::internal {

class BufferPool {
 public:
  // `compute` is the owner's pointer, read at every Take: the tier may be replaced after the pool is made
  // (the CUDA engine's is created in Init).
  BufferPool(const std::unique_ptr<ComputeTier>& compute, MemTag tag) : compute_(compute), tag_(tag) {}
  // A byte cap on what the pool holds, in use and free: a Take that finds no free buffer of its size first frees
  // free buffers of other sizes while the pool would exceed it. So the pool never holds more than the larger of
  // the cap and the most bytes in use at once. (A pool of units of one size never frees; units of many sizes
  // under a tight cap allocate again.) Unset: the pool keeps every buffer.
  void set_cap(size_t bytes) { cap_ = bytes; }
  Buffer Take(size_t bytes, bool zero) {
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      Buffer b = std::move(it->second);
      free_.erase(it);
      free_bytes_ -= bytes;
      in_use_ += bytes;
      if (zero) compute_->Zero(b.data(), bytes);
      return b;
    }
    while (!free_.empty() && in_use_ + free_bytes_ + bytes > cap_) {
      auto largest = std::prev(free_.end());
      free_bytes_ -= largest->first;
      free_.erase(largest);
    }
    Buffer b = compute_->Alloc(tag_, bytes);  // zero-filled
    if (!b.empty()) in_use_ += bytes;
    return b;
  }
  void Give(Buffer b) {
    if (b.empty()) return;
    const size_t bytes = b.size();
    in_use_ -= std::min(in_use_, bytes);
    free_bytes_ += bytes;
    free_.emplace(bytes, std::move(b));
  }
  bool Has(size_t bytes) const { return free_.count(bytes) > 0; }

 private:
  const std::unique_ptr<ComputeTier>& compute_;
  MemTag tag_;
  std::multimap<size_t, Buffer> free_;
  size_t cap_ = SIZE_MAX, in_use_ = 0, free_bytes_ = 0;
};

}  // namespace zero::internal
