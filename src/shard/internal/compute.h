// The compute tier: the operations the engine runs on the memory the trainer computes in.
//
// The engine's logic (units, scopes, prefetch, buckets, the step) is one piece of code; what it runs on the
// compute tier goes through this interface, so the same engine drives host DRAM (the Gloo engine: plain
// loops, memcpy, the Highway/threaded host kernels) and a CUDA device (the NCCL engine: cudaMalloc'd buffers,
// the fused kernels of zero/advanced/cuda_kernels.h, all on the trainer's compute stream).
//
// Ordering model (docs/internals/design.md, "The device engine"): on a device every operation here is enqueued on one
// stream — the trainer's compute stream — and returns at once; a collective's input is ordered by passing that
// stream as the op's producer stream, and its result is joined with Join (Work::WaitStream). Since every
// compute-tier read and write of the engine and the trainer is on that one stream, a buffer handed back to an
// engine pool may be taken again at once: its next use is ordered after its last one. On the host every
// operation completes before it returns and Join is Work::Wait.
//
// Errors: the operations that enqueue work do not return a Status (a device reports launch failures
// asynchronously anyway); the first failure is kept and returned by status(), which the engine checks at
// every public call. Methods with Sync in their name block the calling thread until the device is done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "zero/dtype.h"
#include "zero/memory.h"
#include "zero/mixed_precision.h"
#include "zero/optimizer.h"
#include "zero/status.h"
#include "zero/work.h"

struct CUstream_st;

namespace zero::internal {

class ComputeTier {
 public:
  virtual ~ComputeTier() = default;

  // True for device memory (the trainer's views are device pointers), false for host DRAM.
  virtual bool device() const = 0;
  // The stream every compute-tier operation runs on (nullptr on the host). Collectives take it as their
  // producer stream.
  virtual CUstream_st* stream() const = 0;
  // The first failure of any operation so far (OK if none).
  virtual Status status() const = 0;

  // A zero-filled buffer of `bytes` in the compute tier, counted under (MemTier::kDevice, tag). On failure an
  // empty buffer, and status() names the tag and size.
  virtual Buffer Alloc(MemTag tag, size_t bytes) = 0;
  virtual void Zero(void* p, size_t bytes) = 0;
  // Element-wise conversion (round to nearest even); same dtypes: a copy.
  virtual void Convert(const void* src, DType sdt, void* dst, DType ddt, int64_t n) = 0;
  // Lands `n` reduced elements of `src` in `dst`: stored (converted) or, with `add`, added in f32 and rounded
  // once to `ddt`. The buffers must not overlap.
  virtual void Land(const void* src, DType sdt, void* dst, DType ddt, int64_t n, bool add) = 0;
  // Adds the overflow check and sum of squares of n gradient elements to a running total, which
  // TakeGradStatsSync returns and clears. Pieces are added in call order.
  virtual void AddGradStats(const void* g, DType dt, int64_t n) = 0;
  virtual GradStatsResult TakeGradStatsSync() = 0;
  // One optimizer step over a shard of compute-tier buffers (ShardUpdate's pointers in this tier).
  virtual void Update(const ElementwiseOptimizer& opt, const ShardUpdate& u, int threads, size_t tile) = 0;
  virtual void StochasticRound(const float* src, uint16_t* dst, size_t n, uint64_t key, int64_t first_index) = 0;
  // ZeRO++ qwZ's blockwise int8 codes (core/internal/quantize.h's format: one f32 scale per `block` elements): n
  // elements of `x` into `q` and `scales`, and back into `out`. The host kernels and the CUDA kernels
  // (zero::cuda::QuantizeInt8 / DequantizeInt8) give the same bits.
  virtual void QuantizeInt8(const void* x, DType dt, int64_t n, int64_t block, int8_t* q, float* scales) = 0;
  virtual void DequantizeInt8(const int8_t* q, const float* scales, int64_t n, int64_t block, void* out, DType dt) = 0;
  // ZeRO++ qgZ's element work (shard/internal/qgz.h builds its records from these and the ops above): int4 codes in
  // core/internal/quantize.h's format (two per byte, one f32 scale per `block` of the n f32 elements; `scratch`:
  // QuantBlockCount(n, block) floats for the quantizer), LoCo's residual step e[i] = β·e[i] + (1 − β)·(y[i] −
  // sent[i]) in f32 with a non-finite result stored as 0, and the average's division dst[i] = src[i] / divisor.
  // The host tier runs the scalar references; the CUDA kernels (cuda/internal/qgz.cuh) give the same bits.
  virtual void QuantizeInt4(const float* x, int64_t n, int64_t block, uint8_t* q, float* scales, float* scratch) = 0;
  virtual void DequantizeInt4(const uint8_t* q, const float* scales, int64_t n, int64_t block, float* out) = 0;
  virtual void LocoResidual(const float* y, const float* sent, float* e, float beta, int64_t n) = 0;
  virtual void Divide(const float* src, float* dst, int64_t n, float divisor) = 0;
  // Copies between host memory and the compute tier; the host waits until the copy is done.
  virtual void CopyToHostSync(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void CopyFromHostSync(void* dst, const void* host_src, size_t bytes) = 0;
  // Enqueues a copy of `bytes` from host memory into the compute tier on the stream; the host source must stay
  // unchanged until the stream has run it (a device reads it then). The host tier copies at once.
  virtual void CopyFromHost(void* dst, const void* host_src, size_t bytes) = 0;

  // Offload's copy-stream work (offload/copy_stream.h: these run on its worker thread, one at a time).
  // A task that lands n elements of compute-tier `src` in host memory (store or add, LandOnHost's arithmetic).
  // On a device it first waits for the compute stream's work enqueued before this call (an event recorded
  // now), so `src` may be the output of a collective joined into the stream.
  virtual std::function<void()> LandOnHostTask(const void* src, DType sdt, void* host_dst, DType ddt, int64_t n,
                                               bool add) = 0;
  // Copies `bytes` from host memory into the compute tier and returns when they are there. Copy-stream only.
  virtual void CopyInOnCopyStream(void* dst, const void* host_src, size_t bytes) = 0;

  // Joins a collective whose output the engine reads next: the host waits (host tier); a device makes the
  // stream wait for the op and returns at once (its errors surface through the communicator later).
  virtual Status Join(Work& w) = 0;
};

// Host DRAM, reported as the device tier (docs/internals/design.md, "Tiers"). `tracker` must outlive it.
std::unique_ptr<ComputeTier> MakeHostCompute(MemoryTracker* tracker);

// The tier an engine over a Gloo communicator gets: MakeHostCompute, unless a test installed a factory (to run
// the engine over an emulated asynchronous tier: tests/shard/async_tier_test.cc). Not for production use.
using ComputeTierFactory = std::function<std::unique_ptr<ComputeTier>(MemoryTracker* tracker)>;
std::unique_ptr<ComputeTier> MakeGlooEngineCompute(MemoryTracker* tracker);
void SetGlooEngineComputeForTesting(ComputeTierFactory factory);  // empty: back to MakeHostCompute

// The CUDA device `device` (the NCCL communicator's), on `stream` (the trainer's compute stream; nullptr: one
// the tier creates and owns). kUnimplemented when zero::cuda is not linked (or zero was built without CUDA);
// kFailedPrecondition without a device. `tracker` must outlive it.
StatusOr<std::unique_ptr<ComputeTier>> MakeCudaCompute(MemoryTracker* tracker, int device, CUstream_st* stream);
// Its implementation, in zero::cuda (shard/cuda_compute.cc): MakeCudaCompute calls it through the table of
// core/internal/cuda_backend.h, which zero::cuda's registration fills.
StatusOr<std::unique_ptr<ComputeTier>> MakeCudaComputeTier(MemoryTracker* tracker, int device, CUstream_st* stream);

// A copy of whole elements of `dt` and a zero-fill in the compute tier, on its stream: PackExactWith's and
// UnpackExactWith's copy and zero (shard/internal/plan.h) for qwZ's and qgZ's exact spans, and hpZ's secondary copy.
// The copy is a same-dtype Convert (a memcpy on the host, cudaMemcpyAsync on a device).
inline auto TierCopy(ComputeTier& t, DType dt) {
  return [&t, dt](void* dst, const void* src, size_t bytes) {
    t.Convert(src, dt, dst, dt, static_cast<int64_t>(bytes / DTypeSize(dt)));
  };
}
inline auto TierZero(ComputeTier& t) {
  return [&t](void* p, size_t bytes) { t.Zero(p, bytes); };
}

// The host tier's LocoResidual and Divide: the scalar references of the CUDA kernels (compiled without FMA
// contraction, as the kernels compute). LoCo's step drops a non-finite residual (an fp16 overflow the loss scaler
// will skip), which would otherwise make every later reduction of the unit non-finite too.
void LocoResidualOnHost(const float* y, const float* sent, float* e, float beta, int64_t n);
void DivideOnHost(const float* src, float* dst, int64_t n, float divisor);

// The host engine's landing of reduced elements (ComputeTier::Land on the host): also what the copy stream
// runs to land an offloaded shard in the host tier. The device kernel (zero::cuda::Add) matches it bit for bit.
void LandOnHost(const void* src, DType sdt, void* dst, DType ddt, int64_t n, bool add);

}  // namespace zero::internal
