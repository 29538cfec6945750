// zero-estimate run as a user runs it, beside zero-gpt with the same flags: the same tag names, and each tag's
// bytes equal to the measured peak; a 70B-class GPT shape at 1,024 ranks answers in both forms (model state
// 16Ψ/N at stage 3, the largest block count that fits a budget); a units file; errors name what is wrong.
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/files.h"

namespace {

using nlohmann::json;

struct ProgramRun {
  int exit_code = -1;
  std::string out;  // stdout
  std::string all;  // stdout and stderr
};

ProgramRun Exec(const std::string& cmd) {
  ProgramRun r;
  // One file per process and call: ctest runs this executable's tests as concurrent processes, and a shared name
  // let one test read another's stderr.
  static int calls = 0;
  const std::string err =
      ::testing::TempDir() + "/zero_estimate_cli_stderr." + std::to_string(::getpid()) + "." + std::to_string(calls++);
  FILE* p = ::popen((cmd + " 2>" + err).c_str(), "r");
  char buf[4096];
  while (p != nullptr && std::fgets(buf, sizeof(buf), p) != nullptr) r.out += buf;
  const int status = p == nullptr ? -1 : ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.all = r.out + zero::testing::ReadWholeFile(err);
  std::remove(err.c_str());
  return r;
}

// The last line of a program's stdout, as JSON.
json LastJson(const ProgramRun& r) {
  std::string s = r.out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  const size_t nl = s.rfind('\n');
  return json::parse(nl == std::string::npos ? s : s.substr(nl + 1));
}

// The last line of a program's stdout that is a JSON object with `key`.
json LastJsonWith(const ProgramRun& r, const std::string& key) {
  std::string s = r.out;
  while (!s.empty()) {
    while (!s.empty() && s.back() == '\n') s.pop_back();
    const size_t nl = s.rfind('\n');
    const std::string line = nl == std::string::npos ? s : s.substr(nl + 1);
    s.resize(nl == std::string::npos ? 0 : nl);
    if (line.empty() || line.front() != '{') continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains(key)) return j;
  }
  return json::object();
}

// zero-gpt's report takes each tag's largest rank; the estimate is every rank's (their buffers have one size).
void ExpectSameTagsSameBytes(const std::string& flags) {
  const ProgramRun est = Exec(absl::StrCat(ZERO_ESTIMATE, " ", flags, " --json"));
  ASSERT_EQ(est.exit_code, 0) << est.all;
  const ProgramRun run = Exec(absl::StrCat(ZERO_GPT, " ", flags, " --steps 3 --json"));
  ASSERT_EQ(run.exit_code, 0) << run.all;
  // (zero-gpt prints its NVMe tiers' counters after the summary line.)
  const json e = LastJson(est)["memory"], m = LastJsonWith(run, "memory")["memory"];
  ASSERT_GT(e.size(), 2u);
  bool timing = false;  // overlap_comm: the buckets lie between "min_bytes" and "bytes", by how fast reductions run
  for (const auto& [tag, v] : e.items()) timing |= v.contains("min_bytes");
  for (const auto& [tag, v] : m.items()) {
    SCOPED_TRACE(tag);
    ASSERT_TRUE(e.contains(tag)) << est.out;
    if (tag == "peak_total") {
      for (const char* tier : {"host", "device"}) {
        EXPECT_LE(v[tier].get<int64_t>(), e[tag][tier].get<int64_t>()) << tier;
        if (!timing) {
          EXPECT_GE(v[tier].get<double>(), 0.9 * e[tag][tier].get<double>()) << tier;
        }
      }
      continue;
    }
    EXPECT_EQ(e[tag]["tier"], v["tier"]);
    if (e[tag].contains("min_bytes")) {
      EXPECT_GE(v["peak"].get<int64_t>(), e[tag]["min_bytes"].get<int64_t>());
      EXPECT_LE(v["peak"].get<int64_t>(), e[tag]["bytes"].get<int64_t>());
    } else {
      EXPECT_EQ(e[tag]["bytes"].get<int64_t>(), v["peak"].get<int64_t>());
    }
  }
  EXPECT_EQ(e.size(), m.size()) << est.out;
}

class EstimateBesideRunTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EstimateBesideRunTest, SameTagsSameBytes) { ExpectSameTagsSameBytes(GetParam()); }

// The NVMe tiers (offload_optimizer and offload_param "nvme"): the parameters, master and optimizer state in the
// "nvme" tier of both, the host holding the tiers' buffers.
TEST(EstimateCliTest, NvmeTiersBesideRun) {
  const std::string dir = zero::testing::MakeTempDir("zero_estimate_nvme");
  zero::testing::WriteWholeFile(dir + "/nvme.json", absl::StrCat(R"({
    "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 4096,
      "offload_optimizer": {"device": "nvme", "nvme_path": ")",
                                                                 dir, R"("},
      "offload_param": {"device": "nvme", "nvme_path": ")",
                                                                 dir, R"(", "buffer_count": 3}}})"));
  ExpectSameTagsSameBytes(absl::StrCat("--model tiny --world 2 --config ", dir, "/nvme.json"));
  const ProgramRun est =
      Exec(absl::StrCat(ZERO_ESTIMATE, " --model tiny --world 2 --config ", dir, "/nvme.json --json"));
  ASSERT_EQ(est.exit_code, 0) << est.all;
  const json e = LastJson(est);
  EXPECT_EQ(e["offload"], "optimizer (nvme)+parameters (nvme)");
  EXPECT_EQ(e["memory"]["params"]["tier"], "nvme") << est.out;
  EXPECT_EQ(e["memory"]["optimizer"]["tier"], "nvme") << est.out;
}

INSTANTIATE_TEST_SUITE_P(Flags, EstimateBesideRunTest,
                         ::testing::Values("--model tiny --world 2", "--model tiny --world 3 --stage 2 --bf16",
                                           "--model tiny --world 2 --stage 3 --recompute",
                                           "--model tiny --world 4 --stage 3 --bf16 --recompute --seq 16",
                                           "--model tiny --world 2 --config " ZERO_CONFIGS "/zero3_offload.json"));

constexpr const char* k70B =
    " --layers 80 --hidden 8192 --heads 64 --vocab 32000 --seq 4096 --micro-batch 1 --world 1024 --stage 3 --bf16";

TEST(EstimateCliTest, SeventyBillionAtScale) {
  const ProgramRun r = Exec(absl::StrCat(ZERO_ESTIMATE, k70B, " --device cuda --fit-gib 80 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.all;
  const json j = LastJson(r);
  const int64_t padded = j["padded"].get<int64_t>();
  EXPECT_GT(j["params"].get<int64_t>(), 64'000'000'000);
  EXPECT_EQ(j["model_state"].get<int64_t>(), 16 * padded / 1024);  // ZeRO's 16Ψ/N, on the padded units
  EXPECT_EQ(j["memory"]["optimizer"]["bytes"].get<int64_t>(), 8 * padded / 1024);
  EXPECT_EQ(j["communication"].size(), 2u);  // stage-3 gathers, gradient reduce-scatter
  EXPECT_GT(j["bytes_sent_per_step"].get<int64_t>(), 0);
  EXPECT_GE(j["fit"]["layers"].get<int>(), 0);

  const ProgramRun human = Exec(absl::StrCat(ZERO_ESTIMATE, k70B, " --fit-gib 80"));
  ASSERT_EQ(human.exit_code, 0) << human.all;
  for (const char* want : {"optimizer", "model state", "true peak", "stage-3 gathers", "gradient reduce-scatter",
                           "largest that fits 80 GiB"}) {
    EXPECT_NE(human.out.find(want), std::string::npos) << want << " in\n" << human.out;
  }
}

TEST(EstimateCliTest, UnitsFile) {
  const std::string dir = zero::testing::MakeTempDir("zero_estimate_units");
  zero::testing::WriteWholeFile(dir + "/list.json",
                                R"([{"name": "embed", "params": 51200, "scopes": 1}, {"name": "h.0", "params": 70000},
                                    {"name": "h.1", "params": 70000}, {"name": "frozen", "params": 9000, "frozen": true}])");
  const ProgramRun r = Exec(absl::StrCat(ZERO_ESTIMATE, " --units ", dir, "/list.json --world 4 --stage 2 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.all;
  const json j = LastJson(r);
  EXPECT_EQ(j["params"].get<int64_t>(), 51200 + 70000 + 70000 + 9000);
  // Stage 2, fp32 AdamW: full parameters everywhere, 8 bytes of state per trainable element over 4 ranks.
  EXPECT_EQ(j["memory"]["params"]["bytes"].get<int64_t>(), 4 * j["padded"].get<int64_t>());
  EXPECT_FALSE(j["memory"].contains("activations"));

  zero::testing::WriteWholeFile(dir + "/object.json",
                                R"({"units": [{"name": "a", "params": 1000}], "activation_bytes": 4096})");
  const ProgramRun o = Exec(absl::StrCat(ZERO_ESTIMATE, " --units ", dir, "/object.json --json"));
  ASSERT_EQ(o.exit_code, 0) << o.all;
  EXPECT_EQ(LastJson(o)["memory"]["activations"]["bytes"].get<int64_t>(), 4096);

  zero::testing::WriteWholeFile(dir + "/bad.json", R"([{"name": "a", "params": 10}, {"name": "b"}])");
  const ProgramRun bad = Exec(absl::StrCat(ZERO_ESTIMATE, " --units ", dir, "/bad.json"));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.all.find("unit 1 (\"b\")"), std::string::npos) << bad.all;

  // With "shapes", qgZ's records carry the unit's 1-D parameters exact: here b's 64 elements, all in shard 3 of
  // 1632, so every record grows by 64 f32 values. Rank 0 of 2 hosts of 2 sends 2 records inside its host and 1
  // across hosts per reduction.
  const std::string qgz =
      " --world 4 --ranks-per-host 2 --stage 2 --set zero_optimization.zero_quantized_gradients=true --json";
  zero::testing::WriteWholeFile(dir + "/flat.json", R"([{"name": "u", "params": 6464}])");
  zero::testing::WriteWholeFile(dir + "/shaped.json",
                                R"([{"name": "u", "params": 6464, "shapes": [[100, 64], [64]]}])");
  const ProgramRun flat = Exec(absl::StrCat(ZERO_ESTIMATE, " --units ", dir, "/flat.json", qgz));
  const ProgramRun shaped = Exec(absl::StrCat(ZERO_ESTIMATE, " --units ", dir, "/shaped.json", qgz));
  ASSERT_EQ(flat.exit_code, 0) << flat.all;
  ASSERT_EQ(shaped.exit_code, 0) << shaped.all;
  const json hs = LastJson(shaped)["host_bytes_per_step"], hf = LastJson(flat)["host_bytes_per_step"];
  EXPECT_EQ(hs["inter"].get<int64_t>() - hf["inter"].get<int64_t>(), 64 * 4);
  EXPECT_EQ(hs["intra"].get<int64_t>() - hf["intra"].get<int64_t>(), 2 * 64 * 4);
  for (const auto& [file, want] :
       {std::pair{R"([{"name": "u", "params": 6464, "shapes": [[100, 64], [60]]}])", "add up to 6460"},
        std::pair{R"([{"name": "u", "params": 6464, "shapes": [[100, 0]]}])", "\"shapes\""}}) {
    zero::testing::WriteWholeFile(dir + "/bad_shapes.json", file);
    const ProgramRun b = Exec(absl::StrCat(ZERO_ESTIMATE, " --units ", dir, "/bad_shapes.json", qgz));
    EXPECT_EQ(b.exit_code, 1) << file;
    EXPECT_NE(b.all.find(want), std::string::npos) << b.all;
  }
}

// A Hugging Face DeepSpeed config is estimated as it is: "auto" on keys that change no byte is left alone (said on
// stderr), the batch and bucket keys follow from the rest and the model, --set fills what does change bytes, and
// what is still missing is named.
TEST(EstimateCliTest, HuggingFaceAutoConfigWithSet) {
  const std::string dir = zero::testing::MakeTempDir("zero_estimate_hf");
  zero::testing::WriteWholeFile(dir + "/hf.json", R"({
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                  "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"})");
  const std::string base = absl::StrCat(ZERO_ESTIMATE, " --model tiny --world 2 --config ", dir, "/hf.json");
  const ProgramRun ok = Exec(
      base +
      " --set bf16.enabled=true --set gradient_accumulation_steps=1 --set train_micro_batch_size_per_gpu=2 --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.all;
  EXPECT_EQ(LastJson(ok)["dtype"], "bf16") << ok.out;
  for (const char* said :
       {"optimizer.params.lr: \"auto\" changes no byte", "fp16.enabled: \"auto\" is false",
        "zero_optimization.reduce_bucket_size: \"auto\" is hidden_size^2", "train_batch_size: \"auto\" is derived"}) {
    EXPECT_NE(ok.all.find(said), std::string::npos) << said << " in\n" << ok.all;
  }
  // Without them: the keys that change bytes are named, each with the --set to give.
  const ProgramRun missing = Exec(base);
  EXPECT_EQ(missing.exit_code, 1) << missing.all;
  for (const char* key :
       {"fp16.enabled", "bf16.enabled", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}) {
    EXPECT_NE(missing.all.find(absl::StrCat(key, ": \"auto\" changes the estimate; give its value with --set ", key)),
              std::string::npos)
        << key << " in\n"
        << missing.all;
  }
  // --set is validated like the JSON.
  const ProgramRun bad = Exec(base + " --set zero_optimization.stage=7");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.all.find("zero_optimization.stage: must be an integer in [0, 3]; got 7"), std::string::npos) << bad.all;
}

// A --set key whose rule names a flag's key (hpZ needs stage 3) is checked with the flags applied, once: the
// config's default stage 0 does not refuse it before --stage 3 is seen, and the order of the flags does not matter.
TEST(EstimateCliTest, SetIsValidatedAfterTheFlags) {
  const std::string hpz = " --set zero_optimization.zero_hpz_partition_size=2";
  const ProgramRun set_first = Exec(absl::StrCat(ZERO_ESTIMATE, " --model tiny --world 4", hpz, " --stage 3 --json"));
  ASSERT_EQ(set_first.exit_code, 0) << set_first.all;
  EXPECT_EQ(LastJson(set_first)["stage"], 3) << set_first.out;
  const ProgramRun stage_first = Exec(absl::StrCat(ZERO_ESTIMATE, " --model tiny --stage 3 --world 4", hpz, " --json"));
  ASSERT_EQ(stage_first.exit_code, 0) << stage_first.all;
  EXPECT_EQ(LastJson(set_first), LastJson(stage_first));
  // Still refused where the result breaks the rule.
  const ProgramRun stage2 = Exec(absl::StrCat(ZERO_ESTIMATE, " --model tiny --world 4", hpz, " --stage 2"));
  EXPECT_EQ(stage2.exit_code, 1) << stage2.all;
  EXPECT_NE(stage2.all.find("zero_optimization.zero_hpz_partition_size: 2 with zero_optimization.stage 2"),
            std::string::npos)
      << stage2.all;
}

TEST(EstimateCliTest, UsageErrors) {
  for (const char* args : {"", " --model tiny --units x.json", " --layers 4 --hidden 64", " --model huge",
                           " --model tiny --world 0", " --model tiny --stage 4", " --model tiny --frobnicate 1"}) {
    const ProgramRun r = Exec(absl::StrCat(ZERO_ESTIMATE, args));
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.all;
    EXPECT_NE(r.all.find("usage: zero-estimate"), std::string::npos) << args;
  }
  // The CUDA trainer has no recomputation; zero-gpt --device cuda --recompute refuses it too.
  const ProgramRun cuda = Exec(absl::StrCat(ZERO_ESTIMATE, " --model tiny --device cuda --recompute"));
  EXPECT_EQ(cuda.exit_code, 1);
  EXPECT_NE(cuda.all.find("--recompute"), std::string::npos) << cuda.all;
}

// Issue 32, case 5: a shape whose bytes would overflow int64 is refused, never printed as negative counts; flags
// out of range name their range; --fit-gib says when its search stopped at its cap, and a budget past 2^62 bytes
// is refused rather than wrapped into "not even one block fits".
TEST(EstimateCliTest, OverflowsAndCapsAreSaid) {
  ProgramRun r =
      Exec(absl::StrCat(ZERO_ESTIMATE, " --layers 100000 --hidden 1000000 --heads 1000 --vocab 50000 --seq 64"));
  EXPECT_EQ(r.exit_code, 2) << r.all;
  EXPECT_NE(r.all.find("--layers 100000: out of range [1, 65536]"), std::string::npos) << r.all;
  // Every flag in range, but 65536 blocks of hidden 2^20: about 8.6e17 parameters.
  r = Exec(absl::StrCat(ZERO_ESTIMATE, " --layers 65536 --hidden 1048576 --heads 1024 --vocab 50000 --seq 64"));
  EXPECT_EQ(r.exit_code, 1) << r.all;
  EXPECT_NE(r.all.find("beyond 2^62 bytes"), std::string::npos) << r.all;
  EXPECT_EQ(r.out.find('-'), std::string::npos) << r.out;
  r = Exec(absl::StrCat(ZERO_ESTIMATE, " --model tiny --fit-gib 9e9"));
  EXPECT_EQ(r.exit_code, 2) << r.all;
  EXPECT_NE(r.all.find("--fit-gib 9e+09: out of range (0, 4294967296] GiB"), std::string::npos) << r.all;
  // A small block in 1000 GiB: more than the search's 65536 blocks fit, and the answer says so.
  const std::string small = " --layers 1 --hidden 64 --heads 4 --vocab 256 --seq 32 --fit-gib 1000";
  r = Exec(absl::StrCat(ZERO_ESTIMATE, small));
  EXPECT_EQ(r.exit_code, 0) << r.all;
  EXPECT_NE(r.out.find("at least 65536 blocks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the search stops at 65536 blocks"), std::string::npos) << r.out;
  r = Exec(absl::StrCat(ZERO_ESTIMATE, small, " --json"));
  ASSERT_EQ(r.exit_code, 0) << r.all;
  EXPECT_EQ(LastJson(r)["fit"]["capped"], true) << r.out;
  EXPECT_EQ(LastJson(r)["fit"]["layers"], 65536) << r.out;
}

}  // namespace
