// tests/support/files.h — temporary folders and whole-file reads and writes for tests that write to disk.
// defines: MakeTempDir, ReadWholeFile, WriteWholeFile.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>
#include <string>

#include "zero/logging.h"
#include "zero/status.h"  // ZERO_CHECK

namespace zero::testing {

// A fresh folder under the test's temporary directory, named `prefix` plus a unique suffix.
inline std::string MakeTempDir(const std::string& prefix = "zero_test") {
  std::string t = ::testing::TempDir() + "/" + prefix + "_XXXXXX";
  ZERO_CHECK(::mkdtemp(t.data()) != nullptr) << "mkdtemp " << t;
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
