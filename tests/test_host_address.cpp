// common/comm/host_address: the parts of a ZeroMQ endpoint, numeric addresses, and the local address
// towards a peer (what syncopate-probe records and the ZMTP greeting probe connects to).
#include <gtest/gtest.h>

#include "common/check.h"
#include "common/comm/host_address.h"

using namespace syncopate;

TEST(HostAddress, AnEndpointSplitsIntoItsHostAndPort) {
  EXPECT_EQ(endpoint_host("tcp://10.77.0.3:5001"), "10.77.0.3");
  EXPECT_EQ(endpoint_port("tcp://10.77.0.3:5001"), "5001");
  EXPECT_EQ(endpoint_host("tcp://[::1]:5001"), "::1");  // brackets of an IPv6 host dropped
  EXPECT_EQ(endpoint_port("tcp://[::1]:5001"), "5001");
  EXPECT_EQ(endpoint_host("node-a:7"), "node-a");  // no scheme
  EXPECT_EQ(endpoint_port("node-a:7"), "7");
  EXPECT_EQ(endpoint_host("tcp://node-a"), "node-a");  // no port: the scheme's colon is not one
  EXPECT_EQ(endpoint_port("tcp://node-a"), "");
  EXPECT_EQ(endpoint_port(""), "");
}

TEST(HostAddress, NumericAddressesStayAndABadHostIsNamed) {
  EXPECT_EQ(numeric_address("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(numeric_address("localhost"), "127.0.0.1");
  try {
    numeric_address("no-such-host.invalid", "the job's shard 2");
    FAIL() << "a host that does not resolve was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-host.invalid"), std::string::npos) << e.what();
  }
  EXPECT_EQ(local_address_towards("127.0.0.1"), "127.0.0.1");
}
