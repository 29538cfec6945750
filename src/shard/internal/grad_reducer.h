// shard/internal/grad_reducer.h — gradient reduction: the buffer a backward scope writes, the reduction its
// close issues, the queue of reductions in flight and where each result lands. defines: GradReducer.
//
// Closing a backward scope issues the unit's reduction at once (average all-reduce at stage 0, average
// reduce-scatter otherwise) and queues it; with overlap_comm the trainer's next unit computes while the Gloo
// thread (or NCCL stream) reduces. reduce_bucket_size bounds the gradient elements in flight, the new reduction's
// included: before one is issued that would exceed it, the oldest are retired, and a unit larger than the bound
// goes alone, reduce-scattered in chunks of at most reduce_bucket_size (shard/internal/collective.h). The wire
// dtype is communication_data_type (fp32 unless set), so 16-bit gradients are widened once into a pooled staging
// buffer (a chunked unit: chunk by chunk, as it is packed). With optimizer offload the host part of each reduced
// shard streams to the host tier on the copy stream while backward goes on. With zero_quantized_gradients (qgZ) every
// unit goes as quantized all-to-alls instead (shard/internal/qgz.h; one above reduce_bucket_size a chunk at a time),
// its f32 average landing as the reduce-scatter's would.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>

#include "offload/copy_stream.h"
#include "shard/internal/buffer_pool.h"
#include "shard/internal/context.h"
#include "shard/internal/qgz.h"

namespace zero::internal {

class GradReducer {
 public:
  GradReducer(EngineContext* ctx, CopyStream* copies)
      : ctx_(ctx),
        copies_(copies),
        bucket_pool_(ctx->compute, MemTag::kBuckets),
        wire_pool_(ctx->compute, MemTag::kBuckets),
        full_pool_(ctx->compute, MemTag::kGrads),
        qgz_pool_(ctx->compute, MemTag::kBuckets) {}

  // Opening a backward scope: retires what still reads the unit's gradient buffer, then provides one (a pooled
  // bucket, the persistent full gradient, or the low-communication full gradient).
  Status BeginBackward(UnitId id);
  // Closing it: issues the unit's reduction (or, while accumulating locally, adds to the accumulator and
  // issues it after the last micro-step).
  Status Reduce(Unit& u);
  // The trainer's own gradient buffer of a trainer-owned unit (zero/sharded_optimizer.h), all of it accumulated
  // by the trainer: reduced in place at stages 0-1 (the average all-reduce; the reduce-scatter into this rank's
  // slice), into the reduced shard at stage 2. The trainer's buffer is read, never pooled or freed.
  Status ReduceTrainerOwned(Unit& u);
  // Retires queued reductions from the front for as long as they have completed; never waits. Their buckets go
  // back to the pool and, with offload, their shards start streaming to the host while backward goes on.
  Status RetireCompleted();
  // Retires every queued reduction (Step), then lets the copy stream land every host part.
  Status Drain();
  // The gradient the device-tier optimizer reads for this rank (the whole unit at stage 0; else the device part
  // [host_n, shard) of the shard, which is all of it without offload), and its dtype.
  std::pair<void*, DType> OptGrad(Unit& u) const;
  // Zeroes every gradient buffer for the next step.
  void ZeroGrads();
  // ~Engine: waits for every queued op; true if one did not complete (its buffers must then be leaked).
  bool WaitAllForShutdown();
  int64_t qgz_chunk_reductions() const { return qgz_chunk_reductions_; }

 private:
  // Where a reduced gradient lands: stored (converted to `dtype`) or added to what is there.
  struct Deposit {
    void* ptr = nullptr;
    DType dtype = DType::kF32;
    bool add = false;
  };
  struct PendingReduce {
    UnitId unit = -1;
    UnitCollective op;
    std::unique_ptr<QgzReduce> qgz;  // qgZ: the quantized reduction instead of `op` (shard/internal/qgz.h)
    Buffer bucket;                   // the trainer's gradient bucket (stages 2-3), returned to the pool when done
    Buffer staging;                  // the input converted to the wire dtype
    Buffer recv;                     // reduce-scatter output before it is deposited
    const void* result = nullptr;    // what to deposit (nullptr: the op wrote the deposit directly)
    DType result_dtype = DType::kF32;
    int64_t result_elems = 0;
    Deposit dep;
    void* zero_after = nullptr;  // a buffer the op reads that must be zeroed once it is done
    size_t zero_bytes = 0;
    bool free_full_after = false;  // low-communication mode: the full gradient lived only until reduced
    int64_t elems = 0;
  };

  // The one reduction of a unit's whole gradient `src` once nothing more accumulates into it: an average
  // all-reduce in place at stage 0, a reduce-scatter into this rank's slice of the full gradient G at stage 1, into
  // the reduced shard at stages 2-3 (`free_full`: the full gradient lived only until this reduction).
  Status IssueWhole(Unit& u, void* G, void* src, DType src_dtype, bool free_full);
  Status Issue(Unit& u, void* src, DType src_dtype, bool allreduce, Deposit dep, PendingReduce p);
  // Issue's end: queues the issued reduction (without overlap_comm, retires every one queued).
  Status Queue(PendingReduce p);
  void ZeroSourceNow(PendingReduce& p, const void* src);
  Status RetireOldest();
  Status RetireUnit(UnitId unit);  // up to and including the last one of `unit` (FIFO order is kept)
  void ReclaimHeld(size_t bytes);
  void ReleaseHeld();
  // Full gradients that live only until reduced (low-communication mode, the fp32 accumulator of stages 2-3):
  // freed on the host, so the report shows them gone; pooled on a device, where freeing would synchronize it.
  // Gradient-bucket elements alive now: the open backward scopes' and those of the reductions in flight.
  int64_t AliveBucketElems() const;
  Buffer TakeFull(size_t bytes);
  void FreeFull(Buffer& b);

  EngineContext* ctx_;
  CopyStream* copies_;
  BufferPool bucket_pool_;
  BufferPool wire_pool_;  // a bucket converted to the wire dtype (communication_data_type) before its reduction
  BufferPool full_pool_;  // CUDA engine only: see TakeFull
  BufferPool qgz_pool_;   // qgZ's records and partial sums
  Buffer qgz_scratch_;    // qgZ's coding scratch, one for every reduction (QgzScratchBytes), from the first on
  std::deque<PendingReduce> pending_;
  int64_t pending_elems_ = 0;
  int64_t qgz_chunk_reductions_ = 0;  // qgZ's chunks of units above reduce_bucket_size, issued or to be by Join
  std::deque<std::pair<uint64_t, Buffer>> held_;  // reduce buckets a queued copy still reads
};

}  // namespace zero::internal
