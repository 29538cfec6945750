// shard/internal/collective.h — one unit's all-gather or reduce-scatter, as one collective or in chunks bounded by
// the config. defines: UnitCollective.
//
// A unit larger than allgather_bucket_size / reduce_bucket_size is moved in chunks of ChunkPerRank elements per
// rank (shard/internal/plan.h), each rank keeping its contiguous shard. Chunk [a, b) covers that range of every
// rank's shard, so the N ranges of a chunk lie S elements apart:
//  - an all-gather, where the communicator has advanced::ExtendedCommunicator::AllGatherStrided (Gloo), gathers every
//  rank's [a, b)
//    straight to full + r·S + a; elsewhere (NCCL) it gathers into a staging buffer (ranks in order) and, once
//    joined, copies rank r's piece to full + r·S + a;
//  - a reduce-scatter, where the dtypes agree and the communicator has
//  advanced::ExtendedCommunicator::ReduceScatterStrided for the
//    chunk (Gloo: f32, power-of-two worlds, at least 1024 elements per rank), reads the ranges r·S + [a, b) where
//    they lie; elsewhere it packs them into a staging buffer (converted to the wire dtype on the way) and
//    reduce-scatters that (destructively: the staging is scratch). Either way the result lands in recv + a;
//  - qwZ's quantized all-gather (QuantizedAllGather) gathers chunk k's int8 messages into a staging buffer and, once
//    joined, hands it to the owner, which dequantizes rank r's into full + r·S + a (shard/gather.cc).
// All are the Communicator's own collectives; only the layout is the engine's. Moving data changes no value,
// and each element is reduced by the same collective algorithm over the same ranks (on Gloo its summation tree
// does not depend on where in the buffer the element lies: docs/internals/design.md), so a chunked unit trains bit for
// bit as one collective would, whichever form each chunk takes.
//
// Two staging buffers of one chunk each, double-buffered: while chunk j is on the wire, chunk j-1 is unpacked (or
// chunk j+1 packed). Strided chunks need no staging (none is taken when every chunk is strided), so nothing bounds
// how many are in flight: they are all issued at creation and run back to back on the communicator's thread while
// the owner computes (with two at a time, the rest had waited for Join). Every rank must issue the same collectives
// in the same order, so chunks are issued only at points of the program, never because an op happened to complete:
// staged, the first two at creation, the rest in Join (as slots come free: the host waits, a device's stream
// waits); strided, all at creation (every rank decides alike: the communicator's Supports* answers depend on the
// world, the count and the dtype only). Poll, between them, only finishes the chunks that have completed (an
// all-gather's unpacking). The owner keeps at most one chunked collective per staging pool in flight.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>

#include "shard/internal/buffer_pool.h"
#include "zero/status.h"
#include "zero/work.h"

namespace zero::internal {

struct EngineContext;  // shard/internal/context.h (which includes this header through unit.h)
struct QuantChunks;    // shard/internal/plan.h

class UnitCollective {
 public:
  UnitCollective() = default;  // nothing in flight: Join returns OK
  // One collective carrying the whole unit.
  UnitCollective(EngineContext* ctx, Work whole) : ctx_(ctx), whole_(std::move(whole)), has_whole_(true) {}
  UnitCollective(UnitCollective&&) = default;
  UnitCollective& operator=(UnitCollective&&) = default;
  UnitCollective(const UnitCollective&) = delete;
  UnitCollective& operator=(const UnitCollective&) = delete;

  // All-gathers this rank's shard `send` (S elements of `dtype`) into the shard-contiguous `full` (world·S) in
  // chunks of `chunk` elements per rank. `send` may be full + rank·S (in place). Errors name the chunk; the owner
  // names the unit.
  static UnitCollective AllGather(EngineContext* ctx, BufferPool* staging, const void* send, void* full, int64_t S,
                                  int64_t chunk, DType dtype);
  // Reduce-scatters (average) `src` (world·S elements of `src_dtype`, not modified) in chunks of `chunk` elements
  // per rank: block `rank` of the result lands in `recv` (S elements of `wire`). `recv` may be src + rank·S (the
  // chunk that writes a range of it has packed that range before).
  static UnitCollective ReduceScatter(EngineContext* ctx, BufferPool* staging, const void* src, DType src_dtype,
                                      void* recv, DType wire, int64_t S, int64_t chunk);
  // qwZ's gather of a unit in chunks (shard/internal/plan.h, QuantChunks): `msgs` holds this rank's message of every
  // chunk at the layout's offsets; chunk k's messages are all-gathered (as 16-bit words) into a staging buffer of
  // `world` of them, ranks in order, which `unpack(k, staging)` reads (on the compute tier) once the chunk is joined.
  // `layout` outlives the collective.
  static UnitCollective QuantizedAllGather(EngineContext* ctx, BufferPool* staging, const uint8_t* msgs,
                                           const QuantChunks* layout,
                                           std::function<void(int64_t k, const uint8_t* got)> unpack);

  bool chunked() const { return pool_ != nullptr; }
  // Without blocking and without issuing: finishes the chunks in flight that have completed.
  Status Poll();
  // Issues and joins every chunk (the whole collective: joins it), so the result may be read on the compute tier.
  // Idempotent; returns the first failure.
  Status Join();
  // Whether Join would issue nothing and return at once: every chunk issued and finished (or a failure), or, for
  // one whole collective, it has completed. (A chunked collective is Done only once Join issued its last chunks,
  // unless creation issued them all: never a reason to issue anything.)
  bool Done() const;
  // After a failure or at shutdown: waits (on the host) for what is in flight, issuing nothing more; false if an
  // op did not complete, whose buffers must then outlive it.
  bool WaitInFlight();
  // Whether an op in flight has not completed (after a failed join: its buffers must not be reused).
  bool Unfinished() const;
  // Hands the staging buffers back to their pool, or, if an op in flight did not complete (a failed wait),
  // quarantines them (EngineContext::Quarantine). Call once the collective is joined or has failed.
  void ReleaseStaging();

 private:
  void Start();           // takes the staging buffers, then issues the first chunks
  void IssueWhileFree();  // issues chunks while a staging buffer is free (the first failure goes to status_)
  Status IssueNext();     // the next chunk into a free staging buffer
  Status FinishFront();   // joins the oldest chunk in flight and, for an all-gather, unpacks it
  // Whether a reduce-scatter's chunk of n elements per rank reads the ranks' ranges where they lie
  // (advanced::ExtendedCommunicator::ReduceScatterStrided: no conversion, and the communicator has it for n) instead of
  // packing them.
  bool StridedReduce(int64_t n) const;

  struct InFlight {
    int64_t a, b;
    int slot;
    Work work;
  };

  EngineContext* ctx_ = nullptr;
  Work whole_;
  bool has_whole_ = false;
  // Chunked.
  BufferPool* pool_ = nullptr;
  bool gather_ = false;
  // Every chunk moves where it lies (AllGatherStrided; ReduceScatterStrided for every chunk size): no staging,
  // nothing to unpack, all chunks issued at creation.
  bool in_place_ = false;
  const char* src_ = nullptr;
  char* dst_ = nullptr;
  DType src_dtype_ = DType::kF32, dtype_ = DType::kF32;  // dtype_: the collective's (all-gather: = src_dtype_)
  int64_t S_ = 0, chunk_ = 0, next_ = 0;
  // QuantizedAllGather: S_ counts the chunks, chunk_ is 1 (the loop's [a, b) is chunk a), msgs are in src_.
  const QuantChunks* qwz_ = nullptr;
  std::function<void(int64_t, const uint8_t*)> unpack_;
  std::deque<InFlight> inflight_;
  Buffer slots_[2];
  bool busy_[2] = {false, false};
  Status status_;
  std::string label_;  // the communicator's label when the collective started (Communicator::SetLabel)
};

}  // namespace zero::internal
