// fuzz/fuzz_check.h — what the fuzz targets share: FUZZ_CHECK (a property that must hold for every input; a
// failure aborts, which libFuzzer reports as a crash and the replay test as a failure), quiet logging, and a
// scratch folder in memory for the targets that read files.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "zero/logging.h"

#define FUZZ_CHECK(cond, msg)                                                                                          \
  do {                                                                                                                 \
    if (!(cond)) {                                                                                                     \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, std::string(msg).c_str()); \
      std::abort();                                                                                                    \
    }                                                                                                                  \
  } while (0)

namespace zero::fuzz {

// Log lines are still formatted (that code runs too), then dropped: warnings about odd inputs would flood the
// fuzzer's output.
inline void QuietLogs() {
  static const bool once = [] {
    SetLogSink([](LogLevel, std::string_view) {});
    return true;
  }();
  (void)once;
}

// A folder of its own for this process, under $ZERO_FUZZ_SCRATCH if set, else /dev/shm where there is one (the
// targets write files for every input), created on first use and removed at exit.
const std::string& ScratchDir();
// Removes everything inside `dir` (not `dir` itself).
void ClearDir(const std::string& dir);
void WriteFile(const std::string& path, std::string_view data);

}  // namespace zero::fuzz
