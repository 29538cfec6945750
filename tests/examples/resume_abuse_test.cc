// zero-gpt and zero-flat-trainer --resume under abuse, as processes (issue 32's cases 3, 6 and 7): a folder of
// complete checkpoints without a usable `latest` (missing, a symlink loop, a FIFO, escape bytes) is an error
// naming the newest, never "no checkpoint there yet"; a trainer-state next_step that is negative or does not
// parse (in an otherwise valid meta.json) is an error on every rank, neither an abort nor a stall; and a run on an
// empty folder still starts at step 0. Every command runs under `timeout`, so that what blocked or stalled before
// fails here instead of hanging the suite.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/internal/format.h"
#include "gtest/gtest.h"
#include "support/files.h"
#include "support/programs.h"

namespace {

using zero::testing::ProgramRun;
ProgramRun Exec(const std::string& cmd) { return zero::testing::RunProgram(cmd, 120); }

bool NoControlBytes(const std::string& s) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 && c != '\n') return false;
  }
  return true;
}

// Sets every rank's trainer_state[key] in DIR/TAG/meta.json (its checksum recomputed: otherwise valid).
void SetTrainerState(const std::string& folder, const std::string& key, const std::string& rank0,
                     const std::string& others) {
  const std::string path = folder + "/meta.json";
  auto meta = zero::ckpt::MetaFromJson(zero::testing::ReadWholeFile(path), path);
  ASSERT_TRUE(meta.ok()) << meta.status();
  for (size_t r = 0; r < meta->ranks.size(); ++r) meta->ranks[r].trainer_state[key] = r == 0 ? rank0 : others;
  zero::testing::WriteWholeFile(path, zero::ckpt::MetaToJson(*meta));
}

#ifdef ZERO_GPT
const std::string kGpt = absl::StrCat(ZERO_GPT, " --model tiny --seq 32 --world 2 --stage 2 --json");

// Saves step-00000001 and step-00000002 into a fresh folder.
std::string SavedTwo() {
  const std::string dir = zero::testing::MakeTempDir("zero_resumea");
  const ProgramRun r = Exec(kGpt + " --steps 2 --save " + dir + " --save-every 1");
  EXPECT_EQ(r.code, 0) << r.output;
  return dir;
}

TEST(GptResumeAbuseTest, NoUsableLatestBesideCompleteCheckpointsIsAnErrorNamingTheNewest) {
  const std::string dir = SavedTwo();
  ASSERT_FALSE(HasFailure());
  const std::string latest = dir + "/latest";
  const std::pair<const char*, std::function<void()>> cases[] = {
      {"missing", [] {}},
      {"symlink loop", [&] { ASSERT_EQ(0, ::symlink("latest", latest.c_str())); }},
      {"FIFO", [&] { ASSERT_EQ(0, ::mkfifo(latest.c_str(), 0644)); }},
      {"escape and CRLF", [&] { zero::testing::WriteWholeFile(latest, "\x1b[2Jstep-00000002\r\n"); }},
  };
  for (const auto& [what, damage] : cases) {
    ::unlink(latest.c_str());
    damage();
    const ProgramRun r = Exec(kGpt + " --steps 4 --resume " + dir + " --save " + dir);
    EXPECT_TRUE(r.exited) << what << ": " << r.output;
    EXPECT_EQ(r.code, 1) << what << ": " << r.output;
    EXPECT_EQ(r.output.find("no checkpoint there yet"), std::string::npos) << what << ": " << r.output;
    EXPECT_EQ(r.output.find("{\"step\": "), std::string::npos) << what << ": trained anyway\n" << r.output;
    EXPECT_NE(r.output.find("the newest " + dir + "/step-00000002"), std::string::npos) << what << ": " << r.output;
    EXPECT_NE(r.output.find("echo step-00000002 > " + dir + "/latest"), std::string::npos) << what << ": " << r.output;
    EXPECT_TRUE(NoControlBytes(r.output)) << what << ": " << r.output;
  }
  // Made the latest as the message says, the run resumes at step 3.
  ::unlink(latest.c_str());
  zero::testing::WriteWholeFile(latest, "step-00000002\n");
  const ProgramRun r = Exec(kGpt + " --steps 3 --resume " + dir);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("{\"step\": 3,"), std::string::npos) << r.output;
  // A folder with no checkpoint at all is still a start from step 0.
  const std::string empty = zero::testing::MakeTempDir("zero_resumea");
  const ProgramRun fresh = Exec(kGpt + " --steps 1 --resume " + empty);
  EXPECT_EQ(fresh.code, 0) << fresh.output;
  EXPECT_NE(fresh.output.find("no checkpoint there yet; starting at step 0"), std::string::npos) << fresh.output;
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(empty);
}

TEST(GptResumeAbuseTest, ABadNextStepIsAnErrorOnEveryRankNotAnAbortOrAStall) {
  const std::string dir = SavedTwo();
  ASSERT_FALSE(HasFailure());
  // Negative on every rank: aborted zero-gpt (SIGABRT) before.
  ASSERT_NO_FATAL_FAILURE(SetTrainerState(dir + "/step-00000002", "next_step", "-5", "-5"));
  ProgramRun r = Exec(kGpt + " --steps 4 --resume " + dir);
  EXPECT_TRUE(r.exited) << r.output;
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("\"next_step\" is \"-5\", not an integer in [0, "), std::string::npos) << r.output;
  // Not a number on rank 1 only: rank 0 went on into a collective and waited out the timeout before.
  ASSERT_NO_FATAL_FAILURE(SetTrainerState(dir + "/step-00000002", "next_step", "2", "two\x1b[0m"));
  r = Exec(kGpt + " --steps 4 --resume " + dir);
  EXPECT_TRUE(r.exited) << r.output;
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("\"next_step\" is \"two\\x1b[0m\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("failed on rank 1"), std::string::npos) << r.output;  // rank 0's error names it
  EXPECT_EQ(r.output.find("{\"step\": "), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}

#ifdef ZERO_RUN_PATH
// The same as processes under zero-run: each rank reads `latest` itself, and each refuses.
TEST(GptResumeAbuseTest, UnderZeroRunEveryRankRefuses) {
  const std::string dir = SavedTwo();
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(0, ::unlink((dir + "/latest").c_str()));
  const std::string gpt = absl::StrCat(ZERO_GPT, " --model tiny --seq 32 --stage 2 --json");
  ProgramRun r = Exec(absl::StrCat(ZERO_RUN_PATH, " -n 2 -- ", gpt, " --steps 4 --resume ", dir, " --save ", dir));
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("no checkpoint there yet"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the newest " + dir + "/step-00000002"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-00000003")) << r.output;
  zero::testing::WriteWholeFile(dir + "/latest", "step-00000002\n");
  ASSERT_NO_FATAL_FAILURE(SetTrainerState(dir + "/step-00000002", "next_step", "2", "x"));
  r = Exec(absl::StrCat(ZERO_RUN_PATH, " -n 2 -- ", gpt, " --steps 4 --resume ", dir));
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("\"next_step\" is \"x\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("failed on rank 1"), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}
#endif
#endif

#ifdef ZERO_FLAT_TRAINER
TEST(FlatTrainerResumeAbuseTest, SameRules) {
  const std::string dir = zero::testing::MakeTempDir("zero_resumea");
  const std::string base = absl::StrCat(ZERO_FLAT_TRAINER, " --zero --world 2 --stage 2 --json");
  ProgramRun r = Exec(base + " --steps 2 --save " + dir + " --save-every 1");
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_EQ(0, ::unlink((dir + "/latest").c_str()));
  r = Exec(base + " --steps 4 --resume " + dir);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("the newest " + dir + "/step-00000002"), std::string::npos) << r.output;
  zero::testing::WriteWholeFile(dir + "/latest", "step-00000002\n");
  ASSERT_NO_FATAL_FAILURE(SetTrainerState(dir + "/step-00000002", "next_step", "-5", "-5"));
  r = Exec(base + " --steps 4 --resume " + dir);
  EXPECT_TRUE(r.exited) << r.output;
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("\"next_step\" is \"-5\", not an integer in [1, "), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}
#endif

}  // namespace
