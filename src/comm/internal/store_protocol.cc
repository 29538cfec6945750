#include "comm/internal/store_protocol.h"

#include <algorithm>

namespace zero::internal {
namespace {

void AppendU32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>(v >> (8 * i)));
}
void AppendU64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t ReadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}
uint32_t ReadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace

std::string EncodeStoreRequest(uint8_t cmd, std::string_view key, std::string_view payload) {
  std::string req;
  req.reserve(13 + key.size() + payload.size());
  req.push_back(static_cast<char>(cmd));
  AppendU32(&req, static_cast<uint32_t>(key.size()));
  req += key;
  AppendU64(&req, payload.size());
  req += payload;
  return req;
}

StoreDecode DecodeStoreRequest(std::string_view in, StoreRequest* req, size_t* size) {
  if (in.size() < 5) return StoreDecode::kIncomplete;
  const uint64_t key_len = ReadU32(in.data() + 1);
  if (key_len > kStoreMaxMessage) return StoreDecode::kMalformed;
  if (in.size() < 5 + key_len + 8) return StoreDecode::kIncomplete;
  const uint64_t payload_len = ReadU64(in.data() + 5 + key_len);
  if (payload_len > kStoreMaxMessage) return StoreDecode::kMalformed;
  const uint64_t total = 5 + key_len + 8 + payload_len;
  if (in.size() < total) return StoreDecode::kIncomplete;
  req->cmd = static_cast<uint8_t>(in[0]);
  req->key.assign(in.substr(5, key_len));
  req->payload.assign(in.substr(5 + key_len + 8, payload_len));
  *size = total;
  return StoreDecode::kRequest;
}

std::string EncodeStoreResponse(uint8_t code, std::string_view payload) {
  std::string r;
  r.reserve(kStoreResponseHeader + payload.size());
  r.push_back(static_cast<char>(code));
  AppendU64(&r, payload.size());
  r += payload;
  return r;
}

bool DecodeStoreResponseHeader(const char (&header)[kStoreResponseHeader], uint8_t* code, uint64_t* payload_len) {
  *code = static_cast<uint8_t>(header[0]);
  *payload_len = ReadU64(header + 1);
  return *payload_len <= kStoreMaxMessage;
}

std::string StoreI64Payload(int64_t v) {
  std::string s;
  AppendU64(&s, static_cast<uint64_t>(v));
  return s;
}

int64_t StoreReadI64(const char* p) { return static_cast<int64_t>(ReadU64(p)); }

bool StoreServerState::Receive(int conn, std::string_view bytes, absl::Time now) {
  Conn& c = conns_[conn];
  c.in.append(bytes);
  size_t done = 0;
  StoreRequest req;
  for (;;) {
    size_t size = 0;
    const StoreDecode d = DecodeStoreRequest(std::string_view(c.in).substr(done), &req, &size);
    if (d == StoreDecode::kMalformed) return false;
    if (d == StoreDecode::kIncomplete) break;
    done += size;
    Handle(conn, req, now);
  }
  c.in.erase(0, done);
  return true;
}

void StoreServerState::Handle(int conn, StoreRequest& req, absl::Time now) {
  std::string& out = conns_[conn].out;
  if (req.cmd == kStoreCmdSet) {
    auto [it, inserted] = values_.try_emplace(req.key, std::move(req.payload));
    if (!inserted) {
      out += EncodeStoreResponse(kStoreCodeExists, "");
      return;
    }
    out += EncodeStoreResponse(kStoreCodeOk, "");
    // Every GET waiting for the key gets its value.
    for (auto w = waiters_.begin(); w != waiters_.end();) {
      if (w->key == req.key) {
        conns_[w->conn].out += EncodeStoreResponse(kStoreCodeOk, it->second);
        w = waiters_.erase(w);
      } else {
        ++w;
      }
    }
  } else if (req.cmd == kStoreCmdGet && req.payload.size() == 8) {
    const int64_t timeout_ms = StoreReadI64(req.payload.data());
    if (auto it = values_.find(req.key); it != values_.end()) {
      out += EncodeStoreResponse(kStoreCodeOk, it->second);
    } else if (timeout_ms == 0) {
      out += EncodeStoreResponse(kStoreCodeTimeout, "");
    } else {
      // absl::Milliseconds and Time + Duration saturate: a timeout past the representable range never expires.
      waiters_.push_back(
          {conn, std::move(req.key), timeout_ms < 0 ? absl::InfiniteFuture() : now + absl::Milliseconds(timeout_ms)});
    }
  } else if (req.cmd == kStoreCmdAdd && req.payload.size() == 8) {
    int64_t& counter = counters_[req.key];
    int64_t sum = 0;
    if (__builtin_add_overflow(counter, StoreReadI64(req.payload.data()), &sum)) {
      out += EncodeStoreResponse(kStoreCodeOverflow, StoreI64Payload(counter));
      return;
    }
    counter = sum;
    out += EncodeStoreResponse(kStoreCodeOk, StoreI64Payload(sum));
  } else {
    out += EncodeStoreResponse(kStoreCodeBadRequest, "");
  }
}

bool StoreServerState::HasOutput(int conn) const {
  auto it = conns_.find(conn);
  return it != conns_.end() && !it->second.out.empty();
}

void StoreServerState::Close(int conn) {
  conns_.erase(conn);
  std::erase_if(waiters_, [conn](const Waiter& w) { return w.conn == conn; });
}

void StoreServerState::Expire(absl::Time now) {
  for (auto w = waiters_.begin(); w != waiters_.end();) {
    if (w->deadline <= now) {
      conns_[w->conn].out += EncodeStoreResponse(kStoreCodeTimeout, "");
      w = waiters_.erase(w);
    } else {
      ++w;
    }
  }
}

absl::Time StoreServerState::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  for (const Waiter& w : waiters_) next = std::min(next, w.deadline);
  return next;
}

int PollTimeoutMs(absl::Time deadline, absl::Time now) {
  if (deadline == absl::InfiniteFuture()) return -1;
  constexpr int64_t kDayMs = int64_t{24} * 3600 * 1000;
  // Rounded up, so the poll never wakes just before the deadline and spins.
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(deadline - now, absl::Milliseconds(1)));
  return static_cast<int>(std::clamp<int64_t>(ms, 0, kDayMs));
}

}  // namespace zero::internal
