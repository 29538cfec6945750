// The vectorized casts (core/convert_simd.cc, behind zero::ConvertBuffer) against zero/dtype.h's scalar
// conversions, bit for bit (NaN payloads included), on every SIMD target this CPU runs:
//   * 16 -> 32 and 16 -> 16: all 65,536 patterns of f16 and of bf16;
//   * 32 -> 16: every f16 rounding boundary (each pair of neighbouring f16 values' midpoint, one f32 ulp either
//     side, and the neighbours themselves, normal and subnormal, up to the 65520 overflow threshold), every bf16
//     upper half with tie / near-tie lower halves, IEEE specials and random bit patterns;
//   * odd lengths, pointers misaligned to the vector width, and no write past the end.

#include <cmath>
#include <cstdint>
#include <cstdio>
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

using internal::SimdTarget;

using TargetGuard = testing::SimdTargetGuard;

std::vector<SimdTarget> Targets() {
  std::vector<SimdTarget> t = internal::AvailableSimdTargets();
  EXPECT_FALSE(t.empty());
  return t;
}

// Scalar conversion of element i of src (type st) into element i of dst (type dt), as dtype.h does it.
void ScalarConvert(const void* src, DType st, void* dst, DType dt, size_t n) {
  for (size_t i = 0; i < n; ++i) StoreFromF32(dst, dt, i, LoadAsF32(src, st, i));
}

// Byte-exact comparison of n elements of type t; reports the first few differing elements with their bits.
::testing::AssertionResult SameBits(const void* got, const void* want, DType t, size_t n, const void* input,
                                    DType in_t) {
  const size_t es = DTypeSize(t), is = DTypeSize(in_t);
  std::string msg;
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(static_cast<const char*>(got) + i * es, static_cast<const char*>(want) + i * es, es) == 0) {
      continue;
    }
    if (++bad <= 5) {
      uint32_t g = 0, w = 0, in = 0;
      std::memcpy(&g, static_cast<const char*>(got) + i * es, es);
      std::memcpy(&w, static_cast<const char*>(want) + i * es, es);
      std::memcpy(&in, static_cast<const char*>(input) + i * is, is);
      char line[128];
      std::snprintf(line, sizeof(line), "\n  [%zu] input 0x%08x: got 0x%08x, want 0x%08x", i, in, g, w);
      msg += line;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << n << " elements differ:" << msg;
}

std::vector<uint16_t> AllPatterns() {
  std::vector<uint16_t> p(1 << 16);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint16_t>(i);
  return p;
}

// f32 inputs that exercise every rounding decision of f32 -> f16 and f32 -> bf16.
std::vector<float> NarrowingInputs() {
  std::vector<uint32_t> bits;
  // f16: for each non-negative finite half and its upper neighbour (65536 past the largest, where the overflow
  // threshold 65520 is the midpoint), the two neighbours, the midpoint (exact in f32) and one f32 ulp either
  // side of it; subnormal halves included.
  for (uint32_t h = 0; h <= 0x7BFF; ++h) {
    const float lo = F16ToF32(static_cast<uint16_t>(h));
    const float hi = h == 0x7BFF ? 65536.0f : F16ToF32(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
    for (float f : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) bits.push_back(FloatBits(f));
  }
  // bf16 and f16-normal ties: every upper half with lower halves at and around bit 15 (bf16) and bit 12 (f16).
  const uint32_t kLow[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x2000,
                           0x3000, 0x7FFF, 0x8000, 0x8001, 0x9000, 0xFFFF};
  for (uint32_t hi = 0; hi < (1u << 16); ++hi) {
    for (uint32_t lo : kLow) bits.push_back(hi << 16 | lo);
  }
  // Specials: signed zeros, f32 subnormals, extremes, infinities, quiet and signalling NaNs with payloads in
  // the bits a narrowing keeps and in the bits it drops.
  for (uint32_t b : {0x00000000u, 0x00000001u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu, 0x7F800000u, 0x7F800001u,
                     0x7F802000u, 0x7F810000u, 0x7FA00000u, 0x7FBFFFFFu, 0x7FC00000u, 0x7FC00001u, 0x7FFFFFFFu,
                     0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x33000000u, 0x33000001u, 0x32FFFFFFu}) {
    bits.push_back(b);
    bits.push_back(b | 0x80000000u);
  }
  std::mt19937 rng(11);
  for (int i = 0; i < (1 << 18); ++i) bits.push_back(static_cast<uint32_t>(rng()));
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = BitsToFloat(bits[i]);
  return out;
}

TEST(ConvertSimd, WidenAllPatternsOnEveryTarget) {
  const std::vector<uint16_t> in = AllPatterns();
  for (const SimdTarget& target : Targets()) {
    TargetGuard guard(target.bits);
    ASSERT_EQ(internal::ActiveSimdTarget(), target.name);
    for (DType st : {DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(target.name + " " + std::string(DTypeName(st)) + " -> f32");
      std::vector<float> got(in.size()), want(in.size());
      ConvertBuffer(in.data(), st, got.data(), DType::kF32, in.size());
      ScalarConvert(in.data(), st, want.data(), DType::kF32, in.size());
      EXPECT_TRUE(SameBits(got.data(), want.data(), DType::kF32, in.size(), in.data(), st));
    }
  }
}

// f16 <-> bf16 goes through f32 in registers: widening is exact, so one rounding, as the scalar path.
TEST(ConvertSimd, SixteenToSixteenAllPatternsOnEveryTarget) {
  const std::vector<uint16_t> in = AllPatterns();
  for (const SimdTarget& target : Targets()) {
    TargetGuard guard(target.bits);
    for (DType st : {DType::kF16, DType::kBF16}) {
      const DType dt = st == DType::kF16 ? DType::kBF16 : DType::kF16;
      SCOPED_TRACE(target.name + " " + std::string(DTypeName(st)) + " -> " + std::string(DTypeName(dt)));
      std::vector<uint16_t> got(in.size()), want(in.size());
      ConvertBuffer(in.data(), st, got.data(), dt, in.size());
      ScalarConvert(in.data(), st, want.data(), dt, in.size());
      EXPECT_TRUE(SameBits(got.data(), want.data(), dt, in.size(), in.data(), st));
    }
  }
}

TEST(ConvertSimd, NarrowRoundingBoundariesOnEveryTarget) {
  const std::vector<float> in = NarrowingInputs();
  for (const SimdTarget& target : Targets()) {
    TargetGuard guard(target.bits);
    for (DType dt : {DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(target.name + " f32 -> " + std::string(DTypeName(dt)));
      std::vector<uint16_t> got(in.size()), want(in.size());
      ConvertBuffer(in.data(), DType::kF32, got.data(), dt, in.size());
      ScalarConvert(in.data(), DType::kF32, want.data(), dt, in.size());
      EXPECT_TRUE(SameBits(got.data(), want.data(), dt, in.size(), in.data(), DType::kF32));
    }
  }
}

// Lengths around every vector width (1 to 16 f32 lanes, two vectors per iteration), start addresses 1-3
// elements past a 64-byte boundary, and guard elements after the end that must stay untouched.
TEST(ConvertSimd, OddLengthsAndMisalignedPointers) {
  const size_t kLengths[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 1000, 1031};
  const DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
  constexpr size_t kGuard = 40;  // elements
  std::mt19937 rng(5);
  for (const SimdTarget& target : Targets()) {
    TargetGuard guard(target.bits);
    for (DType st : kTypes) {
      for (DType dt : kTypes) {
        if (st == dt) continue;
        for (size_t n : kLengths) {
          for (size_t src_off : {0, 1, 3}) {
            for (size_t dst_off : {0, 2, 1}) {
              SCOPED_TRACE(target.name + " " + std::string(DTypeName(st)) + " -> " + std::string(DTypeName(dt)) +
                           " n=" + std::to_string(n) + " src+" + std::to_string(src_off) + " dst+" +
                           std::to_string(dst_off));
              alignas(64) static uint8_t src_buf[4 * (1031 + 3 + kGuard)];
              alignas(64) static uint8_t got_buf[4 * (1031 + 3 + kGuard)];
              alignas(64) static uint8_t want_buf[4 * (1031 + 3 + kGuard)];
              // Random bit patterns: every value class of every type.
              for (auto& b : src_buf) b = static_cast<uint8_t>(rng());
              std::memset(got_buf, 0xA5, sizeof(got_buf));
              std::memset(want_buf, 0xA5, sizeof(want_buf));
              const void* src = src_buf + src_off * DTypeSize(st);
              void* got = got_buf + dst_off * DTypeSize(dt);
              void* want = want_buf + dst_off * DTypeSize(dt);
              ConvertBuffer(src, st, got, dt, n);
              ScalarConvert(src, st, want, dt, n);
              ASSERT_TRUE(SameBits(got, want, dt, n, src, st));
              // Nothing written before or after [dst, dst + n).
              ASSERT_EQ(std::memcmp(got_buf, want_buf, sizeof(got_buf)), 0);
            }
          }
        }
      }
    }
  }
}

// CopyStreaming is memcpy, bit for bit, on every target: every length around the vector sizes and the 4-vector
// body, every misalignment of source and destination, and not one byte written outside [dst, dst + n).
TEST(CopyStreaming, IsMemcpyOnEveryTargetAtEveryAlignment) {
  constexpr size_t kMax = 1100, kGuard = 80;
  std::mt19937 rng(9);
  alignas(64) static uint8_t src_buf[kMax + 2 * kGuard];
  alignas(64) static uint8_t got_buf[kMax + 2 * kGuard];
  alignas(64) static uint8_t want_buf[kMax + 2 * kGuard];
  for (const SimdTarget& target : Targets()) {
    TargetGuard guard(target.bits);
    for (size_t n : {0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 1000, 1100}) {
      for (size_t src_off = 0; src_off < 66; src_off += 13) {
        for (size_t dst_off = 0; dst_off < 66; dst_off += 5) {
          SCOPED_TRACE(target.name + " n=" + std::to_string(n) + " src+" + std::to_string(src_off) + " dst+" +
                       std::to_string(dst_off));
          for (auto& b : src_buf) b = static_cast<uint8_t>(rng());
          std::memset(got_buf, 0x5A, sizeof(got_buf));
          std::memset(want_buf, 0x5A, sizeof(want_buf));
          internal::CopyStreaming(got_buf + kGuard + dst_off, src_buf + src_off, n);
          std::memcpy(want_buf + kGuard + dst_off, src_buf + src_off, n);
          ASSERT_EQ(std::memcmp(got_buf, want_buf, sizeof(got_buf)), 0);
        }
      }
    }
  }
  // Large enough to stream most of it, from an odd source into an odd destination.
  std::vector<uint8_t> big(size_t{5} << 20), out(big.size() + 3, 0), want(big.size() + 3, 0);
  for (auto& b : big) b = static_cast<uint8_t>(rng());
  internal::CopyStreaming(out.data() + 3, big.data() + 1, big.size() - 1);
  std::memcpy(want.data() + 3, big.data() + 1, big.size() - 1);
  EXPECT_EQ(out, want);
}

// The public entry point keeps its contract for the same-type case (a copy, in place allowed).
TEST(ConvertSimd, SameTypeIsACopy) {
  std::vector<uint16_t> a = AllPatterns(), b(a.size());
  ConvertBuffer(a.data(), DType::kBF16, b.data(), DType::kBF16, a.size());
  EXPECT_EQ(a, b);
  ConvertBuffer(a.data(), DType::kF16, a.data(), DType::kF16, a.size());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace zero
