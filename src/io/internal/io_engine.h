// io/internal/io_engine.h — one I/O engine for the disk: batches of reads and writes at offsets of IoFiles,
// through io_uring or a thread pool of pread/pwrite, in blocks through reused aligned staging buffers.
// defines: IoEngine, IoOptions, IoOptionsFromConfig, IoBackend, IoBackendInfo, IoOp.
//
//   ZERO_ASSIGN_OR_RETURN(auto engine, zero::io::IoEngine::Create(zero::io::IoOptionsFromConfig(config)));
//   ZERO_ASSIGN_OR_RETURN(zero::io::IoFile f, zero::io::IoFile::Open(path, zero::io::IoFile::Mode::kTruncate));
//   ZERO_RETURN_IF_ERROR(engine->Write(f, /*offset=*/0, data, bytes));   // every byte, whatever the alignment
//   ZERO_RETURN_IF_ERROR(engine->Read(f, 0, out, bytes));                // every byte, or an error
//
// What a request is cut into. The bytes from the first to the last multiple of `alignment` inside the request
// move with O_DIRECT (on a direct file) in pieces of at most `block_size`, each from the caller's memory when it
// is aligned and otherwise through one of the staging buffers; the unaligned head and tail (less than
// `alignment` bytes each) move through the file's buffered twin (io_file.h). Up to `queue_depth` pieces are in
// flight. A short read or write is continued where it stopped, EINTR and EAGAIN are retried, and a read that
// meets the end of the file before its last byte is kOutOfRange naming the path, the offset and the bytes.
//
// The backend. io_uring when the library was built with liburing and the kernel lets this process set up a ring
// (io_uring_queue_init can be refused: seccomp in a container, a kernel without it, kernel.io_uring_disabled);
// otherwise, or when asked (IoOptions::backend, or ZERO_IO_BACKEND=threads|io_uring in the environment, which wins),
// `queue_depth` threads each doing one pread/pwrite at a time. backend() says which and why; Create logs it.
//
// Memory: queue_depth staging buffers of block_size bytes, aligned to `alignment`, allocated once by Create and
// counted in the host tier under MemTag::kStaging of the tracker (IoOptions::tracker, or the engine's own).
//
// Threads: one batch at a time; calls from several threads are serialized. A batch's requests must not overlap
// each other in the file (they run in any order, and at once).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/internal/io_file.h"
#include "zero/config.h"
#include "zero/memory.h"
#include "zero/status.h"

namespace zero::io {

enum class IoBackend : uint8_t { kIoUring, kThreads };
// "io_uring", "threads".
const char* IoBackendName(IoBackend backend);

struct IoOptions {
  enum class BackendChoice : uint8_t { kAuto, kIoUring, kThreads };
  // Largest piece one syscall moves (DeepSpeed's aio.block_size). A multiple of `alignment`.
  int64_t block_size = 1 << 20;
  // Pieces in flight at once (DeepSpeed's aio.queue_depth): the ring's size, or the number of threads.
  int queue_depth = 8;
  // O_DIRECT's granule: a multiple of the page size (so direct and buffered bytes never share a page, io_file.h)
  // and of every logical block size in use (512 or 4096 on the devices we know).
  int64_t alignment = 4096;
  // kIoUring: an error from Create when the ring is refused, instead of the fallback.
  BackendChoice backend = BackendChoice::kAuto;
  // DeepSpeed's aio.single_submit: on io_uring, one submit call per piece instead of one per batch of pieces.
  bool single_submit = false;
  // DeepSpeed's aio.overlap_events: on io_uring, submit new pieces while others complete. false: a wave of
  // queue_depth pieces, all of it reaped before the next.
  bool overlap_events = true;
  // Where the staging buffers are counted; null: the engine's own tracker (IoEngine::tracker()).
  MemoryTracker* tracker = nullptr;

  // For tests: make the loops that finish short transfers and retry EAGAIN run for real. After a syscall (or a
  // completion) that moved more than `cap_bytes_per_call` bytes, the engine takes it to have moved only that many
  // (rounded down to the alignment on a direct piece, at least one granule) and moves the rest again; every
  // `eagain_every`-th call is taken to have failed with EAGAIN, and every `eintr_every`-th with EINTR. Moving the
  // same bytes to the same offset again is idempotent, so the file's contents stay exact. 0: off.
  struct TestHooks {
    int64_t cap_bytes_per_call = 0;
    int eagain_every = 0;
    int eintr_every = 0;
  } hooks;
};

// Block size, queue depth, single_submit and overlap_events from the config's "aio" section.
// (intra_op_parallelism is DeepSpeed's threads per request; here a request's pieces already run queue_depth wide.)
IoOptions IoOptionsFromConfig(const Config& config);

struct IoBackendInfo {
  IoBackend backend = IoBackend::kThreads;
  // Why this backend: "io_uring_queue_init(8) succeeded", "forced by ZERO_IO_BACKEND=threads",
  // "io_uring_queue_init(8) failed: Operation not permitted", "built without liburing".
  std::string reason;
};

// One request of a batch. For a write `data` is read (and not written); for a read it is filled.
struct IoOp {
  const IoFile* file = nullptr;
  int64_t offset = 0;
  void* data = nullptr;
  int64_t bytes = 0;
};

class IoEngine {
 public:
  ~IoEngine();
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // Checks the options (kInvalidArgument naming the field), chooses the backend, allocates the staging buffers
  // (kResourceExhausted when the tracker's budget refuses them).
  [[nodiscard]] static StatusOr<std::unique_ptr<IoEngine>> Create(IoOptions options);
  // Whether this build has the io_uring backend at all (liburing found by CMake).
  static bool IoUringBuilt();

  // Writes every op's bytes; returns when all are written, or with the first error (the others in flight are
  // finished first; bytes of the failed batch may or may not be in the file).
  [[nodiscard]] Status WriteBatch(const std::vector<IoOp>& ops);
  // Reads every op's bytes; an op that meets the end of the file is kOutOfRange.
  [[nodiscard]] Status ReadBatch(const std::vector<IoOp>& ops);
  [[nodiscard]] Status Write(const IoFile& file, int64_t offset, const void* data, int64_t bytes);
  [[nodiscard]] Status Read(const IoFile& file, int64_t offset, void* data, int64_t bytes);

  const IoBackendInfo& backend() const { return info_; }
  const IoOptions& options() const { return options_; }
  // The tracker the staging buffers are counted in.
  MemoryTracker* tracker() const { return tracker_; }
  // Bytes of staging buffers (all of them, allocated by Create).
  int64_t staging_bytes() const;
  // Pieces moved since Create, and how many were staged (copied through a staging buffer) or went through a
  // buffered twin: for tests and the probe, which want to know the path the bytes took.
  struct Counters {
    int64_t pieces = 0;
    int64_t staged_pieces = 0;
    int64_t buffered_pieces = 0;
    int64_t resubmits = 0;  // continuations of short transfers and retries after EAGAIN/EINTR
  };
  Counters counters() const;

  // Runs the pieces a batch is cut into (io/internal/piece.h).
  class Backend;

 private:
  IoEngine() = default;
  [[nodiscard]] Status Run(bool write, const std::vector<IoOp>& ops);

  IoOptions options_;
  IoBackendInfo info_;
  std::unique_ptr<MemoryTracker> own_tracker_;
  MemoryTracker* tracker_ = nullptr;
  std::unique_ptr<Backend> impl_;
  std::mutex run_mu_;
};

}  // namespace zero::io
