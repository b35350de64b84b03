// Several connections to one peer used as one: a message of n bytes is cut into k contiguous
// stripes, stripe i travelling on connection i, all k in parallel (each on its own thread), so
// that one TCP stream's window or one core's copy loop does not cap a fast link. The cut depends
// only on n and k, so both ends agree without a header; messages shorter than 2 x min_stripe go
// whole over the first connection. Both ends must use the same k (the rendezvous checks it).
#pragma once
#include <memory>
#include <vector>

#include "common/comm/transport/connection.h"

namespace syncopate {

class StripedConnection : public Connection {
 public:
  explicit StripedConnection(std::vector<std::unique_ptr<Connection>> links, size_t min_stripe = 64 << 10);
  ~StripedConnection() override;
  void send(const void* data, size_t n) override;
  void recv(void* data, size_t n) override;
  void shutdown() override;
  std::string peer() const override;

 private:
  struct Lanes;                    // one worker thread per extra link and direction
  std::vector<std::unique_ptr<Connection>> links_;
  size_t min_stripe_;
  std::unique_ptr<Lanes> send_lanes_, recv_lanes_;
};

}  // namespace syncopate
