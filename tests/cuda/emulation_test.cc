// The CUDA kernels' per-thread bodies (src/cuda/internal/*.cuh) run on the CPU, one simulated thread at a
// time, and are compared with the host implementations. This runs in CI, where there is no GPU: it proves the
// kernels' indexing (grid-stride loops, the 16-byte-vector plan with its scalar head and tail), their
// arithmetic (bit for bit the host optimizer) and their coverage (every element written exactly once, nothing
// outside the buffers touched). What it cannot prove — the device's own arithmetic, launches, CUB's block
// reductions — the GPU tests beside it check on a device.
//
// Compiled with -ffp-contract=off (tests/cuda/CMakeLists.txt) so the host never fuses a*b+c, like the device
// code's _rn intrinsics.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/internal/batch_copy.cuh"
#include "cuda/internal/convert.cuh"
#include "cuda/internal/fused_optim.cuh"
#include "cuda/internal/grad_stats.cuh"
#include "shard/internal/compute.h"
#include "zero/mixed_precision.h"
#include "zero/dtype.h"
#include "zero/optimizer.h"

namespace zero {
namespace {

namespace in = ::zero::cuda::internal;

// Simulated grids for the fused step: 3 blocks of 32 threads (smaller than the work, so threads loop), and 2
// blocks of 5 (tiles of a few units, so blocks take many tiles each, with leftovers).
struct SimGrid {
  size_t blocks;
  size_t threads;
};
constexpr SimGrid kSimGrids[] = {{3, 32}, {2, 5}};

// Values that must survive every path: infinities, NaN, subnormals, the largest finite, signed zeros.
const float kEdge[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN(),  1e-40f, -3e-42f,
                       std::numeric_limits<float>::max(),        -std::numeric_limits<float>::max(),
                       0.0f,                                     -0.0f,
                       std::numeric_limits<float>::min()};

bool SameFloat(float a, float b) { return (std::isnan(a) && std::isnan(b)) || FloatBits(a) == FloatBits(b); }

bool SameBits16(uint16_t a, uint16_t b, DType t) {
  if (a == b) return true;
  const float fa = t == DType::kF16 ? F16ToF32(a) : BF16ToF32(a);
  const float fb = t == DType::kF16 ? F16ToF32(b) : BF16ToF32(b);
  return std::isnan(fa) && std::isnan(fb);
}

// A byte buffer with `offset` bytes of slack before the data and poisoned guard bytes around it.
struct Guarded {
  static constexpr size_t kGuard = 64;
  std::vector<unsigned char> bytes;
  size_t begin;
  size_t size;
  Guarded(size_t size_bytes, size_t offset) : bytes(size_bytes + 2 * kGuard + offset + 16, 0xA5),
                                                begin(kGuard + offset), size(size_bytes) {}
  // 16-byte aligned base + begin: the data's misalignment is exactly `offset` (mod 16) relative to `base16`.
  unsigned char* data() { return Base() + begin; }
  unsigned char* Base() {
    auto a = reinterpret_cast<uintptr_t>(bytes.data());
    return bytes.data() + ((16 - (a & 15)) & 15);
  }
  bool GuardsIntact() {
    unsigned char* b = Base();
    for (size_t i = 0; i < begin; ++i) {
      if (b[i] != 0xA5) return false;
    }
    for (size_t i = begin + size; i < begin + size + kGuard; ++i) {
      if (b[i] != 0xA5) return false;
    }
    return true;
  }
};

float RandomValue(std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  return d(rng);
}

// ---------------------------------------------------------------------------------------------------------
// Vector plan.

TEST(EmulationTest, VecPlanAlignsEveryBufferAndCoversRange) {
  alignas(16) static unsigned char arena[4096];
  for (size_t off_a = 0; off_a < 16; off_a += 4) {    // an f32 buffer at every 4-byte phase
    for (size_t off_b = 0; off_b < 16; off_b += 2) {  // a 16-bit buffer at every 2-byte phase
      for (size_t n : {0u, 1u, 7u, 8u, 9u, 33u, 100u}) {
        const in::PlanBuffer bufs[2] = {{arena + off_a, 4}, {arena + 1024 + off_b, 2}};
        const in::VecPlan plan = in::MakeVecPlan(bufs, 2, n);
        ASSERT_EQ(plan.n, n);
        ASSERT_LE(plan.head + 8 * plan.nvec, n);
        ASSERT_EQ(plan.ScalarCount() + 8 * plan.nvec, n);
        if (plan.nvec > 0) {
          ASSERT_LT(plan.head, 8u);
          for (const auto& b : bufs) {
            ASSERT_EQ((reinterpret_cast<uintptr_t>(b.ptr) + plan.head * b.elem_size) % 16, 0u);
          }
        }
        // Scalar indices enumerate exactly the elements outside the vector body.
        std::vector<int> seen(n, 0);
        for (size_t k = 0; k < plan.ScalarCount(); ++k) seen[plan.ScalarIndex(k)]++;
        for (size_t v = 0; v < plan.nvec; ++v) {
          for (size_t j = 0; j < 8; ++j) seen[plan.head + 8 * v + j]++;
        }
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "i=" << i << " n=" << n;
      }
    }
  }
}

TEST(EmulationTest, VecPlanFallsBackToScalarWhenBuffersDisagree) {
  alignas(16) static float a[64];
  alignas(16) static float b[64];
  // a is aligned at element 0, b at element 1 (mod 4): no common head exists.
  const in::PlanBuffer bufs[2] = {{a, 4}, {b + 3, 4}};
  const in::VecPlan plan = in::MakeVecPlan(bufs, 2, 40);
  EXPECT_EQ(plan.nvec, 0u);
  EXPECT_EQ(plan.ScalarCount(), 40u);
  // A pointer that is not even element-aligned also falls back.
  const in::PlanBuffer odd[1] = {{reinterpret_cast<const unsigned char*>(a) + 1, 4}};
  EXPECT_EQ(in::MakeVecPlan(odd, 1, 40).nvec, 0u);
}

// ---------------------------------------------------------------------------------------------------------
// Fused optimizer step against the host optimizer (zero::MakeAdam / MakeSgd), bit for bit.

struct OptCase {
  DType grad_dtype;
  int out;  // -1: no write-back, else a DType
  size_t n;
  size_t misalign;  // elements by which grad and param_out are shifted relative to the fp32 buffers
};

// Fills master/state/grad with random values plus edge values at random positions.
void FillInputs(std::mt19937& rng, size_t n, int states, std::vector<float>* master, std::vector<float>* s0,
                std::vector<float>* s1, std::vector<float>* grad32) {
  master->resize(n);
  s0->resize(n);
  s1->resize(n);
  grad32->resize(n);
  std::uniform_int_distribution<int> pick(0, 15);
  for (size_t i = 0; i < n; ++i) {
    (*master)[i] = RandomValue(rng, 1.0f);
    (*s0)[i] = RandomValue(rng, 0.1f);
    (*s1)[i] = std::abs(RandomValue(rng, 0.01f));
    (*grad32)[i] = RandomValue(rng, 0.5f);
    if (pick(rng) == 0) (*grad32)[i] = kEdge[std::uniform_int_distribution<int>(0, 9)(rng)];
    if (pick(rng) == 0) (*master)[i] = kEdge[std::uniform_int_distribution<int>(3, 9)(rng)];
  }
  (void)states;
}

// How the emulation runs one step: the first version's per-thread body over blocks x threads threads, or a
// tiled variant's body block by block, thread by thread.
struct V1Body {
  template <class G, class P, class Op>
  static void Run(const in::FusedArgs& a, const Op& op, SimGrid grid) {
    const size_t nthreads = grid.blocks * grid.threads;
    for (size_t t = 0; t < nthreads; ++t) in::FusedStepThread<G, P, Op>(a, op, t, nthreads);
  }
};

template <class V>
struct TiledBody {
  template <class G, class P, class Op>
  static void Run(const in::FusedArgs& a, const Op& op, SimGrid grid) {
    for (size_t b = 0; b < grid.blocks; ++b) {
      for (size_t t = 0; t < grid.threads; ++t) {
        in::FusedStepTiledThread<G, P, Op, V>(a, op, b, grid.blocks, t, grid.threads);
      }
    }
  }
};

using ProductionBody = TiledBody<in::FusedProductionVariant>;

template <class Body, class G, class Op>
void DispatchOut(int out, const in::FusedArgs& a, const Op& op, SimGrid grid) {
  switch (out) {
    case -1: Body::template Run<G, in::NoOut>(a, op, grid); break;
    case 0: Body::template Run<G, in::F32>(a, op, grid); break;
    case 1: Body::template Run<G, in::F16>(a, op, grid); break;
    default: Body::template Run<G, in::BF16>(a, op, grid); break;
  }
}

template <class Body, class Op>
void Dispatch(DType g, int out, const in::FusedArgs& a, const Op& op, SimGrid grid) {
  switch (g) {
    case DType::kF32: DispatchOut<Body, in::F32>(out, a, op, grid); break;
    case DType::kF16: DispatchOut<Body, in::F16>(out, a, op, grid); break;
    case DType::kBF16: DispatchOut<Body, in::BF16>(out, a, op, grid); break;
  }
}

// Runs three steps of the emulated kernel (Body) and of the host optimizer on the same inputs and compares all
// outputs bit for bit. make_op(step) gives the kernel's scalars; host is the host optimizer.
template <class Body, class MakeOp>
void CompareWithHost(const OptCase& c, int states, const ElementwiseOptimizer& host, MakeOp make_op, float grad_scale,
                     SimGrid grid, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "grad=" << DTypeName(c.grad_dtype) << " out=" << c.out << " n=" << c.n
                                    << " misalign=" << c.misalign << " grid=" << grid.blocks << "x" << grid.threads
                                    << " seed=" << seed);
  std::mt19937 rng(seed);
  std::vector<float> master, s0, s1, g32;
  FillInputs(rng, c.n, states, &master, &s0, &s1, &g32);
  const size_t gsize = DTypeSize(c.grad_dtype);
  const size_t osize = c.out < 0 ? 0 : DTypeSize(static_cast<DType>(c.out));
  // Device-side (emulated) buffers, guarded; the fp32 buffers 16-byte aligned, grad/out shifted by misalign.
  Guarded dm(c.n * 4, 0), d0(c.n * 4, 0), d1(c.n * 4, 0), dg(c.n * gsize, c.misalign * gsize),
      dout(c.n * osize, c.misalign * (osize ? osize : 1));
  std::memcpy(dm.data(), master.data(), c.n * 4);
  std::memcpy(d0.data(), s0.data(), c.n * 4);
  std::memcpy(d1.data(), s1.data(), c.n * 4);
  ConvertBuffer(g32.data(), DType::kF32, dg.data(), c.grad_dtype, c.n);
  // Host buffers.
  std::vector<float> hm = master, h0 = s0, h1 = s1;
  std::vector<unsigned char> hg(c.n * gsize + 1), hout(c.n * osize + 1, 0xA5);
  ConvertBuffer(g32.data(), DType::kF32, hg.data(), c.grad_dtype, c.n);

  in::FusedArgs a;
  a.master = reinterpret_cast<float*>(dm.data());
  a.grad = dg.data();
  a.grad_scale = grad_scale;
  a.state[0] = states >= 1 ? reinterpret_cast<float*>(d0.data()) : nullptr;
  a.state[1] = states >= 2 ? reinterpret_cast<float*>(d1.data()) : nullptr;
  a.param_out = c.out < 0 ? nullptr : dout.data();
  const in::PlanBuffer bufs[5] = {{a.master, 4}, {a.grad, gsize}, {a.state[0], 4}, {a.state[1], 4},
                                  {a.param_out, osize ? osize : 1}};
  a.plan = in::MakeVecPlan(bufs, 5, c.n);
  if (c.misalign == 0 && c.n >= 8) {
    ASSERT_GT(a.plan.nvec, 0u);  // the aligned case must take the vector path
  }

  float* hstate[2] = {h0.data(), h1.data()};
  for (int64_t step = 1; step <= 3; ++step) {
    Dispatch<Body>(c.grad_dtype, c.out, a, make_op(step), grid);
    ShardUpdate u;
    u.master = hm.data();
    u.grad = hg.data();
    u.grad_dtype = c.grad_dtype;
    u.grad_scale = grad_scale;
    u.state = hstate;
    u.param_out = c.out < 0 ? nullptr : hout.data();
    u.param_out_dtype = c.out < 0 ? DType::kBF16 : static_cast<DType>(c.out);
    u.n = c.n;
    u.step = step;
    u.lr = 1e-2;
    host.Update(u);
  }
  const float* em = reinterpret_cast<const float*>(dm.data());
  const float* e0 = reinterpret_cast<const float*>(d0.data());
  const float* e1 = reinterpret_cast<const float*>(d1.data());
  for (size_t i = 0; i < c.n; ++i) {
    ASSERT_TRUE(SameFloat(em[i], hm[i])) << "master i=" << i << " " << em[i] << " vs " << hm[i];
    if (states >= 1) {
      ASSERT_TRUE(SameFloat(e0[i], h0[i])) << "state0 i=" << i << " " << e0[i] << " vs " << h0[i];
    }
    if (states >= 2) {
      ASSERT_TRUE(SameFloat(e1[i], h1[i])) << "state1 i=" << i << " " << e1[i] << " vs " << h1[i];
    }
    if (c.out == 0) {
      ASSERT_TRUE(SameFloat(reinterpret_cast<const float*>(dout.data())[i], reinterpret_cast<float*>(hout.data())[i]))
          << "param_out i=" << i;
    } else if (c.out > 0) {
      uint16_t x, y;
      std::memcpy(&x, dout.data() + 2 * i, 2);
      std::memcpy(&y, hout.data() + 2 * i, 2);
      ASSERT_TRUE(SameBits16(x, y, static_cast<DType>(c.out))) << "param_out i=" << i << " " << x << " vs " << y;
    }
  }
  EXPECT_TRUE(dm.GuardsIntact());
  EXPECT_TRUE(d0.GuardsIntact());
  EXPECT_TRUE(d1.GuardsIntact());
  EXPECT_TRUE(dg.GuardsIntact());
  EXPECT_TRUE(dout.GuardsIntact());
}

std::vector<OptCase> OptCases() {
  std::vector<OptCase> cases;
  for (DType g : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int out : {-1, 0, 1, 2}) {
      for (size_t n : {0u, 1u, 7u, 8u, 9u, 64u, 1003u}) {
        for (size_t mis : {0u, 1u, 3u}) cases.push_back({g, out, n, mis});
      }
    }
  }
  return cases;
}

// The production kernel's body (FusedProductionVariant), every Adam/AdamW flavour.
TEST(EmulationTest, AdamMatchesHostBitForBit) {
  uint32_t seed = 1;
  for (bool decoupled : {true, false}) {
    for (bool bias_correction : {true, false}) {
      for (double beta1 : {0.9, 0.3}) {  // 0.3: torch's lerp takes its other branch (weight >= 0.5)
        AdamParams p;
        p.beta1 = beta1;
        p.beta2 = 0.999;
        p.eps = 1e-8;
        p.weight_decay = 0.01;
        p.decoupled_weight_decay = decoupled;
        p.bias_correction = bias_correction;
        auto host = MakeAdam(p);
        auto make_op = [&](int64_t step) {
          return in::MakeAdamOp(1e-2, p.beta1, p.beta2, p.eps, p.weight_decay, p.decoupled_weight_decay,
                                p.bias_correction, step);
        };
        for (const OptCase& c : OptCases()) {
          for (SimGrid g : kSimGrids) CompareWithHost<ProductionBody>(c, 2, *host, make_op, 0.5f, g, seed++);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(EmulationTest, SgdMatchesHostBitForBit) {
  uint32_t seed = 1000;
  struct Variant {
    double momentum, dampening, weight_decay;
    bool nesterov;
  };
  for (Variant v : {Variant{0.0, 0.0, 0.0, false}, Variant{0.0, 0.0, 1e-4, false}, Variant{0.9, 0.1, 1e-4, false},
                    Variant{0.9, 0.0, 0.0, true}}) {
    SgdParams p;
    p.momentum = v.momentum;
    p.dampening = v.dampening;
    p.weight_decay = v.weight_decay;
    p.nesterov = v.nesterov;
    auto host = MakeSgd(p);
    for (const OptCase& c : OptCases()) {
      if (v.momentum != 0.0) {
        auto make_op = [&](int64_t step) {
          return in::MakeSgdOp<1>(1e-2, p.momentum, p.dampening, p.weight_decay, p.nesterov, step);
        };
        for (SimGrid g : kSimGrids) CompareWithHost<ProductionBody>(c, 1, *host, make_op, 2.0f, g, seed++);
      } else {
        auto make_op = [&](int64_t step) {
          return in::MakeSgdOp<0>(1e-2, p.momentum, p.dampening, p.weight_decay, p.nesterov, step);
        };
        for (SimGrid g : kSimGrids) CompareWithHost<ProductionBody>(c, 0, *host, make_op, 2.0f, g, seed++);
      }
      if (HasFatalFailure()) return;
    }
  }
}

// Every other variant zero-bench-gpu times (the first version and each tiled variant) computes the same bits:
// AdamW and SGD with Nesterov momentum, every dtype pair and alignment, plus a size where each simulated block
// takes several whole tiles.
TEST(EmulationTest, EveryFusedVariantMatchesHostBitForBit) {
  AdamParams ap;
  ap.weight_decay = 0.01;
  auto adam = MakeAdam(ap);
  auto make_adam = [&](int64_t step) {
    return in::MakeAdamOp(1e-2, ap.beta1, ap.beta2, ap.eps, ap.weight_decay, true, true, step);
  };
  SgdParams sp;
  sp.momentum = 0.9;
  sp.nesterov = true;
  sp.weight_decay = 1e-4;
  auto sgd = MakeSgd(sp);
  auto make_sgd = [&](int64_t step) { return in::MakeSgdOp<1>(1e-2, 0.9, 0.0, 1e-4, true, step); };
  std::vector<OptCase> cases = OptCases();
  for (DType g : {DType::kF32, DType::kBF16}) cases.push_back({g, g == DType::kF32 ? -1 : 2, 4103, 0});
  uint32_t seed = 5000;
  auto check = [&](auto body, const char* name) {
    using Body = decltype(body);
    SCOPED_TRACE(name);
    for (const OptCase& c : cases) {
      for (SimGrid g : kSimGrids) {
        CompareWithHost<Body>(c, 2, *adam, make_adam, 0.5f, g, seed++);
        CompareWithHost<Body>(c, 1, *sgd, make_sgd, 2.0f, g, seed++);
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
  };
  check(V1Body{}, "v1");
  in::ForEachFusedVariant([&](auto v) {
    using V = decltype(v);
    const std::string name = std::string(V::kLayout == in::FusedLayout::kVec8 ? "vec8" : "quad") + " x" +
                             std::to_string(V::kUnits) + " hint " + std::to_string(static_cast<int>(V::kHint));
    if (!HasFatalFailure()) check(TiledBody<V>{}, name.c_str());
  });
}

// ---------------------------------------------------------------------------------------------------------
// GradStats: the per-thread partials of all simulated threads sum to the double reference.

template <class G>
in::StatsPartial EmulateStats(const void* g, float scale, const in::VecPlan& plan, size_t nthreads) {
  in::StatsPartial total;
  for (size_t t = 0; t < nthreads; ++t) {
    const in::StatsPartial p = in::GradStatsThread<G>(g, scale, plan, t, nthreads);
    total.sumsq += p.sumsq;
    total.nonfinite += p.nonfinite;
  }
  return total;
}

TEST(EmulationTest, GradStatsThreadsCoverEveryElement) {
  std::mt19937 rng(7);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (size_t n : {0u, 1u, 8u, 13u, 64u, 1000u, 4099u}) {
      for (size_t mis : {0u, 1u, 5u}) {
        for (size_t nthreads : {96u, 7u}) {
          SCOPED_TRACE(::testing::Message() << DTypeName(dt) << " n=" << n << " mis=" << mis << " t=" << nthreads);
          std::vector<float> g(n);
          for (auto& x : g) x = RandomValue(rng, 3.0f);
          size_t expect_nonfinite = 0;
          if (n > 4) {
            g[n / 2] = std::numeric_limits<float>::infinity();
            g[n - 1] = std::numeric_limits<float>::quiet_NaN();
            g[0] = 1e-40f;
          }
          const float scale = 0.25f;
          Guarded buf(n * DTypeSize(dt), mis * DTypeSize(dt));
          ConvertBuffer(g.data(), DType::kF32, buf.data(), dt, n);
          double ref = 0.0;
          for (size_t i = 0; i < n; ++i) {
            const float x = LoadAsF32(buf.data(), dt, i) * scale;
            if (std::isfinite(x)) {
              ref += static_cast<double>(x) * x;
            } else {
              ++expect_nonfinite;
            }
          }
          const in::PlanBuffer pb{buf.data(), DTypeSize(dt)};
          const in::VecPlan plan = in::MakeVecPlan(&pb, 1, n);
          in::StatsPartial got;
          switch (dt) {
            case DType::kF32: got = EmulateStats<in::F32>(buf.data(), scale, plan, nthreads); break;
            case DType::kF16: got = EmulateStats<in::F16>(buf.data(), scale, plan, nthreads); break;
            case DType::kBF16: got = EmulateStats<in::BF16>(buf.data(), scale, plan, nthreads); break;
          }
          EXPECT_EQ(got.nonfinite, expect_nonfinite);
          if (expect_nonfinite == 0) {
            EXPECT_NEAR(got.sumsq, ref, 1e-6 * ref + 1e-40);
          } else {
            EXPECT_FALSE(std::isfinite(got.sumsq));
          }
          EXPECT_TRUE(buf.GuardsIntact());
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// BatchCopy: every byte of every segment lands, nothing else is touched, with any alignments.

TEST(EmulationTest, BatchCopyCopiesEverySegmentExactly) {
  std::mt19937 rng(3);
  for (int round = 0; round < 20; ++round) {
    const int count = std::uniform_int_distribution<int>(1, 40)(rng);
    std::vector<Guarded> srcs, dsts;
    srcs.reserve(count);
    dsts.reserve(count);
    in::BatchCopyTable table;
    table.count = count;
    table.tile_begin[0] = 0;
    for (int s = 0; s < count; ++s) {
      size_t bytes = std::uniform_int_distribution<size_t>(0, 3000)(rng);
      if (s % 7 == 3) bytes = in::kCopyTileBytes * 2 + std::uniform_int_distribution<size_t>(0, 40)(rng);
      if (s % 5 == 1) bytes = 0;
      srcs.emplace_back(bytes, std::uniform_int_distribution<size_t>(0, 15)(rng));
      dsts.emplace_back(bytes, std::uniform_int_distribution<size_t>(0, 15)(rng));
      for (size_t i = 0; i < bytes; ++i) srcs.back().data()[i] = static_cast<unsigned char>(rng());
      table.src[s] = srcs.back().data();
      table.dst[s] = dsts.back().data();
      table.bytes[s] = bytes;
      table.tile_begin[s + 1] = table.tile_begin[s] + (bytes + in::kCopyTileBytes - 1) / in::kCopyTileBytes;
    }
    const size_t nblocks = std::uniform_int_distribution<size_t>(1, 9)(rng);
    const unsigned nthreads = round % 2 ? 64 : 33;
    for (size_t b = 0; b < nblocks; ++b) {
      for (unsigned t = 0; t < nthreads; ++t) in::BatchCopyThread(table, b, nblocks, t, nthreads);
    }
    for (int s = 0; s < count; ++s) {
      ASSERT_EQ(std::memcmp(srcs[s].data(), dsts[s].data(), table.bytes[s]), 0) << "round " << round << " seg " << s;
      ASSERT_TRUE(dsts[s].GuardsIntact()) << "round " << round << " seg " << s;
    }
  }
}

// Calls f(S{}, D{}) with the kernels' type tags for the dtypes st and dt.
template <class F>
void WithTypeTags(DType st, DType dt, F&& f) {
  auto with_dst = [&](auto stag) {
    if (dt == DType::kF32) f(stag, in::F32{});
    if (dt == DType::kF16) f(stag, in::F16{});
    if (dt == DType::kBF16) f(stag, in::BF16{});
  };
  if (st == DType::kF32) with_dst(in::F32{});
  if (st == DType::kF16) with_dst(in::F16{});
  if (st == DType::kBF16) with_dst(in::BF16{});
}

// ---------------------------------------------------------------------------------------------------------
// Convert: bit for bit the host ConvertBuffer, for every alignment pair.

template <class S, class D>
void EmulateConvert(const void* src, void* dst, size_t n, size_t nthreads) {
  const in::PlanBuffer bufs[2] = {{src, sizeof(typename S::Elem)}, {dst, sizeof(typename D::Elem)}};
  const in::VecPlan plan = in::MakeVecPlan(bufs, 2, n);
  for (size_t t = 0; t < nthreads; ++t) in::ConvertThread<S, D>(src, dst, plan, t, nthreads);
}

TEST(EmulationTest, ConvertMatchesHostBitForBit) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  const size_t n = 1000;
  std::vector<float> src(n);
  for (auto& x : src) x = BitsToFloat(bits(rng));
  for (size_t i = 0; i < 10; ++i) src[i] = kEdge[i];
  for (DType st : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      if (st == dt) continue;
      for (size_t mis_s : {0u, 1u}) {
        for (size_t mis_d : {0u, 3u}) {
          SCOPED_TRACE(::testing::Message() << DTypeName(st) << "->" << DTypeName(dt) << " " << mis_s << "/" << mis_d);
          Guarded s(n * DTypeSize(st), mis_s * DTypeSize(st)), d(n * DTypeSize(dt), mis_d * DTypeSize(dt));
          ConvertBuffer(src.data(), DType::kF32, s.data(), st, n);
          std::vector<unsigned char> ref(n * DTypeSize(dt));
          ConvertBuffer(s.data(), st, ref.data(), dt, n);
          WithTypeTags(st, dt, [&](auto stag, auto dtag) {
            EmulateConvert<decltype(stag), decltype(dtag)>(s.data(), d.data(), n, 96);
          });
          for (size_t i = 0; i < n; ++i) {
            const float a = LoadAsF32(d.data(), dt, i);
            const float b = LoadAsF32(ref.data(), dt, i);
            if (std::isnan(a) && std::isnan(b)) continue;  // NaN payloads may differ between paths
            ASSERT_EQ(std::memcmp(d.data() + i * DTypeSize(dt), ref.data() + i * DTypeSize(dt), DTypeSize(dt)), 0)
                << "i=" << i;
          }
          EXPECT_TRUE(d.GuardsIntact());
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Add (the device engine's landing of a gradient by addition): bit for bit the host engine's LandOnHost.

template <class S, class D>
void EmulateAdd(const void* src, void* dst, size_t n, size_t nthreads) {
  const in::PlanBuffer bufs[2] = {{src, sizeof(typename S::Elem)}, {dst, sizeof(typename D::Elem)}};
  const in::VecPlan plan = in::MakeVecPlan(bufs, 2, n);
  for (size_t t = 0; t < nthreads; ++t) in::AddThread<S, D>(src, dst, plan, t, nthreads);
}

TEST(EmulationTest, AddMatchesHostLandBitForBit) {
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0.f, 3.f);
  const size_t n = 1003;
  std::vector<float> a(n), b(n);
  for (auto& x : a) x = normal(rng);
  for (auto& x : b) x = normal(rng);
  for (size_t i = 0; i < 10; ++i) b[i] = kEdge[i];
  for (DType st : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (size_t mis_s : {0u, 1u}) {
        for (size_t mis_d : {0u, 3u}) {
          SCOPED_TRACE(::testing::Message() << DTypeName(st) << "+=" << DTypeName(dt) << " " << mis_s << "/" << mis_d);
          Guarded s(n * DTypeSize(st), mis_s * DTypeSize(st)), d(n * DTypeSize(dt), mis_d * DTypeSize(dt));
          ConvertBuffer(b.data(), DType::kF32, s.data(), st, n);
          ConvertBuffer(a.data(), DType::kF32, d.data(), dt, n);
          std::vector<unsigned char> ref(n * DTypeSize(dt));
          ConvertBuffer(a.data(), DType::kF32, ref.data(), dt, n);
          internal::LandOnHost(s.data(), st, ref.data(), dt, static_cast<int64_t>(n), /*add=*/true);
          WithTypeTags(st, dt, [&](auto stag, auto dtag) {
            EmulateAdd<decltype(stag), decltype(dtag)>(s.data(), d.data(), n, 96);
          });
          size_t changed = 0;
          for (size_t i = 0; i < n; ++i) {
            const float x = LoadAsF32(d.data(), dt, i);
            const float y = LoadAsF32(ref.data(), dt, i);
            changed += x != LoadAsF32(a.data(), DType::kF32, i);
            if (std::isnan(x) && std::isnan(y)) continue;
            ASSERT_EQ(std::memcmp(d.data() + i * DTypeSize(dt), ref.data() + i * DTypeSize(dt), DTypeSize(dt)), 0)
                << "i=" << i << " got " << x << " want " << y;
          }
          EXPECT_GT(changed, n / 2);  // the sum really happened
          EXPECT_TRUE(d.GuardsIntact());
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Stochastic rounding: bit for bit the host's StochasticRoundToBF16, for any split into threads and offsets.

TEST(EmulationTest, StochasticRoundMatchesHostBitForBit) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  const size_t n = 777;
  std::vector<float> src(n);
  for (auto& x : src) x = normal(rng);
  for (size_t i = 0; i < 10; ++i) src[i] = kEdge[i];
  for (uint64_t key : {uint64_t{0}, uint64_t{0x1234567890ABCDEFull}}) {
    for (int64_t first : {int64_t{0}, int64_t{4096 + 3}}) {
      std::vector<uint16_t> ref(n), got(n, 0xFFFF);
      StochasticRoundToBF16(src.data(), ref.data(), n, key, first);
      for (size_t t = 0; t < 37; ++t) {
        in::StochasticRoundThread(src.data(), got.data(), n, in::SplitMix(key), first, t, 37);
      }
      for (size_t i = 0; i < n; ++i) {
        if (std::isnan(src[i])) continue;
        ASSERT_EQ(got[i], ref[i]) << "i=" << i << " key=" << key << " first=" << first;
      }
    }
  }
}

}  // namespace
}  // namespace zero
