#include "offload/nvme_store.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace zero::internal {

namespace {
constexpr int64_t kAlign = 4096;
int64_t RoundUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }
}  // namespace

StatusOr<std::unique_ptr<NvmeStore>> NvmeStore::Create(const NvmeOptions& options, const std::vector<int64_t>& host_n) {
  if (options.chunk_elems <= 0 || options.chunk_elems % 1024 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NVMe tier: chunk of ", options.chunk_elems, " elements is not a positive multiple of 1024"));
  }
  if (options.buffer_count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.key, ".buffer_count: ", options.buffer_count, " with device \"nvme\"; at least 1"));
  }
  std::unique_ptr<NvmeStore> s(new NvmeStore);
  s->opts_ = options;
  s->host_n_ = host_n;
  io::IoOptions io = options.io;
  io.tracker = options.tracker;
  ZERO_ASSIGN_OR_RETURN(s->engine_, io::IoEngine::Create(io));
  // mkstemp gives a name no other rank or engine has; the file is unlinked once open (both descriptors), so it
  // goes with the process however that ends.
  std::string name = absl::StrCat(options.dir, "/zero-", options.file_tag, "-rank", options.rank, "-XXXXXX");
  const int fd = mkstemp(name.data());
  if (fd < 0) {
    return io::IoErrno(errno, absl::StrCat("create (", options.key, ".nvme_path)").c_str(), 0, 0, name);
  }
  close(fd);
  s->path_ = name;
  StatusOr<io::IoFile> f = io::IoFile::Open(name, io::IoFile::Mode::kReadWrite);
  unlink(name.c_str());
  if (!f.ok()) return f.status();
  s->file_ = std::move(*f);
  int64_t at = 0;
  for (int64_t n : host_n) {
    s->region_.push_back(at);
    at = RoundUp(at + n * options.fields * 4, kAlign);
  }
  if (Status t = s->file_.Truncate(at); !t.ok()) {
    return Status(t.code(), absl::StrCat("NVMe tier of rank ", options.rank, ": sizing ", name, " to ", at,
                                         " bytes: ", t.message()));
  }
  const int64_t slot = SlotBytes(options.chunk_elems, options.fields);
  for (int b = 0; b < options.buffer_count; ++b) {
    Status err;
    Buffer buf = options.pinned
                     ? Buffer::Pinned(options.tracker, MemTag::kStaging, static_cast<size_t>(slot), &err)
                     : Buffer::Host(options.tracker, MemTag::kStaging, static_cast<size_t>(slot), MemTier::kHost, &err);
    if (!err.ok()) {
      return Status(err.code(),
                    absl::StrCat("NVMe tier of rank ", options.rank, ": staging buffer ", b, ": ", err.message()));
    }
    auto p = reinterpret_cast<uintptr_t>(buf.data());
    s->slot_data_.push_back(reinterpret_cast<float*>(RoundUp(static_cast<int64_t>(p), kAlign)));
    s->slots_.push_back(std::move(buf));
  }
  return s;
}

NvmeStore::~NvmeStore() { worker_.Sync(); }

int64_t NvmeStore::ChunkOffset(int unit, int64_t k) const {
  return region_[unit] + k * opts_.chunk_elems * opts_.fields * 4;
}

std::vector<io::IoOp> NvmeStore::ChunkOps(const PassChunk& c, float* slot) const {
  // One contiguous request: the chunk's fields lie one after another in the file as in the slot.
  return {io::IoOp{&file_, ChunkOffset(c.unit, c.begin / opts_.chunk_elems), slot, c.n * opts_.fields * 4}};
}

Status NvmeStore::ReadField(int unit, int field, int64_t begin, int64_t n, float* out) {
  std::vector<io::IoOp> ops;
  const int64_t C = opts_.chunk_elems;
  for (int64_t x = begin; x < begin + n;) {
    const int64_t k = x / C, cb = k * C, cn = std::min(C, host_n_[unit] - cb);
    const int64_t hi = std::min(begin + n, cb + cn);
    ops.push_back({&file_, ChunkOffset(unit, k) + (field * cn + (x - cb)) * 4, out + (x - begin), (hi - x) * 4});
    x = hi;
  }
  bytes_read_ += n * 4;
  return engine_->ReadBatch(ops);
}

Status NvmeStore::WriteField(int unit, int field, int64_t begin, int64_t n, const float* in) {
  std::vector<io::IoOp> ops;
  const int64_t C = opts_.chunk_elems;
  for (int64_t x = begin; x < begin + n;) {
    const int64_t k = x / C, cb = k * C, cn = std::min(C, host_n_[unit] - cb);
    const int64_t hi = std::min(begin + n, cb + cn);
    ops.push_back({&file_, ChunkOffset(unit, k) + (field * cn + (x - cb)) * 4, const_cast<float*>(in + (x - begin)),
                   (hi - x) * 4});
    x = hi;
  }
  bytes_written_ += n * 4;
  return engine_->WriteBatch(ops);
}

Status NvmeStore::TakeError() {
  std::lock_guard<std::mutex> lock(error_mu_);
  return error_;
}

Status NvmeStore::BeginPass(const std::vector<int>& units) {
  worker_.Sync();  // a pass a failure left open: its queued transfers are done before the buffers are reused
  pass_.clear();
  for (int u : units) {
    for (int64_t b = 0; b < host_n_[u]; b += opts_.chunk_elems) {
      pass_.push_back({u, b, std::min(opts_.chunk_elems, host_n_[u] - b)});
    }
  }
  read_ticket_.assign(pass_.size(), 0);
  next_ = 0;
  queued_reads_ = 0;
  acquired_ = false;
  return TakeError();
}

void NvmeStore::QueueRead(size_t i) {
  const PassChunk& c = pass_[i];
  float* slot = slot_data_[i % slot_data_.size()];
  std::vector<io::IoOp> ops = ChunkOps(c, slot);
  bytes_read_ += c.n * opts_.fields * 4;
  pass_bytes_read_ += c.n * opts_.fields * 4;
  read_ticket_[i] = worker_.Enqueue([this, ops = std::move(ops), c] {
    Status s = engine_->ReadBatch(ops);
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(error_mu_);
    if (error_.ok()) {
      error_ = Status(s.code(), absl::StrCat("NVMe tier of rank ", opts_.rank, ": reading unit ", c.unit,
                                             "'s elements ", c.begin, "-", c.begin + c.n, ": ", s.message()));
    }
  });
}

StatusOr<NvmeStore::Chunk> NvmeStore::Acquire() {
  ZERO_CHECK(!acquired_ && next_ < pass_.size()) << "NvmeStore::Acquire out of turn";
  const size_t i = next_;
  // Chunk j takes the staging buffer of chunk j - buffer_count, which was released (its write queued) before:
  // the worker's FIFO runs that write first.
  const size_t ahead = opts_.pipeline_read ? slot_data_.size() - 1 : 0;
  while (queued_reads_ < pass_.size() && queued_reads_ <= i + ahead) QueueRead(queued_reads_++);
  worker_.Wait(read_ticket_[i]);
  ZERO_RETURN_IF_ERROR(TakeError());
  acquired_ = true;
  Chunk c;
  c.unit = pass_[i].unit;
  c.begin = pass_[i].begin;
  c.n = pass_[i].n;
  float* slot = slot_data_[i % slot_data_.size()];
  for (int f = 0; f < opts_.fields; ++f) c.field.push_back(slot + f * c.n);
  return c;
}

Status NvmeStore::Release() {
  ZERO_CHECK(acquired_) << "NvmeStore::Release without Acquire";
  const size_t i = next_++;
  acquired_ = false;
  const PassChunk c = pass_[i];
  std::vector<io::IoOp> ops = ChunkOps(c, slot_data_[i % slot_data_.size()]);
  bytes_written_ += c.n * opts_.fields * 4;
  pass_bytes_written_ += c.n * opts_.fields * 4;
  const CopyStream::Ticket t = worker_.Enqueue([this, ops = std::move(ops), c] {
    Status s = engine_->WriteBatch(ops);
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(error_mu_);
    if (error_.ok()) {
      error_ = Status(s.code(), absl::StrCat("NVMe tier of rank ", opts_.rank, ": writing unit ", c.unit,
                                             "'s elements ", c.begin, "-", c.begin + c.n, ": ", s.message()));
    }
  });
  if (!opts_.pipeline_write) worker_.Wait(t);
  return TakeError();
}

Status NvmeStore::EndPass() {
  worker_.Sync();
  ZERO_RETURN_IF_ERROR(TakeError());
  if (next_ != pass_.size()) {
    return absl::InternalError(absl::StrCat("NVMe tier of rank ", opts_.rank, ": the step's pass ended after ", next_,
                                            " of ", pass_.size(), " chunks"));
  }
  return absl::OkStatus();
}

}  // namespace zero::internal
