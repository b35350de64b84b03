#include "server/ps_protocol.h"

#include <fmt/format.h>

#include "common/check.h"
#include "common/fnv1a.h"

namespace syncopate {

uint64_t token_digest(const std::string& token) { return fnv1a64(token); }

std::string encode_header(const MsgHeader& h) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, h);
  return std::string(buf.data(), buf.size());
}

MsgHeader decode_reply(const void* data, size_t n) { return decode_header(data, n, kMaxReplyHeaderBytes); }

MsgHeader decode_header(const void* data, size_t n, size_t limit) {
  SYN_CHECK(n > 0 && n <= limit, fmt::format("message header of {} bytes (limit {})", n, limit),
            "the peer is not a Syncopate worker of this version");
  const size_t str_limit = limit == kMaxHeaderBytes ? 2048 : limit;
  MsgHeader h;
  try {
    // Tight limits: a hostile frame cannot make the decoder allocate much.
    msgpack::object_handle oh = msgpack::unpack(static_cast<const char*>(data), n, nullptr, nullptr,
                                                msgpack::unpack_limit(64, 64, str_limit, 256, 256, 4));
    SYN_CHECK(oh.get().type == msgpack::type::MAP, "message header is not a msgpack map", "the peer is not a Syncopate worker");
    oh.get().convert(h);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    SYN_FAIL(fmt::format("malformed message header: {}", e.what()), "the peer is not a Syncopate worker of this version");
  }
  SYN_CHECK(h.version == kPsProtocolVersion, fmt::format("protocol version {} (server speaks {})", h.version, kPsProtocolVersion),
            "run the same Syncopate build on workers and servers");
  const bool known = (h.type >= 1 && h.type <= 7) || h.type == 100 || h.type == 101;
  SYN_CHECK(known, fmt::format("unknown message type {}", h.type), "the peer is not a Syncopate worker of this version");
  SYN_CHECK(h.offset >= 0 && h.length >= 0 && h.length <= (int64_t{1} << 36),
            fmt::format("bad range offset={} length={}", h.offset, h.length), "the peer sent a corrupt header");
  SYN_CHECK(h.join >= 0 && h.join <= 2 && h.samples >= 0 && h.samples <= (int64_t{1} << 40),
            fmt::format("bad elastic fields join={} samples={}", h.join, h.samples), "the peer sent a corrupt header");
  SYN_CHECK(h.adam_steps >= 0 && h.adam_steps <= (int64_t{1} << 50), fmt::format("bad adam_steps={}", h.adam_steps),
            "the peer sent a corrupt header");
  return h;
}

}  // namespace syncopate
