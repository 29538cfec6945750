// ZERO_SIMD_TARGET (core/internal/convert_simd.h): one Highway target for every host kernel of a process, applied
// before its first dispatch whichever kernel runs first (the casts, GradStats, the optimizer tiles), in every
// process (ranks under zero-run too), with an error that names a bad value and lists what the CPU offers.
//
// The variable is read once per process, so each case runs this executable again as a child with the variable
// set: the DISABLED_ tests below are the children's bodies (ctest never runs them on their own).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/internal/convert_simd.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "optim/internal/kernels.h"
#include "support/simd_target_guard.h"
#include "support/status_matchers.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/dtype.h"
#include "zero/engine.h"
#include "zero/mixed_precision.h"
#include "zero/optimizer.h"

namespace zero {
namespace {

using internal::SimdTarget;

struct ChildRun {
  int status = -1;
  std::string output;
};

// This executable's path (a shell's /proc/self/exe would name the shell).
std::string Self() {
  char self[4096];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  return len > 0 ? std::string(self, static_cast<size_t>(len)) : std::string();
}

// Runs this executable's DISABLED_`test` (a child body below) under `env` (env(1)'s arguments: "-u A B=x"),
// behind `launcher` when given.
ChildRun RunChild(const std::string& env, const std::string& test, const std::string& launcher = "") {
  const std::string cmd = absl::StrCat("env ", env, " ", launcher, Self(), " --gtest_also_run_disabled_tests",
                                       " --gtest_filter=SimdTargetChild.DISABLED_", test, " 2>&1");
  ChildRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  while (p != nullptr && std::fgets(buf, sizeof(buf), p) != nullptr) r.output += buf;
  r.status = p == nullptr ? -1 : ::pclose(p);
  return r;
}

std::string Names(const std::vector<SimdTarget>& targets) {
  std::string s;
  for (const SimdTarget& t : targets) absl::StrAppend(&s, s.empty() ? "" : ", ", t.name);
  return s;
}

TEST(SimdTargetFromName, AcceptsAnOfferedTargetInAnyCase) {
  const std::vector<SimdTarget> cpu = internal::CpuSimdTargets();
  ASSERT_FALSE(cpu.empty());
  // Highway's portable fallback runs everywhere: EMU128, or SCALAR where the compiler's EMU128 is broken.
  EXPECT_TRUE(cpu.back().name == "EMU128" || cpu.back().name == "SCALAR") << cpu.back().name;
  for (const SimdTarget& t : cpu) {
    std::string lower = t.name;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    ASSERT_OK_AND_ASSIGN(SimdTarget got, internal::SimdTargetFromName(lower, cpu));
    EXPECT_EQ(got.bits, t.bits);
    EXPECT_EQ(got.name, t.name);
  }
}

TEST(SimdTargetFromName, RefusesUnknownAndUnofferedNamesListingTheOffer) {
  const std::vector<SimdTarget> cpu = internal::CpuSimdTargets();
  const std::string offer = absl::StrCat("this CPU offers: ", Names(cpu));
  auto typo = internal::SimdTargetFromName("AVX9", cpu);
  EXPECT_EQ(typo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(typo.status().message().find("AVX9 is not a Highway SIMD target name"), std::string::npos) << typo.status();
  EXPECT_NE(typo.status().message().find(offer), std::string::npos) << typo.status();
  // SSSE3 is a Highway target that this build leaves out (HWY_DISABLED_TARGETS in the kernels' files).
  auto absent = internal::SimdTargetFromName("SSSE3", cpu);
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(absent.status().message().find("SSSE3 is not a target this build runs on this CPU"), std::string::npos)
      << absent.status();
  EXPECT_NE(absent.status().message().find(offer), std::string::npos) << absent.status();
  // A target of this CPU missing from the offer (as AVX3 is on an AVX2 machine) is refused the same way.
  if (cpu.size() > 1) {
    const std::vector<SimdTarget> rest(cpu.begin() + 1, cpu.end());
    auto missing = internal::SimdTargetFromName(cpu.front().name, rest);
    EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(missing.status().message().find("is not a target this build runs on this CPU"), std::string::npos)
        << missing.status();
  }
}

// Each kernel family as the first dispatch of a fresh process, under each target this CPU offers: the
// restriction is in place before that dispatch (Highway's supported set is the one target right after it), and
// every family then reports that target.
TEST(SimdTargetEnv, EveryKernelObeysItFromTheFirstDispatch) {
  for (const SimdTarget& t : internal::CpuSimdTargets()) {
    for (const char* first : {"convert", "grad_stats", "adam", "sgd"}) {
      SCOPED_TRACE(absl::StrCat(t.name, ", first kernel ", first));
      const ChildRun r =
          RunChild(absl::StrCat("ZERO_SIMD_TARGET=", t.name, " ZERO_SIMD_TEST_FIRST=", first), "ObeysTheTarget");
      EXPECT_EQ(r.status, 0) << r.output;
      EXPECT_NE(r.output.find("[  PASSED  ] 1 test"), std::string::npos) << r.output;
    }
  }
}

TEST(SimdTargetEnv, DebugLogSaysWhichTargetRuns) {
  const SimdTarget t = internal::CpuSimdTargets().back();
  const ChildRun set = RunChild(absl::StrCat("ZERO_LOG_LEVEL=debug ZERO_SIMD_TARGET=", t.name), "Convert");
  EXPECT_EQ(set.status, 0) << set.output;
  EXPECT_NE(set.output.find(absl::StrCat("SIMD target of the host kernels: ", t.name, " (ZERO_SIMD_TARGET)")),
            std::string::npos)
      << set.output;
  const ChildRun unset = RunChild("-u ZERO_SIMD_TARGET ZERO_LOG_LEVEL=debug", "Convert");
  EXPECT_EQ(unset.status, 0) << unset.output;
  EXPECT_NE(unset.output.find(absl::StrCat("SIMD target of the host kernels: ", internal::CpuSimdTargets()[0].name,
                                           " (the best this CPU offers; ZERO_SIMD_TARGET unset)")),
            std::string::npos)
      << unset.output;
}

TEST(SimdTargetEnv, BadValueStopsTheProcessNamingItAndTheOffer) {
  const std::string offer = absl::StrCat("this CPU offers: ", Names(internal::CpuSimdTargets()));
  for (const char* bad : {"AVX9", "SSSE3"}) {
    SCOPED_TRACE(bad);
    const ChildRun r = RunChild(absl::StrCat("ZERO_SIMD_TARGET=", bad), "Convert");
    EXPECT_NE(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(absl::StrCat("zero: ZERO_SIMD_TARGET=", bad, " is not")), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(offer), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("[  PASSED  ]"), std::string::npos) << r.output;
  }
}

// A trainer's typo is an error from Engine::Create (and so ShardedOptimizer::Create), before any kernel could
// only abort: the child creates an engine under a bad value and expects the error.
TEST(SimdTargetEnv, BadValueIsAnErrorFromCreate) {
  const ChildRun r =
      RunChild("-u RANK -u WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u SLURM_PROCID -u ZERO_STORE_DIR ZERO_SIMD_TARGET=AVX9",
               "EngineCreate");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[  PASSED  ] 1 test"), std::string::npos) << r.output;
}

#ifdef ZERO_RUN_PATH
// Rank processes started by zero-run inherit the variable and obey it.
TEST(SimdTargetEnv, RanksUnderZeroRunObeyIt) {
  const SimdTarget t = internal::CpuSimdTargets().back();
  const ChildRun r = RunChild(absl::StrCat("ZERO_SIMD_TARGET=", t.name, " ZERO_SIMD_TEST_FIRST=adam"), "ObeysTheTarget",
                              absl::StrCat(ZERO_RUN_PATH, " -n 2 -- "));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[r0] [  PASSED  ] 1 test"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[r1] [  PASSED  ] 1 test"), std::string::npos) << r.output;
}
#endif

// ---- the children's bodies (run only by the tests above, with the environment they set) ----

void RunKernel(const std::string& which) {
  std::vector<float> a(100, 1.5f), m(100), v(100);
  std::vector<uint16_t> half(100);
  if (which == "convert") {
    ConvertBuffer(a.data(), DType::kF32, half.data(), DType::kBF16, a.size());
  } else if (which == "grad_stats") {
    EXPECT_EQ(GradStats(a.data(), DType::kF32, a.size()).sumsq, 225.0);
  } else if (which == "adam") {
    ShardUpdate u;
    u.lr = 1e-3;
    u.step = 1;
    optim_internal::TileArgs args{
        .master = a.data(), .grad = a.data(), .state0 = m.data(), .state1 = v.data(), .n = a.size()};
    optim_internal::AdamTile(optim_internal::MakeAdamScalars(AdamParams{}, u), args);
  } else if (which == "sgd") {
    ShardUpdate u;
    u.lr = 1e-3;
    optim_internal::TileArgs args{.master = a.data(), .grad = a.data(), .n = a.size()};
    optim_internal::SgdTile(optim_internal::MakeSgdScalars(SgdParams{}, u), args);
  } else {
    FAIL() << "ZERO_SIMD_TEST_FIRST=" << which;
  }
}

// The slot of Highway's dispatch tables that `bits` (one target) selects: HWY_DYNAMIC_DISPATCH calls the entry
// at hwy::GetChosenTarget().GetIndex(), read here with no call into zero (which would apply the variable).
size_t DispatchIndexOf(int64_t bits) {
  return hwy::Num0BitsBelowLS1Bit_Nonzero64(
      static_cast<uint64_t>(HWY_CHOSEN_TARGET_SHIFT(bits) | HWY_CHOSEN_TARGET_MASK_SCALAR));
}

TEST(SimdTargetChild, DISABLED_ObeysTheTarget) {
  const char* want = std::getenv("ZERO_SIMD_TARGET");
  const char* first = std::getenv("ZERO_SIMD_TEST_FIRST");
  ASSERT_NE(want, nullptr);
  ASSERT_NE(first, nullptr);
  int64_t want_bits = 0;
  for (int bit = 0; bit < 63; ++bit) {
    if (std::string(hwy::TargetName(int64_t{1} << bit)) == want) want_bits = int64_t{1} << bit;
  }
  ASSERT_NE(want_bits, 0) << want;
  RunKernel(first);  // the process's first call into zero's kernels
  // Had `first` dispatched before applying the variable, Highway would have chosen the CPU's best target.
  EXPECT_EQ(hwy::GetChosenTarget().GetIndex(), DispatchIndexOf(want_bits)) << first;
  EXPECT_EQ(internal::ActiveSimdTarget(), want);
  EXPECT_EQ(optim_internal::ActiveKernelTarget(), want);
  ASSERT_EQ(internal::AvailableSimdTargets().size(), 1u);
  EXPECT_EQ(internal::AvailableSimdTargets()[0].name, want);
  // Listing the targets, and a test's forcing and its reset, keep the restriction.
  EXPECT_EQ(internal::ActiveSimdTarget(), want);
  { testing::SimdTargetGuard guard(want_bits); }
  EXPECT_EQ(internal::ActiveSimdTarget(), want);
  EXPECT_EQ(optim_internal::ActiveKernelTarget(), want);
}

TEST(SimdTargetChild, DISABLED_Convert) { RunKernel("convert"); }

TEST(SimdTargetChild, DISABLED_EngineCreate) {
  auto comm = Communicator::FromEnv(Backend::kGloo);
  ASSERT_TRUE(comm.ok()) << comm.status();
  auto cfg = Config::FromJsonString(R"({"train_micro_batch_size_per_gpu": 1})");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto engine = Engine::Create(*cfg, std::shared_ptr<Communicator>(std::move(*comm)));
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << engine.status();
  EXPECT_NE(engine.status().message().find("ZERO_SIMD_TARGET=AVX9 is not"), absl::string_view::npos) << engine.status();
  EXPECT_NE(engine.status().message().find("this CPU offers: "), absl::string_view::npos) << engine.status();
}

}  // namespace
}  // namespace zero
