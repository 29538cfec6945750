// shard/qgz.cc — ZeRO++ qgZ, the quantized gradient reduce-scatter (shard/internal/qgz.h).
#include "shard/internal/qgz.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/internal/quantize.h"
#include "shard/internal/context.h"
#include "shard/internal/plan.h"
#include "zero/advanced/communicator_ext.h"
#include "zero/logging.h"

namespace zero::internal {

int64_t QgzFormat::record_bytes() const { return QgzRecordBytes(S, block, bits) + 4 * exact; }

void QgzResidualRef::Load(ComputeTier& t, int64_t S, int64_t block, float* e) const {
  if (scales != nullptr) {
    t.DequantizeInt8(static_cast<const int8_t*>(values), scales, S, block, e, DType::kF32);
  } else {
    t.Convert(values, dtype, e, DType::kF32, S);
  }
}

void QgzResidualRef::Store(ComputeTier& t, const float* e, int64_t S, int64_t block) const {
  if (scales != nullptr) {
    // Zeros quantize to zero codes (an all-zero block to a zero scale), so the spans' residual stays exactly zero.
    t.QuantizeInt8(e, DType::kF32, S, block, static_cast<int8_t*>(values), scales);
  } else {
    t.Convert(e, DType::kF32, values, dtype, S);
  }
}

void QgzFormat::Encode(ComputeTier& t, const float* x, const std::vector<ExactSpan>& spans, const QgzResidualRef& err,
                       float beta, uint8_t* rec, float* scratch) const {
  const int64_t blocks = (S + block - 1) / block;
  auto* scales = reinterpret_cast<float*>(rec);
  uint8_t* codes = rec + 4 * blocks;
  uint8_t* tail = rec + QgzRecordBytes(S, block, bits);  // the exact values (2-byte aligned: copied, not cast)
  float* e = scratch;                                    // the residual, in f32
  float* y = scratch + S;                                // what is quantized: x plus the residual
  float* sent = scratch + 2 * S;                         // what the record reads back (first, the int4 scratch)
  const float* q = x;
  if (err.values != nullptr) {
    err.Load(t, S, block, e);
    t.Convert(x, DType::kF32, y, DType::kF32, S);
    t.Land(e, DType::kF32, y, DType::kF32, S, /*add=*/true);  // y = x + e
    q = y;
  } else if (!spans.empty()) {
    t.Convert(x, DType::kF32, y, DType::kF32, S);  // the spans are zeroed below: not in the caller's x
    q = y;
  }
  // The exact elements go to the tail as they are (their residual is zero) and count as zeros in their blocks.
  uint8_t* filled = PackExactWith(q, const_cast<float*>(q), 4, spans, tail, TierCopy(t, DType::kF32), TierZero(t));
  t.Zero(filled, static_cast<size_t>(tail + 4 * exact - filled));
  if (bits == 8) {
    t.QuantizeInt8(q, DType::kF32, S, block, reinterpret_cast<int8_t*>(codes), scales);
  } else {
    t.QuantizeInt4(q, S, block, codes, scales, sent);
  }
  const int64_t used = 4 * blocks + (bits == 8 ? S : (S + 1) / 2);
  t.Zero(rec + used, static_cast<size_t>(tail - (rec + used)));  // the padding: every byte sent is defined
  if (err.values == nullptr) return;
  // e ← β·e + (1 − β)·(y − sent): what this record lost, carried (smoothed) into the unit's next reduction; a
  // non-finite one restarts at zero (LocoResidualOnHost). On the spans y was zeroed and sent is exact: their residual
  // stays zero.
  Decode(t, rec, {}, sent, /*acc=*/false, nullptr);
  t.LocoResidual(y, sent, e, beta, S);
  for (const ExactSpan& sp : spans) t.Zero(e + sp.begin, static_cast<size_t>(sp.end - sp.begin) * 4);
  err.Store(t, e, S, block);
}

void QgzFormat::Decode(ComputeTier& t, const uint8_t* rec, const std::vector<ExactSpan>& spans, float* out, bool acc,
                       float* scratch) const {
  const int64_t blocks = (S + block - 1) / block;
  const auto* scales = reinterpret_cast<const float*>(rec);
  const uint8_t* codes = rec + 4 * blocks;
  const uint8_t* tail = rec + QgzRecordBytes(S, block, bits);
  float* dst = acc ? scratch : out;
  if (bits == 8) {
    t.DequantizeInt8(reinterpret_cast<const int8_t*>(codes), scales, S, block, dst, DType::kF32);
  } else {
    t.DequantizeInt4(codes, scales, S, block, dst);
  }
  UnpackExactWith(tail, 4, spans, dst, TierCopy(t, DType::kF32));
  if (acc) t.Land(dst, DType::kF32, out, DType::kF32, S, /*add=*/true);  // out += dst
}

namespace {

void ZeroResiduals(Unit& u, EngineContext& c) {
  for (int k = 0; k < 2; ++k) {  // QgzResidual's two streams
    Buffer& b = QgzResidual(u, k);
    if (!b.empty()) c.compute->Zero(b.data(), b.size());
  }
}

// The unit's residuals, zeroed every reset_T reductions (and, allocated by the plan, zero at first).
void MaybeResetResiduals(const PlanPolicy& p, Unit& u, EngineContext& c) {
  if (p.loco_reset <= 0 || u.qgz_rounds == 0 || u.qgz_rounds % p.loco_reset != 0) return;
  ZeroResiduals(u, c);
}

}  // namespace

Buffer& QgzResidual(Unit& u, int stream) { return stream == 0 ? u.qgz_residual : u.qgz_host_residual; }

void RestartQgzResiduals(EngineContext& c, const char* what, const std::string& why) {
  for (Unit& u : c.units) {
    ZeroResiduals(u, c);
    u.qgz_rounds = 0;
  }
  if (c.policy.qgz_bits > 0 && c.policy.qgz_loco && c.world_rank == 0) {
    ZERO_LOG(INFO) << what << ": qgZ's LoCo residuals restart at zero (" << why
                   << "), so the steps after it round their gradients otherwise than an uninterrupted run would";
  }
}

Status QgzReduce::Start(EngineContext* ctx, BufferPool* pool, float* scratch, Unit& u, const void* src, DType src_dtype,
                        float* out) {
  ctx_ = ctx;
  pool_ = pool;
  scratch_ = scratch;
  unit_ = &u;
  out_ = out;
  src_ = static_cast<const char*>(src);
  src_dtype_ = src_dtype;
  EngineContext& c = *ctx;
  const PlanPolicy& p = c.policy;
  const int N = c.world;
  L_ = p.qgz_local;
  M_ = N / L_;
  // Whole, one part of the shard; in chunks (a unit above reduce_bucket_size), one part per chunk, one after
  // another through the same buffers, sized for the largest.
  const QuantChunks& qc = u.plan.qgz_chunks;
  chunks_ = qc.chunks() > 0 ? qc.chunks() : 1;
  const int64_t S = QgzPartElems(u.plan), R = QgzPartRecordBytes(p, u.plan);
  struct Want {
    Buffer* b;
    int64_t bytes;
    const char* what;
  };
  const Want wants[] = {{&send1_, N * R, "qgZ send records"},
                        {&recv1_, N * R, "qgZ receive records"},
                        {&partial_, M_ * S * 4, "qgZ partial sums"},
                        {&send2_, M_ > 1 ? M_ * R : 0, "qgZ second-hop send records"},
                        {&recv2_, M_ > 1 ? M_ * R : 0, "qgZ second-hop receive records"}};
  for (const Want& w : wants) {
    if (w.bytes == 0) continue;
    *w.b = pool_->Take(static_cast<size_t>(w.bytes), /*zero=*/false);
    if (Status s = c.AllocStatus(*w.b, static_cast<size_t>(w.bytes), w.what, u); !s.ok()) {
      Release();
      return s;
    }
  }
  MaybeResetResiduals(p, u, c);  // once per reduction, whatever its parts
  ++u.qgz_rounds;
  IssuePart(0);
  return absl::OkStatus();
}

void QgzReduce::IssuePart(int64_t k) {
  EngineContext& c = *ctx_;
  const PlanPolicy& p = c.policy;
  Unit& u = *unit_;
  const QuantChunks& qc = u.plan.qgz_chunks;
  const int N = c.world;
  const int64_t full = u.layout.shard;
  part_ = k;
  const bool chunked = qc.chunks() > 0;
  a_ = chunked ? qc.begin(k) : 0;
  const int64_t S = chunked ? qc.elems(k) : full;
  // A chunk's exact spans in each shard, counted from its start (a unit reduced whole reads the plan's); the record
  // holds the most any shard has, as the plan sized it.
  spans_.clear();
  if (chunked) {
    for (int r = 0; r < N; ++r) spans_.push_back(SpansIn(ShardSpans(u.plan, r), a_, a_ + S));
  }
  fmt_ = QgzFormat{p.qgz_bits, p.qgz_block, S, chunked ? qc.exact[static_cast<size_t>(k)] : u.plan.exact_max};
  hop1_done_ = hop2_issued_ = part_done_ = false;
  const int64_t R = fmt_.record_bytes();
  const size_t ses = DTypeSize(src_dtype_);
  float* scratch = scratch_;
  float* x = partial_.as<float>();  // the part being encoded, in f32 (the partials come later)
  // Message to local peer j: the records of shards {h·L + j : h < M}, h in order (one hop: shard j alone).
  auto* send = static_cast<uint8_t*>(send1_.data());
  for (int j = 0; j < L_; ++j) {
    for (int h = 0; h < M_; ++h) {
      const int64_t shard = static_cast<int64_t>(h) * L_ + j;
      const int64_t at = shard * full + a_;  // this part of the shard, in the unit
      c.compute->Convert(src_ + at * static_cast<int64_t>(ses), src_dtype_, x, DType::kF32, S);
      fmt_.Encode(*c.compute, x, Spans(shard), ResidualAt(u.qgz_residual, N, shard), p.loco_beta,
                  send + (static_cast<int64_t>(j) * M_ + h) * R, scratch);
    }
  }
  Communicator* intra = c.qgz_intra();
  CommLabel label(intra, absl::StrCat("qgZ gradient all-to-all of unit ", u.name(), M_ > 1 ? " inside the host" : "",
                                      chunks_ > 1 ? absl::StrCat(", chunk ", k + 1, " of ", chunks_) : ""));
  advanced::ExtendedCommunicator* x1 = advanced::Extended(*intra);
  hop1_ = x1->AllToAll(send1_.data(), recv1_.data(), static_cast<size_t>(M_ * R / 2), DType::kF16, c.stream());
}

QgzResidualRef QgzReduce::ResidualAt(Buffer& b, int64_t rows, int64_t row) const {
  const PlanPolicy& p = ctx_->policy;
  if (!p.qgz_loco) return {};
  const QgzResidualLayout lay = QgzResidualOf(p, rows, unit_->layout.shard);
  char* base = static_cast<char*>(b.data());
  const int64_t at = row * lay.S + a_;  // this part's first element; a multiple of the block within its row
  if (!lay.int8) {
    return {base + at * static_cast<int64_t>(DTypeSize(ctx_->cd())), nullptr, ctx_->cd()};
  }
  ZERO_CHECK_EQ(a_ % lay.block, 0);  // parts start at whole blocks (QgzChunkLayout's chunks are lcm(block, 8) long)
  float* scales = reinterpret_cast<float*>(base + lay.rows * lay.S) + row * lay.blocks_per_row() + a_ / lay.block;
  return {base + at, scales};
}

const std::vector<ExactSpan>& QgzReduce::Spans(int64_t shard) const {
  return spans_.empty() ? ShardSpans(unit_->plan, shard) : spans_[static_cast<size_t>(shard)];
}

Status QgzReduce::FinishHop1() {
  EngineContext& c = *ctx_;
  const PlanPolicy& p = c.policy;
  Status s = c.compute->Join(hop1_);  // the host waits; a device stream-waits
  if (!s.ok()) return s;
  hop1_done_ = true;
  const int64_t S = fmt_.S, R = fmt_.record_bytes();
  float* scratch = scratch_;
  float* partial = partial_.as<float>();
  const auto* recv = static_cast<const uint8_t*>(recv1_.data());
  // Partial h: the sum over this host's ranks j (in order) of their records of shard h·L + local rank.
  const int l = c.rank % L_;
  for (int h = 0; h < M_; ++h) {
    for (int j = 0; j < L_; ++j) {
      fmt_.Decode(*c.compute, recv + (static_cast<int64_t>(j) * M_ + h) * R, Spans(h * L_ + l), partial + h * S,
                  /*acc=*/j > 0, scratch);
    }
  }
  if (M_ == 1) return absl::OkStatus();
  // The second hop: partial h to host h, requantized with the host residual (row h: the host partial of shard
  // h·L + l, of which this part).
  auto* send = static_cast<uint8_t*>(send2_.data());
  for (int h = 0; h < M_; ++h) {
    fmt_.Encode(*c.compute, partial + h * S, Spans(h * L_ + l), ResidualAt(unit_->qgz_host_residual, M_, h),
                p.loco_beta, send + h * R, scratch);
  }
  Communicator* inter = c.qgz_across.get();
  CommLabel label(inter, absl::StrCat("qgZ gradient all-to-all of unit ", unit_->name(), " across hosts",
                                      chunks_ > 1 ? absl::StrCat(", chunk ", part_ + 1, " of ", chunks_) : ""));
  hop2_ = advanced::Extended(*inter)->AllToAll(send2_.data(), recv2_.data(), static_cast<size_t>(R / 2), DType::kF16,
                                               c.stream());
  hop2_issued_ = true;
  return absl::OkStatus();
}

Status QgzReduce::FinishHop2() {
  EngineContext& c = *ctx_;
  const int64_t S = fmt_.S, R = fmt_.record_bytes();
  const float* sum = partial_.as<float>();
  if (M_ > 1) {
    Status s = c.compute->Join(hop2_);
    if (!s.ok()) return s;
    float* scratch = scratch_;
    float* total = partial_.as<float>();  // partial 0 is no longer needed: the sum over hosts, host order
    const auto* recv = static_cast<const uint8_t*>(recv2_.data());
    const std::vector<ExactSpan>& mine = Spans(c.rank);
    for (int h = 0; h < M_; ++h) fmt_.Decode(*c.compute, recv + h * R, mine, total, /*acc=*/h > 0, scratch);
    sum = total;
  }
  c.compute->Divide(sum, out_ + a_, S, static_cast<float>(c.world));
  part_done_ = true;
  finished_ = part_ + 1 == chunks_;
  return absl::OkStatus();
}

Status QgzReduce::Advance() {
  // On a device the second hop waits for Join, which the reducer calls in program order (the same on every rank),
  // not for this rank's host to see the first hop complete: NCCL's kernels of the world, host and across-host
  // communicators are then issued in one order on every rank, as NCCL asks of communicators used concurrently.
  if (!status_.ok() || hop1_done_ || ctx_->compute->device() || !hop1_.IsCompleted()) return status_;
  status_ = FinishHop1();
  return status_;
}

bool QgzReduce::Done() const {
  if (!status_.ok() || finished_) return true;
  // A part after this one is issued only by Join: until then the reduction is not done, and the reducer's poll
  // never retires it (so the parts are issued at the same points of the program on every rank).
  if (!hop1_done_ || part_ + 1 < chunks_) return false;  // (Advance finishes a first hop)
  return M_ == 1 || (hop2_issued_ && hop2_.IsCompleted());
}

Status QgzReduce::Join() {
  while (status_.ok() && !finished_) {
    if (part_done_) IssuePart(part_ + 1);  // the next chunk, through the same buffers
    if (!hop1_done_) status_ = FinishHop1();
    if (status_.ok()) status_ = FinishHop2();
  }
  return status_;
}

bool QgzReduce::WaitInFlight() {
  (void)hop1_.Wait();
  if (hop2_issued_) (void)hop2_.Wait();
  return !Unfinished();
}

bool QgzReduce::Unfinished() const { return !hop1_.IsCompleted() || (hop2_issued_ && !hop2_.IsCompleted()); }

void QgzReduce::Release() {
  // A finished reduction joined every hop into the compute stream (the host waited, on the host tier), so the pool's
  // ordering covers the ops a device's communicator streams may still run: its buffers go back. Only one that failed
  // with an op still in flight keeps them out (on a device, quarantining every finished one leaked them all).
  const bool unfinished = ctx_ != nullptr && !finished_ && Unfinished();
  for (Buffer* b : {&send1_, &recv1_, &partial_, &send2_, &recv2_}) {
    if (b->empty()) continue;
    if (unfinished) {
      ctx_->Quarantine(std::move(*b));  // an op may still read or write it
    } else {
      pool_->Give(std::move(*b));
    }
  }
}

}  // namespace zero::internal
