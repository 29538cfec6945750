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
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "zero/logging.h"

namespace zero::internal {
namespace {

constexpr uint8_t kCmdSet = 1;
constexpr uint8_t kCmdGet = 2;
constexpr uint8_t kCmdAdd = 3;
constexpr uint8_t kCodeOk = 0;
constexpr uint8_t kCodeExists = 1;
constexpr uint8_t kCodeTimeout = 2;
constexpr uint8_t kCodeBadRequest = 3;
// A request larger than this is a protocol error (a stray client), not a value anyone stores.
constexpr uint64_t kMaxMessage = uint64_t{1} << 30;

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

std::string Response(uint8_t code, const std::string& payload) {
  std::string r;
  r.push_back(static_cast<char>(code));
  AppendU64(&r, payload.size());
  r += payload;
  return r;
}

std::string I64Payload(int64_t v) {
  std::string s;
  AppendU64(&s, static_cast<uint64_t>(v));
  return s;
}

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
    return absl::UnavailableError(
        absl::StrCat("TCP store: cannot listen on port ", port, " (MASTER_PORT): ", std::strerror(err)));
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
  struct Conn {
    int fd;
    std::string in;
    std::string out;
  };
  struct Waiter {
    int fd;
    std::string key;
    absl::Time deadline;  // InfiniteFuture when the client gave no timeout
  };
  std::vector<Conn> conns;
  std::vector<Waiter> waiters;
  std::map<std::string, std::string> values;
  std::map<std::string, int64_t> counters;

  auto conn_of = [&](int fd) -> Conn* {
    for (auto& c : conns) {
      if (c.fd == fd) return &c;
    }
    return nullptr;
  };
  auto answer_waiters = [&](const std::string& key, const std::string& value) {
    for (auto it = waiters.begin(); it != waiters.end();) {
      if (it->key == key) {
        if (Conn* c = conn_of(it->fd)) c->out += Response(kCodeOk, value);
        it = waiters.erase(it);
      } else {
        ++it;
      }
    }
  };
  // Handles every complete request in c.in; returns false on a protocol error (the connection is dropped).
  auto handle = [&](Conn& c) -> bool {
    for (;;) {
      if (c.in.size() < 5) return true;
      const uint32_t key_len = ReadU32(c.in.data() + 1);
      if (key_len > kMaxMessage) return false;
      if (c.in.size() < 5 + key_len + 8) return true;
      const uint64_t payload_len = ReadU64(c.in.data() + 5 + key_len);
      if (payload_len > kMaxMessage) return false;
      const size_t total = 5 + key_len + 8 + payload_len;
      if (c.in.size() < total) return true;
      const uint8_t cmd = static_cast<uint8_t>(c.in[0]);
      std::string key = c.in.substr(5, key_len);
      std::string payload = c.in.substr(5 + key_len + 8, payload_len);
      c.in.erase(0, total);
      if (cmd == kCmdSet) {
        if (values.count(key) != 0) {
          c.out += Response(kCodeExists, "");
        } else {
          values[key] = payload;
          c.out += Response(kCodeOk, "");
          answer_waiters(key, payload);
        }
      } else if (cmd == kCmdGet && payload.size() == 8) {
        auto it = values.find(key);
        const int64_t timeout_ms = static_cast<int64_t>(ReadU64(payload.data()));
        if (it != values.end()) {
          c.out += Response(kCodeOk, it->second);
        } else if (timeout_ms == 0) {
          c.out += Response(kCodeTimeout, "");
        } else {
          waiters.push_back(
              {c.fd, key, timeout_ms < 0 ? absl::InfiniteFuture() : absl::Now() + absl::Milliseconds(timeout_ms)});
        }
      } else if (cmd == kCmdAdd && payload.size() == 8) {
        const int64_t v = counters[key] += static_cast<int64_t>(ReadU64(payload.data()));
        c.out += Response(kCodeOk, I64Payload(v));
      } else {
        c.out += Response(kCodeBadRequest, "");
      }
    }
  };

  for (;;) {
    std::vector<pollfd> fds;
    fds.push_back({wake_read_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const auto& c : conns) {
      fds.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
    }
    absl::Time next_deadline = absl::InfiniteFuture();
    for (const auto& w : waiters) next_deadline = std::min(next_deadline, w.deadline);
    int poll_ms = -1;
    if (next_deadline != absl::InfiniteFuture()) {
      poll_ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(next_deadline - absl::Now()) + 1));
    }
    int n = ::poll(fds.data(), fds.size(), poll_ms);
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
        conns.push_back({cfd, "", ""});
      }
    }
    std::vector<int> dead;
    for (size_t i = 2; i < fds.size(); ++i) {
      Conn* c = conn_of(fds[i].fd);
      if (c == nullptr) continue;
      bool alive = true;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[65536];
        for (;;) {
          ssize_t r = ::recv(c->fd, buf, sizeof(buf), 0);
          if (r > 0) {
            c->in.append(buf, static_cast<size_t>(r));
            continue;
          }
          if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) alive = false;
          break;
        }
        if (alive) alive = handle(*c);
      }
      if (alive && !c->out.empty()) {
        ssize_t w = ::send(c->fd, c->out.data(), c->out.size(), MSG_NOSIGNAL);
        if (w > 0) {
          c->out.erase(0, static_cast<size_t>(w));
        } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          alive = false;
        }
      }
      if (!alive) dead.push_back(c->fd);
    }
    // Waiters whose deadline passed get a timeout answer.
    const absl::Time now = absl::Now();
    for (auto it = waiters.begin(); it != waiters.end();) {
      if (it->deadline <= now) {
        if (Conn* c = conn_of(it->fd)) c->out += Response(kCodeTimeout, "");
        it = waiters.erase(it);
      } else {
        ++it;
      }
    }
    for (int fd : dead) {
      ::close(fd);
      std::erase_if(conns, [fd](const Conn& c) { return c.fd == fd; });
      std::erase_if(waiters, [fd](const Waiter& w) { return w.fd == fd; });
    }
  }
  for (auto& c : conns) ::close(c.fd);
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
  std::string req;
  req.push_back(static_cast<char>(cmd));
  AppendU32(&req, static_cast<uint32_t>(key.size()));
  req += key;
  AppendU64(&req, payload.size());
  req += payload;
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
  char header[9];
  if (s.ok()) s = RecvAll(fd_, header, sizeof(header), deadline);
  if (!s.ok()) return fail(s);
  const uint64_t len = ReadU64(header + 1);
  if (len > kMaxMessage) return absl::InternalError(absl::StrCat("TCP store ", endpoint_, ": bad response"));
  std::string body(len, '\0');
  s = RecvAll(fd_, body.data(), len, deadline);
  if (!s.ok()) return fail(s);
  return std::make_pair(static_cast<uint8_t>(header[0]), std::move(body));
}

Status TcpStoreClient::Set(const std::string& key, const std::string& value, absl::Duration limit) {
  ZERO_ASSIGN_OR_RETURN(auto r, RoundTrip(kCmdSet, key, value, std::min(io_timeout_, limit)));
  if (r.first == kCodeExists) return absl::AlreadyExistsError(absl::StrCat("store key '", key, "' is already set"));
  if (r.first != kCodeOk) return absl::InternalError(absl::StrCat("TCP store: SET '", key, "' rejected"));
  return absl::OkStatus();
}

StatusOr<std::string> TcpStoreClient::Get(const std::string& key, absl::Duration timeout) {
  const int64_t ms = timeout == absl::InfiniteDuration() ? -1 : absl::ToInt64Milliseconds(timeout);
  // The server holds a Get up to `timeout`; the round trip may take that plus the store's own timeout.
  ZERO_ASSIGN_OR_RETURN(auto r, RoundTrip(kCmdGet, key, I64Payload(ms), io_timeout_ + timeout));
  if (r.first == kCodeTimeout) {
    return absl::DeadlineExceededError(
        absl::StrCat("store key '", key, "' did not appear within ", absl::FormatDuration(timeout)));
  }
  if (r.first != kCodeOk) return absl::InternalError(absl::StrCat("TCP store: GET '", key, "' rejected"));
  return std::move(r.second);
}

StatusOr<int64_t> TcpStoreClient::Add(const std::string& key, int64_t delta) {
  ZERO_ASSIGN_OR_RETURN(auto r, RoundTrip(kCmdAdd, key, I64Payload(delta), io_timeout_));
  if (r.first != kCodeOk || r.second.size() != 8) {
    return absl::InternalError(absl::StrCat("TCP store: ADD '", key, "' rejected"));
  }
  return static_cast<int64_t>(ReadU64(r.second.data()));
}

}  // namespace zero::internal
