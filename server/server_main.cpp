// syncopate-server: one parameter-server shard. Start K of them (scripts/local_cluster.sh --servers K
// does it per node); workers in `ps` mode shard the flat parameter vector across them. It reads
// the job's TOML file (--config, the worker's too): its [server], [ps] and [trace] sections, and
// skips the worker's by name. Usage: kUsage below.
// The job token comes from $SYNCOPATE_TOKEN (or the file named by $SYNCOPATE_TOKEN_FILE).
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <chrono>
#include <iostream>
#include <thread>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <zmq.h>

#include "common/crash_report.h"
#include "common/check.h"
#include "common/comm/job_token.h"
#include "common/command_line.h"
#include "common/config_schema.h"
#include "common/trace.h"
#include "server/ps_client.h"
#include "server/ps_server.h"
#include "server/ps_status.h"

using namespace syncopate;

namespace {
const char* kUsage =
    "usage: syncopate-server [--config FILE.toml] [--print-config] [--section.field=value ...]\n"
    "       syncopate-server --status tcp://H:P[,tcp://H:P...] [--json] [--watch SECONDS]\n"
    "       syncopate-server --generate-curve-keys\n"
    "Runs one parameter-server shard until interrupted (or, with server.exit_when_done, until the workers end).\n"
    "  --config FILE          the job's TOML file: its [server], [ps] and [trace] sections; the worker's\n"
    "                         sections ([model], [train], [dist], ...) are skipped (see configs/)\n"
    "  --print-config         print this shard's config as TOML and exit\n"
    "  --status ENDPOINTS     live status of a job's shards (clock, staleness, straggler per worker);\n"
    "                         --json: one JSON object per poll; --watch S: poll every S seconds.\n"
    "                         Exit 0 when every shard answered (one no worker has joined yet included),\n"
    "                         3 when one did not\n"
    "  --generate-curve-keys  print a CURVE key pair 'PUBLIC SECRET' (PUBLIC goes to the workers'\n"
    "                         dist.curve_server_key; both to server.curve_key_file) and exit\n"
    "The job token comes from $SYNCOPATE_TOKEN (or the file named by $SYNCOPATE_TOKEN_FILE); with\n"
    "server.encrypt=auto (the default) the CURVE keys derive from it.\n"
    "Fields (current value, doc, allowed values):\n";
std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop = true; }
}  // namespace

// --status ENDPOINTS [--json] [--watch S]: one poll (or one every S seconds until interrupted) of
// every shard's STATS, as a table or one JSON object per line.
int status(const std::vector<std::string>& args, const ServerConfig& sc) {
  try {
    SYN_CHECK(args.size() >= 2, "--status needs the shards' endpoints", "e.g. --status tcp://10.0.0.1:29501,tcp://10.0.0.2:29501");
    bool json = false;
    double watch = 0;
    for (size_t i = 2; i < args.size(); ++i) {
      if (args[i] == "--json") json = true;
      else if (args[i] == "--watch" && i + 1 < args.size()) watch = std::stod(args[++i]);
      else SYN_FAIL("unknown --status argument '" + args[i] + "'", "use --json and --watch SECONDS");
    }
    StatusOptions o;
    o.token = job_token_or_insecure_default("[status]");
    o.encrypt = sc.encrypt;
    const auto endpoints = PsClient::parse_endpoints(args[1]);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    nlohmann::json last;
    do {
      last = poll_status(endpoints, o, last);
      std::cout << (json ? last.dump() + "\n" : format_status(last) + "\n") << std::flush;
      for (double slept = 0; watch > 0 && slept < watch && !g_stop; slept += 0.1)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } while (watch > 0 && !g_stop);
    for (const auto& s : last["shards"])
      if (!s["ok"].get<bool>()) return 3;  // a shard did not answer (named above)
    return 0;
  } catch (const Error& e) {
    std::cerr << "syncopate-server --status: " << e.what() << "\n";
    return 2;
  }
}

int main(int argc, char** argv) {
  install_crash_report("syncopate-server");  // a fatal signal prints the native stack (common/crash_report.h)
  ServerConfig sc;
  PsConfig pc;
  TraceConfig tc;
  ConfigSchema schema;
  schema.section("server", sc);
  schema.section("ps", pc);
  schema.section("trace", tc);
  // The worker's sections of a shared job file (syncopate-worker --print-config lists them).
  for (const char* s : {"model", "data", "train", "optim", "schedule", "eval", "checkpoint", "dist", "emulate"})
    schema.foreign_section(s, "syncopate-worker");
  try {
    auto rest = apply_command_line(schema, std::vector<std::string>(argv + 1, argv + argc));
    if (!rest.empty() && rest[0] == "--status") return status(rest, sc);
    for (auto& a : rest) {
      if (a == "--print-config") {
        std::cout << schema.to_toml();
        return 0;
      }
      if (a == "--generate-curve-keys") {  // "PUBLIC SECRET": give PUBLIC to the workers (dist.curve_server_key)
        char pub[41], sec[41];
        SYN_CHECK(zmq_curve_keypair(pub, sec) == 0, "this libzmq has no CURVE support", "install libzmq built with libsodium");
        std::cout << pub << " " << sec << "\n";
        return 0;
      }
      if (a == "--help" || a == "-h") {
        std::cout << kUsage << schema.help();
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
    TraceSession trace(tc.file, fmt::format("server shard {}", sc.shard));
    PsServer(sc, pc, token).run({}, [] { return g_stop.load(); });
  } catch (const Error& e) {
    std::cerr << "syncopate-server: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
