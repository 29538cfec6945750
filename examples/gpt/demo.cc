// zero-demo: the main job on an embedded default. Trains the reference GPT at every ZeRO stage with N ranks as
// threads (then stage 3 with bf16 compute, and with activation recomputation) and prints the bytes each rank holds
// by category beside the ZeRO paper's formula, the activation peak, the true peak per tier (all bytes alive at
// once), the loss and the step time — the trade-offs zero exists for, measured.
//
//   zero-demo [--model tiny|small] [--world N] [--steps K] [--csv FILE]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "support_threads.h"
#include "train.h"
#include "zero/config.h"

namespace {

// ZeRO paper model-state bytes per rank for fp32 Adam (Ψ elements, N ranks): 16Ψ, 8Ψ+8Ψ/N, 4Ψ+12Ψ/N, 16Ψ/N.
double FormulaBytes(int stage, double psi, int n) {
  switch (stage) {
    case 0: return 16 * psi;
    case 1: return 8 * psi + 8 * psi / n;
    case 2: return 4 * psi + 12 * psi / n;
    default: return 16 * psi / n;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "tiny", csv;
  int world = 4;
  int64_t steps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--model") model = argv[i + 1];
    else if (a == "--world") world = std::atoi(argv[i + 1]);
    else if (a == "--steps") steps = std::atoll(argv[i + 1]);
    else if (a == "--csv") csv = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: zero-demo [--model tiny|small] [--world N] [--steps K] [--csv FILE]\n");
      return 2;
    }
  }
  std::printf("zero demo: GPT '%s', %d ranks as threads over Gloo (loopback), AdamW, fp32 unless marked, %lld steps a run\n",
              model.c_str(), world, static_cast<long long>(steps));
  std::printf("model-state bytes are per rank (largest rank), measured by zero's allocation tracker; formula = ZeRO "
              "paper (16Ψ, 8Ψ+8Ψ/N, 4Ψ+12Ψ/N, 16Ψ/N) on the unpadded Ψ\n\n");
  std::printf("%-15s %10s %10s %10s %10s %12s %12s %12s %11s %11s %11s %8s %8s %8s\n", "stage", "params", "grads",
              "optimizer", "gather", "model_state", "formula", "state_device", "activations", "peak_device",
              "peak_host", "loss_0", "loss_end", "step_ms");
  FILE* out = csv.empty() ? nullptr : std::fopen(csv.c_str(), "w");
  if (out) {
    std::fprintf(out, "run,stage,world,params_bytes,grads_bytes,optimizer_bytes,gather_peak,model_state,formula,"
                      "model_state_device,activations_peak,loss_first,loss_last,step_ms,peak_total_device,"
                      "peak_total_host\n");
  }
  // Stages 0-3 in fp32, then stage 3 with bf16 compute, with every block recomputed, and with bf16 and the
  // optimizer and parameters offloaded to the host tier.
  struct Run {
    int stage;
    bool bf16;
    bool recompute;
    bool offload;
    const char* name;
  };
  const Run runs[] = {{0, false, false, false, "0"},           {1, false, false, false, "1"},
                      {2, false, false, false, "2"},           {3, false, false, false, "3"},
                      {3, true, false, false, "3 bf16"},       {3, false, true, false, "3 recompute"},
                      {3, true, false, true, "3 bf16 offload"}};
  for (const Run& run : runs) {
    const int stage = run.stage;
    zero::Config cfg = zero::Config::Default();
    cfg.zero.stage = stage;
    cfg.bf16.enabled = run.bf16;
    if (run.offload) {
      cfg.zero.offload_optimizer.device = zero::OffloadDevice::kCpu;
      cfg.zero.offload_param.device = zero::OffloadDevice::kCpu;
    }
    cfg.zero.stage3_param_persistence_threshold = 0;  // shard every unit, so the formula applies to all
    cfg.train_micro_batch_size_per_gpu = 4;
    cfg.train_batch_size.reset();
    cfg.optimizer->lr = 3e-3;
    zero::gpt::TrainOptions opt;
    opt.model = model;
    opt.steps = steps;
    opt.local_world_size = world;
    opt.recompute = run.recompute;
    auto results = zero::gpt::RunThreadRanks(world, cfg, opt);
    if (!results.ok()) {
      std::fprintf(stderr, "zero-demo: stage %d: %s\n", stage, results.status().ToString().c_str());
      return 1;
    }
    const auto& r0 = (*results)[0];
    int64_t worst_state = 0, params = 0, grads = 0, optim = 0, gather = 0, acts = 0, on_device = 0;
    int64_t peak_device = 0, peak_host = 0;  // the largest rank's true peak per tier, all tags alive at once
    for (const auto& m : r0.all_ranks) {
      if (m.ModelStateBytes() >= worst_state) {
        worst_state = m.ModelStateBytes();
        // Both tiers: the host engine's compute tier ("device") and, with offload, the host tier.
        auto both = [&](zero::MemTag t, bool peak) {
          const auto& h = m.Get(zero::MemTier::kHost, t);
          const auto& d = m.Get(zero::MemTier::kDevice, t);
          return peak ? h.peak + d.peak : h.current + d.current;
        };
        params = both(zero::MemTag::kParams, false);
        grads = both(zero::MemTag::kGrads, false);
        optim = both(zero::MemTag::kOptimizer, false);
        gather = both(zero::MemTag::kGather, true);
        acts = both(zero::MemTag::kActivations, true);
        peak_device = m.PeakTotal(zero::MemTier::kDevice);
        peak_host = m.PeakTotal(zero::MemTier::kHost);
        on_device = 0;  // model state left in the compute tier (offload moves it to the host tier)
        for (auto t : {zero::MemTag::kParams, zero::MemTag::kGrads, zero::MemTag::kOptimizer, zero::MemTag::kMaster}) {
          on_device += m.Get(zero::MemTier::kDevice, t).current;
        }
      }
    }
    double ms = 0;
    for (size_t s = 1; s < r0.steps.size(); ++s) ms += r0.steps[s].step_ms;
    ms /= std::max<size_t>(1, r0.steps.size() - 1);
    // fp32 and bf16 Adam have the same formula at stage 3 (16Ψ/N); the split between tags differs.
    const double formula = FormulaBytes(stage, static_cast<double>(r0.params), world);
    std::printf("%-15s %10lld %10lld %10lld %10lld %12lld %12.0f %12lld %11lld %11lld %11lld %8.4f %8.4f %8.1f\n",
                run.name, static_cast<long long>(params), static_cast<long long>(grads), static_cast<long long>(optim),
                static_cast<long long>(gather), static_cast<long long>(worst_state), formula,
                static_cast<long long>(on_device), static_cast<long long>(acts), static_cast<long long>(peak_device),
                static_cast<long long>(peak_host), r0.steps.front().loss, r0.steps.back().loss, ms);
    if (out) {
      std::fprintf(out, "%s,%d,%d,%lld,%lld,%lld,%lld,%lld,%.0f,%lld,%lld,%.6f,%.6f,%.3f,%lld,%lld\n", run.name, stage,
                   world, static_cast<long long>(params), static_cast<long long>(grads), static_cast<long long>(optim),
                   static_cast<long long>(gather), static_cast<long long>(worst_state), formula,
                   static_cast<long long>(on_device), static_cast<long long>(acts), r0.steps.front().loss,
                   r0.steps.back().loss, ms, static_cast<long long>(peak_device), static_cast<long long>(peak_host));
    }
  }
  if (out) std::fclose(out);
  std::printf("\nmodel_state - formula = padding (each unit padded to a multiple of 32*N elements); bf16 keeps 16-bit "
              "params and grads plus an fp32 master shard (still 16Ψ/N at stage 3). state_device = model state left in the "
              "compute tier (offload moves master, optimizer state and shards to the host tier; on this host engine "
              "both tiers are host DRAM). activations = peak bytes of the "
              "trainer's activation arena. peak_device / peak_host = the true peak of each tier: the most bytes "
              "alive at once, all tags and the communicator's staging together (below the sum of the per-tag peaks "
              "when they peak at different times). step_ms is wall time on this machine, all ranks sharing its cores.\n");
  return 0;
}
