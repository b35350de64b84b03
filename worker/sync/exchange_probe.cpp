#include "worker/sync/exchange_probe.h"

#include <chrono>
#include <functional>
#include <thread>

#include <torch/torch.h>

#include "common/check.h"
#include "common/comm/ring_allreduce.h"
#include "common/log.h"

namespace syncopate {
namespace {

// `warmup` + `rounds` calls of one_round(i), each after gap_s seconds; the timed ones' seconds.
std::vector<double> time_rounds(int rounds, int warmup, double gap_s, const std::function<void(int)>& one_round) {
  SYN_CHECK(rounds > 0 && warmup >= 0 && gap_s >= 0, "exchange probe: nothing to time", "a caller bug");
  std::vector<double> out;
  for (int i = 0; i < warmup + rounds; ++i) {
    std::this_thread::sleep_for(std::chrono::duration<double>(gap_s));
    const auto t0 = std::chrono::steady_clock::now();
    one_round(i);
    if (i >= warmup) out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return out;
}

}  // namespace

ExchangeProbe probe_ring_rounds(int rank, int world, Connection& next, Connection& prev, int64_t params, int rounds,
                                int warmup, double gap_s, WireFormat wire) {
  SYN_CHECK(params > 0, "probe_ring_rounds: no parameters", "a caller bug");
  std::vector<float> buf(static_cast<size_t>(params), 0.0f);
  RingAllreducer ring(rank, world, next, prev);
  RingAllreduceOptions opt;
  opt.wire = wire;
  int64_t sent = 0, received = 0;
  ExchangeProbe r;
  r.round_s = time_rounds(rounds, warmup, gap_s, [&](int i) {
    if (i == warmup) sent = ring.bytes_sent(), received = ring.bytes_received();
    ring.sum(buf.data(), buf.size(), opt);
  });
  r.bytes_sent = (ring.bytes_sent() - sent) / rounds;
  r.bytes_received = (ring.bytes_received() - received) / rounds;
  return r;
}

namespace {

// The parameter servers' rounds: under BSP (bsp) every node at once, or under ASP with this node
// offset_s behind the others.
ExchangeProbe ps_rounds(const std::vector<std::string>& endpoints, const std::string& token, int rank, int world,
                        PsClientOptions options, int64_t params, int rounds, int warmup, double gap_s, bool bsp,
                        double offset_s) {
  SYN_CHECK(params > 0, "probe_ps_rounds: no parameters", "a caller bug");
  PsClient client(endpoints, token, rank, world, options);
  at::Tensor values = torch::zeros({params}, torch::kFloat32);
  const at::Tensor grads = torch::zeros({params}, torch::kFloat32);
  client.init(values, {}, AdamWConfig{}, 0);
  ExchangeProbe r;
  r.parts = client.parts();
  int64_t clock = 0;
  PsClientCounters before = client.counters();
  try {
    if (offset_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(offset_s));
    r.round_s = time_rounds(rounds, warmup, gap_s, [&](int i) {
      if (i == warmup) before = client.counters();
      push_pull(client, grads, values, clock, 0.0);
      ++clock;
      // Under SSP and ASP a reply carries no job round (the BSP rounds would be timed without BSP's
      // lockstep, which is not the exchange the advisor calibrates); under BSP it does (the spread
      // rounds would wait for the last node's push).
      if (bsp)
        SYN_CHECK(client.job_round() >= 0,
                  "the parameter servers do not run BSP: their round trips are not the exchange the probe times",
                  "start the probe's servers with --ps.consistency=bsp and no backup workers "
                  "(scripts/local_cluster.sh --probe --servers K --consistency bsp)");
      else
        SYN_CHECK(client.job_round() < 0, "the probe's spread rounds went to shards that run BSP", "a caller bug");
    });
  } catch (...) {
    // Leave, so that the other nodes' rounds stop waiting for this one; the failure is what is reported.
    try {
      client.finish(clock);
    } catch (const std::exception& e) {
      log::warn("[probe] node {}: leaving the shards after a failed round: {}", rank, e.what());
    }
    throw;
  }
  const PsClientCounters after = client.counters();
  r.bytes_sent = (after.bytes_sent - before.bytes_sent) / rounds;
  r.bytes_received = (after.bytes_received - before.bytes_received) / rounds;
  client.finish(clock);
  return r;
}

}  // namespace

ExchangeProbe probe_ps_rounds(const std::vector<std::string>& endpoints, const std::string& token, int rank, int world,
                              PsClientOptions options, int64_t params, int rounds, int warmup, double gap_s) {
  return ps_rounds(endpoints, token, rank, world, std::move(options), params, rounds, warmup, gap_s, true, 0.0);
}

ExchangeProbe probe_ps_spread_rounds(const std::vector<std::string>& endpoints, const std::string& token, int rank,
                                     int world, PsClientOptions options, int64_t params, int rounds, int warmup,
                                     double gap_s, double offset_s) {
  return ps_rounds(endpoints, token, rank, world, std::move(options), params, rounds, warmup, gap_s, false, offset_s);
}

}  // namespace syncopate
