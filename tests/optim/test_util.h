// Helpers shared by the optim tests: deterministic inputs with IEEE edge values, bitwise comparisons.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "zero/dtype.h"

namespace zero::optim_test {

// Values that break careless kernels: signed zeros, subnormals, extremes, inf, NaN, f16 limits.
inline const std::vector<float>& EdgeValues() {
  static const std::vector<float> v = {0.0f,
                                       -0.0f,
                                       1.0f,
                                       -1.0f,
                                       std::numeric_limits<float>::denorm_min(),
                                       -1e-40f,
                                       std::numeric_limits<float>::min(),
                                       std::numeric_limits<float>::max(),
                                       -std::numeric_limits<float>::max(),
                                       3e38f,
                                       std::numeric_limits<float>::infinity(),
                                       -std::numeric_limits<float>::infinity(),
                                       std::numeric_limits<float>::quiet_NaN(),
                                       65504.0f,
                                       65520.0f,
                                       -65519.0f,
                                       6e-8f,
                                       3e-8f,
                                       1e-20f,
                                       1e20f,
                                       1.00390625f /* bf16 tie */,
                                       1.000244140625f /* f16 tie */};
  return v;
}

// Random values over many magnitudes (both signs), with about one element in 8 replaced by an edge value
// when `edges` is set.
inline std::vector<float> RandomF32(size_t n, uint64_t seed, bool edges, float min_exp = -12, float max_exp = 4) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> e(min_exp, max_exp);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const float sign = (rng() & 1) ? 1.0f : -1.0f;
    out[i] = (rng() % 4 == 0) ? u(rng) : sign * std::pow(10.0f, e(rng));
    if (edges && rng() % 8 == 0) out[i] = EdgeValues()[rng() % EdgeValues().size()];
  }
  return out;
}

// Gradient bytes of the given dtype: f32 values as RandomF32, 16-bit ones as random bit patterns (every class
// of f16/bf16 value, NaN and inf included) mixed with rounded random values.
inline std::vector<uint8_t> RandomGrad(DType t, size_t n, uint64_t seed, bool edges) {
  std::vector<float> f = RandomF32(n, seed, edges, -8, 2);
  std::vector<uint8_t> out(n * DTypeSize(t));
  std::mt19937_64 rng(seed ^ 0x9E3779B97F4A7C15ull);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &f[i], 4);
    } else {
      uint16_t h = t == DType::kF16 ? F32ToF16(f[i]) : F32ToBF16(f[i]);
      if (edges && rng() % 8 == 0) h = static_cast<uint16_t>(rng());
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// Bitwise equality, except that any two NaNs are equal (NaN payloads follow operand order, which the compiler
// may swap for commutative operations; the value class is what matters).
inline bool SameF32(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return FloatBits(a) == FloatBits(b);
}

inline bool Is16Nan(uint16_t h, DType t) {
  if (t == DType::kF16) return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0;
  return (h & 0x7F80u) == 0x7F80u && (h & 0x7Fu) != 0;
}

// Compares two buffers of `n` elements of type `t`; reports the first few differences.
inline ::testing::AssertionResult SameBuffer(const void* a, const void* b, DType t, size_t n, const std::string& what) {
  int shown = 0;
  size_t bad = 0;
  std::string msg;
  for (size_t i = 0; i < n; ++i) {
    bool same;
    std::string detail;
    if (t == DType::kF32) {
      float x, y;
      std::memcpy(&x, static_cast<const char*>(a) + 4 * i, 4);
      std::memcpy(&y, static_cast<const char*>(b) + 4 * i, 4);
      same = SameF32(x, y);
      if (!same)
        detail = std::to_string(x) + " (0x" + std::to_string(FloatBits(x)) + ") vs " + std::to_string(y) + " (0x" +
                 std::to_string(FloatBits(y)) + ")";
    } else {
      uint16_t x, y;
      std::memcpy(&x, static_cast<const char*>(a) + 2 * i, 2);
      std::memcpy(&y, static_cast<const char*>(b) + 2 * i, 2);
      same = x == y || (Is16Nan(x, t) && Is16Nan(y, t));
      if (!same) detail = std::to_string(x) + " vs " + std::to_string(y);
    }
    if (!same) {
      ++bad;
      if (shown++ < 5) msg += "\n  " + what + "[" + std::to_string(i) + "]: " + detail;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << n << " elements differ" << msg;
}

}  // namespace zero::optim_test
