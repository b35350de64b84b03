// TCP transport over Boost.Asio (blocking sockets with kernel timeouts): connections, a listener,
// and the job handshake every connection starts with (magic, protocol version, job-token digest,
// ranks), so that a process of another job or a stray client is refused at once.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "common/comm/transport/connection.h"

namespace syncopate {

namespace asio = boost::asio;

// Bounds every blocking send/recv on the socket by timeout_s (SO_SNDTIMEO/SO_RCVTIMEO); sets TCP_NODELAY.
void set_socket_timeouts(asio::ip::tcp::socket& s, double timeout_s);



class TcpConnection : public Connection {
 public:
  // timeout_s bounds every blocking send/recv (SO_SNDTIMEO/SO_RCVTIMEO): a peer that hangs
  // becomes an error after that long.
  TcpConnection(asio::ip::tcp::socket socket, std::string peer_name, double timeout_s);
  void send(const void* data, size_t n) override;
  void recv(void* data, size_t n) override;
  size_t recv_some(void* data, size_t max, double wait_s) override;
  std::string peer() const override { return peer_; }
  void shutdown() override;
  asio::ip::tcp::socket& socket() { return socket_; }

 private:
  void transfer(char* p, size_t n, bool sending);  // poll + send/recv until n bytes moved, or throw
  [[noreturn]] void fail(bool sending, bool timeout, bool closed) const;
  asio::ip::tcp::socket socket_;
  std::string peer_;
  double timeout_s_;
};

// A listening socket on host:port (port 0 = ephemeral; see port()).
class TcpListener {
 public:
  TcpListener(asio::io_context& io, const std::string& host, uint16_t port);
  uint16_t port() const;
  // Accepts one connection within timeout_s, or throws syncopate::Error saying what was awaited.
  asio::ip::tcp::socket accept(double timeout_s, const std::string& awaiting);

 private:
  asio::ip::tcp::acceptor acceptor_;
  std::string where_;
};

// Connects to host:port, retrying until timeout_s (the peer may not be listening yet).
asio::ip::tcp::socket tcp_connect(asio::io_context& io, const std::string& host, uint16_t port, double timeout_s,
                                  const std::string& what);


}  // namespace syncopate
