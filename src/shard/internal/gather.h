// shard/internal/gather.h — stage-3 parameter gathers: issue, wait, release, and prefetch by the recorded order.
// defines: GatherScheduler.
//
// Every step records the sequence of gathers. From the second step on, each gather that matches the recorded
// order triggers prefetches of the next units in it, bounded by stage3_prefetch_bucket_size (elements in flight,
// not yet opened) and stage3_max_live_parameters (elements gathered or in flight). A gather that does not match
// logs once, stops prefetching for the rest of the step, and that step's sequence becomes the recorded order
// (DeepSpeed's PartitionedParameterCoordinator with its trace modes). Every rank runs the same trainer code, so
// every rank issues the same prefetch collectives at the same points. A demand gather that would take the live
// elements past stage3_max_live_parameters first releases units prefetched but not opened (off the recorded
// order; on it they are a prefix of what comes next, headed by the demanded unit), so the live elements stay
// within max(stage3_max_live_parameters, the units open at once) and within the units open plus
// stage3_prefetch_bucket_size. A unit larger than allgather_bucket_size is gathered in chunks
// (shard/internal/collective.h), one such unit at a time. With zero_quantized_weights (ZeRO++'s qwZ) a forward
// gather moves int8 blocks and their scales (core/internal/quantize.h) and dequantizes them into the gathered
// buffer; a backward gather moves the parameters as they are (the recorded order says which a prefetch is for).
// With offload_param "nvme" a gather first reads the unit's shard from the parameter tier into one of its
// buffer_count staging buffers (offload/nvme_param_tier.h), held until the gather is waited for: a prefetch stops
// when none is free, and a demand gather waits for the prefetched gathers holding them, first in unit order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "shard/internal/buffer_pool.h"
#include "shard/internal/context.h"

namespace zero::internal {

class GatherScheduler {
 public:
  explicit GatherScheduler(EngineContext* ctx)
      : ctx_(ctx),
        gather_pool_(ctx->compute, MemTag::kGather),
        stage_pool_(ctx->compute, MemTag::kStaging),
        chunk_pool_(ctx->compute, MemTag::kStaging),
        qwz_pool_(ctx->compute, MemTag::kStaging) {}

  // Opening a scope on sharded unit `id`: records it in this step's order, gathers it (or waits for its
  // prefetch) and prefetches ahead while the step follows the recorded order. Collective.
  Status Acquire(UnitId id, int64_t step, bool backward);
  // Closing its scope: the unit goes back to NOT_AVAILABLE (FSDP's reshard-after-forward).
  void Release(Unit& u);
  // At Step: releases prefetched units nobody opened and adopts this step's order for the next one.
  Status EndStep();
  // Advances a chunked gather in flight without blocking (a scope's close); errors go to the next call.
  void Poll();

  int64_t prefetch_gathers() const { return prefetch_gathers_; }
  int64_t demand_gathers() const { return demand_gathers_; }
  int64_t peak_live_elements() const { return peak_live_; }
  int64_t qwz_chunk_gathers() const { return qwz_chunk_gathers_; }

 private:
  // Issues the all-gather of a sharded unit into a pooled full buffer (NOT_AVAILABLE -> INFLIGHT); quantized
  // (qwZ) for a forward scope when the config asks and the unit goes in one collective.
  Status Issue(Unit& u, bool backward);
  // offload_param "nvme": the tier's staging buffer the unit's gather read its shard from, back to the pool.
  void GiveParamSlot(Unit& u);
  // The bytes of a qwZ gather's buffers back to their pool (or quarantined when its op may still write).
  void ReleaseQwz(Unit& u, bool quarantine);
  Status Wait(Unit& u);  // INFLIGHT -> AVAILABLE
  void Prefetch();
  Status FinishChunked();  // joins the chunked gather in flight, if any
  void UpdateLive(int64_t delta) {
    live_elems_ += delta;
    peak_live_ = std::max(peak_live_, live_elems_);
  }

  EngineContext* ctx_;
  BufferPool gather_pool_;
  BufferPool stage_pool_;  // CUDA engine with offload_param: see Issue
  BufferPool chunk_pool_;  // the staging of chunked gathers (shard/internal/collective.h)
  BufferPool qwz_pool_;    // qwZ's int8 messages, sent and received
  UnitId chunked_ = -1;    // the unit whose chunked gather may be in flight
  // The gathers of a step in order: (unit, for a backward scope).
  std::vector<std::pair<UnitId, bool>> order_, this_step_order_;
  bool order_valid_ = false, order_broken_ = false;
  size_t order_pos_ = 0;
  int64_t live_elems_ = 0, peak_live_ = 0;
  int64_t prefetch_gathers_ = 0, demand_gathers_ = 0, qwz_chunk_gathers_ = 0;
};

}  // namespace zero::internal
