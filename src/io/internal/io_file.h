// io/internal/io_file.h — a file the I/O engine reads and writes: O_DIRECT where the file system takes it,
// buffered where it refuses, and a buffered twin for the bytes O_DIRECT cannot move.
// defines: IoFile, IoFile::Mode.
//
//   ZERO_ASSIGN_OR_RETURN(zero::io::IoFile f, zero::io::IoFile::Open(path, zero::io::IoFile::Mode::kCreate));
//   if (!f.direct()) ZERO_LOG(INFO) << f.path() << ": buffered (" << f.why_buffered() << ")";
//
// O_DIRECT moves whole aligned blocks only: the offset, the length and the memory must be multiples of the
// engine's alignment. The head and tail of a request that are not (the last 448 bytes of a 28,824,000-byte
// tensor) go through the twin, a second descriptor of the same file without O_DIRECT, so every byte is moved
// (DeepSpeed's libaio path dropped such a tail: a 28,824,000-byte tensor left a 28,311,552-byte file). Direct and
// buffered writes never share a page when the alignment is a multiple of the page size (IoEngine checks it), which
// is what keeps the two coherent: the kernel flushes and drops cached pages a direct transfer covers.
// A file system that refuses O_DIRECT at open (tmpfs: EINVAL) gets a buffered file, said by direct() and
// why_buffered(). Move-only; closes its descriptors unless they were adopted.
#pragma once

#include <cstdint>
#include <string>

#include "zero/status.h"

namespace zero::io {

class IoFile {
 public:
  enum class Mode : uint8_t {
    kRead,       // an existing file, read only
    kReadWrite,  // an existing file
    kCreate,     // created if missing, read-write, never truncated
    kTruncate,   // created if missing, emptied if not
  };

  IoFile() = default;
  ~IoFile();
  IoFile(IoFile&& o) noexcept { *this = std::move(o); }
  IoFile& operator=(IoFile&& o) noexcept;
  IoFile(const IoFile&) = delete;
  IoFile& operator=(const IoFile&) = delete;

  // Opens `path` with O_DIRECT when `direct` and the file system takes it, else buffered. Errors name the path
  // and the errno (kNotFound, kPermissionDenied, ...).
  [[nodiscard]] static StatusOr<IoFile> Open(const std::string& path, Mode mode, bool direct = true);
  // Uses a descriptor the caller keeps and closes (after this IoFile is gone). `name` is what errors say. If the
  // descriptor has O_DIRECT, the twin is opened through /proc/self/fd with its access mode.
  [[nodiscard]] static StatusOr<IoFile> Adopt(int fd, std::string name);

  int fd() const { return fd_; }
  // The descriptor for bytes O_DIRECT cannot move: fd() itself when the file is buffered.
  int buffered_fd() const { return twin_fd_ >= 0 ? twin_fd_ : fd_; }
  bool direct() const { return direct_; }
  const std::string& why_buffered() const { return why_buffered_; }
  const std::string& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }

  // The file's size now (fstat). Errors name the path.
  [[nodiscard]] StatusOr<int64_t> Size() const;
  // Sets the size (ftruncate): O_DIRECT writes whole blocks, so a writer that rounded up trims here. Not needed
  // after the engine's writes, which never write past the bytes asked for.
  [[nodiscard]] Status Truncate(int64_t bytes) const;
  // fdatasync: the buffered head and tail bytes are in the page cache until then, as every buffered write is.
  [[nodiscard]] Status Sync() const;
  void Close();

 private:
  int fd_ = -1;
  int twin_fd_ = -1;
  bool owned_ = true;
  bool direct_ = false;
  std::string why_buffered_;
  std::string path_;
};

// "write of 4096 bytes at offset 8192 of /data/x: No space left on device (errno 28)", with the errno's canonical
// code (ENOSPC: kResourceExhausted, EBADF: kInvalidArgument, ...). `what` is "write", "read", "open", ...
Status IoErrno(int err, const char* what, int64_t bytes, int64_t offset, const std::string& path);

}  // namespace zero::io
