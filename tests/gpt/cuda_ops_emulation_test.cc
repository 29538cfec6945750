// The GPT's CUDA path (examples/gpt/cuda) run on the CPU, in CI where there is no GPU: the kernels' per-item
// bodies (ops_body.cuh) execute as simulated grids — every simulated thread runs the same grid-stride loop a
// device thread runs — and the cuBLAS calls execute as a naive column-major GEMM on exactly the arguments the
// device passes to cublasSgemm(StridedBatched). The ops and phases are the same templates (ops_impl.h,
// model_impl.h) the device instantiates, so this checks, against the CPU ops (gpt/ops.h) and the CPU model:
// - each body's indexing and arithmetic: bit for bit the CPU op where the arithmetic is the same (everything
//   but the GEMMs), NaN-poisoned outputs all written, guard zones around every buffer untouched;
// - that items are independent: grids of different shapes and thread orders (including reversed) give the
//   same bits, so no item reads another's output (which would be a race on the device);
// - the row-major -> column-major GEMM mapping (operands, transposes, leading dimensions, batch strides), with
//   cuBLAS's argument rules enforced and overlapping batch outputs / aliased inputs refused;
// - every op's and phase's composition (buffers, order, aliasing), up to a whole Tiny-GPT forward + backward.
// It cannot check what only a device shows: the launches themselves, CUDA's expf / tanhf and FMA contraction,
// cuBLAS's own results and the handle / stream plumbing — cuda_ops_test.cc (label `gpu`) does, on a device.
//
// Built with -ffp-contract=off (tests/gpt/CMakeLists.txt) so the host compiler never fuses a*b+c: the bodies
// then round exactly like ops.cc, which is compiled without FMA (baseline x86-64).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gpt/cuda/model_impl.h"
#include "gpt/cuda/ops_body.cuh"
#include "gpt/cuda/ops_impl.h"
#include "gpt/cuda_check.h"
#include "gpt/model.h"
#include "gpt/ops.h"
#include "support/status_matchers.h"

namespace zero::gpt {
namespace {

using ::zero::testing::StatusIs;

namespace body = cuda::body;
namespace impl = cuda::impl;
using cuda_testing::AbsGemm;
using cuda_testing::Bitwise;
using cuda_testing::NormwiseClose;
using cuda_testing::NormwiseError;
using cuda_testing::RandomFloats;
using cuda_testing::RandomIds;
using cuda_testing::WithinGemmBound;

// ---------------------------------------------------------------------------------------------------------
// The emulated executor.

// A simulated launch: blocks x threads threads, run one after the other in ascending or descending thread id.
struct SimGrid {
  int64_t blocks;
  int64_t threads;
  bool reverse;
};
// One thread doing everything; fewer threads than items (threads loop), in both orders; more threads than
// items in reverse order (one item per thread, items in reverse).
constexpr SimGrid kGrids[] = {{1, 1, false}, {3, 32, false}, {2, 5, true}, {64, 256, true}};

std::string GridName(const SimGrid& g) {
  return std::to_string(g.blocks) + "x" + std::to_string(g.threads) + (g.reverse ? " reversed" : "");
}

// How the emulated GEMM sums its K products: in order with one rounding per multiply and add, or in reverse
// order with fused multiply-adds — two different roundings, neither OpenBLAS's nor cuBLAS's, to see how far a
// change of summation order moves the results (the tolerances must cover it with a margin).
enum class GemmOrder { kSequential, kReverseFma };

class EmulatedExec {
 public:
  explicit EmulatedExec(SimGrid grid, GemmOrder order = GemmOrder::kSequential) : grid_(grid), order_(order) {}

  template <class Op>
  Status Grid(const Op& op) {
    ++grids;
    const int64_t nthreads = grid_.blocks * grid_.threads;
    for (int64_t k = 0; k < nthreads; ++k) body::GridStride(op, grid_.reverse ? nthreads - 1 - k : k, nthreads);
    return OkStatus();
  }

  // cuBLAS semantics, column-major, naive order (l = 0..k-1 in float): C is not read when beta == 0.
  Status Gemm(const body::GemmCall& g) {
    ++gemms;
    auto bad = [](const std::string& what) { return absl::InvalidArgumentError("emulated cuBLAS: " + what); };
    if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 1) return bad("negative dimension or batch");
    const int64_t rows_a = g.trans_a ? g.k : g.m, cols_a = g.trans_a ? g.m : g.k;
    const int64_t rows_b = g.trans_b ? g.n : g.k, cols_b = g.trans_b ? g.k : g.n;
    if (g.lda < std::max<int64_t>(1, rows_a)) return bad("lda < rows of A");
    if (g.ldb < std::max<int64_t>(1, rows_b)) return bad("ldb < rows of B");
    if (g.ldc < std::max<int64_t>(1, g.m)) return bad("ldc < rows of C");
    // The device computes all batches concurrently: their outputs must be distinct elements, and no input
    // element may be an output.
    std::unordered_set<const float*> written;
    for (int64_t p = 0; p < g.batch; ++p) {
      for (int64_t j = 0; j < g.n; ++j) {
        for (int64_t i = 0; i < g.m; ++i) {
          if (!written.insert(g.c + p * g.stride_c + i + j * g.ldc).second) return bad("batches share C elements");
        }
      }
    }
    for (int64_t p = 0; p < g.batch; ++p) {
      for (int64_t j = 0; j < cols_a; ++j) {
        for (int64_t i = 0; i < rows_a; ++i) {
          if (written.count(g.a + p * g.stride_a + i + j * g.lda)) return bad("A aliases C");
        }
      }
      for (int64_t j = 0; j < cols_b; ++j) {
        for (int64_t i = 0; i < rows_b; ++i) {
          if (written.count(g.b + p * g.stride_b + i + j * g.ldb)) return bad("B aliases C");
        }
      }
    }
    for (int64_t p = 0; p < g.batch; ++p) {
      const float* A = g.a + p * g.stride_a;
      const float* B = g.b + p * g.stride_b;
      float* C = g.c + p * g.stride_c;
      for (int64_t j = 0; j < g.n; ++j) {
        for (int64_t i = 0; i < g.m; ++i) {
          float s = 0.0f;
          for (int64_t step = 0; step < g.k; ++step) {
            const int64_t l = order_ == GemmOrder::kSequential ? step : g.k - 1 - step;
            const float a = g.trans_a ? A[l + i * g.lda] : A[i + l * g.lda];
            const float b = g.trans_b ? B[j + l * g.ldb] : B[l + j * g.ldb];
            s = order_ == GemmOrder::kSequential ? s + a * b : std::fma(a, b, s);
          }
          float r = g.alpha * s;
          if (g.beta != 0.0f) r += g.beta * C[i + j * g.ldc];
          C[i + j * g.ldc] = r;
        }
      }
    }
    return OkStatus();
  }

  Status Copy(void* dst, const void* src, size_t bytes) {
    auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
    if (d < s + bytes && s < d + bytes) return absl::InvalidArgumentError("emulated cudaMemcpyAsync: overlap");
    std::memcpy(dst, src, bytes);
    return OkStatus();
  }

  Status Zero(void* dst, size_t bytes) {
    std::memset(dst, 0, bytes);
    return OkStatus();
  }

  int grids = 0;
  int gemms = 0;

 private:
  SimGrid grid_;
  GemmOrder order_;
};

// ---------------------------------------------------------------------------------------------------------
// Buffers with poisoned guard zones.

float Poison() {
  const uint32_t bits = 0x7FC0DEADu;  // a NaN no op produces
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// n floats with kGuard poisoned floats on each side; the interior starts as `init` (or poisoned).
class Guarded {
 public:
  static constexpr size_t kGuard = 16;
  explicit Guarded(size_t n) : v_(n + 2 * kGuard, Poison()), n_(n) {}
  explicit Guarded(const std::vector<float>& init) : Guarded(init.size()) {
    std::copy(init.begin(), init.end(), v_.begin() + kGuard);
  }
  float* data() { return v_.data() + kGuard; }
  std::vector<float> values() const { return {v_.begin() + kGuard, v_.begin() + kGuard + n_}; }
  bool GuardsIntact() const {
    for (size_t i = 0; i < kGuard; ++i) {
      if (cuda_testing::Bits(v_[i]) != 0x7FC0DEADu || cuda_testing::Bits(v_[kGuard + n_ + i]) != 0x7FC0DEADu) {
        return false;
      }
    }
    return true;
  }

 private:
  std::vector<float> v_;
  size_t n_;
};

// ---------------------------------------------------------------------------------------------------------
// The grid-stride loop itself.

struct CountOp {
  int* hits;
  int64_t n;
  int64_t size() const { return n; }
  void operator()(int64_t i) const { ++hits[i]; }
};

TEST(GptCudaEmulationTest, GridStrideRunsEveryItemExactlyOnce) {
  for (const SimGrid& g : kGrids) {
    for (int64_t n : {0, 1, 5, 32, 97, 20000}) {
      std::vector<int> hits(n + 1, 0);
      EmulatedExec ex(g);
      ASSERT_OK(ex.Grid(CountOp{hits.data(), n}));
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << "item " << i << " n=" << n << " " << GridName(g);
      ASSERT_EQ(hits[n], 0);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Bodies whose arithmetic is the CPU's: bit for bit.

TEST(GptCudaEmulationTest, LayerNormForwardIsBitwiseTheCpuOp) {
  std::mt19937_64 rng(11);
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {1, 7}, {5, 3}, {7, 64}, {33, 65}}) {
    const auto x = RandomFloats(rng, N * C, 2.0f, 0.5f), w = RandomFloats(rng, C, 1.0f), b = RandomFloats(rng, C, 1.0f);
    std::vector<float> y(N * C), mean(N), rstd(N);
    ops::LayerNormForward(x.data(), w.data(), b.data(), N, C, y.data(), mean.data(), rstd.data());
    for (const SimGrid& g : kGrids) {
      SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " grid " << GridName(g));
      EmulatedExec ex(g);
      Guarded gy(N * C), gm(N), gr(N);
      ASSERT_OK(impl::LayerNormForward(ex, x.data(), w.data(), b.data(), N, C, gy.data(), gm.data(), gr.data()));
      EXPECT_TRUE(Bitwise(gy.values(), y));
      EXPECT_TRUE(Bitwise(gm.values(), mean));
      EXPECT_TRUE(Bitwise(gr.values(), rstd));
      EXPECT_TRUE(gy.GuardsIntact() && gm.GuardsIntact() && gr.GuardsIntact());
      // In place (y aliases x), as the header allows.
      Guarded inplace(x);
      ASSERT_OK(
          impl::LayerNormForward(ex, inplace.data(), w.data(), b.data(), N, C, inplace.data(), gm.data(), gr.data()));
      EXPECT_TRUE(Bitwise(inplace.values(), y));
    }
  }
}

TEST(GptCudaEmulationTest, LayerNormBackwardIsBitwiseTheCpuOp) {
  std::mt19937_64 rng(12);
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {1, 7}, {5, 3}, {7, 64}, {33, 65}}) {
    const auto x = RandomFloats(rng, N * C, 2.0f, 0.5f), w = RandomFloats(rng, C, 1.0f), b = RandomFloats(rng, C, 1.0f);
    const auto dy = RandomFloats(rng, N * C, 1.0f);
    std::vector<float> y(N * C), mean(N), rstd(N);
    ops::LayerNormForward(x.data(), w.data(), b.data(), N, C, y.data(), mean.data(), rstd.data());
    // Everything accumulates: start from nonzero values.
    const auto dx0 = RandomFloats(rng, N * C, 1.0f), dw0 = RandomFloats(rng, C, 1.0f), db0 = RandomFloats(rng, C, 1.0f);
    std::vector<float> dx = dx0, dw = dw0, db = db0;
    ops::LayerNormBackward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C, dx.data(), dw.data(),
                           db.data());
    for (const SimGrid& g : kGrids) {
      SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " grid " << GridName(g));
      EmulatedExec ex(g);
      Guarded gdx(dx0), gdw(dw0), gdb(db0);
      ASSERT_OK(impl::LayerNormBackward(ex, dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C, gdx.data(),
                                        gdw.data(), gdb.data()));
      EXPECT_TRUE(Bitwise(gdx.values(), dx));
      EXPECT_TRUE(Bitwise(gdw.values(), dw));
      EXPECT_TRUE(Bitwise(gdb.values(), db));
      EXPECT_TRUE(gdx.GuardsIntact() && gdw.GuardsIntact() && gdb.GuardsIntact());
    }
  }
}

std::vector<float> WithEdgeValues(std::vector<float> v) {
  const float edges[] = {0.0f,
                         -0.0f,
                         1e-30f,
                         -1e-30f,
                         20.0f,
                         -20.0f,
                         1e4f,
                         -1e4f,
                         std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity()};
  for (size_t i = 0; i < std::size(edges) && i < v.size(); ++i) v[i * 3 % v.size()] = edges[i];
  return v;
}

TEST(GptCudaEmulationTest, GeluAndResidualAreBitwiseTheCpuOps) {
  std::mt19937_64 rng(13);
  for (int64_t n : {1, 7, 1000}) {
    const auto x = WithEdgeValues(RandomFloats(rng, n, 3.0f)), dy = RandomFloats(rng, n, 1.0f);
    const auto other = RandomFloats(rng, n, 1.0f);
    std::vector<float> y(n), dx(n), sum(n);
    ops::GeluForward(x.data(), n, y.data());
    ops::GeluBackward(dy.data(), x.data(), n, dx.data());
    ops::ResidualForward(x.data(), other.data(), n, sum.data());
    for (const SimGrid& g : kGrids) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " grid " << GridName(g));
      EmulatedExec ex(g);
      Guarded gy(n), gdx(n), gsum(n);
      ASSERT_OK(impl::GeluForward(ex, x.data(), n, gy.data()));
      ASSERT_OK(impl::GeluBackward(ex, dy.data(), x.data(), n, gdx.data()));
      ASSERT_OK(impl::ResidualForward(ex, x.data(), other.data(), n, gsum.data()));
      EXPECT_TRUE(Bitwise(gy.values(), y));
      EXPECT_TRUE(Bitwise(gdx.values(), dx));
      EXPECT_TRUE(Bitwise(gsum.values(), sum));
      EXPECT_TRUE(gy.GuardsIntact() && gdx.GuardsIntact() && gsum.GuardsIntact());
      // In place: y aliases x; dx aliases dy; the residual's output aliases either input.
      Guarded a(x), d(dy), r(x);
      ASSERT_OK(impl::GeluForward(ex, a.data(), n, a.data()));
      ASSERT_OK(impl::GeluBackward(ex, d.data(), x.data(), n, d.data()));
      ASSERT_OK(impl::ResidualForward(ex, r.data(), other.data(), n, r.data()));
      EXPECT_TRUE(Bitwise(a.values(), y));
      EXPECT_TRUE(Bitwise(d.values(), dx));
      EXPECT_TRUE(Bitwise(r.values(), sum));
    }
  }
}

TEST(GptCudaEmulationTest, SoftmaxCrossEntropyIsBitwiseTheCpuOp) {
  std::mt19937_64 rng(14);
  for (auto [N, V] : {std::pair<int64_t, int64_t>{1, 1}, {1, 5}, {7, 5}, {33, 256}}) {
    const auto logits = RandomFloats(rng, N * V, 3.0f);
    const auto targets = RandomIds(rng, N, static_cast<int32_t>(V));
    std::vector<float> probs(N * V), dlogits(N * V);
    const float loss = ops::SoftmaxCrossEntropyForward(logits.data(), targets.data(), N, V, probs.data());
    ops::SoftmaxCrossEntropyBackward(probs.data(), targets.data(), N, V, dlogits.data());
    for (const SimGrid& g : kGrids) {
      SCOPED_TRACE(::testing::Message() << "N=" << N << " V=" << V << " grid " << GridName(g));
      EmulatedExec ex(g);
      Guarded gp(N * V), gl(1), gd(N * V);
      std::vector<double> row_loss(N, std::nan(""));
      ASSERT_OK(impl::SoftmaxCrossEntropyForward(ex, logits.data(), targets.data(), N, V, gp.data(), gl.data(),
                                                 row_loss.data()));
      EXPECT_TRUE(Bitwise(gp.values(), probs));
      EXPECT_TRUE(Bitwise(gl.values(), {loss}));
      ASSERT_OK(impl::SoftmaxCrossEntropyBackward(ex, gp.data(), targets.data(), N, V, gd.data()));
      EXPECT_TRUE(Bitwise(gd.values(), dlogits));
      EXPECT_TRUE(gp.GuardsIntact() && gl.GuardsIntact() && gd.GuardsIntact());
      // In place, as HeadForward / HeadBackward use it: probs over logits, dlogits over probs.
      Guarded inplace(logits);
      ASSERT_OK(impl::SoftmaxCrossEntropyForward(ex, inplace.data(), targets.data(), N, V, inplace.data(), gl.data(),
                                                 row_loss.data()));
      EXPECT_TRUE(Bitwise(inplace.values(), probs));
      EXPECT_TRUE(Bitwise(gl.values(), {loss}));
      ASSERT_OK(impl::SoftmaxCrossEntropyBackward(ex, inplace.data(), targets.data(), N, V, inplace.data()));
      EXPECT_TRUE(Bitwise(inplace.values(), dlogits));
    }
  }
}

GptConfig SmallShapes() {
  GptConfig cfg;
  cfg.vocab = 11;
  cfg.max_seq = 7;
  cfg.layers = 1;
  cfg.heads = 1;
  cfg.channels = 5;
  return cfg;
}

TEST(GptCudaEmulationTest, EmbeddingsAreBitwiseTheCpuPhases) {
  std::mt19937_64 rng(15);
  const GptConfig cfg = SmallShapes();
  const int64_t V = cfg.vocab, C = cfg.channels;
  const auto wte = RandomFloats(rng, V * C, 1.0f), wpe = RandomFloats(rng, cfg.max_seq * C, 1.0f);
  const auto dwte0 = RandomFloats(rng, V * C, 1.0f), dwpe0 = RandomFloats(rng, cfg.max_seq * C, 1.0f);
  for (auto [B, T] : {std::pair<int, int>{1, 1}, {1, 7}, {3, 5}, {4, 7}}) {
    const int64_t N = static_cast<int64_t>(B) * T;
    const auto tokens = RandomIds(rng, N, cfg.vocab);  // 4*7 = 28 rows over 11 ids: plenty of repeats
    const auto dx = RandomFloats(rng, N * C, 1.0f);
    RootWeights rw;
    rw.wte = wte.data();
    rw.wpe = wpe.data();
    std::vector<float> x(N * C), dwte = dwte0, dwpe = dwpe0;
    EmbeddingForward(cfg, rw, tokens.data(), B, T, x.data());
    RootGrads rg;
    rg.wte = dwte.data();
    rg.wpe = dwpe.data();
    EmbeddingBackward(cfg, rg, tokens.data(), B, T, dx.data());
    for (const SimGrid& g : kGrids) {
      SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T << " grid " << GridName(g));
      EmulatedExec ex(g);
      Guarded gx(N * C), gwte(dwte0), gwpe(dwpe0);
      ASSERT_OK(impl::EmbeddingForward(ex, cfg, rw, tokens.data(), B, T, gx.data()));
      EXPECT_TRUE(Bitwise(gx.values(), x));
      RootGrads eg;
      eg.wte = gwte.data();
      eg.wpe = gwpe.data();
      ASSERT_OK(impl::EmbeddingBackward(ex, cfg, eg, tokens.data(), B, T, dx.data()));
      EXPECT_TRUE(Bitwise(gwte.values(), dwte));
      EXPECT_TRUE(Bitwise(gwpe.values(), dwpe));
      EXPECT_TRUE(gx.GuardsIntact() && gwte.GuardsIntact() && gwpe.GuardsIntact());
    }
  }
}

// The device cannot abort on a bad id as the CPU does: it must not read out of bounds, and must make the damage
// visible (NaN) where the value would have been used.
TEST(GptCudaEmulationTest, OutOfRangeIdsGiveNaNInsteadOfOutOfBoundsAccess) {
  std::mt19937_64 rng(16);
  const GptConfig cfg = SmallShapes();
  const int64_t V = cfg.vocab, C = cfg.channels;
  const auto wte = RandomFloats(rng, V * C, 1.0f), wpe = RandomFloats(rng, cfg.max_seq * C, 1.0f);
  const int B = 1, T = 3;
  const std::vector<int32_t> tokens = {2, -1, static_cast<int32_t>(V)};
  RootWeights rw;
  rw.wte = wte.data();
  rw.wpe = wpe.data();
  EmulatedExec ex(kGrids[1]);
  Guarded x(T * C);
  ASSERT_OK(impl::EmbeddingForward(ex, cfg, rw, tokens.data(), B, T, x.data()));
  const auto xv = x.values();
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(xv[c], wte[2 * C + c] + wpe[c]);
    EXPECT_TRUE(std::isnan(xv[C + c]) && std::isnan(xv[2 * C + c]));
  }
  std::vector<float> dwte(V * C, 0.0f), dwpe(cfg.max_seq * C, 0.0f);
  RootGrads rg;
  rg.wte = dwte.data();
  rg.wpe = dwpe.data();
  const std::vector<float> dx(T * C, 1.0f);
  ASSERT_OK(impl::EmbeddingBackward(ex, cfg, rg, tokens.data(), B, T, dx.data()));
  for (int64_t i = 0; i < V * C; ++i) EXPECT_EQ(dwte[i], i / C == 2 ? 1.0f : 0.0f) << i;  // bad rows ignored

  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, 3.0f};
  const std::vector<int32_t> targets = {1, 3};  // V = 3: the second target is out of range
  std::vector<float> probs(6), loss(1);
  std::vector<double> row_loss(2);
  ASSERT_OK(impl::SoftmaxCrossEntropyForward(ex, logits.data(), targets.data(), 2, 3, probs.data(), loss.data(),
                                             row_loss.data()));
  EXPECT_TRUE(std::isfinite(row_loss[0]));
  EXPECT_TRUE(std::isnan(row_loss[1]) && std::isnan(loss[0]));
  std::vector<float> dlogits(6);
  ASSERT_OK(impl::SoftmaxCrossEntropyBackward(ex, probs.data(), targets.data(), 2, 3, dlogits.data()));
  for (int i = 3; i < 6; ++i) EXPECT_EQ(dlogits[i], probs[i] * 0.5f);  // no one-hot subtracted, nothing written
}

// ---------------------------------------------------------------------------------------------------------
// GEMMs: the row-major -> column-major mapping, then the ops built on it (within the GEMM error bound).

TEST(GptCudaEmulationTest, RowMajorGemmMapsTransposesLeadingDimensionsAndBatchStrides) {
  std::mt19937_64 rng(17);
  const int64_t M = 5, N = 3, K = 4, batch = 3;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      // Stored shapes (row-major) with padded rows: op(A) is [M, K], so A is [K, M] when transposed.
      const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, lda = a_cols + 3;
      const int64_t b_rows = tb ? N : K, b_cols = tb ? K : N, ldb = b_cols + 1;
      const int64_t ldc = N + 2;
      const int64_t sa = a_rows * lda + 7, sb = b_rows * ldb + 2, sc = M * ldc + 5;
      const auto A = RandomFloats(rng, batch * sa, 1.0f), Bm = RandomFloats(rng, batch * sb, 1.0f);
      const auto C0 = RandomFloats(rng, batch * sc, 1.0f);
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb << " beta=" << beta);
        // Poisoned C (beta = 0 must not read it), but the padding between rows and batches must survive.
        std::vector<float> C(batch * sc);
        for (int64_t p = 0; p < batch; ++p) {
          for (int64_t i = 0; i < sc; ++i) {
            const bool inside = i < M * ldc && i % ldc < N;
            C[p * sc + i] = inside && beta == 0.0f ? Poison() : C0[p * sc + i];
          }
        }
        const std::vector<float> before = C;
        EmulatedExec ex(kGrids[0]);
        ASSERT_OK(ex.Gemm(body::RowMajorGemm(ta, tb, M, N, K, 1.0f, A.data(), lda, Bm.data(), ldb, beta, C.data(), ldc,
                                             batch, sa, sb, sc)));
        for (int64_t p = 0; p < batch; ++p) {
          const float* Ap = A.data() + p * sa;
          const float* Bp = Bm.data() + p * sb;
          std::vector<float> want(M * ldc);
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < N; ++j) {
              double s = beta * static_cast<double>(C0[p * sc + i * ldc + j]);
              for (int64_t k = 0; k < K; ++k) {
                s += static_cast<double>(ta ? Ap[k * lda + i] : Ap[i * lda + k]) *
                     (tb ? Bp[j * ldb + k] : Bp[k * ldb + j]);
              }
              want[i * ldc + j] = static_cast<float>(s);
            }
          }
          const auto scale =
              AbsGemm(ta, tb, M, N, K, Ap, lda, Bp, ldb, beta != 0.0f ? C0.data() + p * sc : nullptr, ldc);
          EXPECT_TRUE(WithinGemmBound(C.data() + p * sc, want.data(), scale, M, N, ldc, K)) << "batch " << p;
        }
        for (int64_t p = 0; p < batch; ++p) {
          for (int64_t i = 0; i < sc; ++i) {
            if (!(i < M * ldc && i % ldc < N)) {
              ASSERT_EQ(cuda_testing::Bits(C[p * sc + i]), cuda_testing::Bits(before[p * sc + i])) << "padding " << i;
            }
          }
        }
      }
    }
  }
}

TEST(GptCudaEmulationTest, EmulatedCublasRefusesOverlappingOutputsAndBadLeadingDimensions) {
  std::vector<float> a(64, 1.0f), c(64, 0.0f);
  EmulatedExec ex(kGrids[0]);
  // Two batches writing the same C (stride 0): a race on the device.
  EXPECT_FALSE(ex.Gemm(body::RowMajorGemm(false, false, 2, 2, 2, 1.0f, a.data(), 2, a.data() + 8, 2, 0.0f, c.data(), 2,
                                          2, 4, 4, 0))
                   .ok());
  // C aliasing A.
  EXPECT_FALSE(
      ex.Gemm(body::RowMajorGemm(false, false, 2, 2, 2, 1.0f, c.data(), 2, a.data(), 2, 0.0f, c.data(), 2)).ok());
  // Row-major ld smaller than the row length.
  EXPECT_FALSE(
      ex.Gemm(body::RowMajorGemm(false, false, 2, 3, 2, 1.0f, a.data(), 2, a.data(), 2, 0.0f, c.data(), 3)).ok());
}

struct GemmShape {
  int64_t N, IC, OC;
};
constexpr GemmShape kGemmShapes[] = {{1, 1, 1}, {1, 5, 7}, {7, 3, 1}, {33, 64, 192}, {5, 256, 64}};

TEST(GptCudaEmulationTest, MatmulAndTiedHeadMatchTheCpuOpsWithinTheGemmBound) {
  std::mt19937_64 rng(18);
  for (const GemmShape& s : kGemmShapes) {
    const int64_t N = s.N, IC = s.IC, OC = s.OC;
    SCOPED_TRACE(::testing::Message() << "N=" << N << " IC=" << IC << " OC=" << OC);
    const auto x = RandomFloats(rng, N * IC, 1.0f), w = RandomFloats(rng, IC * OC, 0.5f),
               b = RandomFloats(rng, OC, 1.0f);
    const auto dy = RandomFloats(rng, N * OC, 1.0f);
    const auto dw0 = RandomFloats(rng, IC * OC, 1.0f), db0 = RandomFloats(rng, OC, 1.0f);
    for (bool bias : {true, false}) {
      std::vector<float> y(N * OC);
      ops::MatmulForward(x.data(), w.data(), bias ? b.data() : nullptr, N, IC, OC, y.data());
      std::vector<float> dx(N * IC), dw = dw0, db = db0;
      ops::MatmulBackward(dy.data(), x.data(), w.data(), N, IC, OC, dx.data(), dw.data(), bias ? db.data() : nullptr);
      EmulatedExec ex(kGrids[2]);
      Guarded gy(N * OC), gdx(N * IC), gdw(dw0), gdb(db0);
      ASSERT_OK(impl::MatmulForward(ex, x.data(), w.data(), bias ? b.data() : nullptr, N, IC, OC, gy.data()));
      EXPECT_TRUE(WithinGemmBound(
          gy.data(), y.data(),
          AbsGemm(false, false, N, OC, IC, x.data(), IC, w.data(), OC, bias ? b.data() : nullptr, 0), N, OC, OC, IC))
          << "y, bias " << bias;
      ASSERT_OK(impl::MatmulBackward(ex, dy.data(), x.data(), w.data(), N, IC, OC, gdx.data(), gdw.data(),
                                     bias ? gdb.data() : nullptr));
      EXPECT_TRUE(WithinGemmBound(gdx.data(), dx.data(), AbsGemm(false, true, N, IC, OC, dy.data(), OC, w.data(), OC),
                                  N, IC, IC, OC));
      EXPECT_TRUE(WithinGemmBound(gdw.data(), dw.data(),
                                  AbsGemm(true, false, IC, OC, N, x.data(), IC, dy.data(), OC, dw0.data(), OC), IC, OC,
                                  OC, N));
      EXPECT_TRUE(Bitwise(gdb.values(), db)) << "db (summed like the CPU: bitwise)";
      EXPECT_TRUE(gy.GuardsIntact() && gdx.GuardsIntact() && gdw.GuardsIntact() && gdb.GuardsIntact());
    }
    // dx == nullptr: only the parameter gradients.
    {
      std::vector<float> dw = dw0;
      ops::MatmulBackward(dy.data(), x.data(), w.data(), N, IC, OC, nullptr, dw.data(), nullptr);
      EmulatedExec ex(kGrids[1]);
      Guarded gdw(dw0);
      ASSERT_OK(impl::MatmulBackward(ex, dy.data(), x.data(), w.data(), N, IC, OC, nullptr, gdw.data(), nullptr));
      EXPECT_TRUE(WithinGemmBound(gdw.data(), dw.data(),
                                  AbsGemm(true, false, IC, OC, N, x.data(), IC, dy.data(), OC, dw0.data(), OC), IC, OC,
                                  OC, N));
    }
    // Tied head: C = IC, V = OC, wte [V, C].
    {
      const int64_t C = IC, V = OC;
      const auto wte = RandomFloats(rng, V * C, 0.5f), dlogits = RandomFloats(rng, N * V, 1.0f);
      const auto dwte0 = RandomFloats(rng, V * C, 1.0f);
      std::vector<float> logits(N * V), dx(N * C), dwte = dwte0;
      ops::TiedHeadForward(x.data(), wte.data(), N, C, V, logits.data());
      ops::TiedHeadBackward(dlogits.data(), x.data(), wte.data(), N, C, V, dx.data(), dwte.data());
      EmulatedExec ex(kGrids[3]);
      Guarded gl(N * V), gdx(N * C), gdwte(dwte0);
      ASSERT_OK(impl::TiedHeadForward(ex, x.data(), wte.data(), N, C, V, gl.data()));
      ASSERT_OK(impl::TiedHeadBackward(ex, dlogits.data(), x.data(), wte.data(), N, C, V, gdx.data(), gdwte.data()));
      EXPECT_TRUE(WithinGemmBound(gl.data(), logits.data(), AbsGemm(false, true, N, V, C, x.data(), C, wte.data(), C),
                                  N, V, V, C));
      EXPECT_TRUE(WithinGemmBound(gdx.data(), dx.data(),
                                  AbsGemm(false, false, N, C, V, dlogits.data(), V, wte.data(), C), N, C, C, V));
      EXPECT_TRUE(WithinGemmBound(gdwte.data(), dwte.data(),
                                  AbsGemm(true, false, V, C, N, dlogits.data(), V, x.data(), C, dwte0.data(), C), V, C,
                                  C, N));
      EXPECT_TRUE(gl.GuardsIntact() && gdx.GuardsIntact() && gdwte.GuardsIntact());
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Attention.

struct AttnShape {
  int B, T, C, NH;
};
// T = 1, odd T, odd head size (15 / 3 = 5), one head, and the Tiny model's (64 / 2 = 32, T = 20 < max_seq).
constexpr AttnShape kAttnShapes[] = {{1, 1, 4, 2}, {2, 5, 6, 3}, {1, 7, 15, 3}, {3, 4, 8, 1}, {2, 20, 64, 2}};

TEST(GptCudaEmulationTest, CausalSoftmaxBodiesMatchADoubleReference) {
  std::mt19937_64 rng(19);
  for (int64_t T : {1, 2, 5, 7}) {
    const int64_t rows = 3 * T;  // three (b, h) pairs
    const float scale = 1.0f / std::sqrt(5.0f);
    const auto scores = RandomFloats(rng, rows * T, 3.0f), datt = RandomFloats(rng, rows * T, 1.0f);
    for (const SimGrid& g : kGrids) {
      SCOPED_TRACE(::testing::Message() << "T=" << T << " grid " << GridName(g));
      EmulatedExec ex(g);
      Guarded att(scores);
      ASSERT_OK(ex.Grid(body::CausalSoftmaxOp{att.data(), rows, T, scale}));
      const auto a = att.values();
      Guarded d(datt);
      ASSERT_OK(ex.Grid(body::CausalSoftmaxBackwardOp{a.data(), d.data(), rows, T, scale}));
      const auto dv = d.values();
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = r % T;
        std::vector<double> p(T, 0.0), dp(T, 0.0);
        double mx = -INFINITY, sum = 0.0, dot = 0.0;
        for (int64_t j = 0; j <= t; ++j) mx = std::max(mx, static_cast<double>(scale) * scores[r * T + j]);
        for (int64_t j = 0; j <= t; ++j) sum += p[j] = std::exp(static_cast<double>(scale) * scores[r * T + j] - mx);
        for (int64_t j = 0; j <= t; ++j) p[j] /= sum;
        for (int64_t j = 0; j <= t; ++j) dot += p[j] * datt[r * T + j];
        for (int64_t j = 0; j <= t; ++j) dp[j] = p[j] * (datt[r * T + j] - dot) * scale;
        for (int64_t j = 0; j < T; ++j) {
          EXPECT_NEAR(a[r * T + j], p[j], 1e-6) << "row " << r << " col " << j;
          EXPECT_NEAR(dv[r * T + j], dp[j], 1e-5) << "row " << r << " col " << j;
          if (j > t) {
            EXPECT_TRUE(a[r * T + j] == 0.0f && dv[r * T + j] == 0.0f) << "above the diagonal";
          }
        }
      }
      EXPECT_TRUE(att.GuardsIntact() && d.GuardsIntact());
    }
  }
}

// One shape on one simulated grid and GEMM order against the CPU op; returns the worst normwise error.
double CheckAttention(std::mt19937_64& rng, const AttnShape& s, const SimGrid& g, GemmOrder order) {
  const int B = s.B, T = s.T, C = s.C, NH = s.NH;
  SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T << " C=" << C << " NH=" << NH << " grid " << GridName(g)
                                    << (order == GemmOrder::kSequential ? " sequential" : " reverse-FMA"));
  const int64_t n_qkv = static_cast<int64_t>(B) * T * 3 * C, n_y = static_cast<int64_t>(B) * T * C;
  const int64_t n_att = static_cast<int64_t>(B) * NH * T * T;
  const auto qkv = RandomFloats(rng, n_qkv, 1.0f), dy = RandomFloats(rng, n_y, 1.0f);
  std::vector<float> att(n_att), y(n_y), dqkv(n_qkv), scratch(static_cast<size_t>(T) * T);
  ops::AttentionForward(qkv.data(), B, T, C, NH, att.data(), y.data());
  ops::AttentionBackward(dy.data(), qkv.data(), att.data(), B, T, C, NH, dqkv.data(), scratch.data());

  EmulatedExec ex(g, order);
  Guarded gatt(n_att), gy(n_y), gdqkv(n_qkv), gscratch(n_att);
  EXPECT_OK(impl::AttentionForward(ex, qkv.data(), B, T, C, NH, gatt.data(), gy.data()));
  EXPECT_EQ(ex.gemms, 2 * NH);  // one strided-batched call per head and product
  EXPECT_TRUE(NormwiseClose(gatt.values(), att, cuda_testing::kAttentionRel)) << "att";
  EXPECT_TRUE(NormwiseClose(gy.values(), y, cuda_testing::kAttentionRel)) << "y";
  // Exact zeros above the diagonal, like the CPU.
  const auto ga = gatt.values();
  for (int64_t r = 0; r < static_cast<int64_t>(B) * NH * T; ++r) {
    for (int64_t j = r % T + 1; j < T; ++j) EXPECT_EQ(cuda_testing::Bits(ga[r * T + j]), 0u) << "row " << r;
  }
  // Backward from the CPU's probabilities, so it is compared on its own.
  EXPECT_OK(impl::AttentionBackward(ex, dy.data(), qkv.data(), att.data(), B, T, C, NH, gdqkv.data(), gscratch.data()));
  EXPECT_TRUE(NormwiseClose(gdqkv.values(), dqkv, cuda_testing::kAttentionRel)) << "dqkv";
  EXPECT_TRUE(gatt.GuardsIntact() && gy.GuardsIntact() && gdqkv.GuardsIntact() && gscratch.GuardsIntact());
  return std::max({NormwiseError(gatt.data(), att.data(), n_att), NormwiseError(gy.data(), y.data(), n_y),
                   NormwiseError(gdqkv.data(), dqkv.data(), n_qkv)});
}

TEST(GptCudaEmulationTest, AttentionMatchesTheCpuOp) {
  std::mt19937_64 rng(20);
  double worst = 0.0;
  for (const AttnShape& s : kAttnShapes) {
    for (const SimGrid& g : kGrids) {
      for (GemmOrder order : {GemmOrder::kSequential, GemmOrder::kReverseFma}) {
        worst = std::max(worst, CheckAttention(rng, s, g, order));
      }
    }
  }
  // The Small model's head shape (hs = 64, T = 128): the largest sums, to calibrate the tolerance.
  for (GemmOrder order : {GemmOrder::kSequential, GemmOrder::kReverseFma}) {
    worst = std::max(worst, CheckAttention(rng, AttnShape{2, 128, 384, 6}, kGrids[3], order));
  }
  std::printf("[ emulated ] attention: worst normwise error vs the CPU op %.3g (tolerance %.3g)\n", worst,
              cuda_testing::kAttentionRel);
}

// ---------------------------------------------------------------------------------------------------------
// Argument checks and the activation layout.

TEST(GptCudaEmulationTest, BadShapesAreInvalidArgumentAndEmptyOpsDoNothing) {
  EmulatedExec ex(kGrids[0]);
  float f[8] = {};
  int32_t ids[2] = {};
  double d[2] = {};
  EXPECT_THAT(impl::MatmulForward(ex, f, f, f, -1, 2, 2, f), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(impl::MatmulForward(ex, f, f, f, 1, 0, 2, f), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(impl::MatmulForward(ex, nullptr, f, f, 1, 2, 2, f), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(impl::MatmulBackward(ex, f, f, f, 1, 2, int64_t{1} << 31, f, f, f),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(impl::AttentionForward(ex, f, 1, 2, 5, 2, f, f), StatusIs(absl::StatusCode::kInvalidArgument));  // 2 !| 5
  EXPECT_THAT(impl::AttentionBackward(ex, f, f, f, 1, 0, 4, 2, f, f), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(impl::SoftmaxCrossEntropyForward(ex, f, ids, 0, 2, f, f, d),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(impl::LayerNormForward(ex, f, f, f, 2, 0, f, f, f), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(impl::GeluForward(ex, f, -3, f), StatusIs(absl::StatusCode::kInvalidArgument));
  // Empty: OK and nothing launched.
  EXPECT_OK(impl::MatmulForward(ex, nullptr, nullptr, nullptr, 0, 2, 2, nullptr));
  EXPECT_OK(impl::MatmulBackward(ex, nullptr, nullptr, nullptr, 0, 2, 2, nullptr, nullptr, nullptr));
  EXPECT_OK(impl::GeluForward(ex, nullptr, 0, nullptr));
  EXPECT_OK(impl::LayerNormForward(ex, nullptr, nullptr, nullptr, 0, 4, nullptr, nullptr, nullptr));
  EXPECT_EQ(ex.grids + ex.gemms, 0);

  const GptConfig cfg = GptConfig::Tiny();
  RootWeights rw;
  rw.wte = f;
  rw.wpe = f;
  EXPECT_THAT(impl::EmbeddingForward(ex, cfg, rw, ids, 1, cfg.max_seq + 1, f),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(impl::EmbeddingForward(ex, cfg, rw, ids, 0, 1, f), StatusIs(absl::StatusCode::kInvalidArgument));
  BlockActs unbound;
  EXPECT_THAT(impl::BlockForward(ex, cfg, BlockWeights{}, f, f, &unbound),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(GptCudaEmulationTest, ActivationViewsAreAlignedDisjointAndInsideTheAllocation) {
  const GptConfig cfg = GptConfig::Tiny();
  const int B = 3, T = 7;
  const int64_t N = B * T, C = cfg.channels;
  const size_t bytes = cuda::ActivationViews::Bytes(cfg, B, T);
  std::vector<std::byte> storage(bytes + cuda::ActivationViews::kAlign);
  std::byte* base = storage.data() + (cuda::ActivationViews::kAlign -
                                      reinterpret_cast<uintptr_t>(storage.data()) % cuda::ActivationViews::kAlign);
  cuda::ActivationViews v;
  v.Bind(cfg, B, T, base);
  ASSERT_EQ(static_cast<int>(v.blocks.size()), cfg.layers);
  std::vector<std::pair<const std::byte*, size_t>> views;
  auto add = [&](const void* p, int64_t n, size_t elem) {
    views.push_back({static_cast<const std::byte*>(p), static_cast<size_t>(n) * elem});
  };
  for (const BlockActs& a : v.blocks) {
    EXPECT_EQ(a.B, B);
    EXPECT_EQ(a.T, T);
    for (const float* p : {a.x_in, a.ln1, a.atty, a.residual2, a.ln2}) add(p, N * C, 4);
    for (const float* p : {a.ln1_mean, a.ln1_rstd, a.ln2_mean, a.ln2_rstd}) add(p, N, 4);
    add(a.qkv, N * 3 * C, 4);
    add(a.att, static_cast<int64_t>(B) * cfg.heads * T * T, 4);
    add(a.fch, N * 4 * C, 4);
    add(a.fch_gelu, N * 4 * C, 4);
  }
  add(v.scratch.dln, N * C, 4);
  add(v.scratch.dqkv, N * 3 * C, 4);
  add(v.scratch.dfch, N * 4 * C, 4);
  add(v.scratch.datt, static_cast<int64_t>(B) * cfg.heads * T * T, 4);
  for (const float* p : {v.head.x_in, v.head.lnf, v.head.dlnf, v.x, v.dx}) add(p, N * C, 4);
  add(v.head.lnf_mean, N, 4);
  add(v.head.lnf_rstd, N, 4);
  add(v.head.probs, N * cfg.vocab, 4);
  add(v.head.targets, N, 4);
  add(v.head.row_loss, N, 8);
  add(v.head.loss, 1, 4);
  std::sort(views.begin(), views.end());
  for (size_t i = 0; i < views.size(); ++i) {
    EXPECT_GE(views[i].first, base);
    EXPECT_LE(views[i].first + views[i].second, base + bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(views[i].first) % 64, 0u);
    if (i > 0) {
      EXPECT_LE(views[i - 1].first + views[i - 1].second, views[i].first) << "views overlap";
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// The whole Tiny GPT: the device composition, emulated, against GptModel.

struct EmulatedRun {
  float loss = 0.0f;
  std::vector<std::vector<float>> grads;  // per unit
};

// One forward + backward through model_impl.h's phases on host memory, the way the device test drives the
// device (residual stream in place, scratch shared by the blocks).
EmulatedRun RunEmulatedModel(const GptModel& model, const std::vector<int32_t>& tokens,
                             const std::vector<int32_t>& targets, int B, int T, SimGrid grid, GemmOrder order,
                             int steps = 1) {
  const GptConfig& cfg = model.config();
  EmulatedRun run;
  std::vector<std::vector<float>> params(model.num_units());
  run.grads.resize(model.num_units());
  for (int u = 0; u < model.num_units(); ++u) {
    params[u].assign(model.params(u), model.params(u) + model.unit_numel(u));
    run.grads[u].assign(model.unit_numel(u), 0.0f);
  }
  const size_t bytes = cuda::ActivationViews::Bytes(cfg, B, T);
  std::vector<float> storage(bytes / sizeof(float) + cuda::ActivationViews::kAlign, Poison());
  auto* base =
      reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(storage.data()) + cuda::ActivationViews::kAlign - 1) /
                                   cuda::ActivationViews::kAlign * cuda::ActivationViews::kAlign);
  cuda::ActivationViews acts;
  acts.Bind(cfg, B, T, base);

  EmulatedExec ex(grid, order);
  const RootWeights rw = RootWeightsFromFlat(cfg, params[0].data());
  const RootGrads rg = RootGradsFromFlat(cfg, run.grads[0].data());
  // `steps` forward + backward passes without zeroing: gradients accumulate, as GptModel's do across calls.
  for (int step = 0; step < steps; ++step) {
    EXPECT_OK(impl::EmbeddingForward(ex, cfg, rw, tokens.data(), B, T, acts.x));
    for (int l = 0; l < cfg.layers; ++l) {
      EXPECT_OK(impl::BlockForward(ex, cfg, BlockWeightsFromFlat(cfg, params[l + 1].data()), acts.x, acts.x,
                                   &acts.blocks[l]));
    }
    EXPECT_OK(impl::HeadForward(ex, cfg, rw, acts.x, targets.data(), &acts.head));
    run.loss = *acts.head.loss;
    EXPECT_OK(impl::HeadBackward(ex, cfg, rw, rg, &acts.head, acts.dx));
    for (int l = cfg.layers - 1; l >= 0; --l) {
      EXPECT_OK(impl::BlockBackward(ex, cfg, BlockWeightsFromFlat(cfg, params[l + 1].data()),
                                    BlockGradsFromFlat(cfg, run.grads[l + 1].data()), acts.blocks[l], acts.dx, acts.dx,
                                    &acts.scratch));
    }
    EXPECT_OK(impl::EmbeddingBackward(ex, cfg, rg, tokens.data(), B, T, acts.dx));
  }
  return run;
}

TEST(GptCudaEmulationTest, WholeTinyGptForwardBackwardMatchesGptModel) {
  const GptConfig cfg = GptConfig::Tiny();
  auto model = GptModel::Create(cfg, 21);
  ASSERT_OK(model);
  std::mt19937_64 rng(21);
  for (auto [B, T] : {std::pair<int, int>{3, 20}, {1, 1}, {2, cfg.max_seq}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T);
    const auto tokens = RandomIds(rng, static_cast<size_t>(B) * T, cfg.vocab);
    const auto targets = RandomIds(rng, static_cast<size_t>(B) * T, cfg.vocab);
    model->ZeroGrads();
    auto cpu_loss = model->ForwardBackward(tokens.data(), targets.data(), B, T);
    ASSERT_OK(cpu_loss);

    for (GemmOrder order : {GemmOrder::kSequential, GemmOrder::kReverseFma}) {
      const EmulatedRun r = RunEmulatedModel(*model, tokens, targets, B, T, kGrids[1], order);
      double worst = 0.0;
      cuda_testing::ExpectModelMatches(*model, *cpu_loss, r.loss, r.grads, &worst);
      std::printf(
          "[ emulated ] Tiny GPT B=%d T=%d, %s GEMMs: loss %.7f vs CPU %.7f, worst gradient normwise error "
          "%.3g (tolerance %.3g)\n",
          B, T, order == GemmOrder::kSequential ? "sequential" : "reverse-FMA", r.loss, *cpu_loss, worst,
          cuda_testing::kModelGradRel);
    }

    // Two steps without zeroing: every gradient accumulates (an op that overwrites instead shows up here, since
    // it cannot from zeroed gradients).
    auto cpu_loss2 = model->ForwardBackward(tokens.data(), targets.data(), B, T);
    ASSERT_OK(cpu_loss2);
    const EmulatedRun two = RunEmulatedModel(*model, tokens, targets, B, T, kGrids[2], GemmOrder::kSequential, 2);
    cuda_testing::ExpectModelMatches(*model, *cpu_loss2, two.loss, two.grads, nullptr);

    // Another grid shape in reverse thread order: the same bits (no item depends on another's output).
    const EmulatedRun run = RunEmulatedModel(*model, tokens, targets, B, T, kGrids[1], GemmOrder::kSequential);
    const EmulatedRun again = RunEmulatedModel(*model, tokens, targets, B, T, kGrids[3], GemmOrder::kSequential);
    EXPECT_EQ(cuda_testing::Bits(again.loss), cuda_testing::Bits(run.loss));
    for (int u = 0; u < model->num_units(); ++u) EXPECT_TRUE(Bitwise(again.grads[u], run.grads[u])) << "unit " << u;
  }
}

}  // namespace
}  // namespace zero::gpt
