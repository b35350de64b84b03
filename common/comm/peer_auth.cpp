#include "common/comm/peer_auth.h"

#include <cstring>

#include <fmt/format.h>
#include <sodium.h>

#include "common/check.h"

namespace syncopate {
namespace {

constexpr uint64_t kMagic = 0x5359'4e43'4f50'4154ULL;  // "SYNCOPAT"
constexpr uint32_t kVersion = 2;                        // 2: challenge-response (1 sent a token digest)
constexpr char kLabel[] = "syncopate-peer";

struct Hello {
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  uint8_t nonce[32];
};
static_assert(sizeof(Hello) == 48, "the wire layout of the hello");

void init_sodium() {
  static const int ok = sodium_init();
  SYN_CHECK(ok >= 0, "libsodium failed to initialize", "check the system's random source (/dev/urandom)");
}

std::array<uint8_t, crypto_auth_hmacsha256_BYTES> proof(const JobKey& key, const uint8_t* own, const uint8_t* peer,
                                                        int32_t own_rank) {
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, key.bytes.data(), key.bytes.size());
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const uint8_t*>(kLabel), sizeof(kLabel));
  crypto_auth_hmacsha256_update(&st, own, 32);
  crypto_auth_hmacsha256_update(&st, peer, 32);
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const uint8_t*>(&own_rank), sizeof(own_rank));
  std::array<uint8_t, crypto_auth_hmacsha256_BYTES> out{};
  crypto_auth_hmacsha256_final(&st, out.data());
  return out;
}

}  // namespace

JobKey job_key(const std::string& token) {
  init_sodium();
  JobKey k;
  static const char kKeyLabel[] = "syncopate-job-key";
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, k.bytes.size());
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(kKeyLabel), sizeof(kKeyLabel));
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(token.data()), token.size());
  crypto_generichash_final(&st, k.bytes.data(), k.bytes.size());
  return k;
}

int authenticate_peer(Connection& c, const JobKey& key, int my_rank, int expect_rank) {
  init_sodium();
  Hello mine{kMagic, kVersion, my_rank, {}}, theirs{};
  randombytes_buf(mine.nonce, sizeof(mine.nonce));
  c.send(&mine, sizeof(mine));
  c.recv(&theirs, sizeof(theirs));
  SYN_CHECK(theirs.magic == kMagic && theirs.version == kVersion,
            fmt::format("{} is not a Syncopate peer of this version", c.peer()), "check that every node runs the same build");
  SYN_CHECK(std::memcmp(theirs.nonce, mine.nonce, sizeof(mine.nonce)) != 0,
            fmt::format("{} echoed this process's own challenge", c.peer()), "something replays traffic on this network");
  const auto own = proof(key, mine.nonce, theirs.nonce, mine.rank);
  c.send(own.data(), own.size());
  std::array<uint8_t, crypto_auth_hmacsha256_BYTES> got{};
  c.recv(got.data(), got.size());
  const auto want = proof(key, theirs.nonce, mine.nonce, theirs.rank);
  SYN_CHECK(sodium_memcmp(got.data(), want.data(), want.size()) == 0,
            fmt::format("{} could not prove this job's token", c.peer()),
            "give every process of the job the same SYNCOPATE_TOKEN");
  SYN_CHECK(expect_rank < 0 || theirs.rank == expect_rank,
            fmt::format("{} says it is rank {}, expected rank {}", c.peer(), theirs.rank, expect_rank),
            "two jobs may share a port: use distinct MASTER_PORTs");
  return theirs.rank;
}

}  // namespace syncopate
