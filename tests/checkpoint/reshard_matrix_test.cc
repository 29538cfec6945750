// Resharding as a tested contract (elastic restarts load a checkpoint at whatever world size is left): for every
// pair N -> M of worlds {1, 2, 3, 4, 6, 8} at every stage, a checkpoint saved at N after three steps and loaded at
// M holds the fp32 master and every optimizer state bit for bit, equals the offline reshard to M file for file, and
// takes one step exactly as a run started at M from that reshard (CheckReshard, checkpoint/reshard_check.h). The
// synthetic model's units (37x19 + 19, 19x23, 101, 64x33 elements) leave shards uneven at every world above 1 and
// empty at 8 (unit "c", 101 elements: ranks 4-7 hold none of it). Ranks are threads over real Gloo.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/reshard_check.h"

namespace zero {
namespace {

std::vector<ReshardCase> Matrix() {
  std::vector<ReshardCase> cases;
  for (int stage = 0; stage <= 3; ++stage) {
    for (int from : {1, 2, 3, 4, 6, 8}) {
      for (int to : {1, 2, 3, 4, 6, 8}) {
        cases.push_back(
            ReshardCase{absl::StrCat("s", stage, "_w", from, "_to_w", to), from, stage, to, stage, DType::kF32});
      }
    }
  }
  return cases;
}

class ReshardMatrixTest : public ::testing::TestWithParam<ReshardCase> {};

// The assertions are CheckReshard's (reshard_check.h); a fatal one there ends this case here too.
TEST_P(ReshardMatrixTest, RoundTripIsExact) { ASSERT_NO_FATAL_FAILURE(CheckReshard(GetParam())); }

INSTANTIATE_TEST_SUITE_P(EveryPair, ReshardMatrixTest, ::testing::ValuesIn(Matrix()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace zero
