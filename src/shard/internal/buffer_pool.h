// shard/internal/buffer_pool.h — a free list of same-sized compute-tier buffers under one tag. defines: BufferPool.
//
// Buffers stay allocated (and counted) while pooled, so the steady state allocates nothing (on a device: no
// cudaMalloc/cudaFree). Reuse needs no event: every compute-tier use of a buffer is ordered on the compute
// tier's one stream (shard/internal/compute.h), and a collective's use of it is joined into that stream before
// the buffer comes back here.
#pragma once

#include <cstddef>
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
  Buffer Take(size_t bytes, bool zero) {
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      Buffer b = std::move(it->second);
      free_.erase(it);
      if (zero) compute_->Zero(b.data(), bytes);
      return b;
    }
    return compute_->Alloc(tag_, bytes);  // zero-filled
  }
  void Give(Buffer b) {
    if (!b.empty()) free_.emplace(b.size(), std::move(b));
  }
  bool Has(size_t bytes) const { return free_.count(bytes) > 0; }

 private:
  const std::unique_ptr<ComputeTier>& compute_;
  MemTag tag_;
  std::multimap<size_t, Buffer> free_;
};

}  // namespace zero::internal
