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
// an inproc PAIR socket; one thread at a time calls failing(), often enough that events do not pile up.
// The events cannot say why a handshake failed on the client's side (a server that cannot decrypt a
// HELLO closes the connection like a proxy in front of a stopped server): see zmtp_greeting.h.
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
  // Stops the monitor (call it on the thread that owns the watched socket, before this watch goes):
  // libzmq sends monitor events with a blocking send, so a watch nobody reads any more would stall
  // ZeroMQ's I/O thread once its queue (about 2000 events) is full. Not done by the destructor, which
  // may run where another thread owns the socket (the server's delay line); without stop() the
  // monitor ends with the watched socket.
  void stop();
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
  zmq::socket_t* watched_;
  zmq::socket_t pair_;
  int64_t streak_ = 0;
  int64_t failures_ = 0, successes_ = 0;
  std::string last_;
};

}  // namespace syncopate
