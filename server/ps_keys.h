// CURVE keys of the parameter-server link derived from the job token, so that one secret gives
// both authentication and encryption and no key file has to be distributed: the servers' key
// pair is crypto_box_seed_keypair(BLAKE2b-256("syncopate-ps-server" || token)). A worker derives
// the servers' public key the same way; it never travels (CurveZMQ's handshake does not send
// the server's permanent key), so only a process that knows the token can complete a handshake,
// and every message after it is encrypted (nothing to replay or read).
#pragma once
#include <string>

namespace syncopate {

struct CurveKeyPair {
  std::string public_z85, secret_z85;  // 40 characters each
};
CurveKeyPair ps_server_keys_from_token(const std::string& token);

}  // namespace syncopate
