// syncopate-rendezvous: the rendezvous service of elastic rings (dist.mode=ring, dist.elastic=true).
// Start it once per job, on a host that outlives the nodes (launch_node.sh starts it on node 0's
// host; the nodes find it at MASTER_ADDR:MASTER_PORT). It keeps the membership (who is in the
// ring, its epoch, who holds the state a joiner takes) and nothing else: no weights, no data.
//
//   syncopate-rendezvous [--host IP] [--port N | --port -1 --port-file FILE]
// The job token comes from SYNCOPATE_TOKEN / SYNCOPATE_TOKEN_FILE, as for the nodes. SIGTERM or
// SIGINT ends it.
#include <signal.h>

#include <thread>

#include <CLI/CLI.hpp>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/comm/job_token.h"
#include "common/comm/rendezvous_service.h"
#include "common/log.h"

using namespace syncopate;

int main(int argc, char** argv) {
  CLI::App app{"syncopate-rendezvous: the membership service of elastic ring jobs (dist.elastic with dist.mode=ring)"};
  std::string host = "127.0.0.1", port_file;
  int port = 29500;
  app.add_option("--host", host, "address to listen on: the one the nodes reach (MASTER_ADDR)")->capture_default_str();
  app.add_option("--port", port, "TCP port (MASTER_PORT); -1 = any free port, written to --port-file")
      ->check(CLI::Range(-1, 65535))
      ->capture_default_str();
  app.add_option("--port-file", port_file, "with --port -1: the file the port is written to (the nodes' dist.rendezvous_file)");
  CLI11_PARSE(app, argc, argv);
  try {
    SYN_CHECK(port != -1 || !port_file.empty(), "--port -1 needs --port-file", "give the file the nodes read the port from");
    // SIGTERM / SIGINT: taken by one waiting thread, which stops the service.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    RendezvousServiceOptions o;
    o.host = host;
    o.port = static_cast<uint16_t>(port < 0 ? 0 : port);
    o.token = job_token_or_insecure_default("[rendezvous]");
    o.on_listening = [&](uint16_t p) {
      if (!port_file.empty()) publish_file(port_file, std::to_string(p) + "\n");
      log::info("[rendezvous] listening on {}:{}", host, p);
    };
    RendezvousService service(o);
    std::thread signals([&] {
      int sig = 0;
      sigwait(&set, &sig);
      log::info("[rendezvous] signal {}: stopping", sig);
      service.stop();
    });
    signals.detach();
    service.run();
    return 0;
  } catch (const std::exception& e) {
    log::error("syncopate-rendezvous: {}", e.what());
    return 1;
  }
}
