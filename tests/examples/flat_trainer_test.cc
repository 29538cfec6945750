// zero-flat-trainer (examples/flat_trainer) run as a binary: the --zero run on ShardedOptimizer, each rank on its
// slice of the global batch, must reproduce the trainer's own single-process AdamW on the whole batch.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "support/tolerance.h"

namespace {

constexpr int kSteps = 20;

struct TrainerRun {
  int status = -1;
  std::string output;
  std::vector<double> losses;  // losses[k - 1]: step k's, from the --json lines
};

// Runs `prefix` + the trainer + `args` (stderr folded into the output) and parses the {"step": k, "loss": x} lines.
TrainerRun RunTrainer(const std::string& args, const std::string& prefix = "") {
  const std::string cmd = absl::StrCat(prefix, ZERO_FLAT_TRAINER, " --json --steps ", kSteps, " ", args, " 2>&1");
  TrainerRun run;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[1024];
  while (p != nullptr && std::fgets(buf, sizeof(buf), p) != nullptr) {
    run.output += buf;
    const char* json = std::strstr(buf, "{\"step\": ");  // zero-run prefixes lines with [rN]
    int step = 0;
    double loss = 0;
    if (json != nullptr && std::sscanf(json, "{\"step\": %d, \"loss\": %lf}", &step, &loss) == 2) {
      EXPECT_EQ(step, static_cast<int>(run.losses.size()) + 1) << buf;
      run.losses.push_back(loss);
    }
  }
  run.status = p == nullptr ? -1 : ::pclose(p);
  return run;
}

// Each step's loss within `rel`, relative. Measured (bench/results/cpu-targets.md), the same under every SIMD target
// and OpenBLAS kernel (the trainer's loops call no BLAS): world 1 agrees bit for bit (bound 1e-6), world 4 and
// zero-run's two ranks within 1.4e-7 (bound 1e-5, 70x).
void ExpectSameLosses(const TrainerRun& want, const TrainerRun& got, double rel, const std::string& what) {
  ASSERT_EQ(want.status, 0) << want.output;
  ASSERT_EQ(got.status, 0) << got.output;
  ASSERT_EQ(want.losses.size(), static_cast<size_t>(kSteps)) << want.output;
  ASSERT_EQ(got.losses.size(), static_cast<size_t>(kSteps)) << got.output;
  zero::testing::Deviation loss(absl::StrCat("loss (", what, ")"), rel);
  for (int k = 0; k < kSteps; ++k) {
    EXPECT_TRUE(loss.Add(std::abs(got.losses[k] - want.losses[k]) / std::abs(want.losses[k])))
        << "step " << k + 1 << ": " << got.losses[k] << " vs " << want.losses[k];
  }
  // Not a run that learns nothing: the loss falls.
  EXPECT_LT(want.losses.back(), 0.8 * want.losses.front());
}

TEST(FlatTrainer, ZeroAtWorldOneEqualsOwnAdamW) {
  ExpectSameLosses(RunTrainer(""), RunTrainer("--zero --world 1"), 1e-6, "world 1");
}

TEST(FlatTrainer, ZeroAtWorldFourEqualsOwnAdamWOnTheWholeBatch) {
  const TrainerRun own = RunTrainer("");
  for (int stage : {0, 1, 2}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    ExpectSameLosses(own, RunTrainer(absl::StrCat("--zero --world 4 --stage ", stage)), 1e-5,
                     absl::StrCat("world 4 stage ", stage));
  }
}

TEST(FlatTrainer, SeedChangesTheRun) {
  const TrainerRun a = RunTrainer(""), b = RunTrainer("--seed 7");
  ASSERT_EQ(a.losses.size(), b.losses.size());
  EXPECT_NE(a.losses, b.losses);
}

TEST(FlatTrainer, DecayOnMatricesOnlyAgreesToo) {
  // llm.c's rule (no weight decay on biases and layernorm parameters): the own loop's per-tensor test against a
  // ShardedOptimizer parameter group; a different run from decay everywhere.
  const TrainerRun own = RunTrainer("--decay-2d");
  ExpectSameLosses(own, RunTrainer("--zero --world 1 --decay-2d"), 1e-6, "world 1");
  ExpectSameLosses(own, RunTrainer("--zero --world 4 --stage 2 --decay-2d"), 1e-5, "world 4 stage 2");
  EXPECT_NE(own.losses, RunTrainer("").losses);
}

TEST(FlatTrainer, RefusesSeveralRanksWithoutZero) {
  // Without --zero there are no ranks to split the batch over, and no stage 3 with --zero (the Engine's path).
  const TrainerRun world = RunTrainer("--world 4");
  EXPECT_NE(world.status, 0);
  EXPECT_NE(world.output.find("--world 1"), std::string::npos) << world.output;
  EXPECT_TRUE(world.losses.empty()) << world.output;
  // Started as one of several ranks by any launcher FromEnv reads: each copy would train the whole batch alone.
  // (The variables of rank 0 of 2; the refusal comes before any rendezvous.)
  for (const char* vars : {"RANK=0 WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2",
                           "SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2"}) {
    const TrainerRun launched = RunTrainer("", absl::StrCat("env ", vars, " "));
    EXPECT_NE(launched.status, 0) << vars;
    EXPECT_NE(launched.output.find("as one of 2 ranks"), std::string::npos) << vars << ": " << launched.output;
    EXPECT_TRUE(launched.losses.empty()) << vars << ": " << launched.output;
  }
  // A launch whose variables do not read is no lone run either.
  const TrainerRun unread = RunTrainer("", "env RANK=0 WORLD_SIZE=2 MASTER_PORT=99999 ");
  EXPECT_NE(unread.status, 0);
  EXPECT_NE(unread.output.find("do not read"), std::string::npos) << unread.output;
  // A launched world of one is the lone trainer.
  const TrainerRun one = RunTrainer("", "env OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1 ");
  EXPECT_EQ(one.status, 0) << one.output;
  EXPECT_EQ(one.losses.size(), static_cast<size_t>(kSteps)) << one.output;
  const TrainerRun stage3 = RunTrainer("--zero --stage 3");
  EXPECT_NE(stage3.status, 0);
  EXPECT_NE(stage3.output.find("Engine"), std::string::npos) << stage3.output;
}

#ifdef ZERO_RUN_PATH
TEST(FlatTrainer, ZeroUnderLauncherEqualsOwnAdamW) {
  ExpectSameLosses(RunTrainer(""), RunTrainer("--zero --stage 2", absl::StrCat(ZERO_RUN_PATH, " -n 2 -- ")), 1e-5,
                   "zero-run -n 2 stage 2");
}
#endif

}  // namespace
