// zero/advanced/device_memory.h — a caching, stream-ordered pool of device memory for gather buffers and buckets.
// A building block of the CUDA engine, not the trainer's API: it may change between minor versions
// (docs/design.md, "Which headers are stable").
//
//   ZERO_ASSIGN_OR_RETURN(auto pool, zero::DevicePool::Create(&tracker));
//   ZERO_ASSIGN_OR_RETURN(zero::DeviceBlock buf, pool->Allocate(bytes, zero::MemTag::kGather, comm_stream));
//   ... enqueue the all-gather into buf.data() on comm_stream; compute_stream waits on its event ...
//   buf.Release(compute_stream);   // the last kernel that reads buf was enqueued on compute_stream
//
// Why: cudaMalloc/cudaFree synchronize the device and can deadlock with in-flight collectives, so the hot path
// must not call them. The pool keeps freed blocks and hands them out again; after warm-up (once as many blocks
// of each size exist as are in flight at once) a training step makes no cudaMalloc and no cudaFree, which
// Stats().malloc_count lets a test assert.
//
// Stream-ordered reuse: releasing a block records an event on the stream named as its last user and returns
// at once. A cached block is handed out again (1) at once to an allocation on that same stream (stream order
// puts the new work after the old), or (2) to an allocation on another stream only once the event has
// completed (checked with cudaEventQuery, which never blocks). Otherwise the pool allocates a new block —
// except at its byte limit, where it makes the allocating stream wait on the pending event instead
// (cudaStreamWaitEvent: device-side order, the host is not blocked).
//
// Accounting: every byte the pool holds from cudaMalloc is reported in `tracker` under MemTier::kDevice, under
// the tag of the block's latest Allocate (a cached block stays counted under the tag it last served, since
// the memory is still held for that purpose; Stats() separates in-use from cached bytes).
//
// Thread-safe: Allocate, Release and Stats may be called from any thread. Blocks are for the device that was
// current when the pool was created; Allocate fails with kFailedPrecondition if another device is current.
// Every block must be released before the pool is destroyed (checked). Available when ZERO_HAVE_CUDA, in
// zero::cuda.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "zero/memory.h"
#include "zero/status.h"

struct CUstream_st;  // cudaStream_t without including CUDA headers.

namespace zero {

class DevicePool;

// A block of device memory from a DevicePool. Move-only. Destroying it releases it with its allocation stream
// as the last user; call Release(stream) when the last work touching it was enqueued on another stream.
class DeviceBlock {
 public:
  DeviceBlock() = default;
  DeviceBlock(DeviceBlock&& o) noexcept { *this = std::move(o); }
  DeviceBlock& operator=(DeviceBlock&& o) noexcept;
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  ~DeviceBlock() { Release(stream_); }

  // Returns the block to its pool. `last_user`: the stream whose enqueued work is the last to touch the block
  // (work on other streams must have been joined into it with events before). Stream-ordered: records an
  // event on last_user and returns at once. No-op on an empty block.
  void Release(CUstream_st* last_user);

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }          // bytes asked for
  size_t capacity() const { return capacity_; }  // bytes held (size rounded up to the pool's size class)
  MemTag tag() const { return tag_; }
  CUstream_st* stream() const { return stream_; }  // the stream it was allocated for
  bool empty() const { return data_ == nullptr; }

 private:
  friend class DevicePool;
  DevicePool* pool_ = nullptr;
  void* handle_ = nullptr;  // the pool's record of the block
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
  MemTag tag_ = MemTag::kGather;
  CUstream_st* stream_ = nullptr;
};

struct DevicePoolOptions {
  // Total bytes the pool may hold from cudaMalloc; 0: no limit besides the device's memory.
  size_t max_bytes = 0;
  // Requests below large_threshold are rounded up to a multiple of small_round, others to large_round.
  size_t small_round = 512;
  size_t large_threshold = size_t{1} << 20;
  size_t large_round = size_t{2} << 20;
  // A cached block up to this factor larger than the rounded request may serve it (no splitting).
  double max_fit_ratio = 1.25;
};

struct DevicePoolStats {
  int64_t malloc_count = 0;        // cudaMalloc calls that succeeded
  int64_t free_count = 0;          // cudaFree calls
  int64_t allocations = 0;         // Allocate calls that returned a block
  int64_t reuses = 0;              // ... served by a cached block
  int64_t same_stream_reuses = 0;  // ... of which reused on the stream that released it, event not completed
  int64_t stream_waits = 0;        // ... of which at the byte limit, by making the new stream wait on the event
  int64_t blocks = 0;              // blocks held (in use + cached)
  int64_t blocks_in_use = 0;
  int64_t bytes_reserved = 0;  // bytes held from cudaMalloc (capacities)
  int64_t bytes_in_use = 0;    // capacities of blocks in use
  std::string ToString() const;
};

class DevicePool {
 public:
  // A pool for the current device. kFailedPrecondition without a device; kInvalidArgument for bad options.
  // `tracker` must outlive the pool (nullptr: no accounting).
  static StatusOr<std::unique_ptr<DevicePool>> Create(MemoryTracker* tracker, const DevicePoolOptions& options = {});
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // A block of at least `bytes` bytes (uninitialized), usable by work enqueued on `stream` from now on.
  // bytes == 0 gives an empty block. Never blocks the host. kResourceExhausted when the limit or the device's
  // memory is reached and no cached block can be waited on; kFailedPrecondition if another device is current;
  // kInternal for other CUDA errors.
  [[nodiscard]] StatusOr<DeviceBlock> Allocate(size_t bytes, MemTag tag, CUstream_st* stream);

  DevicePoolStats Stats() const;

  // Waits for the events of all cached (released) blocks and frees them with cudaFree, which also
  // synchronizes the device. Blocks in use are kept. Not for the hot path.
  [[nodiscard]] Status ReleaseCachedSync();

  int device() const { return device_; }

 private:
  struct Block;
  struct State;
  DevicePool(MemoryTracker* tracker, const DevicePoolOptions& options, int device);
  friend class DeviceBlock;
  void ReleaseBlock(Block* block, CUstream_st* last_user);
  size_t RoundSize(size_t bytes) const;

  MemoryTracker* tracker_;
  DevicePoolOptions options_;
  int device_;
  std::unique_ptr<State> state_;
};

}  // namespace zero
