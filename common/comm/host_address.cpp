#include "common/comm/host_address.h"

#include <utility>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <fmt/format.h>

#include "common/check.h"

namespace asio = boost::asio;

namespace syncopate {

std::string numeric_address(const std::string& host, const std::string& what) {
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(host, ec);
  if (!ec) return addr.to_string();
  asio::io_context io;
  asio::ip::tcp::resolver resolver(io);
  const auto found = resolver.resolve(asio::ip::tcp::v4(), host, "", ec);
  SYN_CHECK(!ec && !found.empty(),
            fmt::format("'{}' is neither an IP address nor a host name that resolves to one{}", host,
                        what.empty() ? "" : " (" + what + ")"),
            "use a numeric address such as 10.0.0.1, or a name this host resolves (getent hosts NAME)");
  return found.begin()->endpoint().address().to_string();
}

std::string local_address_towards(const std::string& host) {
  asio::io_context io;
  asio::ip::udp::socket s(io);
  boost::system::error_code ec;
  const asio::ip::udp::endpoint to(asio::ip::make_address(numeric_address(host)), 9);  // (discard; nothing is sent)
  s.open(to.protocol(), ec);
  if (!ec) s.connect(to, ec);
  SYN_CHECK(!ec, fmt::format("no route from this host to {} ({})", host, ec.message()),
            "check MASTER_ADDR and this host's routes (ip route get ADDRESS)");
  return s.local_endpoint().address().to_string();
}

namespace {

// Where the host begins (after "SCHEME://") and the colon before the port (npos where there is none).
std::pair<size_t, size_t> host_and_port_at(const std::string& endpoint) {
  const size_t scheme = endpoint.find("://");
  const size_t begin = scheme == std::string::npos ? 0 : scheme + 3;
  const size_t colon = endpoint.rfind(':');
  return {begin, colon == std::string::npos || colon < begin ? std::string::npos : colon};
}

}  // namespace

std::string endpoint_host(const std::string& endpoint) {
  const auto [begin, colon] = host_and_port_at(endpoint);
  if (colon == std::string::npos) return endpoint.substr(begin);
  std::string h = endpoint.substr(begin, colon - begin);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  return h;
}

std::string endpoint_port(const std::string& endpoint) {
  const size_t colon = host_and_port_at(endpoint).second;
  return colon == std::string::npos ? "" : endpoint.substr(colon + 1);
}

}  // namespace syncopate
