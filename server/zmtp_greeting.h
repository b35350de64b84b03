// Asks a ZeroMQ endpoint which security mechanism it speaks, from the ZMTP 3 greeting that every
// libzmq peer sends before any authentication ("NULL", "PLAIN" or "CURVE").
//
// A client whose CurveZMQ handshakes keep failing cannot tell from its own socket's events why: the
// server drops a HELLO it cannot decrypt (another job's keys) the way a proxy drops a connection to a
// server that is down. The greeting tells them apart: a live ZeroMQ server answers it, and says
// whether it encrypts. The probe sends the 11 bytes that make the server send its whole greeting
// (signature and major version), reads 64 bytes, and closes (the server counts one handshake failed).
#pragma once
#include <optional>
#include <string>

namespace syncopate {

// endpoint: "tcp://HOST:PORT" (or "HOST:PORT"; [IPv6] in brackets). Returns the mechanism, or nullopt
// when no ZMTP 3 greeting came within timeout_s: nothing listens, the connection was closed or stayed
// silent (a stopped process), or the peer is not a ZeroMQ 3.x socket.
std::optional<std::string> zmtp_mechanism(const std::string& endpoint, double timeout_s);

}  // namespace syncopate
