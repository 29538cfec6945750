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
#include <vector>

#include "absl/synchronization/mutex.h"
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
  kAllGatherStrided = 8,
  kReduceScatterStrided = 9,
  kAllToAll = 10,
};

struct OpDesc {
  OpKind kind = OpKind::kBarrier;
  DType dtype = DType::kF32;
  ReduceOp reduce = ReduceOp::kSum;  // meaningful for the reduce-scatters and kAllReduce
  int32_t root = -1;                 // meaningful for kBroadcast
  uint64_t count = 0;                // elements per rank (AllGather/ReduceScatter/AllToAll: the per-rank block)
  // kAllGatherStrided, kReduceScatterStrided: elements from one rank's block to the next. Described, not
  // fingerprinted: it is this rank's layout of its buffer, and the messages on the wire do not depend on it.
  uint64_t stride = 0;
  int64_t seq = -1;
  // What the caller was doing (Communicator::SetLabel when the op was issued), and its hash, which the
  // fingerprint carries (a decoded fingerprint has the hash only).
  std::string label;
  uint32_t label_hash = 0;
};

const char* OpKindName(OpKind kind);
const char* ReduceOpName(ReduceOp op);

// "AllGather#5(f32, 1000 elements)", "ReduceScatter#6(bf16, 250 elements, sum)", "Broadcast#7(f32, 3
// elements, root 1)", "Barrier#8", followed by " [label]" when the op has one.
std::string DescribeOp(const OpDesc& op);

// Fixed-size wire form of an OpDesc (little-endian fields and a magic word, so a rank that sends garbage, e.g.
// another op's payload after a desync, is reported as such instead of as a bogus op).
inline constexpr size_t kFingerprintBytes = 32;
using Fingerprint = std::array<uint8_t, kFingerprintBytes>;
Fingerprint EncodeFingerprint(const OpDesc& op);
// False when `bytes` does not carry the magic word.
bool DecodeFingerprint(const uint8_t* bytes, OpDesc* op);

// 32-bit FNV-1a of a label (0 for none).
uint32_t LabelHash(const std::string& label);

// What a communicator has issued: a running hash of every op's fingerprint, and the last kRecent ops'
// descriptions. Equal hashes on all ranks mean they issued the same sequence (kinds, dtypes, counts, roots,
// reduce ops and labels); the descriptions say what each side issued when they do not. Recorded by the issuing
// thread; read by it and by the thread that reports a failed op.
// The bytes one rank sends for `op` over `world` ranks with a bandwidth-optimal algorithm: nccl-tests' "bus
// bytes" (its busbw times the time). AllGather, ReduceScatter and AllToAll (count = the per-rank block): (W - 1)
// blocks; AllReduce: 2 (W - 1) / W of the buffer; Broadcast: the buffer; barriers and fences: 0; any op at W = 1: 0.
int64_t BusBytes(const OpDesc& op, int world);

// The payload bytes rank `rank` of `world` sends to each rank for `op`, added to (*to_rank)[peer] (sized
// `world`), as GlooCommunicator runs the op: the messages of Gloo's algorithms, not a measurement of the wire
// (no TCP/IP or Gloo headers). All-gathers (plain and strided): Gloo's ring, (W - 1) blocks to rank + 1. Reduce-
// scatters: Gloo's halving-doubling in f32 whatever the dtype (the communicator converts), in runs of at most
// GlooReduceScatterChunkLimit() elements; at a power-of-two world step i sends half of what is left to
// rank XOR 2^i (the nearest peers first), then the distribution phase sends this rank's reduced block to the
// rank that owns it (its bit-reversed rank) when that is another rank. At other worlds the binary blocks'
// exchanges are not modelled: the (W - 1) blocks are spread evenly over the other ranks. All-reduce: Gloo's ring
// in f32 (segments of at most 1 MiB, every message to rank - 1: reduce-scatter, then all-gather). Broadcast:
// Gloo's binomial tree from the root. All-to-all: one block to every other rank. Barriers and fences: 0.
// `fingerprints`: check mode's all-gather of a kFingerprintBytes fingerprint before each op (a ring too).
void AddGlooSends(const OpDesc& op, int world, int rank, bool fingerprints, std::vector<int64_t>* to_rank);

class OpHistory {
 public:
  static constexpr size_t kRecent = 12;
  // Fills in desc.label and desc.label_hash from `label`, then records the op, and its bus bytes at `world`.
  void Record(OpDesc& desc, const std::string& label, int world);
  // Record, and the op's bytes to each rank (AddGlooSends) summed in sent_to(): GlooCommunicator's form.
  void RecordGloo(OpDesc& desc, const std::string& label, int world, int rank, bool fingerprints);
  std::vector<int64_t> sent_to() const;  // by rank; empty when no op was recorded with RecordGloo
  uint64_t hash() const;
  std::vector<std::string> Recent() const;  // oldest first
  int64_t bus_bytes() const;                // the sum over every op recorded (Communicator::bus_bytes)

 private:
  mutable absl::Mutex mu_;
  int64_t bus_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> sent_to_ ABSL_GUARDED_BY(mu_);
  uint64_t hash_ ABSL_GUARDED_BY(mu_) = 0xcbf29ce484222325ull;
  std::array<std::string, kRecent> ring_ ABSL_GUARDED_BY(mu_);
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

// After an op timed out: what each rank last issued, from the lines each posted (Recent()), "" for a rank that
// posted nothing. Names the first op number at which two ranks' descriptions differ, or the rank that is
// behind, then lists every rank's last ops.
std::string DescribeDesync(const std::vector<std::string>& posted, int my_rank);

// Compares the fingerprints of all ranks (`all` holds world_size fingerprints, rank order). OK when they all
// equal `mine`; else kFailedPrecondition with the same message on every rank, naming the lowest rank whose op
// differs from rank 0's: "collective order violated: rank 0 issued AllGather#5(f32, 1000 elements) but rank 1
// issued ReduceScatter#5(f32, 250 elements, sum)".
Status CompareFingerprints(const uint8_t* all, int world_size);

}  // namespace zero::internal
