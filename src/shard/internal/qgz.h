// shard/internal/qgz.h — ZeRO++ qgZ: one unit's gradient reduce-scatter as quantized all-to-alls. defines:
// QgzFormat, QgzReduce.
//
// The unit's full gradient (N shards of S elements, shard r owned by rank r) is reduced to this rank's shard, on
// the wire as records of one shard each (QgzUnitRecordBytes: int8 or int4 blocks with one f32 scale each, then the
// shard's 1-D parameters' elements exact, in f32: UnitPlan::exact_spans):
//  - one hop (the ranks are one host, or the hosts are uneven, or hybrid sharding's shard group): rank r receives
//    every rank's record of shard r by one all-to-all over the N ranks, and sums their dequantized values in f32,
//    rank order;
//  - two hops, over N = M hosts × L ranks (world rank h·L + l): first inside the host, an all-to-all over its L
//    ranks in which local rank l receives, from each, the records of the M shards {h'·L + l}: it sums them (f32,
//    local-rank order) into the host's partial sums of those shards; then across hosts, an all-to-all over the M
//    ranks of local index l in which it sends the partial of shard h'·L + l, requantized, to host h', and receives
//    every host's partial of its own shard, which it sums (host order). Per rank, what crosses hosts is (M - 1)
//    records instead of a reduce-scatter's (N - 1) f32 shards: ZeRO++'s hierarchical all-to-all (its "swizzle" is
//    the order of the first hop's records).
// A unit above reduce_bucket_size goes the same way a chunk at a time (UnitPlan::qgz_chunks: whole blocks of every
// shard's [a, b)), through one set of buffers: the same blocks, residuals and sums, so the whole reduction's bits.
// The average divides the f32 sum by N once. With LoCo error feedback (zeropp_loco_param) each quantization adds the
// residual carried from the unit's previous reduction before it quantizes, and keeps
// e ← β·e + (1 − β)·(what it sent − what it meant), as DeepSpeed's loco_swizzled_quant: residuals of the whole
// gradient (first hop) and of the host partials (second), in the compute dtype or as int8 blocks
// (zero_quantized_gradients_error_feedback_dtype, QgzResidualLayout), zeroed every reset_T reductions;
// an element whose residual would be non-finite (an fp16 overflow, a step the loss scaler skips) restarts at zero.
//
// Collective order: every rank issues the first hop when the unit's reduction is issued (GradReducer::Issue), on
// the hop-1 communicator; the second hop on its own communicator, in the order the reductions were issued, once
// the first hop has completed and the owner advances or joins it. Each communicator sees the same ops in the
// same order on every rank, whenever each rank gets to them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shard/internal/buffer_pool.h"
#include "shard/internal/compute.h"
#include "shard/internal/plan.h"
#include "zero/communicator.h"
#include "zero/dtype.h"
#include "zero/status.h"
#include "zero/work.h"

namespace zero::internal {

struct EngineContext;
struct Unit;

// A unit's qgZ residual by rank-state stream (ckpt::kRankStateStreams: 0 the first hop's, 1 the host partials');
// empty where the unit has none (LoCo off, a frozen unit, or one hop for the host residual).
Buffer& QgzResidual(Unit& u, int stream);

// qgZ's LoCo residuals are in a checkpoint only when saved with SaveOptions::save_qgz_residuals (each rank's adds a
// whole unit per rank). A Load that cannot restore them restarts every unit's at zero, and its reset_T count with
// them, as a fresh engine has them, so a resume never goes on with the residuals of steps the checkpoint does not
// hold; rank 0 logs it, naming the call (`what`: "Load", "LoadSafetensors") and `why`, when LoCo is on.
void RestartQgzResiduals(EngineContext& c, const char* what, const std::string& why);

// Where one part's LoCo residual lies (QgzResidualLayout): S values of `dtype` at `values`; or, with `scales`, S int8
// codes at `values` and their blocks' f32 scales (of the record's block) at `scales`. values null: no error feedback.
struct QgzResidualRef {
  void* values = nullptr;
  float* scales = nullptr;
  DType dtype = DType::kF32;  // (with scales: unused)
  // The residual as S f32 values into e, and e stored back: as the values are, or dequantized from and requantized
  // into blocks of `block`. Compute-tier operations, as the rest of Encode.
  void Load(ComputeTier& t, int64_t S, int64_t block, float* e) const;
  void Store(ComputeTier& t, const float* e, int64_t S, int64_t block) const;
};

// One shard's record: S elements in blocks of `block`, `bits` (8 or 4) per element, then `exact` f32 slots for the
// shard's exact elements (its spans', in order; zeros after them), the most any shard of the unit has. The exact
// elements count as zeros in their blocks, so they neither take a code's precision nor set a block's scale.
// Encode and Decode run as compute-tier operations (shard/internal/compute.h) on `t`'s stream: at once on the host,
// enqueued on a device; every pointer is compute-tier memory, and `spans` (the unit plan's) outlive the ops.
struct QgzFormat {
  int bits = 8;
  int64_t block = 1024;
  int64_t S = 0;
  int64_t exact = 0;
  int64_t record_bytes() const;
  // Quantizes x[0, S) into `rec`, `spans` exact. With a residual (err.values), first adds it to x and then updates it
  // with what the record loses (β = beta): the LoCo step (zero on the spans), in f32, then stored back as `err`
  // keeps it (int8: requantized in blocks of `block`). `scratch`: 3·S floats.
  void Encode(ComputeTier& t, const float* x, const std::vector<ExactSpan>& spans, const QgzResidualRef& err,
              float beta, uint8_t* rec, float* scratch) const;
  // out[0, S) = the record's values (acc: out += them, through `scratch`, S floats).
  void Decode(ComputeTier& t, const uint8_t* rec, const std::vector<ExactSpan>& spans, float* out, bool acc,
              float* scratch) const;
};

class QgzReduce {
 public:
  QgzReduce() = default;
  QgzReduce(QgzReduce&&) = default;
  QgzReduce& operator=(QgzReduce&&) = default;

  // Quantizes the unit's full gradient `src` (N·S elements of `src_dtype`) and issues the first hop. The average
  // lands in `out` (S floats) when the reduction is joined. Buffers from `pool`; `scratch` (QgzUnitScratchBytes of
  // the unit at least) is the coding's, shared with every other reduction: each encode and decode is done with it
  // before the next starts (on the host at once, on a device in its one stream's order). An error (an allocation)
  // issues nothing. A unit reduced whole reads `src` now and not after; one above reduce_bucket_size
  // (UnitPlan::qgz_chunks) is reduced a chunk at a time through the same buffers: the first chunk now, each later one
  // by Join, which reads that chunk of `src` then (the caller keeps it until the reduction is joined).
  Status Start(EngineContext* ctx, BufferPool* pool, float* scratch, Unit& u, const void* src, DType src_dtype,
               float* out);
  // Without blocking: once the first hop has completed, finishes it and issues the second (two hops only). On a
  // device it does nothing: Join issues the second hop, in the order the reducer retires (see qgz.cc).
  Status Advance();
  // Whether every hop is issued and has completed (Join would not block).
  bool Done() const;
  // Whether the first hop is finished (its sums taken, the second hop issued).
  bool Hop1Finished() const { return hop1_done_ || !status_.ok(); }
  // Finishes every hop (the host waits; a device's stream does), then writes the average into `out`. Idempotent.
  Status Join();
  // After a failure or at shutdown: waits for what is in flight; false if an op did not complete.
  bool WaitInFlight();
  bool Unfinished() const;
  // Hands the buffers back to the pool, or, when the reduction failed with an op still in flight, quarantines them.
  void Release();

 private:
  // Encodes part k (the whole shard, or chunk k of a unit in chunks: UnitPlan::qgz_chunks) and issues its first hop.
  void IssuePart(int64_t k);
  Status FinishHop1();  // the first hop's sums; with two hops, quantizes them and issues the second
  Status FinishHop2();  // the average of the part

  EngineContext* ctx_ = nullptr;
  BufferPool* pool_ = nullptr;
  Unit* unit_ = nullptr;
  QgzFormat fmt_;
  int L_ = 1, M_ = 1;
  float* out_ = nullptr;
  const char* src_ = nullptr;  // the unit's full gradient: read as each part is encoded
  DType src_dtype_ = DType::kF32;
  int64_t chunks_ = 1, part_ = 0, a_ = 0;      // the parts, the one in flight, and where it starts in each shard
  std::vector<std::vector<ExactSpan>> spans_;  // a chunk's: each shard's exact spans in it, counted from a_
  // Shard `shard`'s exact spans in the part in flight: the plan's for a unit reduced whole, else spans_'.
  const std::vector<ExactSpan>& Spans(int64_t shard) const;
  // The part in flight of row `row` of residual buffer `b` (`rows` rows of a shard: QgzResidualLayout); none when
  // LoCo is off.
  QgzResidualRef ResidualAt(Buffer& b, int64_t rows, int64_t row) const;
  Buffer send1_, recv1_, partial_, send2_, recv2_;
  float* scratch_ = nullptr;  // the coding's (Start), not this reduction's own
  Work hop1_, hop2_;
  bool hop1_done_ = false, hop2_issued_ = false, part_done_ = false, finished_ = false;
  Status status_;
};

}  // namespace zero::internal
