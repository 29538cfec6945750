// The blockwise int8 quantize / dequantize kernels (src/cuda/quantize.cu) emulated on the CPU, in CI where there is
// no GPU: their per-thread bodies (src/cuda/internal/quantize.cuh) run as simulated grids — each simulated CUDA
// block walks the quantization blocks of its grid-stride loop as the kernel does, its threads run one after the
// other (in ascending or descending order), the block's maximum is the max of the threads' partials (the
// kernel's shuffle/shared-memory reduction computes the same max in another order; an integer max is
// order-free) — and the results must equal the host's scalar reference (QuantizeInt8Scalar /
// DequantizeInt8Scalar) byte for byte, for f32, bf16 and f16, on blocks holding ties, an outlier, constants,
// zeros, subnormals, NaN and infinities. Outputs are poisoned with two different patterns (so an element the
// grid fails to write cannot match by chance) and guarded on both sides.
//
// What it proves: the kernels' indexing (block ranges, partial last block, grid-stride over blocks, thread
// strides), that threads are independent (any grid shape and order gives the same bytes), and the arithmetic as
// the host compiles it. What only a device shows — __fdiv_rn / __fmul_rn / __float2int_rn, the warp shuffles,
// the launches — tests/cuda/quantize_test.cc (label `gpu`) checks on a device.
//
// Compiled with -ffp-contract=off (tests/cuda/CMakeLists.txt), like the device code's _rn intrinsics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/internal/quantize.h"
#include "cuda/internal/launch.h"
#include "cuda/internal/quantize.cuh"
#include "zero/dtype.h"

namespace zero {
namespace {

namespace in = ::zero::cuda::internal;

// A simulated launch: `blocks` CUDA blocks of `threads` threads; `reverse` runs blocks and threads in descending
// order. blocks == 0 / threads == 0 take the kernels' own launch shape (QuantGridBlocks / QuantThreads).
struct SimGrid {
  size_t blocks;
  size_t threads;
  bool reverse;
};
constexpr SimGrid kGrids[] = {{0, 0, false}, {0, 0, true}, {1, 1, false}, {3, 32, false}, {2, 5, true}, {7, 256, true}};

std::string GridName(const SimGrid& g) {
  return std::to_string(g.blocks) + "x" + std::to_string(g.threads) + (g.reverse ? " reversed" : "");
}

// A byte buffer with poisoned guard zones on both sides of `size` data bytes.
struct Guarded {
  static constexpr size_t kGuard = 64;
  std::vector<unsigned char> bytes;
  size_t size;
  Guarded(size_t size_bytes, unsigned char poison) : bytes(size_bytes + 2 * kGuard + 16, 0xC3), size(size_bytes) {
    std::fill(data(), data() + size, poison);
  }
  // 16-byte aligned data, as cudaMalloc's.
  unsigned char* data() {
    const auto a = reinterpret_cast<uintptr_t>(bytes.data()) + kGuard;
    return bytes.data() + kGuard + ((16 - (a & 15)) & 15);
  }
  bool GuardsIntact() {
    const unsigned char* d = data();
    for (const unsigned char* p = bytes.data(); p < d; ++p) {
      if (*p != 0xC3) return false;
    }
    for (const unsigned char* p = d + size; p < bytes.data() + bytes.size(); ++p) {
      if (*p != 0xC3) return false;
    }
    return true;
  }
};

size_t Order(size_t i, size_t count, bool reverse) { return reverse ? count - 1 - i : i; }

// QuantizeKernel<T>, emulated.
template <class T>
void EmulateQuantize(const SimGrid& grid, const void* x, size_t n, size_t block, int8_t* q, float* scales) {
  const size_t nblocks = in::QuantBlockCount(n, block);
  const size_t gb = grid.blocks ? grid.blocks : in::QuantGridBlocks(n, block);
  const size_t nt = grid.threads ? grid.threads : in::QuantThreads(block);
  for (size_t bi = 0; bi < gb; ++bi) {
    const size_t bid = Order(bi, gb, grid.reverse);
    for (size_t b = bid; b < nblocks; b += gb) {
      const size_t begin = b * block;
      const size_t end = std::min(n, begin + block);
      uint32_t m = 0;
      for (size_t ti = 0; ti < nt; ++ti)
        m = std::max(m, in::QuantMaxThread<T>(x, begin, end, Order(ti, nt, grid.reverse), nt));
      const in::QuantScale s = in::QuantScaleOfBits(in::QuantMaxAsF32Bits<T>(m));
      scales[b] = s.scale;
      for (size_t ti = 0; ti < nt; ++ti)
        in::QuantizeThread<T>(x, begin, end, s.inv, q, Order(ti, nt, grid.reverse), nt);
    }
  }
}

// DequantizeKernel<D>, emulated.
template <class D>
void EmulateDequantize(const SimGrid& grid, const int8_t* q, const float* scales, size_t n, size_t block, void* out) {
  const size_t nblocks = in::QuantBlockCount(n, block);
  const size_t gb = grid.blocks ? grid.blocks : in::QuantGridBlocks(n, block);
  const size_t nt = grid.threads ? grid.threads : in::QuantThreads(block);
  for (size_t bi = 0; bi < gb; ++bi) {
    const size_t bid = Order(bi, gb, grid.reverse);
    for (size_t b = bid; b < nblocks; b += gb) {
      const size_t begin = b * block;
      const size_t end = std::min(n, begin + block);
      for (size_t ti = 0; ti < nt; ++ti) {
        in::DequantizeThread<D>(q, scales[b], begin, end, out, Order(ti, nt, grid.reverse), nt);
      }
    }
  }
}

void EmulateQuantizeAny(const SimGrid& g, DType t, const void* x, size_t n, size_t block, int8_t* q, float* s) {
  switch (t) {
    case DType::kF32: return EmulateQuantize<in::F32>(g, x, n, block, q, s);
    case DType::kF16: return EmulateQuantize<in::F16>(g, x, n, block, q, s);
    case DType::kBF16: return EmulateQuantize<in::BF16>(g, x, n, block, q, s);
  }
}
void EmulateDequantizeAny(const SimGrid& g, DType t, const int8_t* q, const float* s, size_t n, size_t block,
                          void* out) {
  switch (t) {
    case DType::kF32: return EmulateDequantize<in::F32>(g, q, s, n, block, out);
    case DType::kF16: return EmulateDequantize<in::F16>(g, q, s, n, block, out);
    case DType::kBF16: return EmulateDequantize<in::BF16>(g, q, s, n, block, out);
  }
}

// The kinds of block the input cycles through.
enum Kind { kRandom, kTies, kOutlier, kConstant, kZero, kSubnormal, kNaN, kInf, kNegInf, kKinds };

// n f32 values in blocks of `block`, block b of kind (b + shift) % kKinds.
std::vector<float> MakeInput(size_t n, size_t block, size_t shift, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t begin = 0, b = 0; begin < n; begin += block, ++b) {
    const size_t end = std::min(n, begin + block);
    const Kind kind = static_cast<Kind>((b + shift) % kKinds);
    for (size_t i = begin; i < end; ++i) {
      const size_t k = i - begin;
      float v = normal(rng);
      switch (kind) {
        case kRandom: break;
        case kTies:
          // max|x| = 127 makes 127 / max exactly 1 (254: exactly 0.5), so k + 0.5 (2k + 1) lands on a tie that
          // must round to even, in both signs; every value is exact in bf16 and f16.
          if (k == 0) {
            v = (b & 1) ? 254.0f : 127.0f;
          } else {
            const float tie = static_cast<float>(k % 126) + 0.5f;
            v = ((b & 1) ? 2.0f * tie : tie) * ((k & 1) ? -1.0f : 1.0f);
          }
          break;
        case kOutlier: v = k == (end - begin) / 2 ? 1e4f : v; break;
        case kConstant: v = (b & 1) ? -0.37f : 0.37f; break;
        case kZero: v = (k & 1) ? -0.0f : 0.0f; break;
        case kSubnormal: v = (k % 3 == 0) ? 1e-40f : (k % 3 == 1 ? -3e-42f : 0.0f); break;
        case kNaN: v = k == (end - begin - 1) ? std::numeric_limits<float>::quiet_NaN() : v; break;
        case kInf: v = k == 0 ? std::numeric_limits<float>::infinity() : v; break;
        case kNegInf: v = k == (end - begin) / 3 ? -std::numeric_limits<float>::infinity() : v; break;
        case kKinds: break;
      }
      x[i] = v;
    }
  }
  return x;
}

// Input of type t (f32 values rounded to t, as the engine's 16-bit shards are).
std::vector<unsigned char> AsType(const std::vector<float>& x, DType t) {
  std::vector<unsigned char> out(x.size() * DTypeSize(t));
  ConvertBuffer(x.data(), DType::kF32, out.data(), t, x.size());
  return out;
}

constexpr size_t kBlockSizes[] = {1, 3, 64, 4096, 5000};

// The lengths tried for a block size: less than a block, exact multiples, and multiples plus a partial block.
std::vector<size_t> Lengths(size_t block) {
  std::vector<size_t> ns = {1, block + 1, 3 * block, 2 * kKinds * block + block / 2 + 1};
  if (block > 1) ns.push_back(block - 1);
  return ns;
}

TEST(QuantizeEmulationTest, QuantizeMatchesScalarReferenceOnEveryGrid) {
  std::mt19937 rng(37);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (size_t block : kBlockSizes) {
      size_t shift = 0;
      for (size_t n : Lengths(block)) {
        const std::vector<unsigned char> x = AsType(MakeInput(n, block, shift++, rng), t);
        const size_t nb = internal::QuantBlocks(n, block);
        std::vector<int8_t> ref_q(n);
        std::vector<float> ref_s(nb);
        internal::QuantizeInt8Scalar(x.data(), t, n, block, ref_q.data(), ref_s.data());
        for (const SimGrid& g : kGrids) {
          for (unsigned char poison : {0xA5, 0x5A}) {
            Guarded q(n, poison), s(nb * sizeof(float), poison);
            EmulateQuantizeAny(g, t, x.data(), n, block, reinterpret_cast<int8_t*>(q.data()),
                               reinterpret_cast<float*>(s.data()));
            const std::string where = std::string(DTypeName(t)) + " block=" + std::to_string(block) +
                                      " n=" + std::to_string(n) + " grid " + GridName(g);
            ASSERT_EQ(std::memcmp(q.data(), ref_q.data(), n), 0) << "codes differ: " << where;
            ASSERT_EQ(std::memcmp(s.data(), ref_s.data(), nb * sizeof(float)), 0) << "scales differ: " << where;
            ASSERT_TRUE(q.GuardsIntact()) << where;
            ASSERT_TRUE(s.GuardsIntact()) << where;
          }
        }
      }
    }
  }
}

TEST(QuantizeEmulationTest, DequantizeMatchesScalarReferenceOnEveryGrid) {
  std::mt19937 rng(38);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (size_t block : kBlockSizes) {
      size_t shift = 0;
      for (size_t n : Lengths(block)) {
        // Codes and scales as the host quantizes them (quantized from f32: the scales and codes of every kind).
        const std::vector<float> x = MakeInput(n, block, shift++, rng);
        const size_t nb = internal::QuantBlocks(n, block);
        std::vector<int8_t> q(n);
        std::vector<float> s(nb);
        internal::QuantizeInt8Scalar(x.data(), DType::kF32, n, block, q.data(), s.data());
        std::vector<unsigned char> ref(n * DTypeSize(t));
        internal::DequantizeInt8Scalar(q.data(), s.data(), n, block, ref.data(), t);
        for (const SimGrid& g : kGrids) {
          for (unsigned char poison : {0xA5, 0x5A}) {
            Guarded out(n * DTypeSize(t), poison);
            EmulateDequantizeAny(g, t, q.data(), s.data(), n, block, out.data());
            ASSERT_EQ(std::memcmp(out.data(), ref.data(), ref.size()), 0)
                << DTypeName(t) << " block=" << block << " n=" << n << " grid " << GridName(g);
            ASSERT_TRUE(out.GuardsIntact()) << DTypeName(t) << " block=" << block << " grid " << GridName(g);
          }
        }
      }
    }
  }
}

// The cases the reference defines, checked against their meaning too (not only against the reference): a tie
// rounds to even, NaN/inf blocks give scale NaN and codes 0, zero/subnormal blocks scale 0 and codes 0.
TEST(QuantizeEmulationTest, SpecialBlocksHaveTheDocumentedCodes) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {127.0f, 0.5f,  1.5f,
                                2.5f,   -0.5f, -2.5f,  // ties: 0, 2, 2, -0, -2
                                1e-40f, -0.0f, 0.0f,
                                1e-39f, 0.0f,  0.0f,  // subnormal block
                                1.0f,   inf,   2.0f,
                                3.0f,   4.0f,  5.0f,  // inf block
                                1.0f,   2.0f,  std::numeric_limits<float>::quiet_NaN(),
                                3.0f,   4.0f,  5.0f};
  const size_t block = 6;
  std::vector<int8_t> q(x.size(), 99);
  std::vector<float> s(4, 99.0f);
  EmulateQuantize<in::F32>({0, 0, false}, x.data(), x.size(), block, q.data(), s.data());
  EXPECT_EQ(FloatBits(s[0]), FloatBits(1.0f));
  const int8_t ties[] = {127, 0, 2, 2, 0, -2};
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(q[i], ties[i]) << i;
  EXPECT_EQ(FloatBits(s[1]), 0u);
  EXPECT_TRUE(std::isnan(s[2]));
  EXPECT_TRUE(std::isnan(s[3]));
  for (size_t i = 6; i < x.size(); ++i) EXPECT_EQ(q[i], 0) << i;
  std::vector<float> back(x.size());
  EmulateDequantize<in::F32>({0, 0, false}, q.data(), s.data(), x.size(), block, back.data());
  for (size_t i = 12; i < x.size(); ++i) EXPECT_TRUE(std::isnan(back[i])) << i;
  for (size_t i = 6; i < 12; ++i) EXPECT_EQ(FloatBits(back[i]), 0u) << i;
}

// The launch shape: whole warps, at most kThreads, one CUDA block per quantization block up to kQuantMaxGrid.
TEST(QuantizeEmulationTest, LaunchShape) {
  EXPECT_EQ(in::QuantThreads(1), 32u);
  EXPECT_EQ(in::QuantThreads(33), 64u);
  EXPECT_EQ(in::QuantThreads(256), static_cast<unsigned>(in::kThreads));
  EXPECT_EQ(in::QuantThreads(5000), static_cast<unsigned>(in::kThreads));
  EXPECT_EQ(in::QuantGridBlocks(10, 3), 4u);
  EXPECT_EQ(in::QuantGridBlocks(size_t{1} << 40, 1), static_cast<unsigned>(in::kQuantMaxGrid));
}

}  // namespace
}  // namespace zero
