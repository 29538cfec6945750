// zero-torch-lm (examples/torch_lm) run as processes: torch::optim::AdamW in one process on the whole global batch
// against zero::TorchOptimizer under zero-run, each rank on its slice, at stage 2 (2 ranks) and stage 1 (4 ranks);
// the torch baseline's own all-reduce under zero-run; overlap on and off; tied and frozen embeddings; and each rank's
// optimizer-state bytes against the ZeRO paper's count. The config (configs/torch_lm_clip.json) clips at 0.3, below
// every step's gradient norm at this shape, so the clipping is part of what agrees.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/tolerance.h"

namespace {

constexpr int kSteps = 8;
constexpr double kClip = 0.3;  // gradient_clipping in configs/torch_lm_clip.json
// A small shape: 30 080 parameters, 12 buckets of at most 4000 elements; each run takes a second or a few.
const char kShape[] = "--dim 32 --layers 2 --heads 2 --seq 16 --vocab 64 --batch 8";

struct LmRun {
  int status = -1;
  std::string output;
  std::vector<nlohmann::json> steps;  // steps[k - 1]: step k's line (rank 0's)
  std::vector<nlohmann::json> ranks;  // the per-rank optimizer-state lines, any order
};

// Runs `prefix` + zero-torch-lm --json + the shape, the config and `args` (stderr folded into the output), and
// parses its JSON lines (zero-run prefixes each with [rN]).
LmRun RunLm(const std::string& args, const std::string& prefix = "") {
  const std::string cmd = absl::StrCat(prefix, ZERO_TORCH_LM, " --json --steps ", kSteps, " ", kShape, " --config ",
                                       ZERO_CONFIGS, "/torch_lm_clip.json ", args, " 2>&1");
  LmRun run;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[8192];
  while (p != nullptr && std::fgets(buf, sizeof(buf), p) != nullptr) {
    run.output += buf;
    const char* brace = std::strchr(buf, '{');
    if (brace == nullptr) continue;
    const nlohmann::json j = nlohmann::json::parse(brace, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;
    if (j.contains("step")) {
      EXPECT_EQ(j["step"].get<int>(), static_cast<int>(run.steps.size()) + 1) << buf;
      run.steps.push_back(j);
    } else if (j.contains("rank")) {
      run.ranks.push_back(j);
    }
  }
  run.status = p == nullptr ? -1 : ::pclose(p);
  return run;
}

std::string Launch(int n) { return absl::StrCat(ZERO_RUN_PATH, " -n ", n, " -- "); }

// Every step's loss within `rel` of `want`'s (relative), the gradient norm within 10 rel. Measured: the processes'
// runs agree with the single process to 1.2e-7 (loss) and 1e-7 (norm) at every world size and stage here.
void ExpectSameRun(const LmRun& want, const LmRun& got, double rel, const std::string& what) {
  ASSERT_EQ(want.status, 0) << want.output;
  ASSERT_EQ(got.status, 0) << got.output;
  ASSERT_EQ(want.steps.size(), static_cast<size_t>(kSteps)) << want.output;
  ASSERT_EQ(got.steps.size(), static_cast<size_t>(kSteps)) << got.output;
  zero::testing::Deviation loss(absl::StrCat("loss (", what, ")"), rel);
  zero::testing::Deviation norm(absl::StrCat("grad_norm (", what, ")"), 10 * rel);
  for (int k = 0; k < kSteps; ++k) {
    const double a = want.steps[k]["loss"], b = got.steps[k]["loss"];
    EXPECT_TRUE(loss.Add(std::abs(b - a) / std::abs(a))) << what << " step " << k + 1 << ": " << b << " vs " << a;
    const double na = want.steps[k]["grad_norm"], nb = got.steps[k]["grad_norm"];
    EXPECT_TRUE(norm.Add(std::abs(nb - na) / na)) << what << " step " << k + 1 << ": " << nb << " vs " << na;
  }
}

// The run learns, and the clipping engaged (the comparison covers it).
void ExpectLearnsAndClips(const LmRun& run) {
  ASSERT_EQ(run.steps.size(), static_cast<size_t>(kSteps)) << run.output;
  EXPECT_LT(run.steps.back()["loss"].get<double>(), run.steps.front()["loss"].get<double>()) << run.output;
  double max_norm = 0;
  for (const auto& s : run.steps) max_norm = std::max(max_norm, s["grad_norm"].get<double>());
  EXPECT_GT(max_norm, kClip) << "the clipping never engaged";
}

// Every rank printed its optimizer-state bytes, equal to the count it printed: zero 8Ψ/N at stages 1-2 (Ψ: the
// trainable buckets' elements, each padded to ShardedOptimizer::Capacity), torch 8 bytes per trainable parameter.
void ExpectStateBytes(const LmRun& run, int world, int stage) {
  ASSERT_EQ(run.ranks.size(), static_cast<size_t>(world)) << run.output;
  std::vector<int> seen;
  for (const auto& r : run.ranks) {
    seen.push_back(r["rank"]);
    const int64_t psi = r["psi"], bytes = r["optimizer_state_bytes"], formula = r["formula_bytes"];
    EXPECT_EQ(bytes, formula) << r.dump();
    if (r["optimizer"] == "zero") {
      EXPECT_EQ(formula, stage == 0 ? 8 * psi : 8 * psi / world) << r.dump();
      EXPECT_GE(psi, r["trainable_params"].get<int64_t>()) << r.dump();
      EXPECT_EQ(psi % (32 * world), 0) << "Ψ is a sum of Capacity()s: " << r.dump();
    } else {
      EXPECT_EQ(formula, 8 * r["trainable_params"].get<int64_t>()) << r.dump();
    }
  }
  std::sort(seen.begin(), seen.end());
  for (int i = 0; i < world; ++i) EXPECT_EQ(seen[i], i);
}

TEST(TorchLm, ZeroUnderLauncherEqualsTorchAdamWInOneProcess) {
  const LmRun torch = RunLm("--optimizer torch");
  ExpectLearnsAndClips(torch);
  ExpectStateBytes(torch, 1, 0);
  const LmRun two = RunLm("--optimizer zero --stage 2", Launch(2));
  ExpectSameRun(torch, two, 1e-6, "zero-run -n 2 stage 2");
  ExpectStateBytes(two, 2, 2);
  const LmRun four = RunLm("--optimizer zero --stage 1", Launch(4));
  ExpectSameRun(torch, four, 1e-6, "zero-run -n 4 stage 1");
  ExpectStateBytes(four, 4, 1);
}

TEST(TorchLm, TorchBaselineUnderLauncherEqualsOneProcess) {
  // The baseline's own data parallelism: one all-reduce of the flattened gradients per step.
  const LmRun two = RunLm("--optimizer torch", Launch(2));
  ExpectSameRun(RunLm("--optimizer torch"), two, 1e-6, "torch, zero-run -n 2");
  ExpectStateBytes(two, 2, 0);
}

TEST(TorchLm, OverlapOnAndOffAreTheSameRun) {
  // Reductions started from backward's hooks are the same bits as reductions at step().
  const LmRun on = RunLm("--optimizer zero --stage 2", Launch(2));
  const LmRun off = RunLm("--optimizer zero --stage 2 --no-overlap", Launch(2));
  ASSERT_EQ(on.status, 0) << on.output;
  ASSERT_EQ(off.status, 0) << off.output;
  ASSERT_EQ(on.steps.size(), static_cast<size_t>(kSteps)) << on.output;
  for (int k = 0; k < kSteps; ++k) EXPECT_EQ(on.steps[k]["loss"], off.steps[k]["loss"]) << "step " << k + 1;
}

TEST(TorchLm, TiedHeadAndFrozenEmbeddingsAgreeToo) {
  const std::string flags = "--tied --freeze-embeddings";
  const LmRun torch = RunLm("--optimizer torch " + flags);
  ASSERT_EQ(torch.status, 0) << torch.output;
  ASSERT_EQ(torch.steps.size(), static_cast<size_t>(kSteps)) << torch.output;
  EXPECT_NE(torch.steps.back()["loss"], RunLm("--optimizer torch").steps.back()["loss"]) << "the flags changed nothing";
  const LmRun zero = RunLm("--optimizer zero --stage 2 " + flags, Launch(2));
  ExpectSameRun(torch, zero, 1e-6, "tied, frozen embeddings, zero-run -n 2 stage 2");
  ExpectStateBytes(zero, 2, 2);
  // Trainable: the two blocks (12 704 each) and the final LayerNorm (64); the frozen embeddings, the tied head with
  // them, hold no optimizer state.
  EXPECT_EQ(zero.ranks.at(0)["trainable_params"].get<int64_t>(), 2 * 12704 + 64);
}

TEST(TorchLm, ZeroFlagsAreRefusedWithTheTorchOptimizer) {
  for (const std::string flag : {"--stage 1", "--no-overlap", "--save /nonexistent", "--resume /nonexistent"}) {
    const LmRun r = RunLm("--optimizer torch " + flag);
    EXPECT_EQ(WEXITSTATUS(r.status), 2) << flag << ": " << r.output;
    EXPECT_NE(r.output.find("--optimizer zero"), std::string::npos) << r.output;
    EXPECT_TRUE(r.steps.empty()) << r.output;
  }
}

}  // namespace
