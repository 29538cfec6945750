// zero::GradStats (mixed_precision/grad_stats.cc) against scalar double loops, on every SIMD target this CPU
// runs, for f32, f16 and bf16 gradients over random and edge inputs (inf, NaN, subnormals, largest finite
// values), odd lengths and misaligned starts:
//   * the non-finite count is exact;
//   * sumsq equals, bit for bit, a scalar loop that adds in the documented order (element i into partial sum
//     i mod 32, then a pairwise tree over the 32 partial sums), and so is the same on every target;
//   * sumsq is within a relative n * 2^-52 of a plain sequential double sum (each of the two sums of n
//     non-negative terms is within (n - 1) * 2^-53 of the exact value).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/internal/convert_simd.h"
#include "gtest/gtest.h"
#include "support/simd_target_guard.h"
#include "zero/dtype.h"
#include "zero/mixed_precision.h"

namespace zero {
namespace {

using internal::SimdTarget;

using TargetGuard = testing::SimdTargetGuard;

bool NonFinite(float x) { return !std::isfinite(x); }

// The plain loop: squares and sum in double, in index order.
GradStatsResult SequentialReference(const void* g, DType t, size_t n) {
  GradStatsResult r;
  for (size_t i = 0; i < n; ++i) {
    const double x = LoadAsF32(g, t, i);
    r.sumsq += x * x;
    r.nonfinite += NonFinite(static_cast<float>(x)) ? 1 : 0;
  }
  return r;
}

// The documented order: 32 partial sums by index mod 32, added pairwise (16 + 16, 8 + 8, ...).
GradStatsResult StripedReference(const void* g, DType t, size_t n) {
  double slots[32] = {};
  uint64_t nonfinite = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = LoadAsF32(g, t, i);
    slots[i % 32] += x * x;
    nonfinite += NonFinite(static_cast<float>(x)) ? 1 : 0;
  }
  for (size_t w = 16; w > 0; w /= 2) {
    for (size_t j = 0; j < w; ++j) slots[j] += slots[j + w];
  }
  return {slots[0], nonfinite};
}

uint64_t Bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

// Checks GradStats against both references; NaN sums compare as NaN (their payload is not part of the contract).
void ExpectMatches(const void* g, DType t, size_t n, const std::string& what) {
  SCOPED_TRACE(what + " " + std::string(DTypeName(t)) + " n=" + std::to_string(n));
  const GradStatsResult got = GradStats(g, t, n);
  const GradStatsResult striped = StripedReference(g, t, n);
  const GradStatsResult seq = SequentialReference(g, t, n);
  ASSERT_EQ(got.nonfinite, seq.nonfinite);
  if (seq.nonfinite > 0) {
    ASSERT_FALSE(std::isfinite(got.sumsq)) << got.sumsq;
    ASSERT_EQ(std::isnan(got.sumsq), std::isnan(striped.sumsq));
    if (!std::isnan(got.sumsq)) {
      ASSERT_EQ(got.sumsq, striped.sumsq);
    }
    return;
  }
  ASSERT_TRUE(std::isfinite(got.sumsq)) << got.sumsq;
  ASSERT_EQ(Bits(got.sumsq), Bits(striped.sumsq)) << got.sumsq << " vs striped " << striped.sumsq;
  const double tol = static_cast<double>(n) * std::ldexp(1.0, -52) * seq.sumsq;
  ASSERT_LE(std::abs(got.sumsq - seq.sumsq), tol) << got.sumsq << " vs sequential " << seq.sumsq;
}

// Largest finite value and smallest subnormal of each type, as f32.
float MaxFinite(DType t) {
  return t == DType::kF32 ? std::numeric_limits<float>::max() : t == DType::kF16 ? 65504.0f : BF16ToF32(0x7F7F);
}
float MinSubnormal(DType t) {
  return t == DType::kF32 ? std::numeric_limits<float>::denorm_min()
                          : t == DType::kF16 ? F16ToF32(0x0001) : BF16ToF32(0x0001);
}

// Random finite values over the type's whole range (magnitudes 2^-150 .. 2^128 for f32), both signs, with
// about one in 16 replaced by a subnormal or a largest finite value; with `specials`, also inf / NaN.
std::vector<uint8_t> RandomGrad(DType t, size_t n, uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> e(t == DType::kF32 ? -150 : t == DType::kF16 ? -25 : -134,
                                           t == DType::kF16 ? 16 : 127);
  std::vector<uint8_t> out(n * DTypeSize(t));
  const float kSpecial[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()};
  for (size_t i = 0; i < n; ++i) {
    float x = static_cast<float>(std::exp2(e(rng)) * ((rng() & 1) ? 1 : -1));
    switch (rng() % 32) {
      case 0: x = MaxFinite(t); break;
      case 1: x = -MinSubnormal(t) * static_cast<float>(1 + rng() % 7); break;
      case 2:
        if (specials) x = kSpecial[rng() % 4];
        break;
      default: break;
    }
    if (t == DType::kF16 && std::abs(x) > 65504.0f && std::isfinite(x)) x = std::copysign(65504.0f, x);
    StoreFromF32(out.data(), t, i, x);
  }
  return out;
}

const DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

TEST(GradStats, RandomInputsMatchReferencesOnEveryTarget) {
  const size_t kLengths[] = {0, 1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1000, 4097, 100003};
  for (const SimdTarget& target : internal::AvailableSimdTargets()) {
    TargetGuard guard(target.bits);
    ASSERT_EQ(internal::ActiveSimdTarget(), target.name);
    for (DType t : kTypes) {
      for (size_t n : kLengths) {
        for (bool specials : {false, true}) {
          // Start 0..3 elements past the allocation (misaligned to the vector width).
          const size_t off = n % 4;
          const std::vector<uint8_t> g = RandomGrad(t, n + off, 1000 * n + specials, specials);
          ExpectMatches(g.data() + off * DTypeSize(t), t, n,
                        target.name + (specials ? " random+inf/nan" : " random") + " +" + std::to_string(off));
        }
      }
    }
  }
}

// Every 16-bit pattern, all at once: 2048 non-finite f16 patterns (exponent 31), 256 bf16 (exponent 255); and
// the finite ones alone, whose sum must be exact against the striped reference.
TEST(GradStats, AllSixteenBitPatterns) {
  for (const SimdTarget& target : internal::AvailableSimdTargets()) {
    TargetGuard guard(target.bits);
    for (DType t : {DType::kF16, DType::kBF16}) {
      std::vector<uint16_t> all(1 << 16), finite;
      for (size_t i = 0; i < all.size(); ++i) {
        all[i] = static_cast<uint16_t>(i);
        if (std::isfinite(LoadAsF32(all.data(), t, i))) finite.push_back(all[i]);
      }
      const GradStatsResult r = GradStats(all.data(), t, all.size());
      EXPECT_EQ(r.nonfinite, t == DType::kF16 ? 2048u : 256u) << target.name;
      EXPECT_TRUE(std::isnan(r.sumsq)) << target.name;
      ExpectMatches(finite.data(), t, finite.size(), target.name + " finite patterns");
    }
  }
}

// Extremes that a float accumulator or a float square would lose: the squares of the largest finite values
// (1.2e77 for f32) and of the smallest subnormals (2^-298 for f32) are exact in double. Sums of copies of a power
// of two (the largest one below the maximum, the smallest subnormal) are exact in any order, so they must equal
// n * x^2; the largest finite values themselves go through both references.
TEST(GradStats, LargestFiniteAndSubnormals) {
  for (const SimdTarget& target : internal::AvailableSimdTargets()) {
    TargetGuard guard(target.bits);
    for (DType t : kTypes) {
      const float top_pow2 = t == DType::kF16 ? 32768.0f : std::ldexp(1.0f, 127);
      for (size_t n : {1, 33, 1000}) {
        std::vector<uint8_t> max(n * DTypeSize(t)), pow2(n * DTypeSize(t)), tiny(n * DTypeSize(t));
        for (size_t i = 0; i < n; ++i) {
          StoreFromF32(max.data(), t, i, (i % 2 ? -1 : 1) * MaxFinite(t));
          StoreFromF32(pow2.data(), t, i, (i % 2 ? 1 : -1) * top_pow2);
          StoreFromF32(tiny.data(), t, i, (i % 3 ? 1 : -1) * MinSubnormal(t));
        }
        SCOPED_TRACE(target.name + " " + std::string(DTypeName(t)) + " n=" + std::to_string(n));
        const GradStatsResult rp = GradStats(pow2.data(), t, n);
        const GradStatsResult rt = GradStats(tiny.data(), t, n);
        EXPECT_EQ(rp.nonfinite, 0u);
        EXPECT_EQ(rt.nonfinite, 0u);
        EXPECT_EQ(rp.sumsq, static_cast<double>(n) * top_pow2 * top_pow2);
        const double min2 = static_cast<double>(MinSubnormal(t)) * MinSubnormal(t);
        EXPECT_EQ(rt.sumsq, static_cast<double>(n) * min2);
        EXPECT_GT(rt.sumsq, 0.0);
        ExpectMatches(max.data(), t, n, target.name + " largest finite");
        ExpectMatches(tiny.data(), t, n, target.name + " smallest subnormal");
      }
    }
  }
}

// A single inf or NaN anywhere (body or tail) is counted once, whatever its sign or payload.
TEST(GradStats, EachNonFiniteCountedWherever) {
  const size_t n = 2 * 32 * 4 + 5;  // body blocks and a tail on every target
  const uint32_t kBad32[] = {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x7FBFFFFFu};
  const uint16_t kBadF16[] = {0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF};
  const uint16_t kBadBF16[] = {0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF};
  for (const SimdTarget& target : internal::AvailableSimdTargets()) {
    TargetGuard guard(target.bits);
    for (size_t pos = 0; pos < n; ++pos) {
      std::vector<float> f(n, 0.5f);
      std::vector<uint16_t> h(n, 0x3C00), b(n, 0x3F00);  // 1.0 in f16 and bf16
      std::memcpy(&f[pos], &kBad32[pos % 6], 4);
      h[pos] = kBadF16[pos % 5];
      b[pos] = kBadBF16[pos % 5];
      SCOPED_TRACE(target.name + " pos=" + std::to_string(pos));
      EXPECT_EQ(GradStats(f.data(), DType::kF32, n).nonfinite, 1u);
      EXPECT_EQ(GradStats(h.data(), DType::kF16, n).nonfinite, 1u);
      EXPECT_EQ(GradStats(b.data(), DType::kBF16, n).nonfinite, 1u);
      EXPECT_FALSE(std::isfinite(GradStats(f.data(), DType::kF32, n).sumsq));
    }
  }
}

// The vector loop folds its per-lane counters into the 64-bit total every 2^24 elements; a count past that
// (and past 2^24 / lanes per lane) must still be exact.
TEST(GradStats, CountsPastTheFoldInterval) {
  const size_t n = (size_t{1} << 24) + 4 * 32 + 3;
  std::vector<uint16_t> g(n, 0x7F80);  // bf16 +inf
  for (size_t i = 0; i < n; i += 1000) g[i] = 0x3F80;  // 1.0
  const uint64_t finite = (n + 999) / 1000;
  for (const SimdTarget& target : internal::AvailableSimdTargets()) {
    TargetGuard guard(target.bits);
    EXPECT_EQ(GradStats(g.data(), DType::kBF16, n).nonfinite, n - finite) << target.name;
  }
}

}  // namespace
}  // namespace zero
