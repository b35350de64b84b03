#include "worker/train/node_training.h"

#include <atomic>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include <c10/core/DeviceGuard.h>
#include <fmt/format.h>

#include "common/check.h"
#include "common/comm/local_group.h"
#include "common/log.h"
#include "common/comm/rendezvous.h"
#include "common/trace.h"
#include "worker/train/trainer.h"

namespace syncopate {
namespace fs = std::filesystem;

std::string claim_run_dir(RunConfig cfg, std::string out_dir, bool resume, bool force) {
  resolve_from_environment(cfg.dist);
  for (size_t at = out_dir.find("{node}"); at != std::string::npos; at = out_dir.find("{node}"))
    out_dir.replace(at, 6, std::to_string(cfg.dist.node_rank));
  // A run already there (one that finished or checkpointed: checkpoints/latest) is continued
  // (--resume), replaced (--force), or refused: never overwritten by accident. (A run that died
  // before its first checkpoint has nothing to resume: it is started afresh, as launch_node.sh's
  // restarts expect.)
  const fs::path metrics_file = fs::path(out_dir) / "metrics.jsonl", checkpoints = fs::path(out_dir) / "checkpoints";
  SYN_CHECK(!(resume && force), "--resume and --force together",
            "--resume continues the run in --out, --force deletes it and starts afresh: give one");
  if (!resume && fs::exists(checkpoints / "latest")) {
    SYN_CHECK(force, fmt::format("'{}' already holds a run (checkpoints/latest, metrics.jsonl)", out_dir),
              "continue it with --resume, replace it with --force (its metrics, samples and checkpoints are "
              "deleted), or give another --out");
    fs::remove(metrics_file);
    fs::remove(fs::path(out_dir) / "samples.txt");
    fs::remove_all(checkpoints);
    log::info("[train] --force: removed the earlier run's metrics, samples and checkpoints from {}", out_dir);
  }
  return out_dir;
}

bool train_node(RunConfig cfg, std::string out_dir, bool resume, const std::string& config_toml) {
  resolve_from_environment(cfg.dist);  // (join_job does it too) the node's rank names its timeline
  // "{node}" in --out: processes that share a command line (torchrun, srun) get a directory each.
  for (size_t at = out_dir.find("{node}"); at != std::string::npos; at = out_dir.find("{node}"))
    out_dir.replace(at, 6, std::to_string(cfg.dist.node_rank));
  TraceSession trace(cfg.trace.file, fmt::format("worker node {}", cfg.dist.node_rank));  // opened now: a bad path fails at start
  JobMembership job = join_job(cfg, out_dir, resume);
  if (job.ring && cfg.dist.node_rank != 0) Tracer::global().clock_sync("worker node 0", job.ring->clock_offset_us, -1);
  const int L = job.local_size;
  if (L == 1) {  // the single-replica path: this thread trains
    Trainer t(cfg, out_dir, resume, config_toml, job, 0);
    t.run();
    return t.switching();
  }
  std::atomic<bool> switching{false};
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int l = 0; l < L; ++l) {
    threads.emplace_back([&, l] {
      try {
        std::unique_ptr<c10::DeviceGuard> on_device;  // this thread's current CUDA device
        if (!job.devices.empty())
          on_device = std::make_unique<c10::DeviceGuard>(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(job.devices[l])));
        Trainer t(cfg, out_dir, resume, config_toml, job, l);
        t.run();
        if (t.switching()) switching = true;
      } catch (...) {
        {
          std::lock_guard<std::mutex> g(mu);
          if (!first) {
            first = std::current_exception();
          }
        }
        job.abort_failed_replica(l);
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
  return switching;
}

}  // namespace syncopate
