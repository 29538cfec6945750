// checkpoint/file.cc — atomic writes (temporary file, fsync, rename, directory fsync) and checked reads.
#include "checkpoint/internal/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace zero::ckpt {
namespace {

Status Errno(const std::string& what, const std::string& path) {
  const int e = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  if (e == ENOSPC || e == EDQUOT) return absl::ResourceExhaustedError(msg);
  if (e == ENOENT) return absl::NotFoundError(msg);
  if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

Status AtomicFile::Open(const std::string& path) {
  path_ = path;
  tmp_ = absl::StrCat(path, ".tmp.", ::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    Status s = Errno("cannot create", tmp_);
    tmp_.clear();
    return s;
  }
  return absl::OkStatus();
}

Status AtomicFile::Write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write", tmp_);
    }
    p += w;
    n -= static_cast<size_t>(w);
    written_ += w;
  }
  return absl::OkStatus();
}

Status AtomicFile::Commit() {
  if (::fsync(fd_) != 0) return Errno("cannot fsync", tmp_);
  if (::close(fd_) != 0) {
    fd_ = -1;
    return Errno("cannot close", tmp_);
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) return Errno("cannot rename to", path_);
  committed_ = true;
  return FsyncDir(DirOf(path_));
}

Status WriteFileAtomic(const std::string& path, const std::string& data) {
  AtomicFile f;
  ZERO_RETURN_IF_ERROR(f.Open(path));
  ZERO_RETURN_IF_ERROR(f.Write(data.data(), data.size()));
  return f.Commit();
}

StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      Status s = Errno("cannot read", path);
      ::close(fd);
      return s;
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

Status ReadAt(int fd, const std::string& path, int64_t offset, void* dst, size_t n) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, offset);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot read", path);
    }
    if (r == 0) {
      return absl::DataLossError(absl::StrCat(path, " is truncated: ", n, " bytes missing at byte offset ", offset));
    }
    p += r;
    offset += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

StatusOr<int64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Errno("cannot stat", path);
  return static_cast<int64_t>(st.st_size);
}

Status MakeDirs(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i < path.size() && path[i] != '/') continue;
    const std::string prefix = path.substr(0, i);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return Errno("cannot create directory", prefix);
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Errno("cannot fsync directory", dir);
  return absl::OkStatus();
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace zero::ckpt
