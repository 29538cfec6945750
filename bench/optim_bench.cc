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
// torch: bench/torch_adamw.py --serve, a /usr/bin/python3 subprocess that runs torch.optim.AdamW steps on
// command, so each repetition is (triad, zero's step, torch single-tensor step, torch foreach step) and all
// four see the same machine state (this dev VM changes speed from minute to minute). The faster torch mode
// counts.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "core/internal/convert_simd.h"
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

constexpr const char* kUsage =
    "usage: zero-bench-optim [--params N] [--threads T] [--reps R] [--json] [--no-torch] [--torch-script PATH] "
    "[--simd TARGET]\n";

// A usage error: what is wrong, then the usage, on stderr; exit 2.
[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr, "zero-bench-optim: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    // Called only for a known flag, so an unknown last flag is named as unknown rather than as missing a value.
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) Usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--params") o.params = std::strtoull(next(), nullptr, 10);
    else if (a == "--threads") o.threads = std::atoi(next());
    else if (a == "--reps") o.reps = std::atoi(next());
    else if (a == "--json") o.json = true;
    else if (a == "--no-torch") o.torch = false;
    else if (a == "--torch-script") o.torch_script = next();
    else if (a == "--simd") o.simd = next();
    else Usage("unknown flag " + a);
  }
  if (o.params < 1024 || o.threads < 1 || o.reps < 1)
    Usage("--params must be at least 1024, --threads and --reps at least 1");
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

// bench/torch_adamw.py --serve as a child process: steps of torch.optim.AdamW on command.
class TorchServer {
 public:
  explicit TorchServer(const Options& o) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      const int devnull = open("/dev/null", O_WRONLY);
      if (devnull >= 0) dup2(devnull, 2);
      close(to_child[1]);
      close(from_child[0]);
      const std::string params = std::to_string(o.params), threads = std::to_string(o.threads);
      execl("/usr/bin/python3", "python3", o.torch_script.c_str(), "--serve", "--params", params.c_str(), "--threads",
            threads.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    if (pid_ < 0) return;
    to_ = fdopen(to_child[1], "w");
    from_ = fdopen(from_child[0], "r");
    char version[64];
    const std::string line = ReadLine();
    if (std::sscanf(line.c_str(), "ready %63s %d", version, &threads_) == 2) {
      version_ = version;
      ok_ = true;
    }
  }
  ~TorchServer() {
    if (to_ != nullptr) {
      std::fputs("quit\n", to_);
      std::fclose(to_);
    }
    if (from_ != nullptr) std::fclose(from_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  TorchServer(const TorchServer&) = delete;
  TorchServer& operator=(const TorchServer&) = delete;

  bool ok() const { return ok_; }
  const std::string& version() const { return version_; }
  int threads() const { return threads_; }
  // Builds both modes of `kernel` ("fp32" or "bf16") and warms them up.
  bool Setup(const std::string& kernel) { return ok_ && Command("setup " + kernel) == "ok"; }
  // One timed step of `mode` ("single" or "foreach"), in seconds; NaN on failure.
  double Step(const std::string& mode) {
    if (!ok_) return NAN;
    const std::string r = Command("step " + mode);
    char* end = nullptr;
    const double s = std::strtod(r.c_str(), &end);
    return end != r.c_str() ? s : NAN;
  }

 private:
  std::string Command(const std::string& cmd) {
    std::fprintf(to_, "%s\n", cmd.c_str());
    std::fflush(to_);
    const std::string r = ReadLine();
    if (r.empty()) ok_ = false;  // the child died (out of memory, ...)
    return r;
  }
  std::string ReadLine() {
    if (from_ == nullptr) return "";
    char buf[256];
    if (std::fgets(buf, sizeof(buf), from_) == nullptr) return "";
    std::string s = buf;
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s;
  }

  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  bool ok_ = false;
  std::string version_;
  int threads_ = 0;
};

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
  Stats torch_single, torch_foreach;  // empty when torch is absent
};

// Runs `reps` interleaved (triad, zero step, torch single step, torch foreach step) rounds after one warm-up.
template <class StepFn>
KernelResult Measure(const std::string& name, int bytes_per_param, Triad& triad, int reps, StepFn step,
                     TorchServer* torch) {
  KernelResult r{name, bytes_per_param, {}, {}, {}, {}};
  const std::string torch_kernel = name.substr(name.find('_') + 1);
  if (torch != nullptr && !torch->Setup(torch_kernel)) torch = nullptr;
  triad.RunSeconds();
  step();
  for (int i = 0; i < reps; ++i) {
    r.triad_stats.Add(triad.RunSeconds());
    const auto t0 = Clock::now();
    step();
    r.kernel_stats.Add(std::chrono::duration<double>(Clock::now() - t0).count());
    if (torch != nullptr) {
      const double single = torch->Step("single"), foreach = torch->Step("foreach");
      if (std::isnan(single) || std::isnan(foreach)) {
        torch = nullptr;
        r.torch_single = r.torch_foreach = Stats{};
      } else {
        r.torch_single.Add(single);
        r.torch_foreach.Add(foreach);
      }
    }
  }
  return r;
}

KernelResult RunAdamW(bool bf16, const Options& o, Triad& triad, TorchServer* torch) {
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
  KernelResult r = Measure(bf16 ? "adamw_bf16" : "adamw_fp32", 28, triad, o.reps, run, torch);
  // Sanity: the master must still be finite after all those steps.
  for (size_t i = 0; i < n; i += n / 1024 + 1) {
    if (!std::isfinite(p.as<float>()[i])) {
      std::fprintf(stderr, "%s: non-finite parameter at %zu\n", r.kernel.c_str(), i);
      std::exit(1);
    }
  }
  return r;
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
  std::signal(SIGPIPE, SIG_IGN);  // a torch child that dies must not kill the benchmark
  if (!o.simd.empty()) {
    const absl::StatusOr<zero::internal::SimdTarget> t =
        zero::internal::SimdTargetFromName(o.simd, zero::internal::AvailableSimdTargets());
    if (!t.ok()) {
      std::fprintf(stderr, "--simd %s: %s\n", o.simd.c_str(), std::string(t.status().message()).c_str());
      return 2;
    }
    zero::internal::ForceSimdTargetForTest(t->bits);  // before any thread runs a kernel
  }
  const std::string load_before = LoadAvg();
  std::unique_ptr<TorchServer> torch;
  if (o.torch) {
    torch = std::make_unique<TorchServer>(o);
    if (!torch->ok()) torch.reset();
  }
  // Same footprint as the fp32 kernel (16 B/param): three double arrays of params * 2/3 elements.
  Triad triad(o.params * 2 / 3, o.threads);
  std::vector<KernelResult> results;
  results.push_back(RunAdamW(false, o, triad, torch.get()));
  results.push_back(RunAdamW(true, o, triad, torch.get()));
  const std::string target = zero::optim_internal::ActiveKernelTarget();

  if (!o.json) {
    std::printf("# zero-bench-optim: params=%zu threads=%d reps=%d simd=%s loadavg(before)=%s\n", o.params, o.threads,
                o.reps, target.c_str(), load_before.c_str());
    std::printf(
        "# STREAM triad: 3 x %zu doubles (%.0f MiB total), same pool and threads, interleaved with each "
        "kernel; best of %d\n",
        triad.elems(), 24.0 * triad.elems() / (1 << 20), o.reps);
    std::printf(
        "# ratio = GB/s / triad GB/s (STREAM count, 24 B/elem); ratio_rfo uses the triad's real traffic "
        "with write-allocate (32 B/elem)\n");
    if (o.torch && torch == nullptr) std::printf("# torch: not available (/usr/bin/python3 cannot import torch)\n");
    if (torch != nullptr) {
      std::printf(
          "# torch %s, %d threads: torch.optim.AdamW steps interleaved with zero's, faster of "
          "foreach/single-tensor, best of %d\n",
          torch->version().c_str(), torch->threads(), o.reps);
    }
    std::printf("%-11s %5s %12s %12s %8s %9s %9s %6s %9s %13s %8s\n", "kernel", "B/par", "Gparam/s", "(median)", "GB/s",
                "triadGB/s", "+RFO GB/s", "ratio", "ratio_rfo", "torch Gpar/s", "speedup");
  }
  for (const KernelResult& r : results) {
    const double pps = o.params / r.kernel_stats.best_s;
    const double median_pps = o.params / r.kernel_stats.Median();
    const double gbps = pps * r.bytes_per_param / 1e9;
    const double stream = 24.0 * triad.elems() / r.triad_stats.best_s / 1e9;
    const double stream_rfo = stream * 32.0 / 24.0;
    double torch_pps = NAN;
    if (!r.torch_single.all.empty()) {
      torch_pps = o.params / std::min(r.torch_single.best_s, r.torch_foreach.best_s);
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
        j["torch_single_tensor_s"] = r.torch_single.best_s;
        j["torch_foreach_s"] = r.torch_foreach.best_s;
        j["torch_median_params_per_s"] = o.params / std::min(r.torch_single.Median(), r.torch_foreach.Median());
        j["torch_version"] = torch->version();
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
