// shard/collective.cc — a unit's collective, whole or in chunks bounded by the config (shard/internal/collective.h).
#include "shard/internal/collective.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shard/internal/context.h"
#include "shard/internal/plan.h"
#include "zero/advanced/communicator_ext.h"

namespace zero::internal {

UnitCollective UnitCollective::AllGather(EngineContext* ctx, BufferPool* staging, const void* send, void* full,
                                         int64_t S, int64_t chunk, DType dtype) {
  UnitCollective c;
  c.ctx_ = ctx;
  c.pool_ = staging;
  c.gather_ = true;
  c.src_ = static_cast<const char*>(send);
  c.dst_ = static_cast<char*>(full);
  c.src_dtype_ = c.dtype_ = dtype;
  c.S_ = S;
  c.chunk_ = chunk;
  c.Start();
  return c;
}

UnitCollective UnitCollective::ReduceScatter(EngineContext* ctx, BufferPool* staging, const void* src, DType src_dtype,
                                             void* recv, DType wire, int64_t S, int64_t chunk) {
  UnitCollective c;
  c.ctx_ = ctx;
  c.pool_ = staging;
  c.src_ = static_cast<const char*>(src);
  c.dst_ = static_cast<char*>(recv);
  c.src_dtype_ = src_dtype;
  c.dtype_ = wire;
  c.S_ = S;
  c.chunk_ = chunk;
  c.Start();
  return c;
}

UnitCollective UnitCollective::QuantizedAllGather(EngineContext* ctx, BufferPool* staging, const uint8_t* msgs,
                                                  const QuantChunks* layout,
                                                  std::function<void(int64_t k, const uint8_t* got)> unpack) {
  UnitCollective c;
  c.ctx_ = ctx;
  c.pool_ = staging;
  c.gather_ = true;
  c.src_ = reinterpret_cast<const char*>(msgs);
  c.src_dtype_ = c.dtype_ = DType::kF16;
  c.S_ = layout->chunks();
  c.chunk_ = 1;
  c.qwz_ = layout;
  c.unpack_ = std::move(unpack);
  c.Start();
  return c;
}

void UnitCollective::Start() {
  // Both staging buffers before any chunk: a failed allocation (a device out of memory) then issues nothing, so
  // no rank waits for a chunk this one never sends.
  EngineContext& c = *ctx_;
  label_ = c.comm->label();  // later chunks may be issued under another scope's label: they keep this one
  const advanced::ExtendedCommunicator* x = advanced::Extended(*c.comm);
  in_place_ = qwz_ != nullptr ? false
              : gather_       ? x != nullptr && x->SupportsAllGatherStrided()
                              : EveryChunkSize(S_, chunk_, [this](int64_t n) { return StridedReduce(n); });
  if (in_place_) {
    IssueWhileFree();  // every chunk in place: no staging, so nothing bounds what is in flight: all of them
    return;
  }
  const size_t bytes = qwz_ != nullptr ? static_cast<size_t>(c.world * qwz_->largest)
                                       : static_cast<size_t>(c.world * chunk_) * DTypeSize(dtype_);
  for (int slot = 0; slot < (S_ > chunk_ ? 2 : 1); ++slot) {
    slots_[slot] = pool_->Take(bytes, /*zero=*/false);
    if (slots_[slot].empty()) {
      status_ = absl::ResourceExhaustedError(
          absl::StrCat(label_, ": chunk staging buffer (", bytes,
                       " bytes): ", c.compute->status().ok() ? "allocation failed" : c.compute->status().message()));
      return;
    }
  }
  IssueWhileFree();  // the first two chunks; an error stays in the collective for its Join
}

Status UnitCollective::IssueNext() {
  EngineContext& c = *ctx_;
  const int slot = busy_[0] ? 1 : 0;
  const size_t es = DTypeSize(dtype_);
  const int64_t a = next_, b = std::min(S_, next_ + chunk_), n = b - a;
  char* buf = static_cast<char*>(slots_[slot].data());
  CommLabel label(c.comm.get(), absl::StrCat(label_, ", chunk at element ", qwz_ != nullptr ? qwz_->begin(a) : a));
  Work w;
  if (qwz_ != nullptr) {
    // Chunk a's message, as 16-bit words (every rank's the same size).
    w = c.comm->AllGather(src_ + qwz_->offset[static_cast<size_t>(a)], buf, static_cast<size_t>(qwz_->bytes(a) / 2),
                          DType::kF16, c.stream());
  } else if (gather_ && in_place_) {
    // in_place_: the communicator is an ExtendedCommunicator with the strided all-gather.
    w = advanced::Extended(*c.comm)->AllGatherStrided(src_ + a * es, dst_ + a * es, static_cast<size_t>(n),
                                                      static_cast<size_t>(S_), dtype_, c.stream());
  } else if (gather_) {
    w = c.comm->AllGather(src_ + a * es, buf, static_cast<size_t>(n), dtype_, c.stream());
  } else if (StridedReduce(n)) {
    w = advanced::Extended(*c.comm)->ReduceScatterStrided(src_ + a * static_cast<int64_t>(es), dst_ + a * es,
                                                          static_cast<size_t>(n), static_cast<size_t>(S_), dtype_,
                                                          ReduceOp::kAvg, c.stream());
  } else {
    // Every rank's [a, b), ranks in order, in the wire dtype.
    const size_t ses = DTypeSize(src_dtype_);
    for (int r = 0; r < c.world; ++r) {
      c.compute->Convert(src_ + (r * S_ + a) * static_cast<int64_t>(ses), src_dtype_, buf + r * n * es, dtype_, n);
    }
    w = c.comm->ReduceScatterDestructive(buf, dst_ + a * es, static_cast<size_t>(n), dtype_, ReduceOp::kAvg,
                                         c.stream());
  }
  busy_[slot] = !in_place_;
  inflight_.push_back(InFlight{a, b, slot, std::move(w)});
  next_ = b;
  return absl::OkStatus();
}

Status UnitCollective::FinishFront() {
  EngineContext& c = *ctx_;
  InFlight& f = inflight_.front();
  Status s = c.compute->Join(f.work);  // the host waits; a device's stream waits
  if (!s.ok()) {
    const int64_t k = f.a / chunk_, chunks = (S_ + chunk_ - 1) / chunk_;
    const int64_t a = qwz_ != nullptr ? qwz_->begin(f.a) : f.a, b = qwz_ != nullptr ? a + qwz_->elems(f.a) : f.b;
    return absl::Status(s.code(), absl::StrCat(qwz_ != nullptr ? "quantized " : "", "chunk ", k + 1, " of ", chunks,
                                               " (elements [", a, ", ", b, ") of each rank's shard): ", s.message()));
  }
  if (qwz_ != nullptr) {
    unpack_(f.a, static_cast<const uint8_t*>(slots_[f.slot].data()));
  } else if (gather_ && !in_place_) {
    const size_t es = DTypeSize(dtype_);
    const int64_t n = f.b - f.a;
    const char* buf = static_cast<const char*>(slots_[f.slot].data());
    const bool in_place = src_ == dst_ + c.rank * S_ * static_cast<int64_t>(es);
    for (int r = 0; r < c.world; ++r) {
      if (in_place && r == c.rank) continue;  // already there (and what a later chunk reads is elsewhere)
      c.compute->Convert(buf + r * n * static_cast<int64_t>(es), dtype_,
                         dst_ + (r * S_ + f.a) * static_cast<int64_t>(es), dtype_, n);
    }
  }
  busy_[f.slot] = false;
  inflight_.pop_front();
  return absl::OkStatus();
}

bool UnitCollective::StridedReduce(int64_t n) const {
  if (gather_ || src_dtype_ != dtype_) return false;
  const advanced::ExtendedCommunicator* x = advanced::Extended(*ctx_->comm);
  return x != nullptr && x->SupportsReduceScatterStrided(static_cast<size_t>(n), dtype_);
}

void UnitCollective::IssueWhileFree() {
  while (status_.ok() && next_ < S_ && (in_place_ || !(busy_[0] && busy_[1]))) status_ = IssueNext();
}

Status UnitCollective::Poll() {
  if (!chunked()) return absl::OkStatus();
  while (status_.ok() && !inflight_.empty() && inflight_.front().work.IsCompleted()) status_ = FinishFront();
  return status_;
}

Status UnitCollective::Join() {
  if (has_whole_) return ctx_->compute->Join(whole_);
  if (!chunked()) return absl::OkStatus();
  // In place every chunk is in flight, and they complete in order: waiting for the last first lets this thread
  // run whatever is still queued in one go (OrderedExecutor::Help, during which the communicator's own thread stays
  // asleep) instead of waking up once per chunk; the loop below then only collects the statuses.
  if (in_place_ && status_.ok() && !inflight_.empty()) (void)ctx_->compute->Join(inflight_.back().work);
  for (IssueWhileFree(); status_.ok() && !inflight_.empty(); IssueWhileFree()) status_ = FinishFront();
  return status_;
}

bool UnitCollective::Done() const {
  if (has_whole_) return whole_.IsCompleted();
  return !chunked() || (next_ >= S_ && inflight_.empty()) || !status_.ok();
}

bool UnitCollective::WaitInFlight() {
  if (has_whole_) {
    (void)whole_.Wait();
    return whole_.IsCompleted();
  }
  bool completed = true;
  for (InFlight& f : inflight_) {
    (void)f.work.Wait();
    completed &= f.work.IsCompleted();
  }
  return completed;
}

bool UnitCollective::Unfinished() const {
  if (has_whole_) return !whole_.IsCompleted();
  for (const InFlight& f : inflight_) {
    if (!f.work.IsCompleted()) return true;
  }
  return false;
}

void UnitCollective::ReleaseStaging() {
  if (!chunked()) return;
  const bool unfinished = Unfinished();
  for (Buffer& b : slots_) {
    if (unfinished) {
      ctx_->Quarantine(std::move(b));  // an op may still read or write it
    } else {
      pool_->Give(std::move(b));
    }
  }
  busy_[0] = busy_[1] = false;
}

}  // namespace zero::internal
