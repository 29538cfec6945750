#include "comm/internal/op.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "comm/internal/gloo_testing.h"

namespace zero::internal {
namespace {

constexpr uint32_t kFingerprintMagic = 0x5a43464bu;  // "ZCFK"

void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string DescribeFingerprint(const uint8_t* bytes) {
  OpDesc op;
  if (!DecodeFingerprint(bytes, &op)) return "an unrecognizable fingerprint (not a zero op)";
  return DescribeOp(op);
}

}  // namespace

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllGather: return "AllGather";
    case OpKind::kReduceScatter: return "ReduceScatter";
    case OpKind::kAllReduce: return "AllReduce";
    case OpKind::kBroadcast: return "Broadcast";
    case OpKind::kBarrier: return "Barrier";
    case OpKind::kReduceScatterDestructive: return "ReduceScatterDestructive";
    case OpKind::kFence: return "Fence after";
    case OpKind::kAllGatherStrided: return "AllGatherStrided";
    case OpKind::kReduceScatterStrided: return "ReduceScatterStrided";
    case OpKind::kAllToAll: return "AllToAll";
  }
  return "UnknownOp";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "unknown";
}

std::string DescribeOp(const OpDesc& op) {
  std::string s = absl::StrCat(OpKindName(op.kind), "#", op.seq);
  if (op.kind == OpKind::kBarrier) return s;
  const std::string_view dtype = DTypeName(op.dtype);
  absl::StrAppend(&s, "(", std::string(dtype), ", ", op.count, op.count == 1 ? " element" : " elements");
  if (op.kind == OpKind::kReduceScatter || op.kind == OpKind::kReduceScatterDestructive ||
      op.kind == OpKind::kReduceScatterStrided || op.kind == OpKind::kAllReduce) {
    absl::StrAppend(&s, ", ", ReduceOpName(op.reduce));
  }
  if (op.kind == OpKind::kBroadcast) absl::StrAppend(&s, ", root ", op.root);
  if ((op.kind == OpKind::kAllGatherStrided || op.kind == OpKind::kReduceScatterStrided) && op.stride != 0) {
    absl::StrAppend(&s, ", stride ", op.stride);
  }
  absl::StrAppend(&s, ")");
  if (!op.label.empty()) {
    absl::StrAppend(&s, " [", op.label, "]");
  } else if (op.label_hash != 0) {
    absl::StrAppend(&s, " [label ", absl::Hex(op.label_hash, absl::kZeroPad8), "]");
  }
  return s;
}

uint32_t LabelHash(const std::string& label) {
  if (label.empty()) return 0;
  uint32_t h = 2166136261u;
  for (unsigned char c : label) h = (h ^ c) * 16777619u;
  return h == 0 ? 1 : h;
}

int64_t BusBytes(const OpDesc& op, int world) {
  if (world <= 1) return 0;
  const int64_t bytes = static_cast<int64_t>(op.count * DTypeSize(op.dtype));
  switch (op.kind) {
    case OpKind::kAllGather:
    case OpKind::kAllGatherStrided:
    case OpKind::kReduceScatterStrided:
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterDestructive:
    case OpKind::kAllToAll: return (world - 1) * bytes;
    case OpKind::kAllReduce: return 2 * (world - 1) * bytes / world;
    case OpKind::kBroadcast: return bytes;
    default: return 0;
  }
}

namespace {

bool PowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

uint32_t ReverseBits(uint32_t v, int bits) {
  uint32_t r = 0;
  for (int i = 0; i < bits; ++i) r = (r << 1) | ((v >> i) & 1u);
  return r;
}

// gloo::allreduce's ring (gloo/allreduce.cc): `bytes` in segments of at most kMaxSegmentSize, at least two per
// rank; a reduce-scatter pass and an all-gather pass, each sending segment i of the loop (but the last two) to
// rank - 1 where it lies inside the buffer.
int64_t GlooRingAllReduceSends(int world, int rank, int64_t bytes, int64_t element) {
  if (bytes <= 0) return 0;
  const int64_t n = world;
  const int64_t max_segment = element * (static_cast<int64_t>(1024 * 1024) / element);
  const int64_t rounded = (bytes + 2 * n - 1) / (2 * n);
  const int64_t segment = (std::min(rounded, max_segment) + element - 1) / element * element;
  const int64_t segments = (std::max((bytes + segment - 1) / segment, 2 * n) + n - 1) / n * n;
  const int64_t per_rank = segments / n;
  int64_t sent = 0;
  for (int64_t i = 0; i + 2 < segments; ++i) {
    for (const int64_t first : {(rank + 1) * per_rank, rank * per_rank}) {  // reduce-scatter, all-gather
      const int64_t offset = ((first + i) * segment) % (segments * segment);
      sent += std::max<int64_t>(0, std::min(segment, bytes - offset));
    }
  }
  return sent;
}

// One run of Gloo's ReduceScatterHalvingDoubling over `total` f32 elements (blocks of total / world) at a
// power-of-two world: the constructor's sendCounts_ and the distribution map of the block this rank ends with.
void GlooHalvingDoublingSends(int world, int rank, int64_t total, std::vector<int64_t>* to_rank) {
  int steps = 0;
  while ((1 << steps) < world) ++steps;
  const int64_t chunk = (total + world - 1) / world;
  int64_t step_chunk = chunk << (steps - 1), send_offset = 0, recv_offset = 0, recv_count = 0;
  for (int i = 0; i < steps; ++i) {
    const int bit = 1 << i, peer = rank ^ bit;
    const int64_t at = send_offset + ((peer & bit) ? step_chunk : 0);
    if (at < total) (*to_rank)[peer] += 4 * std::min(step_chunk, total - at);
    const int64_t rat = recv_offset + ((rank & bit) ? step_chunk : 0);
    recv_count = rat < total ? std::min(step_chunk, total - rat) : 0;
    if (rank & bit) {
      send_offset += step_chunk;
      recv_offset += step_chunk;
    }
    step_chunk >>= 1;
  }
  // Distribution: this rank holds block ReverseBits(rank) of the result; its owner gets it.
  const int owner = static_cast<int>(ReverseBits(static_cast<uint32_t>(rank), steps));
  if (owner != rank) (*to_rank)[owner] += 4 * recv_count;
}

}  // namespace

void AddGlooSends(const OpDesc& op, int world, int rank, bool fingerprints, std::vector<int64_t>* to_rank) {
  if (world <= 1 || op.kind == OpKind::kFence) return;
  to_rank->resize(static_cast<size_t>(world), 0);
  const int right = (rank + 1) % world, left = (rank + world - 1) % world;
  if (fingerprints) (*to_rank)[right] += static_cast<int64_t>((world - 1) * kFingerprintBytes);
  const int64_t count = static_cast<int64_t>(op.count);
  switch (op.kind) {
    case OpKind::kAllGather:
    case OpKind::kAllGatherStrided:
      (*to_rank)[right] += (world - 1) * count * static_cast<int64_t>(DTypeSize(op.dtype));
      return;
    case OpKind::kAllToAll:  // gloo::alltoall: block r straight to rank r
      for (int r = 0; r < world; ++r) {
        if (r != rank) (*to_rank)[r] += count * static_cast<int64_t>(DTypeSize(op.dtype));
      }
      return;
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterDestructive:
    case OpKind::kReduceScatterStrided: {
      if (!PowerOfTwo(world)) {
        for (int r = 0; r < world; ++r) {
          if (r != rank) (*to_rank)[r] += 4 * count;
        }
        return;
      }
      // RunReduceScatterCached: runs of at most the chunk limit's elements per rank (the strided op: one run).
      const int64_t chunk = op.kind == OpKind::kReduceScatterStrided
                                ? count
                                : std::max<int64_t>(1, static_cast<int64_t>(GlooReduceScatterChunkLimit()) / world);
      for (int64_t off = 0; off < count; off += chunk) {
        GlooHalvingDoublingSends(world, rank, std::min(chunk, count - off) * world, to_rank);
      }
      return;
    }
    case OpKind::kAllReduce: (*to_rank)[left] += GlooRingAllReduceSends(world, rank, 4 * count, 4); return;
    case OpKind::kBroadcast: {
      const int64_t bytes = count * static_cast<int64_t>(DTypeSize(op.dtype));
      const int vrank = (rank + world - op.root) % world;
      int dim = 0;
      while ((1 << dim) < world) ++dim;
      int mask = (1 << dim) - 1;
      for (int i = 0; i < dim; ++i) {
        mask ^= 1 << i;
        if ((vrank & mask) != 0) continue;
        const int vpeer = vrank ^ (1 << i);
        if (vpeer >= world) continue;
        if ((vrank & (1 << i)) == 0) (*to_rank)[(vpeer + op.root) % world] += bytes;
      }
      return;
    }
    default: return;
  }
}

void OpHistory::RecordGloo(OpDesc& desc, const std::string& label, int world, int rank, bool fingerprints) {
  std::vector<int64_t> sends(static_cast<size_t>(std::max(world, 1)), 0);
  AddGlooSends(desc, world, rank, fingerprints, &sends);
  Record(desc, label, world);
  absl::MutexLock lock(&mu_);
  if (sent_to_.size() < sends.size()) sent_to_.resize(sends.size(), 0);
  for (size_t r = 0; r < sends.size(); ++r) sent_to_[r] += sends[r];
}

std::vector<int64_t> OpHistory::sent_to() const {
  absl::MutexLock lock(&mu_);
  return sent_to_;
}

void OpHistory::Record(OpDesc& desc, const std::string& label, int world) {
  desc.label = label;
  desc.label_hash = LabelHash(label);
  const Fingerprint f = EncodeFingerprint(desc);
  std::string text = DescribeOp(desc);
  const int64_t bus = BusBytes(desc, world);
  absl::MutexLock lock(&mu_);
  bus_bytes_ += bus;
  for (uint8_t b : f) hash_ = (hash_ ^ b) * 0x100000001b3ull;
  ring_[count_ % kRecent] = std::move(text);
  ++count_;
}

int64_t OpHistory::bus_bytes() const {
  absl::MutexLock lock(&mu_);
  return bus_bytes_;
}

uint64_t OpHistory::hash() const {
  absl::MutexLock lock(&mu_);
  return hash_;
}

std::vector<std::string> OpHistory::Recent() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  const uint64_t n = std::min<uint64_t>(count_, kRecent);
  for (uint64_t i = count_ - n; i < count_; ++i) out.push_back(ring_[i % kRecent]);
  return out;
}

namespace {
// The op number of a description "Kind#seq(...)", -1 when there is none.
int64_t SeqOf(const std::string& d) {
  const size_t hash = d.find('#');
  if (hash == std::string::npos) return -1;
  int64_t v = 0;
  size_t i = hash + 1;
  if (i >= d.size() || d[i] < '0' || d[i] > '9') return -1;
  for (; i < d.size() && d[i] >= '0' && d[i] <= '9'; ++i) v = v * 10 + (d[i] - '0');
  return v;
}
}  // namespace

std::string DescribeDesync(const std::vector<std::string>& posted, int my_rank) {
  const int world = static_cast<int>(posted.size());
  std::vector<std::map<int64_t, std::string>> ops(world);
  for (int r = 0; r < world; ++r) {
    for (absl::string_view line : absl::StrSplit(posted[r], '\n', absl::SkipEmpty())) {
      ops[r][SeqOf(std::string(line))] = std::string(line);
    }
  }
  std::string first;
  // The first op number that two reporting ranks both hold with different descriptions.
  for (int a = 0; a < world && first.empty(); ++a) {
    for (int b = a + 1; b < world && first.empty(); ++b) {
      for (const auto& [seq, desc] : ops[a]) {
        auto it = ops[b].find(seq);
        if (seq >= 0 && it != ops[b].end() && it->second != desc) {
          first = absl::StrCat("the ranks diverged at op #", seq, ": rank ", a, " issued ", desc, " where rank ", b,
                               " issued ", it->second);
          break;
        }
      }
    }
  }
  std::vector<int> silent;
  for (int r = 0; r < world; ++r) {
    if (posted[r].empty()) silent.push_back(r);
  }
  if (first.empty() && !silent.empty()) {
    first = absl::StrCat(silent.size() == 1 ? "rank " : "ranks ", absl::StrJoin(silent, ", "),
                         " posted no report in time: dead, stopped, or not waiting in a collective (a rank that "
                         "left the collective sequence, e.g. one that failed on its own or skipped a Step)");
  }
  if (first.empty()) {
    // Same descriptions where they overlap: some rank stopped issuing earlier (it is behind, stuck or dead).
    int64_t hi = -1, lo = INT64_MAX;
    int hi_rank = -1, lo_rank = -1;
    for (int r = 0; r < world; ++r) {
      if (ops[r].empty()) continue;
      const int64_t last = ops[r].rbegin()->first;
      if (last > hi) hi = last, hi_rank = r;
      if (last < lo) lo = last, lo_rank = r;
    }
    if (hi_rank >= 0 && hi != lo) {
      first = absl::StrCat("rank ", lo_rank, " issued nothing after op #", lo, " while rank ", hi_rank, " went on to #",
                           hi, " (a rank skipped or added collectives, or is stuck in its own code)");
    } else if (hi_rank >= 0) {
      first = "every reporting rank issued the same ops (a rank that posted nothing is dead or stuck)";
    }
  }
  std::string out = absl::StrCat("desync report (what each rank issued last): ", first);
  for (int r = 0; r < world; ++r) {
    absl::StrAppend(&out, "\n  rank ", r, r == my_rank ? " (this rank)" : "", ":");
    if (posted[r].empty()) {
      absl::StrAppend(&out, " posted nothing in time (dead, stopped, or not failing yet)");
      continue;
    }
    int same = -1;  // a lower rank that posted the very same ops: not listed twice
    for (int q = 0; q < r && same < 0; ++q) {
      if (posted[q] == posted[r]) same = q;
    }
    if (same >= 0) {
      absl::StrAppend(&out, " the same as rank ", same);
      continue;
    }
    for (const auto& [seq, desc] : ops[r]) absl::StrAppend(&out, "\n    ", desc);
  }
  return out;
}

Fingerprint EncodeFingerprint(const OpDesc& op) {
  Fingerprint f{};
  PutU32(&f[0], kFingerprintMagic);
  f[4] = static_cast<uint8_t>(op.kind);
  f[5] = static_cast<uint8_t>(op.dtype);
  f[6] = static_cast<uint8_t>(op.reduce);
  PutU32(&f[8], static_cast<uint32_t>(op.root));
  PutU64(&f[12], op.count);
  PutU64(&f[20], static_cast<uint64_t>(op.seq));
  PutU32(&f[28], op.label_hash);
  return f;
}

bool DecodeFingerprint(const uint8_t* bytes, OpDesc* op) {
  if (GetU32(bytes) != kFingerprintMagic) return false;
  const bool op_kind = (bytes[4] >= 1 && bytes[4] <= 6) ||
                       bytes[4] == static_cast<uint8_t>(OpKind::kAllGatherStrided) ||
                       bytes[4] == static_cast<uint8_t>(OpKind::kReduceScatterStrided) ||
                       bytes[4] == static_cast<uint8_t>(OpKind::kAllToAll);
  if (!op_kind || bytes[5] > 2 || bytes[6] > 2) return false;
  op->kind = static_cast<OpKind>(bytes[4]);
  op->dtype = static_cast<DType>(bytes[5]);
  op->reduce = static_cast<ReduceOp>(bytes[6]);
  op->root = static_cast<int32_t>(GetU32(bytes + 8));
  op->count = GetU64(bytes + 12);
  op->seq = static_cast<int64_t>(GetU64(bytes + 20));
  op->label_hash = GetU32(bytes + 28);
  return true;
}

Status CompareFingerprints(const uint8_t* all, int world_size) {
  for (int r = 1; r < world_size; ++r) {
    if (std::memcmp(all, all + r * kFingerprintBytes, kFingerprintBytes) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "collective order violated (all ranks must issue the same ops in the same order): rank 0 "
          "issued ",
          DescribeFingerprint(all), " but rank ", r, " issued ", DescribeFingerprint(all + r * kFingerprintBytes)));
    }
  }
  return absl::OkStatus();
}

}  // namespace zero::internal
