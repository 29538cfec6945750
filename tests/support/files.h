// tests/support/files.h — temporary folders and whole-file reads and writes for tests that write to disk.
// defines: MakeTempDir, ReadWholeFile, WriteWholeFile.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "zero/logging.h"
#include "zero/status.h"  // ZERO_CHECK

namespace zero::testing {

namespace files_internal {

// The folders MakeTempDir made, removed when the test binary exits: the suite runs thousands of tests that write
// checkpoints, and a CI machine (or a developer's /tmp) must not fill up with them run after run. Only the process
// that made a folder removes it: a forked child that exits must not delete its parent's folders under it. Set
// ZERO_KEEP_TEST_DIRS=1 to keep them for a post-mortem.
class TempDirs {
 public:
  static TempDirs& Get() {
    static TempDirs* dirs = new TempDirs();  // never destroyed: the atexit handler below may run after statics
    return *dirs;
  }
  void Add(const std::string& dir) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!registered_) {
      registered_ = true;
      ::atexit([] { Get().RemoveAll(); });
    }
    dirs_.push_back(dir);
  }

 private:
  TempDirs() : owner_(::getpid()) {}
  void RemoveAll() {
    if (::getpid() != owner_) return;
    const char* keep = std::getenv("ZERO_KEEP_TEST_DIRS");
    if (keep != nullptr && keep[0] != '\0' && keep[0] != '0') return;
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& d : dirs_) {
      std::error_code ec;  // a folder a test already removed, or one still in use by a child: left as it is
      std::filesystem::remove_all(d, ec);
    }
    dirs_.clear();
  }
  const pid_t owner_;
  std::mutex mu_;
  bool registered_ = false;
  std::vector<std::string> dirs_;
};

}  // namespace files_internal

// A fresh folder under the test's temporary directory, named `prefix` plus a unique suffix; removed with everything
// in it when the test binary exits (files_internal::TempDirs says why and how to keep it).
inline std::string MakeTempDir(const std::string& prefix = "zero_test") {
  std::string t = ::testing::TempDir() + "/" + prefix + "_XXXXXX";
  ZERO_CHECK(::mkdtemp(t.data()) != nullptr) << "mkdtemp " << t;
  files_internal::TempDirs::Get().Add(t);
  return t;
}

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void WriteWholeFile(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
}

}  // namespace zero::testing
