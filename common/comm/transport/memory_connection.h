// In-process transport: a bounded byte channel between threads. Lets tests run the collective
// algorithms with ranks as threads, and the same algorithm code then runs over TCP.
#pragma once
#include <memory>
#include <utility>

#include "common/comm/transport/connection.h"

namespace syncopate {

// Returns the two ends of a one-way channel: `first` may only send, `second` may only receive.
// capacity_bytes bounds what is in flight, so a slow receiver applies back-pressure like a socket.
std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> memory_channel(
    size_t capacity_bytes = 1 << 20, const std::string& name = "memory channel");

}  // namespace syncopate
