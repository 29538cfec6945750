// zero-run under abuse (issue 32, cases 1 and 8): whatever ends the launcher, no rank outlives it and its store
// folder goes; a rank's endless line is cut into bounded pieces; a rank that leaves is named with the time.
//
// The ranks are /bin/sh scripts that print their pid and store folder, then wait, so the test can look for them
// after the launcher is gone. A process counts as gone once kill(pid, 0) fails or it is a zombie (a reparented
// child waits for whoever reaps orphans here, which may be slow or nobody in a container).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "support/files.h"

namespace {

std::string TempDir(const std::string& name) { return zero::testing::MakeTempDir(name); }
std::string ReadFile(const std::string& path) { return zero::testing::ReadWholeFile(path); }

// Starts zero-run with `args`, its output in `out_path`. `ignore_hup`: SIGHUP ignored, as `nohup` leaves it.
pid_t StartZeroRun(const std::vector<std::string>& args, const std::string& out_path, bool ignore_hup = false) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    if (ignore_hup) signal(SIGHUP, SIG_IGN);
    std::vector<char*> argv;
    std::string path = ZERO_RUN_PATH;
    argv.push_back(path.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

std::optional<int> WaitExit(pid_t pid, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    if (absl::Now() > deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

bool Gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = s.rfind(')');
  return paren != std::string::npos && paren + 2 < s.size() && s[paren + 2] == 'Z';
}

bool AllGone(const std::vector<pid_t>& pids, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  for (;;) {
    bool all = true;
    for (pid_t p : pids) all = all && Gone(p);
    if (all) return true;
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// A rank that prints "pid P store DIR" and then waits (sleep in the foreground of the shell, a second process
// of the rank's group: the watchdog must reach it too, PR_SET_PDEATHSIG reaches only the shell).
const char kWaitingRank[] = "echo \"pid $$ store $ZERO_STORE_DIR\"; sleep 1000; echo woke";

struct Ranks {
  std::vector<pid_t> pids;
  std::string store;
};

// Waits until all `n` ranks printed their line; returns their pids and the store folder.
std::optional<Ranks> WaitForRanks(const std::string& out_path, int n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  const std::regex re(R"(\[r[0-9]+\] pid ([0-9]+) store (\S+))");
  while (absl::Now() < deadline) {
    const std::string out = ReadFile(out_path);
    Ranks r;
    for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
      r.pids.push_back(static_cast<pid_t>(std::stol((*it)[1].str())));
      r.store = (*it)[2].str();
    }
    if (static_cast<int>(r.pids.size()) == n) return r;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return std::nullopt;
}

// The sleeps the ranks started (children of the ranks' shells), found through /proc: the processes whose parent
// is one of `parents`.
std::vector<pid_t> ChildrenOf(const std::vector<pid_t>& parents) {
  std::vector<pid_t> kids;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string s((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t paren = s.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(s.substr(paren + 2));
    char state;
    long ppid = 0;
    rest >> state >> ppid;
    for (pid_t p : parents) {
      if (ppid == p) kids.push_back(static_cast<pid_t>(std::stol(name)));
    }
  }
  return kids;
}

// A signal to the launcher: forwarded, every rank (and what it started) ends, the store folder goes, and the
// launcher exits 128 + the signal. SIGHUP and SIGQUIT are the cases that orphaned the ranks before.
void ExpectForwarded(int sig) {
  const std::string dir = TempDir("zero-run-sig");
  const pid_t launcher = StartZeroRun({"-n", "3", "--grace", "2", "--", "/bin/sh", "-c", kWaitingRank}, dir + "/out");
  auto ranks = WaitForRanks(dir + "/out", 3);
  ASSERT_TRUE(ranks.has_value()) << ReadFile(dir + "/out");
  EXPECT_TRUE(std::filesystem::exists(ranks->store));
  ASSERT_EQ(::kill(launcher, sig), 0);
  auto status = WaitExit(launcher, absl::Seconds(30));
  ASSERT_TRUE(status.has_value()) << "zero-run did not exit after " << strsignal(sig) << ":\n"
                                  << ReadFile(dir + "/out");
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 128 + sig) << ReadFile(dir + "/out");
  EXPECT_TRUE(AllGone(ranks->pids, absl::Seconds(10))) << ReadFile(dir + "/out");
  EXPECT_FALSE(std::filesystem::exists(ranks->store)) << ranks->store;
  EXPECT_EQ(ReadFile(dir + "/out").find("woke"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(ZeroRunAbuse, SighupIsForwarded) { ExpectForwarded(SIGHUP); }
TEST(ZeroRunAbuse, SigquitIsForwarded) { ExpectForwarded(SIGQUIT); }
TEST(ZeroRunAbuse, SigtermIsForwarded) { ExpectForwarded(SIGTERM); }

// nohup's contract: a SIGHUP ignored when zero-run starts stays ignored, and the job goes on.
TEST(ZeroRunAbuse, IgnoredSighupStaysIgnored) {
  const std::string dir = TempDir("zero-run-nohup");
  const pid_t launcher =
      StartZeroRun({"-n", "2", "--", "/bin/sh", "-c", "echo \"pid $$ store $ZERO_STORE_DIR\"; sleep 2; echo finished"},
                   dir + "/out", /*ignore_hup=*/true);
  auto ranks = WaitForRanks(dir + "/out", 2);
  ASSERT_TRUE(ranks.has_value()) << ReadFile(dir + "/out");
  ASSERT_EQ(::kill(launcher, SIGHUP), 0);
  auto status = WaitExit(launcher, absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  const std::string out = ReadFile(dir + "/out");
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << out;
  EXPECT_NE(out.find("[r0] finished"), std::string::npos) << out;
  EXPECT_NE(out.find("[r1] finished"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

// kill -9 of the launcher runs none of its code: the ranks die by PR_SET_PDEATHSIG, what they started by the
// watchdog, which also removes the store folder.
TEST(ZeroRunAbuse, SigkillOfTheLauncherTakesTheRanks) {
  const std::string dir = TempDir("zero-run-kill");
  const pid_t launcher = StartZeroRun({"-n", "3", "--", "/bin/sh", "-c", kWaitingRank}, dir + "/out");
  auto ranks = WaitForRanks(dir + "/out", 3);
  ASSERT_TRUE(ranks.has_value()) << ReadFile(dir + "/out");
  // The sleeps the shells started: a rank's own children, which the parent-death signal does not reach.
  std::vector<pid_t> sleeps;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((sleeps = ChildrenOf(ranks->pids)).size() < 3 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(sleeps.size(), 3u);
  ASSERT_EQ(::kill(launcher, SIGKILL), 0);
  ASSERT_TRUE(WaitExit(launcher, absl::Seconds(10)).has_value());
  EXPECT_TRUE(AllGone(ranks->pids, absl::Seconds(10))) << "a rank outlived its launcher";
  EXPECT_TRUE(AllGone(sleeps, absl::Seconds(10))) << "a rank's child outlived the launcher";
  const absl::Time store_deadline = absl::Now() + absl::Seconds(10);
  while (std::filesystem::exists(ranks->store) && absl::Now() < store_deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(std::filesystem::exists(ranks->store)) << ranks->store;
  // The watchdog says what it did once it has done it: wait for its line.
  const absl::Time said_deadline = absl::Now() + absl::Seconds(10);
  while (ReadFile(dir + "/out").find("zero-run (watchdog): zero-run died") == std::string::npos &&
         absl::Now() < said_deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_NE(ReadFile(dir + "/out").find("zero-run (watchdog): zero-run died"), std::string::npos)
      << ReadFile(dir + "/out");
  std::filesystem::remove_all(dir);
}

// A rank that writes 3 MiB without a newline: printed in pieces of at most 64 KiB, each with the rank's prefix,
// and nothing lost.
TEST(ZeroRunAbuse, EndlessLineIsCutIntoPieces) {
  const std::string dir = TempDir("zero-run-line");
  const int64_t n = 3 * 1024 * 1024 + 17;
  const pid_t launcher = StartZeroRun(
      {"-n", "1", "--", "/bin/sh", "-c", absl::StrCat("head -c ", n, " /dev/zero | tr '\\0' a; echo; echo after")},
      dir + "/out");
  auto status = WaitExit(launcher, absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  std::ifstream in(dir + "/out");
  std::string line;
  int64_t as = 0;
  size_t longest = 0, pieces = 0;
  bool after = false;
  while (std::getline(in, line)) {
    if (line.rfind("[r0] ", 0) != 0) continue;
    const std::string body = line.substr(5);
    longest = std::max(longest, body.size());
    if (body == "after") {
      after = true;
      continue;
    }
    if (!body.empty() && body.find_first_not_of('a') == std::string::npos) {
      as += static_cast<int64_t>(body.size());
      ++pieces;
    }
  }
  EXPECT_EQ(as, n);
  EXPECT_LE(longest, 64u * 1024u);
  EXPECT_EQ(pieces, static_cast<size_t>((n + 64 * 1024 - 1) / (64 * 1024)));
  EXPECT_TRUE(after);
  std::filesystem::remove_all(dir);
}

// A rank that leaves while the others wait: zero-run names it, how it ended, and when (seconds since the start),
// so the survivors' errors can be matched to it.
TEST(ZeroRunAbuse, TheRankThatLeftIsNamedWithTheTime) {
  const std::string dir = TempDir("zero-run-left");
  const pid_t launcher = StartZeroRun(
      {"-n", "2", "--grace", "1", "--", "/bin/sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 1000"},
      dir + "/out");
  auto status = WaitExit(launcher, absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  const std::string out = ReadFile(dir + "/out");
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(zero-run: rank 1 exited with code 3 at [0-9]+\.[0-9]{3} s)")))
      << out;
  std::filesystem::remove_all(dir);
}

}  // namespace

namespace {

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// --max-restarts: a failed attempt stops every rank and starts them all again, each rank told which attempt it is
// (TORCHELASTIC_RESTART_COUNT, as torchrun) and given a fresh rendezvous folder.
TEST(ZeroRunRestarts, AFailedAttemptIsRestartedWhole) {
  const std::string dir = TempDir("zero-run-restart");
  const char* rank_program =
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then [ \"$RANK\" = 1 ] && exit 3; sleep 1000; fi; "
      "echo \"attempt $TORCHELASTIC_RESTART_COUNT of max $TORCHELASTIC_MAX_RESTARTS store $ZERO_STORE_DIR\"";
  const pid_t launcher = StartZeroRun(
      {"-n", "2", "--grace", "1", "--max-restarts", "2", "--", "/bin/sh", "-c", rank_program}, dir + "/out");
  auto status = WaitExit(launcher, absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  const std::string out = ReadFile(dir + "/out");
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << out;
  EXPECT_EQ(CountOf(out, "zero-run: restarting all 2 rank(s) at "), 1) << out;
  EXPECT_NE(out.find("(restart 1 of 2)"), std::string::npos) << out;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(
        std::regex_search(out, std::regex(absl::StrCat(R"(\[r)", r, R"(\] attempt 1 of max 2 store \S+/attempt-1)"))))
        << out;
  }
  EXPECT_EQ(out.find("] attempt 0"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

// Restarts are bounded: a rank that fails every time ends the job after K restarts with its exit code.
TEST(ZeroRunRestarts, RestartsAreBounded) {
  const std::string dir = TempDir("zero-run-restart-spent");
  const pid_t launcher =
      StartZeroRun({"-n", "2", "--grace", "1", "--max-restarts", "2", "--", "/bin/sh", "-c",
                    "echo \"try $TORCHELASTIC_RESTART_COUNT\"; [ \"$RANK\" = 1 ] && exit 3; sleep 1000"},
                   dir + "/out");
  auto status = WaitExit(launcher, absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  const std::string out = ReadFile(dir + "/out");
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << out;
  EXPECT_EQ(CountOf(out, "zero-run: restarting all 2 rank(s)"), 2) << out;
  EXPECT_EQ(CountOf(out, "[r1] try "), 3) << out;
  EXPECT_NE(out.find("in the last of 3 attempts"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

// A hang is a failure like an exit: once every rank left is stopped (SIGSTOP: it can never report an error), the
// grace period is not waited out. With --grace 1000 the job would otherwise outlive the 120 s limit below.
TEST(ZeroRunRestarts, StoppedRanksAreNotGivenTheGrace) {
  const std::string dir = TempDir("zero-run-stopped");
  const pid_t launcher =
      StartZeroRun({"-n", "2", "--grace", "1000", "--max-restarts", "1", "--", "/bin/sh", "-c",
                    "echo \"try $TORCHELASTIC_RESTART_COUNT\"; [ \"$TORCHELASTIC_RESTART_COUNT\" = 1 ] && exit 0; "
                    "if [ \"$RANK\" = 0 ]; then kill -STOP $$; fi; sleep 1; exit 3"},
                   dir + "/out");
  auto status = WaitExit(launcher, absl::Seconds(120));
  if (!status) ::kill(launcher, SIGKILL);
  ASSERT_TRUE(status.has_value()) << ReadFile(dir + "/out");
  const std::string out = ReadFile(dir + "/out");
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << out;
  EXPECT_NE(out.find("zero-run: rank 0 was stopped by signal"), std::string::npos) << out;
  EXPECT_NE(out.find("zero-run: rank 0 failed first: it is stopped"), std::string::npos) << out;
  EXPECT_NE(out.find("every rank still running is stopped; terminating them now"), std::string::npos) << out;
  EXPECT_EQ(CountOf(out, "[r0] try 1"), 1) << out;
  std::filesystem::remove_all(dir);
}

// --min-nproc: each restart runs one rank fewer, leaving out the failed rank's slot (its LOCAL_RANK, so its GPU),
// never below M; the ranks are numbered 0..n-1 again and told the new WORLD_SIZE.
TEST(ZeroRunRestarts, MinNprocShrinksByTheFailedSlot) {
  const std::string dir = TempDir("zero-run-shrink");
  const char* rank_program =
      "echo \"attempt $TORCHELASTIC_RESTART_COUNT rank $RANK of $WORLD_SIZE local $LOCAL_RANK of "
      "$LOCAL_WORLD_SIZE\"; case $WORLD_SIZE in 4) [ \"$LOCAL_RANK\" = 1 ] && exit 3;; 3) [ \"$RANK\" = 0 ] && exit "
      "4;; "
      "2) exit 0;; esac; sleep 1000";
  const pid_t launcher = StartZeroRun(
      {"-n", "4", "--grace", "1", "--max-restarts", "5", "--min-nproc", "2", "--", "/bin/sh", "-c", rank_program},
      dir + "/out");
  auto status = WaitExit(launcher, absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  const std::string out = ReadFile(dir + "/out");
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << out;
  // Attempt 0: LOCAL_RANK 1 fails; attempt 1 runs slots 0, 2, 3 as ranks 0-2, and rank 0 (slot 0) fails;
  // attempt 2 runs slots 2, 3 as ranks 0-1 and succeeds.
  EXPECT_NE(out.find("rank 1's slot (LOCAL_RANK 1) is left out: 3 rank(s) from now on (--min-nproc 2)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("] attempt 1 rank 1 of 3 local 2 of 3"), std::string::npos) << out;
  EXPECT_NE(out.find("] attempt 1 rank 2 of 3 local 3 of 3"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 0's slot (LOCAL_RANK 0) is left out: 2 rank(s) from now on"), std::string::npos) << out;
  EXPECT_NE(out.find("[r0] attempt 2 rank 0 of 2 local 2 of 2"), std::string::npos) << out;
  EXPECT_NE(out.find("[r1] attempt 2 rank 1 of 2 local 3 of 2"), std::string::npos) << out;
  EXPECT_EQ(CountOf(out, "zero-run: restarting all"), 2) << out;
  std::filesystem::remove_all(dir);
}

TEST(ZeroRunRestarts, MinNprocAboveNprocIsRefused) {
  const std::string dir = TempDir("zero-run-shrink-bad");
  const pid_t launcher = StartZeroRun({"-n", "2", "--min-nproc", "3", "--", "/bin/true"}, dir + "/out");
  auto status = WaitExit(launcher, absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  const std::string out = ReadFile(dir + "/out");
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << out;
  EXPECT_NE(out.find("zero-run: --min-nproc 3 is above -n 2"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

// Without --max-restarts nothing is restarted (the default is torchrun's: 0).
TEST(ZeroRunRestarts, NoRestartByDefault) {
  const std::string dir = TempDir("zero-run-no-restart");
  const pid_t launcher = StartZeroRun(
      {"-n", "2", "--grace", "1", "--", "/bin/sh", "-c", "echo try; [ \"$RANK\" = 1 ] && exit 3; sleep 1000"},
      dir + "/out");
  auto status = WaitExit(launcher, absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  const std::string out = ReadFile(dir + "/out");
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << out;
  EXPECT_EQ(CountOf(out, "[r1] try"), 1) << out;
  EXPECT_EQ(out.find("restarting"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

}  // namespace

namespace {

// Every flag is range-checked, the range in the message (1e300 seconds overflowed the clock's conversion).
TEST(ZeroRunAbuse, FlagsOutOfRangeAreRefusedWithTheRange) {
  const std::string dir = TempDir("zero-run-flags");
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"-n", "0"},
                                              {"-n", "5000"},
                                              {"--timeout", "1e300"},
                                              {"--grace", "-1"},
                                              {"--grace", "nan"},
                                              {"--max-restarts", "-1"},
                                              {"--max-restarts", "100000"}}) {
    std::vector<std::string> args = bad;
    args.insert(args.end(), {"--", "/bin/true"});
    const pid_t launcher = StartZeroRun(args, dir + "/out");
    auto status = WaitExit(launcher, absl::Seconds(30));
    ASSERT_TRUE(status.has_value());
    const std::string out = ReadFile(dir + "/out");
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << bad[0] << " " << bad[1] << ": " << out;
    EXPECT_NE(out.find("invalid value '" + bad[1] + "' for " + bad[0] + ": must be "), std::string::npos) << out;
  }
  std::filesystem::remove_all(dir);
}

// --live-groups: a failed rank stops and restarts only its group of consecutive ranks (ZERO_GROUP_RESTART_COUNT
// counts its incarnations, the store folder stays the job's), while the other groups run on untouched.
TEST(ZeroRunLiveGroups, OnlyTheFailedGroupRestarts) {
  const std::string dir = TempDir("zero-run-live");
  // Rank 3 fails a second in, once its group-mate rank 2 (killed with it) has said that it started.
  const char* rank_program =
      "echo \"rank $RANK incarnation $ZERO_GROUP_RESTART_COUNT store $ZERO_STORE_DIR\"; "
      "if [ \"$ZERO_GROUP_RESTART_COUNT\" = 0 ]; then [ \"$RANK\" = 3 ] && sleep 1 && exit 3; "
      "[ \"$RANK\" = 2 ] && sleep 1000; fi; "
      "sleep 2; echo \"rank $RANK done\"";
  const pid_t launcher = StartZeroRun(
      {"-n", "4", "--live-groups", "2", "--max-restarts", "2", "--", "/bin/sh", "-c", rank_program}, dir + "/out");
  auto status = WaitExit(launcher, absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  const std::string out = ReadFile(dir + "/out");
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << out;
  EXPECT_NE(out.find("zero-run: rank 3 (group 1, incarnation 0) exited with code 3"), std::string::npos) << out;
  EXPECT_EQ(CountOf(out, "zero-run: restarting group "), 1) << out;
  EXPECT_NE(out.find("zero-run: restarting group 1 (ranks 2-3) as incarnation 1"), std::string::npos) << out;
  for (int r = 0; r < 4; ++r) {
    // Group 0 ran once; group 1 twice, the second time told so, in the same store folder.
    EXPECT_EQ(CountOf(out, absl::StrCat("[r", r, "] rank ", r, " incarnation")), r < 2 ? 1 : 2) << out;
    EXPECT_EQ(CountOf(out, absl::StrCat("[r", r, "] rank ", r, " done")), 1) << out;
    EXPECT_TRUE(std::regex_search(out, std::regex(absl::StrCat(R"(\[r)", r, R"(\] rank )", r, R"( incarnation )",
                                                               r < 2 ? 0 : 1, R"( store \S+/attempt-0)"))))
        << out;
  }
  std::filesystem::remove_all(dir);
}

// A group that keeps failing is given up once the restarts are spent; the others finish, and the job's exit code
// is the failure's.
TEST(ZeroRunLiveGroups, AGroupPastItsRestartsIsGivenUp) {
  const std::string dir = TempDir("zero-run-live-spent");
  const pid_t launcher = StartZeroRun({"-n", "4", "--live-groups", "2", "--max-restarts", "1", "--", "/bin/sh", "-c",
                                       "[ \"$RANK\" = 2 ] && exit 3; sleep 2; echo \"rank $RANK done\""},
                                      dir + "/out");
  auto status = WaitExit(launcher, absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  const std::string out = ReadFile(dir + "/out");
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << out;
  EXPECT_EQ(CountOf(out, "zero-run: restarting group 1"), 1) << out;
  EXPECT_NE(out.find("zero-run: group 1 is not restarted (1 of 1 restarts spent); the others go on"), std::string::npos)
      << out;
  EXPECT_NE(out.find("[r0] rank 0 done"), std::string::npos) << out;
  EXPECT_NE(out.find("[r1] rank 1 done"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

// Groups must divide the ranks into at least two, and --min-nproc (which shrinks the whole job) does not mix in.
TEST(ZeroRunLiveGroups, BadGroupsAreUsageErrors) {
  for (const std::vector<std::string>& flags : std::vector<std::vector<std::string>>{
           {"-n", "4", "--live-groups", "3"},
           {"-n", "4", "--live-groups", "4"},
           {"-n", "4", "--live-groups", "2", "--max-restarts", "1", "--min-nproc", "2"}}) {
    const std::string dir = TempDir("zero-run-live-usage");
    std::vector<std::string> args = flags;
    for (const char* a : {"--", "/bin/true"}) args.push_back(a);
    const pid_t launcher = StartZeroRun(args, dir + "/out");
    auto status = WaitExit(launcher, absl::Seconds(30));
    ASSERT_TRUE(status.has_value());
    const std::string out = ReadFile(dir + "/out");
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << out;
    EXPECT_NE(out.find("--live-groups"), std::string::npos) << out;
    std::filesystem::remove_all(dir);
  }
}

// --nnodes: one zero-run per machine (two here, on one machine), agreeing through the shared --rdzv-dir. A rank of
// node 1 fails in the first attempt: node 0's agent sees it through the folder and stops its own ranks, both start
// attempt 1 together, the ranks are numbered node by node over the whole job, and the last agent out removes the
// folder.
struct NodeRun {
  std::optional<int> status;
  std::string out;
};
std::vector<NodeRun> RunNodes(const std::string& dir, const std::vector<std::string>& flags, const char* program,
                              int nodes = 2) {
  std::vector<pid_t> launchers;
  for (int n = 0; n < nodes; ++n) {
    std::vector<std::string> args = {
        "-n",          "2",       "--nnodes", std::to_string(nodes), "--node-rank", std::to_string(n), "--rdzv-dir",
        dir + "/rdzv", "--grace", "2"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"--", "/bin/sh", "-c", program});
    launchers.push_back(StartZeroRun(args, absl::StrCat(dir, "/out", n)));
  }
  std::vector<NodeRun> out(launchers.size());
  for (size_t n = 0; n < launchers.size(); ++n) {
    out[n].status = WaitExit(launchers[n], absl::Seconds(90));
    if (!out[n].status) ::kill(launchers[n], SIGKILL);
    out[n].out = ReadFile(absl::StrCat(dir, "/out", n));
  }
  return out;
}

TEST(ZeroRunNodes, AFailureOnOneNodeRestartsEveryNode) {
  const std::string dir = TempDir("zero-run-nodes");
  const char* rank_program =
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then [ \"$RANK\" = 3 ] && exit 3; sleep 1000; fi; "
      "echo \"attempt $TORCHELASTIC_RESTART_COUNT rank $RANK of $WORLD_SIZE local $LOCAL_RANK of $LOCAL_WORLD_SIZE "
      "node $GROUP_RANK of $GROUP_WORLD_SIZE store $ZERO_STORE_DIR job $ZERO_JOB_ID\"";
  const std::vector<NodeRun> runs = RunNodes(dir, {"--max-restarts", "2"}, rank_program);
  for (int n = 0; n < 2; ++n) {
    const std::string& out = runs[n].out;
    ASSERT_TRUE(runs[n].status.has_value()) << "node " << n << ": " << out;
    EXPECT_TRUE(WIFEXITED(*runs[n].status) && WEXITSTATUS(*runs[n].status) == 0) << out;
    EXPECT_NE(out.find(absl::StrCat("zero-run: node ", n, " of 2 runs ranks ", 2 * n, "-", 2 * n + 1, " of 4")),
              std::string::npos)
        << out;
    EXPECT_EQ(CountOf(out, absl::StrCat("zero-run: node ", n, ": restarting all 2 rank(s) of 2 nodes")), 1) << out;
    for (int local = 0; local < 2; ++local) {
      const int r = 2 * n + local;
      EXPECT_TRUE(std::regex_search(
          out, std::regex(absl::StrCat(R"(\[r)", r, R"(\] attempt 1 rank )", r, " of 4 local ", local, R"( of 2 node )",
                                       n, R"( of 2 store \S+/rdzv/attempt-1 job rdzv)"))))
          << out;
    }
  }
  EXPECT_NE(runs[0].out.find("zero-run: node 0: a rank of another node failed"), std::string::npos) << runs[0].out;
  EXPECT_NE(runs[1].out.find("zero-run: rank 3 exited with code 3"), std::string::npos) << runs[1].out;
  EXPECT_NE(runs[0].out.find("attempt 0 ended: [node 0 failed "), std::string::npos) << runs[0].out;
  EXPECT_NE(runs[0].out.find("[node 1 failed 3]"), std::string::npos) << runs[0].out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/rdzv")) << "the last agent out removes the folder";
  std::filesystem::remove_all(dir);
}

// The restarts are bounded on every node alike, and a node whose ranks were only stopped because another node's
// rank failed exits with that rank's code.
TEST(ZeroRunNodes, RestartsAreBoundedOnEveryNode) {
  const std::string dir = TempDir("zero-run-nodes-spent");
  const std::vector<NodeRun> runs =
      RunNodes(dir, {"--max-restarts", "1"},
               "echo \"try $TORCHELASTIC_RESTART_COUNT\"; [ \"$RANK\" = 2 ] && exit 3; sleep 1000");
  for (int n = 0; n < 2; ++n) {
    ASSERT_TRUE(runs[n].status.has_value()) << runs[n].out;
    EXPECT_TRUE(WIFEXITED(*runs[n].status) && WEXITSTATUS(*runs[n].status) == 3) << runs[n].out;
    EXPECT_EQ(CountOf(runs[n].out, "restarting all 2 rank(s) of 2 nodes"), 1) << runs[n].out;
  }
  EXPECT_EQ(CountOf(runs[1].out, "[r2] try "), 2) << runs[1].out;
  std::filesystem::remove_all(dir);
}

// A node whose agent never comes is named after --rdzv-timeout, instead of a job that waits forever; and the flags
// that go together are checked.
TEST(ZeroRunNodes, AMissingNodeIsNamedAndFlagsAreChecked) {
  const std::string dir = TempDir("zero-run-nodes-missing");
  const pid_t launcher = StartZeroRun({"-n", "1", "--nnodes", "2", "--node-rank", "0", "--rdzv-dir", dir + "/rdzv",
                                       "--rdzv-timeout", "1", "--", "/bin/true"},
                                      dir + "/out");
  auto status = WaitExit(launcher, absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  std::string out = ReadFile(dir + "/out");
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << out;
  EXPECT_NE(out.find("no zero-run.node.0.1 from the other agents within 1 s (--rdzv-timeout)"), std::string::npos)
      << out;
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--nnodes", "2", "--node-rank", "0"},
        {"--nnodes", "2", "--node-rank", "2", "--rdzv-dir", dir},
        {"--node-rank", "1", "--rdzv-dir", dir},
        {"--nnodes", "2", "--node-rank", "0", "--rdzv-dir", dir, "--max-restarts", "1", "--min-nproc", "1"}}) {
    std::vector<std::string> args = {"-n", "2"};
    args.insert(args.end(), bad.begin(), bad.end());
    args.insert(args.end(), {"--", "/bin/true"});
    const pid_t p = StartZeroRun(args, dir + "/out");
    status = WaitExit(p, absl::Seconds(30));
    ASSERT_TRUE(status.has_value());
    out = ReadFile(dir + "/out");
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << bad[0] << ": " << out;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
