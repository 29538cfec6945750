// Unit layout: where each parameter lives in its unit's flat buffer and how the buffer is cut into shards.
// defines: kShardAlignElems, ParamSlot, UnitLayout, PaddedNumel.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "zero/engine.h"

namespace zero::internal {

// Every shard is a multiple of 32 elements: 64 bytes of 16-bit values, 128 bytes of fp32 — cache-line and
// vector aligned on the host, 16-byte aligned for device vector loads, NCCL-friendly.
inline constexpr int64_t kShardAlignElems = 32;

struct ParamSlot {
  ParamSpec spec;
  int64_t offset = 0;  // in elements, within the unit's flat buffer
  int64_t numel = 0;
};

struct UnitLayout {
  std::string name;
  std::vector<ParamSlot> params;
  std::unordered_map<std::string, int> index;
  int64_t numel = 0;   // sum of parameter sizes (Ψ of this unit)
  int64_t padded = 0;  // numel rounded up to world_size * kShardAlignElems
  int64_t shard = 0;   // padded / world_size

  // Elements of the unpadded unit that fall in `rank`'s shard (the rest of the shard is padding).
  int64_t OwnedElems(int rank) const {
    int64_t begin = static_cast<int64_t>(rank) * shard;
    int64_t n = numel - begin;
    return n < 0 ? 0 : (n > shard ? shard : n);
  }
};

// Padded size of a unit of `numel` elements at `world_size` ranks (the rule tests recompute independently).
inline int64_t PaddedNumel(int64_t numel, int world_size) {
  const int64_t q = kShardAlignElems * world_size;
  return (numel + q - 1) / q * q;
}

}  // namespace zero::internal
