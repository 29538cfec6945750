#include "offload/nvme_param_tier.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "zero/logging.h"

namespace zero::internal {

StatusOr<std::unique_ptr<NvmeParamTier>> NvmeParamTier::Create(NvmeOptions options,
                                                               const std::vector<int64_t>& shard_bytes,
                                                               int64_t slot_bytes) {
  std::unique_ptr<NvmeParamTier> t(new NvmeParamTier);
  std::vector<int64_t> words;
  for (int64_t b : shard_bytes) {
    ZERO_CHECK(b % 4 == 0 && b <= slot_bytes) << "parameter shard of " << b << " bytes, slots of " << slot_bytes;
    words.push_back(b / 4);
  }
  options.key = "zero_optimization.offload_param";
  options.file_tag = "param";
  options.fields = 1;
  options.chunk_elems = SlotWords(slot_bytes);             // a shard is one chunk: one request, from a 4 KiB boundary
  options.pipeline_read = options.pipeline_write = false;  // no passes: every transfer is synchronous
  ZERO_ASSIGN_OR_RETURN(t->store_, NvmeStore::Create(options, words));
  t->words_ = std::move(words);
  for (int b = t->store_->slot_count() - 1; b >= 0; --b) t->free_.push_back(b);
  return t;
}

StatusOr<int> NvmeParamTier::Take(int unit, bool read, bool count_in_step) {
  ZERO_CHECK(!free_.empty()) << "NvmeParamTier::Take with every slot in use";
  const int slot = free_.back();
  free_.pop_back();
  if (read) {
    if (Status s = Read(unit, store_->slot(slot), count_in_step); !s.ok()) {
      Give(slot);
      return s;
    }
  }
  return slot;
}

Status NvmeParamTier::Write(int unit, int slot, bool count_in_step) {
  return WriteFrom(unit, store_->slot(slot), count_in_step);
}

Status NvmeParamTier::Read(int unit, void* dst, bool count_in_step) {
  const int64_t n = words_[static_cast<size_t>(unit)];
  ZERO_RETURN_IF_ERROR(store_->ReadField(unit, 0, 0, n, static_cast<float*>(dst)));
  if (count_in_step) step_read_ += n * 4;
  return absl::OkStatus();
}

Status NvmeParamTier::WriteFrom(int unit, const void* src, bool count_in_step) {
  const int64_t n = words_[static_cast<size_t>(unit)];
  ZERO_RETURN_IF_ERROR(store_->WriteField(unit, 0, 0, n, static_cast<const float*>(src)));
  if (count_in_step) step_written_ += n * 4;
  return absl::OkStatus();
}

void NvmeParamTier::Give(int slot) {
  ZERO_CHECK(slot >= 0 && slot < store_->slot_count()) << "NvmeParamTier::Give of slot " << slot;
  free_.push_back(slot);
}

}  // namespace zero::internal
