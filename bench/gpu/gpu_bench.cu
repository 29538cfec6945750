// zero-bench-gpu: device bandwidth ceilings and zero's memory-bound kernels against them.
//
//   zero-bench-gpu [--params N] [--copy-mib M] [--iters I] [--warmup W] [--no-variants] [--quant-shapes S]
//                  [--md results.md]
//
// Measures, with CUDA events around each launch, the median (and min/max) of I timed runs after W warm-ups:
//   * device-to-device copy (cudaMemcpyAsync of M MiB; bytes counted = read + written = 2M);
//   * a plain streaming kernel with the fused AdamW's access pattern (read 4 fp32 arrays, write 3), and the
//     same pattern through the production fused-step kernel: the ceiling the optimizer can reach;
//   * zero's fused AdamW on N parameters (the production entry point, LaunchAdam): fp32 p/g/m/v (28 B/param:
//     read p,g,m,v + write p,m,v), bf16 grad + bf16 param write-back (28 B/param), fp32 grad + bf16 write-back
//     (30 B/param); ratio to the copy;
//   * the variant sweep (unless --no-variants): every variant of the fused step (fused_kernel.cuh: the first
//     version, vec8/quad layouts, 8 or 16 elements per thread per iteration, with and without evict-first
//     hints, full-wave or one-pass grid) on the pattern and on the three AdamW configurations, the production
//     variant on staggered buffers, and the copy again (drift); a summary table of ratios at the end;
//   * GradStats on the gradient (f32 and bf16; bytes = elements x element size), Convert f32->bf16, the
//     blockwise int8 QuantizeInt8 (f32, bf16 in) / DequantizeInt8 (bf16, f32 out) in blocks of 4096 (a RESULT
//     line each: its ratio to the copy, issue 37's target 0.8), and a Flatten of 64 segments. --quant-shapes
//     TxC[,TxC...] (e.g. 256x4,128x4,64x8) adds the four int8 rows again per launch shape: at most T threads per
//     CUDA block, C vectors cached per thread (launch.h's QuantShape; the production rows use QuantShapeOf), so
//     one run compares shapes; named "... @TxC", each with its own #wrong and a RESULT quant_shape_ratio line.
// Every fused-step row is also checked on its first and last 2^20 elements, and every quantize/dequantize row on
// its first 2^20, against the same element code run on the host (bit for bit: "#wrong" must be 0). Inputs are random (a
// hash of the index), never zeros.
//
// Built two ways: by CMake (target zero-bench-gpu) and standalone, with nothing but the CUDA toolkit, by
// bench/gpu/check.sh: nvcc -O3 -std=c++20 -arch=sm_90 --expt-relaxed-constexpr -I src src/cuda/*.cu
// bench/gpu/gpu_bench.cu. It therefore uses zero's absl-free launchers (src/cuda/internal/launch.h), which are
// what the public zero::cuda functions call after checking their arguments.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/internal/fused_kernel.cuh"
#include "cuda/internal/launch.h"

namespace in = ::zero::cuda::internal;

namespace {

// ---------------------------------------------------------------------------------------------------------
// Errors: a failed CUDA call aborts the current measurement (exception), not the whole run.

struct CudaFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void Check(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) {
    throw CudaFailure(std::string(what) + " (line " + std::to_string(line) + "): " + cudaGetErrorName(e) + ": " +
                      cudaGetErrorString(e));
  }
}
#define CK(expr) Check((expr), #expr, __LINE__)

// A device allocation freed on scope exit.
struct DevMem {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevMem(size_t b) : bytes(b) { CK(cudaMalloc(&p, b)); }
  ~DevMem() {
    if (p) cudaFree(p);
  }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// ---------------------------------------------------------------------------------------------------------
// Inputs: a hash of (index, seed) mapped to a normal-ish value of the given scale, computed on the device.

__host__ __device__ inline uint32_t Hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Sum of two uniforms in [-1, 1): triangular, zero mean, never exactly zero in practice.
__host__ __device__ inline float RandomValue(size_t i, uint32_t seed, float scale, bool positive) {
  const float a = static_cast<float>(Hash(i * 2 + (static_cast<uint64_t>(seed) << 40))) * (1.0f / 4294967296.0f);
  const float b = static_cast<float>(Hash(i * 2 + 1 + (static_cast<uint64_t>(seed) << 40))) * (1.0f / 4294967296.0f);
  const float v = (a + b - 1.0f) * scale;
  return positive ? fabsf(v) + 1e-6f * scale : v;
}

__global__ void FillKernel(float* out, size_t n, uint32_t seed, float scale, bool positive) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = RandomValue(i, seed, scale, positive);
  }
}

__global__ void FillBF16Kernel(uint16_t* out, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = in::F32ToBF16(RandomValue(i, seed, scale, false));
  }
}

void Fill(float* d, size_t n, uint32_t seed, float scale, bool positive = false) {
  FillKernel<<<2048, 256>>>(d, n, seed, scale, positive);
  CK(cudaGetLastError());
}
void FillBF16(uint16_t* d, size_t n, uint32_t seed, float scale) {
  FillBF16Kernel<<<2048, 256>>>(d, n, seed, scale);
  CK(cudaGetLastError());
}

// The fused AdamW's access pattern without its arithmetic: read p, g, m, v; write p, m, v (16-byte accesses,
// one full wave, grid-stride). What the optimizer could reach if its math were free.
__global__ void __launch_bounds__(256) Stream4R3WKernel(float* p, const float* g, float* m, float* v, size_t nvec) {
  const size_t nthreads = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t k = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; k < nvec; k += nthreads) {
    float a[8], b[8], c[8], d[8];
    in::Load8<in::F32>(p, 8 * k, a);
    in::Load8<in::F32>(g, 8 * k, b);
    in::Load8<in::F32>(m, 8 * k, c);
    in::Load8<in::F32>(v, 8 * k, d);
    for (int j = 0; j < 8; ++j) {
      a[j] += b[j];
      c[j] += b[j];
      d[j] += b[j];
    }
    in::Store8<in::F32>(p, 8 * k, a);
    in::Store8<in::F32>(m, 8 * k, c);
    in::Store8<in::F32>(v, 8 * k, d);
  }
}

// The same pattern through the fused step's own kernels (any variant): an Op with AdamW's state count whose
// arithmetic is one add per output. Rows with it separate a variant's access pattern from AdamW's math.
struct StreamOp {
  static constexpr int kStates = 2;
  ZERO_HD void Apply(float& p, float g, float (&s)[2]) const {
    p = in::FAdd(p, g);
    s[0] = in::FAdd(s[0], g);
    s[1] = in::FAdd(s[1], g);
  }
};

// ---------------------------------------------------------------------------------------------------------
// The fused step's variants (src/cuda/internal/fused_kernel.cuh), each timed on the same buffers.

struct V1Tag {};  // the first version's kernel (FusedStepV1Kernel)

template <class G, class P, class Op, class V>
cudaError_t LaunchVariant(const in::FusedArgs& a, const Op& op, in::FusedGrid grid, cudaStream_t stream) {
  if constexpr (std::is_same_v<V, V1Tag>) {
    return in::LaunchFusedV1<G, P, Op>(a, op, stream);
  } else {
    return in::LaunchFusedTiled<G, P, Op, V>(a, op, grid, stream);
  }
}

template <class V>
std::string VariantName(in::FusedGrid grid) {
  if constexpr (std::is_same_v<V, V1Tag>) {
    return "v1 (first version: vec8 x1, grid-stride)";
  } else {
    std::string s = V::kLayout == in::FusedLayout::kVec8 ? "vec8" : "quad";
    s += " x" + std::to_string(V::kUnits) + " (" + std::to_string(V::kElemsPerThread) + "/thr)";
    if (V::kHint == in::CacheHint::kStreaming) s += " cs";
    if (V::kHint == in::CacheHint::kStreamingPf256) s += " cs+L2::256B";
    s += grid == in::FusedGrid::kOnePass ? ", one pass" : ", full wave";
    if (std::is_same_v<V, in::FusedProductionVariant> && (grid == in::FusedGrid::kOnePass) == in::kProductionOnePass) {
      s += " [production]";
    }
    return s;
  }
}

// Calls f(tag, grid) for every variant the bench compares: the first version; every tiled variant of
// ForEachFusedVariant on a full wave; two of them also on a one-pass grid.
template <class F>
void ForEachVariant(F&& f) {
  f(V1Tag{}, in::FusedGrid::kFullWave);
  in::ForEachFusedVariant([&](auto v) { f(v, in::FusedGrid::kFullWave); });
  f(in::FusedVariant<in::FusedLayout::kQuad, 2, in::CacheHint::kStreaming>{}, in::FusedGrid::kOnePass);
  f(in::FusedProductionVariant{}, in::FusedGrid::kOnePass);
}

// ---------------------------------------------------------------------------------------------------------
// Timing.

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
};

Timing TimeIt(int warmup, int iters, const std::function<void()>& launch) {
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) launch();
  CK(cudaDeviceSynchronize());
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(start));
    launch();
    CK(cudaEventRecord(stop));
    CK(cudaEventSynchronize(stop));
    float t = 0;
    CK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  CK(cudaGetLastError());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  Timing r;
  r.min_ms = ms.front();
  r.max_ms = ms.back();
  r.median_ms = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  return r;
}

// ---------------------------------------------------------------------------------------------------------
// Results table.

struct Row {
  std::string name;
  std::string size;
  Timing t;
  double bytes = 0;
  std::string wrong = "-";  // "#wrong" of the correctness spot check, or "-"
  std::string error;        // non-empty when the measurement failed
  double GBps() const { return t.median_ms > 0 ? bytes / (t.median_ms * 1e-3) / 1e9 : 0; }
};

std::vector<Row> g_rows;
double g_copy_gbps = 0;                 // the D2D copy ceiling measured in this run
std::string g_variant_table;            // markdown: ratio to the copy per variant (rows) and configuration (columns)
std::vector<std::string> g_best_lines;  // "RESULT best_variant[...]" per column of the table
std::function<void()> g_after_row;

std::string HumanCount(double n) {
  char buf[64];
  if (n >= 1e9) {
    std::snprintf(buf, sizeof(buf), "%.2f G", n / 1e9);
  } else if (n >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.1f M", n / 1e6);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f", n);
  }
  return buf;
}

void PrintRow(const Row& r) {
  if (!r.error.empty()) {
    std::printf("%-44s %-16s ERROR: %s\n", r.name.c_str(), r.size.c_str(), r.error.c_str());
  } else {
    std::printf("%-44s %-16s median %9.3f ms (min %.3f, max %.3f)  %8.1f GB/s  ratio %.3f  #wrong %s\n", r.name.c_str(),
                r.size.c_str(), r.t.median_ms, r.t.min_ms, r.t.max_ms, r.GBps(),
                g_copy_gbps > 0 ? r.GBps() / g_copy_gbps : 0.0, r.wrong.c_str());
  }
  std::fflush(stdout);
}

// Runs one measurement; a CUDA failure is recorded in the table and the next measurement still runs.
void Measure(const std::string& name, const std::string& size, const std::function<void(Row&)>& body) {
  Row r;
  r.name = name;
  r.size = size;
  try {
    body(r);
  } catch (const std::exception& e) {
    r.error = e.what();
    cudaGetLastError();  // clear a non-sticky error so the next measurement can run
  }
  PrintRow(r);
  g_rows.push_back(r);
  if (g_after_row) g_after_row();  // rewrite the table, so a crash later still leaves these rows
}

// ---------------------------------------------------------------------------------------------------------
// Spot check: one device step (`launch`) over the whole shard; its first and last 2^20 elements recomputed on
// the host with the same element code (FusedStepThread, all-scalar path, one host "thread") and compared bit
// for bit. Returns the number of elements where any output differs.

template <class G, class P, class Op>
size_t SpotCheck(const in::FusedArgs& dev, size_t n, const Op& op, const std::function<cudaError_t()>& launch,
                 cudaStream_t stream) {
  const size_t gsize = sizeof(typename G::Elem);
  size_t osize = 0;
  if constexpr (!std::is_same_v<P, in::NoOut>) osize = sizeof(typename P::Elem);
  const size_t window = std::min<size_t>(n / 2, size_t{1} << 20);
  const size_t begins[2] = {0, n - window};
  struct Snap {
    std::vector<float> p, m, v;
    std::vector<unsigned char> g, out;
  } snap[2];
  for (int w = 0; w < 2; ++w) {
    Snap& s = snap[w];
    s.p.resize(window);
    s.m.resize(window);
    s.v.resize(window);
    s.g.resize(window * gsize);
    s.out.assign(window * (osize ? osize : 1), 0);
    CK(cudaMemcpy(s.p.data(), dev.master + begins[w], window * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(s.m.data(), dev.state[0] + begins[w], window * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(s.v.data(), dev.state[1] + begins[w], window * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(s.g.data(), static_cast<const unsigned char*>(dev.grad) + begins[w] * gsize, window * gsize,
                  cudaMemcpyDeviceToHost));
  }
  CK(launch());
  CK(cudaStreamSynchronize(stream));
  size_t wrong = 0;
  for (int w = 0; w < 2; ++w) {
    Snap& s = snap[w];
    in::FusedArgs h;
    h.master = s.p.data();
    h.grad = s.g.data();
    h.grad_scale = dev.grad_scale;
    h.state[0] = s.m.data();
    h.state[1] = s.v.data();
    h.param_out = osize ? s.out.data() : nullptr;
    h.plan.n = window;
    h.plan.head = window;  // all scalar on the host: another code path for the same function
    h.plan.nvec = 0;
    in::FusedStepThread<G, P, Op>(h, op, 0, 1);
    std::vector<float> dp(window), dm(window), dv(window);
    std::vector<unsigned char> dout(window * (osize ? osize : 1));
    CK(cudaMemcpy(dp.data(), dev.master + begins[w], window * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dm.data(), dev.state[0] + begins[w], window * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dv.data(), dev.state[1] + begins[w], window * 4, cudaMemcpyDeviceToHost));
    if (osize) {
      CK(cudaMemcpy(dout.data(), static_cast<unsigned char*>(dev.param_out) + begins[w] * osize, window * osize,
                    cudaMemcpyDeviceToHost));
    }
    for (size_t i = 0; i < window; ++i) {
      bool ok = std::memcmp(&dp[i], &s.p[i], 4) == 0 && std::memcmp(&dm[i], &s.m[i], 4) == 0 &&
                std::memcmp(&dv[i], &s.v[i], 4) == 0;
      if (osize) ok = ok && std::memcmp(&dout[i * osize], &s.out[i * osize], osize) == 0;
      wrong += ok ? 0 : 1;
    }
  }
  return wrong;
}

// ---------------------------------------------------------------------------------------------------------

struct Options {
  size_t params = size_t{256} << 20;  // 268,435,456 parameters
  size_t copy_mib = 2048;
  int iters = 10;
  int warmup = 3;
  bool variants = true;                      // the variant sweep (--no-variants skips it)
  std::vector<in::QuantShape> quant_shapes;  // --quant-shapes: extra int8 rows per launch shape
  std::string md_path;
};

constexpr const char* kUsage =
    "usage: zero-bench-gpu [--params N] [--copy-mib M] [--iters I] [--warmup W] [--no-variants]\n"
    "                      [--quant-shapes TxC[,TxC...]] [--md file]\n";

// "256x4,128x4,64x8" -> shapes; exits with the usage on a malformed or invalid one.
std::vector<in::QuantShape> ParseQuantShapes(const std::string& list) {
  std::vector<in::QuantShape> shapes;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string item = list.substr(pos, comma - pos);
    unsigned t = 0, c = 0;
    char extra = 0;
    if (std::sscanf(item.c_str(), "%ux%u%c", &t, &c, &extra) != 2 || !in::QuantShapeValid({t, c})) {
      std::fprintf(stderr,
                   "zero-bench-gpu: bad --quant-shapes item '%s' (TxC, T a multiple of 32 in [32, %d], C 4 or 8)\n%s",
                   item.c_str(), in::kThreads, kUsage);
      std::exit(2);
    }
    shapes.push_back({t, c});
    pos = comma + 1;
  }
  return shapes;
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    // Called only for a known flag, so an unknown last flag is named as unknown rather than as missing a value.
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "zero-bench-gpu: %s needs a value\n%s", a.c_str(), kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--params") {
      o.params = std::strtoull(next(), nullptr, 10);
    } else if (a == "--copy-mib") {
      o.copy_mib = std::strtoull(next(), nullptr, 10);
    } else if (a == "--iters") {
      o.iters = std::atoi(next());
    } else if (a == "--warmup") {
      o.warmup = std::atoi(next());
    } else if (a == "--md") {
      o.md_path = next();
    } else if (a == "--no-variants") {
      o.variants = false;
    } else if (a == "--quant-shapes") {
      o.quant_shapes = ParseQuantShapes(next());
    } else {
      std::fprintf(stderr, "zero-bench-gpu: unknown flag %s\n%s", a.c_str(), kUsage);
      std::exit(2);
    }
  }
  o.params = std::max<size_t>(o.params / 8 * 8, 1 << 21);
  o.iters = std::max(o.iters, 1);
  return o;
}

void WriteMarkdown(const Options& o, const std::string& device_line) {
  if (o.md_path.empty()) return;
  FILE* f = std::fopen(o.md_path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", o.md_path.c_str());
    return;
  }
  std::fprintf(f, "%s\n\n", device_line.c_str());
  std::fprintf(f,
               "Median of %d timed runs after %d warm-ups (CUDA events around each launch); GB/s = bytes "
               "counted / median time; ratio = GB/s / the D2D copy's GB/s measured in the same run.\n\n",
               o.iters, o.warmup);
  std::fprintf(f,
               "| measurement | size | median ms | min ms | max ms | bytes counted | GB/s | ratio to copy | "
               "#wrong |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : g_rows) {
    if (!r.error.empty()) {
      std::fprintf(f, "| %s | %s | ERROR: %s | | | | | | |\n", r.name.c_str(), r.size.c_str(), r.error.c_str());
      continue;
    }
    std::fprintf(f, "| %s | %s | %.3f | %.3f | %.3f | %s B | %.1f | %.3f | %s |\n", r.name.c_str(), r.size.c_str(),
                 r.t.median_ms, r.t.min_ms, r.t.max_ms, HumanCount(r.bytes).c_str(), r.GBps(),
                 g_copy_gbps > 0 ? r.GBps() / g_copy_gbps : 0.0, r.wrong.c_str());
  }
  if (!g_variant_table.empty()) {
    std::fprintf(f,
                 "\nFused-step variants, ratio to the copy (columns: the no-math 4R+3W pattern through the "
                 "variant's kernel, then AdamW per configuration; #wrong for each row is in the table above):"
                 "\n\n%s",
                 g_variant_table.c_str());
  }
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("zero-bench-gpu: no CUDA device (%s); nothing measured\n", cudaGetErrorString(cudaGetLastError()));
    return 3;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int mem_khz = 0, bus_bits = 0, l2 = 0;
  cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, 0);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0);
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  char device_line[512];
  std::snprintf(device_line, sizeof(device_line),
                "Device: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %d MiB, memory clock %d MHz x %d-bit bus (theoretical "
                "%.0f GB/s, DDR), driver %d, runtime %d",
                prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                static_cast<double>(prop.totalGlobalMem) / (1 << 30), l2 >> 20, mem_khz / 1000, bus_bits,
                2.0 * mem_khz * 1e3 * bus_bits / 8 / 1e9, driver, runtime);
  std::printf("%s\n", device_line);
  std::printf("params=%zu copy=%zu MiB iters=%d warmup=%d\n\n", o.params, o.copy_mib, o.iters, o.warmup);
  cudaStream_t stream = nullptr;  // the legacy default stream: events below are recorded on it too
  g_after_row = [&] { WriteMarkdown(o, device_line); };

  // ---- ceiling: device-to-device copy ----
  Measure("D2D copy (cudaMemcpyAsync)", std::to_string(o.copy_mib) + " MiB", [&](Row& r) {
    const size_t bytes = o.copy_mib << 20;
    DevMem a(bytes), b(bytes);
    Fill(a.as<float>(), bytes / 4, 1, 1.0f);
    r.t = TimeIt(o.warmup, o.iters, [&] { CK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, stream)); });
    r.bytes = 2.0 * bytes;
    g_copy_gbps = r.GBps();
  });
  Measure("BatchCopy kernel, 1 segment", std::to_string(o.copy_mib) + " MiB", [&](Row& r) {
    const size_t bytes = o.copy_mib << 20;
    DevMem a(bytes), b(bytes);
    Fill(a.as<float>(), bytes / 4, 2, 1.0f);
    const in::CopySeg seg{a.p, b.p, bytes};
    r.t = TimeIt(o.warmup, o.iters, [&] { CK(in::LaunchBatchCopy(&seg, 1, stream)); });
    r.bytes = 2.0 * bytes;
    std::vector<unsigned char> x(1 << 20), y(1 << 20);
    CK(cudaMemcpy(x.data(), static_cast<char*>(a.p) + bytes - x.size(), x.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y.data(), static_cast<char*>(b.p) + bytes - y.size(), y.size(), cudaMemcpyDeviceToHost));
    r.wrong = std::to_string(x == y ? 0 : 1);
  });

  // ---- the optimizer ----
  const size_t n = o.params;
  const std::string nstr = HumanCount(static_cast<double>(n)) + " params";
  {
    std::unique_ptr<DevMem> p, g32, m, v, g16, out16;
    try {
      p = std::make_unique<DevMem>(n * 4);
      g32 = std::make_unique<DevMem>(n * 4);
      m = std::make_unique<DevMem>(n * 4);
      v = std::make_unique<DevMem>(n * 4);
      g16 = std::make_unique<DevMem>(n * 2);
      out16 = std::make_unique<DevMem>(n * 2);
      Fill(p->as<float>(), n, 11, 1.0f);
      Fill(g32->as<float>(), n, 12, 0.01f);
      Fill(m->as<float>(), n, 13, 0.001f);
      Fill(v->as<float>(), n, 14, 1e-5f, /*positive=*/true);
      FillBF16(g16->as<uint16_t>(), n, 15, 0.01f);
      CK(cudaMemset(out16->p, 0xA5, n * 2));  // poisoned; the spot check compares every element it reads
      CK(cudaDeviceSynchronize());
    } catch (const std::exception& e) {
      Measure("AdamW buffers", nstr, [&](Row&) { throw CudaFailure(e.what()); });
    }
    if (out16) {
      auto refill = [&] {  // back to sane optimizer values after the pattern kernels' adds
        Fill(p->as<float>(), n, 11, 1.0f);
        Fill(m->as<float>(), n, 13, 0.001f);
        Fill(v->as<float>(), n, 14, 1e-5f, true);
      };
      Measure("stream 4 reads + 3 writes (AdamW pattern)", nstr, [&](Row& r) {
        int wave = 0;
        CK(in::FullWaveBlocks(reinterpret_cast<const void*>(&Stream4R3WKernel), 256, &wave));
        r.t = TimeIt(o.warmup, o.iters, [&] {
          Stream4R3WKernel<<<wave, 256, 0, stream>>>(p->as<float>(), g32->as<float>(), m->as<float>(), v->as<float>(),
                                                     n / 8);
          CK(cudaGetLastError());
        });
        r.bytes = 28.0 * n;
        refill();
      });
      const in::AdamOp op = in::MakeAdamOp(1e-3, 0.9, 0.999, 1e-8, 0.01, true, true, 10);
      // The fused step's arguments over `count` elements, buffer k starting `shift[k]` elements in (master,
      // grad, exp_avg, exp_avg_sq, param_out; all zero but in the staggered rows).
      auto make_args = [&](const void* grad, in::Dt gdt, void* out, in::OutDt odt, size_t count,
                           const size_t(&shift)[5]) {
        in::FusedArgs a;
        a.master = p->as<float>() + shift[0];
        a.grad = static_cast<const unsigned char*>(grad) + shift[1] * in::DtSize(gdt);
        a.grad_scale = 1.0f / 1024;
        a.state[0] = m->as<float>() + shift[2];
        a.state[1] = v->as<float>() + shift[3];
        a.param_out = out ? static_cast<unsigned char*>(out) + shift[4] * (odt == in::OutDt::kF32 ? 4 : 2) : nullptr;
        a.plan = in::MakeFusedPlan(a, gdt, odt, 2, count);
        if (a.plan.nvec * 8 + a.plan.ScalarCount() != count || a.plan.nvec == 0) {
          throw CudaFailure("unexpected vector plan (buffers not 16-byte aligned?)");
        }
        return a;
      };
      constexpr size_t kNoShift[5] = {0, 0, 0, 0, 0};
      // One row: a bit-for-bit spot check of one launch, then the timing. gtag/ptag: gradient and write-back
      // types (for the host reference).
      auto fused_row = [&](const std::string& name, const std::string& size, double bytes, auto gtag, auto ptag,
                           const auto& row_op, const std::function<in::FusedArgs()>& args,
                           const std::function<cudaError_t(const in::FusedArgs&)>& launch) {
        Measure(name, size, [&](Row& r) {
          const in::FusedArgs a = args();
          using Op = std::decay_t<decltype(row_op)>;
          r.wrong = std::to_string(SpotCheck<decltype(gtag), decltype(ptag), Op>(
              a, a.plan.n, row_op, [&] { return launch(a); }, stream));
          r.t = TimeIt(o.warmup, o.iters, [&] { CK(launch(a)); });
          r.bytes = bytes;
        });
      };
      constexpr in::FusedGrid kProdGrid = in::kProductionOnePass ? in::FusedGrid::kOnePass : in::FusedGrid::kFullWave;
      const std::string prod = VariantName<in::FusedProductionVariant>(kProdGrid);
      fused_row(
          "stream 4R+3W, " + prod, nstr, 28.0 * n, in::F32{}, in::NoOut{}, StreamOp{},
          [&] { return make_args(g32->p, in::Dt::kF32, nullptr, in::OutDt::kNone, n, kNoShift); },
          [&](const in::FusedArgs& a) {
            return in::LaunchFusedTiled<in::F32, in::NoOut, StreamOp, in::FusedProductionVariant>(a, StreamOp{},
                                                                                                  kProdGrid, stream);
          });
      refill();
      // The production entry point (what zero::cuda::AdamStep calls), one row per configuration.
      struct Config {
        const char* name;  // "fused AdamW, ..." rows give the RESULT lines
        const char* tag;   // short name in the variant table
        const void* grad;
        in::Dt gdt;
        void* out;
        in::OutDt odt;
        double bpp;
      };
      const Config configs[3] = {
          {"fused AdamW, fp32 p/g/m/v (28 B/param)", "fp32", g32->p, in::Dt::kF32, nullptr, in::OutDt::kNone, 28.0},
          {"fused AdamW, bf16 grad + bf16 param out (28 B/param)", "bf16 g+out", g16->p, in::Dt::kBF16, out16->p,
           in::OutDt::kBF16, 28.0},
          {"fused AdamW, fp32 grad + bf16 param out (30 B/param)", "f32 g+bf16 out", g32->p, in::Dt::kF32, out16->p,
           in::OutDt::kBF16, 30.0},
      };
      // Calls f(gtag, ptag) with the gradient and write-back type tags of configs[c].
      auto with_types = [](int c, auto&& f) {
        if (c == 0) {
          f(in::F32{}, in::NoOut{});
        } else if (c == 1) {
          f(in::BF16{}, in::BF16{});
        } else {
          f(in::F32{}, in::BF16{});
        }
      };
      for (int c = 0; c < 3; ++c) {
        const Config& cf = configs[c];
        with_types(c, [&](auto gtag, auto ptag) {
          fused_row(
              cf.name, nstr, cf.bpp * n, gtag, ptag, op,
              [&] { return make_args(cf.grad, cf.gdt, cf.out, cf.odt, n, kNoShift); },
              [&](const in::FusedArgs& a) { return in::LaunchAdam(a, cf.gdt, cf.odt, op, stream); });
        });
      }

      // ---- the variant sweep: every variant on the pattern and on the three AdamW configurations ----
      if (o.variants) {
        std::printf("\nvariant sweep (rows 'config | variant'; ratio = GB/s / the copy at the top):\n");
        std::vector<std::string> vnames;
        ForEachVariant([&](auto vtag, in::FusedGrid grid) { vnames.push_back(VariantName<decltype(vtag)>(grid)); });
        const char* cols[4] = {"pattern", configs[0].tag, configs[1].tag, configs[2].tag};
        std::vector<std::vector<double>> ratio(vnames.size(), std::vector<double>(4, 0.0));
        for (int c = -1; c < 3; ++c) {  // -1: the no-math pattern; configuration outer, so a column's rows
          size_t vi = 0;                // run close together in time
          ForEachVariant([&](auto vtag, in::FusedGrid grid) {
            using V = decltype(vtag);
            const std::string name = std::string(cols[c + 1]) + " | " + vnames[vi];
            if (c < 0) {
              fused_row(
                  name, nstr, 28.0 * n, in::F32{}, in::NoOut{}, StreamOp{},
                  [&] { return make_args(g32->p, in::Dt::kF32, nullptr, in::OutDt::kNone, n, kNoShift); },
                  [&](const in::FusedArgs& a) {
                    return LaunchVariant<in::F32, in::NoOut, StreamOp, V>(a, StreamOp{}, grid, stream);
                  });
            } else {
              const Config& cf = configs[c];
              with_types(c, [&](auto gtag, auto ptag) {
                using G = decltype(gtag);
                using P = decltype(ptag);
                fused_row(
                    name, nstr, cf.bpp * n, gtag, ptag, op,
                    [&] { return make_args(cf.grad, cf.gdt, cf.out, cf.odt, n, kNoShift); },
                    [&](const in::FusedArgs& a) { return LaunchVariant<G, P, in::AdamOp, V>(a, op, grid, stream); });
              });
            }
            const Row& r = g_rows.back();
            ratio[vi][c + 1] = r.error.empty() && g_copy_gbps > 0 ? r.GBps() / g_copy_gbps : 0.0;
            ++vi;
          });
          if (c < 0) refill();
        }
        // Buffers staggered by 66.25 KiB x k instead of sitting at the allocator's (large, aligned) offsets
        // from each other: does the relative placement of the seven streams matter?
        {
          const size_t step = 16960;  // elements (66.25 KiB of f32; a multiple of 16 bytes)
          const size_t shift[5] = {0, step, 2 * step, 3 * step, 0};
          const size_t count = n - 3 * step;
          std::printf("buffers: p=%p g=%p m=%p v=%p (staggered rows shift g, m, v by %zu, %zu, %zu bytes)\n", p->p,
                      g32->p, m->p, v->p, 4 * step, 8 * step, 12 * step);
          const std::string cstr = HumanCount(static_cast<double>(count)) + " params";
          fused_row(
              "pattern | " + prod + ", staggered", cstr, 28.0 * count, in::F32{}, in::NoOut{}, StreamOp{},
              [&] { return make_args(g32->p, in::Dt::kF32, nullptr, in::OutDt::kNone, count, shift); },
              [&](const in::FusedArgs& a) {
                return in::LaunchFusedTiled<in::F32, in::NoOut, StreamOp, in::FusedProductionVariant>(
                    a, StreamOp{}, kProdGrid, stream);
              });
          refill();
          fused_row(
              "fp32 | " + prod + ", staggered", cstr, 28.0 * count, in::F32{}, in::NoOut{}, op,
              [&] { return make_args(g32->p, in::Dt::kF32, nullptr, in::OutDt::kNone, count, shift); },
              [&](const in::FusedArgs& a) { return in::LaunchAdam(a, in::Dt::kF32, in::OutDt::kNone, op, stream); });
        }
        // The variant table (also appended to the markdown file).
        std::string table = "| variant | " + std::string(cols[0]) + " | " + cols[1] + " | " + cols[2] + " | " +
                            cols[3] + " |\n|---|---|---|---|---|\n";
        for (size_t i = 0; i < vnames.size(); ++i) {
          char line[256];
          std::snprintf(line, sizeof(line), "| %s | %.3f | %.3f | %.3f | %.3f |\n", vnames[i].c_str(), ratio[i][0],
                        ratio[i][1], ratio[i][2], ratio[i][3]);
          table += line;
        }
        g_variant_table = table;
        for (int c = 0; c < 4; ++c) {
          size_t best = 0;
          for (size_t i = 1; i < vnames.size(); ++i) best = ratio[i][c] > ratio[best][c] ? i : best;
          char line[256];
          std::snprintf(line, sizeof(line), "RESULT best_variant[%s] %.3f  %s", cols[c], ratio[best][c],
                        vnames[best].c_str());
          g_best_lines.push_back(line);
        }
        // The copy again: how much the ceiling drifted over the run (the ratios use the first one).
        Measure("D2D copy (again, after the sweep)", std::to_string(o.copy_mib) + " MiB", [&](Row& r) {
          const size_t bytes = o.copy_mib << 20;
          DevMem a(bytes), b(bytes);
          Fill(a.as<float>(), bytes / 4, 1, 1.0f);
          r.t = TimeIt(o.warmup, o.iters,
                       [&] { CK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, stream)); });
          r.bytes = 2.0 * bytes;
        });
      }

      // ---- gradient statistics, conversion, flatten ----
      Measure("GradStats f32 (4 B/elem)", nstr, [&](Row& r) {
        DevMem ws(in::kStatsWorkspaceBytes), res(sizeof(in::StatsResult));
        r.t = TimeIt(o.warmup, o.iters, [&] {
          CK(in::LaunchGradStats(g32->p, in::Dt::kF32, n, 1.0f, res.as<in::StatsResult>(), false, ws.p, stream));
        });
        r.bytes = 4.0 * n;
        in::StatsResult a, b;
        CK(cudaMemcpy(&a, res.p, sizeof(a), cudaMemcpyDeviceToHost));
        CK(in::LaunchGradStats(g32->p, in::Dt::kF32, n, 1.0f, res.as<in::StatsResult>(), false, ws.p, stream));
        CK(cudaMemcpy(&b, res.p, sizeof(b), cudaMemcpyDeviceToHost));
        // #wrong: 1 if two runs differ in any bit (determinism) or something is non-finite.
        r.wrong = std::to_string((std::memcmp(&a, &b, sizeof(a)) != 0 || a.nonfinite != 0) ? 1 : 0);
        std::printf("  GradStats f32: sumsq=%.17g nonfinite=%llu\n", a.sumsq, a.nonfinite);
      });
      Measure("GradStats bf16 (2 B/elem)", nstr, [&](Row& r) {
        DevMem ws(in::kStatsWorkspaceBytes), res(sizeof(in::StatsResult));
        r.t = TimeIt(o.warmup, o.iters, [&] {
          CK(in::LaunchGradStats(g16->p, in::Dt::kBF16, n, 1.0f, res.as<in::StatsResult>(), false, ws.p, stream));
        });
        r.bytes = 2.0 * n;
        in::StatsResult a;
        CK(cudaMemcpy(&a, res.p, sizeof(a), cudaMemcpyDeviceToHost));
        r.wrong = std::to_string(a.nonfinite != 0 ? 1 : 0);
      });
      Measure("Convert f32 -> bf16 (6 B/elem)", nstr, [&](Row& r) {
        r.t = TimeIt(o.warmup, o.iters,
                     [&] { CK(in::LaunchConvert(p->p, in::Dt::kF32, out16->p, in::Dt::kBF16, n, stream)); });
        r.bytes = 6.0 * n;
      });
      // ---- blockwise int8 quantization (ZeRO++ qwZ), blocks of 4096 ----
      // Bytes: the input read + the codes written + a scale per block (quantize); codes + scales read + the
      // output written (dequantize). #wrong: codes and scales (quantize), or outputs (dequantize), of the first
      // 2^20 elements against the same element code run on the host (quantize.cuh's bodies, one host thread),
      // byte for byte.
      {
        constexpr size_t kQBlock = 4096;
        const size_t nb = in::QuantBlockCount(n, kQBlock);
        std::unique_ptr<DevMem> q8, qs;
        try {
          q8 = std::make_unique<DevMem>(n);
          qs = std::make_unique<DevMem>(nb * 4);
        } catch (const std::exception& e) {
          std::printf("quantize rows skipped: %s\n", e.what());
        }
        auto check_quantize = [&](const DevMem& x, in::Dt dt, Row& r) {
          const size_t w = std::min<size_t>(n, size_t{1} << 20), wb = in::QuantBlockCount(w, kQBlock);
          const size_t es = in::DtSize(dt);
          std::vector<unsigned char> hx(w * es);
          std::vector<int8_t> dq(w), hq(w);
          std::vector<float> ds(wb), hs(wb);
          CK(cudaStreamSynchronize(stream));
          CK(cudaMemcpy(hx.data(), x.p, w * es, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(dq.data(), q8->p, w, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(ds.data(), qs->p, wb * 4, cudaMemcpyDeviceToHost));
          for (size_t b = 0; b < wb; ++b) {
            const size_t begin = b * kQBlock, end = std::min(w, begin + kQBlock);
            const uint32_t m = dt == in::Dt::kF32 ? in::QuantMaxThread<in::F32>(hx.data(), begin, end, 0, 1)
                                                  : in::QuantMaxThread<in::BF16>(hx.data(), begin, end, 0, 1);
            const in::QuantScale sc = in::QuantScaleOfBits(dt == in::Dt::kF32 ? in::QuantMaxAsF32Bits<in::F32>(m)
                                                                              : in::QuantMaxAsF32Bits<in::BF16>(m));
            hs[b] = sc.scale;
            if (dt == in::Dt::kF32) {
              in::QuantizeThread<in::F32>(hx.data(), begin, end, sc.inv, hq.data(), 0, 1);
            } else {
              in::QuantizeThread<in::BF16>(hx.data(), begin, end, sc.inv, hq.data(), 0, 1);
            }
          }
          size_t wrong = 0;
          for (size_t i = 0; i < w; ++i) wrong += dq[i] != hq[i];
          wrong += std::memcmp(ds.data(), hs.data(), wb * 4) != 0;
          r.wrong = std::to_string(wrong);
        };
        // The first 2^20 outputs of a dequantize against DequantizeThread run on the host from the same codes and
        // scales (read back from the device), bit for bit.
        auto check_dequantize = [&](const DevMem& out, in::Dt dt, Row& r) {
          const size_t w = std::min<size_t>(n, size_t{1} << 20), wb = in::QuantBlockCount(w, kQBlock);
          const size_t es = in::DtSize(dt);
          std::vector<int8_t> hq(w);
          std::vector<float> hs(wb);
          std::vector<unsigned char> dout(w * es), hout(w * es);
          CK(cudaStreamSynchronize(stream));
          CK(cudaMemcpy(hq.data(), q8->p, w, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(hs.data(), qs->p, wb * 4, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(dout.data(), out.p, w * es, cudaMemcpyDeviceToHost));
          for (size_t b = 0; b < wb; ++b) {
            const size_t begin = b * kQBlock, end = std::min(w, begin + kQBlock);
            if (dt == in::Dt::kF32) {
              in::DequantizeThread<in::F32>(hq.data(), hs[b], begin, end, hout.data(), 0, 1);
            } else {
              in::DequantizeThread<in::BF16>(hq.data(), hs[b], begin, end, hout.data(), 0, 1);
            }
          }
          size_t wrong = 0;
          for (size_t i = 0; i < w; ++i) wrong += std::memcmp(dout.data() + i * es, hout.data() + i * es, es) != 0;
          r.wrong = std::to_string(wrong);
        };
        // The four rows on a launch shape: null for the production launchers (QuantShapeOf), else the shaped ones.
        auto quant_rows = [&](const in::QuantShape* shape) {
          const std::string tag =
              shape ? " @" + std::to_string(shape->max_threads) + "x" + std::to_string(shape->cached) : "";
          auto quantize = [&](const DevMem& x, in::Dt dt) {
            CK(shape ? in::LaunchQuantizeInt8Shaped(x.p, dt, n, kQBlock, *shape, q8->as<int8_t>(), qs->as<float>(),
                                                    stream)
                     : in::LaunchQuantizeInt8(x.p, dt, n, kQBlock, q8->as<int8_t>(), qs->as<float>(), stream));
          };
          auto dequantize = [&](const DevMem& out, in::Dt dt) {
            CK(shape ? in::LaunchDequantizeInt8Shaped(q8->as<int8_t>(), qs->as<float>(), n, kQBlock, *shape, out.p, dt,
                                                      stream)
                     : in::LaunchDequantizeInt8(q8->as<int8_t>(), qs->as<float>(), n, kQBlock, out.p, dt, stream));
          };
          Measure("QuantizeInt8 f32 (5 B/elem)" + tag, nstr, [&](Row& r) {
            r.t = TimeIt(o.warmup, o.iters, [&] { quantize(*p, in::Dt::kF32); });
            r.bytes = 5.0 * n + 4.0 * nb;
            check_quantize(*p, in::Dt::kF32, r);
          });
          Measure("QuantizeInt8 bf16 (3 B/elem)" + tag, nstr, [&](Row& r) {
            r.t = TimeIt(o.warmup, o.iters, [&] { quantize(*g16, in::Dt::kBF16); });
            r.bytes = 3.0 * n + 4.0 * nb;
            check_quantize(*g16, in::Dt::kBF16, r);
          });
          Measure("DequantizeInt8 -> bf16 (3 B/elem)" + tag, nstr, [&](Row& r) {
            r.t = TimeIt(o.warmup, o.iters, [&] { dequantize(*out16, in::Dt::kBF16); });
            r.bytes = 3.0 * n + 4.0 * nb;
            check_dequantize(*out16, in::Dt::kBF16, r);
          });
          Measure("DequantizeInt8 -> f32 (5 B/elem)" + tag, nstr, [&](Row& r) {
            r.t = TimeIt(o.warmup, o.iters, [&] { dequantize(*g32, in::Dt::kF32); });
            r.bytes = 5.0 * n + 4.0 * nb;
            check_dequantize(*g32, in::Dt::kF32, r);
          });
        };
        if (q8 && qs) {
          quant_rows(nullptr);
          for (const in::QuantShape& shape : o.quant_shapes) quant_rows(&shape);
        }
      }
      Measure("Flatten 64 segments (BatchCopy)", HumanCount(4.0 * n) + "B", [&](Row& r) {
        // 64 segments of p scattered into g32's space: one launch.
        std::vector<in::CopySeg> segs;
        const size_t per = n / 64;
        for (size_t s = 0; s < 64; ++s) {
          segs.push_back({p->as<float>() + s * per, g32->as<float>() + s * per, per * 4});
        }
        r.t = TimeIt(o.warmup, o.iters, [&] { CK(in::LaunchBatchCopy(segs.data(), 64, stream)); });
        r.bytes = 2.0 * 4.0 * per * 64;
      });
    }
  }

  std::printf("\n");
  WriteMarkdown(o, device_line);
  if (!g_variant_table.empty()) std::printf("fused-step variants, ratio to the copy:\n%s\n", g_variant_table.c_str());
  bool any_error = false;
  for (const Row& r : g_rows) any_error |= !r.error.empty();
  for (const Row& r : g_rows) {
    if (r.name.rfind("fused AdamW", 0) == 0 && r.error.empty() && g_copy_gbps > 0) {
      std::printf("RESULT adamw_ratio_to_copy %.3f  (%s)  target >= 0.85: %s\n", r.GBps() / g_copy_gbps, r.name.c_str(),
                  r.GBps() / g_copy_gbps >= 0.85 ? "met" : "NOT met");
    }
  }
  for (const Row& r : g_rows) {  // issue 37: the int8 kernels at >= 0.8 of the same run's copy
    if ((r.name.rfind("QuantizeInt8", 0) == 0 || r.name.rfind("DequantizeInt8", 0) == 0) && r.error.empty() &&
        g_copy_gbps > 0) {
      const bool shaped = r.name.find(" @") != std::string::npos;  // a --quant-shapes row, not production
      std::printf("RESULT %s %.3f  (%s)  target >= 0.80: %s\n", shaped ? "quant_shape_ratio" : "quant_ratio_to_copy",
                  r.GBps() / g_copy_gbps, r.name.c_str(), r.GBps() / g_copy_gbps >= 0.80 ? "met" : "NOT met");
    }
  }
  for (const std::string& line : g_best_lines) std::printf("%s\n", line.c_str());
  for (const Row& r : g_rows) {  // a spot check that found a differing bit fails the run
    if (r.error.empty() && r.wrong != "-" && r.wrong != "0") {
      std::printf("RESULT WRONG_RESULTS %s  (#wrong %s: not bit-identical to the host)\n", r.name.c_str(),
                  r.wrong.c_str());
      any_error = true;
    }
  }
  return any_error ? 1 : 0;
}
