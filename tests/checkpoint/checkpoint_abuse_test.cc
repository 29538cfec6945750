// Checkpoint folders and the tools under abuse (issue 32's cases 2, 3, 6, 7, 9, 10, library side and zero-ckpt):
// an output inside the checkpoint being read is refused; a reshard in place leaves nothing of the old world; a
// folder of complete checkpoints without a usable `latest` is never "no checkpoint"; a FIFO where a checkpoint
// file belongs is refused, not waited on; names from files are printed escaped; a bad trainer state fails Load on
// every rank; ranks asking for different tags fail before writing; leftovers of a killed save go at the next save of
// the tag, verify names unlisted files, and `zero-ckpt clean` removes them.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "support/engine_helpers.h"
#include "support/files.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/checkpoint.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::Borrow;
using ::testing::HasSubstr;
using testing::ReadWholeFile;
using testing::StatusIs;
using testing::TrainConfig;
using testing::WriteWholeFile;

// Two checkpoints (step-00000001, step-00000002) of the synthetic model at world 2, stage 2, fp32.
std::string SaveTwo() {
  const std::string dir = testing::MakeTempDir("zero_ckpta");
  testing::RunRanks(2, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(TrainConfig(2, 1), Borrow(comm)));
    testing::SyntheticTrace t;
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 1, 1, testing::HostViewIo(), &t));
    ASSERT_OK(e->Save(dir).status());
    ASSERT_NO_FATAL_FAILURE(testing::TrainSynthetic(*e, 1, 1, testing::HostViewIo(), &t));
    ASSERT_OK(e->Save(dir).status());
  });
  return dir;
}

// Loads DIR (no tag) into a fresh world-1 engine of the same model.
StatusOr<LoadResult> LoadInto(const std::string& dir, const LoadOptions& options = {}) {
  StatusOr<LoadResult> out = absl::UnknownError("not run");
  testing::RunRanks(1, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(TrainConfig(2, 1), Borrow(comm)));
    out = e->Load(dir, options);
  });
  return out;
}

bool NoControlBytes(const std::string& s) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 && c != '\n') return false;
  }
  return true;
}

// Case 3 (library): no usable `latest` beside complete checkpoints is an error naming the newest, whatever is
// wrong with `latest`; "no checkpoint" (kNotFound) only for a folder without any.
TEST(ResumeRuleTest, CompleteCheckpointsWithoutUsableLatestAreNeverNothing) {
  const std::string dir = SaveTwo();
  ASSERT_FALSE(HasFailure());
  const std::string latest = dir + "/latest";
  ASSERT_OK_AND_ASSIGN(std::string tag, ResumeCheckpointTag(dir));
  EXPECT_EQ(tag, "step-00000002");
  // Missing, a symlink loop, a FIFO, bytes that name no folder (an escape sequence, a carriage return).
  const std::vector<std::pair<std::string, std::function<void()>>> damages = {
      {"missing", [&] { ::unlink(latest.c_str()); }},
      {"symlink loop", [&] { ASSERT_EQ(0, ::symlink("latest", latest.c_str())); }},
      {"FIFO", [&] { ASSERT_EQ(0, ::mkfifo(latest.c_str(), 0644)); }},
      {"escape", [&] { WriteWholeFile(latest, "\x1b[2J\x1b[31mstep-00000001\n"); }},
      {"CRLF", [&] { WriteWholeFile(latest, "step-00000001\r\n"); }},
  };
  for (const auto& [what, damage] : damages) {
    ::unlink(latest.c_str());
    damage();
    const StatusOr<std::string> r = ResumeCheckpointTag(dir);
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("the newest " + dir + "/step-00000002")))
        << what;
    EXPECT_TRUE(NoControlBytes(std::string(r.status().message()))) << what << ": " << r.status();
    // Engine::Load with no tag follows the same rule; with the tag it names, it loads.
    EXPECT_THAT(LoadInto(dir), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("step-00000002"))) << what;
    ASSERT_OK_AND_ASSIGN(LoadResult lr, LoadInto(dir, {.tag = "step-00000002"}));
    EXPECT_EQ(lr.step, 2);
  }
  // What the FIFO and the escape say about themselves.
  ::unlink(latest.c_str());
  ASSERT_EQ(0, ::mkfifo(latest.c_str(), 0644));
  EXPECT_THAT(LatestCheckpointTag(dir), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is a FIFO")));
  ::unlink(latest.c_str());
  WriteWholeFile(latest, "\x1b[31mstep-1\r\n");
  EXPECT_THAT(LatestCheckpointTag(dir), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("\\x1b[31mstep-1\\x0d")));
  // Nothing complete: no `latest` is "no checkpoint" (a run starts), an incomplete save changes nothing.
  const std::string empty = testing::MakeTempDir("zero_ckpta");
  EXPECT_THAT(ResumeCheckpointTag(empty), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_EQ(0, ::mkdir((empty + "/step-00000001").c_str(), 0755));
  WriteWholeFile(empty + "/step-00000001/rank-00000-of-00001.bin.tmp.1", "x");
  EXPECT_THAT(ResumeCheckpointTag(empty), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(LoadInto(empty), StatusIs(absl::StatusCode::kNotFound));
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(empty);
}

// Case 7: a FIFO as meta.json or as a rank file is refused at once, not waited on forever.
TEST(ResumeRuleTest, FifosWhereCheckpointFilesBelongAreRefused) {
  const std::string dir = SaveTwo();
  ASSERT_FALSE(HasFailure());
  const std::string rank1 = dir + "/step-00000002/rank-00001-of-00002.bin";
  ASSERT_EQ(0, ::unlink(rank1.c_str()));
  ASSERT_EQ(0, ::mkfifo(rank1.c_str(), 0644));
  EXPECT_THAT(VerifyCheckpoint(dir), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is a FIFO")));
  const std::string meta = dir + "/step-00000001/meta.json";
  ASSERT_EQ(0, ::unlink(meta.c_str()));
  ASSERT_EQ(0, ::mkfifo(meta.c_str(), 0644));
  EXPECT_THAT(VerifyCheckpoint(dir, "step-00000001"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("meta.json is a FIFO")));
  std::filesystem::remove_all(dir);
}

// Case 6 (library): LoadOptions::check_trainer_state's error on one rank fails the Load on every rank, at once.
TEST(TrainerStateTest, ABadValueOnOneRankFailsLoadEverywhere) {
  const std::string dir = testing::MakeTempDir("zero_ckpta");
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(TrainConfig(2, 1), Borrow(comm)));
    ASSERT_OK(e->Save(dir, {.trainer_state = {{"next_step", rank == 1 ? "abc" : "3"}}}).status());
    LoadOptions lo;
    lo.check_trainer_state = [](const TrainerState& ts) { return TrainerStateInt(ts, "next_step", 0, 100).status(); };
    const StatusOr<LoadResult> r = e->Load(dir, lo);
    ASSERT_FALSE(r.ok());
    if (rank == 1) {
      EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                              HasSubstr("\"next_step\" is \"abc\", not an integer in [0, 100]")));
    } else {
      EXPECT_THAT(r, StatusIs(absl::StatusCode::kAborted, HasSubstr("failed on rank 1")));
    }
  });
  EXPECT_THAT(TrainerStateInt({{"next_step", "-5"}}, "next_step", 0, 100),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is \"-5\", not an integer in [0, 100]")));
  EXPECT_THAT(TrainerStateInt({{"next_step", "\x1b[0m7"}}, "next_step", 0, 100),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\\x1b[0m7")));
  EXPECT_THAT(TrainerStateInt({}, "next_step", 0, 100), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK_AND_ASSIGN(const int64_t v, TrainerStateInt({{"next_step", "42"}}, "next_step", 0, 100));
  EXPECT_EQ(v, 42);
  std::filesystem::remove_all(dir);
}

// Ranks that ask Save for different tags (DeepSpeed's checkpoint.tag_validation): every rank fails before writing
// anything, naming both tags; `latest` still names the checkpoint before, which loads; a save with one tag then
// goes through. Sync and async alike.
TEST(TagTest, RanksSavingUnderDifferentTagsFailEverywhereAndWriteNothing) {
  const std::string dir = testing::MakeTempDir("zero_ckpta");
  testing::RunRanks(2, [&](Communicator& comm, int rank) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(TrainConfig(2, 1), Borrow(comm)));
    ASSERT_OK(e->Save(dir, {.tag = "good"}).status());
    for (const bool async : {false, true}) {
      const StatusOr<std::string> r = e->Save(dir, {.tag = rank == 0 ? "mine" : "theirs", .async = async});
      EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                              ::testing::AllOf(HasSubstr("different tags"), HasSubstr("rank 0 \"mine\""),
                                               HasSubstr("rank 1 \"theirs\""))));
    }
    ASSERT_OK(e->WaitForSave());
    ASSERT_OK_AND_ASSIGN(LoadResult loaded, e->Load(dir));
    EXPECT_EQ(loaded.tag, "good");
  });
  EXPECT_FALSE(std::filesystem::exists(dir + "/mine"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/theirs"));
  ASSERT_OK_AND_ASSIGN(std::string latest, LatestCheckpointTag(dir));
  EXPECT_EQ(latest, "good");
}

// Case 10 (library): a killed save's temporaries and another world's rank files in the tag's folder are removed
// by the next successful save of that tag; UnlistedCheckpointFiles names what is left otherwise.
TEST(LeftoversTest, ASaveRemovesEarlierAttemptsLeftovers) {
  const std::string dir = testing::MakeTempDir("zero_ckpta");
  const std::string folder = dir + "/step-00000000";
  ASSERT_EQ(0, ::mkdir(folder.c_str(), 0755));
  for (const char* f : {"rank-00000-of-00002.bin.tmp.99999", "rank-00003-of-00004.bin", "meta.json.tmp.99999"}) {
    WriteWholeFile(folder + "/" + f, "left by a killed save");
  }
  testing::RunRanks(2, [&](Communicator& comm, int) {
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(TrainConfig(2, 1), Borrow(comm)));
    ASSERT_OK(e->Save(dir).status());
  });
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> stray, UnlistedCheckpointFiles(dir));
  EXPECT_TRUE(stray.empty()) << stray.front();
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(folder)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"meta.json", "rank-00000-of-00002.bin", "rank-00001-of-00002.bin"}));
  WriteWholeFile(folder + "/notes.txt", "mine");
  ASSERT_OK_AND_ASSIGN(stray, UnlistedCheckpointFiles(dir));
  EXPECT_EQ(stray, std::vector<std::string>{"notes.txt"});
  std::filesystem::remove_all(dir);
}

#ifdef ZERO_CKPT_TOOL
// zero-ckpt ARGS under `timeout` (the old tools blocked forever on a FIFO: the test then fails, it does not hang).
std::pair<int, std::string> RunTool(const std::string& args) {
  FILE* p = ::popen(("timeout 60 " + std::string(ZERO_CKPT_TOOL) + " " + args + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// Case 2: export onto meta.json, a rank file, `latest`, a symlink to meta.json or a hard link of a rank file,
// and reshard into the checkpoint's folder, are refused; the checkpoint is untouched and verifies.
TEST(ZeroCkptAbuseTest, NoOutputInsideTheCheckpointItReads) {
  const std::string dir = SaveTwo();
  ASSERT_FALSE(HasFailure());
  const std::string folder = dir + "/step-00000002";
  const std::string meta = ReadWholeFile(folder + "/meta.json");
  const std::string rank0 = ReadWholeFile(folder + "/rank-00000-of-00002.bin");
  ASSERT_EQ(0, ::symlink((folder + "/meta.json").c_str(), (dir + "/to-meta").c_str()));
  ASSERT_EQ(0, ::link((folder + "/rank-00000-of-00002.bin").c_str(), (dir + "/hard.bin").c_str()));
  for (const std::string& out :
       {folder + "/meta.json", folder + "/rank-00000-of-00002.bin", dir + "/latest", dir + "/to-meta",
        dir + "/hard.bin", folder + "/new.safetensors", dir + "/step-00000001/x.safetensors",
        dir + "/../" + std::filesystem::path(dir).filename().string() + "/step-00000002/meta.json"}) {
    auto [rc, text] = RunTool("export " + dir + " " + out);
    EXPECT_EQ(rc, 1) << out << ": " << text;
    EXPECT_NE(text.find("of the checkpoint"), std::string::npos) << out << ": " << text;
  }
  auto [rc, text] = RunTool("reshard " + dir + " " + folder + " --world 3");
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("inside checkpoint folder step-00000002"), std::string::npos) << text;
  EXPECT_EQ(ReadWholeFile(folder + "/meta.json"), meta);
  EXPECT_EQ(ReadWholeFile(folder + "/rank-00000-of-00002.bin"), rank0);
  EXPECT_EQ(ReadWholeFile(dir + "/latest"), "step-00000002\n");
  ASSERT_OK(VerifyCheckpoint(dir));
  // Beside the checkpoint folders (not in them) is allowed, as before.
  std::tie(rc, text) = RunTool("export " + dir + " " + dir + "/w.safetensors");
  EXPECT_EQ(rc, 0) << text;
  std::filesystem::remove_all(dir);
}

// Cases 2 and 10: a reshard in place replaces the folder whole: the new world's files only, and it verifies.
TEST(ZeroCkptAbuseTest, ReshardInPlaceLeavesNothingOfTheOldWorld) {
  const std::string dir = SaveTwo();
  ASSERT_FALSE(HasFailure());
  auto [rc, text] = RunTool("reshard " + dir + " " + dir + " --world 3 --stage 3");
  ASSERT_EQ(rc, 0) << text;
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/step-00000002")) {
    names.push_back(e.path().filename());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"meta.json", "rank-00000-of-00003.bin", "rank-00001-of-00003.bin",
                                             "rank-00002-of-00003.bin"}));
  std::tie(rc, text) = RunTool("verify " + dir);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_EQ(text.find("does not list"), std::string::npos) << text;
  std::tie(rc, text) = RunTool("inspect " + dir);
  EXPECT_NE(text.find("world size 3, stage 3"), std::string::npos) << text;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  }
  ASSERT_OK_AND_ASSIGN(LoadResult lr, LoadInto(dir));
  EXPECT_EQ(lr.saved_world_size, 3);
  std::filesystem::remove_all(dir);
}

// Case 9: worlds that are no world, or whose ranks would hold nothing, and stages that are no stage: refused
// with the reason and the range, and nothing written.
TEST(ZeroCkptAbuseTest, ReshardRangeChecksSayWhatIsWrong) {
  const std::string dir = SaveTwo();
  ASSERT_FALSE(HasFailure());
  const std::string out = dir + "/out";
  auto [rc, text] = RunTool("reshard " + dir + " " + out + " --world 100000");
  EXPECT_EQ(rc, 1) << text;
  // The synthetic model's largest unit: d, 64 x 33 = 2112 elements, 66 blocks of 32.
  EXPECT_NE(text.find("largest unit (d) has blocks of 32 elements (66)"), std::string::npos) << text;
  EXPECT_NE(text.find("[1, 66]"), std::string::npos) << text;
  EXPECT_FALSE(std::filesystem::exists(out));
  std::tie(rc, text) = RunTool("reshard " + dir + " " + out + " --world 66");
  EXPECT_EQ(rc, 0) << text;
  std::tie(rc, text) = RunTool("reshard " + dir + " " + out + " --world 0");
  EXPECT_EQ(rc, 2) << text;
  EXPECT_NE(text.find("--world 0: not a world size in [1, 1048576]"), std::string::npos) << text;
  EXPECT_EQ(text.find("usage:"), std::string::npos) << text;
  std::tie(rc, text) = RunTool("reshard " + dir + " " + out + " --world 2 --stage 5");
  EXPECT_EQ(rc, 2) << text;
  EXPECT_NE(text.find("--stage 5: not a stage (0, 1, 2 or 3)"), std::string::npos) << text;
  std::filesystem::remove_all(dir);
}

// Case 10: verify names the files meta.json does not list (and still says ok); clean removes them, the
// temporaries of killed saves and folders of saves that never finished, and leaves complete checkpoints loading.
TEST(ZeroCkptAbuseTest, VerifyNamesStrayFilesAndCleanRemovesThem) {
  const std::string dir = SaveTwo();
  ASSERT_FALSE(HasFailure());
  const std::string folder = dir + "/step-00000002";
  WriteWholeFile(folder + "/rank-00000-of-00002.bin.tmp.4242", "killed");
  WriteWholeFile(folder + "/rank-00003-of-00004.bin", "old world");
  WriteWholeFile(dir + "/latest.tmp.4242", "step-0000000");
  ASSERT_EQ(0, ::mkdir((dir + "/step-00000003").c_str(), 0755));
  WriteWholeFile(dir + "/step-00000003/rank-00000-of-00002.bin", "never finished");
  ASSERT_EQ(0, ::mkdir((dir + "/exports").c_str(), 0755));
  WriteWholeFile(dir + "/exports/w.safetensors", "not ours");
  auto [rc, text] = RunTool("verify " + dir);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("2 files in the folder that meta.json does not list"), std::string::npos) << text;
  EXPECT_NE(text.find("  rank-00000-of-00002.bin.tmp.4242\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  rank-00003-of-00004.bin\n"), std::string::npos) << text;
  std::tie(rc, text) = RunTool("clean " + dir + " --dry-run");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_TRUE(std::filesystem::exists(folder + "/rank-00003-of-00004.bin"));
  std::tie(rc, text) = RunTool("clean " + dir);
  EXPECT_EQ(rc, 0) << text;
  for (const std::string& gone : {folder + "/rank-00000-of-00002.bin.tmp.4242", folder + "/rank-00003-of-00004.bin",
                                  dir + "/latest.tmp.4242", dir + "/step-00000003"}) {
    EXPECT_FALSE(std::filesystem::exists(gone)) << gone << "\n" << text;
    EXPECT_NE(text.find("removed " + gone), std::string::npos) << text;
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "/exports/w.safetensors"));
  std::filesystem::remove_all(dir + "/exports");  // (verify --all takes every folder for a checkpoint)
  std::tie(rc, text) = RunTool("verify " + dir + " --all");
  EXPECT_EQ(rc, 0) << text;
  std::tie(rc, text) = RunTool("verify " + dir);
  EXPECT_EQ(text.find("does not list"), std::string::npos) << text;
  std::filesystem::remove_all(dir);
}

// Case 7 (tool): a FIFO named `latest` is refused at once; an escape sequence in `latest` is printed escaped.
TEST(ZeroCkptAbuseTest, LatestIsReadOnlyAsARegularFileAndPrintedEscaped) {
  const std::string dir = SaveTwo();
  ASSERT_FALSE(HasFailure());
  const std::string latest = dir + "/latest";
  ASSERT_EQ(0, ::unlink(latest.c_str()));
  ASSERT_EQ(0, ::mkfifo(latest.c_str(), 0644));
  auto [rc, text] = RunTool("inspect " + dir);
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("latest is a FIFO, not a regular file"), std::string::npos) << text;
  EXPECT_NE(text.find("the newest " + dir + "/step-00000002"), std::string::npos) << text;
  ::unlink(latest.c_str());
  WriteWholeFile(latest, "\x1b]0;owned\x07step-00000002\r\n");
  std::tie(rc, text) = RunTool("verify " + dir);
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("\\x1b]0;owned\\x07step-00000002\\x0d"), std::string::npos) << text;
  EXPECT_TRUE(NoControlBytes(text)) << text;
  std::filesystem::remove_all(dir);
}
#endif

}  // namespace
}  // namespace zero
