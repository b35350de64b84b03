// The training loop: batch, forward, backward, (reduce), clip, update, log, evaluate, sample,
// checkpoint. Torch stays behind the pimpl so that including this header is cheap.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "worker/train/run_config.h"

namespace syncopate {
class GPTImpl;
class FlatParameters;
class LocalGroup;
class RendezvousSession;
class Tokenizer;
struct Ring;
struct SyncCounters;
struct TrainingData;

// This node's share of the job: its local replicas (count, devices: -1 CPU), the node's
// communication objects (the local group, the ring links), the job token, where to resume, and
// the tokenizer and data every local replica reads (opened once per node; read-only, so shared).
// join_job resolves cfg.dist from the environment, opens the data, lists the checkpoints this
// node could resume from, meets the other nodes and decides the resume step with them.
struct JobMembership {
  int local_size = 1;                 // replicas on this node
  std::shared_ptr<LocalGroup> group;  // null with one local replica
  std::shared_ptr<Ring> ring;         // ring mode with several nodes: this node's links; else null
  std::shared_ptr<RendezvousSession> session;  // elastic ring: the session with the rendezvous service (links per epoch)
  std::vector<int> devices;
  std::string token;
  std::vector<int64_t> checkpoints;  // steps this node holds complete checkpoints of (with resume), ascending
  int64_t resume_step = -1;          // the step every replica of the job resumes from; -1: a fresh start
  std::shared_ptr<Tokenizer> tokenizer;
  std::shared_ptr<TrainingData> data;
  // One local replica failed: the others stop waiting for it (local collectives and ring links
  // alike) and throw. Safe from any thread.
  void abort(const std::string& why);
  // Inside a catch: abort with the exception being handled, "local replica L failed: <what>".
  void abort_failed_replica(int local);
  JobMembership();
  JobMembership(JobMembership&&) noexcept;
  ~JobMembership();
};
// local = 0: dist.local_replicas decides (every visible GPU, or one CPU replica); local > 0: that many.
// verbose: node 0 reports the data it opens.
JobMembership join_job(RunConfig& cfg, const std::string& out_dir, bool resume, int local = 0, bool verbose = true);

class Trainer {
 public:
  // out_dir receives metrics.jsonl, samples.txt, config.toml and checkpoints/ (written by local
  // replica 0 only). resume=true continues from out_dir/checkpoints/latest (an error if there is
  // none). config_toml is the full resolved config, saved with the run and into checkpoints.
  // This constructor joins the job with one local replica.
  Trainer(const RunConfig& cfg, const std::string& out_dir, bool resume, const std::string& config_toml,
          bool verbose = true);
  // Local replica `local` of a node that has joined the job (cfg as resolved by join_job).
  Trainer(const RunConfig& cfg, const std::string& out_dir, bool resume, const std::string& config_toml,
          JobMembership& job, int local, bool verbose = true);
  ~Trainer();

  // Trains from the current step to cfg.train.steps, or only up to step stop_at when it is
  // smaller (the schedule still spans cfg.train.steps: used to simulate an interrupted run).
  void run(int64_t stop_at = -1);
  double evaluate();             // mean validation loss over the fixed validation batches
  std::string sample_text();     // greedy sample from eval.sample_prompt
  int64_t step() const;          // optimizer steps completed
  // run() stopped at a checkpoint for the job to switch synchronization (dist.readvise_every; its
  // worker exits with kExitSwitch, worker/train/readvise.h).
  bool switching() const;
  SyncCounters sync_counters() const;  // the step synchronization's totals (see GradientSync)
  GPTImpl& model();
  FlatParameters& flat();

 private:
  struct Impl;
  std::unique_ptr<JobMembership> own_job_;  // the first constructor's job (outlives impl_, which aborts it on failure)
  std::unique_ptr<Impl> impl_;
};

}  // namespace syncopate
