// io/internal/piece.h — what the engine's backends share: the pieces a batch is cut into, the staging buffers,
// and the step that accounts for one syscall's result (short transfers, EAGAIN, EINTR, the end of the file).
// defines: Piece, PieceState, IoContext, IoEngine::Backend, BeginPiece, AdvancePiece, EndPiece,
// MakeUringBackend.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "io/internal/io_engine.h"

namespace zero::io {

// At most block_size bytes of one request, moved by one syscall at a time on one descriptor.
struct Piece {
  const IoFile* file = nullptr;
  bool write = false;
  bool direct = false;  // on file->fd() with O_DIRECT: offset, bytes and the memory used are aligned
  bool staged = false;  // through the slot's staging buffer (direct, and the caller's memory is not aligned)
  int64_t offset = 0;   // in the file
  int64_t bytes = 0;
  char* data = nullptr;  // the caller's bytes for this piece
  // The request the piece belongs to, for errors (the caller knows requests, not pieces).
  int64_t op_offset = 0;
  int64_t op_bytes = 0;
};

// A piece in progress in a slot.
struct PieceState {
  const Piece* piece = nullptr;
  char* buf = nullptr;  // the caller's memory or the slot's staging buffer
  int64_t done = 0;
  // A direct transfer that stopped short of a granule boundary (a read meeting the end of the file) continues on
  // the buffered twin: O_DIRECT would refuse the unaligned remainder.
  bool on_twin = false;
  int fd() const { return piece->direct && !on_twin ? piece->file->fd() : piece->file->buffered_fd(); }
};

// A staging buffer: aligned, counted under kStaging in the host tier, freed and uncounted on destruction.
class StagingBuffer {
 public:
  StagingBuffer() = default;
  ~StagingBuffer();
  StagingBuffer(StagingBuffer&& o) noexcept;
  StagingBuffer& operator=(StagingBuffer&&) = delete;
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  [[nodiscard]] static StatusOr<StagingBuffer> Allocate(MemoryTracker* tracker, int64_t bytes, int64_t alignment);
  char* data() const { return data_; }

 private:
  char* data_ = nullptr;
  int64_t bytes_ = 0;
  MemoryTracker* tracker_ = nullptr;
};

// What the backends share with the engine.
struct IoContext {
  IoOptions options;
  std::vector<StagingBuffer> staging;  // one per slot
  std::atomic<int64_t> pieces{0}, staged_pieces{0}, buffered_pieces{0}, resubmits{0};
  std::atomic<int64_t> calls{0};  // syscalls and completions, for the test hooks
};

class IoEngine::Backend {
 public:
  virtual ~Backend() = default;
  // Runs every piece; the first error after the pieces in flight have finished.
  [[nodiscard]] virtual Status Run(const std::vector<Piece>& pieces) = 0;
  IoContext& context() { return *ctx_; }

 protected:
  explicit Backend(std::unique_ptr<IoContext> ctx) : ctx_(std::move(ctx)) {}
  std::unique_ptr<IoContext> ctx_;
};

// Starts `piece` in `slot`: copies a staged write's bytes into the slot's buffer.
PieceState BeginPiece(IoContext& ctx, const Piece& piece, int slot);
// Accounts for one syscall's (or completion's) result on `s`: `result` bytes moved, or -errno. Returns true when
// the piece is complete (a staged read's bytes then copied out to the caller), false when it must be issued again
// from s->done (a short transfer, EAGAIN, EINTR), or the error naming the request's path, offset and bytes.
StatusOr<bool> AdvancePiece(IoContext& ctx, PieceState* s, int64_t result);

// The io_uring backend with `queue_depth` entries (taking `ctx` only then), or why the ring was refused. Only in
// builds with liburing (io_uring_backend.cc); elsewhere kUnimplemented.
StatusOr<std::unique_ptr<IoEngine::Backend>> MakeUringBackend(std::unique_ptr<IoContext>& ctx);

}  // namespace zero::io
