// zero/memory.h — every byte zero allocates is tagged by category and tier, so memory is reported, not estimated.
//
//   zero::MemoryTracker tracker;
//   zero::Buffer master = zero::Buffer::Host(&tracker, zero::MemTag::kMaster, n * 4);   // 64-byte aligned
//   zero::MemoryReport r = tracker.Report();
//   r.Get(zero::MemTier::kHost, zero::MemTag::kMaster).current;   // == n * 4
//
// A tracker is per rank (per Engine). Its counters are atomic: buffers may be created and destroyed from
// several threads. Peak is the high-water mark of `current` per (tier, tag) since creation or ResetPeaks();
// peak_total is the high-water mark of a tier's total, which is what an out-of-memory error depends on.
//
// ERRORS. Nothing here aborts on the caller's input. An allocation that fails (the allocator, or the tracker's
// budget) is a Status where the call takes a `Status* error`, and otherwise throws std::bad_alloc like operator
// new.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "zero/status.h"

namespace zero {

enum class MemTag : uint8_t {
  kParams = 0,   // parameters the trainer computes with (16-bit or fp32 working copy, or their shard)
  kGrads,        // gradients (full or sharded, incl. the fp32 accumulator)
  kOptimizer,    // optimizer state (Adam m/v, momentum, plug-in states)
  kMaster,       // fp32 master weights (mixed precision)
  kGather,       // full-unit buffers a stage-3 gather fills
  kBuckets,      // gradient reduction buckets (incl. a bucket's wire-dtype copy and the reduce-scatter output)
  kActivations,  // activation arena / checkpoints
  kStaging,      // staging between tiers (offload copy-back tiles) and the communicator's own copies
  kCount,
};
// kNvme: bytes in files on a disk (offload_optimizer.device "nvme": the fp32 master and optimizer state of the
// host-updated range), counted where they live though no memory holds them; Buffer never allocates there.
enum class MemTier : uint8_t { kHost = 0, kDevice = 1, kNvme = 2, kCount };

// Lower-case names used in reports and JSON: "params", "grads", "optimizer", "master", "gather", "buckets",
// "activations", "staging"; tiers "host", "device", "nvme".
const char* MemTagName(MemTag tag);
const char* MemTierName(MemTier tier);

struct MemoryUsage {
  int64_t current = 0;
  int64_t peak = 0;
};

struct MemoryReport {
  std::array<std::array<MemoryUsage, static_cast<size_t>(MemTag::kCount)>, static_cast<size_t>(MemTier::kCount)>
      usage{};
  // Per tier, the high-water mark of the bytes alive at once (all tags together). Tags peak at different
  // moments (stage-3 gathers are released before the buckets fill), so this is at most, and usually less than,
  // the sum of the tier's per-tag peaks: the figure to compare with the tier's capacity. 0 in a report not
  // made by a tracker (the plan's).
  std::array<int64_t, static_cast<size_t>(MemTier::kCount)> peak_total{};
  // Bytes of padding included in the figures above (unit flat buffers padded to equal, aligned shards).
  int64_t padding_bytes = 0;

  const MemoryUsage& Get(MemTier tier, MemTag tag) const {
    return usage[static_cast<size_t>(tier)][static_cast<size_t>(tag)];
  }
  int64_t PeakTotal(MemTier tier) const { return peak_total[static_cast<size_t>(tier)]; }
  // Sum of `current` over the given tags in one tier.
  int64_t Current(MemTier tier) const;
  // Model-state bytes (params + grads + optimizer + master) in both tiers: what the ZeRO paper's formulas count.
  int64_t ModelStateBytes() const;
  // A human-readable table.
  std::string ToString() const;
  // {"params": {"tier": "host", "current": .., "peak": ..}, ..., "peak_total": {"host": .., "device": ..}} —
  // one entry per tag that was ever used (a tag used in both tiers appears as "params@device" for its device
  // part), then always "peak_total", the only key that is not a tag.
  std::string ToJson() const;
};

class MemoryTracker {
 public:
  MemoryTracker() = default;
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  // Thread-safe. Each also moves the tier's total and peak_total here and in every tracker this one counts in.
  void Add(MemTier tier, MemTag tag, int64_t bytes);
  void Sub(MemTier tier, MemTag tag, int64_t bytes);
  void AddPadding(int64_t bytes) { padding_.fetch_add(bytes, std::memory_order_relaxed); }
  // Lowers every peak, peak_total included, to the current figure.
  void ResetPeaks();
  // This tracker's own bytes by tag (peak_total: its own and those counted in it, see CountAlsoIn).
  MemoryReport Report() const;
  // The same, but each tag's current and peak also count the bytes of the trackers that count in this one
  // (CountAlsoIn) while they do: the high-water mark of the tag's bytes in all of them alive at once, not a sum
  // of their peaks. So no tag's peak exceeds its tier's peak_total (each allocation enters the tier's total
  // before its tag and leaves it after), which adding separately kept peaks did not promise: a buffer of the
  // engine freed before the communicator's cache filled was counted in both. Engine::memory_report uses it.
  MemoryReport ReportWithLinked() const;

  // Counts this tracker's bytes also in `total`'s per-tier totals — the bytes alive here now, then every
  // Add/Sub as it happens — until StopCountingIn(total); not in `total`'s own per-tag figures (Report), which
  // stay its own, but in its combined ones (ReportWithLinked).
  // So `total`'s peak_total is the high-water mark of both trackers' bytes alive at once, where adding the
  // two peaks would over-state it: the Engine counts its communicator's staging (a tracker the communicator
  // owns, shared by every engine over it) into its own tracker this way. Thread-safe with Add/Sub here (an
  // allocation is never half counted). `total` must outlive the link; what reaches it this way goes no further
  // (not to trackers `total` itself counts in).
  void CountAlsoIn(MemoryTracker* total);
  // Ends CountAlsoIn(total), taking this tracker's bytes alive now back out of `total`'s totals.
  void StopCountingIn(MemoryTracker* total);
  // How many allocations were counted in `tier` so far (Add calls): equal before and after a training step
  // when the step allocated nothing there (the steady state of the engine's pools).
  int64_t allocations(MemTier tier) const { return adds_[static_cast<size_t>(tier)].load(std::memory_order_relaxed); }

  // A budget for a tier: an allocation through Buffer that would take the tier's total (this tracker's bytes and
  // those counted in it, as in peak_total) past `bytes` is not made, and fails with RESOURCE_EXHAUSTED as a
  // failure of the allocator would (see Buffer). 0 (the default): no budget. For running as on a smaller device
  // than the one at hand, and for testing what an out-of-memory does (docs/internals/design.md, "Running out of
  // memory"). Bytes counted with Add directly (the communicator's record of its transport's own buffers) are not
  // refused, but they count against the budget of later allocations.
  void SetLimit(MemTier tier, int64_t bytes);
  int64_t limit(MemTier tier) const { return limit_[static_cast<size_t>(tier)].load(std::memory_order_relaxed); }
  // Calls `allocate` (true: it succeeded) and counts `bytes` under (tier, tag) when it did; when the tier's
  // budget would be exceeded, neither (false, *over_budget set). Under a budget the check, the allocation and the
  // count are one step, so racing allocations never both pass a budget only one fits, and a refused or failed
  // allocation leaves no trace in the figures (peaks and allocations() included).
  bool AllocateCounted(MemTier tier, MemTag tag, int64_t bytes, const std::function<bool()>& allocate,
                       bool* over_budget);
  // The tier's bytes alive now, this tracker's and those counted in it: what the budget is checked against.
  int64_t total(MemTier tier) const {
    return total_[static_cast<size_t>(tier)].current.load(std::memory_order_relaxed);
  }

 private:
  struct Counter {
    std::atomic<int64_t> current{0};
    std::atomic<int64_t> peak{0};
  };
  // Moves a counter by `bytes` and raises its peak to the new value (a CAS loop: no raise is lost to a
  // concurrent one).
  static void Move(Counter& c, int64_t bytes);
  // Adds `bytes` (negative: frees) to this tracker's and its listeners' totals of `tier`.
  void MoveTotals(MemTier tier, int64_t bytes);
  // Adds `bytes` to (tier, tag) here (own and combined) and in the listeners' combined figures.
  void MoveTags(MemTier tier, MemTag tag, int64_t bytes);

  using TagCounters =
      std::array<std::array<Counter, static_cast<size_t>(MemTag::kCount)>, static_cast<size_t>(MemTier::kCount)>;
  TagCounters c_;
  // Per (tier, tag), this tracker's bytes plus those of the trackers counting in it (ReportWithLinked).
  TagCounters combined_;
  // Per tier, the bytes counted here plus those of the trackers counting in this one (CountAlsoIn).
  std::array<Counter, static_cast<size_t>(MemTier::kCount)> total_;
  std::atomic<int64_t> padding_{0};
  std::array<std::atomic<int64_t>, static_cast<size_t>(MemTier::kCount)> adds_{};
  std::array<std::atomic<int64_t>, static_cast<size_t>(MemTier::kCount)> limit_{};
  std::mutex limit_mu_;  // serializes AllocateCounted under a budget
  // Add/Sub hold it shared and CountAlsoIn/StopCountingIn exclusively, so the bytes handed over when a link
  // starts or ends are exactly those the later Add/Sub calls pass on or have passed on.
  mutable std::shared_mutex listeners_mu_;
  std::vector<MemoryTracker*> listeners_;
};

// An owned, tagged, aligned host allocation (zero-filled). Move-only; frees and untracks on destruction.
class Buffer {
 public:
  Buffer() = default;
  // 64-byte aligned host memory (cache line / AVX-512), zero-filled. When the allocator fails or the tracker's
  // budget (MemoryTracker::SetLimit) would be exceeded: with `error` null, throws std::bad_alloc like operator
  // new; with `error`, returns an empty buffer and sets *error (RESOURCE_EXHAUSTED naming the tag, the tier and
  // the bytes). The engine always passes `error`.
  // Reported in `tier`: MemTier::kDevice is for host memory that serves as the compute device's own — the host
  // (Gloo) engine computes on the CPU, so its compute tier is host DRAM reported as "device" (docs/internals/design.md,
  // "Tiers"); everything else is kHost.
  static Buffer Host(MemoryTracker* tracker, MemTag tag, size_t bytes, MemTier tier = MemTier::kHost,
                     Status* error = nullptr);
  // Pinned (page-locked) host memory when the program links zero::cuda and a device is present; otherwise the
  // same as Host. Reported in the host tier. Failures as for Host.
  static Buffer Pinned(MemoryTracker* tracker, MemTag tag, size_t bytes, Status* error = nullptr);
  // Memory of the current CUDA device (cudaMalloc), zero-filled before this returns, reported in the device
  // tier: the CUDA engine's compute tier. On failure (zero::cuda not linked or no CUDA build: kUnimplemented;
  // no device, out of memory, the tracker's budget) an empty buffer and *error names the tag and the size.
  static Buffer Device(MemoryTracker* tracker, MemTag tag, size_t bytes, Status* error);
  // A view of memory zero does not own (a trainer's own buffer, zero/sharded_optimizer.h): never counted, never
  // freed; Reset only forgets it. `tier` says where it lives, as for the owning kinds.
  static Buffer Borrow(void* data, size_t bytes, MemTag tag, MemTier tier);

  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  void Reset();
  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }
  bool empty() const { return data_ == nullptr; }
  MemTag tag() const { return tag_; }
  MemTier tier() const { return tier_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  MemoryTracker* tracker_ = nullptr;
  MemTag tag_ = MemTag::kParams;
  MemTier tier_ = MemTier::kHost;
  enum class Kind : uint8_t { kHost, kPinned, kDevice, kBorrowed };
  Kind kind_ = Kind::kHost;
};

}  // namespace zero
