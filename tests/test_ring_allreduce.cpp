// Ring all-reduce: exact sums for n = 1..8 ranks and awkward sizes over the memory transport,
// agreement with the naive reference, the bf16 wire format, and the same algorithm over real TCP
// links built by the rendezvous (ranks as threads, loopback, ephemeral ports).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <future>
#include <random>
#include <thread>

#include <boost/asio/write.hpp>

#include "common/check.h"
#include "common/comm/peer_auth.h"
#include "common/comm/rendezvous.h"
#include "common/comm/ring_allreduce.h"
#include "common/comm/transport/memory_connection.h"
#include "common/comm/transport/striped_connection.h"
#include "common/comm/transport/tcp_connection.h"
#include "tests/test_helpers.h"

using namespace syncopate;

namespace {

using test::run_memory_ring;

std::vector<float> rank_data(int rank, size_t n) {  // small integers: every summation order is exact
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + static_cast<size_t>(rank) * 13) % 101) - 50.0f;
  return v;
}

}  // namespace

class RingSizes : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

TEST_P(RingSizes, EqualsExactSum) {
  const auto [world, n] = GetParam();
  std::vector<float> expect(n, 0.0f);
  for (int r = 0; r < world; ++r) {
    auto d = rank_data(r, n);
    for (size_t i = 0; i < n; ++i) expect[i] += d[i];
  }
  std::vector<std::vector<float>> out(world);
  RingAllreduceOptions opt;
  opt.segment_bytes = 4096;  // many segments even for small sizes: exercises the pipelining
  run_memory_ring(world, [&](int r, Connection& next, Connection& prev) {
    out[r] = rank_data(r, n);
    ring_allreduce_sum(out[r].data(), n, r, world, next, prev, opt);
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(out[r], expect) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(AllWorlds, RingSizes,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 6, 7, 8),
                                            ::testing::Values(size_t{0}, size_t{1}, size_t{5}, size_t{4099},
                                                              size_t{(1 << 20) + 3})));

TEST(RingAllreduce, AgreesWithNaiveReferenceOnRandomData) {
  const int world = 4;
  const size_t n = 100003;
  std::vector<std::vector<float>> fast(world), ref(world);
  for (int r = 0; r < world; ++r) {
    std::mt19937 g(r);
    std::normal_distribution<float> d;
    fast[r].resize(n);
    for (auto& x : fast[r]) x = d(g);
    ref[r] = fast[r];
  }
  run_memory_ring(world, [&](int r, Connection& next, Connection& prev) {
    ring_allreduce_sum(fast[r].data(), n, r, world, next, prev);
  });
  run_memory_ring(world, [&](int r, Connection& next, Connection& prev) {
    naive_allreduce_sum(ref[r].data(), n, r, world, next, prev);
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(fast[r], fast[0]) << "replicas must be identical, rank " << r;
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(fast[r][i], ref[r][i], 1e-5) << i;
  }
}

TEST(RingAllreduce, Bf16WireKeepsReplicasIdenticalWithBoundedError) {
  const int world = 3;
  const size_t n = 50001;
  std::vector<std::vector<float>> v(world);
  std::vector<float> exact(n, 0.0f);
  for (int r = 0; r < world; ++r) {
    std::mt19937 g(r + 10);
    std::uniform_real_distribution<float> d(0.5f, 1.5f);
    v[r].resize(n);
    for (size_t i = 0; i < n; ++i) exact[i] += (v[r][i] = d(g));
  }
  RingAllreduceOptions opt;
  opt.wire = WireFormat::kBf16;
  run_memory_ring(world, [&](int r, Connection& next, Connection& prev) {
    ring_allreduce_sum(v[r].data(), n, r, world, next, prev, opt);
  });
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, static_cast<double>(std::abs(v[0][i] - exact[i]) / exact[i]));
  for (int r = 1; r < world; ++r) EXPECT_EQ(v[r], v[0]);
  EXPECT_LT(worst, 3 * 0.0078125);  // bf16 keeps 8 significant bits: <= 2^-8 relative per rounding
  EXPECT_GT(worst, 0.0);            // and it really did round
}

using test::tcp_ring;

class TcpRingStreams : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(OneAndThree, TcpRingStreams, ::testing::Values(1, 3));

// With 3 streams per neighbour the messages are striped over three sockets per link.
TEST_P(TcpRingStreams, AllreduceOverLoopbackSockets) {
  const int world = 3;
  auto rings = tcp_ring(world, {}, 20, std::vector<int>(world, GetParam()));
  if (GetParam() > 1) {
    EXPECT_NE(rings[0].next->peer().find("(3 streams)"), std::string::npos) << rings[0].next->peer();
  }
  const size_t n = 300007;
  std::vector<std::vector<float>> v(world);
  std::vector<std::future<void>> fs;
  for (int r = 0; r < world; ++r)
    fs.push_back(std::async(std::launch::async, [&, r] {
      v[r] = rank_data(r, n);
      ring_allreduce_sum(v[r].data(), n, r, world, *rings[r].next, *rings[r].prev);
    }));
  for (auto& f : fs) f.get();
  std::vector<float> expect(n, 0.0f);
  for (int r = 0; r < world; ++r) {
    auto d = rank_data(r, n);
    for (size_t i = 0; i < n; ++i) expect[i] += d[i];
  }
  for (int r = 0; r < world; ++r) EXPECT_EQ(v[r], expect);
}

TEST(TcpRing, FingerprintMismatchFailsEveryNodeWithAMessage) {
  try {
    tcp_ring(2, {"model-a", "model-b"});
    FAIL() << "expected a rendezvous error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another model/config"), std::string::npos) << e.what();
  }
}

TEST(TcpRing, MissingNodeTimesOutNamingIt) {
  RendezvousOptions o;
  o.master_port = 0;
  o.nnodes = 3;
  o.token = "t";
  o.timeout_s = 0.5;
  try {
    connect_ring(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node(s) 1, 2 did not connect"), std::string::npos) << e.what();
  }
}

TEST(TcpRing, GarbageAndWrongTokenAtRendezvousAreRefused) {
  std::promise<uint16_t> port;
  auto pf = port.get_future().share();
  auto master = std::async(std::launch::async, [&] {
    RendezvousOptions o;
    o.master_port = 0;
    o.nnodes = 2;
    o.token = "job";
    o.timeout_s = 20;
    o.on_listening = [&](uint16_t p) { port.set_value(p); };
    return connect_ring(o);
  });
  const uint16_t p = pf.get();
  asio::io_context io;
  {  // garbage
    auto s = tcp_connect(io, "127.0.0.1", p, 5, "master");
    asio::write(s, asio::buffer(std::string("\x01\x02garbage\n")));
  }
  {  // another job's node
    RendezvousOptions o;
    o.master_port = p;
    o.nnodes = 2;
    o.node_rank = 1;
    o.token = "other-job";
    o.timeout_s = 5;
    EXPECT_THROW(connect_ring(o), Error);
  }
  RendezvousOptions o;  // the real node still gets in
  o.master_port = p;
  o.nnodes = 2;
  o.node_rank = 1;
  o.token = "job";
  o.timeout_s = 20;
  Ring r1 = connect_ring(o);
  Ring r0 = master.get();
  float a = 1, b = 2;
  auto t = std::async(std::launch::async, [&] { ring_allreduce_sum(&a, 1, 0, 2, *r0.next, *r0.prev); });
  ring_allreduce_sum(&b, 1, 1, 2, *r1.next, *r1.prev);
  t.get();
  EXPECT_EQ(a, 3.0f);
  EXPECT_EQ(b, 3.0f);
}

// Lanes: independent rings over the same nodes (one per local replica). Each sums on its own,
// all at once.
TEST(TcpRing, LanesAreIndependentRings) {
  const int world = 3, lanes = 2;
  auto rings = tcp_ring(world, {}, 20, {}, lanes);
  for (auto& r : rings) EXPECT_EQ(r.lanes(), lanes);
  const size_t n = 10007;
  std::vector<std::future<void>> fs;
  std::vector<std::vector<float>> v(world * lanes);
  for (int r = 0; r < world; ++r)
    for (int l = 0; l < lanes; ++l)
      fs.push_back(std::async(std::launch::async, [&, r, l] {
        v[r * lanes + l] = rank_data(r + 10 * l, n);
        ring_allreduce_sum(v[r * lanes + l].data(), n, r, world, rings[r].next_of(l), rings[r].prev_of(l));
      }));
  for (auto& f : fs) f.get();
  for (int l = 0; l < lanes; ++l) {
    std::vector<float> expect(n, 0.0f);
    for (int r = 0; r < world; ++r) {
      auto d = rank_data(r + 10 * l, n);
      for (size_t i = 0; i < n; ++i) expect[i] += d[i];
    }
    for (int r = 0; r < world; ++r) EXPECT_EQ(v[r * lanes + l], expect) << "lane " << l << " rank " << r;
  }
}

// Ring::shutdown (a node's replica failed): a receive blocked on any lane fails at once, long
// before the 30 s timeout, and the neighbour sees the node leave.
TEST(TcpRing, ShutdownEndsBlockedTransfersAtOnce) {
  auto rings = tcp_ring(2, {}, 30, {}, 2);
  auto blocked = std::async(std::launch::async, [&] {
    float x;
    rings[0].prev_of(1).recv(&x, sizeof x);  // node 1 never sends on lane 1
  });
  auto neighbour = std::async(std::launch::async, [&] {
    float x;
    rings[1].prev_of(0).recv(&x, sizeof x);  // from node 0, which is about to shut down
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  rings[0].shutdown();
  EXPECT_THROW(blocked.get(), Error);
  EXPECT_THROW(neighbour.get(), Error);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

// A host that drops the SYN (a firewall, an address nobody holds) makes a blocking connect wait for
// the kernel's retries, about two minutes; tcp_connect gives up at its own timeout (skeptic review,
// helper-24: the elastic ring's formations stalled past dist.timeout_s).
TEST(TcpRing, ConnectingToASilentAddressEndsAtTheTimeout) {
  // A listener whose accept queue is full: the kernel drops further SYNs, as such a firewall does.
  const int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(l, 0), 0);
  socklen_t len = sizeof(a);
  ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
  std::vector<int> queued;
  for (int i = 0; i < 4; ++i) {  // fill the queue (never accepted)
    const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    queued.push_back(c);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  asio::io_context io;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    tcp_connect(io, "127.0.0.1", ntohs(a.sin_port), 1.0, "a silent host");
    ADD_FAILURE() << "connected past a full accept queue";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a silent host"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  for (int c : queued) ::close(c);
  ::close(l);
}

TEST(TcpRing, DeadPeerIsAnErrorNamingIt) {
  auto rings = tcp_ring(3, {}, /*timeout=*/5);
  rings[2] = Ring{};  // node 2 dies: its sockets close
  const size_t n = 1 << 16;
  std::vector<std::future<void>> fs;
  std::vector<std::string> errors(2);
  for (int r = 0; r < 2; ++r)
    fs.push_back(std::async(std::launch::async, [&, r] {
      std::vector<float> v(n, 1.0f);
      try {
        ring_allreduce_sum(v.data(), n, r, 3, *rings[r].next, *rings[r].prev);
      } catch (const Error& e) {
        errors[r] = e.what();
        rings[r] = Ring{};  // a failed node exits, closing its links, as the worker process does
      }
    }));
  for (auto& f : fs) f.get();
  EXPECT_NE(errors[0].find("receiving from node 2"), std::string::npos) << errors[0];  // 0 receives from 2
  // Node 1 sends to the dead node 2 or hears node 0 go away: either way a prompt, named error.
  EXPECT_TRUE(errors[1].find("node 2") != std::string::npos || errors[1].find("node 0") != std::string::npos) << errors[1];
}

// Several links used as one: the ring over striped memory channels (3 per neighbour, stripes of
// at least 1 KiB, so large messages use all three and small ones one) equals the exact sum.
TEST(StripedRing, EqualsExactSumOverThreeLinksPerNeighbour) {
  for (int world : {2, 3, 5}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{700}, size_t{100003}}) {
      std::vector<std::unique_ptr<Connection>> send_end(world), recv_end(world);
      for (int r = 0; r < world; ++r) {
        std::vector<std::unique_ptr<Connection>> outs, ins;
        for (int i = 0; i < 3; ++i) {
          auto [s, rcv] = memory_channel(16 << 10);
          outs.push_back(std::move(s));
          ins.push_back(std::move(rcv));
        }
        send_end[r] = std::make_unique<StripedConnection>(std::move(outs), 1024);
        recv_end[(r + 1) % world] = std::make_unique<StripedConnection>(std::move(ins), 1024);
      }
      std::vector<float> expect(n, 0.0f);
      for (int r = 0; r < world; ++r) {
        auto d = rank_data(r, n);
        for (size_t i = 0; i < n; ++i) expect[i] += d[i];
      }
      std::vector<std::vector<float>> out(world);
      std::vector<std::future<void>> fs;
      for (int r = 0; r < world; ++r)
        fs.push_back(std::async(std::launch::async, [&, r] {
          out[r] = rank_data(r, n);
          RingAllreduceOptions opt;
          opt.segment_bytes = 8192;
          ring_allreduce_sum(out[r].data(), n, r, world, *send_end[r], *recv_end[r], opt);
        }));
      for (auto& f : fs) f.get();
      for (int r = 0; r < world; ++r) ASSERT_EQ(out[r], expect) << "world " << world << " n " << n << " rank " << r;
    }
  }
}

TEST(TcpRing, StreamCountMismatchIsRefusedByName) {
  try {
    tcp_ring(2, {}, 10, {2, 4});
    FAIL() << "a ring with 2 and 4 streams per link was built";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 1 opens 4 TCP streams per ring link, node 0 opens 2"), std::string::npos)
        << e.what();
  }
}

// One RingAllreducer per rank, reused for a run of collectives of different sizes and segment
// sizes (as the trainer reduces its buckets): every result is the exact sum.
TEST(RingAllreducer, ReusedAcrossCallsOfEverySize) {
  const int world = 3;
  const std::vector<size_t> sizes = {5, 4099, 0, 1, 100003, 7, 65536};
  std::vector<std::vector<std::vector<float>>> out(world);
  run_memory_ring(world, [&](int r, Connection& next, Connection& prev) {
    RingAllreducer ar(r, world, next, prev);
    for (size_t k = 0; k < sizes.size(); ++k) {
      auto v = rank_data(r + static_cast<int>(k), sizes[k]);
      RingAllreduceOptions opt;
      opt.segment_bytes = k % 2 ? 4096 : 1 << 16;
      ar.sum(v.data(), v.size(), opt);
      out[r].push_back(v);
    }
  });
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<float> expect(sizes[k], 0.0f);
    for (int r = 0; r < world; ++r) {
      auto d = rank_data(r + static_cast<int>(k), sizes[k]);
      for (size_t i = 0; i < d.size(); ++i) expect[i] += d[i];
    }
    for (int r = 0; r < world; ++r) EXPECT_EQ(out[r][k], expect) << "call " << k << " rank " << r;
  }
}

namespace {
// A real TCP connection that also keeps every byte it received (what a listener on the wire sees
// of the peer's side).
class Recording : public Connection {
 public:
  explicit Recording(std::unique_ptr<Connection> c) : c_(std::move(c)) {}
  void send(const void* d, size_t n) override { c_->send(d, n); }
  void recv(void* d, size_t n) override {
    c_->recv(d, n);
    heard.append(static_cast<const char*>(d), n);
  }
  std::string peer() const override { return c_->peer(); }
  void shutdown() override { c_->shutdown(); }
  std::string heard;

 private:
  std::unique_ptr<Connection> c_;
};
}  // namespace

// Issue 11: the handshake carries nothing reusable. An eavesdropper records everything an honest
// node sent in a successful handshake and replays it, byte for byte, on a new connection: refused
// (the proof binds the listener's fresh nonce). A wrong token is refused on both sides.
TEST(PeerAuth, ARecordedHandshakeCannotBeReplayed) {
  asio::io_context io;
  TcpListener listener(io, "127.0.0.1", 0);
  const JobKey key = job_key("job");
  auto accept = [&] {
    return std::make_unique<TcpConnection>(listener.accept(10, "test peer"), "listener side", 10);
  };
  auto dial = [&] {
    return std::make_unique<TcpConnection>(tcp_connect(io, "127.0.0.1", listener.port(), 10, "listener"), "dialer side", 10);
  };
  // 1. An honest node (rank 1) authenticates; the listener side records what it sent.
  std::string recorded;
  {
    auto honest = std::async(std::launch::async, [&] { return authenticate_peer(*dial(), key, 1, 0); });
    Recording rec(accept());
    EXPECT_EQ(authenticate_peer(rec, key, 0, 1), 1);
    EXPECT_EQ(honest.get(), 0);
    recorded = rec.heard;
  }
  ASSERT_EQ(recorded.size(), 48u + 32u);  // hello (magic, version, rank, nonce) + proof
  // 2. The replay: the same bytes on a new connection, the listener's hello read and ignored.
  auto attacker = std::async(std::launch::async, [&] {
    auto c = dial();
    c->send(recorded.data(), 48);
    char their_hello[48];
    c->recv(their_hello, sizeof(their_hello));
    c->send(recorded.data() + 48, 32);
    char their_proof[32];
    c->recv(their_proof, sizeof(their_proof));
  });
  {
    auto c = accept();
    try {
      authenticate_peer(*c, key, 0, -1);
      ADD_FAILURE() << "a replayed handshake was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("could not prove this job's token"), std::string::npos) << e.what();
    }
  }
  attacker.get();
  // 3. Another job's token fails on both ends.
  auto other = std::async(std::launch::async, [&] { return authenticate_peer(*dial(), job_key("other-job"), 1, 0); });
  auto c = accept();
  EXPECT_THROW(authenticate_peer(*c, key, 0, 1), Error);
  EXPECT_THROW(other.get(), Error);
}

// Issue 15 (9): the bf16 wire's error, per element, over mixed signs, several rank counts and
// sizes: every element is within world * 2^-8 * sum_r |x_r| of the exact sum (at most `world`
// round-to-nearest-even roundings of a partial sum; bf16 keeps 8 significant bits, so each is off
// by at most 2^-8 of the value: half a unit in the last place), and every rank holds the same
// values. (The issue suggested 2^-9 per rounding; measured, 2 ranks exceed it, as the unit
// roundoff of an 8-bit significand is 2^-8. Truncation would be off by up to 2^-7: the tie test
// below tells the two apart exactly.)
TEST(RingAllreduce, Bf16WireErrorIsBoundedPerElementForAnySignsRanksAndSizes) {
  for (int world : {2, 3, 5, 8}) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{4099}, size_t{100003}}) {
      std::vector<std::vector<float>> v(static_cast<size_t>(world));
      std::vector<double> exact(n, 0.0), mass(n, 0.0);
      for (int r = 0; r < world; ++r) {
        std::mt19937 g(static_cast<uint32_t>(1000 * world + r + n));
        std::normal_distribution<float> d(0.0f, 3.0f);
        v[r].resize(n);
        for (size_t i = 0; i < n; ++i) {
          v[r][i] = d(g);
          exact[i] += v[r][i];
          mass[i] += std::abs(v[r][i]);
        }
      }
      RingAllreduceOptions opt;
      opt.wire = WireFormat::kBf16;
      opt.segment_bytes = 4096;
      run_memory_ring(world, [&](int r, Connection& next, Connection& prev) {
        ring_allreduce_sum(v[r].data(), n, r, world, next, prev, opt);
      });
      for (int r = 1; r < world; ++r) ASSERT_EQ(v[r], v[0]) << world << " ranks, " << n;
      for (size_t i = 0; i < n; ++i)
        ASSERT_LE(std::abs(v[0][i] - exact[i]), world * std::ldexp(1.0, -8) * mass[i] + 1e-30)
            << world << " ranks, n " << n << ", element " << i;
    }
  }
}

// A tie is rounded to even, not truncated: 1 + 3*2^-8 lies halfway between the bf16 values
// 1 + 2^-7 (odd) and 1 + 2^-6 (even); round-to-nearest-even gives 1.015625, truncation 1.0078125.
TEST(RingAllreduce, Bf16WireRoundsTiesToEven) {
  const float tie = 1.0f + 3.0f / 256.0f;
  std::vector<std::vector<float>> v = {{tie, tie}, {0.0f, 0.0f}};
  RingAllreduceOptions opt;
  opt.wire = WireFormat::kBf16;
  run_memory_ring(2, [&](int r, Connection& next, Connection& prev) { ring_allreduce_sum(v[r].data(), 2, r, 2, next, prev, opt); });
  for (int r = 0; r < 2; ++r)
    for (float x : v[r]) EXPECT_EQ(x, 1.015625f) << "rank " << r;
}

// Slurm names hosts (MASTER_ADDR = the first of SLURM_JOB_NODELIST): node 0 listens on the address
// its name resolves to; a name that resolves to nothing is refused by name.
TEST(TcpTransport, AListenerTakesAHostNameAndRefusesOneThatDoesNotResolve) {
  asio::io_context io;
  TcpListener listener(io, "localhost", 0);
  auto dialed = std::async(std::launch::async, [&] {
    TcpConnection c(tcp_connect(io, "127.0.0.1", listener.port(), 10, "listener"), "dialer", 10);
    const char x = 42;
    c.send(&x, 1);
  });
  TcpConnection accepted(listener.accept(10, "dialer"), "listener", 10);
  char got = 0;
  accepted.recv(&got, 1);
  dialed.get();
  EXPECT_EQ(got, 42);
  EXPECT_NE(test::error_of([&] { TcpListener bad(io, "no-such-host.invalid", 0); }).find("no-such-host.invalid"),
            std::string::npos);
}
