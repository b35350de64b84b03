// The emulated link latency of a parameter server: a thread between the ROUTER socket the workers
// reach and the server's loop, holding every message delay_s on its way in and again on its way out
// (the kernels here have no netem qdisc). The loop talks to inner(), a PAIR socket that carries the
// ROUTER's frames unchanged (identity frame first), so the server reads and replies as before.
//
// The thread only polls, stamps and forwards (ZeroMQ messages move, nothing is copied), so a message
// is stamped when it arrives, not when the loop gets to it: a push that reaches a busy server still
// leaves the delay line delay_s after it arrived, and waits for the loop as it would on a real link.
// A round trip therefore takes 2 x delay_s more, and every worker's messages the same: the
// order in which the shard applies pushes is what it would be at any uniform latency.
#pragma once
#include <memory>
#include <string>

#include <zmq.hpp>

namespace syncopate {

class ZmqDelayLine {
 public:
  // outer: the bound ROUTER; from here on only the delay line's thread touches it.
  ZmqDelayLine(zmq::context_t& ctx, zmq::socket_t& outer, double delay_s);
  ~ZmqDelayLine();  // stops the thread (messages still held are dropped, as a dying link would)
  ZmqDelayLine(const ZmqDelayLine&) = delete;
  ZmqDelayLine& operator=(const ZmqDelayLine&) = delete;
  // The loop's end: receive what arrived delay_s ago, send what leaves delay_s from now.
  zmq::socket_t& inner();
  // Rethrows what stopped the delay line's thread, if anything did (call it from the loop).
  void check() const;
  // Before the server exits: waits (at most max_wait_s) until every message the loop sent has left
  // the delay line, and lets the ROUTER linger so that ZeroMQ sends them (FINISH's and SHUTDOWN's
  // replies are the last a server sends).
  void flush(double max_wait_s);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace syncopate
