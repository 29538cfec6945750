// comm/internal/store_protocol.h — the TCP store's wire protocol and its server's state, without sockets.
// defines: the command and answer codes, EncodeRequest, DecodeRequest, EncodeResponse, DecodeResponseHeader,
// StoreServerState, PollTimeoutMs.
//
// Length-prefixed binary over one TCP connection per client, all integers little-endian:
//   request  = u8 cmd | u32 key_len | key | u64 payload_len | payload
//   response = u8 code | u64 payload_len | payload
// cmd 1 SET (payload = value; code 1 if the key exists: keys are write-once like Gloo's stores),
// cmd 2 GET (payload = i64 timeout in ms, negative = none; the server answers when the key appears, or code 2 at
// the deadline), cmd 3 ADD (payload = i64 delta; answers the new value, or code 4 when it would overflow int64).
// Add counters are a separate namespace from SET keys. Any other request gets code 3; a length over kMaxMessage
// is a protocol error that drops the connection.
//
// TcpStoreServer (tcp_store.h) only moves bytes between its sockets and a StoreServerState, which decodes the
// requests and holds the keys, counters and waiting GETs; fuzz/store_protocol_fuzzer.cc feeds the same state
// directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"

namespace zero::internal {

inline constexpr uint8_t kStoreCmdSet = 1;
inline constexpr uint8_t kStoreCmdGet = 2;
inline constexpr uint8_t kStoreCmdAdd = 3;
inline constexpr uint8_t kStoreCodeOk = 0;
inline constexpr uint8_t kStoreCodeExists = 1;
inline constexpr uint8_t kStoreCodeTimeout = 2;
inline constexpr uint8_t kStoreCodeBadRequest = 3;
inline constexpr uint8_t kStoreCodeOverflow = 4;
// A key or payload longer than this is a protocol error (a stray client), not a value anyone stores.
inline constexpr uint64_t kStoreMaxMessage = uint64_t{1} << 30;
inline constexpr size_t kStoreResponseHeader = 9;  // u8 code | u64 payload_len

struct StoreRequest {
  uint8_t cmd = 0;
  std::string key;
  std::string payload;
};

enum class StoreDecode {
  kIncomplete,  // more bytes are needed
  kRequest,     // one request decoded
  kMalformed,   // a length over kStoreMaxMessage: drop the connection
};

std::string EncodeStoreRequest(uint8_t cmd, std::string_view key, std::string_view payload);
// Decodes the request at the start of `in`; on kRequest fills *req and sets *size to the bytes it took.
StoreDecode DecodeStoreRequest(std::string_view in, StoreRequest* req, size_t* size);
std::string EncodeStoreResponse(uint8_t code, std::string_view payload);
// The response header's code and payload length; false when the length is over kStoreMaxMessage.
bool DecodeStoreResponseHeader(const char (&header)[kStoreResponseHeader], uint8_t* code, uint64_t* payload_len);
std::string StoreI64Payload(int64_t v);
int64_t StoreReadI64(const char* p);  // 8 bytes, little-endian

// The server's keys, counters and waiting GETs, and each connection's pending input and output. Connections are
// named by the caller (the server uses the socket's fd); one is created by its first Receive. Not thread-safe:
// the server's one thread owns it.
class StoreServerState {
 public:
  // Bytes arrived on `conn`: handles every complete request, appending the answers to Output(conn) (a GET of a
  // missing key waits, until `now` + its timeout). false: a protocol error; the caller drops the connection
  // (Close).
  bool Receive(int conn, std::string_view bytes, absl::Time now);
  // The bytes to send on `conn`; the caller erases what it sent.
  std::string& Output(int conn) { return conns_[conn].out; }
  bool HasOutput(int conn) const;
  // Forgets the connection, its pending bytes and its waiting GETs.
  void Close(int conn);
  // Answers code 2 (timeout) to every waiting GET whose deadline is <= now.
  void Expire(absl::Time now);
  // The earliest deadline of a waiting GET (InfiniteFuture when none has one).
  absl::Time NextDeadline() const;
  size_t waiting() const { return waiters_.size(); }

 private:
  struct Conn {
    std::string in, out;
  };
  struct Waiter {
    int conn;
    std::string key;
    absl::Time deadline;  // InfiniteFuture when the client gave no timeout
  };
  void Handle(int conn, StoreRequest& req, absl::Time now);

  std::map<int, Conn> conns_;
  std::vector<Waiter> waiters_;
  std::map<std::string, std::string> values_;
  std::map<std::string, int64_t> counters_;
};

// poll()'s timeout until `deadline`: -1 for InfiniteFuture, else the milliseconds left rounded up (0 when past),
// at most a day (the loop then polls again), so a far deadline never wraps around an int.
int PollTimeoutMs(absl::Time deadline, absl::Time now);

}  // namespace zero::internal
