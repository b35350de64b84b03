// The training loop: batch, forward, backward, (reduce), clip, update, log, evaluate, sample,
// checkpoint. Torch stays behind the pimpl so that including this header is cheap.
#pragma once
#include <memory>
#include <string>

#include "worker/run_config.h"

namespace syncopate {
class GPTImpl;
class FlatParameters;

class Trainer {
 public:
  // out_dir receives metrics.jsonl, samples.txt, config.toml and checkpoints/.
  // resume=true continues from out_dir/checkpoints/latest (an error if there is none).
  // config_toml is the full resolved config, saved with the run and into checkpoints.
  Trainer(const RunConfig& cfg, const std::string& out_dir, bool resume, const std::string& config_toml,
          bool verbose = true);
  ~Trainer();

  // Trains from the current step to cfg.train.steps, or only up to step stop_at when it is
  // smaller (the schedule still spans cfg.train.steps: used to simulate an interrupted run).
  void run(int64_t stop_at = -1);
  double evaluate();             // mean validation loss over the fixed validation batches
  std::string sample_text();     // greedy sample from eval.sample_prompt
  int64_t step() const;          // optimizer steps completed
  GPTImpl& model();
  FlatParameters& flat();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace syncopate
