// zero-bench-optim — the CPU AdamW step next to the memory-bandwidth bound and torch.optim.AdamW.
//
//   build/bin/zero-bench-optim [--params N] [--threads T] [--reps R] [--json] [--no-torch] [--simd TARGET]
//
// --simd forces one of the kernels' SIMD targets (AVX3, AVX2, SSE4, SCALAR, ...; default: the best this CPU
// runs). With a cache-resident size (e.g. --params 65536 --threads 1 --reps 2000) it measures the kernels'
// compute rate instead of the memory bound.
//
// Kernels (zero::MakeAdam + zero::ParallelUpdate, the engine's path):
//   adamw_fp32  f32 p, g, m, v                          28 B/param: read p g m v (16), write p m v (12)
//   adamw_bf16  bf16 g in, f32 p m v, bf16 p copy out   28 B/param: read g16 p m v (14), write p m v p16 (14)
// Bound: a STREAM triad (a[i] = b[i] + s * c[i], doubles) in this process, on the same thread pool, the same
// number of threads and the same total footprint as the fp32 kernel, run interleaved with each kernel's
// repetitions so both see the same machine state. Two byte counts for it:
//   stream_gbps      STREAM's own count, 24 B/element (read b, c; write a)
//   stream_rfo_gbps  the DRAM traffic when the stores allocate (read-for-ownership of a): 32 B/element
// `ratio` = gbps / stream_gbps, as the issue defines it; `ratio_rfo` = gbps / stream_rfo_gbps is the fair one,
// since AdamW's stores go to lines it has just read (no extra RFO traffic) while the triad's do not.
// All rates are the best of R repetitions (STREAM's convention); medians are printed too.
// torch: bench/torch_adamw.py run with /usr/bin/python3 (foreach and single-tensor, the faster counts), once
// before and once after zero's kernels; the faster of the two runs counts, so a machine that changes speed in
// between (this dev VM does) does not inflate the speedup.

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "optim/internal/kernels.h"
#include "optim/internal/thread_pool.h"
#include "zero/dtype.h"
#include "zero/optimizer.h"

#ifndef ZERO_TORCH_ADAMW_SCRIPT
#define ZERO_TORCH_ADAMW_SCRIPT "bench/torch_adamw.py"
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  size_t params = 64'000'000;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int reps = 10;
  bool json = false;
  bool torch = true;
  std::string torch_script = ZERO_TORCH_ADAMW_SCRIPT;
  std::string simd;
};

[[noreturn]] void Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--params N] [--threads T] [--reps R] [--json] [--no-torch] [--torch-script PATH] "
               "[--simd TARGET]\n",
               argv0);
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) Usage(argv[0]);
      return argv[++i];
    };
    if (a == "--params") o.params = std::strtoull(next(), nullptr, 10);
    else if (a == "--threads") o.threads = std::atoi(next());
    else if (a == "--reps") o.reps = std::atoi(next());
    else if (a == "--json") o.json = true;
    else if (a == "--no-torch") o.torch = false;
    else if (a == "--torch-script") o.torch_script = next();
    else if (a == "--simd") o.simd = next();
    else Usage(argv[0]);
  }
  if (o.params < 1024 || o.threads < 1 || o.reps < 1) Usage(argv[0]);
  return o;
}

// 2 MiB-aligned, transparent-huge-page backed (where the kernel allows), first touched by the same static
// partition the kernels use, so pages and TLB behave alike for the triad and the optimizer.
class Buffer {
 public:
  Buffer(size_t bytes, int threads) : bytes_((bytes + kHuge - 1) / kHuge * kHuge) {
    data_ = static_cast<char*>(std::aligned_alloc(kHuge, bytes_));
    if (data_ == nullptr) {
      std::fprintf(stderr, "out of memory allocating %zu bytes\n", bytes_);
      std::exit(1);
    }
    madvise(data_, bytes_, MADV_HUGEPAGE);
    zero::optim_internal::ParallelFor(threads, threads, [&](size_t t) {
      const size_t chunk = bytes_ / threads, begin = t * chunk;
      std::memset(data_ + begin, 0, t + 1 == static_cast<size_t>(threads) ? bytes_ - begin : chunk);
    });
  }
  ~Buffer() { std::free(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }

 private:
  static constexpr size_t kHuge = 2u << 20;
  size_t bytes_;
  char* data_;
};

// Deterministic pseudo-random fill in [lo, hi), in parallel.
void Fill(float* x, size_t n, float lo, float hi, uint64_t seed, int threads) {
  zero::optim_internal::ParallelFor(threads, threads, [&](size_t t) {
    const size_t chunk = (n + threads - 1) / threads, begin = t * chunk, end = std::min(n, begin + chunk);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + t;
    for (size_t i = begin; i < end; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      x[i] = lo + (hi - lo) * static_cast<float>(s >> 40) * (1.0f / 16777216.0f);
    }
  });
}

// STREAM triad on one thread's chunk. target_clones: the best of AVX-512/AVX2/SSE2 for this CPU, like the
// optimizer kernels' runtime dispatch, so the bound is not handicapped by the x86-64 baseline.
__attribute__((target_clones("avx512f", "avx2", "default"))) void TriadChunk(double* __restrict a,
                                                                           const double* __restrict b,
                                                                           const double* __restrict c, double s,
                                                                           size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

struct Stats {
  double best_s = INFINITY;
  std::vector<double> all;
  void Add(double s) {
    best_s = std::min(best_s, s);
    all.push_back(s);
  }
  double Median() const {
    std::vector<double> v = all;
    std::sort(v.begin(), v.end());
    return v.empty() ? NAN : v[v.size() / 2];
  }
};

class Triad {
 public:
  Triad(size_t elems, int threads)
      : n_(elems), threads_(threads), a_(elems * 8, threads), b_(elems * 8, threads), c_(elems * 8, threads) {
    std::fill(b_.as<double>(), b_.as<double>() + n_, 1.0);
    std::fill(c_.as<double>(), c_.as<double>() + n_, 2.0);
  }
  double RunSeconds() {
    const auto t0 = Clock::now();
    zero::optim_internal::ParallelFor(threads_, threads_, [&](size_t t) {
      const size_t chunk = (n_ + threads_ - 1) / threads_, begin = t * chunk, end = std::min(n_, begin + chunk);
      TriadChunk(a_.as<double>() + begin, b_.as<double>() + begin, c_.as<double>() + begin, 3.0, end - begin);
    });
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  size_t elems() const { return n_; }

 private:
  size_t n_;
  int threads_;
  Buffer a_, b_, c_;
};

struct KernelResult {
  std::string kernel;
  int bytes_per_param;
  Stats kernel_stats, triad_stats;
};

// Runs `reps` interleaved (triad, kernel step) pairs after one warm-up of each.
template <class StepFn>
KernelResult Measure(const std::string& name, int bytes_per_param, Triad& triad, int reps, StepFn step) {
  KernelResult r{name, bytes_per_param, {}, {}};
  triad.RunSeconds();
  step();
  for (int i = 0; i < reps; ++i) {
    r.triad_stats.Add(triad.RunSeconds());
    const auto t0 = Clock::now();
    step();
    r.kernel_stats.Add(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return r;
}

KernelResult RunAdamW(bool bf16, const Options& o, Triad& triad) {
  const size_t n = o.params;
  auto opt = zero::MakeAdam({.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01});
  Buffer p(n * 4, o.threads), m(n * 4, o.threads), v(n * 4, o.threads);
  Buffer g(n * (bf16 ? 2 : 4), o.threads);
  std::unique_ptr<Buffer> p16;
  Fill(p.as<float>(), n, -0.1f, 0.1f, 1, o.threads);
  if (bf16) {
    Buffer tmp(n * 4, o.threads);
    Fill(tmp.as<float>(), n, -1e-3f, 1e-3f, 2, o.threads);
    zero::ConvertBuffer(tmp.as<float>(), zero::DType::kF32, g.as<uint16_t>(), zero::DType::kBF16, n);
    p16 = std::make_unique<Buffer>(n * 2, o.threads);
  } else {
    Fill(g.as<float>(), n, -1e-3f, 1e-3f, 2, o.threads);
  }
  float* states[2] = {m.as<float>(), v.as<float>()};
  int64_t step = 0;
  auto run = [&] {
    zero::ShardUpdate u;
    u.master = p.as<float>();
    u.grad = g.as<void>();
    u.grad_dtype = bf16 ? zero::DType::kBF16 : zero::DType::kF32;
    u.state = states;
    u.param_out = bf16 ? p16->as<void>() : nullptr;
    u.param_out_dtype = zero::DType::kBF16;
    u.n = n;
    u.step = ++step;
    u.lr = 1e-3;
    // Tile limit as the engine's default sub_group_size (1e9): ParallelUpdate splits by thread.
    zero::ParallelUpdate(*opt, u, o.threads, 1'000'000'000);
  };
  KernelResult r = Measure(bf16 ? "adamw_bf16" : "adamw_fp32", 28, triad, o.reps, run);
  // Sanity: the master must still be finite after all those steps.
  for (size_t i = 0; i < n; i += n / 1024 + 1) {
    if (!std::isfinite(p.as<float>()[i])) {
      std::fprintf(stderr, "%s: non-finite parameter at %zu\n", r.kernel.c_str(), i);
      std::exit(1);
    }
  }
  return r;
}

// {kernel -> params/s} from bench/torch_adamw.py, or empty when torch is absent or the script fails.
nlohmann::json RunTorch(const Options& o) {
  const std::string cmd = "/usr/bin/python3 " + o.torch_script + " --params " + std::to_string(o.params) +
                          " --threads " + std::to_string(o.threads) + " --reps " +
                          std::to_string(std::min(o.reps, 5)) + " 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return {};
  std::string out;
  std::array<char, 4096> buf;
  size_t got;
  while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), got);
  const int rc = pclose(f);
  if (rc != 0) return {};
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("kernels")) return {};
  return j;
}

std::string LoadAvg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  if (!o.simd.empty()) {
    int64_t bits = 0;
    std::string names;
    for (const auto& t : zero::optim_internal::AvailableKernelTargets()) {
      if (t.name == o.simd) bits = t.bits;
      names += " " + t.name;
    }
    if (bits == 0) {
      std::fprintf(stderr, "--simd %s: not available here; choose one of:%s\n", o.simd.c_str(), names.c_str());
      return 2;
    }
    zero::optim_internal::ForceKernelTargetForTest(bits);  // before any thread runs a kernel
  }
  const std::string load_before = LoadAvg();
  nlohmann::json torch_before = o.torch ? RunTorch(o) : nlohmann::json();
  // Same footprint as the fp32 kernel (16 B/param): three double arrays of params * 2/3 elements.
  Triad triad(o.params * 2 / 3, o.threads);
  std::vector<KernelResult> results;
  results.push_back(RunAdamW(false, o, triad));
  results.push_back(RunAdamW(true, o, triad));
  nlohmann::json torch_after = o.torch ? RunTorch(o) : nlohmann::json();
  // Per kernel, the faster of the two torch runs.
  nlohmann::json torch = torch_before.is_null() ? torch_after : torch_before;
  if (!torch_before.is_null() && !torch_after.is_null()) {
    for (auto& [k, v] : torch["kernels"].items()) {
      if (torch_after["kernels"].contains(k) &&
          torch_after["kernels"][k]["params_per_s"].get<double>() > v["params_per_s"].get<double>()) {
        v = torch_after["kernels"][k];
      }
      v["params_per_s_before"] = torch_before["kernels"][k]["params_per_s"];
      v["params_per_s_after"] = torch_after["kernels"].contains(k) ? torch_after["kernels"][k]["params_per_s"]
                                                                    : nlohmann::json();
    }
  }
  const std::string target = zero::optim_internal::ActiveKernelTarget();

  if (!o.json) {
    std::printf("# zero-bench-optim: params=%zu threads=%d reps=%d simd=%s loadavg(before)=%s\n", o.params, o.threads,
                o.reps, target.c_str(), load_before.c_str());
    std::printf("# STREAM triad: 3 x %zu doubles (%.0f MiB total), same pool and threads, interleaved with each "
                "kernel; best of %d\n",
                triad.elems(), 24.0 * triad.elems() / (1 << 20), o.reps);
    std::printf("# ratio = GB/s / triad GB/s (STREAM count, 24 B/elem); ratio_rfo uses the triad's real traffic "
                "with write-allocate (32 B/elem)\n");
    if (o.torch && torch.is_null()) std::printf("# torch: not available (/usr/bin/python3 cannot import torch)\n");
    if (!torch.is_null()) {
      std::printf("# torch %s, %d threads, torch.optim.AdamW best of foreach/single-tensor, best of a run before and "
                  "after zero's\n",
                  torch["torch"].get<std::string>().c_str(), torch["threads"].get<int>());
    }
    std::printf("%-11s %5s %12s %12s %8s %9s %9s %6s %9s %13s %8s\n", "kernel", "B/par", "Gparam/s", "(median)",
                "GB/s", "triadGB/s", "+RFO GB/s", "ratio", "ratio_rfo", "torch Gpar/s", "speedup");
  }
  for (const KernelResult& r : results) {
    const double pps = o.params / r.kernel_stats.best_s;
    const double median_pps = o.params / r.kernel_stats.Median();
    const double gbps = pps * r.bytes_per_param / 1e9;
    const double stream = 24.0 * triad.elems() / r.triad_stats.best_s / 1e9;
    const double stream_rfo = stream * 32.0 / 24.0;
    const std::string short_name = r.kernel.substr(r.kernel.find('_') + 1);
    double torch_pps = NAN;
    if (!torch.is_null() && torch["kernels"].contains(short_name)) {
      torch_pps = torch["kernels"][short_name]["params_per_s"].get<double>();
    }
    if (o.json) {
      nlohmann::json j = {{"kernel", r.kernel},
                          {"params", o.params},
                          {"threads", o.threads},
                          {"bytes_per_param", r.bytes_per_param},
                          {"params_per_s", pps},
                          {"median_params_per_s", median_pps},
                          {"gbps", gbps},
                          {"stream_gbps", stream},
                          {"stream_rfo_gbps", stream_rfo},
                          {"ratio", gbps / stream},
                          {"ratio_rfo", gbps / stream_rfo},
                          {"simd_target", target},
                          {"reps", o.reps},
                          {"loadavg_before", load_before}};
      if (std::isnan(torch_pps)) {
        j["torch_params_per_s"] = nullptr;
        j["speedup_vs_torch"] = nullptr;
      } else {
        j["torch_params_per_s"] = torch_pps;
        j["torch_single_tensor_s"] = torch["kernels"][short_name]["single_tensor_s"];
        j["torch_foreach_s"] = torch["kernels"][short_name]["foreach_s"];
        if (torch["kernels"][short_name].contains("params_per_s_before")) {
          j["torch_params_per_s_before"] = torch["kernels"][short_name]["params_per_s_before"];
          j["torch_params_per_s_after"] = torch["kernels"][short_name]["params_per_s_after"];
        }
        j["torch_version"] = torch["torch"];
        j["speedup_vs_torch"] = pps / torch_pps;
      }
      std::printf("%s\n", j.dump().c_str());
    } else {
      char torch_col[32] = "-", speed_col[32] = "-";
      if (!std::isnan(torch_pps)) {
        std::snprintf(torch_col, sizeof(torch_col), "%.3f", torch_pps / 1e9);
        std::snprintf(speed_col, sizeof(speed_col), "%.1fx", pps / torch_pps);
      }
      std::printf("%-11s %5d %12.3f %12.3f %8.1f %9.1f %9.1f %6.2f %9.2f %13s %8s\n", r.kernel.c_str(),
                  r.bytes_per_param, pps / 1e9, median_pps / 1e9, gbps, stream, stream_rfo, gbps / stream,
                  gbps / stream_rfo, torch_col, speed_col);
    }
  }
  return 0;
}
