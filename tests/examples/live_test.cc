// Live recovery (zero/elastic.h) as a user runs it: zero-run --live-groups 2 over four zero-gpt --live processes,
// two replica groups of two. One rank of the first incarnation is killed (SIGKILL) or stopped (SIGSTOP) inside
// a step's all-reduce across the groups (ZERO_TEST_FAULT, core/internal/fault.h); zero-run stops and restarts only
// that rank's group, the other group drops the step, trains on alone, and admits the restarted group at a step
// boundary with a copy of its state. The job must reach its last step with every rank's final parameters
// bitwise equal (a hash of every bit, printed by each rank), and the decisions must be the three expected (or, on
// a machine slow to restart the group, the survivors' end before its admission, as zero/elastic.h specifies; the
// thread test tests/elastic/replica_groups_test.cc makes the rejoin happen every time). The
// fault trials at random steps and their timings: bench/scripts/live_trials.py, bench/results/elastic.md.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "support/files.h"
#include "support/programs.h"

namespace {

#if defined(ZERO_GPT) && defined(ZERO_RUN_PATH)

using zero::testing::ProgramRun;
ProgramRun Exec(const std::string& cmd) { return zero::testing::RunProgram(cmd, 180); }

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The run with `fault` (ZERO_TEST_FAULT) in the first incarnation of every group only.
ProgramRun RunLive(const std::string& fault, const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string config = dir + "/live.json";
  std::ofstream(config) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 2, "mics_shard_size": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, "comm_timeout_s": 6})";
  const std::string rank =
      absl::StrCat("if [ \"$ZERO_GROUP_RESTART_COUNT\" = 0 ]; then export ZERO_TEST_FAULT=", fault, "; fi; exec ",
                   ZERO_GPT, " --model tiny --steps 80 --json --live --config ", config);
  return Exec(absl::StrCat(ZERO_RUN_PATH, " -n 4 --live-groups 2 --max-restarts 2 -- /bin/sh -c '", rank, "'"));
}

void ExpectRecovered(const ProgramRun& run, int lost_group) {
  ASSERT_TRUE(run.exited && run.code == 0) << run.output;
  // Only the faulty group was restarted; the other trained on.
  EXPECT_EQ(CountOf(run.output, "zero-run: restarting group"), 1) << run.output;
  EXPECT_EQ(CountOf(run.output, absl::StrCat("zero-run: restarting group ", lost_group, " ")), 1) << run.output;
  // Every rank's final line: the same parameters bit for bit, the last step reached.
  const std::regex final_line(R"re(\[r(\d)\] \{"live": \{"group": (\d), "steps": 80, "first_step": (\d+), )re"
                              R"re("redone_steps": (\d+), "params_hash": "([0-9a-f]{16})")re");
  std::set<std::string> hashes;
  std::set<int> ranks;
  for (std::sregex_iterator it(run.output.begin(), run.output.end(), final_line), end; it != end; ++it) {
    ranks.insert(std::stoi((*it)[1]));
    hashes.insert((*it)[5]);
    const int group = std::stoi((*it)[2]);
    if (group == lost_group) {
      EXPECT_GT(std::stoi((*it)[3]), 0) << "the restarted group continues where the other is: " << (*it)[0];
    } else {
      EXPECT_EQ((*it)[4], "1") << "the survivors redo the step the failure dropped: " << (*it)[0];
    }
  }
  // The decisions, in order: formed, the group lost, and (below) the group back.
  EXPECT_NE(run.output.find("epoch 1: groups {0, 1} form the job"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find(absl::StrCat("epoch 2: group(s) ", lost_group, " (a rank's communicator failed) lost; ",
                                         "groups {", 1 - lost_group, "} go on at step 5")),
            std::string::npos)
      << run.output;
  EXPECT_EQ(hashes.size(), 1u) << run.output;
  // The survivors train on by themselves, so on a slow machine they may reach the last step before the restarted
  // group is admitted (its process start and Finalize against some 75 steps of the tiny model): then the restarted
  // ranks stop as Join says, and only the survivors report. Otherwise all four report, after the rejoin.
  if (run.output.find(absl::StrCat("the job finished before group ", lost_group)) != std::string::npos) {
    std::cout << "(the survivors finished before the restarted group was admitted)\n";
    EXPECT_EQ(ranks, (std::set<int>{2 * (1 - lost_group), 2 * (1 - lost_group) + 1})) << run.output;
    return;
  }
  EXPECT_EQ(ranks.size(), 4u) << run.output;
  EXPECT_NE(run.output.find(absl::StrCat("epoch 3: group(s) {", lost_group, "} rejoin: groups {0, 1}")),
            std::string::npos)
      << run.output;
}

TEST(LiveRecovery, ARankKilledInTheAllReduceAcrossGroups) {
  const std::string dir = zero::testing::MakeTempDir("zero-live-kill");
  ExpectRecovered(RunLive("step.replicas:2:KILL:5", dir), /*lost_group=*/1);
  std::filesystem::remove_all(dir);
}

// A stopped rank (a hang) is found by its group-mate's timeout; the other group's all-reduce with it times out
// sooner (a third of comm_timeout_s, 2 s here: room for a loaded machine under a sanitizer), so the survivors agree to
// drop the step before their own vote times out.
TEST(LiveRecovery, ARankStoppedInTheAllReduceAcrossGroups) {
  const std::string dir = zero::testing::MakeTempDir("zero-live-stop");
  ExpectRecovered(RunLive("step.replicas:1:STOP:5", dir), /*lost_group=*/0);
  std::filesystem::remove_all(dir);
}

#endif

}  // namespace
