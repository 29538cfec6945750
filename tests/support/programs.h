// tests/support/programs.h — running a program as a user does, for the tests of the binaries. defines:
// ProgramRun, RunProgram.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace zero::testing {

struct ProgramRun {
  bool exited = false;  // false: killed by a signal (an abort), or not started
  int code = -1;        // the exit code when `exited`
  std::string output;   // stdout and stderr together
};

// Runs `cmd` through the shell under `timeout` (so that what would block or stall fails instead of hanging the
// suite), with stderr joined to stdout.
inline ProgramRun RunProgram(const std::string& cmd, int timeout_s = 120) {
  ProgramRun r;
  FILE* p = ::popen(("timeout " + std::to_string(timeout_s) + " " + cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (p != nullptr) {
    const size_t n = std::fread(buf, 1, sizeof(buf), p);
    if (n == 0) break;
    r.output.append(buf, n);
  }
  const int st = p == nullptr ? -1 : ::pclose(p);
  r.exited = p != nullptr && WIFEXITED(st);
  r.code = r.exited ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace zero::testing
