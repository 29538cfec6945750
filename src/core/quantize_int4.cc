// core/quantize_int4.cc — blockwise int4 quantization (core/internal/quantize.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/internal/quantize.h"

namespace zero::internal {
namespace {

uint32_t AbsBits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b & 0x7FFFFFFFu;
}

}  // namespace

void QuantizeInt4(const float* x, size_t n, size_t block, uint8_t* q, float* scales) {
  std::fill_n(q, Int4Bytes(n), uint8_t{0});
  for (size_t b = 0, begin = 0; begin < n; ++b, begin += block) {
    const size_t end = std::min(n, begin + block);
    // The largest |x| by its bits, as QuantizeInt8: exact, order-free, and a NaN or an infinity is above FLT_MAX.
    uint32_t max_bits = 0;
    for (size_t i = begin; i < end; ++i) max_bits = std::max(max_bits, AbsBits(x[i]));
    float inv = 0.0f;
    if (max_bits > 0x7F7FFFFFu) {
      scales[b] = std::numeric_limits<float>::quiet_NaN();
    } else if (max_bits >= 0x00800000u) {
      float m;
      std::memcpy(&m, &max_bits, 4);
      inv = 7.0f / m;
      // A factor that overflows (max below about 2.1e-38) codes zeros, as a subnormal block does (int8's rule).
      if (inv > std::numeric_limits<float>::max()) inv = 0.0f;
      scales[b] = inv == 0.0f ? 0.0f : m / 7.0f;
    } else {
      scales[b] = 0.0f;
    }
    if (inv == 0.0f) continue;  // codes 0
    for (size_t i = begin; i < end; ++i) {
      const float r = std::clamp(std::nearbyint(x[i] * inv), -7.0f, 7.0f);
      const auto nibble = static_cast<uint8_t>(static_cast<int>(r) & 0xF);
      q[i / 2] |= static_cast<uint8_t>(i % 2 == 0 ? nibble : nibble << 4);
    }
  }
}

void DequantizeInt4(const uint8_t* q, const float* scales, size_t n, size_t block, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const int nibble = (q[i / 2] >> (i % 2 == 0 ? 0 : 4)) & 0xF;
    const int code = nibble >= 8 ? nibble - 16 : nibble;  // sign-extend
    out[i] = static_cast<float>(code) * scales[i / block];
  }
}

}  // namespace zero::internal
