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

// Whether the token-derived keys apply: encryption "auto" and a real job token (not empty, not
// the insecure default, which protects nothing). The servers and every client decide alike.
bool ps_encrypt_from_token(const std::string& encrypt, const std::string& token);
// The servers' public key a client connects with: `key_file_public` when one was given, else the
// token-derived one when ps_encrypt_from_token; "" = plain TCP.
std::string ps_client_server_key(const std::string& token, const std::string& encrypt,
                                 const std::string& key_file_public = "");

}  // namespace syncopate
