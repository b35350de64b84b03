// Watches one ZeroMQ socket's connection handshakes (CurveZMQ, or the plain ZMTP greeting), so that
// a handshake that fails is named at once instead of surfacing as a silence.
//
// A client of another job (a different SYNCOPATE_TOKEN, so other token-derived CURVE keys), a plain
// client of an encrypted server or an encrypted client of a plain one never completes the handshake:
// ZeroMQ drops the connection and retries it, and no request ever reaches the other side. On the
// client that looked like a server that does not answer, for dist.timeout_s. With a watch, the
// client sees "handshake failed" within a reconnect interval and refuses by name; the server logs
// it (rate-limited) and serves its own job's workers as before.
//
// It is libzmq's socket monitor (zmq_socket_monitor, version 1 events) read without blocking from
// an inproc PAIR socket; one thread at a time calls failing().
#pragma once
#include <cstdint>
#include <string>

#include <zmq.hpp>

namespace syncopate {

class HandshakeWatch {
 public:
  // Starts monitoring `watched` (before it connects or binds, so that no event is missed); `name`
  // makes the inproc endpoint unique within the context.
  HandshakeWatch(zmq::context_t& ctx, zmq::socket_t& watched, const std::string& name);
  // (The monitor itself ends with the watched socket: ZeroMQ owns it, and stopping it from here
  // would touch a socket that another thread may own by then, e.g. the server's delay line.)
  HandshakeWatch(const HandshakeWatch&) = delete;
  HandshakeWatch& operator=(const HandshakeWatch&) = delete;

  // Reads the events that arrived (never blocks) and returns the handshakes failed in a row since
  // the last one that succeeded. One failure can be a peer that died mid-handshake; a client that
  // fails again at each reconnect (every 100 ms) is talking to another job.
  int64_t failing();
  int64_t failures() const { return failures_; }     // handshakes failed so far
  int64_t successes() const { return successes_; }   // handshakes completed so far
  const std::string& last_failure() const { return last_; }  // e.g. "the peer closed the connection during the handshake"
  // The monitor's socket, to wait on with zmq::poll beside the watched one.
  zmq::socket_t& events() { return pair_; }

 private:
  zmq::socket_t pair_;
  int64_t streak_ = 0;
  int64_t failures_ = 0, successes_ = 0;
  std::string last_;
};

}  // namespace syncopate
