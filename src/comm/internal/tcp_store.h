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
  Status Set(const std::string& key, const std::string& value);
  StatusOr<std::string> Get(const std::string& key, absl::Duration timeout);
  StatusOr<int64_t> Add(const std::string& key, int64_t delta);

  const std::string& endpoint() const { return endpoint_; }

 private:
  TcpStoreClient(int fd, std::string endpoint) : fd_(fd), endpoint_(std::move(endpoint)) {}
  // Sends one request and reads its response; kUnavailable if the connection broke.
  StatusOr<std::pair<uint8_t, std::string>> RoundTrip(uint8_t cmd, const std::string& key, const std::string& payload);

  absl::Mutex mu_;
  int fd_;
  const std::string endpoint_;
};

}  // namespace zero::internal
