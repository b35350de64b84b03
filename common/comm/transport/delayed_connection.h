// A delay line in front of a connection's receiving side: every byte becomes readable delay_s after
// it arrived, so each message this end receives takes a propagation latency on top of the link's own
// (the emulated cluster's latency: the kernel here has no netem qdisc). A reader thread takes bytes
// from the wrapped connection as they arrive and stamps them, so the delay is paid once per message
// and overlaps across pipelined messages, as on a long link: a ring all-reduce of 2(n-1) hops pays
// 2(n-1) x delay_s however many segments each hop carries. Sending is the wrapped connection's.
//
// The reader buffers at most max_buffered bytes ahead of the consumer (beyond that, TCP's own
// back-pressure applies). A wrapped connection that fails (peer closed, died) fails recv once the
// bytes that arrived before it have been read.
#pragma once
#include <memory>

#include "common/comm/transport/connection.h"

namespace syncopate {

class DelayedConnection : public Connection {
 public:
  // timeout_s: recv's bound on waiting for bytes that never arrive (the transport's timeout).
  DelayedConnection(std::unique_ptr<Connection> inner, double delay_s, double timeout_s,
                    size_t max_buffered = size_t{64} << 20);
  ~DelayedConnection() override;
  void send(const void* data, size_t n) override;
  void recv(void* data, size_t n) override;
  size_t recv_some(void* data, size_t max, double wait_s) override;
  std::string peer() const override;
  void shutdown() override;

 private:
  struct State;
  std::unique_ptr<Connection> inner_;
  std::unique_ptr<State> state_;
};

}  // namespace syncopate
