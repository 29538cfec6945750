#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/internal/cuda_backend.h"
#include "zero/memory.h"

namespace zero {

const char* MemTagName(MemTag tag) {
  switch (tag) {
    case MemTag::kParams: return "params";
    case MemTag::kGrads: return "grads";
    case MemTag::kOptimizer: return "optimizer";
    case MemTag::kMaster: return "master";
    case MemTag::kGather: return "gather";
    case MemTag::kBuckets: return "buckets";
    case MemTag::kActivations: return "activations";
    case MemTag::kStaging: return "staging";
    case MemTag::kCount: break;
  }
  return "?";
}
const char* MemTierName(MemTier tier) {
  switch (tier) {
    case MemTier::kHost: return "host";
    case MemTier::kDevice: return "device";
    case MemTier::kNvme: return "nvme";
    case MemTier::kCount: break;
  }
  return "?";
}

int64_t MemoryReport::Current(MemTier tier) const {
  int64_t sum = 0;
  for (const auto& u : usage[static_cast<size_t>(tier)]) sum += u.current;
  return sum;
}

int64_t MemoryReport::ModelStateBytes() const {
  int64_t sum = 0;
  for (size_t t = 0; t < static_cast<size_t>(MemTier::kCount); ++t) {
    for (MemTag tag : {MemTag::kParams, MemTag::kGrads, MemTag::kOptimizer, MemTag::kMaster}) {
      sum += usage[t][static_cast<size_t>(tag)].current;
    }
  }
  return sum;
}

std::string MemoryReport::ToString() const {
  std::ostringstream os;
  os << "tier    tag          current_bytes      peak_bytes\n";
  for (size_t t = 0; t < static_cast<size_t>(MemTier::kCount); ++t) {
    for (size_t g = 0; g < static_cast<size_t>(MemTag::kCount); ++g) {
      const auto& u = usage[t][g];
      if (u.peak == 0) continue;
      char line[160];
      std::snprintf(line, sizeof(line), "%-7s %-11s %15lld %15lld\n", MemTierName(static_cast<MemTier>(t)),
                    MemTagName(static_cast<MemTag>(g)), static_cast<long long>(u.current),
                    static_cast<long long>(u.peak));
      os << line;
    }
  }
  os << "peak total (all tags alive at once):";
  for (size_t t = 0; t < peak_total.size(); ++t) {
    if (t == static_cast<size_t>(MemTier::kNvme) && peak_total[t] == 0) continue;  // only where used
    os << " " << MemTierName(static_cast<MemTier>(t)) << " " << peak_total[t];
  }
  os << "\n";
  os << "padding bytes (included above): " << padding_bytes << "\n";
  return os.str();
}

std::string MemoryReport::ToJson() const {
  std::ostringstream os;
  os << "{";
  bool first = true;
  for (size_t g = 0; g < static_cast<size_t>(MemTag::kCount); ++g) {
    for (size_t t = 0; t < static_cast<size_t>(MemTier::kCount); ++t) {
      const auto& u = usage[t][g];
      if (u.peak == 0) continue;
      std::string name = MemTagName(static_cast<MemTag>(g));
      if (t == 1 && usage[0][g].peak != 0) name += "@device";
      if (t == 2 && (usage[0][g].peak != 0 || usage[1][g].peak != 0)) name += "@nvme";
      if (!first) os << ", ";
      first = false;
      os << "\"" << name << "\": {\"tier\": \"" << MemTierName(static_cast<MemTier>(t))
         << "\", \"current\": " << u.current << ", \"peak\": " << u.peak << "}";
    }
  }
  if (!first) os << ", ";
  os << "\"peak_total\": {\"host\": " << PeakTotal(MemTier::kHost) << ", \"device\": " << PeakTotal(MemTier::kDevice);
  // The NVMe tier only where it was used, so reports without it read as before.
  if (PeakTotal(MemTier::kNvme) != 0) os << ", \"nvme\": " << PeakTotal(MemTier::kNvme);
  os << "}}";
  return os.str();
}

void MemoryTracker::Move(Counter& c, int64_t bytes) {
  const int64_t now = c.current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = c.peak.load(std::memory_order_relaxed);
  while (now > peak && !c.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void MemoryTracker::MoveTotals(MemTier tier, int64_t bytes) {
  const auto t = static_cast<size_t>(tier);
  Move(total_[t], bytes);
  for (MemoryTracker* l : listeners_) Move(l->total_[t], bytes);
}

void MemoryTracker::MoveTags(MemTier tier, MemTag tag, int64_t bytes) {
  const auto t = static_cast<size_t>(tier), g = static_cast<size_t>(tag);
  Move(c_[t][g], bytes);
  Move(combined_[t][g], bytes);
  for (MemoryTracker* l : listeners_) Move(l->combined_[t][g], bytes);
}

// An allocation enters the totals before its tag and a free leaves its tag before the totals, so at every moment
// a tier's total holds at least each tag's bytes (also with other threads allocating and freeing): no tag's peak
// can exceed peak_total.
void MemoryTracker::Add(MemTier tier, MemTag tag, int64_t bytes) {
  adds_[static_cast<size_t>(tier)].fetch_add(1, std::memory_order_relaxed);
  std::shared_lock lock(listeners_mu_);
  MoveTotals(tier, bytes);
  MoveTags(tier, tag, bytes);
}

void MemoryTracker::SetLimit(MemTier tier, int64_t bytes) {
  limit_[static_cast<size_t>(tier)].store(std::max<int64_t>(0, bytes), std::memory_order_relaxed);
}

bool MemoryTracker::AllocateCounted(MemTier tier, MemTag tag, int64_t bytes, const std::function<bool()>& allocate,
                                    bool* over_budget) {
  const auto t = static_cast<size_t>(tier);
  *over_budget = false;
  std::unique_lock<std::mutex> lock(limit_mu_, std::defer_lock);
  if (limit_[t].load(std::memory_order_relaxed) > 0) {
    lock.lock();
    const int64_t limit = limit_[t].load(std::memory_order_relaxed);
    if (limit > 0 && total_[t].current.load(std::memory_order_relaxed) + bytes > limit) {
      *over_budget = true;
      return false;
    }
  }
  if (!allocate()) return false;
  Add(tier, tag, bytes);
  return true;
}

void MemoryTracker::Sub(MemTier tier, MemTag tag, int64_t bytes) {
  std::shared_lock lock(listeners_mu_);
  MoveTags(tier, tag, -bytes);
  MoveTotals(tier, -bytes);
}

void MemoryTracker::CountAlsoIn(MemoryTracker* total) {
  if (total == nullptr || total == this) return;
  std::unique_lock lock(listeners_mu_);
  if (std::find(listeners_.begin(), listeners_.end(), total) != listeners_.end()) return;
  listeners_.push_back(total);
  // Only this tracker's own bytes: the totals of trackers counting in this one do not travel further. The total
  // first, then the tags (see Add).
  for (size_t t = 0; t < c_.size(); ++t) {
    int64_t own = 0;
    for (const Counter& c : c_[t]) own += c.current.load(std::memory_order_relaxed);
    Move(total->total_[t], own);
    for (size_t g = 0; g < c_[t].size(); ++g) Move(total->combined_[t][g], c_[t][g].current.load());
  }
}

void MemoryTracker::StopCountingIn(MemoryTracker* total) {
  std::unique_lock lock(listeners_mu_);
  auto it = std::find(listeners_.begin(), listeners_.end(), total);
  if (it == listeners_.end()) return;
  listeners_.erase(it);
  for (size_t t = 0; t < c_.size(); ++t) {
    int64_t own = 0;
    for (size_t g = 0; g < c_[t].size(); ++g) {
      const int64_t bytes = c_[t][g].current.load(std::memory_order_relaxed);
      total->combined_[t][g].current.fetch_sub(bytes, std::memory_order_relaxed);
      own += bytes;
    }
    total->total_[t].current.fetch_sub(own, std::memory_order_relaxed);
  }
}

void MemoryTracker::ResetPeaks() {
  for (TagCounters* counters : {&c_, &combined_}) {
    for (auto& tier : *counters) {
      for (auto& c : tier) c.peak.store(c.current.load());
    }
  }
  for (auto& c : total_) c.peak.store(c.current.load());
}

namespace {
template <typename Counters, typename Totals>
MemoryReport ReportOf(const Counters& counters, const Totals& totals, int64_t padding) {
  MemoryReport r;
  for (size_t t = 0; t < counters.size(); ++t) {
    for (size_t g = 0; g < counters[t].size(); ++g) {
      r.usage[t][g].current = counters[t][g].current.load();
      r.usage[t][g].peak = counters[t][g].peak.load();
    }
    r.peak_total[t] = totals[t].peak.load();
  }
  r.padding_bytes = padding;
  return r;
}
}  // namespace

MemoryReport MemoryTracker::Report() const { return ReportOf(c_, total_, padding_.load()); }
MemoryReport MemoryTracker::ReportWithLinked() const { return ReportOf(combined_, total_, padding_.load()); }

namespace {
constexpr size_t kAlign = 64;
size_t RoundUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// What an allocation that could not be made says: the tag, the tier and the bytes, and why.
Status AllocError(MemTag tag, MemTier tier, size_t bytes, const MemoryTracker* tracker, bool over_budget,
                  const char* what) {
  if (over_budget) {
    const int64_t limit = tracker->limit(tier);
    return absl::ResourceExhaustedError(absl::StrCat(what, " of ", bytes, " bytes for ", MemTagName(tag), " (",
                                                     MemTierName(tier), " tier): over the tier's budget of ", limit,
                                                     " bytes (MemoryTracker::SetLimit) with ", tracker->total(tier),
                                                     " bytes in use"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(what, " of ", bytes, " bytes for ", MemTagName(tag), " (",
                                                   MemTierName(tier), " tier): the allocator failed (out of memory)"));
}

// Host and Pinned's failure: *error, or std::bad_alloc as operator new does.
Buffer Fail(Status s, Status* error) {
  if (error == nullptr) throw std::bad_alloc();
  *error = std::move(s);
  return Buffer();
}
}  // namespace

Buffer Buffer::Host(MemoryTracker* tracker, MemTag tag, size_t bytes, MemTier tier, Status* error) {
  Buffer b;
  if (bytes == 0) return b;
  auto allocate = [&] {
    b.data_ = std::aligned_alloc(kAlign, RoundUp(bytes));
    return b.data_ != nullptr;
  };
  bool over_budget = false;
  if (!(tracker != nullptr ? tracker->AllocateCounted(tier, tag, static_cast<int64_t>(bytes), allocate, &over_budget)
                           : allocate())) {
    return Fail(AllocError(tag, tier, bytes, tracker, over_budget, "host buffer"), error);
  }
  std::memset(b.data_, 0, bytes);
  b.size_ = bytes;
  b.tracker_ = tracker;
  b.tag_ = tag;
  b.tier_ = tier;
  return b;
}

Buffer Buffer::Pinned(MemoryTracker* tracker, MemTag tag, size_t bytes, Status* error) {
  // Page-locking goes through zero::cuda (core/internal/cuda_backend.h); without it, or without a device, the
  // memory is pageable.
  const internal::CudaBackend* cuda = internal::GetCudaBackend();
  if (bytes > 0 && cuda != nullptr && cuda->device_count() > 0) {
    Buffer b;
    auto allocate = [&] { return (b.data_ = cuda->alloc_pinned(bytes)) != nullptr; };
    bool over_budget = false;
    if (tracker != nullptr
            ? tracker->AllocateCounted(MemTier::kHost, tag, static_cast<int64_t>(bytes), allocate, &over_budget)
            : allocate()) {
      std::memset(b.data_, 0, bytes);
      b.size_ = bytes;
      b.tracker_ = tracker;
      b.tag_ = tag;
      b.kind_ = Kind::kPinned;
      return b;
    }
    b.data_ = nullptr;
    if (over_budget) return Fail(AllocError(tag, MemTier::kHost, bytes, tracker, true, "pinned host buffer"), error);
    // Page-locked memory is scarcer than pageable: fall back to the latter, as without a device.
  }
  return Host(tracker, tag, bytes, MemTier::kHost, error);
}

Buffer Buffer::Device(MemoryTracker* tracker, MemTag tag, size_t bytes, Status* error) {
  Buffer b;
  if (bytes == 0) return b;
  const internal::CudaBackend* cuda = internal::GetCudaBackend();
  if (cuda == nullptr) {
    if (error != nullptr) {
      *error = internal::CudaNotLinkedError(absl::StrCat("device buffer of ", bytes, " bytes for ", MemTagName(tag)));
    }
    return b;
  }
  void* p = nullptr;
  Status cuda_error;
  // zero-filled and synchronized by the backend: the engine allocates at Finalize and while its pools fill in the
  // first steps, never in the steady state (tests/shard/async_tier_test.cc).
  auto allocate = [&] { return (p = cuda->alloc_device(bytes, &cuda_error)) != nullptr; };
  bool over_budget = false;
  if (tracker != nullptr
          ? tracker->AllocateCounted(MemTier::kDevice, tag, static_cast<int64_t>(bytes), allocate, &over_budget)
          : allocate()) {
    b.data_ = p;
    b.size_ = bytes;
    b.tracker_ = tracker;
    b.tag_ = tag;
    b.tier_ = MemTier::kDevice;
    b.kind_ = Kind::kDevice;
    return b;
  }
  if (error != nullptr && over_budget) {
    *error = AllocError(tag, MemTier::kDevice, bytes, tracker, true, "device buffer");
  } else if (error != nullptr) {
    *error = absl::ResourceExhaustedError(
        absl::StrCat("device buffer of ", bytes, " bytes for ", MemTagName(tag), ": ", cuda_error.message()));
  }
  return b;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Reset();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    tracker_ = std::exchange(o.tracker_, nullptr);
    tag_ = o.tag_;
    tier_ = o.tier_;
    kind_ = std::exchange(o.kind_, Kind::kHost);
  }
  return *this;
}

Buffer Buffer::Borrow(void* data, size_t bytes, MemTag tag, MemTier tier) {
  Buffer b;
  b.data_ = data;
  b.size_ = bytes;
  b.tag_ = tag;
  b.tier_ = tier;
  b.kind_ = Kind::kBorrowed;
  return b;
}

void Buffer::Reset() {
  if (data_ == nullptr) return;
  if (kind_ == Kind::kBorrowed) {  // not ours: forget it
    data_ = nullptr;
    size_ = 0;
    return;
  }
  if (tracker_) tracker_->Sub(tier_, tag_, static_cast<int64_t>(size_));
  // Pinned and device buffers exist only when zero::cuda allocated them, so its table is there to free them.
  if (kind_ == Kind::kPinned) {
    internal::GetCudaBackend()->free_pinned(data_);
  } else if (kind_ == Kind::kDevice) {
    internal::GetCudaBackend()->free_device(data_);  // synchronizes the device: never on the engine's hot path
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  size_ = 0;
  tracker_ = nullptr;
}

}  // namespace zero
