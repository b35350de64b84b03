// Mutual authentication of two processes of one job over a fresh connection, with nothing on the
// wire that a listener could reuse (replace the fixed token digest the handshake used to carry).
//
//   1. each side sends {magic, version, rank, a fresh 32-byte random nonce};
//   2. each side sends proof = HMAC-SHA256(K, "syncopate-peer" || own nonce || peer's nonce || own rank),
//      K = BLAKE2b-256 of the job token (libsodium);
//   3. each side checks the peer's proof in constant time.
// A proof binds both fresh nonces, so a recorded handshake proves nothing on another connection,
// and a reflected proof fails (the verifier's own nonce comes second in what the peer signs).
// The token itself never travels. Used by the rendezvous and by every ring link.
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "common/comm/transport/connection.h"

namespace syncopate {

struct JobKey {
  std::array<uint8_t, 32> bytes{};
};
// The key both sides derive from the job token.
JobKey job_key(const std::string& token);

// Runs the handshake; returns the peer's rank. Throws syncopate::Error naming the peer when it is
// not a Syncopate peer of this version, cannot prove the same token, or is not rank
// `expect_rank` (-1: any rank).
int authenticate_peer(Connection& c, const JobKey& key, int my_rank, int expect_rank);

}  // namespace syncopate
