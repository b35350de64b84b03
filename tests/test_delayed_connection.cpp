// The emulated link latency (DelayedConnection): bytes are held delay_s after they arrived, once per
// message however many are in flight, never twice for bytes that already waited; failures of the
// wrapped connection and shutdown pass through. Then a TCP ring built with a latency pays it once
// per hop. Only lower bounds and "far from serialized" bounds are asserted: a loaded machine makes
// things slower, never faster.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/comm/rendezvous.h"
#include "common/comm/ring_allreduce.h"
#include "common/comm/transport/delayed_connection.h"
#include "common/comm/transport/memory_connection.h"
#include "tests/test_helpers.h"

using namespace syncopate;

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct DelayedChannel {
  std::unique_ptr<Connection> send;
  std::unique_ptr<DelayedConnection> recv;
  DelayedChannel(double delay_s, double timeout_s = 10) {
    auto [s, r] = memory_channel(8 << 20);
    send = std::move(s);
    recv = std::make_unique<DelayedConnection>(std::move(r), delay_s, timeout_s);
  }
};
}  // namespace

TEST(DelayedConnection, EveryByteIsHeldForTheDelayAfterItArrived) {
  DelayedChannel ch(0.15);
  const auto t0 = Clock::now();
  const int sent = 42;
  ch.send->send(&sent, sizeof sent);
  int got = 0;
  ch.recv->recv(&got, sizeof got);
  EXPECT_GE(since(t0), 0.15);
  EXPECT_EQ(got, sent);
}

// Twenty messages sent 5 ms apart: each is readable 0.2 s after it arrived, so all of them are in
// after about 0.2 + 0.1 s, not 20 x 0.2 s as a delay paid per read would make it.
TEST(DelayedConnection, PipelinedMessagesShareOneDelay) {
  DelayedChannel ch(0.2);
  const size_t n = 64 << 10;
  const auto t0 = Clock::now();
  auto sender = std::async(std::launch::async, [&] {
    std::vector<char> m(n);
    for (int i = 0; i < 20; ++i) {
      std::fill(m.begin(), m.end(), static_cast<char>(i));
      ch.send->send(m.data(), n);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  std::vector<char> m(n);
  for (int i = 0; i < 20; ++i) {
    ch.recv->recv(m.data(), n);
    ASSERT_EQ(m.front(), static_cast<char>(i));
    ASSERT_EQ(m.back(), static_cast<char>(i));
  }
  sender.get();
  const double t = since(t0);
  EXPECT_GE(t, 0.2 + 19 * 0.005);
  EXPECT_LT(t, 2.0) << "the delay was paid per message in sequence (serialized: 4 s)";
}

TEST(DelayedConnection, BytesThatAlreadyWaitedAreNotHeldAgain) {
  DelayedChannel ch(0.5);
  const int sent = 7;
  ch.send->send(&sent, sizeof sent);
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // the consumer comes late
  const auto t0 = Clock::now();
  int got = 0;
  ch.recv->recv(&got, sizeof got);
  EXPECT_LT(since(t0), 0.4) << "held again after it had already waited the delay";
  EXPECT_EQ(got, sent);
}

TEST(DelayedConnection, APeerThatClosedFailsOnlyAfterItsBytesWereRead) {
  DelayedChannel ch(0.05);
  const double sent[2] = {1.5, 2.5};
  ch.send->send(sent, sizeof sent);
  ch.send.reset();  // the peer closes
  double got[2] = {};
  ch.recv->recv(got, sizeof got);
  EXPECT_EQ(got[1], 2.5);
  try {
    ch.recv->recv(got, 1);
    FAIL() << "read past a closed peer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("closed"), std::string::npos) << e.what();
  }
}

TEST(DelayedConnection, ShutdownEndsABlockedRecvAtOnce) {
  DelayedChannel ch(0.05, 30);
  auto blocked = std::async(std::launch::async, [&] {
    char c;
    ch.recv->recv(&c, 1);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = Clock::now();
  ch.recv->shutdown();
  EXPECT_THROW(blocked.get(), Error);
  EXPECT_LT(since(t0), 5.0);
}

TEST(DelayedConnection, NothingArrivingIsATimeoutNamingThePeer) {
  DelayedChannel ch(0.01, /*timeout_s=*/0.3);
  char c;
  try {
    ch.recv->recv(&c, 1);
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nothing arrived for 0.3 s"), std::string::npos) << e.what();
  }
}

// Three nodes over TCP with 50 ms of latency: a ring all-reduce is 2(n-1) = 4 hops in sequence, so
// at least 0.2 s; each hop carries 8 segments (32 KiB each), which share their hop's delay: paid
// per segment, the same call would take 8 x 0.2 = 1.6 s. The sum is exact as without latency.
TEST(TcpRing, LatencyIsPaidOncePerHopNotPerSegment) {
  const int world = 3;
  auto rings = test::tcp_ring(world, {}, 20, {}, 1, /*latency_s=*/0.05);
  const size_t n = 3 * 8 * (32 << 10) / sizeof(float);  // 8 segments per chunk
  RingAllreduceOptions opt;
  opt.segment_bytes = 32 << 10;
  std::vector<std::vector<float>> v(world);
  std::vector<double> took(world);
  std::vector<std::future<void>> fs;
  for (int r = 0; r < world; ++r)
    fs.push_back(std::async(std::launch::async, [&, r] {
      v[r].assign(n, static_cast<float>(r + 1));
      const auto t0 = Clock::now();
      ring_allreduce_sum(v[r].data(), n, r, world, *rings[r].next, *rings[r].prev, opt);
      took[r] = since(t0);
    }));
  for (auto& f : fs) f.get();
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(v[r], std::vector<float>(n, 6.0f));
    EXPECT_GE(took[r], 4 * 0.05 - 0.02) << "rank " << r;  // the last hop's arrival ends the call
    EXPECT_LT(took[r], 1.0) << "rank " << r << ": the latency was paid per segment (1.6 s), not per hop";
  }
}
