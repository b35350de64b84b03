// A reliable, ordered byte stream to one peer: all that the collective algorithms see of the
// network. Transports: memory (threads in one process, for tests) and tcp (Boost.Asio).
#pragma once
#include <cstddef>
#include <string>

namespace syncopate {

class Connection {
 public:
  virtual ~Connection() = default;
  // Blocks until all n bytes are handed to the transport (the buffer may be reused afterwards).
  // Throws syncopate::Error naming the peer if it is gone or stalls past the transport's timeout.
  virtual void send(const void* data, size_t n) = 0;
  // Blocks until exactly n bytes have arrived. Throws syncopate::Error naming the peer if it closed
  // the connection, died, or sent nothing within the transport's timeout.
  virtual void recv(void* data, size_t n) = 0;
  // Waits up to wait_s for at least one byte and takes what has arrived, at most max bytes; returns
  // how many (0: nothing within wait_s, which is not an error). Throws as recv does when the peer
  // closed the connection or died. What a reader thread uses (DelayedConnection); the base class
  // refuses it, naming the transport.
  virtual size_t recv_some(void* data, size_t max, double wait_s);
  // Who is at the other end, for error messages ("node 2 at 10.0.0.3:29501").
  virtual std::string peer() const = 0;
  // Ends the connection from any thread: a send/recv blocked on it (in another thread) fails at
  // once, so does every later one, and the peer sees the connection closed. Used to stop a
  // node's collectives promptly when one of its replicas failed.
  virtual void shutdown() = 0;
};

}  // namespace syncopate
