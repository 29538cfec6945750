// shard/gather.cc — stage-3 gathers, release and prefetch (shard/internal/gather.h).
#include "shard/internal/gather.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/internal/fault.h"
#include "core/internal/quantize.h"
#include "zero/logging.h"

namespace zero::internal {
namespace {

// qwZ's exact spans and hpZ's secondary copy: compute-dtype elements, in the compute tier.
auto TierCopy(EngineContext& c) { return TierCopy(*c.compute, c.cd()); }
auto TierZero(EngineContext& c) { return TierZero(*c.compute); }

}  // namespace

Status GatherScheduler::Issue(Unit& u, bool backward) {
  ZERO_CHECK(u.status == UnitStatus::kNotAvailable) << "unit " << u.name();
  EngineContext& c = *ctx_;
  CommLabel label(c.comm.get(), absl::StrCat("stage-3 gather of unit ", u.name()));
  MaybeInjectFault("gather", c.world_rank, c.applied_steps);
  const size_t cds = DTypeSize(c.cd());
  // hpZ: a backward gather after this step's forward one all-gathers the secondary copy inside the host group, in
  // one collective of padded / H per rank (a plain Gloo all-gather needs no staging, so no chunks). Every rank
  // decides alike: hpz_fresh follows the scopes, which every rank opens in the same order.
  const bool hpz = backward && c.hpz_comm != nullptr && u.hpz_fresh;
  u.gather_backward = backward;
  u.gather_hpz = hpz;
  // One chunked gather at a time: its two staging buffers are the gathers' whole chunk staging.
  const int64_t chunk = hpz ? 0 : ChunkPerRank(u.layout.padded, c.world, c.cfg.zero.allgather_bucket_size);
  if (chunk > 0) ZERO_RETURN_IF_ERROR(FinishChunked());
  // The pool holds at most the larger of stage3_max_live_parameters and what is in use (buffer_pool.h).
  gather_pool_.set_cap(static_cast<size_t>(std::max<int64_t>(0, c.cfg.zero.stage3_max_live_parameters)) * cds);
  u.gather = gather_pool_.Take(u.layout.padded * cds, /*zero=*/false);
  ZERO_RETURN_IF_ERROR(c.AllocStatus(u.gather, u.layout.padded * cds, "gather buffer", u));
  // With offload_param the shard is in the host tier and the all-gather reads it from there: on the host
  // engine the transport reads host memory directly, so staging the shard into the compute tier is part of
  // the (prefetched, asynchronous) gather. NCCL reads device memory: the CUDA engine first copies the shard
  // H2D on the compute stream, which the all-gather then waits for (its producer stream).
  const void* send = u.params.data();
  if (ParamStage::InTier(c, u)) {
    // offload_param "nvme": the shard is read from the tier's file into one of its staging buffers (the caller
    // made sure one is free), which the all-gather reads and Wait or Release gives back. A failed read still
    // issues the all-gather (of zeros) so that every rank issues the same collectives; the error is this rank's
    // next call's.
    const int ui = static_cast<int>(&u - c.units.data());
    StatusOr<int> slot = c.param_nvme->Take(ui, /*read=*/true, /*count_in_step=*/true);
    if (!slot.ok()) {
      ctx_->Defer(
          Status(slot.status().code(),
                 absl::StrCat("reading unit ", u.name(), "'s parameter shard for its gather on rank ", c.world_rank,
                              " (zero_optimization.offload_param.nvme_path): ", slot.status().message())));
      slot = c.param_nvme->Take(ui, /*read=*/false, /*count_in_step=*/true);
      ZERO_CHECK(slot.ok()) << slot.status();
      std::fill_n(static_cast<char*>(c.param_nvme->data(*slot)), u.layout.shard * cds, char{0});
    }
    u.param_slot = *slot;
    send = c.param_nvme->data(*slot);
  }
  if (c.compute->device() && u.params.tier() == MemTier::kHost) {
    u.stage_in = stage_pool_.Take(u.params.size(), /*zero=*/false);
    if (Status s = c.AllocStatus(u.stage_in, u.params.size(), "parameter stage-in buffer", u); !s.ok()) {
      gather_pool_.Give(std::move(u.gather));
      return s;
    }
    c.compute->CopyFromHost(u.stage_in.data(), send, u.params.size());
    send = u.stage_in.data();
  }
  const int64_t block = c.policy.qwz_block;
  if (block > 0 && !hpz && chunk > 0) {
    // qwZ on a unit above allgather_bucket_size: every chunk's message (QuantChunks: whole blocks, the chunk's exact
    // elements after them) quantized now into one send buffer, a quarter of the f32 shard's bytes; the chunks
    // all-gathered through two staging buffers of `world` messages, each dequantized into its place as it
    // completes. The blocks are a whole gather's, so are the values, bit for bit.
    const QuantChunks& qc = u.plan.qwz_chunks;
    ZERO_CHECK(qc.chunks() > 0) << "unit " << u.name() << ": no qwZ chunk layout";
    const int64_t S = u.layout.shard, scratch = QwzScratchBytes(c.policy, u.plan);
    u.qwz_send = qwz_pool_.Take(qc.total() + scratch, /*zero=*/false);
    if (Status s = c.AllocStatus(u.qwz_send, qc.total() + scratch, "qwZ send buffer", u); !s.ok()) {
      ReleaseQwz(u, /*quarantine=*/false);
      gather_pool_.Give(std::move(u.gather));
      GiveParamSlot(u);
      return s;
    }
    auto* msgs = static_cast<uint8_t*>(u.qwz_send.data());
    const std::vector<ExactSpan>& spans = ShardSpans(u.plan, c.rank);
    const auto* shard = static_cast<const uint8_t*>(send);
    uint8_t* zeroed = msgs + qc.total();  // the scratch: the shard with its spans zeroed
    if (!spans.empty()) c.compute->Convert(send, c.cd(), zeroed, c.cd(), S);
    const uint8_t* quantized = spans.empty() ? shard : zeroed;
    for (int64_t k = 0; k < qc.chunks(); ++k) {
      const int64_t a = qc.begin(k), n = qc.elems(k);
      const int64_t blocks = static_cast<int64_t>(QuantBlocks(n, block)), codes = QwzMessageBytes(n, block);
      uint8_t* msg = msgs + qc.offset[static_cast<size_t>(k)];
      uint8_t* tail = msg + codes;
      if (!spans.empty()) {
        tail = PackExactWith(shard + a * cds, zeroed + a * cds, cds, SpansIn(spans, a, a + n), tail, TierCopy(c),
                             TierZero(c));
      }
      c.compute->QuantizeInt8(quantized + a * cds, c.cd(), n, block, reinterpret_cast<int8_t*>(msg + 4 * blocks),
                              reinterpret_cast<float*>(msg));
      c.compute->Zero(msg + 4 * blocks + n, static_cast<size_t>(codes - 4 * blocks - n));  // every byte defined
      c.compute->Zero(tail, static_cast<size_t>(msg + qc.bytes(k) - tail));
    }
    EngineContext* ctx = ctx_;
    Unit* unit = &u;
    auto unpack = [ctx, unit, block](int64_t k, const uint8_t* got) {
      EngineContext& e = *ctx;
      const QuantChunks& q = unit->plan.qwz_chunks;
      const int64_t S = unit->layout.shard, a = q.begin(k), n = q.elems(k), P = q.bytes(k);
      const int64_t blocks = static_cast<int64_t>(QuantBlocks(n, block));
      const size_t es = DTypeSize(e.cd());
      for (int r = 0; r < e.world; ++r) {
        const uint8_t* msg = got + r * P;
        auto* out = static_cast<uint8_t*>(unit->gather.data()) + (r * S + a) * static_cast<int64_t>(es);
        e.compute->DequantizeInt8(reinterpret_cast<const int8_t*>(msg + 4 * blocks),
                                  reinterpret_cast<const float*>(msg), n, block, out, e.cd());
        UnpackExactWith(msg + QwzMessageBytes(n, block), es, SpansIn(ShardSpans(unit->plan, r), a, a + n), out,
                        TierCopy(e));
      }
    };
    u.gather_op = UnitCollective::QuantizedAllGather(ctx_, &chunk_pool_, msgs, &qc, std::move(unpack));
    qwz_chunk_gathers_ += qc.chunks();
    chunked_ = static_cast<UnitId>(&u - c.units.data());
  } else if (block > 0 && !hpz) {
    // qwZ: this rank's shard as int8 blocks with their scales, one message per rank, moved as 16-bit words. Every
    // gather, forward and backward, as DeepSpeed quantizes every gather of a quantized parameter: the shard does not
    // change between the two, so both scopes see the same values, and the gradient is the one of the weights the
    // forward used. (Backward gathers exact, the first version, trained the small GPT 6 % above the exact run's loss
    // after 300 steps; quantized, 1.2 %: bench/results/zeropp.md.) With hpZ the backward gathers the secondary copy,
    // which holds the forward's dequantized values: the same values again.
    // A shard's 1-D parameters (UnitPlan::exact_spans) go exact after the codes, in the compute dtype; the
    // quantized shard has them zeroed, so that a norm gain (about 1) does not set the scale of the weights beside it.
    const int64_t S = u.layout.shard, blocks = static_cast<int64_t>(QuantBlocks(S, block));
    const int64_t P = QwzUnitMessageBytes(c.policy, u.plan), scratch = QwzScratchBytes(c.policy, u.plan);
    u.qwz_send = qwz_pool_.Take(P + scratch, /*zero=*/false);
    u.qwz_recv = qwz_pool_.Take(P * c.world, /*zero=*/false);
    Status s = c.AllocStatus(u.qwz_send, P + scratch, "qwZ send buffer", u);
    if (s.ok()) s = c.AllocStatus(u.qwz_recv, P * c.world, "qwZ receive buffer", u);
    if (!s.ok()) {
      ReleaseQwz(u, /*quarantine=*/false);
      gather_pool_.Give(std::move(u.gather));
      GiveParamSlot(u);
      return s;
    }
    // Every byte moves through the compute tier (the CUDA engine's messages are device memory, on its stream).
    auto* msg = static_cast<uint8_t*>(u.qwz_send.data());
    uint8_t* tail = msg + QwzMessageBytes(S, block);
    const std::vector<ExactSpan>& spans = ShardSpans(u.plan, c.rank);
    const void* quantized = send;
    if (!spans.empty()) {
      uint8_t* zeroed = msg + P;  // the scratch: the shard with its spans zeroed
      c.compute->Convert(send, c.cd(), zeroed, c.cd(), S);
      tail = PackExactWith(send, zeroed, cds, spans, tail, TierCopy(c), TierZero(c));
      quantized = zeroed;
    }
    c.compute->QuantizeInt8(quantized, c.cd(), S, block, reinterpret_cast<int8_t*>(msg + 4 * blocks),
                            reinterpret_cast<float*>(msg));
    c.compute->Zero(msg + 4 * blocks + S, QwzMessageBytes(S, block) - 4 * blocks - S);  // padding: every byte defined
    c.compute->Zero(tail, static_cast<size_t>(msg + P - tail));
    u.gather_op = UnitCollective(ctx_, c.comm->AllGather(msg, u.qwz_recv.data(), P / 2, DType::kF16, c.stream()));
  } else if (hpz) {
    CommLabel hpz_label(c.hpz_comm.get(), absl::StrCat("hpZ backward gather of unit ", u.name()));
    const int64_t part = u.layout.padded / c.hpz_comm->world_size();
    u.gather_op = UnitCollective(ctx_, c.hpz_comm->AllGather(u.hpz_secondary.data(), u.gather.data(),
                                                             static_cast<size_t>(part), c.cd(), c.stream()));
  } else if (chunk == 0) {
    u.gather_op = UnitCollective(ctx_, c.comm->AllGather(send, u.gather.data(), u.layout.shard, c.cd(), c.stream()));
  } else {
    u.gather_op = UnitCollective::AllGather(ctx_, &chunk_pool_, send, u.gather.data(), u.layout.shard, chunk, c.cd());
    chunked_ = static_cast<UnitId>(&u - c.units.data());
  }
  u.status = UnitStatus::kInflight;
  UpdateLive(u.layout.padded);
  return absl::OkStatus();
}

Status GatherScheduler::Wait(Unit& u) {
  ZERO_CHECK(u.status == UnitStatus::kInflight);
  const auto t0 = Clock::now();
  Status s = u.gather_op.Join();  // the host waits; a device stream-waits
  ctx_->times.gather_wait_ms += MsSince(t0);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("gathering unit ", u.name(), ": ", s.message()));
  u.gather_op.ReleaseStaging();
  stage_pool_.Give(std::move(u.stage_in));  // the gather is joined into the compute stream
  GiveParamSlot(u);
  if (!u.qwz_recv.empty()) {
    // Every rank's message into its slice of the full buffer: the same bytes on every rank, so the same values.
    EngineContext& c = *ctx_;
    const int64_t S = u.layout.shard, block = c.policy.qwz_block;
    const int64_t blocks = static_cast<int64_t>(QuantBlocks(S, block)), P = QwzUnitMessageBytes(c.policy, u.plan);
    const size_t cds = DTypeSize(c.cd());
    for (int r = 0; r < c.world; ++r) {
      const auto* msg = static_cast<const uint8_t*>(u.qwz_recv.data()) + r * P;
      auto* out = static_cast<uint8_t*>(u.gather.data()) + r * S * cds;
      c.compute->DequantizeInt8(reinterpret_cast<const int8_t*>(msg + 4 * blocks), reinterpret_cast<const float*>(msg),
                                S, block, out, c.cd());
      UnpackExactWith(msg + QwzMessageBytes(S, block), cds, ShardSpans(u.plan, r), out, TierCopy(c));
    }
  }
  ReleaseQwz(u, /*quarantine=*/false);  // (a chunked gather's send buffer: its chunks were dequantized in Join)
  if (!u.gather_backward && !u.hpz_secondary.empty()) {
    // hpZ: this rank's part of what the forward computes with (dequantized under qwZ, as ZeRO++ copies its
    // secondary tensor from the gathered parameter), for this step's backward gathers. A copy in the compute tier,
    // on its stream (device memory on the CUDA engine), after the gather it reads was joined into that stream; the
    // backward's all-gather of the copy waits for the stream as every collective does.
    EngineContext& c = *ctx_;
    const int H = c.hpz_comm->world_size();
    const size_t part = static_cast<size_t>(u.layout.padded / H) * DTypeSize(c.cd());
    TierCopy(c)(u.hpz_secondary.data(), static_cast<const uint8_t*>(u.gather.data()) + c.hpz_comm->rank() * part, part);
    u.hpz_fresh = true;
  }
  u.status = UnitStatus::kAvailable;
  return absl::OkStatus();
}

void GatherScheduler::GiveParamSlot(Unit& u) {
  if (u.param_slot < 0) return;
  ctx_->param_nvme->Give(u.param_slot);
  u.param_slot = -1;
}

void GatherScheduler::ReleaseQwz(Unit& u, bool quarantine) {
  if (quarantine) {
    ctx_->Quarantine(std::move(u.qwz_send));
    ctx_->Quarantine(std::move(u.qwz_recv));
  }
  qwz_pool_.Give(std::move(u.qwz_send));
  qwz_pool_.Give(std::move(u.qwz_recv));
}

void GatherScheduler::Release(Unit& u) {
  ZERO_CHECK(u.status != UnitStatus::kNotAvailable);
  bool failed = false;
  if (u.status == UnitStatus::kInflight) {
    Status s = u.gather_op.Join();  // never reuse a buffer an op is still writing
    failed = !s.ok();
    if (failed) ctx_->Defer(s);
  }
  u.gather_op.ReleaseStaging();  // (quarantined if an op did not complete)
  const bool unfinished = failed && u.gather_op.Unfinished();
  if (unfinished) {
    ctx_->Quarantine(std::move(u.gather));  // the wait failed: the all-gather may still write into it
    ctx_->Quarantine(std::move(u.stage_in));
  }
  ReleaseQwz(u, unfinished);
  u.gather_hpz = false;
  stage_pool_.Give(std::move(u.stage_in));
  gather_pool_.Give(std::move(u.gather));
  // (Given back even when the op did not complete: it only reads the slot, and the communicator is broken.)
  GiveParamSlot(u);
  u.status = UnitStatus::kNotAvailable;
  UpdateLive(-u.layout.padded);
}

Status GatherScheduler::FinishChunked() {
  if (chunked_ < 0) return absl::OkStatus();
  Unit& v = ctx_->units[chunked_];
  chunked_ = -1;
  if (v.status != UnitStatus::kInflight) return absl::OkStatus();  // waited for (or released) already
  const auto t0 = Clock::now();
  Status s = v.gather_op.Join();
  ctx_->times.gather_wait_ms += MsSince(t0);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("gathering unit ", v.name(), ": ", s.message()));
  v.gather_op.ReleaseStaging();
  ReleaseQwz(v, /*quarantine=*/false);  // a quantized chunked gather's messages: all sent and dequantized
  return absl::OkStatus();
}

void GatherScheduler::Poll() {
  if (chunked_ < 0 || ctx_->units[chunked_].status != UnitStatus::kInflight) return;
  Unit& v = ctx_->units[chunked_];
  if (Status s = v.gather_op.Poll(); !s.ok()) {
    ctx_->Defer(absl::Status(s.code(), absl::StrCat("gathering unit ", v.name(), ": ", s.message())));
  }
}

void GatherScheduler::Prefetch() {
  const ZeroOptimizationConfig& z = ctx_->cfg.zero;
  int64_t inflight = 0;
  for (const auto& u : ctx_->units) {
    if (u.status == UnitStatus::kInflight) inflight += u.layout.padded;
  }
  for (size_t j = order_pos_; j < order_.size(); ++j) {
    Unit& v = ctx_->units[order_[j].first];
    if (v.status != UnitStatus::kNotAvailable) continue;
    if (inflight + v.layout.padded > z.stage3_prefetch_bucket_size) break;
    if (live_elems_ + v.layout.padded > ctx_->policy.LiveWindow()) break;
    // offload_param "nvme": a prefetch needs a free staging buffer of the tier (held until its gather is waited
    // for); the buffers in use follow the units' states, the same on every rank.
    if (ParamStage::InTier(*ctx_, v) && ctx_->param_nvme->free_slots() == 0) break;
    // A prefetch never waits: a chunked unit waits while another's chunked gather is in flight (decided by the
    // units' states, which every rank changes at the same calls, never by whether an op has completed).
    if (ChunkPerRank(v.layout.padded, ctx_->world, z.allgather_bucket_size) > 0 && chunked_ >= 0 &&
        ctx_->units[chunked_].status == UnitStatus::kInflight) {
      break;
    }
    if (Status s = Issue(v, order_[j].second); !s.ok()) {  // reported by the next call; prefetch stops here
      ctx_->Defer(s);
      break;
    }
    inflight += v.layout.padded;
    ++prefetch_gathers_;
  }
}

Status GatherScheduler::Acquire(UnitId id, int64_t step, bool backward) {
  Unit& u = ctx_->units[id];
  // Recorded order: this step's sequence; prefetch only while the step follows the recorded one.
  if (order_valid_ && !order_broken_) {
    if (order_pos_ < order_.size() && order_[order_pos_] == std::make_pair(id, backward)) {
      ++order_pos_;
    } else {
      order_broken_ = true;
      ZERO_LOG_ONCE(WARNING) << "unit gather order changed at step " << step << " (expected "
                             << (order_pos_ < order_.size() ? ctx_->units[order_[order_pos_].first].name() : "<end>")
                             << ", got " << u.name() << "); prefetch pauses and the order is re-recorded this step";
    }
  }
  this_step_order_.emplace_back(id, backward);
  if (u.status == UnitStatus::kNotAvailable) {
    // stage3_max_live_parameters holds on demand gathers too: units prefetched but not opened make room first
    // (only off the recorded order; on it, prefetch fills a prefix of what comes next, which this unit heads).
    for (auto& v : ctx_->units) {
      if (live_elems_ + u.layout.padded <= ctx_->policy.LiveWindow()) break;
      if (&v != &u && v.sharded_params() && v.status != UnitStatus::kNotAvailable && !v.scope_open) Release(v);
    }
    // offload_param "nvme": every staging buffer of the tier held by a prefetched gather in flight: the first
    // such gathers (in unit order, the same on every rank) are waited for, which gives their buffers back.
    if (ParamStage::InTier(*ctx_, u)) {
      for (auto& v : ctx_->units) {
        if (ctx_->param_nvme->free_slots() > 0) break;
        if (&v != &u && v.param_slot >= 0 && v.status == UnitStatus::kInflight) ZERO_RETURN_IF_ERROR(Wait(v));
      }
    }
    ZERO_RETURN_IF_ERROR(Issue(u, backward));
    ++demand_gathers_;
  }
  if (u.status == UnitStatus::kInflight) ZERO_RETURN_IF_ERROR(Wait(u));  // (or waited for above, for a buffer)
  if (order_valid_ && !order_broken_) Prefetch();
  return absl::OkStatus();
}

Status GatherScheduler::EndStep() {
  for (auto& u : ctx_->units) {
    if (u.sharded_params() && u.status != UnitStatus::kNotAvailable) Release(u);
    u.hpz_fresh = false;  // the step updates the parameters: the next forward gather refreshes the copy
  }
  if (!order_valid_ || order_broken_ || this_step_order_ != order_) order_ = this_step_order_;
  order_valid_ = !order_.empty();
  order_broken_ = false;
  order_pos_ = 0;
  this_step_order_.clear();
  return ctx_->TakeDeferredError();
}

}  // namespace zero::internal
