#include "server/handshake_watch.h"

#include <cstring>

#include <fmt/format.h>
#include <zmq_addon.hpp>

#include "common/check.h"

namespace syncopate {
namespace {

constexpr int kEvents = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                        ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;

std::string describe(uint16_t event, uint32_t value) {
  switch (event) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
        return "a message of the handshake could not be decrypted (other keys)";
      if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
        return "one side encrypts (CURVE) and the other does not";
      return fmt::format("a protocol error in the handshake (ZeroMQ code 0x{:x})", value);
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      return fmt::format("the peer refused this side's credentials (status {})", value);
    default:
      return "the peer closed the connection during the handshake";
  }
}

}  // namespace

HandshakeWatch::HandshakeWatch(zmq::context_t& ctx, zmq::socket_t& watched, const std::string& name)
    : watched_(&watched), pair_(ctx, zmq::socket_type::pair) {
  const std::string ep = "inproc://handshake-watch-" + name;
  SYN_CHECK(zmq_socket_monitor(watched.handle(), ep.c_str(), kEvents) == 0,
            fmt::format("cannot monitor a socket ({})", zmq_strerror(zmq_errno())), "check the libzmq installation (4.3 or newer)");
  pair_.set(zmq::sockopt::linger, 0);
  pair_.connect(ep);
}

void HandshakeWatch::stop() {
  if (watched_ != nullptr && watched_->handle() != nullptr) zmq_socket_monitor(watched_->handle(), nullptr, 0);
  watched_ = nullptr;
}

int64_t HandshakeWatch::failing() {
  for (;;) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(pair_, std::back_inserter(frames), zmq::recv_flags::dontwait)) break;
    if (frames.size() < 2 || frames[0].size() < 6) continue;
    uint16_t event = 0;
    uint32_t value = 0;
    std::memcpy(&event, frames[0].data(), 2);
    std::memcpy(&value, static_cast<const char*>(frames[0].data()) + 2, 4);
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      ++successes_;
      streak_ = 0;
    } else {
      ++failures_;
      ++streak_;
      last_ = describe(event, value);
    }
  }
  return streak_;
}

}  // namespace syncopate
