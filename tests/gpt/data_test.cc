// The byte corpus: where it comes from, and the batch property that makes losses comparable across world sizes.
#include "gpt/data.h"

#include <gmock/gmock.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "support/status_matchers.h"

namespace zero::gpt {
namespace {

using ::testing::HasSubstr;
using ::zero::testing::StatusIs;

namespace fs = std::filesystem;

std::string TempPath(const std::string& name) {
  return (fs::temp_directory_path() / ("zero_gpt_data_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

TEST(ByteDatasetTest, DefaultCorpusReadsEachSystemLicenseOnceOrFallsBack) {
  auto data = ByteDataset::Load();
  ASSERT_OK(data);
  EXPECT_GT(data->size(), 4000);
  ASSERT_FALSE(data->sources().empty());
  std::set<std::string> targets;
  for (const auto& s : data->sources()) {
    EXPECT_TRUE(targets.insert(fs::canonical(s).string()).second) << s << " read twice (symlink not deduplicated)";
  }
  if (fs::exists("/usr/share/common-licenses/GPL-3")) {
    EXPECT_EQ(data->sources().front().rfind("/usr/share/common-licenses/", 0), 0u);
    EXPECT_GT(data->size(), 100'000) << "the Debian licenses are ~240 KB";
  } else {
    EXPECT_EQ(data->sources(), std::vector<std::string>{ByteDataset::DefaultFallbackCorpus()});
  }
}

TEST(ByteDatasetTest, FallsBackToShippedTextWhenTheSystemFolderIsMissing) {
  auto data = ByteDataset::Load({.system_dir = "/nonexistent/zero-gpt-licenses"});
  ASSERT_OK(data);
  EXPECT_EQ(data->sources(), std::vector<std::string>{ByteDataset::DefaultFallbackCorpus()});
  EXPECT_EQ(data->size(), static_cast<int64_t>(fs::file_size(ByteDataset::DefaultFallbackCorpus())));
  EXPECT_LT(data->size(), 300'000) << "the shipped text is meant to be small";
}

TEST(ByteDatasetTest, ExplicitFilesAreConcatenatedInOrderAndErrorsNameTheFile) {
  const std::string a = TempPath("a.txt"), b = TempPath("b.txt");
  WriteFile(a, "hello");
  WriteFile(b, "world");
  auto data = ByteDataset::Load({.files = {b, a}});
  ASSERT_OK(data);
  EXPECT_EQ(data->bytes(), "world\nhello");
  EXPECT_EQ(data->sources(), (std::vector<std::string>{b, a}));

  EXPECT_THAT(ByteDataset::Load({.files = {a, "/nonexistent/corpus.txt"}}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/corpus.txt")));

  WriteFile(a, "x");
  EXPECT_THAT(ByteDataset::Load({.files = {a}}), StatusIs(absl::StatusCode::kInvalidArgument));
  fs::remove(a);
  fs::remove(b);
}

TEST(ByteDatasetTest, TargetsAreTokensShiftedByOneAndBatchesAreSeeded) {
  auto data = ByteDataset::Load({.seed = 3});
  ASSERT_OK(data);
  const int B = 4, T = 24;
  std::vector<int32_t> tok(B * T), tgt(B * T), tok2(B * T), tgt2(B * T);
  data->Batch(20, B, T, tok.data(), tgt.data());
  for (int i = 0; i < B; ++i) {
    const int64_t s = data->SampleStart(20 + i, T);
    ASSERT_GE(s, 0);
    ASSERT_LE(s + T, data->size() - 1);
    for (int t = 0; t < T; ++t) {
      ASSERT_EQ(tok[i * T + t], static_cast<unsigned char>(data->bytes()[s + t]));
      ASSERT_EQ(tgt[i * T + t], static_cast<unsigned char>(data->bytes()[s + t + 1]));
      if (t + 1 < T) {
        ASSERT_EQ(tgt[i * T + t], tok[i * T + t + 1]);
      }
    }
  }
  data->Batch(20, B, T, tok2.data(), tgt2.data());
  EXPECT_EQ(tok, tok2) << "same (seed, sample) must give the same batch";
  data->Batch(20 + B, B, T, tok2.data(), tgt2.data());
  EXPECT_NE(tok, tok2) << "the next samples must give another batch";
  auto other = ByteDataset::Load({.seed = 4});
  other->Batch(20, B, T, tok2.data(), tgt2.data());
  EXPECT_NE(tok, tok2) << "another seed must give another batch";
}

// The stream does not depend on how it is cut: batches of any size laid end to end read the same samples as one
// batch over the same range, so rank r of world N (samples [r*B, (r+1)*B) of the step) sees rows of the world-1
// batch of B*N, and a run that resumes with another global batch reads on from its cursor.
TEST(ByteDatasetTest, TheSampleStreamIsTheSameHoweverItIsCut) {
  auto data = ByteDataset::Load({.seed = 9});
  ASSERT_OK(data);
  const int T = 16;
  for (int64_t first : {0, 1, 7, 1000}) {
    const int total = 12;
    std::vector<int32_t> tok1(total * T), tgt1(total * T);
    data->Batch(first, total, T, tok1.data(), tgt1.data());
    for (int B : {1, 2, 3, 4, 6}) {
      std::vector<int32_t> tok_cat, tgt_cat;
      for (int k = 0; k < total / B; ++k) {
        std::vector<int32_t> tok(B * T), tgt(B * T);
        data->Batch(first + static_cast<int64_t>(k) * B, B, T, tok.data(), tgt.data());
        tok_cat.insert(tok_cat.end(), tok.begin(), tok.end());
        tgt_cat.insert(tgt_cat.end(), tgt.begin(), tgt.end());
      }
      EXPECT_EQ(tok_cat, tok1) << "first " << first << " batch " << B;
      EXPECT_EQ(tgt_cat, tgt1) << "first " << first << " batch " << B;
    }
  }
  // Distinct samples start at (almost always) distinct places: the stream is not a few positions repeated.
  std::set<int64_t> starts;
  for (int64_t s = 0; s < 256; ++s) starts.insert(data->SampleStart(s, T));
  EXPECT_GT(starts.size(), 250u);
}

}  // namespace
}  // namespace zero::gpt
