// tests/support/gpt_run.h — the tiny GPT trained on N thread-ranks over the test fixture (tests linking
// zero_gpt_train only).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "gpt/train.h"
#include "support/engine_helpers.h"
#include "support/multi_rank.h"
#include "support/status_matchers.h"
#include "zero/config.h"

namespace zero::testing {

// Rank 0's result of `steps` steps of the tiny GPT (seed 42, 16-token sequences) at `world` thread-ranks, with
// the final full parameters. A rank's failure is a test failure naming the rank.
inline gpt::TrainResult TrainTinyGpt(int world, const Config& cfg, int64_t steps) {
  std::vector<gpt::TrainResult> results(world);
  gpt::TrainOptions opt;
  opt.model = "tiny";
  opt.steps = steps;
  opt.seed = 42;
  opt.seq = 16;
  opt.local_world_size = world;
  RunRanks(world, [&](Communicator& comm_ref, int rank) {
    auto r = gpt::TrainRank(cfg, Borrow(comm_ref), opt, {}, /*collect_final_params=*/true);
    ASSERT_OK(r) << "rank " << rank;
    results[rank] = std::move(*r);
  });
  return results[0];
}

}  // namespace zero::testing
