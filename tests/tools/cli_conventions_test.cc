// The command-line conventions every program a user runs keeps (issue 33): `--help` prints usage to stdout and
// exits 0 with nothing on stderr; an unknown flag is named as unknown; a known flag missing its value "needs a
// value"; both usage errors exit 2 with a pointer to the usage on stderr. One test per program, so a regression
// names the program. The paths come from CMake ($<TARGET_FILE:...>), one macro per program that is built.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "support/files.h"

namespace {

struct Program {
  std::string name;
  std::string path;
  // A flag that takes a value, given last with none; empty where the program has no such flag.
  std::string value_flag;
  // Arguments before the flag under test, for programs whose grammar starts with a command (zero-ckpt).
  std::vector<std::string> prefix;
};

// gtest names a failing parameter by this (the default prints the struct's bytes).
void PrintTo(const Program& p, std::ostream* os) { *os << p.name; }

std::vector<Program> Programs() {
  std::vector<Program> p;
#ifdef ZERO_CLI_RUN
  p.push_back({"zero-run", ZERO_CLI_RUN, "-n", {}});
#endif
#ifdef ZERO_CLI_CONFIG
  p.push_back({"zero-config", ZERO_CLI_CONFIG, "--world", {}});
#endif
#ifdef ZERO_CLI_CKPT
  p.push_back({"zero-ckpt", ZERO_CLI_CKPT, "--tag", {"inspect", "dir"}});
#endif
#ifdef ZERO_CLI_IO_BENCH
  p.push_back({"zero-io-bench", ZERO_CLI_IO_BENCH, "--size", {"dir"}});
#endif
#ifdef ZERO_CLI_ESTIMATE
  p.push_back({"zero-estimate", ZERO_CLI_ESTIMATE, "--layers", {}});
#endif
#ifdef ZERO_CLI_GPT
  p.push_back({"zero-gpt", ZERO_CLI_GPT, "--steps", {}});
#endif
#ifdef ZERO_CLI_DEMO
  p.push_back({"zero-demo", ZERO_CLI_DEMO, "--world", {}});
#endif
#ifdef ZERO_CLI_FLAT_TRAINER
  p.push_back({"zero-flat-trainer", ZERO_CLI_FLAT_TRAINER, "--steps", {}});
#endif
#ifdef ZERO_CLI_TORCH_LM
  p.push_back({"zero-torch-lm", ZERO_CLI_TORCH_LM, "--steps", {}});
#endif
#ifdef ZERO_CLI_MLP
  p.push_back({"zero-mlp", ZERO_CLI_MLP, "", {}});
#endif
#ifdef ZERO_CLI_SHARDED_MLP
  p.push_back({"zero-sharded-mlp", ZERO_CLI_SHARDED_MLP, "", {}});
#endif
#ifdef ZERO_CLI_BENCH_OPTIM
  p.push_back({"zero-bench-optim", ZERO_CLI_BENCH_OPTIM, "--params", {}});
#endif
#ifdef ZERO_CLI_BENCH_COMM
  p.push_back({"zero-bench-comm", ZERO_CLI_BENCH_COMM, "--world", {}});
#endif
#ifdef ZERO_CLI_BENCH_HOST_KERNELS
  p.push_back({"zero-bench-host-kernels", ZERO_CLI_BENCH_HOST_KERNELS, "--simd", {}});
#endif
#ifdef ZERO_CLI_BENCH_PARITY
  p.push_back({"zero-bench-parity", ZERO_CLI_BENCH_PARITY, "--world", {}});
#endif
#ifdef ZERO_CLI_BENCH_INIT_SYNC
  p.push_back({"zero-bench-init-sync", ZERO_CLI_BENCH_INIT_SYNC, "--world", {}});
#endif
#ifdef ZERO_CLI_BENCH_CKPT
  p.push_back({"zero-bench-ckpt", ZERO_CLI_BENCH_CKPT, "--world", {}});
#endif
#ifdef ZERO_CLI_BENCH_GPU
  p.push_back({"zero-bench-gpu", ZERO_CLI_BENCH_GPU, "--iters", {}});
#endif
  return p;
}

struct Outcome {
  int exit_code = -1;  // -1: killed by a signal or past the time limit
  std::string out, err;
};

// Runs `path args...` with stdout and stderr in files of their own; a usage error must come back at once, so a
// program still running after a minute counts as a failure (it went on to do work).
Outcome RunProgram(const std::string& path, const std::vector<std::string>& args) {
  const std::string dir = zero::testing::MakeTempDir("cli");
  const std::string out = dir + "/out", err = dir + "/err";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
    ::dup2(::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
    ::chdir(dir.c_str());  // anything a program writes by default lands in the temporary folder
    std::vector<std::string> copy = args;
    std::vector<char*> argv = {const_cast<char*>(path.c_str())};
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  Outcome r;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
      break;
    }
    if (absl::Now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  r.out = zero::testing::ReadWholeFile(out);
  r.err = zero::testing::ReadWholeFile(err);
  return r;
}

// True if one line of `text` holds every one of `needles`.
bool OneLineHolds(const std::string& text, const std::vector<std::string>& needles) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    bool all = true;
    for (const auto& n : needles) all = all && line.find(n) != absl::string_view::npos;
    if (all) return true;
  }
  return false;
}

// A usage error points at the usage: the usage itself or "--help".
bool PointsAtUsage(const std::string& err) {
  const std::string lower = absl::AsciiStrToLower(err);
  return lower.find("usage") != std::string::npos || lower.find("--help") != std::string::npos;
}

class CliConventionsTest : public ::testing::TestWithParam<Program> {};

TEST_P(CliConventionsTest, HelpGoesToStdoutAndExitsZero) {
  const Program& p = GetParam();
  for (const std::string flag : {"--help", "-h"}) {
    const Outcome r = RunProgram(p.path, {flag});
    EXPECT_EQ(r.exit_code, 0) << p.name << " " << flag << "\nstderr: " << r.err;
    EXPECT_NE(r.out.find("usage"), std::string::npos) << p.name << " " << flag << "\nstdout: " << r.out;
    EXPECT_EQ(r.err, "") << p.name << " " << flag;
  }
}

TEST_P(CliConventionsTest, UnknownFlagIsNamedAsUnknown) {
  const Program& p = GetParam();
  // Alone (where a parser that wants a value for every flag says "needs a value") and before a known flag.
  std::vector<std::vector<std::string>> cases = {{"--definitely-not-a-flag"}, {"--definitely-not-a-flag", "x"}};
  for (auto args : cases) {
    args.insert(args.begin(), p.prefix.begin(), p.prefix.end());
    const Outcome r = RunProgram(p.path, args);
    const std::string what = p.name + " " + absl::StrJoin(args, " ");
    EXPECT_EQ(r.exit_code, 2) << what << "\nstderr: " << r.err;
    EXPECT_TRUE(OneLineHolds(r.err, {"unknown", "--definitely-not-a-flag"})) << what << "\nstderr: " << r.err;
    EXPECT_EQ(r.err.find("needs a value"), std::string::npos) << what << "\nstderr: " << r.err;
    EXPECT_TRUE(PointsAtUsage(r.err)) << what << "\nstderr: " << r.err;
  }
}

TEST_P(CliConventionsTest, KnownFlagWithoutItsValueNeedsAValue) {
  const Program& p = GetParam();
  if (p.value_flag.empty()) GTEST_SKIP() << p.name << " has no flag that takes a value";
  std::vector<std::string> args = p.prefix;
  args.push_back(p.value_flag);
  const Outcome r = RunProgram(p.path, args);
  const std::string what = p.name + " " + absl::StrJoin(args, " ");
  EXPECT_EQ(r.exit_code, 2) << what << "\nstderr: " << r.err;
  EXPECT_TRUE(OneLineHolds(r.err, {p.value_flag + " needs a value"})) << what << "\nstderr: " << r.err;
  EXPECT_EQ(r.err.find("unknown"), std::string::npos) << what << "\nstderr: " << r.err;
  EXPECT_TRUE(PointsAtUsage(r.err)) << what << "\nstderr: " << r.err;
}

#ifdef ZERO_CLI_RUN
// zero-run's own flags end at "--": what follows goes to the ranks untouched, --help and unknown flags included.
TEST(ZeroRunCliTest, PassesEverythingAfterTheSeparator) {
  const Outcome r = RunProgram(ZERO_CLI_RUN, {"-n", "1", "--", "/bin/echo", "--help", "--definitely-not-a-flag", "-n"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("--help --definitely-not-a-flag -n"), std::string::npos) << r.out << r.err;
  EXPECT_EQ((r.out + r.err).find("usage"), std::string::npos) << r.out << r.err;
}
#endif

std::string ProgramName(const ::testing::TestParamInfo<Program>& info) {
  std::string n = info.param.name;
  for (char& c : n) {
    if (c == '-') c = '_';
  }
  return n;
}

INSTANTIATE_TEST_SUITE_P(Programs, CliConventionsTest, ::testing::ValuesIn(Programs()), ProgramName);

}  // namespace
