// syncopate-server: one parameter-server shard. Start K of them (scripts/local_cluster.sh --servers K
// does it per node); workers in `ps` mode shard the flat parameter vector across them.
//   syncopate-server [--server.host=IP] [--server.port=P] [--server.shard=I] [--ps.consistency=bsp|ssp|asp]
//                    [--ps.staleness_bound=S] [--ps.mitigation=none|lr_scale|dc_asgd]
// The job token comes from $SYNCOPATE_TOKEN (or the file named by $SYNCOPATE_TOKEN_FILE).
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <iostream>

#include <ATen/Parallel.h>
#include <zmq.h>

#include "common/check.h"
#include "common/comm/job_token.h"
#include "common/config_schema.h"
#include "server/ps_server.h"

using namespace syncopate;

namespace {
std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop = true; }
}  // namespace

int main(int argc, char** argv) {
  ServerConfig sc;
  PsConfig pc;
  ConfigSchema schema;
  schema.section("server", sc);
  schema.section("ps", pc);
  try {
    auto rest = schema.apply_args(std::vector<std::string>(argv + 1, argv + argc));
    for (auto& a : rest) {
      if (a == "--generate-curve-keys") {  // "PUBLIC SECRET": give PUBLIC to the workers (dist.curve_server_key)
        char pub[41], sec[41];
        SYN_CHECK(zmq_curve_keypair(pub, sec) == 0, "this libzmq has no CURVE support", "install libzmq built with libsodium");
        std::cout << pub << " " << sec << "\n";
        return 0;
      }
      if (a == "--help" || a == "-h") {
        std::cout << "usage: syncopate-server [--section.field=value ...]\n" << schema.help();
        return 0;
      }
      SYN_FAIL("unknown argument '" + a + "'", "see syncopate-server --help");
    }
    if (sc.port == 0 && std::getenv("MASTER_PORT")) sc.port = std::atoi(std::getenv("MASTER_PORT")) + 1 + sc.shard;
    if (sc.port == -1) sc.port = 0;  // any free port: PsServer binds '*'
  } catch (const Error& e) {
    std::cerr << "syncopate-server: config error: " << e.what() << "\n";
    return 2;
  }
  const std::string token = job_token_or_insecure_default("[server]");
  try {
    if (sc.threads > 0) at::set_num_threads(static_cast<int>(sc.threads));
    // SIGTERM / SIGINT end the loop cleanly (the shard's statistics are logged on the way out).
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    PsServer(sc, pc, token).run({}, [] { return g_stop.load(); });
  } catch (const Error& e) {
    std::cerr << "syncopate-server: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
