// shard/registration.cc — host-array collectives and the registration agreement check
// (shard/internal/registration.h).
#include "shard/internal/registration.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace zero::internal {

std::string DescribeRegistration(const std::vector<UnitLayout>& units) {
  std::string out;
  for (const auto& u : units) {
    for (const auto& p : u.params) {
      absl::StrAppend(&out, "unit ", u.name, " param ", p.spec.name, " shape [", absl::StrJoin(p.spec.shape, ","),
                      "]\n");
    }
    if (u.params.empty()) absl::StrAppend(&out, "unit ", u.name, " (no params)\n");
  }
  return out;
}

uint64_t Fnv1a64(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t HashValues(const float* values, size_t n) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;  // odd: multiplication by it is a bijection mod 2^64
  uint64_t lane[4] = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull, 0xA4093822299F31D0ull, 0x082EFA98EC4E6C89ull};
  const size_t words = n / 2;  // two floats per 64-bit word
  size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, values + 2 * (i + l), 8);
      lane[l] = (lane[l] ^ w) * kMul;
      lane[l] ^= lane[l] >> 29;
    }
  }
  uint64_t h = static_cast<uint64_t>(n) * kMul;
  for (; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, values + 2 * i, 8);
    h = ((h ^ w) * kMul) ^ (h >> 31);
  }
  if (n % 2 != 0) {
    uint32_t w;
    std::memcpy(&w, values + n - 1, 4);
    h = ((h ^ w) * kMul) ^ (h >> 31);
  }
  for (uint64_t l : lane) h = ((h ^ l) * kMul) ^ (h >> 31);
  return h;
}

Status HostCollectives::AllGather(const float* send, float* recv, size_t n) {
  if (!compute_->device()) return comm_->AllGather(send, recv, n, DType::kF32).Wait();
  const int world = comm_->world_size();
  Buffer ds = compute_->Alloc(MemTag::kStaging, n * 4), dr = compute_->Alloc(MemTag::kStaging, n * world * 4);
  ZERO_RETURN_IF_ERROR(compute_->status());
  compute_->CopyFromHostSync(ds.data(), send, n * 4);
  ZERO_RETURN_IF_ERROR(comm_->AllGather(ds.data(), dr.data(), n, DType::kF32, compute_->stream()).Wait());
  compute_->CopyToHostSync(recv, dr.data(), n * world * 4);
  return compute_->status();
}

Status HostCollectives::AllReduceSum(float* buf, size_t n) {
  if (!compute_->device()) return comm_->AllReduce(buf, n, DType::kF32, ReduceOp::kSum).Wait();
  if (reduce_scratch_.size() < n * 4) reduce_scratch_ = compute_->Alloc(MemTag::kStaging, n * 4);
  ZERO_RETURN_IF_ERROR(compute_->status());
  compute_->CopyFromHostSync(reduce_scratch_.data(), buf, n * 4);
  ZERO_RETURN_IF_ERROR(
      comm_->AllReduce(reduce_scratch_.data(), n, DType::kF32, ReduceOp::kSum, compute_->stream()).Wait());
  compute_->CopyToHostSync(buf, reduce_scratch_.data(), n * 4);
  return compute_->status();
}

Status HostCollectives::Broadcast(float* buf, size_t n, int root) {
  if (n == 0) return absl::OkStatus();
  if (!compute_->device()) return comm_->Broadcast(buf, n, DType::kF32, root).Wait();
  const size_t chunk = std::min(n, kBroadcastChunk);
  Buffer d = compute_->Alloc(MemTag::kStaging, chunk * 4);
  ZERO_RETURN_IF_ERROR(compute_->status());
  for (size_t off = 0; off < n; off += chunk) {
    const size_t m = std::min(chunk, n - off);
    if (comm_->rank() == root) compute_->CopyFromHostSync(d.data(), buf + off, m * 4);
    ZERO_RETURN_IF_ERROR(comm_->Broadcast(d.data(), m, DType::kF32, root, compute_->stream()).Wait());
    compute_->CopyToHostSync(buf + off, d.data(), m * 4);
  }
  return compute_->status();
}

StatusOr<std::vector<std::string>> HostCollectives::AllGatherStrings(const std::string& mine) {
  const int world = comm_->world_size();
  std::vector<float> len_send(1), len_recv(world);
  uint32_t len = static_cast<uint32_t>(mine.size());
  std::memcpy(len_send.data(), &len, 4);
  ZERO_RETURN_IF_ERROR(AllGather(len_send.data(), len_recv.data(), 1));
  uint32_t max_len = 0;
  std::vector<uint32_t> lens(world);
  for (int r = 0; r < world; ++r) {
    std::memcpy(&lens[r], &len_recv[r], 4);
    max_len = std::max(max_len, lens[r]);
  }
  const size_t slots = (max_len + 3) / 4;
  std::vector<float> send(slots), recv(slots * world);
  if (!mine.empty()) std::memcpy(send.data(), mine.data(), mine.size());  // (an empty vector's data() may be null)
  if (slots > 0) ZERO_RETURN_IF_ERROR(AllGather(send.data(), recv.data(), slots));
  std::vector<std::string> out(world);
  for (int r = 0; r < world; ++r) out[r].assign(reinterpret_cast<const char*>(recv.data() + r * slots), lens[r]);
  return out;
}

Status CheckRegistrationAgrees(HostCollectives& host, int world, const std::vector<UnitLayout>& layouts) {
  CommLabel label(host.comm(), "Finalize: registration check");
  const std::string desc = DescribeRegistration(layouts);
  const uint64_t h = Fnv1a64(desc);
  std::vector<float> send(2), recv(2 * world);
  std::memcpy(send.data(), &h, 8);
  ZERO_RETURN_IF_ERROR(host.AllGather(send.data(), recv.data(), 2));
  bool all_same = true;
  for (int r = 0; r < world; ++r) {
    uint64_t hr;
    std::memcpy(&hr, recv.data() + 2 * r, 8);
    all_same &= hr == h;
  }
  if (all_same) return absl::OkStatus();
  // Name the first difference against rank 0's registration.
  ZERO_ASSIGN_OR_RETURN(auto all, host.AllGatherStrings(desc));
  for (int r = 1; r < world; ++r) {
    if (all[r] == all[0]) continue;
    std::vector<std::string> a = absl::StrSplit(all[0], '\n'), b = absl::StrSplit(all[r], '\n');
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    const std::string a_line = i < a.size() && !a[i].empty() ? a[i] : "(nothing)";
    const std::string b_line = i < b.size() && !b[i].empty() ? b[i] : "(nothing)";
    return absl::InvalidArgumentError(absl::StrCat("Finalize: ranks registered different units: rank 0 has \"", a_line,
                                                   "\" where rank ", r, " has \"", b_line, "\""));
  }
  return absl::InternalError("Finalize: registration hashes differ but descriptions agree");
}

}  // namespace zero::internal
