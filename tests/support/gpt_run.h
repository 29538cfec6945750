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
#include "zero/status.h"

namespace zero::testing {

// The options of the tiny GPT runs: seed 42, 16-token sequences, `world` ranks on this host.
inline gpt::TrainOptions TinyGptOptions(int world, int64_t steps) {
  gpt::TrainOptions opt;
  opt.model = "tiny";
  opt.steps = steps;
  opt.seed = 42;
  opt.seq = 16;
  opt.local_world_size = world;
  return opt;
}

// Every rank's result of the tiny GPT trained with `opt` at `world` thread-ranks, with the final full parameters,
// and the first failing rank's status (OK when none failed; a failed rank's result is left empty).
struct TinyGptRanks {
  std::vector<gpt::TrainResult> results;
  Status status;
};
inline TinyGptRanks RunTinyGpt(int world, const Config& cfg, const gpt::TrainOptions& opt) {
  TinyGptRanks out;
  out.results.resize(world);
  std::vector<Status> statuses(world);
  RunRanks(world, [&](Communicator& comm_ref, int rank) {
    auto r = gpt::TrainRank(cfg, Borrow(comm_ref), opt, {}, /*collect_final_params=*/true);
    if (!r.ok()) {
      statuses[rank] = r.status();
      return;
    }
    out.results[rank] = std::move(*r);
  });
  for (const Status& s : statuses) {
    if (!s.ok() && out.status.ok()) out.status = s;
  }
  return out;
}

// Rank 0's result of `steps` steps of the tiny GPT at `world` thread-ranks, with the final full parameters. A
// rank's failure is a test failure naming the rank.
inline gpt::TrainResult TrainTinyGpt(int world, const Config& cfg, int64_t steps) {
  std::vector<gpt::TrainResult> results(world);
  const gpt::TrainOptions opt = TinyGptOptions(world, steps);
  RunRanks(world, [&](Communicator& comm_ref, int rank) {
    auto r = gpt::TrainRank(cfg, Borrow(comm_ref), opt, {}, /*collect_final_params=*/true);
    ASSERT_OK(r) << "rank " << rank;
    results[rank] = std::move(*r);
  });
  return results[0];
}

}  // namespace zero::testing
