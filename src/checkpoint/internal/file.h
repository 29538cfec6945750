// checkpoint/internal/file.h — files a crash cannot leave half-written, and reads that name the file.
// defines: AtomicFile, ReadFile, OpenRegular, ReadAt, MakeDirs, FsyncDir, FileSize, Printable, RemoveTree,
// ResolvePath.
//
// AtomicFile writes `path.tmp.<pid>`, and Commit() makes it `path` by fsync(file), rename, fsync(directory):
// after a crash `path` is either absent, its previous contents, or the new contents in full, never a mix
// (POSIX rename is atomic; the directory fsync makes the rename itself durable). A file that is never
// committed is unlinked by the destructor; one a crash leaves behind is a `*.tmp.*` file that no reader opens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "zero/status.h"

namespace zero::ckpt {

class AtomicFile {
 public:
  AtomicFile() = default;
  ~AtomicFile();  // unlinks the temporary file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  Status Open(const std::string& path);
  Status Write(const void* data, size_t n);  // appends
  Status Commit();                           // fsync, rename over `path`, fsync the directory
  int64_t written() const { return written_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  int64_t written_ = 0;
  bool committed_ = false;
};

// Writes `data` to `path` atomically (AtomicFile).
Status WriteFileAtomic(const std::string& path, const std::string& data);
// The whole file; only a regular file (OpenRegular) of at most max_bytes.
StatusOr<std::string> ReadFile(const std::string& path, int64_t max_bytes = int64_t{1} << 32);
// Opens `path` read-only only if it is a regular file: with O_NONBLOCK, so that a FIFO put where a checkpoint
// file belongs does not block the open until a writer comes (it blocked every tool forever), then fstat. A
// FIFO, a device, a directory or a symlink loop is kFailedPrecondition naming the path and what it is.
StatusOr<int> OpenRegular(const std::string& path);
// Reads exactly n bytes at `offset`; kDataLoss naming the file when it is shorter.
Status ReadAt(int fd, const std::string& path, int64_t offset, void* dst, size_t n);
StatusOr<int64_t> FileSize(const std::string& path);
Status MakeDirs(const std::string& path);
Status FsyncDir(const std::string& dir);
bool Exists(const std::string& path);

// `s` as printed in a message: control bytes, DEL and the backslash as \xNN and \\ (a name read from a file can
// hold terminal escape sequences, or a carriage return that hides what precedes it). Other bytes as they are.
std::string Printable(const std::string& s);
// Removes `path`: a file, or a folder with the files and folders in it (not following symlinks into others).
Status RemoveTree(const std::string& path);
// `path` made absolute with every symlink followed, for a path that need not exist yet: its longest existing
// prefix resolved (realpath), the rest appended. Used to tell whether an output lands inside an input.
StatusOr<std::string> ResolvePath(const std::string& path);
// Whether resolved path `inner` is `outer` or lies under it (both from ResolvePath).
bool PathWithin(const std::string& inner, const std::string& outer);

}  // namespace zero::ckpt
