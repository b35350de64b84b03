// syncopate-rendezvous: the rendezvous service of elastic rings (dist.mode=ring, dist.elastic=true).
// Start it once per job, on a host that outlives the nodes (launch_node.sh starts it on node 0's
// host; the nodes find it at MASTER_ADDR:MASTER_PORT). It keeps the membership (who is in the
// ring, its epoch, who holds the state a joiner takes) and nothing else: no weights, no data.
//
//   syncopate-rendezvous [--host IP] [--port N | --port -1 --port-file FILE] [--exit-when-done]
//                        [--idle-exit-s S]
// The job token comes from SYNCOPATE_TOKEN / SYNCOPATE_TOKEN_FILE, as for the nodes. SIGTERM or
// SIGINT ends it; so does the job's end with --exit-when-done / --idle-exit-s.
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
  bool exit_when_done = false;
  double idle_exit_s = 0;
  app.add_flag("--exit-when-done", exit_when_done,
               "stop once a node finished the job's last step and every node's session ended");
  app.add_option("--idle-exit-s", idle_exit_s,
                 "stop after this many seconds without any node's session (counted once a first session ended); 0 = never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
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
    o.exit_when_done = exit_when_done;
    o.idle_exit_s = idle_exit_s;
    o.on_listening = [&](uint16_t p) {
      if (!port_file.empty()) publish_file(port_file, std::to_string(p) + "\n");
      log::info("[rendezvous] listening on {}:{}", host, p);
    };
    // Shared with the signal thread, which may outlive run() (the service can end by itself).
    auto service = std::make_shared<RendezvousService>(o);
    std::thread signals([service, set]() mutable {
      int sig = 0;
      sigwait(&set, &sig);
      log::info("[rendezvous] signal {}: stopping", sig);
      service->stop();
    });
    signals.detach();
    service->run();
    return 0;
  } catch (const std::exception& e) {
    log::error("syncopate-rendezvous: {}", e.what());
    return 1;
  }
}
