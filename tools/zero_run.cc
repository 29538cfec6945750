// zero-run: start N local ranks of a program, the way torchrun --standalone does for one machine; or, with
// --nnodes, one agent per machine of a job over several, the agents agreeing through a shared folder.
//
//   zero-run -n 4 [--timeout S] [--grace S] -- ./train --config zero3.json
//   zero-run -n 2 --nnodes 2 --node-rank 0 --rdzv-dir /shared/job-42 --master-addr 10.0.0.1 -- ./train ...
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
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "zero/store.h"

namespace {

using Clock = std::chrono::steady_clock;

int g_signal_pipe[2] = {-1, -1};

// A rank's output line longer than this is cut into pieces of this many bytes, each printed as a line of its
// own with the rank's prefix: a rank that writes without newlines must not make zero-run hold its whole output.
constexpr size_t kMaxLine = 64 * 1024;

// The signals zero-run forwards to every rank. SIGHUP is a closed terminal or a dropped ssh session, SIGQUIT a
// Ctrl-\: in both the ranks must go with the launcher, as with SIGINT and SIGTERM.
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

void OnSignal(int sig) {
  const int saved = errno;
  const unsigned char c = static_cast<unsigned char>(sig);
  (void)!::write(g_signal_pipe[1], &c, 1);
  errno = saved;
}

void Usage(FILE* out) {
  std::fprintf(
      out,
      "usage: zero-run -n N [--timeout SECONDS] [--grace SECONDS] [--max-restarts K [--min-nproc M | --live-groups "
      "G]]\n"
      "                [--nnodes K --node-rank I --rdzv-dir DIR [--master-addr ADDR] [--rdzv-timeout S]]\n"
      "                -- PROGRAM [ARGS...]\n"
      "  -n, --nproc N        number of ranks to start on this machine (>= 1)\n"
      "  --timeout SECONDS    kill the job after this long (exit code 124); default: none\n"
      "  --grace SECONDS      after a rank fails, how long the others may take to exit before they\n"
      "                       are terminated; default 10\n"
      "  --max-restarts K     when a rank fails, stop every rank and start them all again, at most K\n"
      "                       times (default 0); each rank sees TORCHELASTIC_RESTART_COUNT\n"
      "  --min-nproc M        each restart runs one rank fewer than the attempt that failed, never\n"
      "                       fewer than M (default N: the same number): the failed rank's slot (its\n"
      "                       LOCAL_RANK, so its GPU) is left out, as a host that is not replaced\n"
      "  --live-groups G      live recovery (zero/elastic.h): the ranks form groups of G consecutive ranks;\n"
      "                       when a rank fails, only its group is stopped and started again (at most K\n"
      "                       times in all), while the other groups train on; each rank of a restarted\n"
      "                       group sees ZERO_GROUP_RESTART_COUNT, and the store folder stays the job's\n"
      "  --nnodes K           the job spans K machines, one zero-run per machine, each with -n ranks;\n"
      "                       ranks are numbered node by node; a failure on any node stops the ranks of\n"
      "                       every node, and --max-restarts restarts them all together (default 1)\n"
      "  --node-rank I        this machine's place in [0, K) (with --nnodes)\n"
      "  --rdzv-dir DIR       with --nnodes: a folder every machine sees (a shared file system), fresh\n"
      "                       for each job: the ranks' store (ZERO_STORE_DIR) and the agents' own\n"
      "  --master-addr ADDR   with --nnodes: MASTER_ADDR for the ranks (an address of node 0), so that\n"
      "                       Gloo binds to this machine's address, not loopback (default 127.0.0.1)\n"
      "  --rdzv-timeout S     with --nnodes: how long an agent waits for the others at each attempt's\n"
      "                       start and end before it gives up, naming the missing node (default 300)\n"
      "Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,\n"
      "ZERO_STORE_DIR and ZERO_JOB_ID; output lines are prefixed with [rN]. SIGINT, SIGTERM, SIGHUP and SIGQUIT are\n"
      "forwarded to the ranks; the ranks never outlive zero-run.\n");
}

// Seconds in [0, 1e9]: a duration the steady clock's int64 nanoseconds hold with room to add it to now (1e300
// would overflow the conversion; the config's comm_timeout_s has the same ceiling).
constexpr double kMaxSeconds = 1e9;

bool ParseSeconds(const char* s, double* out) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s, &end);
  if (errno != 0 || end == s || *end != '\0' || !(v >= 0) || v > kMaxSeconds) return false;
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
  size_t scanned = 0;   // bytes of `partial` already searched for a newline (each byte is searched once)
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int wait_status = 0;
  bool stopped = false;  // stopped by a signal (SIGSTOP, SIGTSTP, ...) and not continued: a hung rank
  Stream streams[2];
};

// Prints every complete line of `s.partial` with the rank's prefix, and pieces of kMaxLine bytes of a line that
// has grown past it. Linear in the bytes read: each byte is searched for a newline once, and the consumed prefix
// is erased once per call.
void EmitLines(int rank, Stream& s, bool flush_partial) {
  size_t start = 0;
  for (;;) {
    const size_t from = std::max(start, s.scanned);
    const size_t nl = s.partial.find('\n', from);
    const size_t end = nl == std::string::npos ? s.partial.size() : nl;
    if (end - start > kMaxLine) {  // a piece of a line longer than kMaxLine
      std::fprintf(s.out, "[r%d] %.*s\n", rank, static_cast<int>(kMaxLine), s.partial.data() + start);
      start += kMaxLine;
      continue;
    }
    if (nl == std::string::npos) break;
    std::fprintf(s.out, "[r%d] %.*s\n", rank, static_cast<int>(nl - start), s.partial.data() + start);
    start = nl + 1;
  }
  s.partial.erase(0, start);
  s.scanned = s.partial.size();
  if (flush_partial && !s.partial.empty()) {
    std::fprintf(s.out, "[r%d] %s\n", rank, s.partial.c_str());
    s.partial.clear();
    s.scanned = 0;
  }
  std::fflush(s.out);
}

// The watchdog: a process of its own that outlives zero-run. zero-run tells it, over a pipe, each rank's process
// group as it starts ("+PGID") and as it is reaped ("-PGID"), and "done" when it is about to exit normally. If the
// pipe closes without "done" (zero-run was killed, SIGKILL included), the watchdog kills every process group still
// listed — the ranks and anything they started, which PR_SET_PDEATHSIG alone does not reach — and removes the
// store folder. It ignores the terminal's signals, which zero-run handles and forwards.
void RunWatchdog(int read_fd, const std::string& store_dir) {
  for (int sig : kForwarded) signal(sig, SIG_IGN);
  std::set<pid_t> groups;
  bool done = false;
  std::string buf;
  char chunk[256];
  for (;;) {
    const ssize_t got = ::read(read_fd, chunk, sizeof(chunk));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    buf.append(chunk, static_cast<size_t>(got));
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      const std::string msg = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      if (msg == "done") {
        done = true;
      } else if (msg.size() > 1 && (msg[0] == '+' || msg[0] == '-')) {
        const pid_t pgid = static_cast<pid_t>(std::strtol(msg.c_str() + 1, nullptr, 10));
        if (msg[0] == '+') {
          groups.insert(pgid);
        } else {
          groups.erase(pgid);
        }
      }
    }
  }
  if (done) ::_exit(0);
  for (pid_t g : groups) ::kill(-g, SIGKILL);
  std::error_code ec;
  std::filesystem::remove_all(store_dir, ec);
  std::fprintf(stderr,
               "zero-run (watchdog): zero-run died before its ranks ended; killed %zu rank process group(s)%s\n",
               groups.size(), ec ? "" : " and removed the store folder");
  ::_exit(0);
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  }
  return "ended with status " + std::to_string(status);
}

double Seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool Failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

// --nnodes: the agents of one job (one zero-run per machine) agree through a store in the shared rendezvous
// folder, as torchrun's agents do through their rendezvous backend. No agent serves it, so no machine's loss takes
// the others' means of deciding with it (a TCP store on node 0 would: pytorch#67742). Per attempt A:
//   node.A.I     node I's rank count (it starts its ranks once every node has said; ranks are numbered in node
//                order, so the offsets follow)
//   failed.A     a counter: a rank of some node failed, or an agent was interrupted; every agent polls it and
//                stops its own ranks (after the grace, as for a local failure)
//   stopped.A    a counter: some node has a rank stopped by a signal, the one that failed even if a peer on
//                another node exits first
//   ended.A.I    node I's outcome once all its ranks are gone: "ok", "failed CODE", "stopped CODE",
//                "interrupted CODE", "timeout"; every agent waits for every node's, so all take the same decision
//                (restart all, or stop with the first failure's code)
//   left         a counter: the last agent to finish removes the folder
class NodeSync {
 public:
  NodeSync(std::shared_ptr<zero::Store> store, int nnodes, int node, double timeout_s)
      : store_(std::move(store)), nnodes_(nnodes), node_(node), timeout_s_(timeout_s) {}

  // Publishes this node's rank count for attempt `a` and waits for every node's. False (with `err`) when a node
  // did not come within the timeout, when an interrupt came, or when the folder holds an earlier job's keys.
  bool Join(int a, int nproc, int* offset, int* world, std::string* err) {
    const std::string mine = Key(a, "node", node_);
    const zero::Status set = store_->Set(mine, Bytes(std::to_string(nproc)));
    if (!set.ok()) {
      *err = absl::StrCat("cannot publish ", mine, " in the rendezvous folder: ", std::string(set.message()),
                          a == 0 ? " (a folder an earlier job used? give each job a fresh --rdzv-dir)" : "");
      return false;
    }
    *offset = 0;
    *world = 0;
    for (int j = 0; j < nnodes_; ++j) {
      std::string v;
      if (!Wait(Key(a, "node", j), &v, err)) return false;
      const int n = std::atoi(v.c_str());
      if (j < node_) *offset += n;
      *world += n;
    }
    return true;
  }
  void MarkFailed(int a) { (void)store_->Add(Key(a, "failed"), 1); }
  void MarkStopped(int a) { (void)store_->Add(Key(a, "stopped"), 1); }
  bool AnyFailed(int a) { return Count(Key(a, "failed")) > 0; }
  bool AnyStopped(int a) { return Count(Key(a, "stopped")) > 0; }
  // Publishes this node's outcome of attempt `a` and collects every node's, in node order.
  bool End(int a, const std::string& outcome, std::vector<std::string>* all, std::string* err) {
    (void)store_->Set(Key(a, "ended", node_), Bytes(outcome));
    all->clear();
    for (int j = 0; j < nnodes_; ++j) {
      std::string v;
      if (!Wait(Key(a, "ended", j), &v, err)) return false;
      all->push_back(v);
    }
    return true;
  }
  // True for the last agent to leave: it may remove the folder.
  bool Leave() {
    const zero::StatusOr<int64_t> n = store_->Add("zero-run.left", 1);
    return n.ok() && *n == nnodes_;
  }

 private:
  static std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }
  static std::string Key(int a, const char* what, int node = -1) {
    // absl::StrCat, not "+": GCC 12 -O3 reports a false -Wrestrict on the std::string concatenation here.
    return node >= 0 ? absl::StrCat("zero-run.", what, ".", a, ".", node) : absl::StrCat("zero-run.", what, ".", a);
  }
  int64_t Count(const std::string& key) {
    const zero::StatusOr<int64_t> n = store_->Add(key, 0);
    return n.ok() ? *n : 0;
  }
  // Waits for `key` in short polls (so an interrupt is seen), up to the rendezvous timeout.
  bool Wait(const std::string& key, std::string* value, std::string* err) {
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
    for (;;) {
      zero::StatusOr<std::vector<uint8_t>> v = store_->Get(key, absl::Milliseconds(200));
      if (v.ok()) {
        value->assign(v->begin(), v->end());
        return true;
      }
      // A signal sets the flag through the self-pipe reader (PollSignals) between polls.
      PollSignals();
      if (interrupted_) {
        *err = "interrupted while waiting for " + key;
        return false;
      }
      if (Clock::now() >= deadline) {
        *err = absl::StrCat("no ", key, " from the other agents within ", timeout_s_,
                            " s (--rdzv-timeout): that node's zero-run did not start, or died");
        return false;
      }
    }
  }
  void PollSignals();

  std::shared_ptr<zero::Store> store_;
  int nnodes_, node_;
  double timeout_s_;
  bool interrupted_ = false;
  int pending_signal_ = 0;  // the first signal PollSignals read while waiting

 public:
  int pending_signal() const { return pending_signal_; }
};

void NodeSync::PollSignals() {
  unsigned char sigs[64];
  const ssize_t got = ::read(g_signal_pipe[0], sigs, sizeof(sigs));
  for (ssize_t i = 0; i < got; ++i) {
    if (sigs[i] == SIGCHLD) continue;
    if (pending_signal_ == 0) pending_signal_ = sigs[i];
    interrupted_ = true;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int nproc = 0;
  double job_timeout_s = 0;
  double grace_s = 10;
  int max_restarts = 0;
  int min_nproc = 0;               // 0: -n's value
  int live_group = 0;              // --live-groups: the group size (0: whole-job restarts)
  int nnodes = 1, node_rank = -1;  // --nnodes, --node-rank
  std::string rdzv_dir, master_addr = "127.0.0.1";
  double rdzv_timeout_s = 300;
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
    if (a == "-n" || a == "--nproc" || a == "--timeout" || a == "--grace" || a == "--max-restarts" ||
        a == "--min-nproc" || a == "--live-groups" || a == "--nnodes" || a == "--node-rank" || a == "--rdzv-dir" ||
        a == "--master-addr" || a == "--rdzv-timeout") {
      if (arg + 1 >= argc) {
        std::fprintf(stderr, "zero-run: %s needs a value\n", a.c_str());
        Usage(stderr);
        return 2;
      }
      const char* v = argv[++arg];
      bool ok = true;
      if (a == "--rdzv-dir" || a == "--master-addr") {
        (a == "--rdzv-dir" ? rdzv_dir : master_addr) = v;
        ok = v[0] != '\0';
      } else if (a == "--nnodes" || a == "--node-rank") {
        char* end = nullptr;
        long n = std::strtol(v, &end, 10);
        ok = end != v && *end == '\0' && n >= (a == "--nnodes" ? 1 : 0) && n <= 4096;
        (a == "--nnodes" ? nnodes : node_rank) = static_cast<int>(n);
      } else if (a == "-n" || a == "--nproc" || a == "--min-nproc" || a == "--live-groups") {
        char* end = nullptr;
        long n = std::strtol(v, &end, 10);
        ok = end != v && *end == '\0' && n >= 1 && n <= 4096;
        (a == "--min-nproc" ? min_nproc : a == "--live-groups" ? live_group : nproc) = static_cast<int>(n);
      } else if (a == "--max-restarts") {
        char* end = nullptr;
        long k = std::strtol(v, &end, 10);
        ok = end != v && *end == '\0' && k >= 0 && k <= 1000;
        max_restarts = static_cast<int>(k);
      } else if (a == "--timeout") {
        ok = ParseSeconds(v, &job_timeout_s);
      } else if (a == "--rdzv-timeout") {
        ok = ParseSeconds(v, &rdzv_timeout_s);
      } else {
        ok = ParseSeconds(v, &grace_s);
      }
      if (!ok) {
        const char* range =
            (a == "-n" || a == "--nproc" || a == "--min-nproc" || a == "--live-groups" || a == "--nnodes")
                ? "an integer in [1, 4096]"
            : a == "--node-rank"                        ? "an integer in [0, 4096]"
            : a == "--rdzv-dir" || a == "--master-addr" ? "not empty"
            : a == "--max-restarts"                     ? "an integer in [0, 1000]"
                                                        : "seconds in [0, 1e9]";
        std::fprintf(stderr, "zero-run: invalid value '%s' for %s: must be %s\n", v, a.c_str(), range);
        return 2;
      }
      continue;
    }
    if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "zero-run: unknown flag %s\n", a.c_str());
      Usage(stderr);
      return 2;
    }
    break;  // the program, without a "--" before it
  }
  if (nproc < 1 || arg >= argc) {
    Usage(stderr);
    return 2;
  }
  if (min_nproc > nproc) {
    std::fprintf(stderr, "zero-run: --min-nproc %d is above -n %d\n", min_nproc, nproc);
    return 2;
  }
  if (live_group > 0 && (min_nproc > 0 || nproc % live_group != 0 || live_group >= nproc)) {
    std::fprintf(stderr,
                 "zero-run: --live-groups %d needs at least two groups that divide -n %d, and no --min-nproc (a lost "
                 "group is restarted whole, or given up while the others go on)\n",
                 live_group, nproc);
    return 2;
  }
  const bool multi_node = nnodes > 1;
  if (multi_node && (node_rank < 0 || node_rank >= nnodes || rdzv_dir.empty())) {
    std::fprintf(stderr,
                 "zero-run: --nnodes %d needs --node-rank in [0, %d) and --rdzv-dir (a folder every node sees)\n",
                 nnodes, nnodes);
    return 2;
  }
  if (!multi_node && (node_rank > 0 || !rdzv_dir.empty())) {
    std::fprintf(stderr, "zero-run: --node-rank and --rdzv-dir go with --nnodes K (K > 1)\n");
    return 2;
  }
  if (multi_node && (min_nproc > 0 || live_group > 0)) {
    // Each would need the agents to agree on which node's slot or group goes; not built.
    std::fprintf(
        stderr,
        "zero-run: --min-nproc and --live-groups run on one machine; with --nnodes a restart runs every node's "
        "ranks again (not built across machines)\n");
    return 2;
  }
  if (min_nproc == 0) min_nproc = nproc;
  // The local slots the ranks run in (LOCAL_RANK: a GPU each); a restart under --min-nproc drops a failed one.
  std::vector<int> slots(static_cast<size_t>(nproc));
  for (int i = 0; i < nproc; ++i) slots[static_cast<size_t>(i)] = i;
  std::vector<char*> child_argv(argv + arg, argv + argc);
  child_argv.push_back(nullptr);

  // A fresh rendezvous directory per job: Gloo's file store keys are write-once, so reusing one would
  // collide with an earlier job's keys. With --nnodes the folder is the user's (shared by every node's agent).
  const char* tmp = std::getenv("TMPDIR");
  std::string store_dir = std::string(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp") + "/zero-run-XXXXXX";
  if (multi_node) {
    store_dir = rdzv_dir;
    std::error_code ec;
    std::filesystem::create_directories(store_dir, ec);
    if (ec) {
      std::fprintf(stderr, "zero-run: cannot create --rdzv-dir %s: %s\n", store_dir.c_str(), ec.message().c_str());
      return 1;
    }
  } else if (::mkdtemp(store_dir.data()) == nullptr) {
    std::fprintf(stderr, "zero-run: cannot create a store directory %s: %s\n", store_dir.c_str(), std::strerror(errno));
    return 1;
  }
  // Removes the store folder on every path out of main from here on (the watchdog does it when zero-run is
  // killed). With --nnodes only the last agent to finish removes it (below): the others may still read it.
  struct StoreCleanup {
    std::string dir;
    ~StoreCleanup() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } store_cleanup{multi_node ? std::string() : store_dir};
  const int port = FreePort();
  // ZERO_JOB_ID, the job's identity at rendezvous (docs/internals/comm.md, "Rendezvous checks"): ranks of another job
  // that reach this job's store refuse it. The store directory's name is unique while the job runs, and the same for
  // every attempt of the job (and, with --nnodes, for every node).
  std::string job_id = std::filesystem::path(store_dir).lexically_normal().string();
  while (job_id.size() > 1 && job_id.back() == '/') job_id.pop_back();
  job_id = job_id.substr(job_id.rfind('/') + 1);
  std::unique_ptr<NodeSync> nodes;
  if (multi_node) {
    nodes = std::make_unique<NodeSync>(zero::Store::File(store_dir + "/agents"), nnodes, node_rank, rdzv_timeout_s);
  }

  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("zero-run: pipe");
    return 1;
  }
  // The watchdog, forked before any rank so it holds none of their pipes. Its end of the pipe is the only one
  // it keeps; zero-run's end is close-on-exec, so no rank holds it open after zero-run dies.
  int watch[2];
  if (::pipe2(watch, O_CLOEXEC) != 0) {
    std::perror("zero-run: pipe");
    return 1;
  }
  const pid_t launcher = ::getpid();
  const pid_t watchdog = ::fork();
  if (watchdog < 0) {
    std::perror("zero-run: fork");
    return 1;
  }
  if (watchdog == 0) {
    ::close(watch[1]);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
    RunWatchdog(watch[0], multi_node ? std::string() : store_dir);  // never returns
  }
  ::close(watch[0]);
  const int watch_fd = watch[1];
  auto tell_watchdog = [&](const std::string& msg) {
    const std::string line = msg + "\n";
    (void)!::write(watch_fd, line.data(), line.size());
  };

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : kForwarded) {
    // A signal ignored when zero-run started stays ignored (nohup zero-run ...: SIGHUP must not stop the job).
    struct sigaction old {};
    sigaction(sig, nullptr, &old);
    if (old.sa_handler != SIG_IGN) sigaction(sig, &sa, nullptr);
  }
  sigaction(SIGCHLD, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const Clock::time_point job_start = Clock::now();
  int restarts = 0;
  int interrupted_by = 0;
  bool timed_out = false;
  int first_failed_rank = -1;
  std::vector<Rank> ranks;
  // Live recovery (--live-groups): per group, its incarnation, whether it is being stopped to be started again,
  // and whether it was given up (restarts spent) while the others went on.
  const int groups = live_group > 0 ? nproc / live_group : 0;
  std::vector<int> incarnation(static_cast<size_t>(groups), 0);
  std::vector<bool> condemned(static_cast<size_t>(groups), false), given_up(static_cast<size_t>(groups), false);
  int rank_offset = 0, world = nproc;  // this node's first rank and the job's ranks (--nnodes: all nodes')
  std::string remote_failure;          // --nnodes: the outcome of another node that failed in the last attempt
  bool remote_first = false;           // --nnodes: that node failed before any rank here did
  for (;;) {                           // one attempt of the whole job per iteration: the first, then each restart
    ranks.assign(nproc, Rank{});
    first_failed_rank = -1;
    remote_failure.clear();
    remote_first = false;
    // Each attempt rendezvouses in a folder of its own: the file store's keys are write-once.
    const std::string attempt_dir = store_dir + "/attempt-" + std::to_string(restarts);
    if (::mkdir(attempt_dir.c_str(), 0700) != 0 && !(multi_node && errno == EEXIST)) {
      std::fprintf(stderr, "zero-run: cannot create %s: %s\n", attempt_dir.c_str(), std::strerror(errno));
      return 1;
    }
    world = nproc;  // one machine: all of them (a restart under --min-nproc may run fewer)
    if (multi_node) {
      std::string err;
      if (!nodes->Join(restarts, nproc, &rank_offset, &world, &err)) {
        std::fprintf(stderr, "zero-run: node %d, attempt %d: %s\n", node_rank, restarts, err.c_str());
        tell_watchdog("done");
        return nodes->pending_signal() != 0 ? 128 + nodes->pending_signal() : 1;
      }
      std::fprintf(stderr, "zero-run: node %d of %d runs ranks %d-%d of %d (attempt %d)\n", node_rank, nnodes,
                   rank_offset, rank_offset + nproc - 1, world, restarts);
      std::fflush(stderr);
    }
    // Starts rank r (again, for a live group restart: `incarnation` > 0). False when it could not.
    auto spawn = [&](int r, int incarnation) -> bool {
      int out[2], err[2];
      if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
        std::perror("zero-run: pipe");
        for (auto& rk : ranks) {
          if (rk.running) ::kill(-rk.pid, SIGKILL);
        }
        return false;
      }
      pid_t pid = ::fork();
      if (pid < 0) {
        std::perror("zero-run: fork");
        for (auto& rk : ranks) {
          if (rk.running) ::kill(-rk.pid, SIGKILL);
        }
        return false;
      }
      if (pid == 0) {
        // Dies with zero-run, whatever kills it: the kernel sends SIGKILL when the parent exits. If zero-run died
        // before this line ran, the parent is already someone else: leave at once.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != launcher) ::_exit(128 + SIGKILL);
        // Own process group: a terminal's Ctrl-C reaches only zero-run, which forwards it once.
        ::setpgid(0, 0);
        ::dup2(out[1], STDOUT_FILENO);
        ::dup2(err[1], STDERR_FILENO);
        for (int sig : kForwarded) signal(sig, SIG_DFL);
        signal(SIGCHLD, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        ::setenv("RANK", std::to_string(rank_offset + r).c_str(), 1);
        ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
        ::setenv("LOCAL_RANK", std::to_string(slots[static_cast<size_t>(r)]).c_str(), 1);
        ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
        if (multi_node) {  // as torchrun: which node this is, and how many
          ::setenv("GROUP_RANK", std::to_string(node_rank).c_str(), 1);
          ::setenv("GROUP_WORLD_SIZE", std::to_string(nnodes).c_str(), 1);
        }
        ::setenv("MASTER_ADDR", master_addr.c_str(), 1);
        ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        ::setenv("ZERO_STORE_DIR", attempt_dir.c_str(), 1);
        ::setenv("ZERO_JOB_ID", job_id.c_str(), 1);
        // As torchrun: which attempt this is, so a trainer resumes from its checkpoint on a restart.
        ::setenv("TORCHELASTIC_RESTART_COUNT", std::to_string(live_group > 0 ? incarnation : restarts).c_str(), 1);
        // Live recovery: which incarnation of its group this rank is (zero::ReplicaGroups::FromEnv).
        if (live_group > 0) ::setenv("ZERO_GROUP_RESTART_COUNT", std::to_string(incarnation).c_str(), 1);
        ::setenv("TORCHELASTIC_MAX_RESTARTS", std::to_string(max_restarts).c_str(), 1);
        ::execvp(child_argv[0], child_argv.data());
        std::fprintf(stderr, "zero-run: cannot execute %s: %s\n", child_argv[0], std::strerror(errno));
        ::_exit(127);
      }
      ::setpgid(pid, pid);
      // snprintf, not "+" + std::to_string: GCC 12 -O3 reports a false -Wrestrict on that inside the lambda.
      char started[32];
      std::snprintf(started, sizeof(started), "+%d", static_cast<int>(pid));
      tell_watchdog(started);
      ::close(out[1]);
      ::close(err[1]);
      ranks[r] = Rank{};
      ranks[r].pid = pid;
      ranks[r].running = true;
      ranks[r].streams[0] = {out[0], stdout, ""};
      ranks[r].streams[1] = {err[0], stderr, ""};
      return true;
    };
    for (int r = 0; r < nproc; ++r) {
      if (!spawn(r, 0)) return 1;
    }
    // Live recovery keeps its decisions in the attempt's store folder; zero-run writes there which group
    // incarnation it saw fail, so the groups left need not wait to find out (zero/elastic.h).
    std::shared_ptr<zero::Store> live_store = live_group > 0 ? zero::Store::File(attempt_dir) : nullptr;

    // When still-running ranks get SIGTERM, then SIGKILL; max() = not scheduled. (Not std::optional: GCC 12 -O3
    // reports a maybe-uninitialized read of the empty optional's value, a false positive.)
    constexpr Clock::time_point kNever = Clock::time_point::max();
    Clock::time_point terminate_at = kNever;
    bool remote_seen = false;  // --nnodes: another node's failure was seen in this attempt
    Clock::time_point kill_at = kNever;
    std::optional<Clock::time_point> all_exited_at;
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
            std::fprintf(stderr, "zero-run: rank %d was stopped by signal %d (%s) at %.3f s\n", rank_offset + r,
                         WSTOPSIG(status), strsignal(WSTOPSIG(status)), Seconds(Clock::now() - job_start));
            std::fflush(stderr);
            if (multi_node) nodes->MarkStopped(restarts);  // the culprit, whichever node's rank exits first
            continue;
          }
          if (WIFCONTINUED(status)) {
            ranks[r].stopped = false;
            std::fprintf(stderr, "zero-run: rank %d continued\n", rank_offset + r);
            continue;
          }
          ranks[r].running = false;
          ranks[r].wait_status = status;
          tell_watchdog("-" + std::to_string(pid));
          if (live_group > 0 && interrupted_by == 0 && !timed_out) {
            // Only the failed rank's group goes: its shard is gone with the rank. The other groups train on.
            const int g = r / live_group;
            if (Failed(status) && !condemned[static_cast<size_t>(g)]) {
              condemned[static_cast<size_t>(g)] = true;
              std::fprintf(stderr, "zero-run: rank %d (group %d, incarnation %d) %s at %.3f s; stopping group %d\n", r,
                           g, incarnation[static_cast<size_t>(g)], DescribeExit(status).c_str(),
                           Seconds(Clock::now() - job_start), g);
              std::fflush(stderr);
              (void)live_store->Add(
                  "zero-live.lost." + std::to_string(g) + "." + std::to_string(incarnation[static_cast<size_t>(g)]), 1);
              for (int q = g * live_group; q < (g + 1) * live_group; ++q) {
                if (ranks[q].running) ::kill(-ranks[q].pid, SIGKILL);
              }
            }
            continue;
          }
          if (Failed(status) && first_failed_rank < 0 && interrupted_by == 0 && !timed_out) {
            int culprit = -1;
            for (int q = 0; q < nproc; ++q) {
              if (ranks[q].running && ranks[q].stopped && culprit < 0) culprit = q;
            }
            if (culprit >= 0) {
              std::fprintf(stderr, "zero-run: rank %d failed first: it is stopped; rank %d then %s\n",
                           rank_offset + culprit, rank_offset + r, DescribeExit(status).c_str());
            }
            first_failed_rank = culprit >= 0 ? culprit : r;
            if (multi_node) nodes->MarkFailed(restarts);  // every node's agent stops its ranks
            // When, so the survivors' errors (which name the op they were in and how long they waited) can be
            // matched to the rank that left.
            std::fprintf(stderr, "zero-run: rank %d %s at %.3f s", rank_offset + r, DescribeExit(status).c_str(),
                         Seconds(Clock::now() - job_start));
            if (running_count() > 0) {
              std::fprintf(stderr, "; the other ranks have %.3g s to exit before they are terminated", grace_s);
              terminate_at = Clock::now() + grace;
            }
            std::fprintf(stderr, "\n");
            std::fflush(stderr);
          }
        }
      }
      // Live recovery: a stopped group whose ranks are all gone starts again as its next incarnation, or is
      // given up when the restarts are spent.
      for (int g = 0; g < groups; ++g) {
        if (!condemned[static_cast<size_t>(g)]) continue;
        bool left = false;
        for (int q = g * live_group; q < (g + 1) * live_group; ++q) left = left || ranks[q].running;
        if (left) continue;
        condemned[static_cast<size_t>(g)] = false;
        if (restarts >= max_restarts || interrupted_by != 0 || timed_out) {
          given_up[static_cast<size_t>(g)] = true;
          if (first_failed_rank < 0) first_failed_rank = g * live_group;
          std::fprintf(stderr, "zero-run: group %d is not restarted (%d of %d restarts spent); the others go on\n", g,
                       restarts, max_restarts);
          std::fflush(stderr);
          continue;
        }
        ++restarts;
        ++incarnation[static_cast<size_t>(g)];
        std::fprintf(stderr,
                     "zero-run: restarting group %d (ranks %d-%d) as incarnation %d at %.3f s (restart %d of %d)\n", g,
                     g * live_group, (g + 1) * live_group - 1, incarnation[static_cast<size_t>(g)],
                     Seconds(Clock::now() - job_start), restarts, max_restarts);
        std::fflush(stderr);
        for (int q = g * live_group; q < (g + 1) * live_group; ++q) {
          for (auto& st : ranks[q].streams) {
            // What the old incarnation wrote and zero-run has not read yet, then its pipe goes.
            for (pollfd p{st.fd, POLLIN, 0}; st.fd >= 0 && ::poll(&p, 1, 0) > 0;) {
              char buf[65536];
              const ssize_t got = ::read(st.fd, buf, sizeof(buf));
              if (got <= 0) break;
              st.partial.append(buf, static_cast<size_t>(got));
            }
            EmitLines(rank_offset + q, st, /*flush_partial=*/true);
            if (st.fd >= 0) ::close(st.fd);
            st.fd = -1;
          }
          if (!spawn(q, incarnation[static_cast<size_t>(g)])) return 1;
        }
      }
      const Clock::time_point now = Clock::now();
      // --nnodes: a failure on another node ends this attempt here too, with the same grace as a local one (the
      // ranks here are usually failing on their own by then: their peers left).
      if (multi_node && first_failed_rank < 0 && !remote_seen && interrupted_by == 0 && !timed_out &&
          running_count() > 0 && nodes->AnyFailed(restarts)) {
        remote_seen = true;
        remote_first = true;
        std::fprintf(stderr,
                     "zero-run: node %d: a rank of another node failed at %.3f s (or its agent was stopped); the %d "
                     "rank(s) here have %.3g s to exit before they are terminated\n",
                     node_rank, Seconds(now - job_start), running_count(), grace_s);
        std::fflush(stderr);
        terminate_at = std::min(terminate_at, now + grace);
      }
      // The grace lets ranks that can still run report their errors; a stopped rank never will, so once every
      // rank left is stopped the wait is over (a hang becomes a restart in detection time, not detection + grace).
      if (terminate_at != kNever && terminate_at > now && running_count() > 0) {
        bool all_stopped = true;
        for (const auto& rk : ranks) all_stopped = all_stopped && (!rk.running || rk.stopped);
        if (all_stopped) {
          std::fprintf(stderr, "zero-run: every rank still running is stopped; terminating them now\n");
          std::fflush(stderr);
          terminate_at = now;
        }
      }
      if (running_count() == 0) {
        if (!all_exited_at) all_exited_at = now;
        // Grandchildren may hold the pipes open; stop reading a second after the ranks themselves exited.
        if (open_streams() == 0 || now - *all_exited_at > std::chrono::seconds(1)) break;
      }
      if (job_timeout_s > 0 && !timed_out &&
          now - job_start > std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(job_timeout_s))) {
        timed_out = true;
        if (multi_node) nodes->MarkFailed(restarts);
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
          if (multi_node) nodes->MarkFailed(restarts);
          std::fprintf(stderr, "zero-run: received %s; forwarding it to %d rank(s)\n", strsignal(sig), running_count());
          std::fflush(stderr);
          signal_all(sig);
          kill_at =
              Clock::now() + std::max(grace, std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(1)));
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
          EmitLines(rank_offset + r, s, /*flush_partial=*/false);
        } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
          EmitLines(rank_offset + r, s, /*flush_partial=*/true);
          ::close(s.fd);
          s.fd = -1;
        }
      }
    }
    for (int r = 0; r < nproc; ++r) {
      for (auto& s : ranks[r].streams) {
        EmitLines(rank_offset + r, s, true);
        if (s.fd >= 0) ::close(s.fd);
      }
    }
    if (live_group > 0) break;  // groups were restarted inside the attempt
    bool any_failed = false;
    for (const Rank& rk : ranks) any_failed = any_failed || Failed(rk.wait_status);
    bool stop_job = timed_out || interrupted_by != 0;
    if (multi_node) {
      // Every node's outcome, so that all agents take the same decision: restart all, or stop.
      std::string outcome = "ok";
      if (interrupted_by != 0) {
        outcome = "interrupted " + std::to_string(128 + interrupted_by);
      } else if (timed_out) {
        outcome = "timeout 124";
      } else if (any_failed) {
        const int f = first_failed_rank >= 0 ? first_failed_rank : 0;
        outcome =
            std::string(ranks[f].stopped ? "stopped " : "failed ") + std::to_string(ExitCodeOf(ranks[f].wait_status));
      }
      std::vector<std::string> all;
      std::string err;
      if (!nodes->End(restarts, outcome, &all, &err)) {
        std::fprintf(stderr, "zero-run: node %d, end of attempt %d: %s\n", node_rank, restarts, err.c_str());
        if (remote_failure.empty()) remote_failure = "failed 1";
        break;
      }
      std::string summary;
      for (int j = 0; j < nnodes; ++j) {
        summary += " [node " + std::to_string(j) + " " + all[static_cast<size_t>(j)] + "]";
        if (all[static_cast<size_t>(j)] == "ok") continue;
        any_failed = true;
        stop_job = stop_job || all[static_cast<size_t>(j)].rfind("interrupted", 0) == 0 ||
                   all[static_cast<size_t>(j)].rfind("timeout", 0) == 0;
        // The node whose rank was stopped failed first; else the lowest node that failed.
        if (j != node_rank && (remote_failure.empty() || all[static_cast<size_t>(j)].rfind("stopped", 0) == 0)) {
          remote_failure = all[static_cast<size_t>(j)];
        }
      }
      if (any_failed) {
        std::fprintf(stderr, "zero-run: attempt %d ended:%s\n", restarts, summary.c_str());
        std::fflush(stderr);
      }
    }
    // A failed attempt is restarted whole (every rank stopped above, as torchrun's agent does), unless the job was
    // interrupted or timed out, or its restarts are spent. The trainer resumes from its last checkpoint.
    if (!any_failed || stop_job || restarts >= max_restarts) break;
    ++restarts;
    if (nproc > min_nproc) {
      // The slot of the rank that failed first is given up (a stopped rank counts as the one that failed).
      const int gone = first_failed_rank >= 0 ? first_failed_rank : 0;
      std::fprintf(stderr,
                   "zero-run: rank %d's slot (LOCAL_RANK %d) is left out: %d rank(s) from now on (--min-nproc %d)\n",
                   gone, slots[static_cast<size_t>(gone)], nproc - 1, min_nproc);
      slots.erase(slots.begin() + gone);
      --nproc;
    }
    if (multi_node) {
      std::fprintf(stderr, "zero-run: node %d: restarting all %d rank(s) of %d nodes at %.3f s (restart %d of %d)\n",
                   node_rank, nproc, nnodes, Seconds(Clock::now() - job_start), restarts, max_restarts);
    } else {
      std::fprintf(stderr, "zero-run: restarting all %d rank(s) at %.3f s (restart %d of %d)\n", nproc,
                   Seconds(Clock::now() - job_start), restarts, max_restarts);
    }
    std::fflush(stderr);
  }  // attempts

  // Every rank is reaped: the watchdog has nothing left to guard. The store folder goes with store_cleanup (with
  // --nnodes, the last agent to finish removes it).
  tell_watchdog("done");
  ::close(watch_fd);
  ::waitpid(watchdog, nullptr, 0);
  if (multi_node && nodes->Leave()) store_cleanup.dir = store_dir;

  int failures = 0;
  for (int r = 0; r < nproc; ++r) failures += Failed(ranks[r].wait_status) ? 1 : 0;
  if (failures > 0) {
    std::fprintf(stderr, "zero-run: %d of %d rank(s)%s failed", failures, nproc, multi_node ? " of this node" : "");
    if (restarts > 0) std::fprintf(stderr, " in the last of %d attempts", restarts + 1);
    std::fprintf(stderr, ":");
    for (int r = 0; r < nproc; ++r) {
      if (Failed(ranks[r].wait_status)) {
        std::fprintf(stderr, " [r%d %s]", rank_offset + r, DescribeExit(ranks[r].wait_status).c_str());
      }
    }
    std::fprintf(stderr, "\n");
  }
  if (timed_out) return 124;
  if (interrupted_by != 0) return 128 + interrupted_by;
  if (!remote_failure.empty() && (remote_first || failures == 0)) {
    // Another node's rank failed first (the ranks here were stopped because of it), or only there.
    const int code = std::atoi(remote_failure.c_str() + remote_failure.find(' ') + 1);
    return code == 0 ? 1 : code;
  }
  if (first_failed_rank >= 0) {
    const int code = ExitCodeOf(ranks[first_failed_rank].wait_status);
    return code == 0 ? 1 : code;
  }
  return failures > 0 ? 1 : 0;
}
