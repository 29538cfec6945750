// zero/advanced/communicator_ext.h — what the engine asks of a communicator beyond zero/communicator.h: strided
// collectives, an all-to-all, the sizes of the communicator's staging, and a hash of the ops issued. Building blocks,
// not the trainer's API: they may change between minor versions (docs/design.md, "Which headers are stable").
//
//   if (const zero::advanced::ExtendedCommunicator* x = zero::advanced::Extended(comm);
//       x != nullptr && x->SupportsAllGatherStrided()) { ... }
//
// The Gloo and NCCL communicators derive from ExtendedCommunicator. A trainer's own Communicator need not: the
// engine then takes every default below (no strided collectives: it stages and copies; no staging counted in its
// memory bound; no op-hash comparison at Step, the step-number check still runs). A wrapper that forwards to
// another communicator (counts or delays ops) derives from ExtendedCommunicator and forwards these too, so that
// the engine sees through it. Thread-safety and ordering are Communicator's (zero/communicator.h): the queries
// are const and may be called from any thread; the ops follow the ordering contract of every other op.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/communicator.h"
#include "zero/dtype.h"
#include "zero/work.h"

struct CUstream_st;

namespace zero::advanced {

class ExtendedCommunicator : public Communicator {
 public:
  // Like AllGather, but rank r's block lands at recv + r*stride elements (stride >= count): the blocks need not
  // be adjacent. The engine's chunked all-gather uses it to gather each rank's range of a chunk straight into
  // its place in the unit, instead of through a staging buffer it then copies out. `send` may alias
  // recv + rank*stride (in-place); what lies between the blocks is not touched. Only where
  // SupportsAllGatherStrided() (Gloo: Gloo's ring all-gather with the blocks' offsets moved); elsewhere the
  // Work fails with kUnimplemented and callers gather contiguously and copy.
  virtual bool SupportsAllGatherStrided() const { return false; }
  virtual Work AllGatherStrided(const void* send, void* recv, size_t count, size_t stride, DType dtype,
                                CUstream_st* stream = nullptr);

  // Like ReduceScatter, but rank r's block of the input lies at send + r*stride elements (stride >= count): the
  // blocks need not be adjacent. `send` is not modified; `recv` may alias send + rank*stride. The engine's chunked
  // reduce-scatter uses it to read each rank's range of a chunk where it lies, instead of packing the ranges into
  // a staging buffer first. Only where SupportsReduceScatterStrided(count, dtype) (Gloo: f32 on power-of-two
  // worlds, at least 1024 elements per rank: its reduce-scatter that reads a const input); elsewhere the Work
  // fails with kUnimplemented and callers pack the blocks. Bit for bit ReduceScatter of the packed blocks.
  virtual bool SupportsReduceScatterStrided(size_t /*count*/, DType /*dtype*/) const { return false; }
  virtual Work ReduceScatterStrided(const void* send, void* recv, size_t count, size_t stride, DType dtype, ReduceOp op,
                                    CUstream_st* stream = nullptr);

  // Sends block r of `send` (world·count elements, block r = [r·count, (r+1)·count)) to rank r, and receives rank
  // r's block for this rank into block r of `recv` (world·count elements): MPI_Alltoall, torch's all_to_all_single
  // with equal splits. Block `rank` is copied locally. `send` and `recv` must not overlap. No reduction, so the dtype
  // only sizes the elements (the engine moves ZeRO++ qgZ's quantized gradient messages as 16-bit words). Only where
  // SupportsAllToAll() (Gloo: gloo::alltoall); elsewhere the Work fails with kUnimplemented.
  virtual bool SupportsAllToAll() const { return false; }
  virtual Work AllToAll(const void* send, void* recv, size_t count, DType dtype, CUstream_st* stream = nullptr);

  // What the engine's bound on its true peak needs of the communicator's staging (docs/design.md, "The true
  // peak and its bound"): the budget of what stays cached between ops (CommOptions::cache_bytes), and the staging
  // bytes one op holds while it runs — a ReduceScatter (ReduceScatterDestructive if `destructive`) or an AllReduce
  // of `count` elements per rank (AllReduce: in all) of `dtype`. 0 where the backend counts nothing (NCCL's
  // internal buffers are not tracked; AllGather and Broadcast stage nothing on either backend).
  virtual int64_t cache_bytes() const { return 0; }
  virtual int64_t ReduceScatterStagingBytes(size_t /*count*/, DType /*dtype*/, bool /*destructive*/) const { return 0; }
  virtual int64_t AllReduceStagingBytes(size_t /*count*/, DType /*dtype*/) const { return 0; }

  // A running hash of every op issued so far (kind, dtype, count, root, reduce op, label): equal on all ranks
  // exactly when they issued the same sequence. The Engine compares it across ranks at every Step. 0 when the
  // implementation does not keep one.
  virtual uint64_t IssuedOpsHash() const { return 0; }

  // The job this communicator served lost a rank for good (live recovery, zero/elastic.h): its destruction
  // closes the connections at once instead of first meeting peers that will never come. Thread-safe.
  virtual void Abandon() {}
};

// `comm` as an ExtendedCommunicator, or nullptr when it is a plain Communicator (a trainer's own).
ExtendedCommunicator* Extended(Communicator& comm);
const ExtendedCommunicator* Extended(const Communicator& comm);

}  // namespace zero::advanced
