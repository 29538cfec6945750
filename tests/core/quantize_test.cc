// Blockwise int8 quantization (core/internal/quantize.h): the scalar definition's properties (the error bound,
// zeros, subnormals, NaN and infinity, an outlier), and every SIMD target this CPU runs against the scalar
// reference bit for bit (codes, scales and the dequantized values, in f32, bf16 and f16, blocks that do and do not
// divide the length, a vector width, or each other).
#include "core/internal/quantize.h"

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

namespace zero {
namespace {

using internal::CurrentQuantizePrefetch;
using internal::DefaultQuantizePrefetch;
using internal::DequantizeInt8;
using internal::DequantizeInt8Scalar;
using internal::QuantBlocks;
using internal::QuantizeInt8;
using internal::QuantizeInt8Scalar;
using internal::QuantizePrefetch;
using internal::SetQuantizePrefetch;

std::vector<float> Normal(size_t n, float sigma, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// x as type t (rounded as dtype.h rounds), in a byte buffer.
std::vector<uint8_t> As(const std::vector<float>& x, DType t) {
  std::vector<uint8_t> out(x.size() * DTypeSize(t));
  for (size_t i = 0; i < x.size(); ++i) StoreFromF32(out.data(), t, i, x[i]);
  return out;
}

TEST(QuantizeInt8, ErrorIsAtMostHalfAStepOfItsBlock) {
  const size_t n = 10007, block = 512;
  std::vector<float> x = Normal(n, 0.02f, 1);
  x[3] = 1e4f;  // an outlier: its block's step is large, the other blocks are untouched by it
  std::vector<int8_t> q(n);
  std::vector<float> scales(QuantBlocks(n, block)), back(n);
  QuantizeInt8Scalar(x.data(), DType::kF32, n, block, q.data(), scales.data());
  DequantizeInt8Scalar(q.data(), scales.data(), n, block, back.data(), DType::kF32);
  for (size_t b = 0; b < scales.size(); ++b) {
    float max_abs = 0;
    for (size_t i = b * block; i < std::min(n, (b + 1) * block); ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
    EXPECT_EQ(scales[b], max_abs / 127.0f) << "block " << b;
    for (size_t i = b * block; i < std::min(n, (b + 1) * block); ++i) {
      // Half a step, plus a few f32 ulps of the step for the products' roundings.
      ASSERT_LE(std::fabs(back[i] - x[i]), max_abs / 254.0f * (1 + 1e-5f)) << "element " << i;
      ASSERT_GE(q[i], -127);
      if (std::fabs(x[i]) == max_abs) {
        ASSERT_EQ(std::abs(q[i]), 127) << "the block's largest value is a full code";
      }
    }
  }
  EXPECT_NEAR(back[3], 1e4f, 1e4f * 1e-6f) << "the outlier is its block's largest: a full code";
  EXPECT_EQ(q[3], 127);
}

TEST(QuantizeInt8, ZeroSubnormalAndNonFiniteBlocks) {
  const size_t block = 4;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {0,      0,       -0.0f, 0,          // zeros
                                1e-40f, -2e-39f, 0,     1e-45f,     // subnormals only
                                1,      nan,     2,     3,          // a NaN
                                -inf,   1,       0,     0,          // an infinity
                                0.5f,   -0.25f,  0,     1e-40f,     // normal, with a subnormal beside
                                2e-37f, -1e-37f, 0,     1.5e-38f};  // normal, but 127 / max overflows
  std::vector<int8_t> q(x.size());
  std::vector<float> scales(QuantBlocks(x.size(), block)), back(x.size());
  QuantizeInt8Scalar(x.data(), DType::kF32, x.size(), block, q.data(), scales.data());
  DequantizeInt8Scalar(q.data(), scales.data(), x.size(), block, back.data(), DType::kF32);
  EXPECT_EQ(scales[0], 0.0f);
  EXPECT_EQ(scales[1], 0.0f) << "a block of subnormals reads back as zeros";
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(back[i], 0.0f) << i;
  EXPECT_TRUE(std::isnan(scales[2]));
  EXPECT_TRUE(std::isnan(scales[3]));
  for (size_t i = 8; i < 16; ++i) EXPECT_TRUE(std::isnan(back[i])) << "a non-finite block reads back as NaN: " << i;
  EXPECT_EQ(back[16], 0.5f);
  EXPECT_EQ(q[16], 127);
  EXPECT_EQ(q[17], -64) << "-0.25 * 254 = -63.5 rounds to the even -64";
  EXPECT_EQ(back[19], 0.0f);
  // A factor of infinity would make 0 · inf a NaN and every other code saturate: the block reads back as zeros, as a
  // subnormal one does (an error below 3.8e-37), on every target (SpecialBlocksBetweenOrdinaryOnesOnEveryTarget).
  EXPECT_EQ(scales[5], 0.0f);
  for (size_t i = 20; i < 24; ++i) EXPECT_EQ(q[i], 0) << i;
  for (size_t i = 20; i < 24; ++i) EXPECT_EQ(back[i], 0.0f) << i;
}

// The scalar reference's codes, scales and read-back values of `src` (n elements of t) in blocks of `block`.
struct Reference {
  std::vector<int8_t> q;
  std::vector<float> scales;
  std::vector<uint8_t> back;
};
Reference ScalarReference(const std::vector<uint8_t>& src, DType t, size_t n, size_t block) {
  Reference r{std::vector<int8_t>(n), std::vector<float>(QuantBlocks(n, block)),
              std::vector<uint8_t>(n * DTypeSize(t))};
  QuantizeInt8Scalar(src.data(), t, n, block, r.q.data(), r.scales.data());
  DequantizeInt8Scalar(r.q.data(), r.scales.data(), n, block, r.back.data(), t);
  return r;
}

TEST(QuantizeInt8, EveryTargetMatchesTheScalarReferenceBitForBit) {
  const std::vector<internal::SimdTarget> targets = internal::AvailableSimdTargets();
  ASSERT_FALSE(targets.empty());
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{33}, size_t{4109}, size_t{100003}}) {
      std::vector<float> x = Normal(n, t == DType::kF16 ? 1.0f : 0.05f, static_cast<unsigned>(n));
      // Exact halves after scaling, a constant run and an outlier, so ties and full codes occur.
      for (size_t i = 0; i < n; i += 97) x[i] = 0.5f;
      if (n > 40) x[40] = t == DType::kF16 ? 6e4f : 1e4f;
      const std::vector<uint8_t> src = As(x, t);
      for (size_t block : {size_t{1}, size_t{3}, size_t{16}, size_t{64}, size_t{4096}, size_t{5000}}) {
        const size_t nb = QuantBlocks(n, block);
        const auto [q_ref, s_ref, back_ref] = ScalarReference(src, t, n, block);
        for (const auto& target : targets) {
          testing::SimdTargetGuard guard(target.bits);
          // One element more than needed, to catch a write past the end.
          std::vector<int8_t> q(n + 1, 99);
          std::vector<float> s(nb + 1, 99.0f);
          std::vector<uint8_t> back(back_ref.size() + 4, 0xAB);
          QuantizeInt8(src.data(), t, n, block, q.data(), s.data());
          DequantizeInt8(q.data(), s.data(), n, block, back.data(), t);
          const std::string where = std::string(target.name) + " " + std::string(DTypeName(t)) + " n " +
                                    std::to_string(n) + " block " + std::to_string(block);
          ASSERT_EQ(0, std::memcmp(q.data(), q_ref.data(), n)) << where;
          ASSERT_EQ(0, std::memcmp(s.data(), s_ref.data(), nb * sizeof(float))) << where;
          ASSERT_EQ(0, std::memcmp(back.data(), back_ref.data(), back_ref.size())) << where;
          ASSERT_EQ(q[n], 99) << where;
          ASSERT_EQ(s[nb], 99.0f) << where;
          ASSERT_EQ(back[back_ref.size()], 0xAB) << where;
        }
      }
    }
  }
}

// Zero, subnormal-only and non-finite blocks between ordinary ones, on every target: the vector kernels find a block's
// maximum while they code the block before it, so a special block must neither skip nor spoil its neighbours'.
TEST(QuantizeInt8, SpecialBlocksBetweenOrdinaryOnesOnEveryTarget) {
  const std::vector<internal::SimdTarget> targets = internal::AvailableSimdTargets();
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (size_t block : {size_t{37}, size_t{64}, size_t{4096}}) {
      const size_t n = 7 * block + 29;
      std::vector<float> x = Normal(n, 0.05f, static_cast<unsigned>(block));
      std::fill(x.begin() + static_cast<std::ptrdiff_t>(block), x.begin() + static_cast<std::ptrdiff_t>(2 * block),
                0.0f);
      x[2 * block + block / 2] = std::numeric_limits<float>::quiet_NaN();
      x[3 * block + 1] = -std::numeric_limits<float>::infinity();
      for (size_t i = 4 * block; i < 5 * block; ++i)
        x[i] = t == DType::kF32 ? 1e-40f * static_cast<float>(i % 7) : 0.0f;
      // Normal values too small for 127 / max to be finite (bf16 holds them too; f16 rounds them to zero).
      for (size_t i = 5 * block; i < 6 * block; ++i) x[i] = 1e-37f * static_cast<float>(static_cast<int>(i % 5) - 2);
      x[6 * block + 3] = t == DType::kF16 ? 6e4f : 1e4f;  // an outlier right after the special blocks
      const std::vector<uint8_t> src = As(x, t);
      const size_t nb = QuantBlocks(n, block);
      const auto [q_ref, s_ref, back_ref] = ScalarReference(src, t, n, block);
      for (const auto& target : targets) {
        testing::SimdTargetGuard guard(target.bits);
        std::vector<int8_t> q(n);
        std::vector<float> s(nb);
        std::vector<uint8_t> back(back_ref.size());
        QuantizeInt8(src.data(), t, n, block, q.data(), s.data());
        DequantizeInt8(q.data(), s.data(), n, block, back.data(), t);
        const std::string where =
            std::string(target.name) + " " + std::string(DTypeName(t)) + " block " + std::to_string(block);
        ASSERT_EQ(0, std::memcmp(q.data(), q_ref.data(), n)) << where;
        ASSERT_EQ(0, std::memcmp(s.data(), s_ref.data(), nb * sizeof(float))) << where;
        ASSERT_EQ(0, std::memcmp(back.data(), back_ref.data(), back_ref.size())) << where;
      }
    }
  }
}

// Outputs of 4 MiB and more take the non-temporal path (kStreamBytes in quantize.cc; Quantize's codes on AVX-512
// only): one element (Dequantize) or vector (Quantize) at a time up to the first aligned position, then whole
// vectors streamed. The same bits as the scalar reference on every target, with the outputs at every offset from a
// 64-byte boundary that matters (0, 1, 16, 33 bytes), and nothing written outside them.
TEST(QuantizeInt8, LargeOutputsStreamTheSameBits) {
  const std::vector<internal::SimdTarget> targets = internal::AvailableSimdTargets();
  const size_t n = (size_t{4} << 20) + 4109;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<float> x = Normal(n, 0.05f, 5);
    x[12345] = 1e4f;
    x[777777] = std::numeric_limits<float>::quiet_NaN();  // a NaN block: 16-bit outputs leave the streamed path
    const std::vector<uint8_t> src = As(x, t);
    for (size_t block : {size_t{4096}, size_t{37}}) {
      const size_t nb = QuantBlocks(n, block);
      const auto [q_ref, s_ref, back_ref] = ScalarReference(src, t, n, block);
      for (const auto& target : targets) {
        testing::SimdTargetGuard guard(target.bits);
        for (size_t offset : {size_t{0}, size_t{1}, size_t{16}, size_t{33}}) {
          // 64-byte aligned storage, the outputs `offset` bytes in, a guard byte on each side.
          std::vector<int8_t> q_store(n + 128, 99);
          std::vector<uint8_t> back_store(back_ref.size() + 128, 0xAB);
          auto align = [](auto* p) {
            return reinterpret_cast<decltype(p)>((reinterpret_cast<uintptr_t>(p) + 63) / 64 * 64);
          };
          int8_t* q = align(q_store.data()) + offset;
          uint8_t* back = align(back_store.data()) + (t == DType::kF32 ? offset / 4 * 4 : offset / 2 * 2);
          std::vector<float> s(nb);
          QuantizeInt8(src.data(), t, n, block, q, s.data());
          DequantizeInt8(q, s.data(), n, block, back, t);
          const std::string where = std::string(target.name) + " " + std::string(DTypeName(t)) + " block " +
                                    std::to_string(block) + " offset " + std::to_string(offset);
          ASSERT_EQ(0, std::memcmp(q, q_ref.data(), n)) << where;
          ASSERT_EQ(0, std::memcmp(s.data(), s_ref.data(), nb * sizeof(float))) << where;
          ASSERT_EQ(0, std::memcmp(back, back_ref.data(), back_ref.size())) << where;
          if (offset > 0) {
            ASSERT_EQ(q[-1], 99) << where;
          }
          ASSERT_EQ(q[n], 99) << where;
          ASSERT_EQ(back[back_ref.size()], 0xAB) << where;
        }
      }
    }
  }
}

// The prefetch plan moves no bit: every plan the library picks by CPU (Intel's L1 and L2, AMD's L1 alone) and none
// at all give the scalar reference's codes and scales on every target, streamed and not; the plan is restored.
TEST(QuantizeInt8, EveryPrefetchPlanGivesTheSameBits) {
  const QuantizePrefetch before = CurrentQuantizePrefetch();
  EXPECT_EQ(before.l1_bytes, DefaultQuantizePrefetch().l1_bytes);
  EXPECT_EQ(before.l2_bytes, DefaultQuantizePrefetch().l2_bytes);
  struct Restore {  // the process's plan back, even after a failed assertion
    QuantizePrefetch plan;
    ~Restore() { SetQuantizePrefetch(plan); }
  } restore{before};
  for (size_t n : {size_t{100003}, (size_t{4} << 20) + 4109}) {
    std::vector<float> x = Normal(n, 0.05f, 7);
    x[4321] = -3e3f;
    const std::vector<uint8_t> src = As(x, DType::kF32);
    const size_t nb = QuantBlocks(n, 4096);
    const auto [q_ref, s_ref, back_ref] = ScalarReference(src, DType::kF32, n, 4096);
    for (const QuantizePrefetch plan : {internal::kQuantizePrefetchL1L2, internal::kQuantizePrefetchL1Only,
                                        QuantizePrefetch{0, 0}, QuantizePrefetch{64, 1 << 20}}) {
      SetQuantizePrefetch(plan);
      for (const auto& target : internal::AvailableSimdTargets()) {
        testing::SimdTargetGuard guard(target.bits);
        std::vector<int8_t> q(n);
        std::vector<float> s(nb);
        QuantizeInt8(src.data(), DType::kF32, n, 4096, q.data(), s.data());
        const std::string where = std::string(target.name) + " n " + std::to_string(n) + " L1 " +
                                  std::to_string(plan.l1_bytes) + " L2 " + std::to_string(plan.l2_bytes);
        ASSERT_EQ(0, std::memcmp(q.data(), q_ref.data(), n)) << where;
        ASSERT_EQ(0, std::memcmp(s.data(), s_ref.data(), nb * sizeof(float))) << where;
      }
    }
  }
}

}  // namespace
}  // namespace zero
