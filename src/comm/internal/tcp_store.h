// Internal: a small TCP key-value store for rendezvous across machines (the role of torch's TCPStore).
//
// Rank 0 runs a TcpStoreServer on MASTER_PORT; every rank (rank 0 included) talks to it through a
// TcpStoreClient. The protocol is length-prefixed binary over one TCP connection per client
// (comm/internal/store_protocol.h, which also holds the server's state: this server only moves its bytes).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "zero/status.h"

namespace zero::internal {

class TcpStoreServer {
 public:
  // Listens on all interfaces at `port` (0 picks a free port; see port()). kUnavailable if the port is taken.
  static StatusOr<std::unique_ptr<TcpStoreServer>> Start(int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }

 private:
  TcpStoreServer(int listen_fd, int port, int wake_read, int wake_write);
  void Loop();

  const int listen_fd_;
  const int port_;
  const int wake_read_;
  const int wake_write_;
  std::thread thread_;
};

class TcpStoreClient {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start after the client).
  static StatusOr<std::unique_ptr<TcpStoreClient>> Connect(const std::string& host, int port, absl::Duration timeout);
  ~TcpStoreClient();
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  // Thread-safe; one request at a time per client.
  // Set within min(the store's timeout, limit).
  Status Set(const std::string& key, const std::string& value, absl::Duration limit = absl::InfiniteDuration());
  StatusOr<std::string> Get(const std::string& key, absl::Duration timeout);
  StatusOr<int64_t> Add(const std::string& key, int64_t delta);

  const std::string& endpoint() const { return endpoint_; }

 private:
  TcpStoreClient(int fd, std::string endpoint, absl::Duration io_timeout)
      : fd_(fd), endpoint_(std::move(endpoint)), io_timeout_(io_timeout) {}
  // Sends one request and reads its response within `bound` (a link that went dark sends no reset, so nothing
  // else would end the wait); kUnavailable if the connection broke, kDeadlineExceeded if the server did not
  // answer in time; after either the client fails every request (the framing is lost).
  StatusOr<std::pair<uint8_t, std::string>> RoundTrip(uint8_t cmd, const std::string& key, const std::string& payload,
                                                      absl::Duration bound);

  absl::Mutex mu_;
  int fd_;
  const std::string endpoint_;
  const absl::Duration io_timeout_;
  Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zero::internal
