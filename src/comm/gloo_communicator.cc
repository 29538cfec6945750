// The Gloo communicator: host-memory collectives over Gloo's TCP transport, run asynchronously in issue order.
//
// Ops run one at a time in issue order, on the communicator's thread or, when the caller already blocks in
// Work::Wait, on the caller's thread (internal/ordered_executor.h).
//
// Two Gloo contexts per communicator, on one TCP device:
//   fn_ctx_  the UnboundBuffer function API: allgather (and its ring with moved offsets, AllGatherStrided), alltoall,
//            allreduce (RING), broadcast, barrier, and the fingerprint exchange of check mode;
//   rs_ctx_  the legacy Algorithm class ReduceScatterHalvingDoubling, the only reduce-scatter in this Gloo.
// They are kept apart because mixing the two API families on one context stalled 64 MiB all-gathers for
// seconds when measured. ReduceScatterHalvingDoubling registers its buffers with the pairs when constructed,
// so constructed instances are cached (see RsCacheEntry).
//
// All Gloo exceptions are caught here (and in store.cc) and converted by GlooExceptionToStatus.
#include <signal.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/dynamic_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/internal/env.h"
#include "comm/internal/gloo_staging.h"
#include "comm/internal/gloo_status.h"
#include "comm/internal/gloo_testing.h"
#include "comm/internal/op.h"
#include "comm/internal/ordered_executor.h"
#include "comm/internal/rendezvous.h"
#include "comm/internal/work_state.h"
#include "core/internal/fault.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/reduce_scatter.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/types.h"
#include "zero/advanced/communicator_ext.h"
#include "zero/communicator.h"
#include "zero/logging.h"
#include "zero/memory.h"

namespace zero {
namespace internal {
namespace {
constexpr size_t kDefaultRsChunkLimit = static_cast<size_t>(INT_MAX) / sizeof(float);
std::atomic<size_t> g_rs_chunk_limit{kDefaultRsChunkLimit};
constexpr uint64_t kDefaultRsRebuildEvery = 4096;
std::atomic<uint64_t> g_rs_rebuild_every{kDefaultRsRebuildEvery};
std::atomic<int> g_rs_fold_delay_rank{-1};
std::atomic<int64_t> g_rs_fold_delay_us{0};
}  // namespace

void SetGlooReduceScatterChunkLimitForTesting(size_t max_total_elements) {
  g_rs_chunk_limit.store(max_total_elements == 0 ? kDefaultRsChunkLimit : max_total_elements);
}
size_t GlooReduceScatterChunkLimit() { return g_rs_chunk_limit.load(); }

void SetGlooReduceScatterRebuildEveryForTesting(uint64_t uses) {
  g_rs_rebuild_every.store(uses == 0 ? kDefaultRsRebuildEvery : uses);
}
uint64_t GlooReduceScatterRebuildEvery() { return g_rs_rebuild_every.load(); }

void SetGlooReduceScatterFoldDelayForTesting(int rank, int64_t microseconds) {
  g_rs_fold_delay_us.store(microseconds);
  g_rs_fold_delay_rank.store(rank);
}
// The test hook's delay for `rank` (zero unless a test set one).
absl::Duration GlooReduceScatterFoldDelay(int rank) {
  if (g_rs_fold_delay_rank.load(std::memory_order_relaxed) != rank) return absl::ZeroDuration();
  return absl::Microseconds(g_rs_fold_delay_us.load());
}

}  // namespace internal

namespace {

using internal::OpDesc;
using internal::OpKind;

// Host float storage owned by the communicator, counted in its MemoryTracker (MemTag::kStaging) so the
// engine's memory report includes the communicator's buffers. Uninitialized; move-only.
class TrackedFloats {
 public:
  TrackedFloats() = default;
  TrackedFloats(MemoryTracker* tracker, size_t n) : tracker_(tracker), n_(n), data_(new float[n]) {
    tracker_->Add(MemTier::kHost, MemTag::kStaging, Bytes());
  }
  TrackedFloats(TrackedFloats&& o) noexcept
      : tracker_(o.tracker_), n_(std::exchange(o.n_, 0)), data_(std::move(o.data_)) {}
  TrackedFloats& operator=(TrackedFloats&& o) noexcept {
    if (this != &o) {
      Release();
      tracker_ = o.tracker_;
      n_ = std::exchange(o.n_, 0);
      data_ = std::move(o.data_);
    }
    return *this;
  }
  TrackedFloats(const TrackedFloats&) = delete;
  TrackedFloats& operator=(const TrackedFloats&) = delete;
  ~TrackedFloats() { Release(); }
  float* get() const { return data_.get(); }
  size_t size() const { return n_; }

 private:
  int64_t Bytes() const { return static_cast<int64_t>(n_ * sizeof(float)); }
  void Release() {
    if (data_ != nullptr) tracker_->Sub(MemTier::kHost, MemTag::kStaging, Bytes());
    data_.reset();
    n_ = 0;
  }
  MemoryTracker* tracker_ = nullptr;
  size_t n_ = 0;
  std::unique_ptr<float[]> data_;
};

// Float storage that grows and never shrinks: staging buffers are reused op after op, so their pages are
// touched once, not once per op.
class FloatScratch {
 public:
  explicit FloatScratch(MemoryTracker* tracker) : tracker_(tracker) {}
  float* Get(size_t n) {
    if (n > data_.size()) {
      data_ = TrackedFloats();  // first: the old and the new buffer are never alive together
      data_ = TrackedFloats(tracker_, n);
    }
    return data_.get();
  }
  int64_t bytes() const { return static_cast<int64_t>(data_.size() * sizeof(float)); }
  void Release() { data_ = TrackedFloats(); }

 private:
  MemoryTracker* tracker_;
  TrackedFloats data_;
};

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte (compared as addresses: the buffers are unrelated).
bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

void DivideInPlace(float* p, size_t n, float divisor) {
  for (size_t i = 0; i < n; ++i) p[i] /= divisor;
}

// Gloo's ReduceScatterHalvingDoubling with five changes, all on top of Gloo's own construction (buffers,
// slots, offsets, peers are Gloo's; the messages on the wire are Gloo's, plus change 4's acknowledgements and
// change 5's split of step 0's message):
//
// 1. run() never overwrites a region that a send of this run still reads from. Gloo's run() copies the
//    received result block into buffer[0, block) while an earlier send from that region can still be in
//    flight (at world 4, rank 2's second-step send of [0, block) to rank 0 is not acknowledged before rank 2
//    receives its result from rank 1), so a slow reader got half-overwritten data: measured as 1.7 million
//    wrong elements in one 256 MiB reduce-scatter on a loaded host. When the result goes to the buffer's
//    start, run() waits for its sends before the distribution phase; when it goes to a separate output that
//    no send reads, the waits move to the end. Either way run() returns only after every send completed, so
//    the caller may rewrite its buffers at once.
//
// 2. Retarget() points it at another input buffer without reconstructing it. Reconstruction is not an option
//    when only this rank's buffer moved: construction takes slot numbers from a per-context counter, so the
//    ranks' instances would stop matching, and reusing the old slots races with peers that already send for
//    the next run. Only the send side depends on the input buffer (receives land in the algorithm's own
//    buffers), so Retarget rebuilds the send buffers exactly as Gloo's constructor does (same peers, same
//    slots, same order: run() indexes them) and swaps the pointer. The replaced send buffers are kept alive,
//    not destroyed: the TCP transport unregisters a buffer's slot when it is destroyed, and a send buffer
//    shares its slot number with a live receive buffer. SetOutput() sends the distribution phase's result to
//    a caller's buffer instead of the buffer's start (ReduceScatterDestructive with a separate `recv`).
//
// 3. SetInput() lets run() read a const input instead of a staged copy of it (power-of-two worlds), and work
//    in Gloo's own receive buffer instead of a buffer of the input's size. Step 0 sends its half from the
//    input and reduces input + received in place in the receive region of step 0, W = recvBuf_[0, half);
//    W holds the part of the buffer, [recvOffsets_[0], + half), where every later step works, so those steps
//    send from W (send buffers over W with Gloo's slots) and the distribution phase writes the result into
//    the caller's output. Its memory traffic is the raw in-place call's: step 0 reads two streams and writes
//    a line it has just read, where an out-of-place reduce into a third buffer also paid a read for each line
//    it wrote; and the instance needs no buffer of the input's size. W is overwritten by the step-0 peer's
//    next run, which starts once that peer has this rank's step-0 notification (Gloo's "consumed" message),
//    so in this mode that notification is sent late: once every send from W completed and this rank's own
//    piece left W, before the pieces of the other ranks are awaited.
//
// 4. On worlds that are not a power of two, ranks of a smaller binary block send their data to ranks of the
//    next larger block, and Gloo acknowledges none of those transfers: the sender's run could return (and the
//    rank run its next op, or close its connections) before the receiver had taken the data. Each receiver
//    now acknowledges the transfer once it has reduced it, on the pair's step-notification slot (which pairs
//    across blocks never use), and the sender awaits the acknowledgements before its run returns. They are
//    usually there already: a receiver reduces that data before its distribution phase, which the sender has
//    awaited. This replaced a barrier after every run on those worlds, which cost a round of messages and
//    waited for the slowest rank's whole run (docs/internals/comm.md has the measured difference).
//
// 5. SetInput() with a stride: change 3 over an input whose rank blocks are not adjacent (rank r's at
//    input + r·stride; ReduceScatterStrided, the engine's chunks of a shard-contiguous unit). Only step 0 reads
//    the input, so only step 0 changes: its half goes as one message per rank block it covers, each to its
//    place in the peer's receive buffer (the remote offset of Gloo's send), and each piece is reduced as it
//    arrives (messages of one pair arrive in order). Every element is summed exactly as in change 3, so the
//    result is the contiguous run's, bit for bit; every rank of a run must use the same form (the number of
//    step-0 messages differs).
class RetargetableReduceScatter final : public gloo::ReduceScatterHalvingDoubling<float> {
 public:
  // `tracker` counts Gloo's own receive buffers of this instance (about twice the input) under staging.
  // `data` is the buffer the plain run() works in; an instance used only with SetInput never touches it.
  RetargetableReduceScatter(const std::shared_ptr<gloo::Context>& context, float* data, int total,
                            std::vector<int> recv_elems, const gloo::ReductionFunction<float>* fn,
                            MemoryTracker* tracker)
      : gloo::ReduceScatterHalvingDoubling<float>(context, {data}, total, std::move(recv_elems), fn),
        tracker_(tracker),
        gloo_bytes_(static_cast<int64_t>((recvBuf_.size() + recvBufDist_.size()) * sizeof(float))) {
    tracker_->Add(MemTier::kHost, MemTag::kStaging, gloo_bytes_);
    // Gloo's step notifications send from and receive into this one int, which nobody reads: the transport's
    // thread writes it (recv) while this rank's thread sends from it (writev). Under TSan (empty otherwise) that
    // exact int is declared a benign race, so races on the data buffers, which the same Gloo functions move,
    // are still reported (docs/internals/sanitizers.md).
    ABSL_ANNOTATE_BENIGN_RACE_SIZED(&dummy_, sizeof(dummy_), "Gloo's step-notification word, never read");
    if (contextSize_ > 1) BuildBlockAcks();
  }
  ~RetargetableReduceScatter() { tracker_->Sub(MemTier::kHost, MemTag::kStaging, gloo_bytes_); }
  int64_t gloo_bytes() const { return gloo_bytes_; }

  void run() override {
    if (contextSize_ == 1) return;              // one buffer, one rank: nothing to reduce or move
    const bool from_input = input_ != nullptr;  // change 3 (power-of-two worlds only)
    // The region every step after step 0 works in: the buffer, or W (change 3), which holds [base, + half).
    const size_t base = from_input ? recvOffsets_[0] : 0;
    float* const work = from_input ? recvBuf_.data() : ptrs_[0];
    std::vector<gloo::transport::Buffer*> sent;  // sends of this run not yet waited for
    // The step notifications this run sent, from the instance's own int (Gloo's dummy_). Gloo never waits for
    // them; this run does before it returns, so no write from that int is left in the transport when the cache
    // evicts and destroys the instance (ASan caught Gloo's thread writev()ing from the freed int once in CI,
    // 2026-12-05). Each is waited for exactly once, so no completion is left over for a later run.
    std::vector<gloo::transport::Buffer*> notified;
    auto notify = [&](gloo::transport::Buffer* b) {
      b->send();
      notified.push_back(b);
    };

    // Reduce-scatter within this rank's binary block (recursive halving).
    size_t buffer_offset = 0;
    size_t items = stepsWithinBlock_ > 0 ? chunkSize_ << (steps_ - 1) : count_;
    for (uint32_t i = 0; i < stepsWithinBlock_; ++i) {
      const bool step0_from_input = from_input && i == 0;
      if (sendOffsets_[i] < static_cast<size_t>(count_)) {
        gloo::transport::Buffer* b;
        size_t offset = sendOffsets_[i];
        if (step0_from_input && input_stride_ != 0) {  // change 5: one message per rank block it covers
          ForEachInputPiece(offset, sendCounts_[i], [&](size_t at, size_t src, size_t n) {
            input_send_->send(src * sizeof(float), n * sizeof(float), at * sizeof(float));
            sent.push_back(input_send_.get());
          });
          b = nullptr;
        } else if (step0_from_input) {
          b = input_send_.get();
        } else if (from_input) {
          b = work_step_sends_[i].get();
          offset -= base;
        } else {
          b = sendDataBufs_[i].get();
        }
        if (b != nullptr) {
          b->send(offset * sizeof(float), sendCounts_[i] * sizeof(float));
          sent.push_back(b);
        }
      }
      if (recvOffsets_[i] < static_cast<size_t>(count_)) {
        if (step0_from_input && input_stride_ != 0) {  // change 5: the same pieces from the peer, in order
          ForEachInputPiece(recvOffsets_[0], recvCounts_[0], [&](size_t at, size_t src, size_t n) {
            recvDataBufs_[0]->waitRecv();
            Reduce(&recvBuf_[at], &input_[src], &recvBuf_[at], n);
          });
        } else if (step0_from_input) {  // W = input + received, in place in W (buffer_offset is 0)
          recvDataBufs_[i]->waitRecv();
          Reduce(recvBuf_.data(), &input_[recvOffsets_[0]], recvBuf_.data(), recvCounts_[0]);
        } else {
          recvDataBufs_[i]->waitRecv();
          fn_->call(&work[recvOffsets_[i] - base], &recvBuf_[buffer_offset], recvCounts_[i]);
        }
      }
      buffer_offset += items;
      if (!step0_from_input) notify(sendNotificationBufs_[i].get());  // change 3: sent once W is released
      items >>= 1;
    }

    // Non-power-of-two worlds: fold in the next smaller binary block, hand over to the next larger one.
    float* const data = ptrs_[0];
    int send_notify_offset = static_cast<int>(stepsWithinBlock_);
    if (nextSmallerBlockSize_ != 0 && smallerBlockRecvDataBuf_ != nullptr) {
      if (const absl::Duration d = internal::GlooReduceScatterFoldDelay(context_->rank); d > absl::ZeroDuration()) {
        absl::SleepFor(d);  // a test hook (gloo_testing.h)
      }
      smallerBlockRecvDataBuf_->waitRecv();
      fn_->call(&data[recvOffsets_[stepsWithinBlock_ - 1]], &recvBuf_[buffer_offset],
                recvCounts_[stepsWithinBlock_ - 1]);
      smaller_ack_send_->send();  // change 4: the region is free for the sender's next run
      sent.push_back(smaller_ack_send_.get());
    }
    std::vector<gloo::transport::Buffer*> acks;  // change 4: the larger block's receivers still to acknowledge
    const size_t to_larger = stepsWithinBlock_ > 0 ? recvCounts_[stepsWithinBlock_ - 1] : count_;
    if (nextLargerBlockSize_ != 0 && to_larger != 0) {
      const size_t offset = stepsWithinBlock_ > 0 ? recvOffsets_[stepsWithinBlock_ - 1] : 0;
      const uint32_t sends = nextLargerBlockSize_ / myBinaryBlockSize_;
      for (uint32_t i = 0; i < sends; ++i) {
        if (sendCountToLargerBlock_ * i < to_larger) {
          largerBlockSendDataBufs_[i]->send((offset + i * sendCountToLargerBlock_) * sizeof(float),
                                            std::min(sendCountToLargerBlock_, to_larger - sendCountToLargerBlock_ * i) *
                                                sizeof(float));
          sent.push_back(largerBlockSendDataBufs_[i].get());
          acks.push_back(larger_ack_recvs_[i].get());
        }
      }
    }

    // Distribution: the largest block's ranks send each reduced piece to the rank it belongs to.
    const int my = context_->rank;
    size_t index = 0;
    for (const auto& d : distMapForSend_) {
      if (d.rank == my) continue;
      gloo::transport::Buffer* b = from_input ? work_dist_sends_[index].get() : distSendDataBufs_[index].get();
      b->send((d.offset - base) * sizeof(float), d.itemCount * sizeof(float));
      sent.push_back(b);
      ++index;
    }
    // Change 1: the result overwrites the buffer's start, or an output that overlaps the input, only after
    // every send of this run completed.
    float* const result = output_ != nullptr ? output_ : data;
    if (result == data || output_overlaps_input_) {
      for (gloo::transport::Buffer* b : sent) b->waitSend();
      sent.clear();
    }
    // Change 3: this rank's own piece leaves W first, so that W is released (the step-0 notification) while
    // the pieces of other ranks are still on their way.
    if (from_input) {
      size_t at = 0;
      for (const auto& d : distMapForRecv_) {
        if (d.rank == my) CopyResult(&result[at], &work[d.offset - base], d.itemCount);
        at += d.itemCount;
      }
      for (gloo::transport::Buffer* b : sent) b->waitSend();
      sent.clear();
      notify(sendNotificationBufs_[0].get());
    }
    index = 0;
    buffer_offset = 0;
    for (const auto& d : distMapForRecv_) {
      if (d.rank != my) {
        distRecvDataBufs_[index++]->waitRecv();
        CopyResult(&result[buffer_offset], &recvBufDist_[d.offset], d.itemCount);
        notify(sendNotificationBufs_[send_notify_offset++].get());
      } else if (!from_input) {
        // Rank 0's piece is already in place; another's may overlap where it goes (one buffer): move, then divide.
        if (&result[buffer_offset] != &work[d.offset]) {
          std::memmove(&result[buffer_offset], &work[d.offset], d.itemCount * sizeof(float));
        }
        if (divisor_ != 1.0f) DivideInPlace(&result[buffer_offset], d.itemCount, divisor_);
      }
      buffer_offset += d.itemCount;
    }
    for (gloo::transport::Buffer* b : sent) b->waitSend();
    for (gloo::transport::Buffer* b : notified) b->waitSend();
    // Peers acknowledge consuming our data, so the next run cannot overwrite their receive buffers early.
    for (auto& b : recvNotificationBufs_) b->waitRecv();
    for (gloo::transport::Buffer* b : acks) b->waitRecv();
  }

  float* data() const { return ptrs_[0]; }
  size_t retired() const { return retired_.size(); }

  // Every element of the next runs' result is divided by `divisor` (kAvg: the world size) as it is written to the
  // result, instead of in a pass of its own after the run: the same quotient of the same sum, so the same bits.
  void SetDivisor(float divisor) { divisor_ = divisor; }

  // Change 3: the next run() reads a const `input` instead of a copy of it in the buffer, and writes this
  // rank's block of the result to `output`. Power-of-two worlds only (every rank reduces at step 0 and never
  // reads the half it sent away again). `output` may overlap `input`. nullptr returns to the plain run().
  // Requires that no run() is in progress.
  static bool CanRunFromInput(int world, size_t total) {
    return world >= 2 && (world & (world - 1)) == 0 && total >= static_cast<size_t>(world) * kMinInputRunElems;
  }
  // Change 5: with `stride` > 0, rank r's block of the input lies at input + r·stride (stride >= the block)
  // instead of input + r·block, and step 0 sends one message per rank block its half covers (to the same place
  // in the peer's receive buffer, through the remote offset of Gloo's send) and reduces each as it arrives. So
  // every element is summed as in the contiguous run (input + received, then the same later steps): the result is
  // the same bits; only the number of step-0 messages differs, so every rank of a run must pass a stride or none.
  void SetInput(const float* input, float* output, size_t stride = 0) {
    const size_t block = static_cast<size_t>(count_) / contextSize_;
    const size_t extent = stride == 0 ? bytes_ : ((contextSize_ - 1) * stride + block) * sizeof(float);
    if (input != nullptr && (input != input_send_over_ || extent != input_send_bytes_)) {
      if (input_send_ != nullptr) retired_.push_back(std::move(input_send_));  // see Retarget
      const int peer = context_->rank ^ 1;  // step 0's peer (the constructor's bitmask 1)
      input_send_ = context_->getPair(peer)->createSendBuffer(DataSlot(peer), const_cast<float*>(input), extent);
      input_send_over_ = input;
      input_send_bytes_ = extent;
    }
    if (input != nullptr && work_step_sends_.empty()) BuildWorkSends();
    input_ = input;
    input_stride_ = input != nullptr ? stride : 0;
    output_ = input != nullptr ? output : nullptr;
    output_overlaps_input_ = false;
    if (input != nullptr) output_overlaps_input_ = Overlaps(output, block * sizeof(float), input, extent);
  }

  // The plain run()'s result goes to `output` (this rank's block, not overlapping the buffer) instead of the
  // buffer's start; nullptr restores the buffer's start. Requires that no run() is in progress.
  void SetOutput(float* output) {
    output_ = output;
    output_overlaps_input_ = false;
  }

  // Requires that no run() is in progress and all of the previous run's sends completed.
  void Retarget(float* data) {
    if (data == ptrs_[0] || contextSize_ == 1) {
      ptrs_[0] = data;
      return;
    }
    for (auto* v : {&sendDataBufs_, &largerBlockSendDataBufs_, &distSendDataBufs_}) {
      for (auto& b : *v) retired_.push_back(std::move(b));
      v->clear();
    }
    const int my = context_->rank;
    // Steps within the binary block (constructor: the loop over stepsWithinBlock_).
    uint32_t bitmask = 1;
    for (uint32_t i = 0; i < stepsWithinBlock_; ++i) {
      const int peer = my ^ static_cast<int>(bitmask);
      sendDataBufs_.push_back(context_->getPair(peer)->createSendBuffer(DataSlot(peer), data, bytes_));
      bitmask <<= 1;
    }
    // Sends to the next larger binary block (non-power-of-two worlds).
    for (int peer : LargerBlockPeers()) {
      largerBlockSendDataBufs_.push_back(context_->getPair(peer)->createSendBuffer(DataSlot(peer), data, bytes_));
    }
    AppendDistSends(data, bytes_, &distSendDataBufs_);
    ptrs_[0] = data;
  }

 private:
  // Below this many elements per rank the staged copy is cheap and every rank surely has data at step 0.
  static constexpr size_t kMinInputRunElems = 1024;

  // The slot Gloo's constructor gives the data buffers shared with `peer`.
  int DataSlot(int peer) const {
    const int my = context_->rank;
    return slotOffset_ + 2 * (std::min(my, peer) * contextSize_ + std::max(my, peer));
  }

  // The ranks of the next larger binary block this rank sends to, in largerBlockSendDataBufs_ order (Gloo's
  // constructor); empty if there is no larger block.
  std::vector<int> LargerBlockPeers() const {
    std::vector<int> peers;
    if (nextLargerBlockSize_ == 0) return peers;
    const auto offset_to_larger = offsetToMyBinaryBlock_ - nextLargerBlockSize_;
    const auto sends = nextLargerBlockSize_ / myBinaryBlockSize_;
    const auto src_ordinal = ReverseLastNBits(rankInBinaryBlock_, static_cast<uint32_t>(log2(myBinaryBlockSize_)));
    auto dest_ordinal = src_ordinal * sends;
    for (uint32_t i = 0; i < sends; ++i, ++dest_ordinal) {
      peers.push_back(static_cast<int>(
          offset_to_larger + ReverseLastNBits(dest_ordinal, static_cast<uint32_t>(log2(nextLargerBlockSize_)))));
    }
    return peers;
  }

  // Change 4's buffers. The slot is the pair's step-notification slot (DataSlot + 1): within-block steps use
  // it only between ranks of one block, and these pairs span two blocks.
  void BuildBlockAcks() {
    if (nextSmallerBlockSize_ != 0 && smallerBlockRecvDataBuf_ != nullptr) {
      // The sender in the smaller block, as Gloo's constructor chose it for smallerBlockRecvDataBuf_.
      const int src =
          static_cast<int>(offsetToMyBinaryBlock_ + myBinaryBlockSize_ + rankInBinaryBlock_ % nextSmallerBlockSize_);
      smaller_ack_send_ =
          context_->getPair(src)->createSendBuffer(DataSlot(src) + 1, &ack_send_word_, sizeof(ack_send_word_));
    }
    for (int peer : LargerBlockPeers()) {
      larger_ack_recvs_.push_back(
          context_->getPair(peer)->createRecvBuffer(DataSlot(peer) + 1, &ack_recv_word_, sizeof(ack_recv_word_)));
    }
  }

  // The distribution phase's send buffers over [ptr, + bytes), one per peer in distMapForSend_ order.
  void AppendDistSends(float* ptr, size_t bytes, std::vector<std::unique_ptr<gloo::transport::Buffer>>* out) {
    for (const auto& d : distMapForSend_) {
      if (d.rank == context_->rank) continue;
      out->push_back(context_->getPair(d.rank)->createSendBuffer(DataSlot(d.rank) + 2, ptr, bytes));
    }
  }

  // Change 3's send buffers over W for the steps after step 0 (index i for step i; step 0 sends from the
  // input) and for the distribution phase. W never moves, so they are built once.
  void BuildWorkSends() {
    const size_t w_bytes = (chunkSize_ << (steps_ - 1)) * sizeof(float);
    work_step_sends_.resize(1);
    for (uint32_t i = 1; i < stepsWithinBlock_; ++i) {
      const int peer = context_->rank ^ (1 << i);
      work_step_sends_.push_back(context_->getPair(peer)->createSendBuffer(DataSlot(peer), recvBuf_.data(), w_bytes));
    }
    AppendDistSends(recvBuf_.data(), w_bytes, &work_dist_sends_);
  }

  // Change 5: the elements [at0, at0 + n) of the contiguous layout (blocks of count_ / contextSize_), piece by
  // piece within one rank's block: f(offset from at0, element of the strided input, elements).
  template <typename F>
  void ForEachInputPiece(size_t at0, size_t n, F&& f) const {
    const size_t block = static_cast<size_t>(count_) / contextSize_;
    for (size_t x = at0; x < at0 + n;) {
      const size_t r = x / block, end = std::min(at0 + n, (r + 1) * block);
      f(x - at0, r * input_stride_ + (x - r * block), end - x);
      x = end;
    }
  }

  // out = a (+ or max) b, element-wise; `out` may be `b`.
  void Reduce(float* out, const float* a, const float* b, size_t n) const {
    if (fn_ == gloo::ReductionFunction<float>::max) {
      for (size_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
    }
  }

  // result[0, n) = reduced[0, n) / divisor_ (a copy when it is 1); the two never overlap (Gloo's buffers).
  void CopyResult(float* result, const float* reduced, size_t n) const {
    if (divisor_ == 1.0f) {
      std::memcpy(result, reduced, n * sizeof(float));
    } else {
      for (size_t i = 0; i < n; ++i) result[i] = reduced[i] / divisor_;
    }
  }

  MemoryTracker* const tracker_;
  const int64_t gloo_bytes_;
  float divisor_ = 1.0f;
  const float* input_ = nullptr;
  float* output_ = nullptr;
  bool output_overlaps_input_ = false;
  std::unique_ptr<gloo::transport::Buffer> input_send_;  // step 0's send buffer over input_send_over_
  const float* input_send_over_ = nullptr;
  size_t input_send_bytes_ = 0;  // its extent
  size_t input_stride_ = 0;      // change 5: elements from one rank's block of input_ to the next (0: contiguous)
  std::vector<std::unique_ptr<gloo::transport::Buffer>> work_step_sends_;  // change 3, see BuildWorkSends
  std::vector<std::unique_ptr<gloo::transport::Buffer>> work_dist_sends_;
  std::unique_ptr<gloo::transport::Buffer> smaller_ack_send_;               // change 4, see BuildBlockAcks
  std::vector<std::unique_ptr<gloo::transport::Buffer>> larger_ack_recvs_;  // in LargerBlockPeers() order
  // The acknowledgements' contents are never read. They are sent from one word and received into another (a
  // rank of a middle block does both), so the transport never writes a word this rank is sending from, as it
  // does Gloo's own notification word (dummy_, see the constructor).
  int ack_send_word_ = 0;
  int ack_recv_word_ = 0;

  // Gloo's private helper of the same name: the last n bits of ctr, reversed.
  static uint32_t ReverseLastNBits(uint32_t ctr, uint32_t n) {
    uint32_t mask = 1, reversed = 0;
    while (mask < (static_cast<uint32_t>(1) << n)) {
      reversed <<= 1;
      if (ctr & mask) reversed |= 1;
      mask <<= 1;
    }
    return reversed;
  }

  std::vector<std::unique_ptr<gloo::transport::Buffer>> retired_;
};

// One constructed reduce-scatter. Construction allocates Gloo's receive buffers (about 2x the input,
// zero-filled) and registers slots with every pair, so instances are cached per key. Every rank makes the
// same hit/miss/evict decisions because the key does not involve buffer addresses (which differ between
// ranks): the staged variant runs over a buffer the entry owns; the input-reading variant (change 3) reads
// the caller's input and works in Gloo's receive buffer; the destructive variant is retargeted to the
// caller's buffer, which is a local change. Retargeting retires a few send-buffer objects; every
// GlooReduceScatterRebuildEvery() uses (a count all ranks share) the instance is rebuilt to drop them.
enum class RsMode { kStaged, kFromInput, kExternal };
struct RsKey {
  size_t total = 0;                  // elements of all ranks' blocks together
  ReduceOp reduce = ReduceOp::kSum;  // kSum or kMax (kAvg runs as kSum, then divides)
  RsMode mode = RsMode::kStaged;
  bool operator<(const RsKey& o) const { return std::tie(total, reduce, mode) < std::tie(o.total, o.reduce, o.mode); }
  bool operator==(const RsKey& o) const { return !(*this < o) && !(o < *this); }
};

struct RsCacheEntry {
  RsKey key;
  TrackedFloats owned;  // the staged variant's buffer
  std::unique_ptr<RetargetableReduceScatter> algorithm;
  int64_t bytes = 0;  // owned + Gloo's receive buffers (RsInstanceBytes)
  uint64_t last_use = 0;
  uint64_t uses = 0;
};
constexpr size_t kRsCacheEntries = 4;

// The staging one cached reduce-scatter of `total` elements (all ranks' blocks) holds at `world` ranks: Gloo's
// receive buffers, recvBuf_ (chunkSize_ << steps_, with steps_ = floor(log2 world) and chunkSize_ = total / 2^steps_
// rounded up) and recvBufDist_ (total), plus the staged variant's own buffer of the input's size. The constructor
// checks it against the instance it built, so the engine's bound (Communicator::ReduceScatterStagingBytes) is
// what the tracker counts.
int64_t RsInstanceBytes(int world, size_t total, bool staged) {
  int steps = 0;
  while ((2 << steps) <= world) ++steps;
  const size_t chunks = size_t{1} << steps;
  const size_t recv_buf = (total + chunks - 1) / chunks * chunks;
  return static_cast<int64_t>((recv_buf + total + (staged ? total : 0)) * sizeof(float));
}
// How long a communicator's destructor waits for the other ranks' (see MeetPeersBeforeClosing).
constexpr absl::Duration kClosingTimeout = absl::Seconds(60);

// A rendezvous store whose every wait is bounded by `timeout` (Store::get included).
class BoundedStore final : public gloo::rendezvous::Store {
 public:
  BoundedStore(gloo::rendezvous::Store& inner, std::chrono::milliseconds timeout) : inner_(inner), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { inner_.set(key, data); }
  std::vector<char> get(const std::string& key) override {
    inner_.wait({key}, timeout_);
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { inner_.wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    inner_.wait(keys, timeout);
  }

 private:
  gloo::rendezvous::Store& inner_;
  const std::chrono::milliseconds timeout_;
};

class GlooCommunicator final : public advanced::ExtendedCommunicator {
 public:
  GlooCommunicator(std::shared_ptr<Store> store, int rank, int world_size, CommOptions options)
      : store_(std::move(store)),
        rank_(rank),
        world_(world_size),
        options_(std::move(options)),
        progress_(std::make_shared<internal::CommProgress>()) {}

  ~GlooCommunicator() override {
    executor_->Stop();
    // The thread exits once nothing is queued or running, on it or on a helping waiter.
    if (thread_.joinable()) thread_.join();
    PostDeparture();
    MeetPeersBeforeClosing();
    rs_cache_.clear();  // the algorithms hold rs_ctx_'s pairs
    fn_ctx_.reset();
    rs_ctx_.reset();
    device_.reset();
  }

  // Destruction meets the other ranks' destructors (a barrier) before it closes any connection. Gloo reports a
  // closed connection to the peer as an error even when everything that peer still expected has arrived, so a
  // rank that closed while a peer was still finishing its last op with it made that op fail ("a peer was
  // lost"; seen at worlds 5-7 with a receiving rank delayed by a test hook). After the barrier every rank has
  // finished every op; the barrier's own messages can race a close, and its failure is ignored. Skipped once
  // an op failed (a peer may be gone); bounded by the op timeout, at most kClosingTimeout, for a peer that
  // never destroys its communicator.
  void MeetPeersBeforeClosing() {
    if (!connected_ || !broken_.ok() || abandoned_) return;
    try {
      gloo::BarrierOptions o(fn_ctx_);
      // Gloo keys a barrier's messages by its tag on barrier-only slots. Op tags never set the high bit (check
      // mode's fingerprints do, on allgather slots), so a rank that is still issuing ops cannot mistake this
      // barrier for one of its Barrier ops.
      o.setTag(static_cast<uint32_t>(next_seq_) | 0x80000000u);
      o.setTimeout(internal::ToGlooTimeout(std::min(options_.timeout, kClosingTimeout)));
      gloo::barrier(o);
    } catch (...) {
      ZERO_LOG(WARNING) << "rank " << rank_ << " of " << world_
                        << ": the other ranks did not all reach the communicator's destruction; closing anyway";
    }
  }

  // A rank that closes its communicator says so in the store, with how many ops it issued and the last: a peer
  // still waiting in a collective (a rank that ran fewer Steps, or returned early) then names who left and when
  // instead of only "a peer was lost" or a timeout. The value is bounded by 2 s on a store that went dark.
  void PostDeparture() {
    // Only after a clean run: after a failure the store may be gone with the peer (Store::Add has no deadline),
    // and the peers have their own error already.
    if (!connected_ || world_ == 1 || !broken_.ok() || abandoned_) return;
    const std::vector<std::string> recent = history_.Recent();
    const std::string text =
        absl::StrCat("rank ", rank_, " closed its communicator at ",
                     absl::FormatTime("%H:%M:%E3S UTC", absl::Now(), absl::UTCTimeZone()), " after issuing ", next_seq_,
                     " ops", recent.empty() ? std::string() : absl::StrCat(" (last: ", recent.back(), ")"));
    // Numbered by a counter, so that a reader asks only for notices that exist: a wait for a missing key costs a
    // second on Gloo's FileStore whatever the timeout.
    StatusOr<int64_t> n = store_->Add(absl::StrCat(key_prefix_, "/left-count"), 1);
    if (!n.ok()) return;
    (void)store_->SetWithin(absl::StrCat(key_prefix_, "/left/", *n), std::vector<uint8_t>(text.begin(), text.end()),
                            std::min(options_.timeout, absl::Seconds(2)));
  }

  // After an op failed because a peer went away or went silent: the departures peers posted (PostDeparture).
  Status WithDepartures(const Status& s) {
    std::string left;
    StatusOr<int64_t> count = store_->Add(absl::StrCat(key_prefix_, "/left-count"), 0);
    for (int64_t i = 1; count.ok() && i <= *count; ++i) {
      auto v = store_->Get(absl::StrCat(key_prefix_, "/left/", i), absl::Milliseconds(100));
      if (v.ok()) absl::StrAppend(&left, "\n  ", std::string(v->begin(), v->end()));
    }
    if (left.empty()) return s;
    return absl::Status(s.code(), absl::StrCat(s.message(), "\nranks that left while this rank waits in ",
                                               "this op (the ranks did not issue the same collectives, e.g. one ran "
                                               "fewer Steps):",
                                               left));
  }

  // Connects both contexts through `native` (a gloo::rendezvous::Store), then starts the thread.
  Status Connect(gloo::rendezvous::Store& native, const std::string& key_prefix) {
    key_prefix_ = key_prefix;
    if (world_ > 1) {
      gloo::transport::tcp::attr attr;
      attr.hostname = options_.hostname;
      if (attr.hostname.empty()) {
        if (auto iface = internal::ProcessEnv()("GLOO_SOCKET_IFNAME")) attr.iface = *iface;
      }
      const std::string what = absl::StrCat("Gloo rendezvous of rank ", rank_, " of ", world_, " (store prefix '",
                                            key_prefix, "', timeout ", absl::FormatDuration(options_.timeout), ")");
      try {
        device_ = gloo::transport::tcp::CreateDevice(attr);
        fn_ctx_ = std::make_shared<gloo::rendezvous::Context>(rank_, world_);
        fn_ctx_->setTimeout(internal::ToGlooTimeout(options_.timeout));
        // Gloo's full-mesh connect reads peers' addresses with Store::get, which waits Gloo's default 30 s
        // whatever the context's timeout: bound every wait by the communicator's timeout instead, so a rank
        // that never arrives fails the others within comm_timeout_s (tests/faults, phase rendezvous).
        BoundedStore bounded(native, internal::ToGlooTimeout(options_.timeout));
        gloo::rendezvous::PrefixStore fn_store(key_prefix + "/fn", bounded);
        fn_ctx_->connectFullMesh(fn_store, device_);
        rs_ctx_ = std::make_shared<gloo::rendezvous::Context>(rank_, world_);
        rs_ctx_->setTimeout(internal::ToGlooTimeout(options_.timeout));
        gloo::rendezvous::PrefixStore rs_store(key_prefix + "/rs", bounded);
        rs_ctx_->connectFullMesh(rs_store, device_);
        connected_ = true;
        // Every rank must cache alike: eviction rebuilds an instance, which takes new slot numbers, so ranks
        // whose budgets differ would stop matching. The tag is outside the ops' (they never set the high bit)
        // and is used once, before any op.
        budgets_.assign(world_, 0);
        gloo::AllgatherOptions o(fn_ctx_);
        o.setInput(const_cast<int64_t*>(&options_.cache_bytes), 1);
        o.setOutput(budgets_.data(), budgets_.size());
        o.setTag(0xffffffffu);
        o.setTimeout(internal::ToGlooTimeout(options_.timeout));
        gloo::allgather(o);
      } catch (...) {
        Status s = internal::GlooExceptionToStatus(std::current_exception(), what);
        if (absl::IsDeadlineExceeded(s)) {
          return absl::DeadlineExceededError(
              absl::StrCat(s.message(),
                           " [a rank never arrived: Gloo's store keys are '<prefix>/<rank>', so the key named above "
                           "ends with the missing rank]"));
        }
        return s;
      }
      for (int r = 0; r < world_; ++r) {
        if (budgets_[r] != options_.cache_bytes) {
          return absl::InvalidArgumentError(absl::StrCat(
              "CommOptions::cache_bytes: rank ", rank_, " has ", options_.cache_bytes, " where rank ", r, " has ",
              budgets_[r], "; every rank must give the same value (the ranks' cached reduce-scatters must match)"));
        }
      }
    }
    thread_ = std::thread([this] {
      SetLogRank(rank_);
      executor_->RunLoop();
    });
    return absl::OkStatus();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Backend backend() const override { return Backend::kGloo; }
  absl::Duration timeout() const override { return options_.timeout; }
  Store* store() const { return store_.get(); }

  // Every rank's (color, key) by an all-gather on this communicator, then a new communicator over the same
  // store under keys of its own: "<this one's keys>/split<k>/<color>" (k counts this communicator's splits, the
  // same on every rank since Split is collective).
  StatusOr<std::shared_ptr<Communicator>> Split(int color, int key) override {
    constexpr int kLimit = 1 << 24;  // exact in the f32 all-gather
    const std::string what = absl::StrCat("Split(color ", color, ", key ", key, ") on rank ", rank_, " of ", world_);
    if (color < 0 || color >= kLimit || key < 0 || key >= kLimit) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": color and key must be in [0, 2^24)"));
    }
    const float mine[2] = {static_cast<float>(color), static_cast<float>(key)};
    std::vector<float> all(2 * static_cast<size_t>(world_));
    {
      CommLabel l(this, "Split: the ranks' colors and keys");
      ZERO_RETURN_IF_ERROR(AllGather(mine, all.data(), 2, DType::kF32, nullptr).Wait());
    }
    std::vector<std::pair<int, int>> members;  // (key, rank) of this color
    for (int r = 0; r < world_; ++r) {
      if (static_cast<int>(all[2 * r]) == color) members.emplace_back(static_cast<int>(all[2 * r + 1]), r);
    }
    std::sort(members.begin(), members.end());
    const int new_rank =
        static_cast<int>(std::find(members.begin(), members.end(), std::make_pair(key, rank_)) - members.begin());
    CommOptions o = options_;
    o.prefix = absl::StrCat(key_prefix_, "/split", splits_++, "/", color);
    auto made = CreateGloo(store_, new_rank, static_cast<int>(members.size()), o);
    if (!made.ok()) return Status(made.status().code(), absl::StrCat(what, ": ", made.status().message()));
    return made;
  }
  MemoryReport memory_report() const override { return tracker_.Report(); }
  MemoryTracker* memory_tracker() override { return &tracker_; }
  uint64_t IssuedOpsHash() const override { return history_.hash(); }
  void Abandon() override { abandoned_ = true; }
  std::vector<std::string> RecentOps() const override { return history_.Recent(); }
  int64_t bus_bytes() const override { return history_.bus_bytes(); }
  std::vector<int64_t> bytes_sent_to_ranks() const override { return history_.sent_to(); }
  int64_t cache_bytes() const override { return options_.cache_bytes; }

  int64_t ReduceScatterStagingBytes(size_t count, DType dtype, bool destructive) const override {
    return internal::GlooReduceScatterStagingBytes(world_, count, dtype, destructive);
  }
  int64_t AllReduceStagingBytes(size_t count, DType dtype) const override {
    return internal::GlooAllReduceStagingBytes(world_, count, dtype);
  }

  Work AllGather(const void* send, void* recv, size_t count, DType dtype, CUstream_st* stream) override {
    OpDesc d{.kind = OpKind::kAllGather, .dtype = dtype, .count = count};
    Status check = ValidateBuffers(count, {send, recv}, world_);
    return Enqueue(d, check, [this, send, recv, count, dtype](const OpDesc& op) -> Status {
      const size_t bytes = count * DTypeSize(dtype);
      auto* out = static_cast<uint8_t*>(recv);
      const auto* in = static_cast<const uint8_t*>(send);
      if (world_ == 1) {
        if (in != out) std::memmove(out, in, bytes);
        return absl::OkStatus();
      }
      gloo::AllgatherOptions o(fn_ctx_);
      if (in != out + rank_ * bytes) o.setInput(const_cast<uint8_t*>(in), bytes);
      o.setOutput(out, bytes * world_);
      o.setTag(OpTag(op));
      o.setTimeout(internal::ToGlooTimeout(options_.timeout));
      gloo::allgather(o);
      return absl::OkStatus();
    });
  }

  bool SupportsAllGatherStrided() const override { return true; }

  Work AllGatherStrided(const void* send, void* recv, size_t count, size_t stride, DType dtype,
                        CUstream_st* stream) override {
    OpDesc d{.kind = OpKind::kAllGatherStrided, .dtype = dtype, .count = count, .stride = stride};
    Status check = ValidateStrided(count, stride, send, recv);
    return Enqueue(d, check, [this, send, recv, count, stride, dtype](const OpDesc& op) -> Status {
      const size_t es = DTypeSize(dtype);
      auto* out = static_cast<uint8_t*>(recv);
      uint8_t* const mine = out + rank_ * stride * es;
      // As gloo::allgather primes its output with a separate input.
      if (count > 0 && send != mine) std::memmove(mine, send, count * es);  // (memmove of null: undefined)
      if (world_ > 1) RingAllGatherStrided(out, count * es, stride * es, OpTag(op));
      return absl::OkStatus();
    });
  }

  bool SupportsAllToAll() const override { return true; }

  Work AllToAll(const void* send, void* recv, size_t count, DType dtype, CUstream_st* stream) override {
    OpDesc d{.kind = OpKind::kAllToAll, .dtype = dtype, .count = count};
    Status check = ValidateBuffers(count, {send, recv}, world_);
    const size_t bytes = count * DTypeSize(dtype) * static_cast<size_t>(world_);
    const auto* in = static_cast<const uint8_t*>(send);
    auto* out = static_cast<uint8_t*>(recv);
    if (check.ok() && count > 0 && in < out + bytes && out < in + bytes) {
      check = absl::InvalidArgumentError("the send and receive buffers overlap");
    }
    return Enqueue(d, check, [this, in, out, bytes](const OpDesc& op) -> Status {
      if (bytes == 0) return absl::OkStatus();
      if (world_ == 1) {
        std::memcpy(out, in, bytes);
        return absl::OkStatus();
      }
      // Moved as bytes: gloo::alltoall splits its buffers into world equal parts and needs no element type.
      gloo::AlltoallOptions o(fn_ctx_);
      o.setInput(const_cast<uint8_t*>(in), bytes);
      o.setOutput(out, bytes);
      o.setTag(OpTag(op));
      o.setTimeout(internal::ToGlooTimeout(options_.timeout));
      gloo::alltoall(o);
      return absl::OkStatus();
    });
  }

  Work ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                     CUstream_st* stream) override {
    OpDesc d{.kind = OpKind::kReduceScatter, .dtype = dtype, .reduce = op, .count = count};
    Status check = ValidateBuffers(count, {send, recv}, world_);
    return Enqueue(d, check, [this, send, recv, count, dtype, op](const OpDesc&) -> Status {
      RunReduceScatter(send, recv, count, dtype, op, /*destructive=*/false);
      return absl::OkStatus();
    });
  }

  Work ReduceScatterDestructive(void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                CUstream_st* stream) override {
    OpDesc d{.kind = OpKind::kReduceScatterDestructive, .dtype = dtype, .reduce = op, .count = count};
    Status check = ValidateBuffers(count, {send, recv}, world_);
    return Enqueue(d, check, [this, send, recv, count, dtype, op](const OpDesc&) -> Status {
      RunReduceScatter(send, recv, count, dtype, op, /*destructive=*/true);
      return absl::OkStatus();
    });
  }

  // Change 5 of RetargetableReduceScatter: the input-reading reduce-scatter (change 3) over strided blocks.
  bool SupportsReduceScatterStrided(size_t count, DType dtype) const override {
    return internal::GlooSupportsReduceScatterStrided(world_, count, dtype);
  }

  Work ReduceScatterStrided(const void* send, void* recv, size_t count, size_t stride, DType dtype, ReduceOp op,
                            CUstream_st* stream) override {
    OpDesc d{.kind = OpKind::kReduceScatterStrided, .dtype = dtype, .reduce = op, .count = count, .stride = stride};
    Status check = ValidateStrided(count, stride, send, recv);
    if (check.ok() && count > 0 && !SupportsReduceScatterStrided(count, dtype)) {
      check = absl::UnimplementedError(absl::StrCat(
          "no strided reduce-scatter of ", count, " elements per rank of ", std::string(DTypeName(dtype)), " at world ",
          world_, " (only f32 on power-of-two worlds, at least 1024 elements per rank: SupportsReduceScatterStrided)"));
    }
    return Enqueue(d, check, [this, send, recv, count, stride, op](const OpDesc&) -> Status {
      const ReduceOp reduce = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
      auto* input = const_cast<float*>(static_cast<const float*>(send));
      auto* out = static_cast<float*>(recv);
      RsCacheEntry& e = GetReduceScatter(RsKey{count * world_, reduce, RsMode::kFromInput}, input);
      e.algorithm->SetInput(input, out, stride);
      e.algorithm->SetDivisor(op == ReduceOp::kAvg ? static_cast<float>(world_) : 1.0f);
      e.algorithm->run();
      e.algorithm->SetInput(nullptr, nullptr);
      TrimCache();
      return absl::OkStatus();
    });
  }

  Work AllReduce(void* buf, size_t count, DType dtype, ReduceOp op, CUstream_st* stream) override {
    OpDesc d{.kind = OpKind::kAllReduce, .dtype = dtype, .reduce = op, .count = count};
    Status check = ValidateBuffers(count, {buf}, 1);
    return Enqueue(d, check, [this, buf, count, dtype, op](const OpDesc& desc) -> Status {
      if (world_ == 1) return absl::OkStatus();  // sum, avg and max of one rank are the identity
      if (dtype != DType::kF32) {
        if (static_cast<int64_t>(count * sizeof(float)) > stage_.bytes()) {
          stage_.Release();  // it grows: the old scratch goes first
          MakeRoom(static_cast<int64_t>(count * sizeof(float)), nullptr, true);
        }
        stage_last_use_ = ++rs_clock_;
      }
      float* data = dtype == DType::kF32 ? static_cast<float*>(buf) : stage_.Get(count);
      if (dtype != DType::kF32) ConvertBuffer(buf, dtype, data, DType::kF32, count);
      gloo::AllreduceOptions o(fn_ctx_);
      o.setOutput(data, count);
      o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      // gloo::sum and gloo::max are overloaded; name the 4-argument form explicitly.
      using ReduceFn = void (*)(void*, const void*, const void*, size_t);
      o.setReduceFunction(op == ReduceOp::kMax ? static_cast<ReduceFn>(&gloo::max<float>)
                                               : static_cast<ReduceFn>(&gloo::sum<float>));
      o.setTag(OpTag(desc));
      o.setTimeout(internal::ToGlooTimeout(options_.timeout));
      gloo::allreduce(o);
      if (op == ReduceOp::kAvg) DivideInPlace(data, count, static_cast<float>(world_));
      if (dtype != DType::kF32) ConvertBuffer(data, DType::kF32, buf, dtype, count);
      TrimCache();
      return absl::OkStatus();
    });
  }

  Work Broadcast(void* buf, size_t count, DType dtype, int root, CUstream_st* stream) override {
    OpDesc d{.kind = OpKind::kBroadcast, .dtype = dtype, .root = root, .count = count};
    Status check = ValidateBuffers(count, {buf}, 1);
    if (check.ok() && (root < 0 || root >= world_)) {
      check = absl::InvalidArgumentError(absl::StrCat("root ", root, " is not a rank of a world of ", world_));
    }
    return Enqueue(d, check, [this, buf, count, dtype, root](const OpDesc& desc) -> Status {
      if (world_ == 1) return absl::OkStatus();
      gloo::BroadcastOptions o(fn_ctx_);
      o.setOutput(static_cast<uint8_t*>(buf), count * DTypeSize(dtype));
      o.setRoot(root);
      o.setTag(OpTag(desc));
      o.setTimeout(internal::ToGlooTimeout(options_.timeout));
      gloo::broadcast(o);
      return absl::OkStatus();
    });
  }

  Work Barrier() override {
    OpDesc d{.kind = OpKind::kBarrier};
    return Enqueue(d, absl::OkStatus(), [this](const OpDesc& desc) -> Status {
      if (world_ == 1) return absl::OkStatus();
      gloo::BarrierOptions o(fn_ctx_);
      o.setTag(OpTag(desc));
      o.setTimeout(internal::ToGlooTimeout(options_.timeout));
      gloo::barrier(o);
      return absl::OkStatus();
    });
  }

 private:
  using Body = std::function<Status(const OpDesc&)>;
  struct Task {
    OpDesc desc;
    Status precheck;  // an argument error found at issue time; the op is not run
    Body body;
    std::shared_ptr<internal::HostWorkState> state;
  };

  // Tags keep ops apart on the wire: if two ranks ever disagree on the op sequence, messages of different
  // ops do not match each other (the op times out instead of mixing data). The fingerprint exchange uses the
  // other half of the tag space.
  static uint32_t OpTag(const OpDesc& op) { return static_cast<uint32_t>(op.seq) & 0x7fffffffu; }
  static uint32_t FingerprintTag(const OpDesc& op) { return OpTag(op) | 0x80000000u; }

  static Status ValidateBuffers(size_t count, std::initializer_list<const void*> ptrs, int blocks) {
    if (count == 0) return absl::OkStatus();
    for (const void* p : ptrs) {
      if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat("null buffer with count ", count));
    }
    if (count > SIZE_MAX / 4 / static_cast<size_t>(blocks)) {
      return absl::InvalidArgumentError(absl::StrCat("count ", count, " overflows the buffer size"));
    }
    return absl::OkStatus();
  }

  // ValidateBuffers for the strided ops, whose blocks lie `stride` elements apart (stride >= count).
  Status ValidateStrided(size_t count, size_t stride, const void* send, const void* recv) const {
    if (Status s = ValidateBuffers(count, {send, recv}, world_); !s.ok()) return s;
    if (count > 0 && stride < count) {
      return absl::InvalidArgumentError(absl::StrCat("stride ", stride, " is less than the count ", count));
    }
    if (count > 0 && stride > (SIZE_MAX / 4 - count) / static_cast<size_t>(world_)) {
      return absl::InvalidArgumentError(absl::StrCat("stride ", stride, " overflows the buffer size"));
    }
    return absl::OkStatus();
  }

  Work Enqueue(OpDesc desc, Status precheck, Body body) {
    desc.seq = next_seq_++;
    history_.RecordGloo(desc, label(), world_, rank_, options_.check_order);
    if (!precheck.ok()) {
      precheck = absl::Status(precheck.code(), absl::StrCat(internal::DescribeOp(desc), " on rank ", rank_, " of ",
                                                            world_, ": ", precheck.message()));
    }
    // A waiter may run queued ops itself (OrderedExecutor::Help); it holds the executor weakly because a Work
    // can outlive its communicator (then every op has completed and there is nothing to help with).
    std::weak_ptr<internal::OrderedExecutor> weak = executor_;
    auto state = std::make_shared<internal::HostWorkState>(desc, options_.timeout, progress_,
                                                           [weak](const std::function<bool()>& done) {
                                                             if (auto executor = weak.lock()) executor->Help(done);
                                                           });
    auto task = std::make_shared<Task>(Task{desc, std::move(precheck), std::move(body), state});
    executor_->Push([this, task] {
      Status s = RunTask(*task);
      if (!s.ok() && broken_.ok()) {
        broken_ = s;
        ZERO_LOG(ERROR) << s.message();
      }
      task->state->Complete(std::move(s));
    });
    return Work(std::move(state));
  }

  Status RunTask(Task& task) {
    const std::string what = absl::StrCat(internal::DescribeOp(task.desc), " on rank ", rank_, " of ", world_);
    if (!broken_.ok()) {
      return absl::Status(broken_.code(),
                          absl::StrCat(what, " was not run: the communicator failed earlier: ", broken_.message()));
    }
    if (!task.precheck.ok()) return task.precheck;
    progress_->Start(task.desc);
    Status s;
    try {
      if (options_.check_order && world_ > 1) s = ExchangeFingerprint(task.desc);
      if (s.ok() && !(task.desc.count == 0 && task.desc.kind != OpKind::kBarrier)) s = task.body(task.desc);
    } catch (...) {
      s = internal::GlooExceptionToStatus(std::current_exception(), what);
    }
    bool store_reachable = true;
    if (absl::IsDeadlineExceeded(s) && world_ > 1) s = WithDesyncReport(s, &store_reachable);
    // (Store::Add has no deadline: a store that did not answer the report is not asked again.)
    if ((absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s)) && world_ > 1 && store_reachable) {
      s = WithDepartures(s);
    }
    progress_->Stop();
    if (!s.ok() && absl::IsFailedPrecondition(s)) {
      s = absl::FailedPreconditionError(absl::StrCat(what, ": ", s.message()));
    }
    return s;
  }

  // An op timed out: a peer is dead, stopped, or issuing other ops (a desync). Torch's desync debugging
  // compares the ranks' op sequences at this point; so does this, through the store (which still works when
  // the collectives do not): each failing rank posts its last ops and waits a bounded time for the others',
  // a quarter of the timeout and at most 10 s (the Wait backstop fires only at 1.5 timeouts).
  Status WithDesyncReport(const Status& s, bool* store_reachable) {
    const std::vector<std::string> recent = history_.Recent();
    std::string mine;
    for (const std::string& op : recent) absl::StrAppend(&mine, op, "\n");
    if (mine.empty()) mine = "\n";
    const std::string base = absl::StrCat(key_prefix_, "/desync/");
    const absl::Duration budget = std::min(options_.timeout / 4, absl::Seconds(10));
    const absl::Time deadline = absl::Now() + budget;
    if (!store_->SetWithin(base + std::to_string(rank_), std::vector<uint8_t>(mine.begin(), mine.end()), budget).ok()) {
      *store_reachable = false;
      return absl::Status(s.code(), absl::StrCat(s.message(), "\n(no desync report: the store is unreachable too)"));
    }
    std::vector<std::string> posted(world_);
    posted[rank_] = mine;
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      const absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(1));
      auto v = store_->Get(base + std::to_string(r), left);
      if (v.ok()) posted[r].assign(v->begin(), v->end());
    }
    return absl::Status(s.code(), absl::StrCat(s.message(), "\n", internal::DescribeDesync(posted, rank_)));
  }

  // gloo::allgather (gloo/allgather.cc), the ring, with one change: rank r's block of `bytes` starts at
  // out + r·stride_bytes instead of out + r·bytes. Everything else is Gloo's: one unbound buffer over the output
  // on the function-API context, the slot Gloo builds from the op's tag, 2(N-1) messages, each block in two
  // halves (Gloo's chunkSize/chunkOffset), at step i half i&1 of block rank-i/2 going to the right neighbour
  // and the same half of block rank-i/2-1 coming from the left, waiting for the next-to-last send and receive
  // before issuing the next pair, then for the last two. The same messages, in the same order, of the same
  // sizes as Gloo's call on a contiguous output (on the wire the two cannot be told apart); only the offsets in
  // this rank's memory differ. The caller has put this rank's own block in place.
  void RingAllGatherStrided(uint8_t* out, size_t bytes, size_t stride_bytes, uint32_t tag) {
    const int n = world_;
    const int recv_rank = (n + rank_ - 1) % n;
    const int send_rank = (n + rank_ + 1) % n;
    auto buf = fn_ctx_->createUnboundBuffer(out, static_cast<size_t>(n - 1) * stride_bytes + bytes);
    const auto slot = gloo::Slot::build(gloo::kAllgatherSlotPrefix, tag);
    const auto timeout = internal::ToGlooTimeout(options_.timeout);
    const std::array<size_t, 2> half_size = {bytes / 2, bytes - bytes / 2};
    const std::array<size_t, 2> half_offset = {0, bytes / 2};
    for (int i = 0; i < (n - 1) * 2; ++i) {
      const int send_block = (n + rank_ - i / 2) % n;
      const int recv_block = (n + rank_ - i / 2 - 1) % n;
      const size_t send_offset = static_cast<size_t>(send_block) * stride_bytes + half_offset[i & 1];
      const size_t recv_offset = static_cast<size_t>(recv_block) * stride_bytes + half_offset[i & 1];
      if (i >= 2) {  // the operations of step i - 2 (Gloo: "we always wait for the next-to-last operation")
        buf->waitSend(timeout);
        buf->waitRecv(timeout);
      }
      buf->send(send_rank, slot, send_offset, half_size[i & 1]);
      buf->recv(recv_rank, slot, recv_offset, half_size[i & 1]);
    }
    for (int i = 0; i < 2; ++i) {
      buf->waitSend(timeout);
      buf->waitRecv(timeout);
    }
  }

  // Check mode: all ranks allgather a fingerprint of the op before running it.
  Status ExchangeFingerprint(const OpDesc& op) {
    internal::Fingerprint mine = internal::EncodeFingerprint(op);
    std::vector<uint8_t> all(internal::kFingerprintBytes * world_);
    gloo::AllgatherOptions o(fn_ctx_);
    o.setInput(mine.data(), mine.size());
    o.setOutput(all.data(), all.size());
    o.setTag(FingerprintTag(op));
    o.setTimeout(internal::ToGlooTimeout(options_.timeout));
    gloo::allgather(o);
    return internal::CompareFingerprints(all.data(), world_);
  }

  // Returns the cached algorithm for `key`, constructed on a miss, over a buffer of its own (kStaged) or over
  // `over` (kExternal: the caller's buffer, to which it is retargeted on every use; kFromInput: the caller's
  // input, which that variant's run() only reads through SetInput's buffers).
  // A miss first releases least recently used instances (MakeRoom), so that what stays cached and the new
  // instance fit options_.cache_bytes where they can.
  RsCacheEntry& GetReduceScatter(const RsKey& key, float* over) {
    ++rs_clock_;
    RsCacheEntry* entry = nullptr;
    for (auto& e : rs_cache_) {
      if (e.key == key) entry = &e;
    }
    if (entry == nullptr) {
      if (rs_cache_.size() >= kRsCacheEntries) {
        auto lru =
            std::min_element(rs_cache_.begin(), rs_cache_.end(),
                             [](const RsCacheEntry& a, const RsCacheEntry& b) { return a.last_use < b.last_use; });
        rs_cache_.erase(lru);
      }
      const int64_t bytes = RsInstanceBytes(world_, key.total, key.mode == RsMode::kStaged);
      MakeRoom(bytes, nullptr, false);
      rs_cache_.emplace_back();
      entry = &rs_cache_.back();
      entry->key = key;
      entry->bytes = bytes;
      if (key.mode == RsMode::kStaged) entry->owned = TrackedFloats(&tracker_, key.total);
    }
    entry->last_use = rs_clock_;
    if (entry->algorithm == nullptr || ++entry->uses % internal::GlooReduceScatterRebuildEvery() == 0) {
      entry->algorithm.reset();  // before constructing: a destroyed buffer unregisters its slot
      const size_t block = key.total / world_;
      entry->algorithm = std::make_unique<RetargetableReduceScatter>(
          rs_ctx_, key.mode == RsMode::kStaged ? entry->owned.get() : over, static_cast<int>(key.total),
          std::vector<int>(world_, static_cast<int>(block)),
          key.reduce == ReduceOp::kMax ? gloo::ReductionFunction<float>::max : gloo::ReductionFunction<float>::sum,
          &tracker_);
      ZERO_CHECK(entry->bytes == entry->algorithm->gloo_bytes() + static_cast<int64_t>(entry->owned.size() * 4))
          << "RsInstanceBytes no longer matches Gloo's instance (total " << key.total << ", world " << world_ << ")";
    }
    if (key.mode == RsMode::kExternal) entry->algorithm->Retarget(over);
    return *entry;
  }

  // The staging cached between ops: the reduce-scatter instances and the f32 scratch.
  int64_t CachedBytes() const {
    int64_t b = stage_.bytes();
    for (const auto& e : rs_cache_) b += e.bytes;
    return b;
  }
  // Releases the least recently used of the instances and the scratch, except what the op in progress uses
  // (`keep`, `keep_scratch`); false if nothing is left to release.
  bool ReleaseLeastRecentlyUsed(const RsKey* keep, bool keep_scratch) {
    auto lru = rs_cache_.end();
    for (auto it = rs_cache_.begin(); it != rs_cache_.end(); ++it) {
      if (keep != nullptr && it->key == *keep) continue;
      if (lru == rs_cache_.end() || it->last_use < lru->last_use) lru = it;
    }
    const bool scratch = !keep_scratch && stage_.bytes() > 0;
    if (scratch && (lru == rs_cache_.end() || stage_last_use_ < lru->last_use)) {
      stage_.Release();
      return true;
    }
    if (lru == rs_cache_.end()) return false;
    rs_cache_.erase(lru);
    return true;
  }
  // Before an op allocates `need` bytes of staging: releases what was least recently used while what stays
  // cached and `need` exceed the budget. Every rank decides alike (same budget, same ops, same sizes).
  void MakeRoom(int64_t need, const RsKey* keep, bool keep_scratch) {
    while (CachedBytes() + need > options_.cache_bytes && ReleaseLeastRecentlyUsed(keep, keep_scratch)) {
    }
  }
  // After an op: what stays cached beyond the budget is released, least recently used first (what the op just
  // used last). So between ops the staging is at most cache_bytes, and during one at most the larger of
  // cache_bytes and what the op itself needs.
  void TrimCache() { MakeRoom(0, nullptr, false); }

  void RunReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, bool destructive) {
    RunReduceScatterCached(send, recv, count, dtype, op, destructive);
    TrimCache();
  }

  void RunReduceScatterCached(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, bool destructive) {
    const size_t esize = DTypeSize(dtype);
    const auto* in = static_cast<const uint8_t*>(send);
    auto* out = static_cast<uint8_t*>(recv);
    if (world_ == 1) {
      if (in != out) std::memmove(out, in, count * esize);
      return;
    }
    const ReduceOp reduce = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
    const float divisor = op == ReduceOp::kAvg ? static_cast<float>(world_) : 1.0f;
    const size_t chunk = std::max<size_t>(1, internal::GlooReduceScatterChunkLimit() / world_);
    if (destructive && dtype == DType::kF32 && count <= chunk) {
      float* data = const_cast<float*>(static_cast<const float*>(send));
      RsCacheEntry& e = GetReduceScatter(RsKey{count * world_, reduce, RsMode::kExternal}, data);
      // A `recv` outside the buffer receives the result directly; one inside it (send + rank*count, or any
      // other overlap) gets it from the buffer's start.
      const size_t bytes = count * esize;
      const bool apart = !Overlaps(out, bytes, in, bytes * world_);
      float* const result = apart ? reinterpret_cast<float*>(out) : data;
      e.algorithm->SetOutput(apart ? result : nullptr);
      e.algorithm->SetDivisor(divisor);
      e.algorithm->run();
      e.algorithm->SetOutput(nullptr);
      if (!apart && out != in) std::memmove(out, data, bytes);
      return;
    }
    if (dtype == DType::kF32 && count <= chunk && RetargetableReduceScatter::CanRunFromInput(world_, count * world_)) {
      // No staging copy: the algorithm reads the const input at step 0 (change 3 above).
      auto* input = const_cast<float*>(static_cast<const float*>(send));
      RsCacheEntry& e = GetReduceScatter(RsKey{count * world_, reduce, RsMode::kFromInput}, input);
      e.algorithm->SetInput(input, reinterpret_cast<float*>(out));
      e.algorithm->SetDivisor(divisor);
      e.algorithm->run();
      e.algorithm->SetInput(nullptr, nullptr);
      return;
    }
    for (size_t off = 0; off < count; off += chunk) {
      const size_t c = std::min(chunk, count - off);
      RsCacheEntry& e = GetReduceScatter(RsKey{c * world_, reduce, RsMode::kStaged}, nullptr);
      float* buf = e.algorithm->data();
      if (c == count) {
        ConvertBuffer(in, dtype, buf, DType::kF32, count * world_);
      } else {
        for (int r = 0; r < world_; ++r) {
          ConvertBuffer(in + (r * count + off) * esize, dtype, buf + r * c, DType::kF32, c);
        }
      }
      e.algorithm->SetDivisor(divisor);
      e.algorithm->run();
      ConvertBuffer(buf, DType::kF32, out + off * esize, dtype, c);
    }
  }

  const std::shared_ptr<Store> store_;  // kept alive: a TCP store's server runs in rank 0's store
  const int rank_;
  const int world_;
  const CommOptions options_;
  int splits_ = 0;  // Split calls so far (issuing thread only)
  const std::shared_ptr<internal::CommProgress> progress_;

  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> fn_ctx_;
  std::shared_ptr<gloo::rendezvous::Context> rs_ctx_;

  int64_t next_seq_ = 0;  // issuing thread only
  internal::OpHistory history_;
  std::string key_prefix_;        // this communicator's store keys (the generation under options_.prefix)
  std::vector<int64_t> budgets_;  // every rank's cache_bytes, exchanged at Connect
  bool connected_ = false;        // both contexts connected (world > 1)

  const std::shared_ptr<internal::OrderedExecutor> executor_ = std::make_shared<internal::OrderedExecutor>();
  std::thread thread_;

  // State of the thread running ops (the communication thread or a helping waiter; never two at once).
  Status broken_;
  std::atomic<bool> abandoned_{false};  // Abandon(): close without meeting the peers
  MemoryTracker tracker_;               // declared before the buffers it counts, so it outlives them
  FloatScratch stage_{&tracker_};
  std::deque<RsCacheEntry> rs_cache_;  // deque: entries stay put when others are added
  uint64_t rs_clock_ = 0;              // the cache's clock: one tick per use of an instance or the scratch
  uint64_t stage_last_use_ = 0;
};

}  // namespace

namespace internal {

int64_t GlooReduceScatterStagingBytes(int world, size_t count, DType dtype, bool destructive) {
  if (world == 1 || count == 0) return 0;
  const size_t chunk = std::max<size_t>(1, GlooReduceScatterChunkLimit() / world);
  if (dtype == DType::kF32 && count <= chunk &&
      (destructive || RetargetableReduceScatter::CanRunFromInput(world, count * world))) {
    return RsInstanceBytes(world, count * world, /*staged=*/false);
  }
  // Staged in column chunks of `chunk` per rank: that instance and, for a shorter last chunk, one more.
  int64_t bytes = RsInstanceBytes(world, std::min(chunk, count) * world, /*staged=*/true);
  if (count > chunk && count % chunk != 0) bytes += RsInstanceBytes(world, count % chunk * world, true);
  return bytes;
}

bool GlooSupportsReduceScatterStrided(int world, size_t count, DType dtype) {
  const size_t chunk = std::max<size_t>(1, GlooReduceScatterChunkLimit() / world);
  return dtype == DType::kF32 && count > 0 && count <= chunk &&
         RetargetableReduceScatter::CanRunFromInput(world, count * world);
}

int64_t GlooAllReduceStagingBytes(int world, size_t count, DType dtype) {
  return world == 1 || dtype == DType::kF32 ? 0 : static_cast<int64_t>(count * sizeof(float));
}

}  // namespace internal

StatusOr<std::shared_ptr<Communicator>> Communicator::CreateGloo(std::shared_ptr<Store> store, int rank, int world_size,
                                                                 const CommOptions& options) {
  if (store == nullptr) return absl::InvalidArgumentError("CreateGloo: store is null");
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateGloo: rank ", rank, " is not in [0, world_size ", world_size, ")"));
  }
  ZERO_ASSIGN_OR_RETURN(CommOptions opts, internal::ApplyCommEnvOverrides(options, internal::ProcessEnv()));
  ZERO_RETURN_IF_ERROR(internal::CheckCommTimeout(opts.timeout));
  if (opts.cache_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CommOptions::cache_bytes must be >= 0, got ", opts.cache_bytes));
  }
  // Each rank counts the communicators it built on this store and prefix, so the k-th communicator of every
  // rank meets the others under the same fresh keys (Gloo's store keys are write-once).
  // A job's keys live under its own scope, so ranks of another job on the same store never take them.
  const std::string scope = internal::JobScope(opts.prefix, opts.job_id);
  ZERO_ASSIGN_OR_RETURN(int64_t generation, store->Add(absl::StrCat(scope, "/generation/", rank), 1));
  const std::string key_prefix = absl::StrCat(scope, "/", generation - 1);
  auto* native = static_cast<gloo::rendezvous::Store*>(store->NativeHandle());
  if (native == nullptr) return absl::FailedPreconditionError("CreateGloo: the store has no Gloo handle");
  // A peer that dies closes its sockets; writing to one must be an error Gloo reports, not a SIGPIPE that
  // kills this process. Only the default disposition is replaced.
  struct sigaction old_action {};
  if (sigaction(SIGPIPE, nullptr, &old_action) == 0 && old_action.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);

  auto comm = std::make_unique<GlooCommunicator>(std::move(store), rank, world_size, opts);
  internal::MaybeInjectFault("rendezvous", rank, 0);
  ZERO_RETURN_IF_ERROR(internal::AgreeAtRendezvous(*comm->store(), opts.prefix, key_prefix, rank, world_size,
                                                   opts.job_id, opts.timeout));
  ZERO_RETURN_IF_ERROR(comm->Connect(*native, key_prefix));
  return std::shared_ptr<Communicator>(std::move(comm));
}

}  // namespace zero
