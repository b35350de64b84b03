// The link probe (common/comm/link_probe.h) on real TCP rings over loopback: round trips and a bulk
// goodput per link, every node's record gathered in rank order, an emulated latency seen on the round
// trip both ways, and a neighbour that dies named instead of waited on. Only bounds that a loaded
// machine cannot break are asserted (a delay line makes things slower, never faster).
#include <algorithm>
#include <gtest/gtest.h>

#include <future>
#include <vector>

#include "common/check.h"
#include "common/comm/link_probe.h"
#include "common/comm/transport/delayed_connection.h"
#include "tests/test_helpers.h"

using namespace syncopate;

namespace {
LinkProbeOptions quick() {
  LinkProbeOptions o;
  o.pings = 10;
  o.seconds = 0.05;
  o.min_bytes = 64 << 10;
  o.max_bytes = 4 << 20;
  return o;
}
}  // namespace

TEST(LinkProbe, QuantileInterpolatesBetweenOrderStatistics) {
  EXPECT_EQ(quantile({}, 0.5), 0);
  EXPECT_DOUBLE_EQ(quantile({3, 1, 2}, 0.5), 2);
  EXPECT_DOUBLE_EQ(quantile({1, 2, 3, 4}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(quantile({5, 1}, 0), 1);
  EXPECT_DOUBLE_EQ(quantile({5, 1}, 1), 5);
}

TEST(LinkProbe, EveryLinkOfATcpRingIsMeasuredAtOnceAndRecordsGatherInRankOrder) {
  for (int world : {2, 3}) {
    std::vector<Ring> rings = test::tcp_ring(world);
    std::vector<std::future<std::pair<LinkProbe, std::vector<std::string>>>> fs;
    for (int r = 0; r < world; ++r)
      fs.push_back(std::async(std::launch::async, [&, r] {
        Ring& g = rings[static_cast<size_t>(r)];
        LinkProbe l = probe_link(*g.next, *g.prev, quick());
        // records of different lengths, one empty
        std::string mine = r == 1 ? std::string() : std::string(static_cast<size_t>(100 * r + 7), static_cast<char>('a' + r));
        return std::make_pair(l, ring_all_gather(r, world, *g.next, *g.prev, mine));
      }));
    for (int r = 0; r < world; ++r) {
      auto [l, all] = fs[static_cast<size_t>(r)].get();
      EXPECT_EQ(l.rtt_us.size(), 7u) << "pings less the 3 warm-up ones";
      for (double v : l.rtt_us) EXPECT_GT(v, 0);
      EXPECT_GT(l.goodput_gbit, 0);
      EXPECT_GE(l.bytes, 64u << 10);
      EXPECT_LE(l.bytes, 4u << 20);
      EXPECT_NEAR(l.goodput_gbit, l.bytes * 8 / l.seconds / 1e9, 1e-9 * l.goodput_gbit);
      ASSERT_EQ(l.repeats_gbit.size(), 3u) << "the final size, sent `repeats` times";
      EXPECT_DOUBLE_EQ(l.goodput_gbit, *std::max_element(l.repeats_gbit.begin(), l.repeats_gbit.end()))
          << "the fastest repeat is the goodput";
      ASSERT_EQ(all.size(), static_cast<size_t>(world));
      for (int k = 0; k < world; ++k)
        EXPECT_EQ(all[static_cast<size_t>(k)],
                  k == 1 ? std::string() : std::string(static_cast<size_t>(100 * k + 7), static_cast<char>('a' + k)))
            << "node " << r << " holds node " << k << "'s record";
    }
  }
}

TEST(LinkProbe, AnEmulatedLatencyIsSeenOnceEachWayOnTheRoundTrip) {
  const double L = 0.02;
  std::vector<Ring> rings = test::tcp_ring(2, {}, 20, {}, 1, L);
  for (auto& g : rings) g.next = std::make_unique<DelayedConnection>(std::move(g.next), L, 20);  // as syncopate-probe
  std::vector<std::future<LinkProbe>> fs;
  for (auto& g : rings) fs.push_back(std::async(std::launch::async, [&g] {
    LinkProbeOptions o = quick();
    o.max_bytes = 64 << 20;
    return probe_link(*g.next, *g.prev, o);
  }));
  for (auto& f : fs) {
    const LinkProbe l = f.get();
    EXPECT_GE(quantile(l.rtt_us, 0), 2 * L * 1e6) << "each round trip holds the delay both ways";
    EXPECT_LT(quantile(l.rtt_us, 0.5), 2 * L * 1e6 + 200e3) << "and not much more (a delay per message, not per byte)";
    // The latency is not mistaken for a slow link: the transfer grows until its data take `seconds`
    // beyond the round trip (loopback carries several Gbit/s; a goodput of latency-bound 1 MiB
    // transfers would be ~0.1).
    EXPECT_GT(l.goodput_gbit, 0.5) << l.bytes << " bytes in " << l.seconds << " s";
  }
}

TEST(LinkProbe, ANeighbourThatDiesIsNamedNotWaitedOn) {
  std::vector<Ring> rings = test::tcp_ring(3, {}, 5);
  // Node 2 leaves before the probe: its links close.
  rings[2].shutdown();
  std::vector<std::future<std::string>> fs;
  for (int r = 0; r < 2; ++r)
    fs.push_back(std::async(std::launch::async, [&, r] {
      return test::error_of([&] { probe_link(*rings[static_cast<size_t>(r)].next, *rings[static_cast<size_t>(r)].prev, quick()); });
    }));
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& f : fs) {
    const std::string e = f.get();
    EXPECT_FALSE(e.empty()) << "a dead neighbour is an error";
    EXPECT_NE(e.find("node 2"), std::string::npos) << "the node that left is named: " << e;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 4.5)
      << "within the transport's timeout, not after it";
}
