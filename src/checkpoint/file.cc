// checkpoint/file.cc — atomic writes (temporary file, fsync, rename, directory fsync) and checked reads.
#include "checkpoint/internal/file.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace zero::ckpt {
namespace {

Status Errno(const std::string& what, const std::string& path) {
  const int e = errno;
  std::string msg = absl::StrCat(what, " ", Printable(path), ": ", std::strerror(e));
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

StatusOr<int> OpenRegular(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ELOOP) {
      return absl::FailedPreconditionError(absl::StrCat(Printable(path), " is a symlink loop, not a file"));
    }
    return Errno("cannot open", path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Status s = Errno("cannot stat", path);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* what = S_ISFIFO(st.st_mode)   ? "a FIFO"
                       : S_ISDIR(st.st_mode)  ? "a directory"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "a device";
    return absl::FailedPreconditionError(absl::StrCat(Printable(path), " is ", what, ", not a regular file"));
  }
  // Reads of a regular file never wait; the flag is cleared anyway so that later reads behave as usual.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

StatusOr<std::string> ReadFile(const std::string& path, int64_t max_bytes) {
  ZERO_ASSIGN_OR_RETURN(const int fd, OpenRegular(path));
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
    if (static_cast<int64_t>(out.size()) > max_bytes) {
      ::close(fd);
      return absl::DataLossError(absl::StrCat(Printable(path), " is over ", max_bytes, " bytes"));
    }
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
      return absl::DataLossError(
          absl::StrCat(Printable(path), " is truncated: ", n, " bytes missing at byte offset ", offset));
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
    return absl::FailedPreconditionError(absl::StrCat(Printable(path), " exists and is not a directory"));
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

std::string Printable(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", u);
    } else if (c == '\\') {
      out += "\\\\";
    } else {
      out += c;
    }
  }
  return out;
}

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? absl::OkStatus() : Errno("cannot stat", path);
  if (S_ISDIR(st.st_mode)) {
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) return Errno("cannot open directory", path);
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
    for (const std::string& n : names) ZERO_RETURN_IF_ERROR(RemoveTree(absl::StrCat(path, "/", n)));
    if (::rmdir(path.c_str()) != 0) return Errno("cannot remove directory", path);
    return absl::OkStatus();
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Errno("cannot remove", path);
  return absl::OkStatus();
}

StatusOr<std::string> ResolvePath(const std::string& path) {
  std::string abs = path;
  if (abs.empty() || abs[0] != '/') {
    char cwd[PATH_MAX];
    if (::getcwd(cwd, sizeof(cwd)) == nullptr) return Errno("cannot resolve", path);
    abs = absl::StrCat(cwd, "/", path);
  }
  // The longest prefix that exists, resolved; the components after it (not there yet) appended lexically.
  std::vector<std::string> tail;
  std::string head = abs;
  for (;;) {
    char real[PATH_MAX];
    if (::realpath(head.c_str(), real) != nullptr) {
      std::vector<std::string> parts = absl::StrSplit(std::string(real), '/', absl::SkipEmpty());
      for (auto it = tail.rbegin(); it != tail.rend(); ++it) {
        if (*it == "." || it->empty()) continue;
        if (*it == "..") {
          if (!parts.empty()) parts.pop_back();
        } else {
          parts.push_back(*it);
        }
      }
      std::string out;
      for (const std::string& p : parts) absl::StrAppend(&out, "/", p);
      return out.empty() ? std::string("/") : out;
    }
    if (errno != ENOENT) return Errno("cannot resolve", head);
    while (head.size() > 1 && head.back() == '/') head.pop_back();
    const size_t slash = head.find_last_of('/');
    if (slash == std::string::npos || head == "/") return Errno("cannot resolve", path);
    tail.push_back(head.substr(slash + 1));
    head = slash == 0 ? "/" : head.substr(0, slash);
  }
}

bool PathWithin(const std::string& inner, const std::string& outer) {
  if (outer == "/") return true;
  return inner == outer ||
         (inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 && inner[outer.size()] == '/');
}

}  // namespace zero::ckpt
