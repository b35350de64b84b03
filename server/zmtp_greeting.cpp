#include "server/zmtp_greeting.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/comm/host_address.h"

namespace syncopate {
namespace {

// A file descriptor closed on every path.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

bool wait_for(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return (p.revents & (events | POLLHUP | POLLERR)) != 0;
    if (r == 0 || errno != EINTR) return false;
  }
}

}  // namespace

std::optional<std::string> zmtp_mechanism(const std::string& endpoint, double timeout_s) {
  const std::string host = endpoint_host(endpoint), port = endpoint_port(endpoint);
  if (port.empty()) return std::nullopt;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) return std::nullopt;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  Fd s;
  s.fd = ::socket(res->ai_family, res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, res->ai_protocol);
  const int rc = s.fd < 0 ? -1 : ::connect(s.fd, res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  if (s.fd < 0 || (rc != 0 && errno != EINPROGRESS)) return std::nullopt;
  if (rc != 0) {
    if (!wait_for(s.fd, POLLOUT, deadline)) return std::nullopt;
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) return std::nullopt;
  }
  // Our signature (0xFF, 8 bytes, 0x7F) and major version 3: the server answers with its 64 bytes.
  const unsigned char hello[11] = {0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F, 3};
  if (::send(s.fd, hello, sizeof(hello), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(hello))) return std::nullopt;
  unsigned char g[64];
  size_t got = 0;
  while (got < sizeof(g)) {
    if (!wait_for(s.fd, POLLIN, deadline)) return std::nullopt;
    const ssize_t n = ::recv(s.fd, g + got, sizeof(g) - got, 0);
    if (n <= 0) {
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      return std::nullopt;
    }
    got += static_cast<size_t>(n);
  }
  if (g[0] != 0xFF || g[9] != 0x7F || g[10] < 3) return std::nullopt;  // not a ZMTP 3.x greeting
  std::string mech(reinterpret_cast<const char*>(g + 12), 20);
  mech.erase(mech.find_last_not_of('\0') + 1);
  return mech;
}

}  // namespace syncopate
