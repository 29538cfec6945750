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

// A simulated launch: `blocks` CUDA blocks of `threads` threads, each keeping `cached` vectors in registers;
// `reverse` runs blocks and threads in descending order. 0 takes the kernels' own launch shape for the type
// (QuantGridBlocks, QuantThreads on QuantShapeOf(dt).max_threads, QuantShapeOf(dt).cached: 256 × 4 for f32,
// 64 × 8 for 16-bit types). The grids past the first six are the bench's other shapes (256 × 4, 128 × 4, 128 × 8,
// 64 × 8, 32 × 8: launch.h's QuantShape), on every type.
struct SimGrid {
  size_t blocks;
  size_t threads;
  bool reverse;
  int cached = 0;
};
constexpr SimGrid kGrids[] = {{0, 0, false},     {0, 0, true},     {1, 1, false},      {3, 32, false},
                              {2, 5, true},      {7, 256, true},   {0, 256, false, 4}, {3, 128, true, 8},
                              {0, 64, false, 8}, {5, 32, true, 8}, {0, 128, true, 4}};

std::string GridName(const SimGrid& g) {
  return std::to_string(g.blocks) + "x" + std::to_string(g.threads) + (g.reverse ? " reversed" : "") + " cached " +
         std::to_string(g.cached);
}

// A byte buffer with poisoned guard zones on both sides of `size` data bytes.
struct Guarded {
  static constexpr size_t kGuard = 64;
  std::vector<unsigned char> bytes;
  size_t size;
  size_t offset;
  Guarded(size_t size_bytes, unsigned char poison, size_t offset_bytes = 0)
      : bytes(size_bytes + 2 * kGuard + 32, 0xC3), size(size_bytes), offset(offset_bytes) {
    std::fill(data(), data() + size, poison);
  }
  // 16-byte aligned data, as cudaMalloc's, then `offset` (< 16) bytes further.
  unsigned char* data() {
    const auto a = reinterpret_cast<uintptr_t>(bytes.data()) + kGuard;
    return bytes.data() + kGuard + ((16 - (a & 15)) & 15) + offset;
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

// QuantizeKernel<T>, emulated: the launch's phase from the buffers' addresses, then per block every thread's
// max pass (each keeping its registers), the max of the partials, every thread's coding pass.
template <class T, int C>
void EmulateQuantize(const SimGrid& grid, const void* x, size_t n, size_t block, int8_t* q, float* scales) {
  const size_t nblocks = in::QuantBlockCount(n, block);
  const size_t gb = grid.blocks ? grid.blocks : in::QuantGridBlocks(n, block);
  const size_t nt = grid.threads ? grid.threads : in::QuantThreads(block, in::QuantShapeOf(T::kDt).max_threads);
  const size_t phase = in::QuantVecPhase(x, sizeof(typename T::Elem), q);
  std::vector<in::QuantRegs<T, C>> regs(nt);
  for (size_t bi = 0; bi < gb; ++bi) {
    const size_t bid = Order(bi, gb, grid.reverse);
    for (size_t b = bid; b < nblocks; b += gb) {
      const size_t begin = b * block;
      const size_t end = std::min(n, begin + block);
      const in::QuantSpan span = in::QuantSpanOf<T>(begin, end, phase);
      // Registers poisoned: a coding pass that used a register its max pass did not load would show.
      std::memset(static_cast<void*>(regs.data()), 0xA5, regs.size() * sizeof(regs[0]));
      uint32_t m = 0;
      for (size_t ti = 0; ti < nt; ++ti) {
        const size_t t = Order(ti, nt, grid.reverse);
        m = std::max(m, in::QuantMaxPass<T>(x, begin, end, span, regs[t], t, nt));
      }
      const in::QuantScale s = in::QuantScaleOfBits(in::QuantMaxAsF32Bits<T>(m));
      scales[b] = s.scale;
      for (size_t ti = 0; ti < nt; ++ti) {
        const size_t t = Order(ti, nt, grid.reverse);
        in::QuantCodePass<T>(x, begin, end, span, regs[t], s.inv, q, t, nt);
      }
    }
  }
}

// DequantizeKernel<D>, emulated.
template <class D, int C>
void EmulateDequantize(const SimGrid& grid, const int8_t* q, const float* scales, size_t n, size_t block, void* out) {
  const size_t nblocks = in::QuantBlockCount(n, block);
  const size_t gb = grid.blocks ? grid.blocks : in::QuantGridBlocks(n, block);
  const size_t nt = grid.threads ? grid.threads : in::QuantThreads(block, in::QuantShapeOf(D::kDt).max_threads);
  const size_t phase = in::QuantVecPhase(out, sizeof(typename D::Elem), q);
  for (size_t bi = 0; bi < gb; ++bi) {
    const size_t bid = Order(bi, gb, grid.reverse);
    for (size_t b = bid; b < nblocks; b += gb) {
      const size_t begin = b * block;
      const size_t end = std::min(n, begin + block);
      const in::QuantSpan span = in::QuantSpanOf<D>(begin, end, phase);
      for (size_t ti = 0; ti < nt; ++ti) {
        in::DequantizeSpanThread<D, C>(q, scales[b], begin, end, span, out, Order(ti, nt, grid.reverse), nt);
      }
    }
  }
}

// The grid's cached vectors, or the type's production count.
template <class T>
int CachedOf(const SimGrid& g) {
  return g.cached ? g.cached : static_cast<int>(in::QuantShapeOf(T::kDt).cached);
}

template <class T>
void EmulateQuantizeC(const SimGrid& g, const void* x, size_t n, size_t block, int8_t* q, float* s) {
  if (CachedOf<T>(g) == 8) return EmulateQuantize<T, 8>(g, x, n, block, q, s);
  ASSERT_EQ(CachedOf<T>(g), 4);
  EmulateQuantize<T, 4>(g, x, n, block, q, s);
}
template <class D>
void EmulateDequantizeC(const SimGrid& g, const int8_t* q, const float* s, size_t n, size_t block, void* out) {
  if (CachedOf<D>(g) == 8) return EmulateDequantize<D, 8>(g, q, s, n, block, out);
  ASSERT_EQ(CachedOf<D>(g), 4);
  EmulateDequantize<D, 4>(g, q, s, n, block, out);
}

void EmulateQuantizeAny(const SimGrid& g, DType t, const void* x, size_t n, size_t block, int8_t* q, float* s) {
  switch (t) {
    case DType::kF32: return EmulateQuantizeC<in::F32>(g, x, n, block, q, s);
    case DType::kF16: return EmulateQuantizeC<in::F16>(g, x, n, block, q, s);
    case DType::kBF16: return EmulateQuantizeC<in::BF16>(g, x, n, block, q, s);
  }
}
void EmulateDequantizeAny(const SimGrid& g, DType t, const int8_t* q, const float* s, size_t n, size_t block,
                          void* out) {
  switch (t) {
    case DType::kF32: return EmulateDequantizeC<in::F32>(g, q, s, n, block, out);
    case DType::kF16: return EmulateDequantizeC<in::F16>(g, q, s, n, block, out);
    case DType::kBF16: return EmulateDequantizeC<in::BF16>(g, q, s, n, block, out);
  }
}

// The kinds of block the input cycles through.
enum Kind { kRandom, kTies, kOutlier, kConstant, kZero, kSubnormal, kTiny, kNaN, kInf, kNegInf, kKinds };

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
        // Normal, but 127 / max overflows: zeros, not NaN or saturated codes (core/internal/quantize.h).
        case kTiny: v = (k % 3 == 0) ? 2e-37f : (k % 3 == 1 ? -1.5e-38f : 0.0f); break;
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

// 32 and 64: a few whole vectors per block; 4096: the bench's, every vector in registers on the launch shape;
// 3, 4097 and 5000 (5000 ≡ 8 mod 16): blocks that start off a vector boundary, so the body has a scalar head.
constexpr size_t kBlockSizes[] = {1, 3, 32, 64, 4096, 4097, 5000};

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

// Buffers offset against cudaMalloc's alignment (the API takes any element-aligned pointer): a common vector
// phase other than 0 (wide and codes offset by the same elements), and none (offset against each other: every
// element scalar). Each against the scalar reference, on the launch shape and a small grid.
TEST(QuantizeEmulationTest, OffsetBuffersMatchScalarReference) {
  std::mt19937 rng(39);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const size_t es = DTypeSize(t);
    for (size_t block : {size_t{64}, size_t{4097}}) {
      const size_t n = 3 * block + 5, nb = internal::QuantBlocks(n, block);
      const std::vector<float> xf = MakeInput(n, block, 0, rng);
      const std::vector<unsigned char> x = AsType(xf, t);
      std::vector<int8_t> ref_q(n);
      std::vector<float> ref_s(nb);
      internal::QuantizeInt8Scalar(x.data(), t, n, block, ref_q.data(), ref_s.data());
      std::vector<unsigned char> ref_out(n * es);
      internal::DequantizeInt8Scalar(ref_q.data(), ref_s.data(), n, block, ref_out.data(), t);
      // (wide buffer's offset in elements, codes' offset in bytes)
      for (const auto& [xo, qo] : {std::pair<size_t, size_t>{0, 0},
                                   {1, 1},
                                   {3, 3},
                                   {2, 2},
                                   {0, 1},
                                   {1, 0},
                                   {0, 4},
                                   {2, 0},
                                   {4, 4},
                                   {5, 5},
                                   {7, 3}}) {
        if (xo * es >= 16) continue;
        const size_t x_off = xo * es;
        const std::string where = std::string(DTypeName(t)) + " block=" + std::to_string(block) + " wide+" +
                                  std::to_string(x_off) + "B codes+" + std::to_string(qo) + "B";
        Guarded gx(n * es, 0);
        std::memcpy(gx.data() + x_off, x.data(), x.size());  // gx is only storage here: offset by hand
        const void* xp = gx.data() + x_off;
        for (const SimGrid& g : {kGrids[0], kGrids[4], kGrids[6], kGrids[10]}) {
          Guarded q(n, 0xA5, qo), s(nb * sizeof(float), 0x5A);
          EmulateQuantizeAny(g, t, xp, n, block, reinterpret_cast<int8_t*>(q.data()),
                             reinterpret_cast<float*>(s.data()));
          ASSERT_EQ(std::memcmp(q.data(), ref_q.data(), n), 0) << "codes differ: " << where << " grid " << GridName(g);
          ASSERT_EQ(std::memcmp(s.data(), ref_s.data(), nb * 4), 0) << where;
          ASSERT_TRUE(q.GuardsIntact()) << where;
          Guarded qin(n, 0, qo), out(n * es, 0x5A, x_off);
          std::memcpy(qin.data(), ref_q.data(), n);
          EmulateDequantizeAny(g, t, reinterpret_cast<const int8_t*>(qin.data()), ref_s.data(), n, block, out.data());
          ASSERT_EQ(std::memcmp(out.data(), ref_out.data(), ref_out.size()), 0)
              << "dequantized values differ: " << where << " grid " << GridName(g);
          ASSERT_TRUE(out.GuardsIntact()) << where;
        }
      }
    }
  }
}

// The phase and the split of a block: a common 16-byte boundary of both buffers when one exists, the scalar
// head and tail below one vector each, everything scalar without a phase or without a whole vector.
TEST(QuantizeEmulationTest, VectorSpans) {
  alignas(16) static unsigned char buf[64];
  EXPECT_EQ(in::QuantVecPhase(buf, 4, buf + 32), 0u);
  EXPECT_EQ(in::QuantVecPhase(buf + 4, 4, buf + 33), 3u);  // element 3 at buf + 16, code 3 at buf + 36
  EXPECT_EQ(in::QuantVecPhase(buf + 4, 4, buf + 32), 4u);  // none: f32 vectors are 4 elements
  EXPECT_EQ(in::QuantVecPhase(buf + 2, 4, buf + 32), 4u);  // not element-aligned
  EXPECT_EQ(in::QuantVecPhase(buf + 6, 2, buf + 11), 5u);  // element 5 at buf + 16, code 5 at buf + 16
  EXPECT_EQ(in::QuantVecPhase(buf + 6, 2, buf + 13), 8u);  // code 5 at buf + 18: none (bf16 vectors are 8)
  EXPECT_EQ(in::QuantVecPhase(buf + 2, 2, buf + 41), 7u);  // element 7 at buf + 16, code 7 at buf + 48
  const in::QuantSpan a = in::QuantSpanOf<in::F32>(4097, 8194, 0);
  EXPECT_EQ(a.body, 4100u);
  EXPECT_EQ(a.nvec, 1023u);
  EXPECT_EQ(a.tail, 8192u);
  const in::QuantSpan b = in::QuantSpanOf<in::BF16>(0, 4096, 0);
  EXPECT_EQ(b.body, 0u);
  EXPECT_EQ(b.nvec, 512u);
  EXPECT_EQ(b.tail, 4096u);
  const in::QuantSpan c = in::QuantSpanOf<in::BF16>(9, 20, 0);  // 16..20 is no whole vector
  EXPECT_EQ(c.nvec, 0u);
  EXPECT_EQ(c.body, 20u);
  const in::QuantSpan d = in::QuantSpanOf<in::F32>(0, 100, 4);  // no phase
  EXPECT_EQ(d.nvec, 0u);
  EXPECT_EQ(d.body, 100u);
  EXPECT_EQ(d.tail, 100u);
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
  EmulateQuantize<in::F32, 4>({0, 0, false}, x.data(), x.size(), block, q.data(), s.data());
  EXPECT_EQ(FloatBits(s[0]), FloatBits(1.0f));
  const int8_t ties[] = {127, 0, 2, 2, 0, -2};
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(q[i], ties[i]) << i;
  EXPECT_EQ(FloatBits(s[1]), 0u);
  EXPECT_TRUE(std::isnan(s[2]));
  EXPECT_TRUE(std::isnan(s[3]));
  for (size_t i = 6; i < x.size(); ++i) EXPECT_EQ(q[i], 0) << i;
  std::vector<float> back(x.size());
  EmulateDequantize<in::F32, 4>({0, 0, false}, q.data(), s.data(), x.size(), block, back.data());
  for (size_t i = 12; i < x.size(); ++i) EXPECT_TRUE(std::isnan(back[i])) << i;
  for (size_t i = 6; i < 12; ++i) EXPECT_EQ(FloatBits(back[i]), 0u) << i;
}

// The launch shape: whole warps, at most the shape's threads (production: 256 × 4 for f32, 64 × 8 for 16-bit types),
// one CUDA block per quantization block up to kQuantMaxGrid.
TEST(QuantizeEmulationTest, LaunchShape) {
  EXPECT_EQ(in::QuantThreads(1), 32u);
  EXPECT_EQ(in::QuantThreads(33), 64u);
  EXPECT_EQ(in::QuantThreads(256), static_cast<unsigned>(in::kThreads));
  EXPECT_EQ(in::QuantThreads(5000), static_cast<unsigned>(in::kThreads));
  EXPECT_EQ(in::QuantThreads(5000, 128), 128u);
  EXPECT_EQ(in::QuantThreads(100, 64), 64u);
  EXPECT_EQ(in::QuantThreads(33, 128), 64u);
  EXPECT_EQ(in::QuantShapeOf(in::Dt::kF32).max_threads, static_cast<unsigned>(in::kThreads));
  EXPECT_EQ(in::QuantShapeOf(in::Dt::kF32).cached, 4u);
  for (in::Dt dt : {in::Dt::kBF16, in::Dt::kF16}) {
    EXPECT_EQ(in::QuantShapeOf(dt).max_threads, 64u);
    EXPECT_EQ(in::QuantShapeOf(dt).cached, 8u);
    // A 4096-element block: 512 vectors, 8 per thread, all in registers.
    EXPECT_EQ(in::QuantThreads(4096, in::QuantShapeOf(dt).max_threads) * in::QuantShapeOf(dt).cached * 8, 4096u);
  }
  for (in::Dt dt : {in::Dt::kF32, in::Dt::kBF16, in::Dt::kF16}) EXPECT_TRUE(in::QuantShapeValid(in::QuantShapeOf(dt)));
  EXPECT_TRUE(in::QuantShapeValid({64, 8}));
  EXPECT_FALSE(in::QuantShapeValid({48, 4}));
  EXPECT_FALSE(in::QuantShapeValid({512, 4}));
  EXPECT_FALSE(in::QuantShapeValid({0, 4}));
  EXPECT_FALSE(in::QuantShapeValid({128, 6}));
  EXPECT_EQ(in::QuantGridBlocks(10, 3), 4u);
  EXPECT_EQ(in::QuantGridBlocks(size_t{1} << 40, 1), static_cast<unsigned>(in::kQuantMaxGrid));
}

}  // namespace
}  // namespace zero
