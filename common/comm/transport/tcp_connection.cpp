#include "common/comm/transport/tcp_connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "common/check.h"
#include "common/comm/host_address.h"

namespace syncopate {
void set_socket_timeouts(asio::ip::tcp::socket& s, double timeout_s) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout_s);
  tv.tv_usec = static_cast<suseconds_t>((timeout_s - static_cast<double>(tv.tv_sec)) * 1e6);
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  s.set_option(asio::ip::tcp::no_delay(true));
}


TcpConnection::TcpConnection(asio::ip::tcp::socket socket, std::string peer_name, double timeout_s)
    : socket_(std::move(socket)), peer_(std::move(peer_name)), timeout_s_(timeout_s) {
  set_socket_timeouts(socket_, timeout_s_);
}

// Raw syscalls with poll() deadlines: Asio's blocking read/write retry on EAGAIN forever, which
// would defeat the timeout that turns a hung peer into an error.
namespace {
enum class IoResult { kOk, kTimeout, kClosed, kError };
IoResult wait_ready(int fd, short events, double timeout_s) {
  pollfd p{fd, events, 0};
  for (;;) {
    int r = ::poll(&p, 1, static_cast<int>(timeout_s * 1000));
    if (r > 0) return IoResult::kOk;
    if (r == 0) return IoResult::kTimeout;
    if (errno != EINTR) return IoResult::kError;
  }
}
}  // namespace

void TcpConnection::transfer(char* p, size_t n, bool sending) {
  const int fd = socket_.native_handle();
  while (n > 0) {
    IoResult r = wait_ready(fd, sending ? POLLOUT : POLLIN, timeout_s_);
    ssize_t k = r != IoResult::kOk ? -1 : sending ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && r == IoResult::kOk && (errno == EINTR || errno == EAGAIN)) continue;
    fail(sending, r == IoResult::kTimeout, k == 0);
  }
}

void TcpConnection::fail(bool sending, bool timeout, bool closed) const {
  const std::string why = timeout ? fmt::format("{} for {} s", sending ? "no progress" : "nothing arrived", timeout_s_)
                          : closed ? std::string("the connection was closed")
                                   : std::string(std::strerror(errno));
  SYN_FAIL(fmt::format("{} {} failed: {}", sending ? "sending to" : "receiving from", peer_, why),
           timeout ? "the peer is hung or too slow; check its log or raise dist.timeout_s"
                   : "the peer died; check its log, then relaunch (with --resume)");
}

size_t TcpConnection::recv_some(void* data, size_t max, double wait_s) {
  if (max == 0) return 0;
  const int fd = socket_.native_handle();
  IoResult r = wait_ready(fd, POLLIN, wait_s);
  if (r == IoResult::kTimeout) return 0;
  ssize_t k = r != IoResult::kOk ? -1 : ::recv(fd, data, max, 0);
  if (k > 0) return static_cast<size_t>(k);
  if (k < 0 && r == IoResult::kOk && (errno == EINTR || errno == EAGAIN)) return 0;
  fail(false, false, k == 0);
}

// A plain syscall on the descriptor, not Asio's socket object (not safe to share across threads):
// poll() in a blocked transfer wakes with the connection ended.
void TcpConnection::shutdown() { ::shutdown(socket_.native_handle(), SHUT_RDWR); }

void TcpConnection::send(const void* data, size_t n) { transfer(static_cast<char*>(const_cast<void*>(data)), n, true); }
void TcpConnection::recv(void* data, size_t n) { transfer(static_cast<char*>(data), n, false); }

namespace {
// A numeric address as it is, or a host name's IPv4 address (Slurm's node list and MASTER_ADDR
// often name hosts); a name that resolves to nothing is an error naming it and `what` it was for.
asio::ip::address address_of(const std::string& host, const std::string& what) {
  return asio::ip::make_address(numeric_address(host, what));
}
}  // namespace

TcpListener::TcpListener(asio::io_context& io, const std::string& host, uint16_t port) : acceptor_(io) {
  where_ = fmt::format("{}:{}", host, port);
  boost::system::error_code ec;
  const auto addr = address_of(host, "to listen on");
  if (addr.to_string() != host) where_ = fmt::format("{} ({}):{}", host, addr.to_string(), port);
  asio::ip::tcp::endpoint ep(addr, port);
  acceptor_.open(ep.protocol());
  acceptor_.set_option(asio::socket_base::reuse_address(true));
  acceptor_.bind(ep, ec);
  SYN_CHECK(!ec, fmt::format("cannot listen on {}: {}", where_, ec.message()),
            ec == asio::error::address_in_use ? "the port is in use: pick another MASTER_PORT / --port, or stop the old job"
                                              : "check the address belongs to this machine");
  acceptor_.listen();
  acceptor_.non_blocking(true);
  where_ = fmt::format("{}:{}", host, this->port());
}

uint16_t TcpListener::port() const { return acceptor_.local_endpoint().port(); }

asio::ip::tcp::socket TcpListener::accept(double timeout_s, const std::string& awaiting) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    boost::system::error_code ec;
    asio::ip::tcp::socket s = acceptor_.accept(ec);
    if (!ec) {
      s.non_blocking(false);
      return s;
    }
    SYN_CHECK(ec == asio::error::would_block || ec == asio::error::try_again,
              fmt::format("accept on {} failed: {}", where_, ec.message()), "check the network configuration");
    SYN_CHECK(std::chrono::steady_clock::now() < deadline,
              fmt::format("{} did not connect to {} within {} s", awaiting, where_, timeout_s),
              "start every node (same MASTER_ADDR/MASTER_PORT/NNODES), or raise dist.timeout_s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

namespace {
// One connect attempt that gives up at `deadline`: a blocking connect() to a host whose firewall
// drops the SYN waits for the kernel's retries (about two minutes), far past dist.timeout_s.
template <class TimePoint>
void connect_before(asio::ip::tcp::socket& s, const asio::ip::tcp::endpoint& to, TimePoint deadline,
                    boost::system::error_code& ec) {
  s.open(to.protocol(), ec);
  if (ec) return;
  s.non_blocking(true, ec);
  if (ec) return;
  if (::connect(s.native_handle(), to.data(), static_cast<socklen_t>(to.size())) != 0)
    ec = boost::system::error_code(errno, boost::system::system_category());
  if (ec.value() == EINPROGRESS) {
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    pollfd p{s.native_handle(), POLLOUT, 0};
    int r;
    do r = ::poll(&p, 1, static_cast<int>(std::max(left, 0.0) * 1000) + 1);
    while (r < 0 && errno == EINTR);
    if (r <= 0) {
      ec = asio::error::timed_out;
    } else {
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(s.native_handle(), SOL_SOCKET, SO_ERROR, &err, &len);
      ec = err ? boost::system::error_code(err, boost::system::system_category()) : boost::system::error_code();
    }
  }
  if (!ec) s.non_blocking(false, ec);
  if (ec) {
    boost::system::error_code ignored;
    s.close(ignored);
  }
}
}  // namespace

asio::ip::tcp::socket tcp_connect(asio::io_context& io, const std::string& host, uint16_t port, double timeout_s,
                                  const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  boost::system::error_code ec;
  const auto addr = address_of(host, what);
  for (;;) {
    asio::ip::tcp::socket s(io);
    connect_before(s, {addr, port}, deadline, ec);
    if (!ec) return s;
    SYN_CHECK(std::chrono::steady_clock::now() < deadline,
              fmt::format("could not reach {} at {}:{} within {} s: {}", what, host, port, timeout_s, ec.message()),
              "start that node first, check MASTER_ADDR/MASTER_PORT and firewalls, or raise dist.timeout_s");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace syncopate
