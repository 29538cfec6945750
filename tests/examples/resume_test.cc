// zero-gpt and zero-flat-trainer run as a user runs them: --save at step k and --resume give the losses of an
// uninterrupted run (and zero-gpt's final parameters, by hash), bit for bit, at every stage, fp32 and bf16, with
// gradient accumulation and offload, with synchronous and asynchronous (--save-async) saves, with ZeRO++ and its qgZ
// residuals saved (--save-qgz-residuals); and a checkpoint resumes at another world size and stage.
#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "support/files.h"

namespace {

struct ProgramRun {
  int status = -1;
  std::string output;
  std::vector<std::string> steps;  // the {"step": ...} lines up to "step_ms" (loss and norm, printed exactly)
  std::string hash;                // zero-gpt --params-hash
  std::vector<long long> samples;  // zero-gpt's data cursor after each step ("samples")
};

ProgramRun Exec(const std::string& cmd) {
  ProgramRun r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[2048];
  while (p != nullptr && std::fgets(buf, sizeof(buf), p) != nullptr) {
    r.output += buf;
    std::string line = buf;
    if (line.rfind("{\"step\": ", 0) == 0) {
      const size_t cut = line.find(", \"step_ms\"");
      r.steps.push_back(line.substr(0, cut == std::string::npos ? line.find('}') : cut));
      if (const size_t at = line.find("\"samples\": "); at != std::string::npos) {
        r.samples.push_back(std::atoll(line.c_str() + at + 11));
      }
    }
    if (const size_t h = line.find("\"params_hash\": \""); h != std::string::npos) r.hash = line.substr(h + 16, 16);
  }
  r.status = p == nullptr ? -1 : ::pclose(p);
  return r;
}

std::string TempDir() { return zero::testing::MakeTempDir("zero_resume"); }

#ifdef ZERO_GPT
struct GptCase {
  const char* name;
  const char* flags;  // beyond --model tiny --world 2 --json
};
class GptResumeTest : public ::testing::TestWithParam<GptCase> {};

TEST_P(GptResumeTest, ResumedRunEqualsUninterruptedRun) {
  const std::string dir = TempDir();
  const std::string base = absl::StrCat(ZERO_GPT, " --model tiny --seq 32 --world 2 --json ", GetParam().flags);
  const ProgramRun straight = Exec(base + " --steps 5 --params-hash");
  const ProgramRun first = Exec(base + " --steps 2 --save " + dir);
  const ProgramRun second =
      Exec(base + " --steps 5 --params-hash --resume " + dir + " --save " + dir + " --save-every 2");
  ASSERT_EQ(straight.status, 0) << straight.output;
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_EQ(second.status, 0) << second.output;
  ASSERT_EQ(straight.steps.size(), 5u) << straight.output;
  ASSERT_EQ(first.steps.size(), 2u) << first.output;
  ASSERT_EQ(second.steps.size(), 3u) << second.output;
  std::vector<std::string> joined = first.steps;
  joined.insert(joined.end(), second.steps.begin(), second.steps.end());
  EXPECT_EQ(joined, straight.steps);
  EXPECT_EQ(second.hash, straight.hash);
  EXPECT_FALSE(straight.hash.empty());
  // Saved: step 2 (the first run's last), then 4 (every 2) and 5 (the last).
  for (const char* tag : {"step-00000002", "step-00000004", "step-00000005"}) {
    EXPECT_EQ(0, ::access(absl::StrCat(dir, "/", tag, "/meta.json").c_str(), F_OK)) << tag;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Stages, GptResumeTest,
    ::testing::Values(GptCase{"s0_f32", "--stage 0"}, GptCase{"s1_bf16", "--stage 1 --bf16"},
                      GptCase{"s2_f32", "--stage 2"}, GptCase{"s3_bf16", "--stage 3 --bf16"},
                      GptCase{"s2_bf16_ga2_offload", "--stage 2 --bf16 --config " ZERO_CONFIGS "/ga2_offload.json"},
                      // Asynchronous saves: the same resume, the files written in the
                      // background (the last one waited for at the end of the run).
                      GptCase{"s1_f32_async", "--stage 1 --save-async"},
                      GptCase{"s2_bf16_ga2_offload_async",
                              "--stage 2 --bf16 --save-async --config " ZERO_CONFIGS "/ga2_offload.json"},
                      // ZeRO++ (the shipped examples/gpt/configs/zeropp.json: qwZ + hpZ + qgZ; 4 ranks as 2 hosts
                      // of 2) with qgZ's residuals in the checkpoints: without them the steps after the resume
                      // round their gradients otherwise.
                      GptCase{"s3_zeropp_qgz_residuals",
                              "--world 4 --ranks-per-host 2 --save-qgz-residuals --config " ZERO_EXAMPLE_CONFIGS
                              "/zeropp.json"}),
    [](const auto& info) { return std::string(info.param.name); });

// Saved at world 2 and stage 3, resumed at world 3 and stage 1: it goes on from step 3, and from the first sample
// the world-2 steps did not train (the data cursor in the checkpoint), with a global batch of 3 micro-batches.
TEST(GptResumeTest, ResumesAtAnotherWorldSizeAndStage) {
  const std::string dir = TempDir();
  const std::string base = absl::StrCat(ZERO_GPT, " --model tiny --seq 32 --json --bf16");
  const ProgramRun first = Exec(base + " --world 2 --stage 3 --steps 2 --save " + dir);
  const ProgramRun second = Exec(base + " --world 3 --stage 1 --steps 4 --resume " + dir);
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_EQ(second.status, 0) << second.output;
  ASSERT_EQ(second.steps.size(), 2u) << second.output;
  EXPECT_EQ(second.steps[0].rfind("{\"step\": 3,", 0), 0u) << second.steps[0];
  ASSERT_EQ(first.samples.size(), 2u) << first.output;
  ASSERT_EQ(second.samples.size(), 2u) << second.output;
  const long long micro = first.samples[0] / 2;  // world 2, no accumulation: a step trains 2 micro-batches
  ASSERT_GT(micro, 0);
  EXPECT_EQ(first.samples[1], 4 * micro);
  EXPECT_EQ(second.samples[0], 4 * micro + 3 * micro) << "step 3 reads on from the saved cursor";
  EXPECT_EQ(second.samples[1], 4 * micro + 6 * micro);
}
#endif

#if defined(ZERO_GPT) && defined(ZERO_CKPT_TOOL)
// zero-ckpt export of a checkpoint, then zero-gpt --init-from it: the run starts from exactly the saved weights
// (the final-parameter hash of a zero-step run equals the saving run's).
TEST(GptInitFromTest, StartsFromAnExportedCheckpoint) {
  const std::string dir = TempDir();
  const std::string base = absl::StrCat(ZERO_GPT, " --model tiny --seq 32 --json --world 2 --stage 2 --bf16");
  const ProgramRun saved = Exec(base + " --steps 2 --params-hash --save " + dir);
  ASSERT_EQ(saved.status, 0) << saved.output;
  const ProgramRun exported = Exec(absl::StrCat(ZERO_CKPT_TOOL, " export ", dir, " ", dir, "/w.safetensors"));
  ASSERT_EQ(exported.status, 0) << exported.output;
  const ProgramRun fresh = Exec(base + " --steps 0 --params-hash");
  const ProgramRun init = Exec(base + " --stage 3 --steps 0 --params-hash --init-from " + dir + "/w.safetensors");
  ASSERT_EQ(init.status, 0) << init.output;
  EXPECT_EQ(init.hash, saved.hash);
  EXPECT_NE(fresh.hash, saved.hash);  // the weights did change from the seeded initialization
}
#endif

#ifdef ZERO_FLAT_TRAINER
TEST(FlatTrainerResumeTest, ResumedRunEqualsUninterruptedRun) {
  const std::string dir = TempDir();
  const std::string base = absl::StrCat(ZERO_FLAT_TRAINER, " --zero --world 2 --stage 2 --json");
  const ProgramRun straight = Exec(base + " --steps 6");
  const ProgramRun first = Exec(base + " --steps 3 --save " + dir);
  const ProgramRun second = Exec(base + " --steps 6 --resume " + dir);
  ASSERT_EQ(straight.status, 0) << straight.output;
  ASSERT_EQ(second.status, 0) << second.output;
  std::vector<std::string> joined = first.steps;
  joined.insert(joined.end(), second.steps.begin(), second.steps.end());
  EXPECT_EQ(joined, straight.steps);
  EXPECT_EQ(joined.size(), 6u);
}
#endif

}  // namespace
