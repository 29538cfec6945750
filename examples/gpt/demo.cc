// zero-demo: the main job on an embedded default. Trains the reference GPT at every ZeRO stage with N ranks as
// threads (then stage 3 with bf16 compute, with activation recomputation, and with bf16 and offload), and shows the
// bytes each rank holds by category, measured by zero's allocation tracker, beside what zero::Estimate predicted
// before the run, the ZeRO paper's formula, the true peak per tier (all bytes alive at once), the loss and the
// tokens per second — the trade-offs zero exists for, measured.
//
//   zero-demo [--model tiny|small] [--world N] [--steps K] [--out DIR]
//
// Writes DIR/zero-demo.csv (default DIR: demo-out) and, where gnuplot is installed, DIR/zero-demo.png: memory per
// rank by category as stacked bars per run, the estimate's bar beside each, and the tokens per second
// (examples/gpt/plot_demo.gp draws it). While it trains, a progress line (plain lines when stdout is not a
// terminal).
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "estimate.h"
#include "model.h"
#include "progress.h"
#include "support_threads.h"
#include "train.h"
#include "zero/config.h"
#include "zero/estimate.h"

#ifndef ZERO_DEMO_PLOT
#define ZERO_DEMO_PLOT "examples/gpt/plot_demo.gp"
#endif

namespace {

// ZeRO paper model-state bytes per rank for Adam (Ψ elements, N ranks): 16Ψ, 8Ψ+8Ψ/N, 4Ψ+12Ψ/N, 16Ψ/N in fp32;
// 16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N with 16-bit compute over an fp32 master.
double FormulaBytes(int stage, bool mixed, double psi, int n) {
  switch (stage) {
    case 0: return 16 * psi;
    case 1: return mixed ? 4 * psi + 12 * psi / n : 8 * psi + 8 * psi / n;
    case 2: return mixed ? 2 * psi + 14 * psi / n : 4 * psi + 12 * psi / n;
    default: return 16 * psi / n;
  }
}

// The categories of the bars, in stacking order (bottom first), with the tags of zero's reports.
constexpr zero::MemTag kCategories[] = {zero::MemTag::kParams,      zero::MemTag::kGrads,  zero::MemTag::kOptimizer,
                                        zero::MemTag::kMaster,      zero::MemTag::kGather, zero::MemTag::kBuckets,
                                        zero::MemTag::kActivations, zero::MemTag::kStaging};
constexpr size_t kNumCategories = sizeof(kCategories) / sizeof(kCategories[0]);

// A tag's peak in both tiers (the host engine's compute tier, "device", and with offload the host tier).
int64_t BothTiers(const zero::MemoryReport& r, zero::MemTag tag) {
  return r.Get(zero::MemTier::kHost, tag).peak + r.Get(zero::MemTier::kDevice, tag).peak;
}

struct Run {
  int stage;
  bool bf16;
  bool recompute;
  bool offload;
  const char* name;
};

struct Row {
  const Run* run;
  int64_t measured[kNumCategories] = {};
  int64_t estimated[kNumCategories] = {};
  int64_t state = 0, planned_state = 0;
  double formula = 0;
  int64_t peak_device = 0, peak_host = 0, est_peak_device = 0, est_peak_host = 0;
  double loss_first = 0, loss_last = 0, step_ms = 0, tokens_per_s = 0;
};

double Mib(int64_t b) { return static_cast<double>(b) / (1 << 20); }

bool HaveGnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

}  // namespace

int main(int argc, char** argv) {
  std::string model = "tiny", out_dir = "demo-out";
  int world = 4;
  int64_t steps = 10;
  constexpr const char* kUsage = "usage: zero-demo [--model tiny|small] [--world N] [--steps K] [--out DIR]\n";
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
    else if (a == "--steps") steps = std::atoll(v);
    else if (a == "--out") out_dir = v;
    else {
      std::fprintf(stderr, "zero-demo: unknown flag %s\n%s", a.c_str(), kUsage);
      return 2;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "zero-demo: %s needs a value\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (world < 1 || steps < 1) {
    std::fprintf(stderr, "zero-demo: --world and --steps must be at least 1\n%s", kUsage);
    return 2;
  }
  auto mc = zero::gpt::GptConfig::FromName(model);
  if (!mc.ok()) {
    std::fprintf(stderr, "zero-demo: %s\n", std::string(mc.status().message()).c_str());
    return 2;
  }
  if (::mkdir(out_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "zero-demo: --out %s: %s\n", out_dir.c_str(), std::strerror(errno));
    return 1;
  }
  std::printf(
      "zero demo: GPT '%s', %d ranks as threads over Gloo (loopback), AdamW, fp32 unless marked, %lld steps a run\n",
      model.c_str(), world, static_cast<long long>(steps));
  std::fflush(stdout);
  // Stages 0-3 in fp32, then stage 3 with bf16 compute, with every block recomputed, and with bf16 and the
  // optimizer and parameters offloaded to the host tier.
  static const Run runs[] = {{0, false, false, false, "0"},           {1, false, false, false, "1"},
                             {2, false, false, false, "2"},           {3, false, false, false, "3"},
                             {3, true, false, false, "3 bf16"},       {3, false, true, false, "3 recompute"},
                             {3, true, false, true, "3 bf16 offload"}};
  constexpr int kRuns = sizeof(runs) / sizeof(runs[0]);
  zero::gpt::Progress progress(stdout, zero::gpt::Progress::ModeFor(stdout, /*json=*/false),
                               /*lines_every=*/std::max<int64_t>(1, steps / 2));
  std::vector<Row> rows;
  for (int k = 0; k < kRuns; ++k) {
    const Run& run = runs[k];
    zero::Config cfg = zero::Config::Default();
    cfg.zero.stage = run.stage;
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
    // The prediction first, from the config alone, as zero-estimate makes it.
    auto est = zero::gpt::EstimateGpt(cfg, *mc, 0, world, run.recompute);
    if (!est.ok()) {
      progress.Clear();
      std::fprintf(stderr, "zero-demo: estimate of run %s: %s\n", run.name, zero::ErrorText(est.status()).c_str());
      return 1;
    }
    const std::string label = absl::StrFormat("run %d/%d (%s)", k + 1, kRuns, run.name);
    auto results = zero::gpt::RunThreadRanks(world, cfg, opt, [&](const zero::gpt::StepLog& s) {
      progress.Step(label, s.step + 1, steps, s, steps * (kRuns - 1 - k));
    });
    if (!results.ok()) {
      progress.Clear();
      std::fprintf(stderr, "zero-demo: run %s: %s\n", run.name, zero::ErrorText(results.status()).c_str());
      return 1;
    }
    const auto& r0 = (*results)[0];
    Row row;
    row.run = &run;
    // Per category the largest rank's peak; per tier the largest rank's true peak (all tags alive at once).
    for (const auto& m : r0.all_ranks) {
      for (size_t c = 0; c < kNumCategories; ++c)
        row.measured[c] = std::max(row.measured[c], BothTiers(m, kCategories[c]));
      row.state = std::max(row.state, m.ModelStateBytes());
      row.peak_device = std::max(row.peak_device, m.PeakTotal(zero::MemTier::kDevice));
      row.peak_host = std::max(row.peak_host, m.PeakTotal(zero::MemTier::kHost));
    }
    for (size_t c = 0; c < kNumCategories; ++c) row.estimated[c] = BothTiers(est->memory, kCategories[c]);
    row.planned_state = est->planned.ModelStateBytes();
    row.est_peak_device = est->memory.PeakTotal(zero::MemTier::kDevice);
    row.est_peak_host = est->memory.PeakTotal(zero::MemTier::kHost);
    row.formula = FormulaBytes(run.stage, run.bf16, static_cast<double>(r0.params), world);
    row.loss_first = r0.steps.front().loss;
    row.loss_last = r0.steps.back().loss;
    // Steady state: the first step fills the pools and records the gather order.
    double ms = 0, tps = 0;
    for (size_t s = 1; s < r0.steps.size(); ++s) {
      ms += r0.steps[s].step_ms;
      tps += r0.steps[s].tokens_per_s;
    }
    const double n = static_cast<double>(std::max<size_t>(1, r0.steps.size() - 1));
    row.step_ms = r0.steps.size() > 1 ? ms / n : r0.steps[0].step_ms;
    row.tokens_per_s = r0.steps.size() > 1 ? tps / n : r0.steps[0].tokens_per_s;
    rows.push_back(row);
  }
  progress.Finish();

  std::printf(
      "\nMiB per rank (the largest rank), each category at its peak, both tiers; the second line of each run is "
      "zero::Estimate's prediction, made before the run from the config alone\n\n");
  std::printf("%-16s %8s %8s %8s %8s %8s %8s %8s %8s %9s %9s %9s %9s %8s %8s %9s\n", "run", "params", "grads", "optim",
              "master", "gather", "buckets", "activ", "staging", "state", "formula", "peak_dev", "peak_host", "loss_0",
              "loss_end", "tok/s");
  for (const Row& r : rows) {
    std::printf("%-16s", r.run->name);
    for (int64_t b : r.measured) std::printf(" %8.3f", Mib(b));
    std::printf(" %9.3f %9.3f %9.3f %9.3f %8.4f %8.4f %9.0f\n", Mib(r.state), r.formula / (1 << 20), Mib(r.peak_device),
                Mib(r.peak_host), r.loss_first, r.loss_last, r.tokens_per_s);
    std::printf("%-16s", "  estimate");
    for (int64_t b : r.estimated) std::printf(" %8.3f", Mib(b));
    std::printf(" %9.3f %9s %9.3f %9.3f\n", Mib(r.planned_state), "", Mib(r.est_peak_device), Mib(r.est_peak_host));
  }
  std::printf(
      "\nstate = model state (params, grads, optimizer, master); state - formula = padding (each unit padded to a "
      "multiple of 32*N elements). bf16 keeps 16-bit params and grads plus an fp32 master shard. With offload the "
      "master, optimizer state and shards sit in the host tier (on this host engine both tiers are host DRAM). "
      "activ = the trainer's activations (its arena and checkpoints); staging = the communicator's cached buffers "
      "and the trainer's fp32 copies of 16-bit units. peak_dev / peak_host = the true peak of each tier: the most "
      "bytes alive at once, all tags together (below the sum of the per-tag peaks when they peak at different "
      "times); the estimate's is the placement plan's bound on it. tok/s: tokens of all ranks per second of wall "
      "time after the first step, all ranks sharing this machine's cores.\n");

  const std::string csv = out_dir + "/zero-demo.csv", png = out_dir + "/zero-demo.png";
  FILE* out = std::fopen(csv.c_str(), "w");
  if (out == nullptr) {
    std::fprintf(stderr, "zero-demo: cannot write %s: %s\n", csv.c_str(), std::strerror(errno));
    return 1;
  }
  std::fprintf(out, "run,model,world,stage,dtype,recompute,offload");
  for (zero::MemTag t : kCategories) std::fprintf(out, ",%s", zero::MemTagName(t));
  for (zero::MemTag t : kCategories) std::fprintf(out, ",est_%s", zero::MemTagName(t));
  std::fprintf(out,
               ",model_state,est_model_state,formula,peak_device,peak_host,est_peak_device,est_peak_host,loss_first,"
               "loss_last,step_ms,tokens_per_s\n");
  for (const Row& r : rows) {
    std::fprintf(out, "%s,%s,%d,%d,%s,%d,%d", r.run->name, model.c_str(), world, r.run->stage,
                 r.run->bf16 ? "bf16" : "fp32", r.run->recompute ? 1 : 0, r.run->offload ? 1 : 0);
    for (int64_t b : r.measured) std::fprintf(out, ",%lld", static_cast<long long>(b));
    for (int64_t b : r.estimated) std::fprintf(out, ",%lld", static_cast<long long>(b));
    std::fprintf(out, ",%lld,%lld,%.0f,%lld,%lld,%lld,%lld,%.6f,%.6f,%.3f,%.1f\n", static_cast<long long>(r.state),
                 static_cast<long long>(r.planned_state), r.formula, static_cast<long long>(r.peak_device),
                 static_cast<long long>(r.peak_host), static_cast<long long>(r.est_peak_device),
                 static_cast<long long>(r.est_peak_host), r.loss_first, r.loss_last, r.step_ms, r.tokens_per_s);
  }
  std::fclose(out);
  std::printf("\nwrote %s\n", csv.c_str());
  std::fflush(stdout);  // before gnuplot's own output, if any
  if (!HaveGnuplot()) {
    std::printf(
        "gnuplot is not installed, so no picture: only %s (scripts/install-deps.sh installs gnuplot-nox; then "
        "gnuplot -e \"csv='%s'; png='%s'\" %s draws it)\n",
        csv.c_str(), csv.c_str(), png.c_str(), ZERO_DEMO_PLOT);
    return 0;
  }
  const std::string title =
      absl::StrCat("zero-demo: GPT ", model, ", ", world, " ranks as threads, ", steps, " steps a run");
  const std::string cmd =
      absl::StrCat("gnuplot -e \"csv='", csv, "'; png='", png, "'; title='", title, "'\" '", ZERO_DEMO_PLOT, "'");
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "zero-demo: gnuplot failed (%s); the CSV is %s\n", cmd.c_str(), csv.c_str());
    return 1;
  }
  std::printf("wrote %s\n", png.c_str());
  return 0;
}
