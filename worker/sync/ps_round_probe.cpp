#include "worker/sync/ps_round_probe.h"

#include <chrono>
#include <thread>

#include <torch/torch.h>

#include "common/check.h"

namespace syncopate {

PsRoundProbe probe_ps_rounds(const std::vector<std::string>& endpoints, const std::string& token, int rank, int world,
                             const PsClientOptions& options, int64_t params, int rounds, int warmup, double gap_s) {
  SYN_CHECK(params > 0 && rounds > 0 && warmup >= 0 && gap_s >= 0, "probe_ps_rounds: nothing to time", "a caller bug");
  PsClient client(endpoints, token, rank, world, options);
  at::Tensor values = torch::zeros({params}, torch::kFloat32);
  const at::Tensor grads = torch::zeros({params}, torch::kFloat32);
  client.init(values, {}, AdamWConfig{}, 0);
  PsRoundProbe r;
  r.servers = client.shards();
  r.parts = client.parts();
  int64_t clock = 0;
  PsClientCounters before = client.counters();
  for (int i = 0; i < warmup + rounds; ++i, ++clock) {
    if (i == warmup) before = client.counters();
    std::this_thread::sleep_for(std::chrono::duration<double>(gap_s));
    const auto t0 = std::chrono::steady_clock::now();
    push_pull(client, grads, values, clock, 0.0);
    if (i >= warmup) r.round_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const PsClientCounters after = client.counters();
  r.bytes_pushed = (after.bytes_sent - before.bytes_sent) / rounds;
  r.bytes_received = (after.bytes_received - before.bytes_received) / rounds;
  client.finish(clock);
  return r;
}

}  // namespace syncopate
