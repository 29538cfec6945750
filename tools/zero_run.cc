// zero-run: start N local ranks of a program, the way torchrun --standalone does for one machine.
//
//   zero-run -n 4 [--timeout S] [--grace S] -- ./train --config zero3.json
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT (a free
// port) and ZERO_STORE_DIR (a fresh temporary directory, removed at exit) so Communicator::FromEnv can
// rendezvous. Every output line is prefixed with "[rN] ". SIGINT/SIGTERM are forwarded to every rank. When a
// rank fails, the others get a grace period to report their own errors, then are terminated. The exit code is
// 0 if every rank exited 0; else the first failing rank's code (128 + signal for a signal; a rank stopped by a signal
// while a peer fails counts as the first to fail), 124 when the job
// timeout expired, 128 + signal when zero-run itself was interrupted.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const int saved = errno;
  const unsigned char c = static_cast<unsigned char>(sig);
  (void)!::write(g_signal_pipe[1], &c, 1);
  errno = saved;
}

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: zero-run -n N [--timeout SECONDS] [--grace SECONDS] -- PROGRAM [ARGS...]\n"
               "  -n, --nproc N        number of ranks to start on this machine (>= 1)\n"
               "  --timeout SECONDS    kill the job after this long (exit code 124); default: none\n"
               "  --grace SECONDS      after a rank fails, how long the others may take to exit before they\n"
               "                       are terminated; default 10\n"
               "Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,\n"
               "ZERO_STORE_DIR and ZERO_JOB_ID; output lines are prefixed with [rN].\n");
}

bool ParseSeconds(const char* s, double* out) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s, &end);
  if (errno != 0 || end == s || *end != '\0' || !(v >= 0)) return false;
  *out = v;
  return true;
}

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  int port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

struct Stream {
  int fd = -1;
  FILE* out = nullptr;  // stdout or stderr of zero-run
  std::string partial;  // bytes after the last newline
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int wait_status = 0;
  bool stopped = false;  // stopped by a signal (SIGSTOP, SIGTSTP, ...) and not continued: a hung rank
  Stream streams[2];
};

void EmitLines(int rank, Stream& s, bool flush_partial) {
  size_t start = 0;
  for (;;) {
    size_t nl = s.partial.find('\n', start);
    if (nl == std::string::npos) break;
    std::fprintf(s.out, "[r%d] %.*s\n", rank, static_cast<int>(nl - start), s.partial.data() + start);
    start = nl + 1;
  }
  s.partial.erase(0, start);
  if (flush_partial && !s.partial.empty()) {
    std::fprintf(s.out, "[r%d] %s\n", rank, s.partial.c_str());
    s.partial.clear();
  }
  std::fflush(s.out);
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  }
  return "ended with status " + std::to_string(status);
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool Failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

}  // namespace

int main(int argc, char** argv) {
  int nproc = 0;
  double job_timeout_s = 0;
  double grace_s = 10;
  int arg = 1;
  for (; arg < argc; ++arg) {
    const std::string a = argv[arg];
    if (a == "--") {
      ++arg;
      break;
    }
    if (a == "-h" || a == "--help") {
      Usage(stdout);
      return 0;
    }
    if ((a == "-n" || a == "--nproc" || a == "--timeout" || a == "--grace") && arg + 1 < argc) {
      const char* v = argv[++arg];
      bool ok = true;
      if (a == "-n" || a == "--nproc") {
        char* end = nullptr;
        long n = std::strtol(v, &end, 10);
        ok = end != v && *end == '\0' && n >= 1 && n <= 4096;
        nproc = static_cast<int>(n);
      } else if (a == "--timeout") {
        ok = ParseSeconds(v, &job_timeout_s);
      } else {
        ok = ParseSeconds(v, &grace_s);
      }
      if (!ok) {
        std::fprintf(stderr, "zero-run: invalid value '%s' for %s\n", v, a.c_str());
        return 2;
      }
      continue;
    }
    if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "zero-run: unknown option '%s'\n", a.c_str());
      Usage(stderr);
      return 2;
    }
    break;  // the program, without a "--" before it
  }
  if (nproc < 1 || arg >= argc) {
    Usage(stderr);
    return 2;
  }
  std::vector<char*> child_argv(argv + arg, argv + argc);
  child_argv.push_back(nullptr);

  // A fresh rendezvous directory per job: Gloo's file store keys are write-once, so reusing one would
  // collide with an earlier job's keys.
  const char* tmp = std::getenv("TMPDIR");
  std::string store_dir = std::string(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp") + "/zero-run-XXXXXX";
  if (::mkdtemp(store_dir.data()) == nullptr) {
    std::fprintf(stderr, "zero-run: cannot create a store directory %s: %s\n", store_dir.c_str(), std::strerror(errno));
    return 1;
  }
  const int port = FreePort();
  // ZERO_JOB_ID, the job's identity at rendezvous (docs/comm.md, "Rendezvous checks"): ranks of another job that
  // reach this job's store refuse it. The store directory's name is unique while the job runs.
  const std::string job_id = store_dir.substr(store_dir.rfind('/') + 1);

  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("zero-run: pipe");
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGCHLD, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<Rank> ranks(nproc);
  for (int r = 0; r < nproc; ++r) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      std::perror("zero-run: pipe");
      return 1;
    }
    pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("zero-run: fork");
      return 1;
    }
    if (pid == 0) {
      // Own process group: a terminal's Ctrl-C reaches only zero-run, which forwards it once.
      ::setpgid(0, 0);
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      signal(SIGCHLD, SIG_DFL);
      signal(SIGPIPE, SIG_DFL);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("ZERO_STORE_DIR", store_dir.c_str(), 1);
      ::setenv("ZERO_JOB_ID", job_id.c_str(), 1);
      ::execvp(child_argv[0], child_argv.data());
      std::fprintf(stderr, "zero-run: cannot execute %s: %s\n", child_argv[0], std::strerror(errno));
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    ::close(out[1]);
    ::close(err[1]);
    ranks[r].pid = pid;
    ranks[r].running = true;
    ranks[r].streams[0] = {out[0], stdout, ""};
    ranks[r].streams[1] = {err[0], stderr, ""};
  }

  const Clock::time_point start = Clock::now();
  // When still-running ranks get SIGTERM, then SIGKILL; max() = not scheduled. (Not std::optional: GCC 12 -O3
  // reports a maybe-uninitialized read of the empty optional's value, a false positive.)
  constexpr Clock::time_point kNever = Clock::time_point::max();
  Clock::time_point terminate_at = kNever;
  Clock::time_point kill_at = kNever;
  std::optional<Clock::time_point> all_exited_at;
  int first_failed_rank = -1;
  int interrupted_by = 0;
  bool timed_out = false;
  const auto grace = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s));

  auto signal_all = [&](int sig) {
    for (auto& rk : ranks) {
      if (rk.running) ::kill(-rk.pid, sig);
    }
  };
  auto running_count = [&]() {
    int n = 0;
    for (auto& rk : ranks) n += rk.running ? 1 : 0;
    return n;
  };
  auto open_streams = [&]() {
    int n = 0;
    for (auto& rk : ranks) {
      for (auto& s : rk.streams) n += s.fd >= 0 ? 1 : 0;
    }
    return n;
  };

  for (;;) {
    // Reap.
    for (;;) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG | WUNTRACED | WCONTINUED);
      if (pid <= 0) break;
      for (int r = 0; r < nproc; ++r) {
        if (ranks[r].pid != pid || !ranks[r].running) continue;
        // A stopped rank holds its peers in their collectives until their timeout: it is the one that failed,
        // even though the peers are the first to exit. Said when it happens, and named first below.
        if (WIFSTOPPED(status)) {
          ranks[r].stopped = true;
          std::fprintf(stderr, "zero-run: rank %d was stopped by signal %d (%s)\n", r, WSTOPSIG(status),
                       strsignal(WSTOPSIG(status)));
          std::fflush(stderr);
          continue;
        }
        if (WIFCONTINUED(status)) {
          ranks[r].stopped = false;
          std::fprintf(stderr, "zero-run: rank %d continued\n", r);
          continue;
        }
        ranks[r].running = false;
        ranks[r].wait_status = status;
        if (Failed(status) && first_failed_rank < 0 && interrupted_by == 0 && !timed_out) {
          int culprit = -1;
          for (int q = 0; q < nproc; ++q) {
            if (ranks[q].running && ranks[q].stopped && culprit < 0) culprit = q;
          }
          if (culprit >= 0) {
            std::fprintf(stderr, "zero-run: rank %d failed first: it is stopped; rank %d then %s\n", culprit, r,
                         DescribeExit(status).c_str());
          }
          first_failed_rank = culprit >= 0 ? culprit : r;
          std::fprintf(stderr, "zero-run: rank %d %s", r, DescribeExit(status).c_str());
          if (running_count() > 0) {
            std::fprintf(stderr, "; the other ranks have %.3g s to exit before they are terminated", grace_s);
            terminate_at = Clock::now() + grace;
          }
          std::fprintf(stderr, "\n");
          std::fflush(stderr);
        }
      }
    }
    const Clock::time_point now = Clock::now();
    if (running_count() == 0) {
      if (!all_exited_at) all_exited_at = now;
      // Grandchildren may hold the pipes open; stop reading a second after the ranks themselves exited.
      if (open_streams() == 0 || now - *all_exited_at > std::chrono::seconds(1)) break;
    }
    if (job_timeout_s > 0 && !timed_out &&
        now - start > std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(job_timeout_s))) {
      timed_out = true;
      std::fprintf(stderr, "zero-run: job timeout of %.3g s reached; terminating %d running rank(s)\n", job_timeout_s,
                   running_count());
      std::fflush(stderr);
      terminate_at = now;
    }
    if (now >= terminate_at) {
      terminate_at = kNever;
      signal_all(SIGTERM);
      for (auto& rk : ranks) {
        if (rk.running && rk.stopped) ::kill(-rk.pid, SIGCONT);  // a stopped rank acts on SIGTERM only when continued
      }
      kill_at = now + std::chrono::seconds(3);
    }
    if (now >= kill_at) {
      kill_at = kNever;
      signal_all(SIGKILL);
    }

    std::vector<pollfd> fds;
    fds.push_back({g_signal_pipe[0], POLLIN, 0});
    std::vector<std::pair<int, int>> owners;  // (rank, stream index) of fds[i + 1]
    for (int r = 0; r < nproc; ++r) {
      for (int k = 0; k < 2; ++k) {
        if (ranks[r].streams[k].fd >= 0) {
          fds.push_back({ranks[r].streams[k].fd, POLLIN, 0});
          owners.push_back({r, k});
        }
      }
    }
    int n = ::poll(fds.data(), fds.size(), 100);
    if (n < 0 && errno != EINTR) {
      std::perror("zero-run: poll");
      break;
    }
    if (fds[0].revents & POLLIN) {
      unsigned char sigs[64];
      ssize_t got = ::read(g_signal_pipe[0], sigs, sizeof(sigs));
      for (ssize_t i = 0; i < got; ++i) {
        const int sig = sigs[i];
        if (sig == SIGCHLD) continue;  // reaped at the top of the loop
        if (interrupted_by != 0) {
          signal_all(SIGKILL);  // a second interrupt: no more waiting
          continue;
        }
        interrupted_by = sig;
        std::fprintf(stderr, "zero-run: received %s; forwarding it to %d rank(s)\n", strsignal(sig), running_count());
        std::fflush(stderr);
        signal_all(sig);
        kill_at = Clock::now() + std::max(grace, std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(1)));
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto [r, k] = owners[i - 1];
      Stream& s = ranks[r].streams[k];
      char buf[65536];
      ssize_t got = ::read(s.fd, buf, sizeof(buf));
      if (got > 0) {
        s.partial.append(buf, static_cast<size_t>(got));
        EmitLines(r, s, /*flush_partial=*/false);
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        EmitLines(r, s, /*flush_partial=*/true);
        ::close(s.fd);
        s.fd = -1;
      }
    }
  }
  for (int r = 0; r < nproc; ++r) {
    for (auto& s : ranks[r].streams) {
      EmitLines(r, s, true);
      if (s.fd >= 0) ::close(s.fd);
    }
  }

  std::error_code ec;
  std::filesystem::remove_all(store_dir, ec);

  int failures = 0;
  for (int r = 0; r < nproc; ++r) failures += Failed(ranks[r].wait_status) ? 1 : 0;
  if (failures > 0) {
    std::fprintf(stderr, "zero-run: %d of %d rank(s) failed:", failures, nproc);
    for (int r = 0; r < nproc; ++r) {
      if (Failed(ranks[r].wait_status)) {
        std::fprintf(stderr, " [r%d %s]", r, DescribeExit(ranks[r].wait_status).c_str());
      }
    }
    std::fprintf(stderr, "\n");
  }
  if (timed_out) return 124;
  if (interrupted_by != 0) return 128 + interrupted_by;
  if (first_failed_rank >= 0) {
    const int code = ExitCodeOf(ranks[first_failed_rank].wait_status);
    return code == 0 ? 1 : code;
  }
  return failures > 0 ? 1 : 0;
}
