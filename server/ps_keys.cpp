#include "server/ps_keys.h"

#include <sodium.h>
#include <zmq.h>

#include "common/check.h"
#include "common/comm/job_token.h"

namespace syncopate {

CurveKeyPair ps_server_keys_from_token(const std::string& token) {
  SYN_CHECK(sodium_init() >= 0, "libsodium failed to initialize", "check the system's random source");
  static const char kLabel[] = "syncopate-ps-server";
  unsigned char seed[crypto_box_SEEDBYTES];
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, sizeof(seed));
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(kLabel), sizeof(kLabel));
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(token.data()), token.size());
  crypto_generichash_final(&st, seed, sizeof(seed));
  unsigned char pk[crypto_box_PUBLICKEYBYTES], sk[crypto_box_SECRETKEYBYTES];
  crypto_box_seed_keypair(pk, sk, seed);
  sodium_memzero(seed, sizeof(seed));
  char pub[41], sec[41];
  SYN_CHECK(zmq_z85_encode(pub, pk, sizeof(pk)) && zmq_z85_encode(sec, sk, sizeof(sk)), "Z85 encoding failed",
            "this is a bug");
  sodium_memzero(sk, sizeof(sk));
  CurveKeyPair k{pub, sec};
  sodium_memzero(sec, sizeof(sec));
  return k;
}

bool ps_encrypt_from_token(const std::string& encrypt, const std::string& token) {
  return encrypt == "auto" && !is_insecure_default_token(token);
}

std::string ps_client_server_key(const std::string& token, const std::string& encrypt, const std::string& key_file_public) {
  if (!key_file_public.empty()) return key_file_public;
  return ps_encrypt_from_token(encrypt, token) ? ps_server_keys_from_token(token).public_z85 : "";
}

}  // namespace syncopate
