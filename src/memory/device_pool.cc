// DevicePool: size-classed caching of cudaMalloc'd blocks with event-ordered reuse (see zero/advanced/device_memory.h).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "zero/advanced/device_memory.h"
#include "zero/logging.h"

namespace zero {

struct DevicePool::Block {
  void* ptr = nullptr;
  size_t capacity = 0;
  cudaEvent_t event = nullptr;  // recorded on release; created once with the block
  cudaStream_t free_stream = nullptr;
  MemTag tag = MemTag::kGather;
  bool in_use = false;
  bool event_pending = false;  // recorded and not yet seen complete
  bool quarantined = false;    // its release event could not be recorded: reusable only after a device sync
};

struct DevicePool::State {
  mutable std::mutex mu;
  std::vector<std::unique_ptr<Block>> blocks;  // every block held
  std::multimap<size_t, Block*> cached;        // released blocks by capacity
  DevicePoolStats stats;
};

namespace {

Status CudaError(cudaError_t e, const std::string& what) {
  cudaGetLastError();  // clear a non-sticky error so it is not reported again by an unrelated call
  return absl::InternalError(absl::StrCat("DevicePool: ", what, ": CUDA error ", static_cast<int>(e), " ",
                                          cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

}  // namespace

std::string DevicePoolStats::ToString() const {
  std::ostringstream os;
  os << "malloc_count=" << malloc_count << " free_count=" << free_count << " allocations=" << allocations
     << " reuses=" << reuses << " same_stream_reuses=" << same_stream_reuses << " stream_waits=" << stream_waits
     << " blocks=" << blocks << " blocks_in_use=" << blocks_in_use << " bytes_reserved=" << bytes_reserved
     << " bytes_in_use=" << bytes_in_use;
  return os.str();
}

DeviceBlock& DeviceBlock::operator=(DeviceBlock&& o) noexcept {
  if (this != &o) {
    Release(stream_);
    pool_ = std::exchange(o.pool_, nullptr);
    handle_ = std::exchange(o.handle_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    capacity_ = std::exchange(o.capacity_, 0);
    tag_ = o.tag_;
    stream_ = std::exchange(o.stream_, nullptr);
  }
  return *this;
}

void DeviceBlock::Release(CUstream_st* last_user) {
  if (pool_ == nullptr) return;
  pool_->ReleaseBlock(static_cast<DevicePool::Block*>(handle_), last_user);
  pool_ = nullptr;
  handle_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  capacity_ = 0;
  stream_ = nullptr;
}

DevicePool::DevicePool(MemoryTracker* tracker, const DevicePoolOptions& options, int device)
    : tracker_(tracker), options_(options), device_(device), state_(std::make_unique<State>()) {}

StatusOr<std::unique_ptr<DevicePool>> DevicePool::Create(MemoryTracker* tracker, const DevicePoolOptions& options) {
  if (options.small_round == 0 || options.large_round == 0 || !(options.max_fit_ratio >= 1.0)) {
    return absl::InvalidArgumentError("DevicePool: small_round and large_round must be > 0 and max_fit_ratio >= 1");
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError("DevicePool: no CUDA device");
  }
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return CudaError(e, "cudaGetDevice");
  return std::unique_ptr<DevicePool>(new DevicePool(tracker, options, device));
}

DevicePool::~DevicePool() {
  std::lock_guard<std::mutex> lock(state_->mu);
  int64_t in_use = 0;
  for (const auto& b : state_->blocks) in_use += b->in_use ? 1 : 0;
  ZERO_CHECK_EQ(in_use, 0) << "DevicePool destroyed while blocks are in use (release every DeviceBlock first)";
  bool synced = false;
  for (const auto& b : state_->blocks) {
    if (b->quarantined && !synced) {
      cudaDeviceSynchronize();
      synced = true;
    }
    if (b->event_pending) cudaEventSynchronize(b->event);
    cudaEventDestroy(b->event);
    cudaFree(b->ptr);
    if (tracker_) tracker_->Sub(MemTier::kDevice, b->tag, static_cast<int64_t>(b->capacity));
  }
  cudaGetLastError();
}

size_t DevicePool::RoundSize(size_t bytes) const {
  const size_t r = bytes < options_.large_threshold ? options_.small_round : options_.large_round;
  return (bytes + r - 1) / r * r;
}

StatusOr<DeviceBlock> DevicePool::Allocate(size_t bytes, MemTag tag, CUstream_st* stream) {
  if (bytes == 0) return DeviceBlock();
  int current = 0;
  if (cudaError_t e = cudaGetDevice(&current); e != cudaSuccess) return CudaError(e, "cudaGetDevice");
  if (current != device_) {
    return absl::FailedPreconditionError(
        absl::StrCat("DevicePool: created for device ", device_, " but device ", current, " is current"));
  }
  const size_t want = RoundSize(bytes);
  const size_t max_fit = std::max(want, static_cast<size_t>(static_cast<double>(want) * options_.max_fit_ratio));
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);

  // 1. A cached block that is safe now: released on this stream, or its event has completed. Best fit first.
  Block* b = nullptr;
  for (auto it = s.cached.lower_bound(want); it != s.cached.end() && it->first <= max_fit; ++it) {
    Block* c = it->second;
    bool ok = false;
    if (c->free_stream == stream || !c->event_pending) {
      ok = true;
    } else {
      const cudaError_t q = cudaEventQuery(c->event);  // never blocks
      if (q == cudaSuccess) {
        c->event_pending = false;
        ok = true;
      } else if (q != cudaErrorNotReady) {
        return CudaError(q, "cudaEventQuery");
      } else {
        cudaGetLastError();  // cudaErrorNotReady is not an error; keep it out of cudaGetLastError
      }
    }
    if (ok) {
      if (c->event_pending) ++s.stats.same_stream_reuses;
      s.cached.erase(it);
      b = c;
      ++s.stats.reuses;
      break;
    }
  }

  // 2. A new block, unless that would pass the limit or the device is out of memory.
  if (b == nullptr) {
    bool exhausted = options_.max_bytes > 0 &&
                     s.stats.bytes_reserved + static_cast<int64_t>(want) > static_cast<int64_t>(options_.max_bytes);
    void* ptr = nullptr;
    if (!exhausted) {
      const cudaError_t e = cudaMalloc(&ptr, want);
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        exhausted = true;
      } else if (e != cudaSuccess) {
        return CudaError(e, absl::StrCat("cudaMalloc(", want, ")"));
      }
    }
    if (!exhausted) {
      auto nb = std::make_unique<Block>();
      nb->ptr = ptr;
      nb->capacity = want;
      nb->tag = tag;
      if (cudaError_t e = cudaEventCreateWithFlags(&nb->event, cudaEventDisableTiming); e != cudaSuccess) {
        cudaFree(ptr);
        return CudaError(e, "cudaEventCreateWithFlags");
      }
      ++s.stats.malloc_count;
      s.stats.bytes_reserved += static_cast<int64_t>(want);
      if (tracker_) tracker_->Add(MemTier::kDevice, tag, static_cast<int64_t>(want));
      b = nb.get();
      s.blocks.push_back(std::move(nb));
    } else {
      // 3. At the limit: make `stream` wait (on the device) for a cached block still in use elsewhere.
      for (auto it = s.cached.lower_bound(want); it != s.cached.end() && it->first <= max_fit; ++it) {
        Block* c = it->second;
        if (cudaError_t e = cudaStreamWaitEvent(stream, c->event, 0); e != cudaSuccess) {
          return CudaError(e, "cudaStreamWaitEvent");
        }
        s.cached.erase(it);
        b = c;
        ++s.stats.reuses;
        ++s.stats.stream_waits;
        break;
      }
      if (b == nullptr) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "DevicePool: cannot allocate ", bytes, " bytes (", want, " rounded) for tag ", MemTagName(tag),
            ": pool holds ", s.stats.bytes_reserved, " bytes",
            options_.max_bytes > 0 ? absl::StrCat(" of its limit ", options_.max_bytes) : std::string(),
            " and no cached block of that size exists; ReleaseCachedSync() returns cached blocks to the device"));
      }
    }
  }

  if (b->tag != tag && tracker_) {
    tracker_->Sub(MemTier::kDevice, b->tag, static_cast<int64_t>(b->capacity));
    tracker_->Add(MemTier::kDevice, tag, static_cast<int64_t>(b->capacity));
  }
  b->tag = tag;
  b->in_use = true;
  ++s.stats.allocations;

  DeviceBlock out;
  out.pool_ = this;
  out.handle_ = b;
  out.data_ = b->ptr;
  out.size_ = bytes;
  out.capacity_ = b->capacity;
  out.tag_ = tag;
  out.stream_ = stream;
  return out;
}

void DevicePool::ReleaseBlock(Block* b, CUstream_st* last_user) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  b->in_use = false;
  const cudaError_t e = cudaEventRecord(b->event, last_user);
  if (e != cudaSuccess) {
    cudaGetLastError();
    // Without an event nobody can tell when the block's last user finishes: keep it out of reuse until
    // ReleaseCachedSync or the destructor has synchronized the device.
    b->quarantined = true;
    ZERO_LOG(ERROR) << "DevicePool: cudaEventRecord on release failed (" << cudaGetErrorName(e) << "); the block of "
                    << b->capacity << " bytes is not reused until ReleaseCachedSync";
    return;
  }
  b->free_stream = last_user;
  b->event_pending = true;
  s.cached.emplace(b->capacity, b);
}

DevicePoolStats DevicePool::Stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  DevicePoolStats st = state_->stats;
  st.blocks = static_cast<int64_t>(state_->blocks.size());
  st.blocks_in_use = 0;
  st.bytes_in_use = 0;
  for (const auto& b : state_->blocks) {
    if (b->in_use) {
      ++st.blocks_in_use;
      st.bytes_in_use += static_cast<int64_t>(b->capacity);
    }
  }
  return st;
}

Status DevicePool::ReleaseCachedSync() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  bool any_quarantined = false;
  for (const auto& b : s.blocks) any_quarantined |= b->quarantined;
  if (any_quarantined) {
    if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return CudaError(e, "cudaDeviceSynchronize");
  }
  std::vector<std::unique_ptr<Block>> keep;
  Status status = absl::OkStatus();
  for (auto& b : s.blocks) {
    if (b->in_use || !status.ok()) {
      keep.push_back(std::move(b));
      continue;
    }
    if (b->event_pending) {
      if (cudaError_t e = cudaEventSynchronize(b->event); e != cudaSuccess) {
        status = CudaError(e, "cudaEventSynchronize");
        keep.push_back(std::move(b));
        continue;
      }
    }
    cudaEventDestroy(b->event);
    if (cudaError_t e = cudaFree(b->ptr); e != cudaSuccess) status = CudaError(e, "cudaFree");
    ++s.stats.free_count;
    s.stats.bytes_reserved -= static_cast<int64_t>(b->capacity);
    if (tracker_) tracker_->Sub(MemTier::kDevice, b->tag, static_cast<int64_t>(b->capacity));
  }
  s.blocks = std::move(keep);
  s.cached.clear();
  for (const auto& b : s.blocks) {
    if (!b->in_use) s.cached.emplace(b->capacity, b.get());
  }
  return status;
}

}  // namespace zero
