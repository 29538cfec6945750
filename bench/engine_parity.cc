// bench/engine_parity.cc — zero-bench-parity: a bit-exact fingerprint of the reference GPT trained through the
// Engine, for before/after records of changes that must not change behaviour (a refactor, a new code path).
//
//   zero-bench-parity [--world 4] [--steps 8] [--model tiny] [--stages 0,1,2,3]
//
// For every stage × compute dtype (fp32, bf16) × offload (none; cpu: offload_optimizer at stages 1-2, optimizer
// and parameters at stage 3) it trains N thread-ranks over Gloo and prints one JSON line: every step's loss and
// gradient norm as hexadecimal floats (%a, exact), and an FNV-1a hash of the final fp32 parameters' bits.
// Two builds agree bit for bit exactly when their lines are equal (diff the outputs).
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gpt/train.h"
#include "thread_ranks.h"
#include "zero/communicator.h"
#include "zero/config.h"

namespace {

uint64_t HashFloats(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::string ConfigJson(int stage, bool bf16, bool offload) {
  std::string zero_opt = absl::StrCat("\"stage\": ", stage, ", \"overlap_comm\": true, \"sub_group_size\": 100000");
  if (offload && stage >= 1) {
    absl::StrAppend(&zero_opt, ", \"offload_optimizer\": {\"device\": \"cpu\"}");
    if (stage == 3) absl::StrAppend(&zero_opt, ", \"offload_param\": {\"device\": \"cpu\"}");
  }
  return absl::StrCat(
      "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2, \"gradient_clipping\": 1.0,"
      " \"bf16\": {\"enabled\": ",
      bf16 ? "true" : "false",
      "},"
      " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001, \"betas\": [0.9, 0.95], \"eps\": 1e-8,"
      " \"weight_decay\": 0.1}},"
      " \"zero_optimization\": {",
      zero_opt, "}}");
}

}  // namespace

int main(int argc, char** argv) {
  int world = 4;
  int64_t steps = 8;
  std::string model = "tiny";
  std::vector<int> stages = {0, 1, 2, 3};
  constexpr const char* kUsage =
      "usage: zero-bench-parity [--world N] [--steps K] [--model tiny|small] [--stages 0,1,2,3]\n";
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    // Every flag takes a value; it is read once the flag is known, so an unknown last flag is named as unknown.
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--world") {
      world = std::atoi(v.c_str());
    } else if (a == "--steps") {
      steps = std::atoll(v.c_str());
    } else if (a == "--model") {
      model = v;
    } else if (a == "--stages") {
      stages.clear();
      for (auto s : absl::StrSplit(v, ',')) stages.push_back(std::atoi(std::string(s).c_str()));
    } else {
      std::fprintf(stderr, "zero-bench-parity: unknown flag %s\n%s", a.c_str(), kUsage);
      return 2;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "zero-bench-parity: %s needs a value\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  int failures = 0;
  for (int stage : stages) {
    for (bool bf16 : {false, true}) {
      for (bool offload : {false, true}) {
        if (offload && stage == 0) continue;  // offload applies from stage 1
        auto cfg = zero::Config::FromJsonString(ConfigJson(stage, bf16, offload));
        if (!cfg.ok()) {
          std::fprintf(stderr, "config: %s\n", zero::ErrorText(cfg.status()).c_str());
          return 1;
        }
        zero::gpt::TrainOptions opt;
        opt.model = model;
        opt.steps = steps;
        opt.local_world_size = world;
        std::vector<zero::StatusOr<zero::gpt::TrainResult>> results(world, absl::UnknownError("not run"));
        const std::vector<absl::Status> status =
            zero::bench::RunGlooThreadRanks(world, [&](std::shared_ptr<zero::Communicator> comm, int r) {
              results[r] = zero::gpt::TrainRank(*cfg, std::move(comm), opt, {}, /*collect_final_params=*/true);
              return results[r].status();
            });
        std::string line = absl::StrCat("{\"stage\": ", stage, ", \"dtype\": \"", bf16 ? "bf16" : "fp32",
                                        "\", \"offload\": \"", offload ? "cpu" : "none", "\", \"world\": ", world);
        bool ok = true;
        for (int r = 0; r < world; ++r) {
          if (!status[r].ok()) {
            std::fprintf(stderr, "stage %d %s offload %d rank %d: %s\n", stage, bf16 ? "bf16" : "fp32", offload, r,
                         zero::ErrorText(status[r]).c_str());
            ok = false;
          }
        }
        if (!ok) {
          ++failures;
          continue;
        }
        const auto& res = *results[0];
        std::string losses, norms;
        char buf[64];
        for (const auto& s : res.steps) {
          std::snprintf(buf, sizeof(buf), "%s\"%a\"", losses.empty() ? "" : ", ", s.loss);
          losses += buf;
          std::snprintf(buf, sizeof(buf), "%s\"%a\"", norms.empty() ? "" : ", ", s.grad_norm);
          norms += buf;
        }
        std::snprintf(buf, sizeof(buf), "%016" PRIx64, HashFloats(res.final_params));
        absl::StrAppend(&line, ", \"losses\": [", losses, "], \"grad_norms\": [", norms, "], \"param_hash\": \"", buf,
                        "\", \"params\": ", res.final_params.size(), "}");
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      }
    }
  }
  return failures == 0 ? 0 : 1;
}
