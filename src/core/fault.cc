// core/fault.cc — the fault-injection hook (core/internal/fault.h).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/internal/fault.h"

namespace zero::internal {
namespace {

struct FaultSpec {
  bool enabled = false;
  std::string phase;
  int rank = -1;
  int signal = SIGKILL;
  int64_t step = 0;
};

FaultSpec Parse() {
  FaultSpec f;
  const char* v = std::getenv("ZERO_TEST_FAULT");
  if (v == nullptr || *v == '\0') return f;
  std::string s = v;
  std::string parts[4];
  int n = 0;
  for (size_t start = 0; n < 4;) {
    const size_t colon = s.find(':', start);
    parts[n++] = s.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (n < 3) {
    std::fprintf(stderr, "zero: ZERO_TEST_FAULT=%s is not <phase>:<rank>:<KILL|STOP>[:<step>]; ignored\n", v);
    return f;
  }
  f.phase = parts[0];
  f.rank = std::atoi(parts[1].c_str());
  if (parts[2] == "KILL") {
    f.signal = SIGKILL;
  } else if (parts[2] == "STOP") {
    f.signal = SIGSTOP;
  } else {
    std::fprintf(stderr, "zero: ZERO_TEST_FAULT signal %s is not KILL or STOP; ignored\n", parts[2].c_str());
    return f;
  }
  if (n == 4) f.step = std::atoll(parts[3].c_str());
  f.enabled = true;
  return f;
}

const FaultSpec& Spec() {
  static const FaultSpec spec = Parse();
  return spec;
}

std::atomic<bool> g_fired{false};

}  // namespace

void MaybeInjectFault(const char* phase, int rank, int64_t step) {
  const FaultSpec& f = Spec();
  if (!f.enabled || rank != f.rank || step < f.step || f.phase != phase) return;
  if (g_fired.exchange(true)) return;
  std::fprintf(stderr, "zero: injecting SIG%s at %s on rank %d (step %lld)\n", f.signal == SIGKILL ? "KILL" : "STOP",
               phase, rank, static_cast<long long>(step));
  std::fflush(stderr);
  ::kill(::getpid(), f.signal);
}

}  // namespace zero::internal
