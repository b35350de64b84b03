// syncopate-worker: trains a GPT. With no arguments it runs the embedded default (a tiny GPT on
// the byte-tokenized Python standard library, on CPU or one GPU).
//
//   syncopate-worker [--config FILE.toml] [--out DIR] [--resume] [--section.field=value ...]
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/crash_report.h"
#include "common/stop_signal.h"
#include "worker/train/readvise.h"
#include "common/atomic_file.h"
#include "common/check.h"
#include "common/command_line.h"
#include "common/config_schema.h"
#include "common/log.h"
#include "worker/sync/advice.h"
#include "worker/sync/dist_config.h"
#include "worker/train/run_config.h"
#include "worker/train/node_training.h"

using namespace syncopate;

namespace {
const char* kUsage =
    "usage: syncopate-worker [--config FILE.toml] [--out DIR] [--resume | --force] [--print-config]\n"
    "                        [--section.field=value ...]\n"
    "Trains a GPT; writes DIR/metrics.jsonl, DIR/samples.txt and DIR/checkpoints/.\n"
    "  --config FILE   TOML file with [section] tables of the fields below; the [ps] and [server]\n"
    "                  sections of syncopate-server are skipped (one job.toml serves both; see configs/)\n"
    "  --out DIR       run directory (default runs/default); {node} becomes this node's rank\n"
    "                  (one process per GPU under torchrun/srun: --out runs/job/node{node})\n"
    "  --resume        continue from DIR/checkpoints/latest\n"
    "  --force         start afresh in a DIR that holds a run (DIR/checkpoints/latest): its metrics,\n"
    "                  samples and checkpoints are deleted first (without --resume or --force such a\n"
    "                  DIR is refused)\n"
    "  --print-config  print the config as TOML and exit; dist.nnodes, node_rank, master_addr and\n"
    "                  master_port are annotated with the values this run would use and their source\n"
    "Fields (current value, doc, allowed values):\n";
}

// The config as TOML, with the [dist] fields the environment fills in annotated with the values
// this process would use and where each comes from ("nnodes = 0  # this run: 3 (from $NNODES)").
std::string annotated_config(const ConfigSchema& schema, const RunConfig& cfg) {
  std::vector<ResolvedField> resolved;
  std::string problem;
  try {
    resolved = explain_resolution(cfg.dist);
  } catch (const Error& e) {
    problem = e.what();
  }
  std::istringstream in(schema.to_toml());
  std::string out, line, section;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '[') section = line;
    if (section == "[dist]")
      for (const auto& r : resolved)
        if (line.rfind(r.field + " = ", 0) == 0) line += fmt::format("  # this run: {} (from {})", r.value, r.source);
    out += line + "\n";
    if (line == "[dist]" && !problem.empty())
      out += fmt::format("# the environment does not resolve here: {}\n", problem);
  }
  return out;
}

int main(int argc, char** argv) {
  // SIGTERM as a preemption notice: stop at the next step boundary (common/stop_signal.h). First,
  // before any thread starts, so that every thread inherits the blocked signal.
  install_stop_signal(TrainConfig{}.preempt_grace_s);
  install_crash_report("syncopate-worker");  // a fatal signal prints the native stack (common/crash_report.h)
  std::vector<std::string> args(argv + 1, argv + argc);
  RunConfig cfg;
  ConfigSchema schema;
  cfg.bind(schema);
  schema.foreign_section("ps", "syncopate-server");
  schema.foreign_section("server", "syncopate-server");
  std::string out = "runs/default";
  bool resume = false, force = false, print_config = false;
  try {
    const std::vector<std::string> rest = apply_command_line(schema, args);
    for (size_t i = 0; i < rest.size(); ++i) {
      const std::string& a = rest[i];
      if (a == "--help" || a == "-h") {
        std::cout << kUsage << schema.help();
        return 0;
      } else if (a == "--resume") {
        resume = true;
      } else if (a == "--force") {
        force = true;
      } else if (a == "--print-config") {
        print_config = true;
      } else if (flag_value(rest, i, "--out", out)) {
        SYN_CHECK(!out.empty(), "--out needs a directory", "write --out DIR");
      } else {
        SYN_FAIL(fmt::format("unknown argument '{}'", a), "see syncopate-worker --help");
      }
    }
    const bool advised = cfg.dist.mode == "auto";
    if (advised) {  // the advice's [dist] flags, before anything reads the config
      RunConfig fresh;
      ConfigSchema defaults;
      fresh.bind(defaults);
      DistConfig resolved = cfg.dist;
      resolved.mode = "ring";  // (so that the node count comes from the environment)
      int64_t nodes = 0;
      try {
        resolve_from_environment(resolved);
        nodes = resolved.nnodes;
      } catch (const Error&) {
        // the layout's own error is reported by the run itself, after the advice is applied
      }
      std::set<std::string> given;  // [dist] fields given on the command line
      for (const auto& a : args)
        if (a.rfind("--dist.", 0) == 0) given.insert(a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2));
      const AppliedAdvice advice = apply_advice(schema, defaults, cfg.dist.advice, nodes, given);
      if (print_config)  // (stdout carries the TOML)
        std::cerr << "[dist] " << advice.summary << "\n";
      else
        log::info("[dist] {}", advice.summary);
      for (const auto& w : advice.warnings) log::warn("[dist] {}", w);
    }
    cfg.validate();
    SYN_CHECK(cfg.dist.readvise_every == 0 || advised,
              fmt::format("dist.readvise_every={} without dist.mode=auto", cfg.dist.readvise_every),
              "a switch needs the advice the run started from: give --dist.mode=auto --dist.advice=advice.json, or "
              "--dist.readvise_every=0");
    if (!print_config) {
      out = claim_run_dir(cfg, out, resume, force);
      // The advice the run started from stays with it (the watch for drift compares the run with
      // it, and a re-advice starts from it); a run started otherwise has none.
      const std::string kept = out + "/" + kAppliedAdviceFile;
      if (advised) {
        std::filesystem::create_directories(out);
        write_file_atomic(kept, read_file(cfg.dist.advice));
      } else if (!resume) {  // (a resume keeps the record of the advice the run started from)
        std::remove(kept.c_str());
      }
    }
  } catch (const Error& e) {
    std::cerr << "syncopate-worker: config error: " << e.what() << "\n";
    return 2;
  }
  if (print_config) {
    std::cout << annotated_config(schema, cfg);
    return 0;
  }
  install_stop_signal(cfg.train.preempt_grace_s);  // the configured grace period
  try {
    if (train_node(cfg, out, resume, schema.to_toml())) return kExitSwitch;  // (scripts/launch_node.sh restarts it)
  } catch (const Error& e) {
    std::cerr << "syncopate-worker: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "syncopate-worker: unexpected error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
