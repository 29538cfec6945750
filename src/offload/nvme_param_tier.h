// The NVMe tier of parameter offload (offload_param.device "nvme", ZeRO-Infinity): each stage-3 unit's parameter
// shard (compute dtype) lives in a region of one file per rank under offload_param.nvme_path, and is read into one
// of a bounded pool of host staging buffers whenever the engine needs it (a gather, the step's update, values in
// and out), then written back where it changed. defines: NvmeParamTier.
//
// It is an NvmeStore (offload/nvme_store.h) of one field over 4-byte words: a shard of S elements of the compute
// dtype is S × size / 4 words (S is a multiple of 32), so the store's file, regions, alignment and I/O engine are
// the optimizer tier's, and its buffer_count staging buffers are the pool. A slot holds one whole shard of at most
// `slot_elems` elements (min(offload_param.buffer_size, the largest shard), so the pool is bounded by buffer_count ×
// buffer_size as DeepSpeed's parameter swapper is; a larger shard is refused at Finalize, naming the key).
//
// The pool is not thread-safe (the engine's thread only). Whoever takes a slot gives it back; the gather scheduler
// holds one per gather in flight, from its issue until it is joined (the all-gather reads the slot).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "offload/nvme_store.h"
#include "zero/status.h"

namespace zero::internal {

class NvmeParamTier {
 public:
  // `options` as for the optimizer tier (dir, rank, buffer_count, pinned, io, tracker; key and file_tag are set
  // here); `shard_bytes[u]`: unit u's shard in bytes (0: the unit is not in the tier); `slot_bytes`: each staging
  // buffer's capacity, at least the largest shard. Errors name the path.
  static StatusOr<std::unique_ptr<NvmeParamTier>> Create(NvmeOptions options, const std::vector<int64_t>& shard_bytes,
                                                         int64_t slot_bytes);

  // The bytes of host staging Create allocates: buffer_count × NvmeStore::SlotBytes of the slot's words.
  static int64_t SlotBytes(int64_t slot_bytes) { return NvmeStore::SlotBytes(SlotWords(slot_bytes), 1); }
  static int64_t SlotWords(int64_t slot_bytes) { return (slot_bytes / 4 + 1023) / 1024 * 1024; }

  int free_slots() const { return static_cast<int>(free_.size()); }
  // Takes a free slot (one must be free: free_slots() > 0) and, when `read`, reads unit `unit`'s shard into it
  // (synchronously). `count_in_step`: the bytes count as the steps' (gathers, updates), else as set-up's (initial
  // values, GatherParam, checkpoints). On a failed read the slot is back in the pool.
  [[nodiscard]] StatusOr<int> Take(int unit, bool read, bool count_in_step);
  void* data(int slot) const { return store_->slot(slot); }
  // Writes the slot's bytes to unit `unit`'s region (synchronously).
  [[nodiscard]] Status Write(int unit, int slot, bool count_in_step);
  void Give(int slot);
  // Unit `unit`'s shard from and to any host memory (synchronously): a caller with no slot free.
  [[nodiscard]] Status Read(int unit, void* dst, bool count_in_step);
  [[nodiscard]] Status WriteFrom(int unit, const void* src, bool count_in_step);

  const std::string& path() const { return store_->path(); }
  // Bytes moved by gathers and steps (step_*), and in all.
  int64_t step_bytes_read() const { return step_read_; }
  int64_t step_bytes_written() const { return step_written_; }
  int64_t bytes_read() const { return store_->bytes_read(); }
  int64_t bytes_written() const { return store_->bytes_written(); }
  const io::IoEngine& io() const { return store_->io(); }

 private:
  NvmeParamTier() = default;
  std::unique_ptr<NvmeStore> store_;
  std::vector<int64_t> words_;  // per unit
  std::vector<int> free_;       // free slots, taken from the back
  int64_t step_read_ = 0, step_written_ = 0;
};

}  // namespace zero::internal
