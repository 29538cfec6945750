// Internal: the description of one collective op, its human-readable name and its fingerprint.
//
// Every op a communicator issues gets an OpDesc with the communicator-wide sequence number. The description
// is what error messages, Work::Describe() and the desync check print ("AllGather#5(f32, 1000 elements)").
// The fingerprint is a fixed-size encoding of the same fields that ranks exchange in check mode.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "zero/communicator.h"
#include "zero/dtype.h"
#include "zero/status.h"

namespace zero::internal {

enum class OpKind : uint8_t {
  kAllGather = 1,
  kReduceScatter = 2,
  kAllReduce = 3,
  kBroadcast = 4,
  kBarrier = 5,
  kReduceScatterDestructive = 6,
  kFence = 7,  // not an op: Communicator::Fence
};

struct OpDesc {
  OpKind kind = OpKind::kBarrier;
  DType dtype = DType::kF32;
  ReduceOp reduce = ReduceOp::kSum;  // meaningful for kReduceScatter and kAllReduce
  int32_t root = -1;                 // meaningful for kBroadcast
  uint64_t count = 0;                // elements per rank (AllGather/ReduceScatter: the per-rank block)
  int64_t seq = -1;
};

const char* OpKindName(OpKind kind);
const char* ReduceOpName(ReduceOp op);

// "AllGather#5(f32, 1000 elements)", "ReduceScatter#6(bf16, 250 elements, sum)", "Broadcast#7(f32, 3
// elements, root 1)", "Barrier#8".
std::string DescribeOp(const OpDesc& op);

// Fixed-size wire form of an OpDesc (little-endian fields and a magic word, so a rank that sends garbage, e.g.
// another op's payload after a desync, is reported as such instead of as a bogus op).
inline constexpr size_t kFingerprintBytes = 32;
using Fingerprint = std::array<uint8_t, kFingerprintBytes>;
Fingerprint EncodeFingerprint(const OpDesc& op);
// False when `bytes` does not carry the magic word.
bool DecodeFingerprint(const uint8_t* bytes, OpDesc* op);

// Compares the fingerprints of all ranks (`all` holds world_size fingerprints, rank order). OK when they all
// equal `mine`; else kFailedPrecondition with the same message on every rank, naming the lowest rank whose op
// differs from rank 0's: "collective order violated: rank 0 issued AllGather#5(f32, 1000 elements) but rank 1
// issued ReduceScatter#5(f32, 250 elements, sum)".
Status CompareFingerprints(const uint8_t* all, int world_size);

}  // namespace zero::internal
