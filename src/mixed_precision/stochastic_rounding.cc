#include <cmath>

#include "zero/dtype.h"
#include "zero/mixed_precision.h"

namespace zero {

namespace {
// splitmix64's finalizer: a strong, cheap 64-bit mix (a counter-based generator, no sequential state).
inline uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

void StochasticRoundToBF16(const float* src, uint16_t* dst, size_t n, uint64_t key, int64_t first_index) {
  const uint64_t k = Mix(key);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = FloatBits(src[i]);
    if ((u & 0x7F800000u) == 0x7F800000u) {
      dst[i] = F32ToBF16(src[i]);
      continue;
    }
    // Adding 16 random bits below the kept 16 and truncating rounds up with probability (low bits) / 2^16.
    const uint32_t r =
        static_cast<uint32_t>(Mix(k ^ static_cast<uint64_t>(first_index + static_cast<int64_t>(i)))) & 0xFFFFu;
    dst[i] = static_cast<uint16_t>((u + r) >> 16);
  }
}

}  // namespace zero
