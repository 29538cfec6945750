// Fuzz target: the TCP store server's side of the wire protocol (comm/internal/store_protocol.h): request
// decoding and the state behind it (keys, counters, waiting GETs, deadlines), exactly as TcpStoreServer runs it
// for bytes from its sockets, but with no socket in the loop.
//
// Input: a script of events on four connections. Each event is one byte e (connection c = e >> 2 & 3) and its
// operands:
//   e & 3 == 0  bytes arrive on c: u8 length n, then n bytes (requests may span events)
//   e & 3 == 1  c closes (as after a protocol error)
//   e & 3 == 2  time passes: u8 k, 2^(k % 48) microseconds; waiting GETs past their deadline are answered
//   e & 3 == 3  c's pending output is sent (checked and dropped)
// Properties: no crash, hang, or allocation beyond what arrived; a connection's output is always a sequence of
// whole, well-formed answers; every request decoded on a connection gets exactly one answer or is waiting; a
// waiting GET past its deadline is answered; poll()'s timeout is -1 exactly when nothing waits with a deadline.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "comm/internal/store_protocol.h"
#include "fuzz_check.h"

namespace {

using namespace zero::internal;  // NOLINT(build/namespaces)

struct Shadow {
  std::string in;        // bytes received and not yet a whole request
  int64_t requests = 0;  // whole requests received
  int64_t sent = 0;      // answers sent (drained from the output)
  bool open = false;
};

// Counts the answers in `out`, checking that they are whole and well-formed.
int64_t CountAnswers(const std::string& out) {
  int64_t n = 0;
  size_t at = 0;
  while (out.size() - at >= kStoreResponseHeader) {
    char header[kStoreResponseHeader];
    std::copy_n(out.data() + at, kStoreResponseHeader, header);
    uint8_t code = 0;
    uint64_t len = 0;
    FUZZ_CHECK(DecodeStoreResponseHeader(header, &code, &len), "an answer with an oversized length");
    FUZZ_CHECK(code <= kStoreCodeOverflow, absl::StrCat("an answer with code ", code));
    FUZZ_CHECK(code == kStoreCodeOk || code == kStoreCodeOverflow || len == 0, "an error answer with a payload");
    FUZZ_CHECK(code != kStoreCodeOverflow || len == 8, "an overflow answer without the counter");
    FUZZ_CHECK(out.size() - at - kStoreResponseHeader >= len, "a partial answer");
    at += kStoreResponseHeader + len;
    ++n;
  }
  FUZZ_CHECK(at == out.size(), "a partial answer header");
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  StoreServerState state;
  std::array<Shadow, 4> shadow;
  absl::Time now = absl::UnixEpoch() + absl::Hours(24 * 365 * 50);
  size_t i = 0;
  auto next = [&]() -> int { return i < size ? data[i++] : -1; };
  // Every request is answered (sent or pending) or waiting: requests - answers summed over the connections is
  // the number of waiting GETs.
  auto check = [&] {
    int64_t unanswered = 0;
    for (int c = 0; c < 4; ++c) {
      const Shadow& s = shadow[c];
      if (!s.open) continue;
      const int64_t pending = CountAnswers(state.Output(c));
      FUZZ_CHECK(s.requests >= s.sent + pending, absl::StrCat("connection ", c, ": more answers than requests"));
      unanswered += s.requests - s.sent - pending;
    }
    FUZZ_CHECK(unanswered == static_cast<int64_t>(state.waiting()),
               absl::StrCat(unanswered, " requests unanswered but ", state.waiting(), " waiting"));
    const absl::Time deadline = state.NextDeadline();
    FUZZ_CHECK(deadline > now, "a GET past its deadline is still waiting");
    const int ms = PollTimeoutMs(deadline, now);
    FUZZ_CHECK(ms >= -1 && (ms == -1) == (deadline == absl::InfiniteFuture()), absl::StrCat("poll timeout ", ms));
  };
  for (int e = next(); e >= 0; e = next()) {
    const int c = e >> 2 & 3;
    Shadow& s = shadow[c];
    switch (e & 3) {
      case 0: {
        const size_t n = static_cast<size_t>(std::max(next(), 0));
        const std::string_view bytes(reinterpret_cast<const char*>(data) + i, std::min(n, size - i));
        i += bytes.size();
        // The shadow decodes the same bytes to count the requests; the state answers them.
        s.open = true;
        s.in.append(bytes);
        StoreRequest req;
        size_t used = 0, at = 0;
        StoreDecode d;
        while ((d = DecodeStoreRequest(std::string_view(s.in).substr(at), &req, &used)) == StoreDecode::kRequest) {
          at += used;
          ++s.requests;
        }
        s.in.erase(0, at);
        const bool ok = state.Receive(c, bytes, now);
        FUZZ_CHECK(ok == (d != StoreDecode::kMalformed), "Receive and DecodeStoreRequest disagree");
        if (!ok) {
          // The server drops the connection, and with it the answers not yet sent.
          state.Close(c);
          s = Shadow{};
        }
        break;
      }
      case 1:
        state.Close(c);
        s = Shadow{};
        break;
      case 2:
        now += absl::Microseconds(int64_t{1} << (std::max(next(), 0) % 48));
        state.Expire(now);
        break;
      case 3:
        if (s.open) {
          s.sent += CountAnswers(state.Output(c));
          state.Output(c).clear();
        }
        break;
    }
    check();
  }
  return 0;
}
