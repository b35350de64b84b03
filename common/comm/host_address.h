// Which machine an address names, for syncopate-probe's record of where a job's processes run (the
// advisor tells shards on the job's own nodes from shards on hosts of their own by comparing these).
#pragma once
#include <string>

namespace syncopate {

// A numeric address as it is, or the first IPv4 address a host name resolves to. Throws
// syncopate::Error naming `host` (and `what` it was for, where given) when it is neither.
std::string numeric_address(const std::string& host, const std::string& what = "");

// The local address this host sends from to reach `host` (the routing table's choice; a UDP
// socket is connected, nothing is sent): the address peers of a job see this node at, as the
// rendezvous's TCP connection to node 0 would show it. Throws syncopate::Error naming `host`.
std::string local_address_towards(const std::string& host);

// The host of a "tcp://HOST:PORT" endpoint (a ZeroMQ address; brackets of an IPv6 host dropped), ""
// when it has none.
std::string endpoint_host(const std::string& endpoint);
// Its port ("" when it has none).
std::string endpoint_port(const std::string& endpoint);

}  // namespace syncopate
