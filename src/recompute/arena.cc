// The activation arena: a stack of 64-byte aligned allocations in blocks of raw memory, reported to the
// tracker by the bytes it holds (reserved), not the bytes in use — what a memory report must show is what
// the process holds.
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "zero/recompute.h"

namespace zero {
namespace {

constexpr size_t kAlign = 64;

size_t RoundUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

ActivationArena::ActivationArena(MemoryTracker* tracker, ArenaOptions options) : tracker_(tracker), options_(options) {}

ActivationArena::~ActivationArena() {
  for (size_t i = 0; i < blocks_.size(); ++i) FreeBlock(i);
}

size_t ActivationArena::NewBlock(size_t bytes) {
  const size_t capacity = RoundUp(bytes == 0 ? 1 : bytes);
  void* p = std::aligned_alloc(kAlign, capacity);
  // Like operator new (and zero::Buffer): running out of host memory aborts rather than returning a Status.
  ZERO_CHECK(p != nullptr) << "out of memory allocating " << capacity << " bytes of activations";
  blocks_.push_back({static_cast<std::byte*>(p), capacity, 0});
  reserved_ += capacity;
  ++system_allocs_;
  if (tracker_) tracker_->Add(options_.tier, MemTag::kActivations, static_cast<int64_t>(capacity));
  return blocks_.size() - 1;
}

void ActivationArena::FreeBlock(size_t index) {
  Block& b = blocks_[index];
  if (b.data == nullptr) return;
  std::free(b.data);
  reserved_ -= b.capacity;
  if (tracker_) tracker_->Sub(options_.tier, MemTag::kActivations, static_cast<int64_t>(b.capacity));
  b = Block{};
}

void* ActivationArena::Allocate(size_t bytes) {
  const size_t size = RoundUp(bytes == 0 ? 1 : bytes);
  // Contiguous: blocks_ is block 0 (the main block) then overflow blocks, each holding live allocations, so the
  // top of the stack is always in the last block. An allocation that does not fit there gets an overflow block
  // of exactly its size: the bytes held stay the bytes in use (plus block 0's free part) while the arena
  // learns its peak, and the next time it is empty the blocks are coalesced into one block of that peak.
  // Non-contiguous: every allocation is its own block.
  size_t block;
  if (options_.contiguous && !blocks_.empty() && blocks_.back().capacity - blocks_.back().used >= size) {
    block = blocks_.size() - 1;
  } else {
    block = NewBlock(size);
  }
  Block& b = blocks_[block];
  allocs_.push_back({block, b.used, size});
  void* p = b.data + b.used;
  b.used += size;
  used_ += size;
  if (used_ > peak_used_) peak_used_ = used_;
  return p;
}

Status ActivationArena::Release(Mark m) {
  if (m > allocs_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("activation arena: release to mark ", m, " but only ", allocs_.size(), " allocations are live"));
  }
  while (allocs_.size() > m) {
    const Alloc a = allocs_.back();
    allocs_.pop_back();
    used_ -= a.bytes;
    // Allocations are released in stack order, so a's block is the last one.
    blocks_[a.block].used = a.offset;
    if (blocks_[a.block].used == 0 && (!options_.contiguous || a.block > 0)) {
      FreeBlock(a.block);
      blocks_.pop_back();
    }
  }
  if (options_.contiguous && allocs_.empty() && blocks_.size() == 1 && blocks_[0].capacity < peak_used_) {
    // Coalesce: the next pass gets one block of the peak, so it allocates nothing and holds no more.
    FreeBlock(0);
    blocks_.clear();
    NewBlock(peak_used_);
  }
  return absl::OkStatus();
}

Status ActivationArena::Reserve(size_t bytes) {
  if (!allocs_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("activation arena: Reserve(", bytes, ") with ", allocs_.size(), " allocations live"));
  }
  if (!options_.contiguous) return absl::OkStatus();
  if (blocks_.size() == 1 && blocks_[0].capacity >= bytes) return absl::OkStatus();
  for (size_t i = 0; i < blocks_.size(); ++i) FreeBlock(i);
  blocks_.clear();
  NewBlock(bytes);
  return absl::OkStatus();
}

}  // namespace zero
