#include "comm/internal/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/internal/store_protocol.h"
#include "zero/logging.h"

namespace zero::internal {
namespace {

// Waits until fd is ready for `events` or `deadline` passes (a link that went dark sends no RST, so a plain
// blocking send or recv could wait for the kernel's TCP timeouts, minutes).
Status AwaitFd(int fd, short events, absl::Time deadline) {
  for (;;) {
    const int ms =
        deadline == absl::InfiniteFuture()
            ? -1
            : static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(deadline - absl::Now()) + 1, 0, 1 << 30));
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("no progress within the store's timeout");
  }
}

Status SendAll(int fd, const std::string& data, absl::Time deadline = absl::InfiniteFuture()) {
  size_t off = 0;
  while (off < data.size()) {
    ZERO_RETURN_IF_ERROR(AwaitFd(fd, POLLOUT, deadline));
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    }
    off += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

Status RecvAll(int fd, char* data, size_t size, absl::Time deadline = absl::InfiniteFuture()) {
  size_t off = 0;
  while (off < size) {
    ZERO_RETURN_IF_ERROR(AwaitFd(fd, POLLIN, deadline));
    ssize_t n = ::recv(fd, data + off, size - off, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n == 0) return absl::UnavailableError("the store server closed the connection");
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    }
    off += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Server

StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(int port) {
  // A dual-stack IPv6 socket accepts IPv4 clients too; fall back to IPv4 where IPv6 is disabled.
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool v6 = fd >= 0;
  if (!v6) fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("TCP store: socket: ", std::strerror(errno)));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int rv;
  if (v6) {
    int zero = 0;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    rv = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    rv = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  if (rv != 0 || ::listen(fd, 1024) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("TCP store: cannot listen on port ", port, ": ", std::strerror(err)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int actual_port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("TCP store: pipe: ", std::strerror(errno)));
  }
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(fd, actual_port, pipe_fds[0], pipe_fds[1]));
}

TcpStoreServer::TcpStoreServer(int listen_fd, int port, int wake_read, int wake_write)
    : listen_fd_(listen_fd), port_(port), wake_read_(wake_read), wake_write_(wake_write) {
  thread_ = std::thread([this] { Loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  const char c = 'x';
  (void)!::write(wake_write_, &c, 1);
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_read_);
  ::close(wake_write_);
}

void TcpStoreServer::Loop() {
  std::vector<int> conns;
  StoreServerState state;  // the protocol: keys, counters, waiting GETs, each connection's bytes
  for (;;) {
    std::vector<pollfd> fds;
    fds.push_back({wake_read_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (int fd : conns) fds.push_back({fd, static_cast<short>(POLLIN | (state.HasOutput(fd) ? POLLOUT : 0)), 0});
    int n = ::poll(fds.data(), fds.size(), PollTimeoutMs(state.NextDeadline(), absl::Now()));
    if (n < 0 && errno != EINTR) {
      ZERO_LOG(ERROR) << "TCP store server: poll: " << std::strerror(errno);
      break;
    }
    if (fds[0].revents != 0) break;  // shutdown
    if (fds[1].revents & POLLIN) {
      int cfd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (cfd >= 0) {
        int one = 1;
        ::setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        conns.push_back(cfd);
      }
    }
    std::vector<int> dead;
    for (size_t i = 2; i < fds.size(); ++i) {
      const int fd = fds[i].fd;
      bool alive = true;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[65536];
        for (;;) {
          ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
          if (r > 0) {
            if (!state.Receive(fd, std::string_view(buf, static_cast<size_t>(r)), absl::Now())) {
              alive = false;  // a protocol error
              break;
            }
            continue;
          }
          if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) alive = false;
          break;
        }
      }
      if (alive && state.HasOutput(fd)) {
        std::string& out = state.Output(fd);
        ssize_t w = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
        if (w > 0) {
          out.erase(0, static_cast<size_t>(w));
        } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          alive = false;
        }
      }
      if (!alive) dead.push_back(fd);
    }
    // Waiters whose deadline passed get a timeout answer.
    state.Expire(absl::Now());
    for (int fd : dead) {
      ::close(fd);
      std::erase(conns, fd);
      state.Close(fd);
    }
  }
  for (int fd : conns) ::close(fd);
}

// ---------------------------------------------------------------------------------------------------------
// Client

StatusOr<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(const std::string& host, int port,
                                                                  absl::Duration timeout) {
  const std::string endpoint = absl::StrCat(host, ":", port);
  const absl::Time deadline = timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  std::string last_error = "no attempt";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const std::string port_str = std::to_string(port);
    int rv = ::getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res);
    if (rv != 0) {
      last_error = absl::StrCat("getaddrinfo: ", ::gai_strerror(rv));
    } else {
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
          ::freeaddrinfo(res);
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          return std::unique_ptr<TcpStoreClient>(new TcpStoreClient(fd, endpoint, timeout));
        }
        last_error = absl::StrCat("connect: ", std::strerror(errno));
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("TCP store: could not connect to ", endpoint,
                                                      " (MASTER_ADDR:MASTER_PORT) within ",
                                                      absl::FormatDuration(timeout), ": ", last_error));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

TcpStoreClient::~TcpStoreClient() { ::close(fd_); }

StatusOr<std::pair<uint8_t, std::string>> TcpStoreClient::RoundTrip(uint8_t cmd, const std::string& key,
                                                                    const std::string& payload, absl::Duration bound) {
  const std::string req = EncodeStoreRequest(cmd, key, payload);
  absl::MutexLock lock(&mu_);
  // A request that got no answer leaves the connection's framing unknown: the client is unusable after it.
  if (!broken_.ok()) return broken_;
  const absl::Time deadline = bound >= absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + bound;
  auto fail = [&](const Status& s) {
    broken_ =
        absl::Status(absl::IsDeadlineExceeded(s) ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable,
                     absl::StrCat("TCP store ", endpoint_, ": ", s.message()));
    return broken_;
  };
  Status s = SendAll(fd_, req, deadline);
  char header[kStoreResponseHeader];
  if (s.ok()) s = RecvAll(fd_, header, sizeof(header), deadline);
  if (!s.ok()) return fail(s);
  uint8_t code = 0;
  uint64_t len = 0;
  if (!DecodeStoreResponseHeader(header, &code, &len)) {
    return absl::InternalError(absl::StrCat("TCP store ", endpoint_, ": bad response"));
  }
  std::string body(len, '\0');
  s = RecvAll(fd_, body.data(), len, deadline);
  if (!s.ok()) return fail(s);
  return std::make_pair(code, std::move(body));
}

Status TcpStoreClient::Set(const std::string& key, const std::string& value, absl::Duration limit) {
  ZERO_ASSIGN_OR_RETURN(auto r, RoundTrip(kStoreCmdSet, key, value, std::min(io_timeout_, limit)));
  if (r.first == kStoreCodeExists) {
    return absl::AlreadyExistsError(absl::StrCat("store key '", key, "' is already set"));
  }
  if (r.first != kStoreCodeOk) return absl::InternalError(absl::StrCat("TCP store: SET '", key, "' rejected"));
  return absl::OkStatus();
}

StatusOr<std::string> TcpStoreClient::Get(const std::string& key, absl::Duration timeout) {
  const int64_t ms = timeout == absl::InfiniteDuration() ? -1 : absl::ToInt64Milliseconds(timeout);
  // The server holds a Get up to `timeout`; the round trip may take that plus the store's own timeout.
  ZERO_ASSIGN_OR_RETURN(auto r, RoundTrip(kStoreCmdGet, key, StoreI64Payload(ms), io_timeout_ + timeout));
  if (r.first == kStoreCodeTimeout) {
    return absl::DeadlineExceededError(
        absl::StrCat("store key '", key, "' did not appear within ", absl::FormatDuration(timeout)));
  }
  if (r.first != kStoreCodeOk) return absl::InternalError(absl::StrCat("TCP store: GET '", key, "' rejected"));
  return std::move(r.second);
}

StatusOr<int64_t> TcpStoreClient::Add(const std::string& key, int64_t delta) {
  ZERO_ASSIGN_OR_RETURN(auto r, RoundTrip(kStoreCmdAdd, key, StoreI64Payload(delta), io_timeout_));
  if (r.first == kStoreCodeOverflow && r.second.size() == 8) {
    return absl::OutOfRangeError(absl::StrCat("store counter '", key, "' is ", StoreReadI64(r.second.data()),
                                              ": adding ", delta, " would overflow int64"));
  }
  if (r.first != kStoreCodeOk || r.second.size() != 8) {
    return absl::InternalError(absl::StrCat("TCP store: ADD '", key, "' rejected"));
  }
  return StoreReadI64(r.second.data());
}

}  // namespace zero::internal
