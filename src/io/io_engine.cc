// io/io_engine.cc — IoEngine: the options, the choice of backend, cutting requests into pieces, the step every
// backend runs after a syscall, and the thread-pool backend (pread/pwrite), which is also the fallback.
#include "io/internal/io_engine.h"

#include <sched.h>
#include <unistd.h>
#include <atomic>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "io/internal/piece.h"
#include "zero/logging.h"

namespace zero::io {

const char* IoBackendName(IoBackend backend) { return backend == IoBackend::kIoUring ? "io_uring" : "threads"; }

IoOptions IoOptionsFromConfig(const Config& config) {
  IoOptions o;
  o.block_size = config.aio.block_size;
  o.queue_depth = static_cast<int>(std::min<int64_t>(config.aio.queue_depth, 1 << 16));
  o.single_submit = config.aio.single_submit;
  o.overlap_events = config.aio.overlap_events;
  return o;
}

// ---- staging buffers ----

StagingBuffer::~StagingBuffer() {
  if (data_ == nullptr) return;
  std::free(data_);
  if (tracker_ != nullptr) tracker_->Sub(MemTier::kHost, MemTag::kStaging, bytes_);
}

StagingBuffer::StagingBuffer(StagingBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(o.bytes_), tracker_(o.tracker_) {}

StatusOr<StagingBuffer> StagingBuffer::Allocate(MemoryTracker* tracker, int64_t bytes, int64_t alignment) {
  StagingBuffer b;
  auto allocate = [&] {
    void* p = nullptr;
    if (posix_memalign(&p, static_cast<size_t>(alignment), static_cast<size_t>(bytes)) != 0) return false;
    b.data_ = static_cast<char*>(p);
    return true;
  };
  bool over_budget = false;
  if (!tracker->AllocateCounted(MemTier::kHost, MemTag::kStaging, bytes, allocate, &over_budget)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("I/O staging buffer of ", bytes, " bytes (staging, host tier): ",
                     over_budget ? "over the tier's budget (MemoryTracker::SetLimit)" : "the allocator failed"));
  }
  b.bytes_ = bytes;
  b.tracker_ = tracker;
  return b;
}

// ---- the step every backend runs ----

PieceState BeginPiece(IoContext& ctx, const Piece& piece, int slot) {
  PieceState s;
  s.piece = &piece;
  s.buf = piece.staged ? ctx.staging[static_cast<size_t>(slot)].data() : piece.data;
  if (piece.staged && piece.write) std::memcpy(s.buf, piece.data, static_cast<size_t>(piece.bytes));
  ctx.pieces.fetch_add(1, std::memory_order_relaxed);
  if (piece.staged) ctx.staged_pieces.fetch_add(1, std::memory_order_relaxed);
  if (!piece.direct) ctx.buffered_pieces.fetch_add(1, std::memory_order_relaxed);
  return s;
}

StatusOr<bool> AdvancePiece(IoContext& ctx, PieceState* s, int64_t result) {
  const Piece& p = *s->piece;
  const IoOptions::TestHooks& hooks = ctx.options.hooks;
  if (hooks.eagain_every > 0 || hooks.eintr_every > 0) {
    const int64_t call = ctx.calls.fetch_add(1, std::memory_order_relaxed) + 1;
    if (hooks.eagain_every > 0 && call % hooks.eagain_every == 0) {
      result = -EAGAIN;
    } else if (hooks.eintr_every > 0 && call % hooks.eintr_every == 0) {
      result = -EINTR;
    }
  }
  if (result == -EINTR || result == -EAGAIN) {
    ctx.resubmits.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const char* what = p.write ? "write" : "read";
  if (result < 0) {
    Status st = IoErrno(static_cast<int>(-result), what, p.op_bytes, p.op_offset, p.file->path());
    return Status(st.code(), absl::StrCat(st.message(), " (at byte ", p.offset + s->done, ")"));
  }
  if (result == 0) {
    if (!p.write) {
      // The piece that met the end may lie wholly past it; the file's size says where it is.
      StatusOr<int64_t> size = p.file->Size();
      return absl::OutOfRangeError(absl::StrCat("read of ", p.op_bytes, " bytes at offset ", p.op_offset, " of ",
                                                p.file->path(), ": end of file at byte ", p.offset + s->done,
                                                " (the file has ", size.ok() ? absl::StrCat(*size) : "?",
                                                " bytes), before the last byte asked for"));
    }
    // pwrite of a nonzero count that writes nothing and sets no errno: no progress is possible.
    return absl::InternalError(absl::StrCat("write of ", p.op_bytes, " bytes at offset ", p.op_offset, " of ",
                                            p.file->path(), ": the kernel wrote 0 bytes at byte ", p.offset + s->done));
  }
  const int64_t align = ctx.options.alignment;
  if (hooks.cap_bytes_per_call > 0 && result > hooks.cap_bytes_per_call) {
    int64_t capped = hooks.cap_bytes_per_call;
    if (p.direct && !s->on_twin) capped = std::max(align, capped / align * align);
    result = std::min(result, capped);
  }
  s->done += result;
  if (s->done < p.bytes) {
    ctx.resubmits.fetch_add(1, std::memory_order_relaxed);
    if (p.direct && s->done % align != 0) s->on_twin = true;
    return false;
  }
  if (p.staged && !p.write) std::memcpy(p.data, s->buf, static_cast<size_t>(p.bytes));
  return true;
}

// ---- the thread-pool backend ----

namespace {

// One piece to the end on the calling thread.
Status RunPieceSync(IoContext& ctx, const Piece& piece, int slot) {
  PieceState s = BeginPiece(ctx, piece, slot);
  while (true) {
    const size_t n = static_cast<size_t>(piece.bytes - s.done);
    const off_t off = static_cast<off_t>(piece.offset + s.done);
    const ssize_t r = piece.write ? ::pwrite(s.fd(), s.buf + s.done, n, off) : ::pread(s.fd(), s.buf + s.done, n, off);
    const int64_t result = r < 0 ? -static_cast<int64_t>(errno) : static_cast<int64_t>(r);
    ZERO_ASSIGN_OR_RETURN(const bool finished, AdvancePiece(ctx, &s, result));
    if (finished) return OkStatus();
    if (result == -EAGAIN) sched_yield();
  }
}

class ThreadsBackend final : public IoEngine::Backend {
 public:
  explicit ThreadsBackend(std::unique_ptr<IoContext> ctx) : Backend(std::move(ctx)) {
    const int n = ctx_->options.queue_depth;
    workers_.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) workers_.emplace_back([this, i] { Work(i); });
  }
  ~ThreadsBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  Status Run(const std::vector<Piece>& pieces) override {
    if (pieces.empty()) return OkStatus();
    std::unique_lock<std::mutex> lock(mu_);
    pieces_ = &pieces;
    next_ = 0;
    error_ = OkStatus();
    busy_ = static_cast<int>(workers_.size());
    ++generation_;
    start_.notify_all();
    done_.wait(lock, [&] { return busy_ == 0; });
    pieces_ = nullptr;
    return std::exchange(error_, OkStatus());
  }

 private:
  void Work(int slot) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      // Pieces are handed out under the lock: one lock per piece of up to block_size bytes is nothing beside
      // the syscall, and it keeps the first error and the end of the batch simple.
      while (error_.ok() && next_ < pieces_->size()) {
        const Piece& piece = (*pieces_)[next_++];
        lock.unlock();
        Status st = RunPieceSync(*ctx_, piece, slot);
        lock.lock();
        if (!st.ok() && error_.ok()) error_ = std::move(st);
      }
      if (--busy_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::vector<Piece>* pieces_ = nullptr;
  size_t next_ = 0;
  Status error_;
  int busy_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

// ---- the engine ----

IoEngine::~IoEngine() = default;

bool IoEngine::IoUringBuilt() {
#if ZERO_HAVE_LIBURING
  return true;
#else
  return false;
#endif
}

StatusOr<std::unique_ptr<IoEngine>> IoEngine::Create(IoOptions options) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  if (options.alignment <= 0 || (options.alignment & (options.alignment - 1)) != 0 || options.alignment % page != 0) {
    return absl::InvalidArgumentError(absl::StrCat("IoOptions::alignment ", options.alignment,
                                                   ": must be a power of two and a multiple of the page size (", page,
                                                   ")"));
  }
  // At most 1 GiB: an io_uring request's length is 32 bits, and a staging buffer per slot is allocated at once.
  if (options.block_size <= 0 || options.block_size % options.alignment != 0 || options.block_size > (1 << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("IoOptions::block_size (aio.block_size) ", options.block_size,
                                                   ": must be a multiple of the alignment (", options.alignment,
                                                   " bytes) in [", options.alignment, ", 1 GiB]"));
  }
  if (options.queue_depth < 1 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("IoOptions::queue_depth (aio.queue_depth) ", options.queue_depth, ": must be in [1, 4096]"));
  }
  // The environment wins, so a test or a user on a machine whose io_uring misbehaves can choose without a rebuild.
  std::string forced_by;
  if (const char* env = std::getenv("ZERO_IO_BACKEND"); env != nullptr && *env != '\0') {
    const std::string v = env;
    if (v == "threads") {
      options.backend = IoOptions::BackendChoice::kThreads;
    } else if (v == "io_uring") {
      options.backend = IoOptions::BackendChoice::kIoUring;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("ZERO_IO_BACKEND=", v, ": expected threads or io_uring (or unset: io_uring where it works)"));
    }
    forced_by = absl::StrCat("ZERO_IO_BACKEND=", v);
  } else if (options.backend != IoOptions::BackendChoice::kAuto) {
    forced_by = "IoOptions::backend";
  }

  std::unique_ptr<IoEngine> engine(new IoEngine());
  if (options.tracker == nullptr) {
    engine->own_tracker_ = std::make_unique<MemoryTracker>();
    options.tracker = engine->own_tracker_.get();
  }
  engine->tracker_ = options.tracker;
  engine->options_ = options;
  auto ctx = std::make_unique<IoContext>();
  ctx->options = options;
  for (int i = 0; i < options.queue_depth; ++i) {
    ZERO_ASSIGN_OR_RETURN(StagingBuffer b,
                          StagingBuffer::Allocate(options.tracker, options.block_size, options.alignment));
    ctx->staging.push_back(std::move(b));
  }

  IoBackendInfo& info = engine->info_;
  if (options.backend != IoOptions::BackendChoice::kThreads) {
    StatusOr<std::unique_ptr<Backend>> uring = MakeUringBackend(ctx);
    if (uring.ok()) {
      engine->impl_ = *std::move(uring);
      info.backend = IoBackend::kIoUring;
      info.reason = absl::StrCat("io_uring_queue_init(", options.queue_depth, ") succeeded",
                                 forced_by.empty() ? "" : ", asked for by ", forced_by);
    } else if (options.backend == IoOptions::BackendChoice::kIoUring) {
      return Status(uring.status().code(),
                    absl::StrCat("the io_uring backend (", forced_by, "): ", uring.status().message()));
    } else {
      info.reason = absl::StrCat("fallback: ", uring.status().message());
    }
  } else {
    info.reason = absl::StrCat("asked for by ", forced_by);
  }
  if (engine->impl_ == nullptr) {
    info.backend = IoBackend::kThreads;
    engine->impl_ = std::make_unique<ThreadsBackend>(std::move(ctx));
  }
  // Said once per process and backend at INFO (every Load and every asynchronous save's first use makes an engine:
  // a line each would bury the trainer's own output), at DEBUG after that.
  static std::atomic<int> said[2] = {0, 0};
  const bool first = said[static_cast<int>(info.backend) & 1].exchange(1) == 0;
  const LogLevel level = first ? LogLevel::kInfo : LogLevel::kDebug;
  if (LogEnabled(level)) {
    ::zero::internal::LogMessage(level, __FILE__, __LINE__).stream()
        << "io: backend " << IoBackendName(info.backend) << " (" << info.reason << "), " << options.queue_depth
        << " in flight, blocks of " << options.block_size << " bytes";
  }
  return engine;
}

int64_t IoEngine::staging_bytes() const {
  return static_cast<int64_t>(impl_->context().staging.size()) * options_.block_size;
}

IoEngine::Counters IoEngine::counters() const {
  IoContext& c = impl_->context();
  return Counters{.pieces = c.pieces.load(),
                  .staged_pieces = c.staged_pieces.load(),
                  .buffered_pieces = c.buffered_pieces.load(),
                  .resubmits = c.resubmits.load()};
}

Status IoEngine::Write(const IoFile& file, int64_t offset, const void* data, int64_t bytes) {
  return WriteBatch({IoOp{.file = &file, .offset = offset, .data = const_cast<void*>(data), .bytes = bytes}});
}
Status IoEngine::Read(const IoFile& file, int64_t offset, void* data, int64_t bytes) {
  return ReadBatch({IoOp{.file = &file, .offset = offset, .data = data, .bytes = bytes}});
}
Status IoEngine::WriteBatch(const std::vector<IoOp>& ops) { return Run(true, ops); }
Status IoEngine::ReadBatch(const std::vector<IoOp>& ops) { return Run(false, ops); }

Status IoEngine::Run(bool write, const std::vector<IoOp>& ops) {
  // The backends run one batch at a time (the ring and the slots' staging buffers are the engine's).
  std::lock_guard<std::mutex> lock(run_mu_);
  const int64_t align = options_.alignment;
  const int64_t block = options_.block_size;
  std::vector<Piece> pieces;
  for (const IoOp& op : ops) {
    if (op.file == nullptr || !op.file->is_open()) {
      return absl::InvalidArgumentError(
          absl::StrCat(write ? "write" : "read", " of ", op.bytes, " bytes at offset ", op.offset, ": no open file"));
    }
    if (op.offset < 0 || op.bytes < 0 || (op.bytes > 0 && op.data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(write ? "write" : "read", " of ", op.bytes, " bytes at offset ",
                                                     op.offset, " of ", op.file->path(),
                                                     ": negative offset or size, or no memory"));
    }
    char* data = static_cast<char*>(op.data);
    const int64_t begin = op.offset, end = op.offset + op.bytes;
    // [mid_begin, mid_end): the whole granules inside the request, which O_DIRECT can move; empty when the file is
    // buffered or the request holds no whole granule.
    int64_t mid_begin = end, mid_end = end;
    if (op.file->direct()) {
      const int64_t a = (begin + align - 1) / align * align;
      const int64_t b = end / align * align;
      if (a < b) mid_begin = a, mid_end = b;
    }
    auto add = [&](int64_t from, int64_t to, bool direct) {
      for (int64_t pos = from; pos < to; pos += block) {
        Piece p;
        p.file = op.file;
        p.write = write;
        p.direct = direct;
        p.offset = pos;
        p.bytes = std::min(block, to - pos);
        p.data = data + (pos - begin);
        p.staged = direct && reinterpret_cast<uintptr_t>(p.data) % static_cast<uintptr_t>(align) != 0;
        p.op_offset = op.offset;
        p.op_bytes = op.bytes;
        pieces.push_back(p);
      }
    };
    if (mid_begin == end) {
      add(begin, end, false);
    } else {
      add(begin, mid_begin, false);
      add(mid_begin, mid_end, true);
      add(mid_end, end, false);
    }
  }
  return impl_->Run(pieces);
}

}  // namespace zero::io

#if !ZERO_HAVE_LIBURING
namespace zero::io {
StatusOr<std::unique_ptr<IoEngine::Backend>> MakeUringBackend(std::unique_ptr<IoContext>& /*ctx*/) {
  return absl::UnimplementedError("built without liburing (Debian: liburing-dev), so the thread pool serves");
}
}  // namespace zero::io
#endif
