// syncopate-sim: a cluster of N virtual workers (1..4096) trains the real model in simulated
// time, one gradient at a time (experiments/sim/virtual_cluster.h). Takes the worker's flags
// (--model.*, --train.*, --optim.*, --schedule.*, --eval.*, --dist.mode/sync_every/outer*,
// --emulate.*), the servers' (--ps.*) and its own (--sim.*).
//
//   syncopate-sim --out DIR --sim.workers=64 --dist.mode=ps --ps.consistency=asp
//                 --emulate.step_time_s=0.3 --sim.link_gbit=1 [--config FILE.toml]
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/command_line.h"
#include "common/config_schema.h"
#include "common/log.h"
#include "experiments/sim/virtual_cluster.h"

using namespace syncopate;

namespace {
const char* kUsage =
    "usage: syncopate-sim [--config FILE.toml] [--out DIR] [--print-config] [--quiet] [--section.field=value ...]\n"
    "Simulates sim.workers workers training the model in virtual time (real gradients, modelled compute and links).\n"
    "Writes DIR/node<r>/metrics.jsonl per worker (time in simulated seconds), DIR/logs/server<k>.log (the shards'\n"
    "stats, ps mode) and DIR/sim.json (simulated and real seconds, events, bytes). The same config gives the same\n"
    "files, byte for byte.\n"
    "  --config FILE   TOML file with [section] tables of the fields below\n"
    "  --out DIR       output directory (default runs/sim)\n"
    "  --print-config  print the resolved config as TOML and exit\n"
    "  --quiet         no progress lines\n"
    "Fields (current value, doc, allowed values):\n";

// The run's one-screen summary (issue 32): what ran, how far it got, where the files are.
void print_summary(const SimResult& r, const RunConfig& run, const PsConfig& ps, const SimConfig& sim, const std::string& out) {
  const std::string mode = run.dist.mode == "ring" ? std::string("ring") : fmt::format("ps {}", ps.consistency);
  const std::string rounds = run.dist.sync_every > 1 ? fmt::format(", local SGD H={}", run.dist.sync_every) : "";
  std::cout << fmt::format("[sim] summary of {} (times are simulated seconds):\n", out)
            << fmt::format("  {} workers, {}{}{}: {} worker-steps, {} tokens in {:.2f} s ({:.0f} tokens/s)\n", sim.workers,
                           mode, run.dist.mode == "ring" ? "" : fmt::format(" through {} shard(s)", sim.shard_count()),
                           rounds, r.worker_steps, r.tokens, r.sim_s, r.sim_s > 0 ? r.tokens / r.sim_s : 0.0);
  if (std::isnan(r.final_val_loss))
    std::cout << "  final validation loss: none (worker 0 did not evaluate)\n";
  else
    std::cout << fmt::format("  final validation loss (worker 0, {} weights): {:.4f}\n", r.final_eval_of, r.final_val_loss);
  if (sim.target_loss > 0)
    std::cout << (r.target_s >= 0 ? fmt::format("  target {:.3f}: reached at {:.2f} s (the run stopped there)\n", sim.target_loss, r.target_s)
                                  : fmt::format("  target {:.3f}: not reached\n", sim.target_loss));
  std::cout << fmt::format("  bytes sent: {:.1f} MB ({:.2f} MB per worker-step)\n", r.bytes_sent / 1e6,
                           r.bytes_sent / 1e6 / static_cast<double>(std::max<int64_t>(1, r.worker_steps)))
            << fmt::format("  real time: {:.1f} s ({:.1f} ms per worker-step, {:.0f}% computing gradients)\n", r.real_s,
                           1e3 * r.real_s / static_cast<double>(std::max<int64_t>(1, r.worker_steps)),
                           100.0 * r.gradient_s / std::max(r.real_s, 1e-9))
            << fmt::format("  files: {0}/node<r>/metrics.jsonl (per worker), {0}/sim.json (totals), {0}/config.toml{1}\n", out,
                           run.dist.mode == "ring" ? "" : fmt::format(", {}/logs/server<k>.log (the shards' stats)", out));
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  RunConfig run;
  PsConfig ps;
  SimConfig sim;
  // Defaults of a small study: 4 workers through ASP shards, 0.3 s modelled steps, 10 Gbit/s links.
  run.dist.mode = "ps";
  run.train.steps = 200;
  run.train.batch_size = 8;
  run.train.threads = 1;
  run.eval.every = 20;
  run.eval.batches = 4;
  run.eval.sample_tokens = 0;
  run.emulate.step_time_s = 0.3;
  ConfigSchema schema;
  run.bind(schema);
  schema.section("ps", ps);
  schema.section("sim", sim);
  std::string out = "runs/sim";
  bool print_config = false, quiet = false;
  try {
    const std::vector<std::string> rest = apply_command_line(schema, args);
    for (size_t i = 0; i < rest.size(); ++i) {
      const std::string& a = rest[i];
      if (a == "--help" || a == "-h") {
        std::cout << kUsage << schema.help();
        return 0;
      } else if (a == "--print-config") {
        print_config = true;
      } else if (a == "--quiet") {
        quiet = true;
      } else if (flag_value(rest, i, "--out", out)) {
        SYN_CHECK(!out.empty(), "--out needs a directory", "write --out DIR");
      } else {
        SYN_FAIL(fmt::format("unknown argument '{}'", a), "see syncopate-sim --help");
      }
    }
    validate_simulation(run, ps, sim);
  } catch (const Error& e) {
    std::cerr << "syncopate-sim: config error: " << e.what() << "\n";
    return 2;
  }
  if (print_config) {
    std::cout << schema.to_toml();
    return 0;
  }
  try {
    std::filesystem::create_directories(out);
    write_file_atomic(out + "/config.toml", schema.to_toml());  // what produced these files
    const SimResult r = run_simulation(run, ps, sim, out, !quiet);
    if (!quiet) print_summary(r, run, ps, sim, out);
  } catch (const Error& e) {
    std::cerr << "syncopate-sim: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "syncopate-sim: unexpected error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
