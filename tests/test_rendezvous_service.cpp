// syncopate-rendezvous (common/comm/rendezvous_service.h) as a real process under hostile input:
// resets before the first byte, garbage, silence, a megabyte without a newline, more connections
// than it serves at once, and, after a correct challenge-response, malformed and out-of-range
// hellos. It must keep serving: a real node's session then forms an epoch, and with
// --exit-when-done the service ends by itself (exit 0) once that node finished and left.
#include <sys/socket.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/comm/json_lines.h"
#include "common/comm/peer_auth.h"
#include "common/comm/rendezvous_session.h"
#include "common/comm/transport/tcp_connection.h"
#include "test_helpers.h"

namespace syncopate {
namespace {

uint16_t read_port(const std::string& file) { return static_cast<uint16_t>(std::stoi(test::slurp(file))); }

// An authenticated connection that then says `line` (raw bytes, a newline appended); returns what
// the service answered (empty: it closed the connection).
std::string authenticated_then(asio::io_context& io, uint16_t port, int node, const std::string& line) {
  TcpConnection c(tcp_connect(io, "127.0.0.1", port, 10, "the service"), "the service", 10);
  authenticate_peer(c, job_key("t"), node, 0);
  const std::string bytes = line + "\n";
  c.send(bytes.data(), bytes.size());
  try {
    return read_json_line(c).dump();
  } catch (const std::exception&) {
    return "";
  }
}

TEST(RendezvousService, HostileInputNeverStopsItAndItEndsWhenTheJobIsDone) {
  test::TempDir d;
  const std::string port_file = d.str("port"), log = d.str("rendezvous.log");
  test::Process service({test::bin_dir() + "/syncopate-rendezvous", "--port", "-1", "--port-file", port_file,
                         "--exit-when-done"},
                        {"SYNCOPATE_TOKEN=t"}, log);
  test::wait_for_line(port_file, 30, &service);
  const uint16_t port = read_port(port_file);
  asio::io_context io;
  // Resets before the first byte (accept() returns a socket whose peer is gone).
  for (int i = 0; i < 20; ++i) {
    asio::ip::tcp::socket s = tcp_connect(io, "127.0.0.1", port, 10, "the service");
    s.set_option(asio::socket_base::linger(true, 0));
    s.close();
  }
  // Garbage, a megabyte without a newline, silence: each ends its own connection.
  {
    asio::ip::tcp::socket g = tcp_connect(io, "127.0.0.1", port, 10, "the service");
    const std::string junk(1 << 20, 'x');
    // (the service may close it before all of it is written: a short or failed send is fine)
    (void)::send(g.native_handle(), junk.data(), junk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    asio::ip::tcp::socket quiet = tcp_connect(io, "127.0.0.1", port, 10, "the service");
  }
  // More connections than it serves at once (256): the rest are closed on arrival.
  {
    std::vector<asio::ip::tcp::socket> many;
    for (int i = 0; i < 300; ++i) many.push_back(tcp_connect(io, "127.0.0.1", port, 10, "the service"));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // their sessions' threads end
  // The token proven, then: not JSON, not an object, wrong types, a rank other than the one
  // authenticated, a node count past any job, a megabyte line.
  const std::string good = R"("host":"127.0.0.1","port":1,"fingerprint":"f","min_nodes":1,"reform_wait_s":5,"start_wait_s":5,"streams":1)";
  for (const std::string& bad :
       {std::string("{{{{ not json"), std::string("[1,2,3]"), std::string(R"({"op":"hello","node":"zero"})"),
        R"({"op":"hello","node":3,"nnodes":1,)" + good + "}", R"({"op":"hello","node":0,"nnodes":1000000000,)" + good + "}",
        std::string(R"({"op":"hello","node":0,"pad":")") + std::string(1 << 20, 'y') + "\"}"})
    EXPECT_EQ(authenticated_then(io, port, 0, bad), "") << bad.substr(0, 80);
  ASSERT_EQ(service.wait(0.1), -1) << "the service died: " << test::slurp(log);

  // A real node still gets its session and its ring; hostile messages inside a session end only it.
  RendezvousSessionOptions o;
  o.port = port;
  o.token = "t";
  o.hello.node = 0;
  o.hello.fingerprint = "f";
  o.hello.nnodes = 1;
  o.hello.reform_wait_s = 5;
  o.hello.start_wait_s = 5;
  {
    RendezvousSession s(o);
    const Epoch e = s.regroup(0, 30);
    EXPECT_EQ(e.number, 1);
    ASSERT_EQ(e.members.size(), 1u);
    EXPECT_EQ(e.root, 0);
    EXPECT_EQ(authenticated_then(io, port, 0, R"({"op":"hello","node":0,"nnodes":1,)" + good + "}").find("refused") !=
                  std::string::npos,
              true)
        << "node 0 has a live session: a second one is refused by name";
    EXPECT_EQ(service.wait(0.3), -1) << "the job is not done while node 0 is in it";
    s.done();
  }
  EXPECT_EQ(service.wait(20), 0) << test::slurp(log);
  const std::string text = test::slurp(log);
  EXPECT_NE(text.find("the job is over"), std::string::npos) << text;
  EXPECT_NE(text.find("connections at once"), std::string::npos) << "the flood was noticed: " << text;
}

}  // namespace
}  // namespace syncopate
