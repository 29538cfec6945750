// The NVMe tier of optimizer offload (offload_optimizer.device "nvme", ZeRO-Infinity): the fp32 master and the
// optimizer state of each unit's host part live in one file per rank under nvme_path, one region per unit, and
// stream through `buffer_count` host staging buffers during the step. defines: NvmeStore, NvmeOptions.
//
// A region holds the unit's host part [0, host_n) in chunks of `chunk_elems` elements (the last one shorter). A
// chunk's fields (the master when the tier keeps it, then each optimizer state) lie one after another, each n × 4
// bytes, so one chunk is one contiguous request and a full chunk's fields start on 4096-byte boundaries (chunk_elems
// is a multiple of 1024). Regions start on 4096-byte boundaries too.
//
// The step's pass (BeginPass, then Acquire/Release per chunk in order, EndPass) runs the disk on a worker of its
// own, in FIFO order: Acquire(i) queues the reads of chunks i..i+buffer_count-1 (pipeline_read; else chunk i
// alone) and waits for chunk i's; Release(i) queues its write-back (and waits for it unless pipeline_write). The
// FIFO is what makes the reuse safe: chunk i+buffer_count-1 takes chunk i-1's staging buffer, and its read is
// queued behind that chunk's write. So while the optimizer updates chunk i (of unit k), chunks i+1.. (unit k+1's
// first ones at a unit's end) are read and chunk i-1 (unit k-1's last) written back: host memory for the tier is
// buffer_count staging buffers, whatever the model's size.
//
// The file is created with mkstemp and unlinked at once: nothing is left behind, even by a killed process, and
// ranks (or tests) sharing a folder never meet. Its contents are zeros until written (fresh optimizer state).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/internal/io_engine.h"
#include "io/internal/io_file.h"
#include "offload/copy_stream.h"
#include "zero/memory.h"
#include "zero/status.h"

namespace zero::internal {

struct NvmeOptions {
  std::string dir;  // offload_optimizer.nvme_path (an existing folder)
  // The config section the store serves, for its errors and its file's name: the optimizer tier's, or the
  // parameter tier's (offload_param.device "nvme", offload/nvme_param_tier.h, whose store moves 4-byte words).
  std::string key = "zero_optimization.offload_optimizer";
  std::string file_tag = "optimizer";
  int rank = 0;                      // for the file's name and errors
  int fields = 1;                    // fp32 values per element: the master (when kept) and each optimizer state
  int64_t chunk_elems = 1024;        // elements per chunk, a multiple of 1024
  int buffer_count = 4;              // staging buffers (<key>.buffer_count)
  bool pipeline_read = true;         // read ahead (offload_optimizer.pipeline_read)
  bool pipeline_write = true;        // write behind (offload_optimizer.pipeline_write)
  bool pinned = false;               // page-locked staging (offload_optimizer.pin_memory)
  io::IoOptions io;                  // the aio section; io.tracker counts the engine's staging
  MemoryTracker* tracker = nullptr;  // the staging buffers, the host tier
};

class NvmeStore {
 public:
  // Opens the file and sizes it for `host_n[u]` elements per unit (0: no region); allocates the staging buffers
  // (the tracker's budget can refuse them: kResourceExhausted). Errors name the path.
  static StatusOr<std::unique_ptr<NvmeStore>> Create(const NvmeOptions& options, const std::vector<int64_t>& host_n);
  ~NvmeStore();
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Bytes of host staging the store holds: buffer_count × (chunk_elems × fields × 4 + 4096, for the alignment).
  static int64_t SlotBytes(int64_t chunk_elems, int fields) { return chunk_elems * fields * 4 + 4096; }

  // Random access outside a pass (initial values, checkpoints, GatherParam): elements [begin, begin + n) of
  // `field` of unit `unit`, synchronously.
  [[nodiscard]] Status ReadField(int unit, int field, int64_t begin, int64_t n, float* out);
  [[nodiscard]] Status WriteField(int unit, int field, int64_t begin, int64_t n, const float* in);

  // The step's stream over the host parts of `units` (in this order, each whole).
  struct Chunk {
    int unit = -1;
    int64_t begin = 0, n = 0;   // elements [begin, begin + n) of the unit's host part
    std::vector<float*> field;  // each n floats, in a staging buffer until Release
  };
  [[nodiscard]] Status BeginPass(const std::vector<int>& units);
  // The next chunk of the pass, its fields read.
  [[nodiscard]] StatusOr<Chunk> Acquire();
  // Queues the write-back of the chunk Acquire returned last.
  [[nodiscard]] Status Release();
  // Waits for every write of the pass.
  [[nodiscard]] Status EndPass();

  // The staging buffers, each chunk_elems × fields floats at a 4096-byte boundary. Outside a pass their owner
  // may lend them out (the parameter tier's pool, which never begins a pass).
  int slot_count() const { return static_cast<int>(slot_data_.size()); }
  float* slot(int b) const { return slot_data_[static_cast<size_t>(b)]; }

  const std::string& path() const { return path_; }
  // Bytes moved in all (bytes_*) and by the steps' passes alone (pass_bytes_*).
  int64_t bytes_read() const { return bytes_read_; }
  int64_t bytes_written() const { return bytes_written_; }
  int64_t pass_bytes_read() const { return pass_bytes_read_; }
  int64_t pass_bytes_written() const { return pass_bytes_written_; }
  // Milliseconds the disk worker spent on the passes' reads and writes, since creation.
  double io_busy_ms() const { return worker_.busy_ms(); }
  int64_t chunk_elems() const { return opts_.chunk_elems; }
  int fields() const { return opts_.fields; }
  const io::IoEngine& io() const { return *engine_; }
  // Milliseconds the step waited for reads (the disk behind the optimizer) and for writes, since creation.
  double wait_ms() const { return worker_.wait_ms(); }

 private:
  NvmeStore() = default;
  struct PassChunk {
    int unit;
    int64_t begin, n;
  };
  // The ops moving one chunk's fields between `slot` and the file.
  std::vector<io::IoOp> ChunkOps(const PassChunk& c, float* slot) const;
  int64_t ChunkOffset(int unit, int64_t chunk_index) const;
  void QueueRead(size_t i);
  Status TakeError();

  NvmeOptions opts_;
  std::string path_;
  std::unique_ptr<io::IoEngine> engine_;
  io::IoFile file_;
  std::vector<int64_t> host_n_, region_;  // per unit: elements, byte offset of the region
  std::vector<Buffer> slots_;
  std::vector<float*> slot_data_;  // 4096-aligned inside slots_
  CopyStream worker_;              // the disk's queue: reads and writes of the pass, in order
  std::mutex error_mu_;
  Status error_;  // the first failure of a queued read or write
  std::vector<PassChunk> pass_;
  std::vector<CopyStream::Ticket> read_ticket_;
  size_t next_ = 0, queued_reads_ = 0;
  bool acquired_ = false;
  int64_t bytes_read_ = 0, bytes_written_ = 0;  // producer side: counted when queued (the ops all complete or fail)
  int64_t pass_bytes_read_ = 0, pass_bytes_written_ = 0;
};

}  // namespace zero::internal
