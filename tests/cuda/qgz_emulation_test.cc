// ZeRO++ qgZ's element kernels (src/cuda/qgz.cu) emulated on the CPU, in CI where there is no GPU: their per-thread
// bodies (src/cuda/internal/qgz.cuh) run as simulated grids — the int4 scale pass per quantization block (each
// simulated CUDA block's threads' partial maxima, their max the block's: the kernel's warp-shuffle and shared-memory
// tree computes the same integer max in another order), the code pass and the others grid-stride over simulated
// threads in ascending or descending order — and must equal the host tier's scalar references byte for byte:
// core/internal/quantize.h's QuantizeInt4 / DequantizeInt4 (codes, scales, read-back values) and
// shard/internal/compute.h's LocoResidualOnHost / DivideOnHost, on blocks of random values, ties, an outlier,
// constants, zeros, subnormals, NaN and infinities, odd lengths and odd block sizes (a byte whose two codes lie in two
// blocks). Outputs are poisoned first, so an element no simulated thread writes cannot match by chance.
//
// What only a device shows — __fmul_rn / __fdiv_rn / __float2int_rn, the shuffles, the launches — tests/cuda/
// qgz_kernels_test.cc (label `gpu`) checks on one. Compiled with -ffp-contract=off (tests/cuda/CMakeLists.txt).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/internal/quantize.h"
#include "cuda/internal/launch.h"
#include "cuda/internal/qgz.cuh"
#include "shard/internal/compute.h"

namespace zero {
namespace {

namespace in = ::zero::cuda::internal;

struct Grid {
  size_t blocks;  // 0: the launch's own (QuantGridBlocks for the scale pass; enough for one item per thread else)
  size_t threads;
  bool reverse;
};
constexpr Grid kGrids[] = {{0, 256, false}, {0, 256, true}, {1, 1, false}, {3, 32, true}, {2, 5, false}, {7, 64, true}};

size_t Order(size_t i, size_t count, bool reverse) { return reverse ? count - 1 - i : i; }

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// n values whose blocks cycle through the kinds a gradient can hold.
std::vector<float> Input(size_t n, size_t block, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t b = i / block, j = i % block;
    switch (b % 9) {
      case 0: x[i] = normal(rng); break;
      case 1: x[i] = (j == 0) ? 7.0f : static_cast<float>(static_cast<int>(j % 15) - 7) * 0.5f; break;  // ties
      case 2: x[i] = (j == 1) ? 1e4f : 1e-3f * normal(rng); break;                                      // an outlier
      case 3: x[i] = 0.25f; break;                                                                      // constant
      case 4: x[i] = 0.0f; break;
      case 5: x[i] = std::numeric_limits<float>::denorm_min() * static_cast<float>(j % 5); break;  // subnormal
      case 6: x[i] = (j == 2) ? std::numeric_limits<float>::quiet_NaN() : normal(rng); break;
      case 7: x[i] = (j % 2 == 0) ? 2e-38f : -1.5e-38f; break;  // normal, but 7 / max overflows: zeros
      default: x[i] = (j == 0) ? -std::numeric_limits<float>::infinity() : normal(rng); break;
    }
  }
  return x;
}

// Int4ScalesKernel then Int4CodesKernel, emulated.
void EmulateQuantizeInt4(const Grid& g, const float* x, size_t n, size_t block, uint8_t* q, float* scales, float* inv) {
  const size_t nblocks = in::QuantBlockCount(n, block);
  const size_t gb = g.blocks ? g.blocks : in::QuantGridBlocks(n, block);
  const size_t nt = g.threads;
  for (size_t bi = 0; bi < gb; ++bi) {
    for (size_t b = Order(bi, gb, g.reverse); b < nblocks; b += gb) {
      const size_t begin = b * block, end = std::min(n, begin + block);
      uint32_t m = 0;
      for (size_t ti = 0; ti < nt; ++ti) {
        m = std::max(m, in::QuantMaxThread<in::F32>(x, begin, end, Order(ti, nt, g.reverse), nt));
      }
      const in::QuantScale s = in::Int4ScaleOfBits(m);
      scales[b] = s.scale;
      inv[b] = s.inv;
    }
  }
  const size_t total = (g.blocks ? g.blocks : ((n + 1) / 2 + nt - 1) / nt) * nt;
  for (size_t ti = 0; ti < total; ++ti) in::Int4CodesThread(x, n, block, inv, q, Order(ti, total, g.reverse), total);
}

// A grid-stride element kernel's threads, emulated: body(tid, nthreads) for every simulated thread.
template <typename Body>
void EmulateElementwise(const Grid& g, size_t n, Body body) {
  const size_t total = (g.blocks ? g.blocks : (n + g.threads - 1) / g.threads) * g.threads;
  for (size_t ti = 0; ti < std::max<size_t>(total, 1); ++ti) body(Order(ti, total, g.reverse), total);
}

TEST(QgzKernelsEmulation, Int4MatchesTheHostReference) {
  std::mt19937 rng(17);
  for (size_t block : {size_t{1}, size_t{7}, size_t{32}, size_t{37}, size_t{1024}}) {
    for (size_t n : {size_t{1}, size_t{2}, size_t{33}, size_t{1001}, size_t{4099}}) {
      const std::vector<float> x = Input(n, block, rng);
      const size_t nb = in::QuantBlockCount(n, block), bytes = (n + 1) / 2;
      std::vector<uint8_t> ref_q(bytes);
      std::vector<float> ref_s(nb), ref_back(n);
      internal::QuantizeInt4(x.data(), n, block, ref_q.data(), ref_s.data());
      internal::DequantizeInt4(ref_q.data(), ref_s.data(), n, block, ref_back.data());
      for (const Grid& g : kGrids) {
        SCOPED_TRACE(::testing::Message() << "n " << n << ", block " << block << ", grid " << g.blocks << "x"
                                          << g.threads << (g.reverse ? " reversed" : ""));
        std::vector<uint8_t> q(bytes, 0xA5);
        std::vector<float> s(nb, 1234.5f), inv(nb, -1.0f), back(n, 99.0f);
        EmulateQuantizeInt4(g, x.data(), n, block, q.data(), s.data(), inv.data());
        ASSERT_EQ(q, ref_q);
        for (size_t b = 0; b < nb; ++b) ASSERT_EQ(Bits(s[b]), Bits(ref_s[b])) << "scale " << b;
        EmulateElementwise(g, n, [&](size_t t, size_t nt) {
          in::DequantizeInt4Thread(q.data(), s.data(), n, block, back.data(), t, nt);
        });
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(Bits(back[i]), Bits(ref_back[i])) << "element " << i;
      }
    }
  }
}

TEST(QgzKernelsEmulation, LocoResidualAndDivideMatchTheHostReference) {
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t n = 3001;
  std::vector<float> y(n), sent(n), e0(n), src(n);
  for (size_t i = 0; i < n; ++i) {
    y[i] = normal(rng);
    sent[i] = y[i] + 0.01f * normal(rng);
    e0[i] = 0.001f * normal(rng);
    src[i] = 1e3f * normal(rng);
  }
  // What LoCo must drop: a non-finite gradient (an fp16 overflow), an overflowing difference, a NaN residual.
  y[5] = std::numeric_limits<float>::infinity();
  y[6] = std::numeric_limits<float>::quiet_NaN();
  y[7] = 3e38f;
  sent[7] = -3e38f;
  e0[8] = std::numeric_limits<float>::quiet_NaN();
  e0[9] = std::numeric_limits<float>::denorm_min();
  src[10] = std::numeric_limits<float>::denorm_min();
  for (float beta : {0.8f, 0.0f, 0.999f}) {
    std::vector<float> ref = e0;
    internal::LocoResidualOnHost(y.data(), sent.data(), ref.data(), beta, static_cast<int64_t>(n));
    EXPECT_EQ(ref[5], 0.0f);
    EXPECT_EQ(ref[6], 0.0f);
    EXPECT_EQ(ref[8], 0.0f);
    for (const Grid& g : kGrids) {
      SCOPED_TRACE(::testing::Message() << "beta " << beta << ", grid " << g.blocks << "x" << g.threads);
      std::vector<float> e = e0;
      EmulateElementwise(g, n, [&](size_t t, size_t nt) {
        in::LocoResidualThread(y.data(), sent.data(), e.data(), beta, 1.0f - beta, n, t, nt);
      });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(Bits(e[i]), Bits(ref[i])) << "element " << i;
    }
  }
  for (float divisor : {4.0f, 3.0f, 6.0f, 1e-30f}) {
    std::vector<float> ref(n);
    internal::DivideOnHost(src.data(), ref.data(), static_cast<int64_t>(n), divisor);
    for (const Grid& g : kGrids) {
      std::vector<float> out(n, -7.0f);
      EmulateElementwise(g, n,
                         [&](size_t t, size_t nt) { in::DivideThread(src.data(), out.data(), divisor, n, t, nt); });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(Bits(out[i]), Bits(ref[i])) << "divisor " << divisor << ", " << i;
    }
  }
}

}  // namespace
}  // namespace zero
