// tests/support/world_stage.h — the {world size, ZeRO stage} parameter most engine tests sweep, and its test
// name ("world2_stage3").
//
//   class MyTest : public ::testing::TestWithParam<zero::testing::WorldStage> {};
//   INSTANTIATE_TEST_SUITE_P(Worlds, MyTest, ::testing::Values(WorldStage{2, 0}, WorldStage{4, 3}),
//                            zero::testing::WorldStageName);
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace zero::testing {

struct WorldStage {
  int world;
  int stage;
};

inline std::string WorldStageName(const ::testing::TestParamInfo<WorldStage>& info) {
  return absl::StrCat("world", info.param.world, "_stage", info.param.stage);
}

}  // namespace zero::testing
