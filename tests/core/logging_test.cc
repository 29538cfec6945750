#include "zero/logging.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace zero {
namespace {

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = CurrentLogLevel();
    SetLogSink([this](LogLevel level, std::string_view line) { lines_.emplace_back(line); });
  }
  void TearDown() override {
    SetLogSink(nullptr);
    SetLogLevel(saved_);
    SetLogRank(-1);
  }
  LogLevel saved_;
  std::vector<std::string> lines_;
};

TEST_F(LoggingTest, LevelFiltersAndRankPrefixes) {
  SetLogLevel(LogLevel::kWarning);
  SetLogRank(3);
  ZERO_LOG(INFO) << "hidden";
  ZERO_LOG(WARNING) << "shown " << 42;
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_NE(lines_[0].find("[zero r3] W "), std::string::npos) << lines_[0];
  EXPECT_NE(lines_[0].find("logging_test.cc:"), std::string::npos);
  EXPECT_NE(lines_[0].find("shown 42"), std::string::npos);
}

TEST_F(LoggingTest, RankIsPerThread) {
  SetLogLevel(LogLevel::kInfo);
  SetLogRank(0);
  std::thread([] {
    SetLogRank(5);
    ZERO_LOG(INFO) << "from thread";
  }).join();
  ZERO_LOG(INFO) << "from main";
  ASSERT_EQ(lines_.size(), 2u);
  EXPECT_NE(lines_[0].find("[zero r5]"), std::string::npos);
  EXPECT_NE(lines_[1].find("[zero r0]"), std::string::npos);
}

TEST_F(LoggingTest, OnceLogsOnce) {
  SetLogLevel(LogLevel::kInfo);
  for (int i = 0; i < 3; ++i) ZERO_LOG_ONCE(WARNING) << "order changed " << i;
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_NE(lines_[0].find("order changed 0"), std::string::npos);
}

}  // namespace
}  // namespace zero
