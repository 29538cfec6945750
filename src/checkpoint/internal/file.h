// checkpoint/internal/file.h — files a crash cannot leave half-written, and reads that name the file.
// defines: AtomicFile, ReadFile, ReadAt, MakeDirs, FsyncDir, FileSize.
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
StatusOr<std::string> ReadFile(const std::string& path);
// Reads exactly n bytes at `offset`; kDataLoss naming the file when it is shorter.
Status ReadAt(int fd, const std::string& path, int64_t offset, void* dst, size_t n);
StatusOr<int64_t> FileSize(const std::string& path);
Status MakeDirs(const std::string& path);
Status FsyncDir(const std::string& dir);
bool Exists(const std::string& path);

}  // namespace zero::ckpt
