#include "worker/train/node_training.h"

#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <c10/core/DeviceGuard.h>
#include <fmt/format.h>

#include "common/check.h"
#include "common/comm/local_group.h"
#include "common/comm/rendezvous.h"
#include "common/trace.h"
#include "worker/train/trainer.h"

namespace syncopate {

void train_node(RunConfig cfg, std::string out_dir, bool resume, const std::string& config_toml) {
  resolve_from_environment(cfg.dist);  // (join_job does it too) the node's rank names its timeline
  // "{node}" in --out: processes that share a command line (torchrun, srun) get a directory each.
  for (size_t at = out_dir.find("{node}"); at != std::string::npos; at = out_dir.find("{node}"))
    out_dir.replace(at, 6, std::to_string(cfg.dist.node_rank));
  TraceSession trace(cfg.trace.file, fmt::format("worker node {}", cfg.dist.node_rank));  // opened now: a bad path fails at start
  JobMembership job = join_job(cfg, out_dir, resume);
  if (job.ring && cfg.dist.node_rank != 0) Tracer::global().clock_sync("worker node 0", job.ring->clock_offset_us, -1);
  const int L = job.local_size;
  if (L == 1) {  // the single-replica path: this thread trains
    Trainer(cfg, out_dir, resume, config_toml, job, 0).run();
    return;
  }
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
      } catch (...) {
        std::string why = "unknown error";
        try {
          throw;
        } catch (const std::exception& e) {
          why = e.what();
        } catch (...) {
        }
        {
          std::lock_guard<std::mutex> g(mu);
          if (!first) {
            first = std::current_exception();
          }
        }
        job.abort(fmt::format("local replica {} failed: {}", l, why));
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace syncopate
