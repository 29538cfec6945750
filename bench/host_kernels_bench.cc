// zero-bench-host-kernels — the fused host shard kernels (zero::GradStats, the f32 <-> f16/bf16 casts behind
// zero::ConvertBuffer) next to memcpy and a read-only pass over the same bytes, in the same run.
//
//   build/bin/zero-bench-host-kernels [--simd=TARGET] [google benchmark flags, e.g. --benchmark_filter=GradStats]
//
// --simd forces one of the kernels' SIMD targets (AVX3, AVX2, SSE4, SCALAR; default: the best this CPU runs).
// Every benchmark reports bytes_per_second = bytes read + bytes written per call:
//   GradStats/<type>/n      n * size(type) read                     (read-only)
//   Cast/<from>_<to>/n      n * (size(from) + size(to))              (read + write)
//   Memcpy/bytes            2 * bytes (read + write)                 the copy bound for the casts
//   ReadSum/bytes           bytes read (uint64 sum, auto-vectorized) the read bound for GradStats
//   Fill/bytes              bytes written (memset)                   the write bound
//   Quantize/<type>/n       n * size(type) read, n int8 + n/4096 scales written (ZeRO++'s wire format, blocks of 4096)
//   QuantizePlan/f32/n/L1/L2  Quantize/f32 with its input prefetched L1 and L2 bytes ahead (0: not at that level):
//                           the plans core/quantize.cc picks by CPU vendor, side by side (the label names the default)
//   QuantizeBlock/f32/n/B   Quantize/f32 in blocks of B elements (n/B scales written): a smaller block's cost
//   DequantizeBlock/f32/n/B Dequantize/f32 from blocks of B elements
//   Dequantize/<type>/n     n int8 + n/4096 scales read, n * size(type) written
//   QuantizeVsMemcpy/<type>/n, DequantizeVsMemcpy/<type>/n  the same, each call followed by a memcpy of
//                           n * size(type) bytes: counter vs_memcpy, the median of the pairs' ratios of bytes per
//                           second
//   Crc32c/bytes            bytes read, checksummed in the checkpoint's 1 MiB blocks (ReadSum: its bound)
//   GradStatsScalar, CastScalar: the scalar loops these kernels replaced (engine SumSquares, old ConvertBuffer)
// Two sizes: 256 Ki elements (1 MiB of f32, cache-resident on most x86 L2s) and 128 Mi elements (512 MiB of f32,
// beyond the last-level cache: a memory-bandwidth measurement). Single thread, and at the large size also on every
// hardware thread at once (".../real_time/threads:T", each thread its own buffers, the rates summed over threads): a
// host's ranks quantize their shards at the same moment, and one thread alone does not reach the memory's bandwidth
// (it is bound by how many reads it keeps in flight), so the all-thread Memcpy/ReadSum/Fill are the host's bounds.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/internal/crc32c.h"
#include "core/internal/convert_simd.h"
#include "core/internal/quantize.h"
#include "zero/dtype.h"
#include "zero/memory.h"
#include "zero/mixed_precision.h"

namespace {

using zero::DType;

constexpr size_t kSmall = size_t{256} << 10;
constexpr size_t kLarge = size_t{128} << 20;

// One zero-initialized, page-touched buffer per (slot, bytes), allocated as the library allocates the engine's
// buffers (zero::Buffer::Host, 64-byte aligned: the streamed kernels take their fast path on aligned outputs), so the
// kernels and the Memcpy/ReadSum/Fill bounds all run on the memory the engine's calls see; reused by every benchmark
// of that size so the large ones are allocated and faulted in once. A benchmark's threads each take their own slots
// (Slot).
std::mutex pool_mu;
uint8_t* Buffer(int slot, size_t bytes) {
  static std::map<std::pair<int, size_t>, zero::Buffer> pool;
  std::lock_guard<std::mutex> lock(pool_mu);
  zero::Buffer& b = pool[{slot, bytes}];
  if (b.empty()) b = zero::Buffer::Host(nullptr, zero::MemTag::kStaging, bytes);
  return b.as<uint8_t>();
}

// The slot of this benchmark thread's buffer `slot`: thread 0 uses the single-thread benchmarks' own.
int Slot(const benchmark::State& state, int slot) { return slot + 1000 * state.thread_index(); }

// n random gradient-like values (normal range, both signs) of type t, in buffer slot `slot` (the type by default).
const void* Source(DType t, size_t n, int slot = -1) {
  static std::map<std::pair<int, size_t>, bool> filled;
  if (slot < 0) slot = static_cast<int>(t);
  uint8_t* p = Buffer(slot, n * zero::DTypeSize(t));
  std::lock_guard<std::mutex> lock(pool_mu);
  if (!filled[{slot, n}]) {
    std::mt19937 rng(static_cast<unsigned>(n) + static_cast<unsigned>(t));
    std::normal_distribution<float> dist(0.0f, 1e-2f);
    for (size_t i = 0; i < n; ++i) zero::StoreFromF32(p, t, i, dist(rng));
    filled[{slot, n}] = true;
  }
  return p;
}

void BM_GradStats(benchmark::State& state, DType t) {
  const size_t n = static_cast<size_t>(state.range(0));
  const void* g = Source(t, n);
  for (auto _ : state) {
    zero::GradStatsResult r = zero::GradStats(g, t, n);
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * zero::DTypeSize(t)));
  state.SetLabel(zero::internal::ActiveSimdTarget());
}

void BM_Cast(benchmark::State& state, DType from, DType to) {
  const size_t n = static_cast<size_t>(state.range(0));
  const void* src = Source(from, n);
  void* dst = Buffer(10 + static_cast<int>(to), n * zero::DTypeSize(to));
  for (auto _ : state) {
    zero::ConvertBuffer(src, from, dst, to, n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * (zero::DTypeSize(from) + zero::DTypeSize(to))));
  state.SetLabel(zero::internal::ActiveSimdTarget());
}

constexpr size_t kQuantBlock = 4096;

// Runs `kernel` (moving `bytes` per call) in the benchmark's loop. `paired`: each iteration times the kernel, then a
// memcpy of `copy_bytes` on Memcpy's buffers (the Memcpy bound the results compare the kernel with), the iteration's
// time the kernel's alone (manual time), and the counter vs_memcpy is the median over iterations of the kernel's
// bytes per second over that memcpy's: a drift of the machine's bandwidth between two benchmarks (minutes apart on
// a shared VM) falls on both halves of a pair alike.
template <class Kernel>
void RunKernel(benchmark::State& state, size_t bytes, bool paired, size_t copy_bytes, Kernel&& kernel) {
  if (!paired) {
    for (auto _ : state) {
      kernel();
      benchmark::ClobberMemory();
    }
  } else {
    const uint8_t* src = Buffer(Slot(state, 20), copy_bytes);
    uint8_t* dst = Buffer(Slot(state, 21), copy_bytes);
    std::vector<double> ratios;
    for (auto _ : state) {
      const auto t0 = std::chrono::steady_clock::now();
      kernel();
      benchmark::ClobberMemory();
      const auto t1 = std::chrono::steady_clock::now();
      std::memcpy(dst, src, copy_bytes);
      benchmark::ClobberMemory();
      const auto t2 = std::chrono::steady_clock::now();
      const double tk = std::chrono::duration<double>(t1 - t0).count();
      const double tm = std::chrono::duration<double>(t2 - t1).count();
      state.SetIterationTime(tk);
      ratios.push_back((static_cast<double>(bytes) / tk) / (2.0 * static_cast<double>(copy_bytes) / tm));
    }
    std::sort(ratios.begin(), ratios.end());
    if (!ratios.empty()) state.counters["vs_memcpy"] = ratios[ratios.size() / 2];
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.SetLabel(zero::internal::ActiveSimdTarget());
}

void RunQuantize(benchmark::State& state, DType t, size_t block, bool paired = false) {
  const size_t n = static_cast<size_t>(state.range(0));
  const void* x = Source(t, n, Slot(state, static_cast<int>(t)));
  auto* q = reinterpret_cast<int8_t*>(Buffer(Slot(state, 30), n));
  auto* scales = reinterpret_cast<float*>(Buffer(Slot(state, 31), zero::internal::QuantBlocks(n, block) * 4));
  const size_t bytes = n * zero::DTypeSize(t) + n + zero::internal::QuantBlocks(n, block) * 4;
  RunKernel(state, bytes, paired, n * zero::DTypeSize(t),
            [&] { zero::internal::QuantizeInt8(x, t, n, block, q, scales); });
}

void BM_Quantize(benchmark::State& state, DType t) { RunQuantize(state, t, kQuantBlock); }

// Quantize f32 in blocks of another size (args: n, block): what a smaller zero_quantized_weights_block_size costs
// the coder, on the same buffers as Quantize/f32 (each block's maximum, scale and tail are per-block work).
void BM_QuantizeBlock(benchmark::State& state) { RunQuantize(state, DType::kF32, static_cast<size_t>(state.range(1))); }

// Quantize f32 under another prefetch plan (args: n, L1 bytes ahead, L2 bytes ahead), the process's own restored
// after: the plans side by side in one run, on the same buffers as Quantize/f32.
void BM_QuantizePlan(benchmark::State& state) {
  const zero::internal::QuantizePrefetch own = zero::internal::CurrentQuantizePrefetch();
  zero::internal::SetQuantizePrefetch(
      {.l1_bytes = static_cast<size_t>(state.range(1)), .l2_bytes = static_cast<size_t>(state.range(2))});
  BM_Quantize(state, DType::kF32);
  zero::internal::SetQuantizePrefetch(own);
  state.SetLabel(std::string(zero::internal::ActiveSimdTarget()) + ", this CPU's plan: L1 " +
                 std::to_string(own.l1_bytes) + " L2 " + std::to_string(own.l2_bytes));
}

void RunDequantize(benchmark::State& state, DType t, size_t block, bool paired = false) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto* q = reinterpret_cast<int8_t*>(Buffer(Slot(state, 30), n));
  auto* scales = reinterpret_cast<float*>(Buffer(Slot(state, 31), zero::internal::QuantBlocks(n, block) * 4));
  zero::internal::QuantizeInt8(Source(t, n, Slot(state, static_cast<int>(t))), t, n, block, q,
                               scales);  // real codes and scales
  void* out = Buffer(Slot(state, 10 + static_cast<int>(t)), n * zero::DTypeSize(t));
  const size_t bytes = n * zero::DTypeSize(t) + n + zero::internal::QuantBlocks(n, block) * 4;
  RunKernel(state, bytes, paired, n * zero::DTypeSize(t),
            [&] { zero::internal::DequantizeInt8(q, scales, n, block, out, t); });
}

void BM_Dequantize(benchmark::State& state, DType t) { RunDequantize(state, t, kQuantBlock); }

// Quantize and Dequantize, each call paired with a memcpy of its wider side (RunKernel's vs_memcpy).
void BM_QuantizeVsMemcpy(benchmark::State& state, DType t) { RunQuantize(state, t, kQuantBlock, /*paired=*/true); }
void BM_DequantizeVsMemcpy(benchmark::State& state, DType t) { RunDequantize(state, t, kQuantBlock, /*paired=*/true); }

// Dequantize to f32 from blocks of another size (args: n, block), as QuantizeBlock.
void BM_DequantizeBlock(benchmark::State& state) {
  RunDequantize(state, DType::kF32, static_cast<size_t>(state.range(1)));
}

// The code these kernels replaced, for the speed-up in the same run: the engine's former SumSquares loop (a
// sequential double sum; no inf/NaN count) and ConvertBuffer's former scalar loops over dtype.h's conversions
// (compiled here with the build's default flags, as they were in dtype.cc).
void BM_GradStatsScalar(benchmark::State& state, DType t) {
  const size_t n = static_cast<size_t>(state.range(0));
  const void* g = Source(t, n);
  for (auto _ : state) {
    double sum = 0.0;
    if (t == DType::kF32) {
      const float* f = static_cast<const float*>(g);
      for (size_t i = 0; i < n; ++i) sum += static_cast<double>(f[i]) * f[i];
    } else {
      for (size_t i = 0; i < n; ++i) {
        const double v = zero::LoadAsF32(g, t, i);
        sum += v * v;
      }
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * zero::DTypeSize(t)));
}

template <typename Load, typename Store>
void ScalarLoop(size_t n, Load load, Store store) {
  for (size_t i = 0; i < n; ++i) store(i, load(i));
}

void BM_CastScalar(benchmark::State& state, DType from, DType to) {
  const size_t n = static_cast<size_t>(state.range(0));
  const void* src = Source(from, n);
  void* dst = Buffer(10 + static_cast<int>(to), n * zero::DTypeSize(to));
  const auto* s32 = static_cast<const float*>(src);
  const auto* s16 = static_cast<const uint16_t*>(src);
  auto* d32 = static_cast<float*>(dst);
  auto* d16 = static_cast<uint16_t*>(dst);
  for (auto _ : state) {
    if (from == DType::kF32 && to == DType::kBF16) {
      ScalarLoop(
          n, [&](size_t i) { return s32[i]; }, [&](size_t i, float v) { d16[i] = zero::F32ToBF16(v); });
    } else if (from == DType::kF32 && to == DType::kF16) {
      ScalarLoop(
          n, [&](size_t i) { return s32[i]; }, [&](size_t i, float v) { d16[i] = zero::F32ToF16(v); });
    } else if (from == DType::kBF16) {
      ScalarLoop(
          n, [&](size_t i) { return zero::BF16ToF32(s16[i]); }, [&](size_t i, float v) { d32[i] = v; });
    } else {
      ScalarLoop(
          n, [&](size_t i) { return zero::F16ToF32(s16[i]); }, [&](size_t i, float v) { d32[i] = v; });
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * (zero::DTypeSize(from) + zero::DTypeSize(to))));
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const uint8_t* src = Buffer(Slot(state, 20), bytes);
  uint8_t* dst = Buffer(Slot(state, 21), bytes);
  for (auto _ : state) {
    std::memcpy(dst, src, bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * bytes));
}

void BM_ReadSum(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const auto* src = reinterpret_cast<const uint64_t*>(Buffer(Slot(state, 20), bytes));
  for (auto _ : state) {
    uint64_t s = 0;
    for (size_t i = 0; i < bytes / 8; ++i) s += src[i];
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

// CRC-32C of the buffer ReadSum reads, in the checkpoint's 1 MiB blocks (each its own checksum, as a save computes
// them): bytes read, against ReadSum's bound.
void BM_Crc32c(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const uint8_t* src = Buffer(20, bytes);
  constexpr size_t kBlock = size_t{1} << 20;
  for (auto _ : state) {
    uint32_t x = 0;
    for (size_t b = 0; b < bytes; b += kBlock) x ^= zero::ckpt::Crc32c(0, src + b, std::min(kBlock, bytes - b));
    benchmark::DoNotOptimize(x);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

// The write-only bound: memset of the buffer Memcpy writes (glibc's best stores for the size, non-temporal where it
// judges the buffer too large for the cache).
void BM_Fill(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  uint8_t* dst = Buffer(Slot(state, 21), bytes);
  int value = 0;
  for (auto _ : state) {
    std::memset(dst, ++value & 0xFF, bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void Register() {
  const struct {
    const char* name;
    DType t;
  } kTypes[] = {{"f32", DType::kF32}, {"f16", DType::kF16}, {"bf16", DType::kBF16}};
  const struct {
    const char* name;
    DType from, to;
  } kCasts[] = {{"f32_bf16", DType::kF32, DType::kBF16},
                {"f32_f16", DType::kF32, DType::kF16},
                {"bf16_f32", DType::kBF16, DType::kF32},
                {"f16_f32", DType::kF16, DType::kF32}};
  for (size_t n : {kSmall, kLarge}) {
    const auto count = static_cast<int64_t>(n);
    for (const auto& t : kTypes) {
      benchmark::RegisterBenchmark((std::string("GradStats/") + t.name).c_str(), BM_GradStats, t.t)->Arg(count);
      benchmark::RegisterBenchmark((std::string("GradStatsScalar/") + t.name).c_str(), BM_GradStatsScalar, t.t)
          ->Arg(count);
    }
    for (const auto& t : kTypes) {
      benchmark::RegisterBenchmark((std::string("Quantize/") + t.name).c_str(), BM_Quantize, t.t)->Arg(count);
      benchmark::RegisterBenchmark((std::string("Dequantize/") + t.name).c_str(), BM_Dequantize, t.t)->Arg(count);
    }
    for (const auto& c : kCasts) {
      benchmark::RegisterBenchmark((std::string("Cast/") + c.name).c_str(), BM_Cast, c.from, c.to)->Arg(count);
      benchmark::RegisterBenchmark((std::string("CastScalar/") + c.name).c_str(), BM_CastScalar, c.from, c.to)
          ->Arg(count);
    }
    // The same byte counts as the kernels' inputs: 4n (f32 source), 2n (16-bit source) and n (int8 codes).
    for (int64_t bytes : {4 * count, 2 * count, count}) {
      benchmark::RegisterBenchmark("Memcpy", BM_Memcpy)->Arg(bytes);
      benchmark::RegisterBenchmark("ReadSum", BM_ReadSum)->Arg(bytes);
      benchmark::RegisterBenchmark("Fill", BM_Fill)->Arg(bytes);
    }
    benchmark::RegisterBenchmark("Crc32c", BM_Crc32c)->Arg(4 * count);
  }
  // The prefetch plans the library picks by CPU vendor (core/quantize.cc), each level alone at both distances, and
  // none, whatever this CPU's default.
  using zero::internal::QuantizePrefetch, zero::internal::kQuantizePrefetchL1L2,
      zero::internal::kQuantizePrefetchL1Only;
  for (const QuantizePrefetch& p :
       {kQuantizePrefetchL1L2, kQuantizePrefetchL1Only, QuantizePrefetch{kQuantizePrefetchL1L2.l1_bytes, 0},
        QuantizePrefetch{kQuantizePrefetchL1Only.l1_bytes, kQuantizePrefetchL1L2.l2_bytes}, QuantizePrefetch{0, 0}}) {
    benchmark::RegisterBenchmark("QuantizePlan/f32", BM_QuantizePlan)
        ->Args({static_cast<int64_t>(kLarge), static_cast<int64_t>(p.l1_bytes), static_cast<int64_t>(p.l2_bytes)});
  }
  // Each call paired with a memcpy (at least 2 s: about a hundred pairs a repetition at 128 Mi elements).
  for (const auto& t : kTypes) {
    benchmark::RegisterBenchmark((std::string("QuantizeVsMemcpy/") + t.name).c_str(), BM_QuantizeVsMemcpy, t.t)
        ->Arg(static_cast<int64_t>(kLarge))
        ->UseManualTime()
        ->MinTime(2.0);
    benchmark::RegisterBenchmark((std::string("DequantizeVsMemcpy/") + t.name).c_str(), BM_DequantizeVsMemcpy, t.t)
        ->Arg(static_cast<int64_t>(kLarge))
        ->UseManualTime()
        ->MinTime(2.0);
  }
  for (int64_t block : {256, 512, 1024, 2048, 8192}) {
    benchmark::RegisterBenchmark("QuantizeBlock/f32", BM_QuantizeBlock)->Args({static_cast<int64_t>(kLarge), block});
    benchmark::RegisterBenchmark("DequantizeBlock/f32", BM_DequantizeBlock)
        ->Args({static_cast<int64_t>(kLarge), block});
  }
  // The large size on every hardware thread at once, against the same bounds at the same thread count (real time:
  // Google Benchmark divides the summed bytes by one thread's wall time).
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  if (threads < 2) return;
  const auto count = static_cast<int64_t>(kLarge);
  for (const auto& t : kTypes) {
    benchmark::RegisterBenchmark((std::string("Quantize/") + t.name).c_str(), BM_Quantize, t.t)
        ->Arg(count)
        ->Threads(threads)
        ->UseRealTime();
    benchmark::RegisterBenchmark((std::string("Dequantize/") + t.name).c_str(), BM_Dequantize, t.t)
        ->Arg(count)
        ->Threads(threads)
        ->UseRealTime();
  }
  for (int64_t bytes : {4 * count, 2 * count, count}) {
    benchmark::RegisterBenchmark("Memcpy", BM_Memcpy)->Arg(bytes)->Threads(threads)->UseRealTime();
    benchmark::RegisterBenchmark("ReadSum", BM_ReadSum)->Arg(bytes)->Threads(threads)->UseRealTime();
    benchmark::RegisterBenchmark("Fill", BM_Fill)->Arg(bytes)->Threads(threads)->UseRealTime();
  }
}

// Our flag, then Google Benchmark's (its own help names the program "benchmark" and has no "usage" line).
void PrintUsage() {
  std::printf(
      "usage: zero-bench-host-kernels [--simd TARGET] [--benchmark_...]\n"
      "  --simd TARGET  run the kernels at that SIMD target (one of those this CPU has)\n"
      "Google Benchmark's flags:\n");
  benchmark::PrintDefaultHelp();
}

}  // namespace

int main(int argc, char** argv) {
  constexpr const char* kHint = "(zero-bench-host-kernels --help for usage)";
  std::vector<char*> rest = {argv[0]};
  std::string simd;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      PrintUsage();
      return 0;
    } else if (a.starts_with("--simd=")) {
      simd = a.substr(7);
    } else if (a == "--simd") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "zero-bench-host-kernels: --simd needs a value %s\n", kHint);
        return 2;
      }
      simd = argv[++i];
    } else if (a.starts_with("--benchmark_") || a.starts_with("--v=")) {
      rest.push_back(argv[i]);  // Google Benchmark's, checked by it below
    } else {
      std::fprintf(stderr, "zero-bench-host-kernels: unknown flag %s %s\n", a.c_str(), kHint);
      return 2;
    }
  }
  if (!simd.empty()) {
    const absl::StatusOr<zero::internal::SimdTarget> t =
        zero::internal::SimdTargetFromName(simd, zero::internal::AvailableSimdTargets());
    if (!t.ok()) {
      std::fprintf(stderr, "zero-bench-host-kernels: --simd %s: %s\n", simd.c_str(),
                   zero::ErrorText(t.status()).c_str());
      return 2;
    }
    zero::internal::ForceSimdTargetForTest(t->bits);
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_argc, rest.data())) return 2;
  Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
