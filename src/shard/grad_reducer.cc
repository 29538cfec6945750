// shard/grad_reducer.cc — gradient buffers, reductions and their landing (shard/internal/grad_reducer.h).
#include "shard/internal/grad_reducer.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/internal/fault.h"
#include "zero/logging.h"

namespace zero::internal {

Status GradReducer::BeginBackward(UnitId id) {
  Unit& u = ctx_->units[id];
  // A reduction of this unit's previous micro-step may still read its gradient buffer.
  ZERO_RETURN_IF_ERROR(RetireUnit(id));
  ++u.backward_count;
  if (u.frozen) return absl::OkStatus();  // no gradient: the scope keeps the parameters gathered, nothing more
  const size_t bytes = u.layout.padded * DTypeSize(ctx_->cd());
  if (ctx_->stage() <= 1) return absl::OkStatus();  // persistent full_grads, zeroed at Step
  if (ctx_->policy.ReduceEveryMicroStep()) {
    // The buckets alive at once stay within the plan's cap (PlanPolicy::bucket_cap): retire the reductions in
    // flight, oldest first, until this one fits beside the rest; their buckets return to the pool for it.
    if (const int64_t cap = ctx_->policy.bucket_cap; cap > 0) {
      while (!pending_.empty() && AliveBucketElems() + u.layout.padded > cap) ZERO_RETURN_IF_ERROR(RetireOldest());
    }
    u.bucket = bucket_pool_.Take(bytes, /*zero=*/true);
    return ctx_->AllocStatus(u.bucket, bytes, "gradient bucket", u);
  }
  if (u.full_grads.empty()) {
    u.full_grads = TakeFull(bytes);  // low-communication: lives until reduced
    return ctx_->AllocStatus(u.full_grads, bytes, "full gradient", u);
  }
  return absl::OkStatus();
}

int64_t GradReducer::AliveBucketElems() const {
  int64_t n = 0;
  for (const Unit& u : ctx_->units) {
    if (!u.bucket.empty()) n += u.layout.padded;  // an open backward scope's
  }
  for (const PendingReduce& p : pending_) {
    if (!p.bucket.empty()) n += p.elems;  // a reduction's in flight
  }
  return n;
}

Buffer GradReducer::TakeFull(size_t bytes) {
  return ctx_->compute->device() ? full_pool_.Take(bytes, /*zero=*/true) : ctx_->compute->Alloc(MemTag::kGrads, bytes);
}

void GradReducer::FreeFull(Buffer& b) {
  if (ctx_->compute->device()) {
    full_pool_.Give(std::move(b));
  } else {
    b.Reset();
  }
}

// Issues the reduction of `src` (the unit's full padded gradient, `src_dtype`): an average all-reduce whose
// result is deposited in full, or an average reduce-scatter whose shard is deposited — in chunks when the unit is
// larger than reduce_bucket_size (shard/internal/collective.h).
Status GradReducer::Issue(Unit& u, void* src, DType src_dtype, bool allreduce, Deposit dep, PendingReduce p) {
  EngineContext& c = *ctx_;
  CommLabel label(c.comm.get(), absl::StrCat("gradient reduction of unit ", u.name()));
  MaybeInjectFault("reduce", c.world_rank, c.applied_steps);
  const DType wire = c.policy.wire;
  ReleaseHeld();
  const int64_t n = u.layout.padded, S = u.layout.shard;
  // reduce_bucket_size bounds the gradient elements in flight, this reduction's included: the oldest are retired
  // before it takes its buffers (the collectives run in issue order anyway, and what they free is reused here).
  // A unit larger than the bound goes alone.
  while (!pending_.empty() && pending_elems_ + n > c.cfg.zero.reduce_bucket_size) {
    ZERO_RETURN_IF_ERROR(RetireOldest());
  }
  p.unit = static_cast<UnitId>(&u - c.units.data());
  p.dep = dep;
  p.elems = n;
  const bool qgz = !allreduce && QgzOn(c.policy);
  const int64_t chunk = allreduce || qgz ? 0 : ReduceChunkPerRank(c.policy, n, u.trainer_params != nullptr);
  if (qgz) {
    // qgZ: the f32 average into a pooled output, landed by RetireOldest as a reduce-scatter's is. A unit reduced
    // whole has its source read (quantized) now: a buffer to zero after the op can be zeroed at once. One above
    // reduce_bucket_size is reduced in chunks, each read as Join issues it: its source is zeroed after the op.
    const int64_t S = u.layout.shard;
    ReclaimHeld(S * 4);
    p.recv = bucket_pool_.Take(S * 4, false);
    ZERO_RETURN_IF_ERROR(c.AllocStatus(p.recv, S * 4, "qgZ reduction output", u));
    if (qgz_scratch_.empty()) {  // kept from the first reduction on, under `buckets`, as the plan bounds it
      const auto bytes = static_cast<size_t>(c.qgz_scratch_bytes);
      qgz_scratch_ = c.compute->Alloc(MemTag::kBuckets, bytes);
      ZERO_RETURN_IF_ERROR(c.AllocStatus(qgz_scratch_, bytes, "qgZ coding scratch", u));
    }
    ZERO_CHECK_LE(QgzUnitScratchBytes(u.plan), static_cast<int64_t>(qgz_scratch_.size()));
    p.qgz = std::make_unique<QgzReduce>();
    ZERO_RETURN_IF_ERROR(
        p.qgz->Start(ctx_, &qgz_pool_, qgz_scratch_.as<float>(), u, src, src_dtype, p.recv.as<float>()));
    if (u.plan.qgz_chunks.chunks() == 0) ZeroSourceNow(p, src);
    qgz_chunk_reductions_ += u.plan.qgz_chunks.chunks();
    p.result = p.recv.data();
    p.result_dtype = DType::kF32;
    p.result_elems = S;
    return Queue(std::move(p));
  }
  void* send = src;
  if (src_dtype != wire && chunk == 0) {  // (chunks are converted as they are packed)
    p.staging = wire_pool_.Take(n * DTypeSize(wire), false);
    ZERO_RETURN_IF_ERROR(c.AllocStatus(p.staging, n * DTypeSize(wire), "wire-dtype copy of the gradient", u));
    c.compute->Convert(src, src_dtype, p.staging.data(), wire, n);
    send = p.staging.data();
    ZeroSourceNow(p, src);  // the op reads the staging copy
  }
  if (allreduce) {
    p.op = UnitCollective(ctx_, c.comm->AllReduce(send, n, wire, ReduceOp::kAvg, c.stream()));
    p.result = send == dep.ptr ? nullptr : send;
    p.result_elems = n;
  } else {
    void* recv;
    if (dep.dtype == wire && !dep.add && u.host_n() == 0) {
      recv = dep.ptr;
      p.result = nullptr;
    } else {
      ReclaimHeld(S * DTypeSize(wire));
      p.recv = bucket_pool_.Take(S * DTypeSize(wire), false);
      ZERO_RETURN_IF_ERROR(c.AllocStatus(p.recv, S * DTypeSize(wire), "reduce-scatter output", u));
      recv = p.recv.data();
      p.result = recv;
    }
    p.result_elems = S;
    if (chunk > 0) {
      p.op = UnitCollective::ReduceScatter(ctx_, &wire_pool_, src, src_dtype, recv, wire, S, chunk);
    } else {
      // A pooled bucket or staging copy is scratch: let the backend reduce in it instead of copying it first.
      const bool scratch = !p.staging.empty() || (!p.bucket.empty() && send == p.bucket.data());
      p.op = UnitCollective(ctx_,
                            scratch ? c.comm->ReduceScatterDestructive(send, recv, S, wire, ReduceOp::kAvg, c.stream())
                                    : c.comm->ReduceScatter(send, recv, S, wire, ReduceOp::kAvg, c.stream()));
    }
  }
  p.result_dtype = wire;
  return Queue(std::move(p));
}

// The reduction no longer reads `src` (it read a copy of it): a buffer to zero after it can be zeroed at once.
void GradReducer::ZeroSourceNow(PendingReduce& p, const void* src) {
  if (p.zero_after != src) return;
  ctx_->compute->Zero(p.zero_after, p.zero_bytes);
  p.zero_after = nullptr;
}

Status GradReducer::Queue(PendingReduce p) {
  pending_elems_ += p.elems;
  pending_.push_back(std::move(p));
  if (!ctx_->cfg.zero.overlap_comm) {
    while (!pending_.empty()) ZERO_RETURN_IF_ERROR(RetireOldest());
  }
  return absl::OkStatus();
}

Status GradReducer::Reduce(Unit& u) {
  if (u.frozen) return absl::OkStatus();
  EngineContext& c = *ctx_;
  const DType cd = c.cd();
  const bool last_micro = u.backward_count == c.ga();
  const size_t cds = DTypeSize(cd);
  void* G = u.GradBase();
  if (c.policy.ReduceEveryMicroStep()) {
    PendingReduce p;
    Deposit dep{u.grad_shard.data(), u.grad_shard_dtype(), /*add=*/u.backward_count > 1};
    if (c.stage() == 1) {  // the persistent full gradient is read by the op, then zeroed for the next micro-step
      p.zero_after = G;
      p.zero_bytes = u.layout.padded * cds;
    } else {
      p.bucket = std::move(u.bucket);
    }
    return Issue(u, G, cd, /*allreduce=*/false, dep, std::move(p));
  }
  // Accumulate locally; reduce once after the last micro-step.
  void* src = G;
  DType src_dtype = cd;
  if (c.policy.Accumulate16()) {
    if (u.accum_full.empty()) u.accum_full = TakeFull(u.layout.padded * 4);
    float* acc = u.accum_full.as<float>();
    c.compute->Land(G, cd, acc, DType::kF32, u.layout.padded, /*add=*/true);
    c.compute->Zero(G, u.layout.padded * cds);
    src = acc;
    src_dtype = DType::kF32;
  }
  if (!last_micro) return absl::OkStatus();
  return IssueWhole(u, G, src, src_dtype, /*free_full=*/true);
}

Status GradReducer::IssueWhole(Unit& u, void* G, void* src, DType src_dtype, bool free_full) {
  EngineContext& c = *ctx_;
  const DType cd = c.cd();
  if (c.stage() == 0) return Issue(u, src, src_dtype, /*allreduce=*/true, Deposit{src, src_dtype, false}, {});
  if (c.policy.GradInSlice(u.trainer_params != nullptr)) {
    Deposit dep{static_cast<char*>(G) + static_cast<int64_t>(c.rank) * u.layout.shard * DTypeSize(cd), cd, false};
    return Issue(u, src, src_dtype, false, dep, {});
  }
  PendingReduce p;
  p.free_full_after = free_full;
  return Issue(u, src, src_dtype, false, Deposit{u.grad_shard.data(), u.grad_shard_dtype(), false}, std::move(p));
}

Status GradReducer::ReduceTrainerOwned(Unit& u) {
  void* G = u.full_grads.data();
  return IssueWhole(u, G, G, ctx_->cd(), /*free_full=*/false);  // the trainer's buffer: read, never freed
}

Status GradReducer::RetireOldest() {
  EngineContext& c = *ctx_;
  PendingReduce p = std::move(pending_.front());
  pending_.pop_front();
  pending_elems_ -= p.elems;
  Unit& u = c.units[p.unit];
  const auto t0 = Clock::now();
  Status s = p.op.Join();  // the host waits; a device stream-waits
  if (s.ok() && p.qgz != nullptr) s = p.qgz->Join();
  c.times.reduce_wait_ms += MsSince(t0);
  if (!s.ok() && p.op.Unfinished()) {
    // The wait failed (timeout, dead peer) with the op still running: its buffers must outlive it.
    for (Buffer* b : {&p.bucket, &p.recv, &p.staging}) c.Quarantine(std::move(*b));
  }
  p.op.ReleaseStaging();
  if (p.qgz != nullptr) p.qgz->Release();  // (its own buffers: quarantined if an op of it did not complete)
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("reducing gradients of unit ", u.name(), ": ", s.message()));
  }
  if (p.result != nullptr) {
    // A reduce-scatter's host part [0, host_n) streams to the host tier on the copy stream while backward goes
    // on; the device part [host_n, shard) lands here. An all-reduce (stage 0) has no host part.
    const int64_t hn = u.host_n();  // > 0 only at stages 1-3, which reduce-scatter
    const size_t rs = DTypeSize(p.result_dtype);
    c.compute->Land(static_cast<const char*>(p.result) + hn * rs, p.result_dtype, p.dep.ptr, p.dep.dtype,
                    p.result_elems - hn, p.dep.add);
    if (hn > 0) {
      // On a device the task's D2H copy waits for the compute stream, which has joined the reduction.
      const auto ticket = copies_->Enqueue(
          c.compute->LandOnHostTask(p.result, p.result_dtype, u.host_grad.data(), u.grad_shard_dtype(), hn, p.dep.add));
      held_.emplace_back(ticket, std::move(p.recv));  // the copy reads it: back to the pool once it ran
    }
  }
  if (p.zero_after != nullptr) c.compute->Zero(p.zero_after, p.zero_bytes);
  if (p.free_full_after) {
    FreeFull(u.full_grads);
    FreeFull(u.accum_full);
  }
  bucket_pool_.Give(std::move(p.bucket));
  bucket_pool_.Give(std::move(p.recv));
  wire_pool_.Give(std::move(p.staging));
  return absl::OkStatus();
}

Status GradReducer::RetireCompleted() {
  // qgZ's second hops, in the order the reductions were issued (each communicator sees the same sequence on every
  // rank): each one whose first hop has completed, up to the first that has not.
  for (PendingReduce& p : pending_) {
    if (p.qgz == nullptr) continue;
    (void)p.qgz->Advance();  // a failure is RetireOldest's to report
    if (!p.qgz->Hop1Finished()) break;
  }
  while (!pending_.empty()) {
    PendingReduce& front = pending_.front();
    (void)front.op.Poll();  // a chunked reduction advances; a failure is RetireOldest's to report
    if (!front.op.Done() || (front.qgz != nullptr && !front.qgz->Done())) break;
    ZERO_RETURN_IF_ERROR(RetireOldest());
  }
  return absl::OkStatus();
}

// Before allocating a reduce-scatter output of `bytes`: if none is pooled but one is held by a copy to the host
// tier, wait for that copy instead of allocating (so offload's steady state allocates nothing, however the copy
// stream and the compute keep pace).
void GradReducer::ReclaimHeld(size_t bytes) {
  ReleaseHeld();
  if (bucket_pool_.Has(bytes)) return;
  for (const auto& [ticket, buffer] : held_) {
    if (buffer.size() != bytes) continue;
    const CopyStream::Ticket t = ticket;
    copies_->Wait(t);  // FIFO: every earlier copy ran too
    ReleaseHeld();     // (invalidates the iteration: done)
    return;
  }
}

// Returns to their pool the reduction buffers whose copy to the host tier has run.
void GradReducer::ReleaseHeld() {
  while (!held_.empty() && copies_->Done(held_.front().first)) {
    bucket_pool_.Give(std::move(held_.front().second));
    held_.pop_front();
  }
}

Status GradReducer::RetireUnit(UnitId unit) {
  size_t last = pending_.size();
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i].unit == unit) last = i;
  }
  if (last == pending_.size()) return absl::OkStatus();
  for (size_t i = 0; i <= last; ++i) ZERO_RETURN_IF_ERROR(RetireOldest());
  return absl::OkStatus();
}

Status GradReducer::Drain() {
  while (!pending_.empty()) ZERO_RETURN_IF_ERROR(RetireOldest());
  copies_->Sync();  // every host-tier gradient has landed
  ReleaseHeld();
  return absl::OkStatus();
}

std::pair<void*, DType> GradReducer::OptGrad(Unit& u) const {
  const EngineContext& c = *ctx_;
  const size_t cds = DTypeSize(c.cd());
  if (c.stage() == 0) {
    return c.policy.Accumulate16() ? std::make_pair(u.accum_full.data(), DType::kF32)
                                   : std::make_pair(u.full_grads.data(), c.cd());
  }
  if (c.policy.GradInSlice(u.trainer_params != nullptr)) {
    return {static_cast<char*>(u.full_grads.data()) +
                (static_cast<int64_t>(c.rank) * u.layout.shard + u.host_n()) * cds,
            c.cd()};
  }
  return {u.grad_shard.data(), u.grad_shard_dtype()};
}

void GradReducer::ZeroGrads() {
  for (auto& u : ctx_->units) {
    for (Buffer* b : {&u.full_grads, &u.grad_shard, &u.accum_full}) {
      if (!b->empty()) ctx_->compute->Zero(b->data(), b->size());
    }
    if (!u.host_grad.empty()) std::memset(u.host_grad.data(), 0, u.host_grad.size());
    u.backward_count = 0;
  }
}

bool GradReducer::WaitAllForShutdown() {
  bool unfinished = false;
  for (auto& p : pending_) {
    unfinished |= !p.op.WaitInFlight();
    if (p.qgz != nullptr) unfinished |= !p.qgz->WaitInFlight();
  }
  return unfinished;
}

}  // namespace zero::internal
