// io/io_uring_backend.cc — the io_uring backend: one ring of queue_depth entries, driven by the calling thread.
// Compiled only where CMake found liburing (ZERO_HAVE_LIBURING); io_engine.cc falls back to the thread pool when
// the ring is refused. Under ASan and TSan the kernel's reads and writes of the buffers through the ring are not
// seen by the sanitizer (it sees ours: the copies in and out of staging, which follow the completions), so the ring
// runs there too; io_test passes under both with no report.
#include <liburing.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "io/internal/piece.h"

namespace zero::io {
namespace {

class UringBackend final : public IoEngine::Backend {
 public:
  explicit UringBackend(std::unique_ptr<IoContext> ctx)
      : Backend(std::move(ctx)), slots_(static_cast<size_t>(ctx_->options.queue_depth)) {}
  ~UringBackend() override {
    if (ready_) io_uring_queue_exit(&ring_);
  }
  // The ring in place (liburing's struct is not documented as copyable): 0, or -errno.
  int Init() {
    const int rc = io_uring_queue_init(static_cast<unsigned>(ctx_->options.queue_depth), &ring_, 0);
    ready_ = rc == 0;
    return rc;
  }
  std::unique_ptr<IoContext> ReleaseContext() { return std::move(ctx_); }

  Status Run(const std::vector<Piece>& pieces) override {
    const IoOptions& o = ctx_->options;
    std::vector<int> free_slots;
    for (int i = o.queue_depth - 1; i >= 0; --i) free_slots.push_back(i);
    size_t next = 0;
    int in_flight = 0;
    Status error;
    while ((error.ok() && next < pieces.size()) || in_flight > 0) {
      // Without overlap_events a wave is reaped whole before the next is issued (DeepSpeed's option).
      if (error.ok() && (o.overlap_events || in_flight == 0)) {
        while (!free_slots.empty() && next < pieces.size()) {
          const int slot = free_slots.back();
          free_slots.pop_back();
          slots_[static_cast<size_t>(slot)] = BeginPiece(*ctx_, pieces[next++], slot);
          Prepare(slot);
          ++in_flight;
          if (o.single_submit) ZERO_RETURN_IF_ERROR(Submit());
        }
      }
      ZERO_RETURN_IF_ERROR(Submit());
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        // The ring itself failed (not a transfer: those fail in their completions): pieces may still be in the kernel's
        // hands, so the buffers cannot be reused.
        return absl::InternalError(absl::StrCat("io_uring_wait_cqe: ", std::strerror(-rc)));
      }
      // Every completion already there, then issue again.
      unsigned head;
      unsigned seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        const int slot = static_cast<int>(io_uring_cqe_get_data64(cqe));
        PieceState& s = slots_[static_cast<size_t>(slot)];
        StatusOr<bool> finished = AdvancePiece(*ctx_, &s, cqe->res);
        if (!finished.ok() || *finished || !error.ok()) {
          if (!finished.ok() && error.ok()) error = finished.status();
          free_slots.push_back(slot);
          --in_flight;
        } else {
          Prepare(slot);  // the rest of a short transfer, or again after EAGAIN/EINTR
        }
      }
      io_uring_cq_advance(&ring_, seen);
    }
    return error;
  }

 private:
  void Prepare(int slot) {
    const PieceState& s = slots_[static_cast<size_t>(slot)];
    // The ring has queue_depth entries and at most queue_depth pieces are prepared and not yet submitted.
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    const unsigned n = static_cast<unsigned>(s.piece->bytes - s.done);
    const uint64_t off = static_cast<uint64_t>(s.piece->offset + s.done);
    if (s.piece->write) {
      io_uring_prep_write(sqe, s.fd(), s.buf + s.done, n, off);
    } else {
      io_uring_prep_read(sqe, s.fd(), s.buf + s.done, n, off);
    }
    io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(slot));
  }

  Status Submit() {
    while (true) {
      const int rc = io_uring_submit(&ring_);
      if (rc >= 0) return OkStatus();
      if (rc != -EINTR && rc != -EAGAIN) {
        return absl::InternalError(absl::StrCat("io_uring_submit: ", std::strerror(-rc)));
      }
    }
  }

  io_uring ring_{};
  bool ready_ = false;
  std::vector<PieceState> slots_;
};

}  // namespace

StatusOr<std::unique_ptr<IoEngine::Backend>> MakeUringBackend(std::unique_ptr<IoContext>& ctx) {
  const int depth = ctx->options.queue_depth;
  auto backend = std::make_unique<UringBackend>(std::move(ctx));
  if (const int rc = backend->Init(); rc < 0) {
    ctx = backend->ReleaseContext();
    return absl::UnavailableError(absl::StrCat("io_uring_queue_init(", depth, ") failed: ", std::strerror(-rc)));
  }
  return std::unique_ptr<IoEngine::Backend>(std::move(backend));
}

}  // namespace zero::io
