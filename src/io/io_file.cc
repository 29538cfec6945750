// io/io_file.cc — IoFile: O_DIRECT where the file system takes it, and the buffered twin.
#include "io/internal/io_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace zero::io {
namespace {

int OpenFlags(IoFile::Mode mode) {
  switch (mode) {
    case IoFile::Mode::kRead: return O_RDONLY;
    case IoFile::Mode::kReadWrite: return O_RDWR;
    case IoFile::Mode::kCreate: return O_RDWR | O_CREAT;
    case IoFile::Mode::kTruncate: return O_RDWR | O_CREAT | O_TRUNC;
  }
  return O_RDONLY;
}

int OpenRetrying(const char* path, int flags) {
  int fd;
  do {
    fd = ::open(path, flags | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// The engine reads and writes at offsets, in blocks, from several requests at once: only a regular file (or a block
// device) takes that. A FIFO would block the open (or the first read) forever waiting for a writer, and a character
// device or a socket would fail at the first pread with an errno that does not name the real cause. So the first
// open is non-blocking (a FIFO opens at once), the kind is checked, and the flag is cleared.
Status CheckKind(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return IoErrno(errno, "fstat", 0, 0, path);
  if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
    const char* kind = S_ISFIFO(st.st_mode)   ? "a FIFO"
                       : S_ISDIR(st.st_mode)  ? "a directory"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is ", kind, ": the I/O engine reads and writes regular files (or block devices) only"));
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) return IoErrno(errno, "fcntl(F_SETFL)", 0, 0, path);
  return absl::OkStatus();
}

}  // namespace

Status IoErrno(int err, const char* what, int64_t bytes, int64_t offset, const std::string& path) {
  return Status(absl::ErrnoToStatusCode(err), absl::StrCat(what, " of ", bytes, " bytes at offset ", offset, " of ",
                                                           path, ": ", std::strerror(err), " (errno ", err, ")"));
}

IoFile::~IoFile() { Close(); }

IoFile& IoFile::operator=(IoFile&& o) noexcept {
  if (this != &o) {
    Close();
    fd_ = std::exchange(o.fd_, -1);
    twin_fd_ = std::exchange(o.twin_fd_, -1);
    owned_ = o.owned_;
    direct_ = std::exchange(o.direct_, false);
    why_buffered_ = std::move(o.why_buffered_);
    path_ = std::move(o.path_);
  }
  return *this;
}

void IoFile::Close() {
  // The twin is always ours (opened here); the main descriptor only when Open made it.
  if (twin_fd_ >= 0) ::close(twin_fd_);
  if (fd_ >= 0 && owned_) ::close(fd_);
  fd_ = twin_fd_ = -1;
  direct_ = false;
}

StatusOr<IoFile> IoFile::Open(const std::string& path, Mode mode, bool direct) {
  IoFile f;
  f.path_ = path;
  const int flags = OpenFlags(mode);
  if (direct) {
    f.fd_ = OpenRetrying(path.c_str(), flags | O_DIRECT | O_NONBLOCK);
    if (f.fd_ >= 0) {
      ZERO_RETURN_IF_ERROR(CheckKind(f.fd_, path));
      // The twin opens after the first open created (or emptied) the file, so it must neither create nor truncate.
      f.twin_fd_ = OpenRetrying(path.c_str(), flags & ~(O_CREAT | O_TRUNC));
      if (f.twin_fd_ < 0) return IoErrno(errno, "open (buffered twin)", 0, 0, path);
      f.direct_ = true;
      return f;
    }
    if (errno != EINVAL) return IoErrno(errno, "open", 0, 0, path);
    // tmpfs and some FUSE file systems refuse O_DIRECT at open with EINVAL: the file is still usable, buffered.
    f.why_buffered_ = "the file system refused O_DIRECT (EINVAL at open)";
  } else {
    f.why_buffered_ = "O_DIRECT not asked for";
  }
  f.fd_ = OpenRetrying(path.c_str(), flags | O_NONBLOCK);
  if (f.fd_ < 0) return IoErrno(errno, "open", 0, 0, path);
  ZERO_RETURN_IF_ERROR(CheckKind(f.fd_, path));
  return f;
}

StatusOr<IoFile> IoFile::Adopt(int fd, std::string name) {
  IoFile f;
  f.path_ = std::move(name);
  f.owned_ = false;
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0) return IoErrno(errno, "fcntl(F_GETFL)", 0, 0, f.path_);
  f.fd_ = fd;
  if ((fl & O_DIRECT) == 0) {
    f.why_buffered_ = "the adopted descriptor has no O_DIRECT";
    return f;
  }
  const std::string proc = absl::StrCat("/proc/self/fd/", fd);
  f.twin_fd_ = OpenRetrying(proc.c_str(), fl & O_ACCMODE);
  if (f.twin_fd_ < 0) {
    const int err = errno;
    f.fd_ = -1;  // not ours to close
    return IoErrno(err, "open (buffered twin through /proc/self/fd)", 0, 0, f.path_);
  }
  f.direct_ = true;
  return f;
}

StatusOr<int64_t> IoFile::Size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return IoErrno(errno, "fstat", 0, 0, path_);
  return static_cast<int64_t>(st.st_size);
}

Status IoFile::Truncate(int64_t bytes) const {
  int rc;
  do {
    rc = ::ftruncate(fd_, bytes);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return IoErrno(errno, "ftruncate", bytes, 0, path_);
  return OkStatus();
}

Status IoFile::Sync() const {
  int rc;
  do {
    rc = ::fdatasync(fd_);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return IoErrno(errno, "fdatasync", 0, 0, path_);
  return OkStatus();
}

}  // namespace zero::io
