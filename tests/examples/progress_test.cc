// zero-gpt's and zero-demo's progress: under a pseudo-terminal (util-linux's `script`) one line rewritten in place
// with '\r'; into a pipe plain lines, one per step (zero-gpt) or per half run (zero-demo), never a '\r'; with
// --json nothing but JSON objects on stdout, terminal or not. And zero-demo writes its CSV, its picture where
// gnuplot is installed, and says so where it is not.
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "support/files.h"

namespace {

struct ProgramRun {
  int exit_code = -1;
  std::string out;
};

// Runs `cmd` with its stdout into a pipe (not a terminal); stderr is dropped.
ProgramRun Exec(const std::string& cmd) {
  ProgramRun r;
  FILE* p = ::popen((cmd + " 2>/dev/null").c_str(), "r");
  char buf[4096];
  size_t n;
  while (p != nullptr && (n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = p == nullptr ? -1 : ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool Have(const std::string& tool) { return std::system(("command -v " + tool + " >/dev/null 2>&1").c_str()) == 0; }

// Runs `cmd` with its stdout on a pseudo-terminal: `script` gives it one and copies what it writes ('\n' arrives
// as "\r\n", the terminal's line discipline).
ProgramRun OnTerminal(const std::string& cmd) {
  return Exec(absl::StrCat("script -qec '", cmd, " 2>/dev/null' /dev/null"));
}

size_t Count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// Lines as the terminal shows them: split at '\n', each line's trailing '\r' (the pty's) dropped.
std::vector<std::string> Lines(const std::string& out) {
  std::vector<std::string> lines = absl::StrSplit(out, '\n');
  for (std::string& l : lines) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
  }
  return lines;
}

const std::string kGpt = absl::StrCat(ZERO_GPT, " --model tiny --world 2 --steps 4");

TEST(ProgressTest, GptOnATerminalRewritesOneLine) {
  if (!Have("script")) GTEST_SKIP() << "no script (util-linux) to give the program a pseudo-terminal";
  const ProgramRun r = OnTerminal(kGpt);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // Four steps drawn over each other, each after a carriage return, and none on a line of its own.
  EXPECT_EQ(Count(r.out, "\rstep "), 4u) << r.out;
  for (int k = 1; k <= 4; ++k) EXPECT_NE(r.out.find(absl::StrCat("step ", k, "/4  loss ")), std::string::npos);
  EXPECT_NE(r.out.find(" left"), std::string::npos);
  for (const std::string& l : Lines(r.out)) EXPECT_NE(l.rfind("step ", 0), 0u) << l;
  // The line is ended once training is over, before the report (after the spaces that cover the rest of a longer
  // line drawn before it, when the last step's line is the shorter: "9.6 ms/step" after "14.9 ms/step").
  EXPECT_TRUE(std::regex_search(r.out, std::regex("left *\r\nparams "))) << r.out;
}

TEST(ProgressTest, GptIntoAPipePrintsPlainLines) {
  const ProgramRun r = Exec(kGpt);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find('\r'), std::string::npos);
  const std::vector<std::string> lines = Lines(r.out);
  for (int k = 1; k <= 4; ++k) {
    EXPECT_EQ(lines[k - 1].rfind(absl::StrCat("step ", k, "/4  loss "), 0), 0u) << lines[k - 1];
  }
}

TEST(ProgressTest, JsonStaysJson) {
  std::vector<ProgramRun> runs = {Exec(kGpt + " --json")};
  if (Have("script")) runs.push_back(OnTerminal(kGpt + " --json"));
  for (const ProgramRun& r : runs) {
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_EQ(Count(r.out, "\rstep"), 0u);
    EXPECT_EQ(Count(r.out, " left"), 0u);
    int objects = 0;
    for (const std::string& l : Lines(r.out)) {
      if (l.empty()) continue;
      EXPECT_TRUE(l.front() == '{' && l.back() == '}') << l;
      ++objects;
    }
    EXPECT_EQ(objects, 4 + 1);  // one per step, then the report
  }
}

const std::string kDemo = absl::StrCat(ZERO_DEMO, " --world 2 --steps 2");

TEST(ProgressTest, DemoOnATerminalAndIntoAPipe) {
  const std::string dir = zero::testing::MakeTempDir("zero_demo_progress");
  const ProgramRun piped = Exec(absl::StrCat(kDemo, " --out ", dir, "/piped"));
  ASSERT_EQ(piped.exit_code, 0) << piped.out;
  EXPECT_EQ(piped.out.find('\r'), std::string::npos);
  // Seven runs, each a line at its half and at its end.
  for (int k = 1; k <= 7; ++k) {
    EXPECT_NE(piped.out.find(absl::StrCat("\nrun ", k, "/7 (")), std::string::npos) << k;
  }
  EXPECT_EQ(Count(piped.out, " step 2/2 "), 7u);
  EXPECT_NE(piped.out.find("  estimate "), std::string::npos);  // the table's second line per run

  if (!Have("script")) GTEST_SKIP() << "no script (util-linux) to give the program a pseudo-terminal";
  const ProgramRun tty = OnTerminal(absl::StrCat(kDemo, " --out ", dir, "/tty"));
  ASSERT_EQ(tty.exit_code, 0) << tty.out;
  EXPECT_EQ(Count(tty.out, "\rrun "), 14u) << tty.out;  // 7 runs x 2 steps, one line
  for (const std::string& l : Lines(tty.out)) {
    EXPECT_FALSE(l.rfind("run ", 0) == 0 && l.find(" step ") != std::string::npos) << l;
  }
}

TEST(ProgressTest, DemoWritesItsCsvAndPicture) {
  const std::string dir = zero::testing::MakeTempDir("zero_demo_out");
  const ProgramRun r = Exec(absl::StrCat(kDemo, " --out ", dir));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string csv = zero::testing::ReadWholeFile(dir + "/zero-demo.csv");
  const std::vector<std::string> rows = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_EQ(rows.size(), 1u + 7u) << csv;
  EXPECT_EQ(rows[0].rfind("run,model,world,stage,dtype,recompute,offload,params,", 0), 0u) << rows[0];
  EXPECT_NE(rows[0].find(",est_params,"), std::string::npos);
  EXPECT_NE(rows[0].find(",tokens_per_s"), std::string::npos);
  if (Have("gnuplot")) {
    const std::string png = zero::testing::ReadWholeFile(dir + "/zero-demo.png");
    ASSERT_GT(png.size(), 8u) << r.out;
    EXPECT_EQ(png.substr(1, 3), "PNG");
  }
  // Without gnuplot: the CSV alone, and a message that says how to get the picture.
  const ProgramRun bare = Exec(absl::StrCat("env PATH=/nonexistent ", kDemo, " --out ", dir, "/bare"));
  ASSERT_EQ(bare.exit_code, 0) << bare.out;
  EXPECT_NE(bare.out.find("gnuplot is not installed"), std::string::npos) << bare.out;
  EXPECT_FALSE(zero::testing::ReadWholeFile(dir + "/bare/zero-demo.csv").empty());
  EXPECT_TRUE(zero::testing::ReadWholeFile(dir + "/bare/zero-demo.png").empty());
}

}  // namespace
