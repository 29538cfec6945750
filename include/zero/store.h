// zero/store.h — the key-value store ranks rendezvous through.
//
//   auto store = zero::Store::File("/tmp/zero-run-1234");          // N processes on one machine
//   auto store = zero::Store::Hash();                               // N threads in one process (tests)
//   auto store = zero::Store::Tcp("10.0.0.1", 29500, is_server);   // several machines (MASTER_ADDR/PORT)
//   auto comm = zero::Communicator::CreateGloo(store, rank, world, options);
//
// A Store is shared (std::shared_ptr) by every communicator built on it; keys are namespaced per
// communicator by a prefix, so one store can bootstrap several communicators. Implementations wrap Gloo's
// stores; the Gloo types never appear in this header.
//
// Every method is thread-safe and returns a Status for a store it cannot reach (kDeadlineExceeded naming the key
// after its timeout); the factories give a store whose calls fail, or a Status, never an abort.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "zero/status.h"

namespace zero {

class Store {
 public:
  virtual ~Store() = default;

  virtual Status Set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Set, giving up after `timeout` where the store can block (a TCP store whose server went dark); the default
  // is Set's own bound.
  virtual Status SetWithin(const std::string& key, const std::vector<uint8_t>& value, absl::Duration timeout) {
    (void)timeout;
    return Set(key, value);
  }
  // Blocks until `key` exists or `timeout`, then returns its value (kDeadlineExceeded naming the key).
  virtual StatusOr<std::vector<uint8_t>> Get(const std::string& key, absl::Duration timeout) = 0;
  // Atomically adds `delta` to the integer at `key` and returns the new value.
  virtual StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;

  // Keys are write-once (as in Gloo's stores): Set on an existing key returns kAlreadyExists. Add counters
  // are a namespace of their own (Get does not see them). All methods are thread-safe.

  // In-process store for N ranks as N threads.
  static std::shared_ptr<Store> Hash();
  // A directory on a file system every rank sees (N processes on one machine, or a shared FS).
  static std::shared_ptr<Store> File(const std::string& directory);
  // A TCP store: rank 0 (is_server) serves on all interfaces at `port` (0 picks a free one, see port()), the
  // others connect to host:port (MASTER_ADDR / MASTER_PORT), retrying for up to `timeout`. The server lives as
  // long as rank 0's Store (communicators keep their store alive).
  static StatusOr<std::shared_ptr<Store>> Tcp(const std::string& host, int port, bool is_server,
                                              absl::Duration timeout);

  // The TCP port a TCP store serves or connects to (useful after Tcp(host, 0, /*is_server=*/true) picked a
  // free port); 0 for other stores.
  virtual int port() const { return 0; }

  // Backend access for zero's own communicators (returns a gloo::rendezvous::Store*, or nullptr for a store
  // that failed to open, whose every call returns the error). Not for users.
  virtual void* NativeHandle() = 0;
};

}  // namespace zero
