// bench/init_agreement_bench.cc — zero-bench-init-sync: what the ranks' agreement on initial values costs at
// Finalize (EngineOptions::initial_value_sync), on the reference GPT's units, N thread-ranks over Gloo.
//
//   zero-bench-init-sync [--model small] [--world 4] [--reps 3]
//
// Modes, each timed side by side in one run (the median of --reps Finalize calls; each call's time is the
// slowest rank's, which is what the job waits for before its first step: with the check, Finalize's hash
// exchange makes every rank wait for the last one there, without it the first collective of the step does):
//   trust          no check, no collective (the time of evaluating and placing the values alone)
//   rank0          the default: one hash all-gather per parameter; every rank agrees, nothing is broadcast
//   require        the same exchange, a difference would be an error
//   rank0-differ   the default with every parameter's values different on rank 1: each is broadcast from rank 0
// Bytes each rank sends or receives for the agreement are counted from the exchange's sizes: 8 bytes per rank
// per parameter for the hashes, plus 4 bytes per element broadcast.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpt/model.h"
#include "thread_ranks.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Mode {
  const char* name;
  zero::InitialValueSync sync;
  bool differ;
};

}  // namespace

int main(int argc, char** argv) {
  std::string model = "small";
  int world = 4, reps = 3;
  constexpr const char* kUsage = "usage: zero-bench-init-sync [--model tiny|small] [--world N] [--reps R]\n";
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    // Every flag takes a value; it is read once the flag is known, so an unknown last flag is named as unknown.
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--model") model = v;
    else if (a == "--world") world = std::atoi(v);
    else if (a == "--reps") reps = std::atoi(v);
    else {
      std::fprintf(stderr, "zero-bench-init-sync: unknown flag %s\n%s", a.c_str(), kUsage);
      return 2;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "zero-bench-init-sync: %s needs a value\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  auto mc_or = zero::gpt::GptConfig::FromName(model);
  if (!mc_or.ok()) {
    std::fprintf(stderr, "zero-bench-init-sync: %s\n", zero::ErrorText(mc_or.status()).c_str());
    return 2;
  }
  const zero::gpt::GptConfig mc = *mc_or;
  std::vector<std::pair<std::string, std::vector<zero::ParamSpec>>> units;
  auto to_engine = [](const std::vector<zero::gpt::ParamSpec>& specs) {
    std::vector<zero::ParamSpec> out;
    for (const auto& s : specs) out.push_back({s.name, s.shape});
    return out;
  };
  units.push_back({"root", to_engine(zero::gpt::RootParams(mc))});
  for (int l = 0; l < mc.layers; ++l)
    units.push_back({zero::gpt::BlockUnitName(l), to_engine(zero::gpt::BlockParams(mc))});
  int64_t params = 0, tensors = 0;
  for (const auto& [n, specs] : units) {
    for (const auto& s : specs) {
      params += s.numel();
      ++tensors;
    }
  }
  std::printf(
      "# zero-bench-init-sync: GPT %s, %lld parameters in %lld tensors, world %d, stage 3, fp32, median of %d, slowest "
      "rank\n",
      model.c_str(), static_cast<long long>(params), static_cast<long long>(tensors), world, reps);
  std::printf("%-13s %12s %12s %14s\n", "mode", "finalize_ms", "vs_trust", "bytes_per_rank");
  const Mode modes[] = {{"trust", zero::InitialValueSync::kTrust, false},
                        {"rank0", zero::InitialValueSync::kFromRank0, false},
                        {"require", zero::InitialValueSync::kRequireEqual, false},
                        {"rank0-differ", zero::InitialValueSync::kFromRank0, true}};
  double trust_ms = 0;
  for (const Mode& m : modes) {
    std::vector<double> times;
    for (int rep = 0; rep < reps; ++rep) {
      std::vector<double> ms(world, 0);
      const std::vector<absl::Status> status =
          zero::bench::RunGlooThreadRanks(world, [&](std::shared_ptr<zero::Communicator> comm, int r) {
            zero::Config cfg = zero::Config::Default();
            cfg.zero.stage = 3;
            cfg.train_micro_batch_size_per_gpu = 1;
            cfg.train_batch_size.reset();
            zero::OptimizerConfig o;
            o.type = "AdamW";
            cfg.optimizer = o;
            zero::EngineOptions opts;
            opts.initial_value_sync = m.sync;
            opts.local_world_size = world;
            ZERO_ASSIGN_OR_RETURN(auto e, zero::Engine::Create(cfg, std::move(comm), opts));
            for (const auto& [n, specs] : units) ZERO_RETURN_IF_ERROR(e->AddUnit(n, specs).status());
            const auto t0 = Clock::now();
            zero::Status s = e->Finalize([&](const std::string& unit, const zero::ParamSpec& p, float* v) {
              (void)zero::gpt::InitParam(1234, mc, unit, zero::gpt::ParamSpec{p.name, p.shape}, v);
              if (m.differ && r == 1) v[0] += 1.0f;
            });
            ms[r] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
            return s;
          });
      for (int r = 0; r < world; ++r) {
        if (!status[r].ok()) {
          std::fprintf(stderr, "%s rank %d: %s\n", m.name, r, zero::ErrorText(status[r]).c_str());
          return 1;
        }
      }
      times.push_back(*std::max_element(ms.begin(), ms.end()));  // the job waits for the slowest rank
    }
    std::sort(times.begin(), times.end());
    const double med = times[times.size() / 2];
    if (m.sync == zero::InitialValueSync::kTrust) trust_ms = med;
    const long long bytes =
        m.sync == zero::InitialValueSync::kTrust ? 0 : 8LL * world * tensors + (m.differ ? 4LL * params : 0);
    std::printf("%-13s %12.1f %12.2f %14lld\n", m.name, med, trust_ms > 0 ? med / trust_ms : 1.0, bytes);
  }
  return 0;
}
