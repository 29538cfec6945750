// Live recovery across replica groups (zero/elastic.h), as threads over real Gloo: four ranks in two groups of
// two; one rank of group 1 vanishes mid-run (its communicators close, as a killed process's sockets do), group 0
// trains on alone without a restart, a new incarnation of group 1 rejoins at a step boundary by copying group 0's
// state, and at the end every parameter is bitwise equal across the groups. The decisions are checked as the
// store recorded them. (zero-run's processes and SIGKILL/SIGSTOP: tests/tools/zero_run_live_test.cc.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "support/engine_helpers.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "support/synthetic_trainer.h"
#include "zero/elastic.h"
#include "zero/engine.h"
#include "zero/store.h"

namespace zero {
namespace {

constexpr int kWorld = 4, kGroup = 2;

// One step of the synthetic trainer (tests/support/synthetic_trainer.h's gradients), returning Step's status.
Status TrainOneStep(Engine& e) {
  std::vector<UnitId> ids;
  for (const auto& [name, specs] : testing::SyntheticUnits()) ids.push_back(e.FindUnit(name));
  for (UnitId id : ids) ZERO_RETURN_IF_ERROR(e.Forward(id).status());
  const int64_t k = e.steps();
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    ZERO_ASSIGN_OR_RETURN(UnitScope b, e.Backward(*it));
    for (const ParamSpec& spec : e.UnitParams(*it)) {
      ZERO_ASSIGN_OR_RETURN(float* p, b.Param<float>(spec.name));
      ZERO_ASSIGN_OR_RETURN(float* g, b.Grad<float>(spec.name));
      for (int64_t i = 0; i < spec.numel(); ++i) {
        g[i] += 0.01f * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(k) + static_cast<float>(e.rank())) +
                0.1f * p[i];
      }
    }
  }
  return e.Step().status();
}

// Rank `rank` of kWorld in groups of kGroup over `store`, loopback, with the config's timeout.
LiveOptions Options(std::shared_ptr<Store> store, int rank, int incarnation, const Config& cfg) {
  LiveOptions lo;
  lo.store = std::move(store);
  lo.rank = rank;
  lo.world_size = kWorld;
  lo.group_size = kGroup;
  lo.incarnation = incarnation;
  lo.comm = testing::TestCommOptions();
  lo.comm.timeout = absl::Seconds(cfg.comm_timeout_s);
  lo.comm.check_order = false;
  return lo;
}

struct RankOutcome {
  Status status;
  std::map<std::string, std::vector<float>> params;
  std::vector<Membership> history;
  int64_t steps_alone = 0;  // steps this rank applied while its group was the only one
  int64_t steps = 0;
  // The data cursor two ways: counted here step by step (the ranks of the world each applied step ran in; only
  // meaningful on a rank that trained from the start), and as SamplesBefore(steps, 1) says from the decisions.
  int64_t counted_samples = 0, samples_before = -1;
};

class LiveRecoveryTest : public ::testing::TestWithParam<int> {};

TEST_P(LiveRecoveryTest, GroupLostTrainsOnAndRejoinsBitwise) {
  const int stage = GetParam();
  constexpr int64_t kSteps = 14, kDie = 4, kRejoinAfter = 8;
  Config cfg = testing::TrainConfig(stage, /*micro=*/1);
  cfg.zero.mics_shard_size = kGroup;
  cfg.comm_timeout_s = 6;  // the all-reduce across groups times out in 2 s (a third), even under a sanitizer
  std::shared_ptr<Store> store = Store::Hash();
  std::atomic<int64_t> group0_step{0};
  absl::Mutex mu;
  std::map<std::pair<int, int>, RankOutcome> out;  // (rank, incarnation)

  auto rank_body = [&](int rank, int incarnation) {
    RankOutcome o;
    o.status = [&]() -> Status {
      ZERO_ASSIGN_OR_RETURN(auto groups, ReplicaGroups::Create(Options(store, rank, incarnation, cfg)));
      ZERO_ASSIGN_OR_RETURN(auto e, testing::MakeSyntheticEngine(cfg, groups->group_comm()));
      ZERO_RETURN_IF_ERROR(groups->Join(*e));
      // Until kSteps and at least 4 steps after the last change of membership, and on while the job runs short
      // of a group (group 0 alone waits for the rejoin so): every rank present stops at the same step.
      while (e->steps() < std::max(kSteps, groups->membership().step + 4) || groups->world_size() < kWorld) {
        if (e->steps() > 50 * kSteps) return absl::DeadlineExceededError("group 1 never rejoined");
        ZERO_RETURN_IF_ERROR(groups->AtStepBoundary(*e));
        // Rank 2 (group 1's first rank) vanishes in step kDie's backward: its communicators close with it.
        if (rank == 2 && incarnation == 0 && e->steps() == kDie) return absl::CancelledError("killed");
        const Status s = TrainOneStep(*e);
        if (!s.ok()) {
          ZERO_RETURN_IF_ERROR(groups->Recover(*e, s));
          continue;
        }
        if (groups->world_size() == kGroup) ++o.steps_alone;
        o.counted_samples += groups->world_size();
        if (rank == 0) group0_step = e->steps();
      }
      for (const auto& [name, specs] : testing::SyntheticUnits()) {
        for (const ParamSpec& spec : specs) {
          ZERO_ASSIGN_OR_RETURN(std::vector<float> v, e->GatherParam(e->FindUnit(name), spec.name));
          o.params[name + "." + spec.name] = std::move(v);
        }
      }
      o.history = groups->history();
      o.steps = e->steps();
      o.samples_before = groups->SamplesBefore(e->steps(), 1);
      return absl::OkStatus();
    }();
    absl::MutexLock lock(&mu);
    out[std::make_pair(rank, incarnation)] = std::move(o);
  };

  std::vector<std::thread> first;
  for (int r = 0; r < kWorld; ++r) first.emplace_back(rank_body, r, 0);
  // Group 1's first incarnation ends (rank 2 killed, rank 3 failing on its group's communicator); group 0
  // trains on alone for a few steps before the new incarnation starts.
  first[2].join();
  first[3].join();
  while (group0_step < kRejoinAfter) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::vector<std::thread> second;
  for (int r = 2; r < kWorld; ++r) second.emplace_back(rank_body, r, 1);
  first[0].join();
  first[1].join();
  for (auto& t : second) t.join();

  auto at = [&](int rank, int inc) -> RankOutcome& { return out[std::make_pair(rank, inc)]; };
  EXPECT_THAT(at(2, 0).status, testing::StatusIs(absl::StatusCode::kCancelled));
  EXPECT_FALSE(at(3, 0).status.ok());
  for (auto [rank, inc] : std::vector<std::pair<int, int>>{{0, 0}, {1, 0}, {2, 1}, {3, 1}}) {
    ASSERT_OK(at(rank, inc).status) << "rank " << rank << " incarnation " << inc;
  }
  // Group 0 trained alone, without a restart, for the steps between the loss and the rejoin.
  EXPECT_GE(at(0, 0).steps_alone, kRejoinAfter - kDie);
  // Every parameter bitwise equal across the groups (and within a group, GatherParam's full values).
  for (const auto& [name, v] : at(0, 0).params) {
    for (auto key : std::vector<std::pair<int, int>>{{1, 0}, {2, 1}, {3, 1}}) {
      const std::vector<float>& w = at(key.first, key.second).params.at(name);
      ASSERT_EQ(v.size(), w.size());
      EXPECT_EQ(0, std::memcmp(v.data(), w.data(), v.size() * sizeof(float))) << name << " on rank " << key.first;
    }
    EXPECT_GT(testing::MovedElements(name, v), 0u) << name;
  }
  // The decisions, as group 0 saw them: formed, group 1 lost, group 1 (incarnation 1) rejoined.
  const std::vector<Membership>& h = at(0, 0).history;
  ASSERT_EQ(h.size(), 3u);
  EXPECT_THAT(h[0].groups, ::testing::ElementsAre(0, 1));
  EXPECT_FALSE(h[0].after_failure);
  EXPECT_THAT(h[1].groups, ::testing::ElementsAre(0));
  EXPECT_TRUE(h[1].after_failure);
  EXPECT_EQ(h[1].step, kDie);
  EXPECT_THAT(h[1].why, ::testing::HasSubstr("group(s) 1 (a rank's communicator failed) lost"));
  EXPECT_THAT(h[2].groups, ::testing::ElementsAre(0, 1));
  EXPECT_THAT(h[2].incarnations, ::testing::ElementsAre(0, 1));
  EXPECT_TRUE(h[2].copy);
  EXPECT_EQ(h[2].source, 0);
  EXPECT_GE(h[2].step, kRejoinAfter);
  // The new incarnation saw only its admission.
  ASSERT_EQ(at(2, 1).history.size(), 1u);
  EXPECT_EQ(at(2, 1).history[0].epoch, 3);
  // The data cursor: 4 ranks until the loss, 2 until the rejoin, 4 after; the same on every rank, the rejoined
  // group's included (it read the decisions before its own), and what group 0 counted step by step.
  const int64_t final_step = at(0, 0).steps;
  const int64_t want = kDie * kWorld + (h[2].step - kDie) * kGroup + (final_step - h[2].step) * kWorld;
  EXPECT_EQ(at(0, 0).counted_samples, want);
  for (const auto& [key, o] : out) {
    if (!o.status.ok()) continue;
    EXPECT_EQ(o.steps, final_step) << "rank " << key.first;
    EXPECT_EQ(o.samples_before, want) << "rank " << key.first << " incarnation " << key.second;
  }
}

// A config whose accumulation steps depend on the world (the global batch kept) cannot regroup under a running
// trainer: Join fails on every rank, naming both numbers and the way out, before any state moves.
TEST(LiveRecoveryConfig, AccumulationThatFollowsTheWorldIsRefusedAtJoin) {
  Config cfg = testing::TrainConfig(/*stage=*/2, /*micro=*/1);
  cfg.train_batch_size = 8;  // accumulation 4 over one group of 2, 2 over both groups
  cfg.gradient_accumulation_steps.reset();
  cfg.zero.mics_shard_size = kGroup;
  cfg.comm_timeout_s = 6;
  std::shared_ptr<Store> store = Store::Hash();
  testing::RunThreads(kWorld, [&](int rank) {
    ASSERT_OK_AND_ASSIGN(auto groups, ReplicaGroups::Create(Options(store, rank, /*incarnation=*/0, cfg)));
    ASSERT_OK_AND_ASSIGN(auto e, testing::MakeSyntheticEngine(cfg, groups->group_comm()));
    const Status s = groups->Join(*e);
    EXPECT_THAT(
        s, testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                             ::testing::AllOf(::testing::HasSubstr("gradient_accumulation_steps would be 2, not 4"),
                                              ::testing::HasSubstr("keep_micro"))))
        << "rank " << rank;
  });
}

INSTANTIATE_TEST_SUITE_P(Stages, LiveRecoveryTest, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return absl::StrCat("Stage", info.param); });

// Started without any launcher's variables there are no ranks to group: FromEnv says so by name (before, it went on
// to complain about the store, the one thing zero-run would have set).
TEST(LiveRecoveryConfig, FromEnvWithoutALauncherSaysSo) {
  for (const char* v : {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID",
                        "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "ZERO_STORE_DIR"}) {
    ::unsetenv(v);
  }
  const StatusOr<std::unique_ptr<ReplicaGroups>> g = ReplicaGroups::FromEnv(testing::TrainConfig(2, 1));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
  EXPECT_THAT(std::string(g.status().message()), ::testing::HasSubstr("no launcher variables")) << g.status();
}

}  // namespace
}  // namespace zero
