#include "comm/internal/op.h"

#include <cstring>

#include "absl/strings/str_cat.h"

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
      op.kind == OpKind::kAllReduce) {
    absl::StrAppend(&s, ", ", ReduceOpName(op.reduce));
  }
  if (op.kind == OpKind::kBroadcast) absl::StrAppend(&s, ", root ", op.root);
  absl::StrAppend(&s, ")");
  return s;
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
  return f;
}

bool DecodeFingerprint(const uint8_t* bytes, OpDesc* op) {
  if (GetU32(bytes) != kFingerprintMagic) return false;
  if (bytes[4] < 1 || bytes[4] > 6 || bytes[5] > 2 || bytes[6] > 2) return false;
  op->kind = static_cast<OpKind>(bytes[4]);
  op->dtype = static_cast<DType>(bytes[5]);
  op->reduce = static_cast<ReduceOp>(bytes[6]);
  op->root = static_cast<int32_t>(GetU32(bytes + 8));
  op->count = GetU64(bytes + 12);
  op->seq = static_cast<int64_t>(GetU64(bytes + 20));
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
