// syncopate-worker: trains a GPT. With no arguments it runs the embedded default (a tiny GPT on
// the byte-tokenized Python standard library, on CPU or one GPU).
//
//   syncopate-worker [--config FILE.toml] [--out DIR] [--resume] [--section.field=value ...]
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/check.h"
#include "common/command_line.h"
#include "common/config_schema.h"
#include "worker/train/run_config.h"
#include "worker/train/node_training.h"

using namespace syncopate;

namespace {
const char* kUsage =
    "usage: syncopate-worker [--config FILE.toml] [--out DIR] [--resume] [--print-config]\n"
    "                        [--section.field=value ...]\n"
    "Trains a GPT; writes DIR/metrics.jsonl, DIR/samples.txt and DIR/checkpoints/.\n"
    "  --config FILE   TOML file with [section] tables of the fields below\n"
    "  --out DIR       run directory (default runs/default); {node} becomes this node's rank\n"
    "                  (one process per GPU under torchrun/srun: --out runs/job/node{node})\n"
    "  --resume        continue from DIR/checkpoints/latest\n"
    "  --print-config  print the resolved config as TOML and exit\n"
    "Fields (current value, doc, allowed values):\n";
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  RunConfig cfg;
  ConfigSchema schema;
  cfg.bind(schema);
  std::string out = "runs/default";
  bool resume = false, print_config = false;
  try {
    const std::vector<std::string> rest = apply_command_line(schema, args);
    for (size_t i = 0; i < rest.size(); ++i) {
      const std::string& a = rest[i];
      if (a == "--help" || a == "-h") {
        std::cout << kUsage << schema.help();
        return 0;
      } else if (a == "--resume") {
        resume = true;
      } else if (a == "--print-config") {
        print_config = true;
      } else if (flag_value(rest, i, "--out", out)) {
        SYN_CHECK(!out.empty(), "--out needs a directory", "write --out DIR");
      } else {
        SYN_FAIL(fmt::format("unknown argument '{}'", a), "see syncopate-worker --help");
      }
    }
    cfg.validate();
  } catch (const Error& e) {
    std::cerr << "syncopate-worker: config error: " << e.what() << "\n";
    return 2;
  }
  if (print_config) {
    std::cout << schema.to_toml();
    return 0;
  }
  try {
    train_node(cfg, out, resume, schema.to_toml());
  } catch (const Error& e) {
    std::cerr << "syncopate-worker: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "syncopate-worker: unexpected error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
