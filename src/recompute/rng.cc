// Philox-4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator of Random123, cuRAND and PyTorch's CUDA RNG: ten rounds of two 32x32->64-bit
// multiplies, with the key bumped by the Weyl constants between rounds.
#include <cstdint>

#include "zero/recompute.h"

namespace zero {
namespace {

constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

inline void Round(std::array<uint32_t, 4>& c, const std::array<uint32_t, 2>& k) {
  const uint64_t p0 = static_cast<uint64_t>(kMul0) * c[0];
  const uint64_t p1 = static_cast<uint64_t>(kMul1) * c[2];
  const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

}  // namespace

std::array<uint32_t, 4> CounterRng::Philox(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      key[0] += kWeyl0;
      key[1] += kWeyl1;
    }
    Round(counter, key);
  }
  return counter;
}

std::array<uint32_t, 4> CounterRng::Block(uint64_t index) const {
  return Philox({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), static_cast<uint32_t>(state_.stream),
                 static_cast<uint32_t>(state_.stream >> 32)},
                {static_cast<uint32_t>(state_.seed), static_cast<uint32_t>(state_.seed >> 32)});
}

uint32_t CounterRng::NextU32() {
  const uint64_t index = state_.position / 4;
  if (index != block_index_) {  // one Philox call yields four values
    block_ = Block(index);
    block_index_ = index;
  }
  return block_[state_.position++ % 4];
}

float CounterRng::NextFloat() { return static_cast<float>(NextU32() >> 8) * 0x1.0p-24f; }

}  // namespace zero
