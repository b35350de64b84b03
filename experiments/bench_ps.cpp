// syncopate-bench-ps: push-and-pull throughput of one worker against K parameter-server shards.
// Run W copies (scripts/bench_ps.sh does it) with NODE_RANK/NNODES/SYNCOPATE_TOKEN set. Prints
//   worker bytes iters time_s push_pull_GBps updates_per_s
// where push_pull_GBps counts both directions (2 x bytes per round trip), the traffic a worker's
// link carries, and updates_per_s x elements is the parameters per second this worker drives.
#include <chrono>
#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "common/check.h"
#include "common/comm/job_token.h"
#include "server/ps_client.h"
#include "server/ps_keys.h"

using namespace syncopate;

int main(int argc, char** argv) {
  CLI::App app{"parameter-server push/pull benchmark"};
  std::string servers;
  int64_t bytes = 64 << 20;
  int iters = 10;
  app.add_option("--servers", servers, "server endpoints, comma-separated")->required();
  app.add_option("--bytes", bytes, "parameter vector size, bytes");
  app.add_option("--iters", iters, "timed round trips");
  std::string encrypt = "auto";
  app.add_option("--encrypt", encrypt, "auto: CURVE with the servers' key derived from the job token; off: plain TCP");
  CLI11_PARSE(app, argc, argv);
  try {
    const int rank = std::getenv("NODE_RANK") ? std::atoi(std::getenv("NODE_RANK")) : 0;
    const int world = std::getenv("NNODES") ? std::atoi(std::getenv("NNODES")) : 1;
    const std::string token = job_token_from_environment();
    PsClientOptions o{120};
    if (encrypt == "auto" && !is_insecure_default_token(token)) o.curve_server_key = ps_server_keys_from_token(token).public_z85;
    PsClient c(PsClient::parse_endpoints(servers), token, rank, world, o);
    auto params = torch::zeros({bytes / 4});
    auto grads = torch::full({bytes / 4}, 1e-3f);
    c.init(params, {}, AdamWConfig{});
    push_pull(c, grads, params, 0, 0.0);  // warm-up
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 1; i <= iters; ++i) push_pull(c, grads, params, i, 0.0);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << fmt::format("{} {} {} {:.3f} {:.3f} {:.1f}", rank, bytes, iters, s, 2.0 * bytes * iters / s / 1e9, iters / s)
              << std::endl;
  } catch (const Error& e) {
    std::cerr << "syncopate-bench-ps: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
