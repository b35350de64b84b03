// syncopate-bench-ps: push-and-pull throughput of one worker against K parameter-server shards
// (--partition-mb M: each shard's range in pipelined partitions of at most M MiB).
// Run W copies (scripts/bench_ps.sh does it) with NODE_RANK/NNODES/SYNCOPATE_TOKEN set. Prints
//   worker bytes iters time_s push_pull_GBps updates_per_s
// where push_pull_GBps counts both directions (2 x bytes per round trip), the traffic a worker's
// link carries, and updates_per_s x elements is the parameters per second this worker drives.
// --seconds S (soak): round trips until S seconds have passed instead of --iters, then also
//   latency worker round_trips p50_ms p99_ms max_ms
// (round_trips counts the warm-up too: the pushes this worker made). --stats: print each shard's
// STATS JSON (one line each) and exit.
#include <algorithm>
#include <chrono>
#include <vector>
#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "common/check.h"
#include "common/comm/job_token.h"
#include "server/ps_client.h"
#include "server/ps_keys.h"
#include "worker/sync/gradient_sync.h"

using namespace syncopate;

int main(int argc, char** argv) {
  CLI::App app{"parameter-server push/pull benchmark"};
  std::string servers;
  int64_t bytes = 64 << 20;
  int iters = 10;
  app.add_option("--servers", servers, "server endpoints, comma-separated")->required();
  app.add_option("--bytes", bytes, "parameter vector size, bytes");
  app.add_option("--iters", iters, "timed round trips");
  double seconds = 0;
  bool stats_only = false;
  app.add_option("--seconds", seconds, "soak: round trips for this long instead of --iters");
  app.add_flag("--stats", stats_only, "print every shard's STATS JSON and exit");
  double partition_mb = 4;  // dist.ps_partition_mb's default
  app.add_option("--partition-mb", partition_mb,
                 "push and pull each shard in partitions of at most this many MiB, pipelined (0 = whole shards)");
  std::string encrypt = "auto";
  app.add_option("--encrypt", encrypt, "auto: CURVE with the servers' key derived from the job token; off: plain TCP");
  CLI11_PARSE(app, argc, argv);
  try {
    const int rank = std::getenv("NODE_RANK") ? std::atoi(std::getenv("NODE_RANK")) : 0;
    const int world = std::getenv("NNODES") ? std::atoi(std::getenv("NNODES")) : 1;
    const std::string token = job_token_from_environment();
    PsClientOptions o{120};
    o.curve_server_key = ps_client_server_key(token, encrypt);
    DistConfig dist;  // the worker's conversion of dist.ps_partition_mb
    dist.ps_partition_mb = partition_mb;
    o.partition_elems = partition_elems(dist);
    PsClient c(PsClient::parse_endpoints(servers), token, rank, world, o);
    if (stats_only) {
      for (int k = 0; k < c.shards(); ++k) std::cout << c.stats(k) << std::endl;
      return 0;
    }
    auto params = torch::zeros({bytes / 4});
    auto grads = torch::full({bytes / 4}, 1e-3f);
    c.init(params, {}, AdamWConfig{});
    push_pull(c, grads, params, 0, 0.0);  // warm-up
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    std::vector<double> ms;  // per round trip
    int i = 1;
    for (; seconds > 0 ? std::chrono::duration<double>(clock::now() - t0).count() < seconds : i <= iters; ++i) {
      const auto t = clock::now();
      push_pull(c, grads, params, i, 0.0);
      ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - t).count());
    }
    iters = i - 1;
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    std::cout << fmt::format("{} {} {} {:.3f} {:.3f} {:.1f}", rank, bytes, iters, s, 2.0 * bytes * iters / s / 1e9, iters / s)
              << std::endl;
    if (seconds > 0 && !ms.empty()) {
      std::sort(ms.begin(), ms.end());
      auto q = [&](double f) { return ms[std::min(ms.size() - 1, static_cast<size_t>(f * static_cast<double>(ms.size())))]; };
      std::cout << fmt::format("latency {} {} {:.2f} {:.2f} {:.2f}", rank, iters + 1, q(0.5), q(0.99), ms.back()) << std::endl;
    }
  } catch (const Error& e) {
    std::cerr << "syncopate-bench-ps: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
