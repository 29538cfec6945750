// Stores: Hash and File wrap Gloo's own HashStore and FileStore (Gloo's rendezvous uses them directly through
// NativeHandle); the TCP store is ours (comm/internal/tcp_store.h) behind a Gloo store adapter. Gloo's stores
// have no atomic add, so Add counters live beside them (a mutex-guarded map; flock-guarded files).
#include "zero/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "comm/internal/gloo_status.h"
#include "comm/internal/store_adapter.h"
#include "comm/internal/tcp_store.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/hash_store.h"

namespace zero {
namespace {

std::vector<char> ToChars(const std::vector<uint8_t>& v) { return std::vector<char>(v.begin(), v.end()); }
std::vector<uint8_t> ToBytes(const std::vector<char>& v) { return std::vector<uint8_t>(v.begin(), v.end()); }

// Set/Get through a Gloo store; Gloo reports a missing key by a timeout exception and a duplicate by an
// EnforceNotMet, which we turn into kDeadlineExceeded / kAlreadyExists naming the key.
Status GlooSet(gloo::rendezvous::Store& store, const std::string& key, const std::vector<uint8_t>& value) {
  try {
    store.set(key, ToChars(value));
    return absl::OkStatus();
  } catch (...) {
    Status s = internal::GlooExceptionToStatus(std::current_exception(), absl::StrCat("store set '", key, "'"));
    if (absl::StrContains(s.message(), "already")) {
      return absl::AlreadyExistsError(absl::StrCat("store key '", key, "' is already set (keys are write-once)"));
    }
    return s;
  }
}

StatusOr<std::vector<uint8_t>> GlooGet(gloo::rendezvous::Store& store, const std::string& key, absl::Duration timeout) {
  try {
    store.wait({key}, internal::ToGlooTimeout(timeout));
    return ToBytes(store.get(key));
  } catch (...) {
    Status s = internal::GlooExceptionToStatus(std::current_exception(), absl::StrCat("store get '", key, "'"));
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(
          absl::StrCat("store key '", key, "' did not appear within ", absl::FormatDuration(timeout)));
    }
    return s;
  }
}

// value + delta, or kOutOfRange when it would overflow int64 (the TCP store's server answers the same).
StatusOr<int64_t> AddChecked(const std::string& key, int64_t value, int64_t delta) {
  int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum)) {
    return absl::OutOfRangeError(
        absl::StrCat("store counter '", key, "' is ", value, ": adding ", delta, " would overflow int64"));
  }
  return sum;
}

class HashStoreImpl final : public Store {
 public:
  Status Set(const std::string& key, const std::vector<uint8_t>& value) override { return GlooSet(gloo_, key, value); }
  StatusOr<std::vector<uint8_t>> Get(const std::string& key, absl::Duration timeout) override {
    return GlooGet(gloo_, key, timeout);
  }
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    absl::MutexLock lock(&mu_);
    int64_t& counter = counters_[key];
    ZERO_ASSIGN_OR_RETURN(counter, AddChecked(key, counter, delta));
    return counter;
  }
  void* NativeHandle() override { return static_cast<gloo::rendezvous::Store*>(&gloo_); }

 private:
  gloo::rendezvous::HashStore gloo_;
  absl::Mutex mu_;
  std::map<std::string, int64_t> counters_ ABSL_GUARDED_BY(mu_);
};

// Keeps a counter file name readable and safe: [A-Za-z0-9._-] pass through, other bytes become %XX.
std::string EscapeKey(const std::string& key) {
  std::string out;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  if (out.size() > 200) out = absl::StrCat("h", std::hash<std::string>{}(key));
  return out;
}

class FileStoreImpl final : public Store {
 public:
  explicit FileStoreImpl(const std::string& directory) : directory_(directory) {
    std::error_code ec;
    std::filesystem::create_directories(directory, ec);
    if (ec) {
      error_ = absl::UnavailableError(
          absl::StrCat("file store: cannot create directory '", directory, "' (ZERO_STORE_DIR): ", ec.message()));
      return;
    }
    try {
      gloo_ = std::make_unique<gloo::rendezvous::FileStore>(directory);
    } catch (...) {
      error_ =
          internal::GlooExceptionToStatus(std::current_exception(), absl::StrCat("file store in '", directory, "'"));
    }
  }

  Status Set(const std::string& key, const std::vector<uint8_t>& value) override {
    ZERO_RETURN_IF_ERROR(error_);
    return GlooSet(*gloo_, key, value);
  }
  StatusOr<std::vector<uint8_t>> Get(const std::string& key, absl::Duration timeout) override {
    ZERO_RETURN_IF_ERROR(error_);
    return GlooGet(*gloo_, key, timeout);
  }
  // Read-modify-write under an exclusive flock, so processes sharing the directory add atomically.
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    ZERO_RETURN_IF_ERROR(error_);
    const std::string path = absl::StrCat(directory_, "/counter.", EscapeKey(key));
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::UnavailableError(absl::StrCat("file store: open '", path, "': ", std::strerror(errno)));
    }
    if (::flock(fd, LOCK_EX) != 0) {
      const int err = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("file store: flock '", path, "': ", std::strerror(err)));
    }
    char buf[32] = {};
    ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    StatusOr<int64_t> sum = AddChecked(key, n > 0 ? std::strtoll(buf, nullptr, 10) : 0, delta);
    if (!sum.ok()) {
      ::flock(fd, LOCK_UN);
      ::close(fd);
      return sum.status();
    }
    const int64_t value = *sum;
    // One fixed-width write over the old value, never a truncate first: a process killed between a truncate and its
    // write (live recovery's rank marking its group lost while zero-run SIGKILLs the group) left the file empty,
    // which reads as 0, and the count was lost for every process (Store.FileAddSurvivesAProcessKilledInTheMiddle).
    // A 20-byte write into one page is done whole or not at all, a kill included.
    char text[32];
    const int len = std::snprintf(text, sizeof(text), "%020lld", static_cast<long long>(value));
    bool ok = ::pwrite(fd, text, static_cast<size_t>(len), 0) == static_cast<ssize_t>(len);
    const int err = errno;
    ::flock(fd, LOCK_UN);
    ::close(fd);
    if (!ok) return absl::UnavailableError(absl::StrCat("file store: write '", path, "': ", std::strerror(err)));
    return value;
  }
  void* NativeHandle() override { return static_cast<gloo::rendezvous::Store*>(gloo_.get()); }

 private:
  const std::string directory_;
  Status error_;
  std::unique_ptr<gloo::rendezvous::FileStore> gloo_;
};

class TcpStoreImpl final : public Store {
 public:
  TcpStoreImpl(std::unique_ptr<internal::TcpStoreServer> server, std::unique_ptr<internal::TcpStoreClient> client,
               int port)
      : server_(std::move(server)), client_(std::move(client)), adapter_(this), port_(port) {}

  Status Set(const std::string& key, const std::vector<uint8_t>& value) override {
    return client_->Set(key, std::string(value.begin(), value.end()));
  }
  Status SetWithin(const std::string& key, const std::vector<uint8_t>& value, absl::Duration timeout) override {
    return client_->Set(key, std::string(value.begin(), value.end()), timeout);
  }
  StatusOr<std::vector<uint8_t>> Get(const std::string& key, absl::Duration timeout) override {
    ZERO_ASSIGN_OR_RETURN(std::string v, client_->Get(key, timeout));
    return std::vector<uint8_t>(v.begin(), v.end());
  }
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override { return client_->Add(key, delta); }
  int port() const override { return port_; }
  void* NativeHandle() override { return static_cast<gloo::rendezvous::Store*>(&adapter_); }

 private:
  // Declared before the client so that the client disconnects before the server stops.
  std::unique_ptr<internal::TcpStoreServer> server_;
  std::unique_ptr<internal::TcpStoreClient> client_;
  internal::GlooStoreAdapter adapter_;
  const int port_;
};

}  // namespace

std::shared_ptr<Store> Store::Hash() { return std::make_shared<HashStoreImpl>(); }

std::shared_ptr<Store> Store::File(const std::string& directory) { return std::make_shared<FileStoreImpl>(directory); }

StatusOr<std::shared_ptr<Store>> Store::Tcp(const std::string& host, int port, bool is_server, absl::Duration timeout) {
  if (port < 0 || port > 65535 || (port == 0 && !is_server)) {
    return absl::InvalidArgumentError(absl::StrCat("TCP store: invalid port ", port));
  }
  std::unique_ptr<internal::TcpStoreServer> server;
  if (is_server) {
    ZERO_ASSIGN_OR_RETURN(server, internal::TcpStoreServer::Start(port));
    port = server->port();
  }
  ZERO_ASSIGN_OR_RETURN(auto client,
                        internal::TcpStoreClient::Connect(is_server ? std::string("127.0.0.1") : host, port, timeout));
  return std::shared_ptr<Store>(std::make_shared<TcpStoreImpl>(std::move(server), std::move(client), port));
}

}  // namespace zero
