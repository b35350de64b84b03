// Whether a run that --dist.mode=auto started still looks like the cluster its advice assumed
// (issue 29, second stage: the first half, reporting). The advice (advice.json, written by
// syncopate-advise from a probe) assumed a step time for every node: the cluster's base step,
// times the node's slowdown when the advice counted it among the slow workers. During the run each
// node compares its own step time (data, compute and the emulation's pacing: the step less its
// wait for communication) with that, over a window of steps; a median 2x off either way is drift,
// logged once when it starts and once when it ends (back within sqrt(2)x: no flapping at the edge), with the command that re-runs the advice on
// what the run measured (syncopate-advise --from-run). The watch only reports: the job goes on in
// the configuration it was started in.
#pragma once
#include <cstdint>
#include <deque>
#include <optional>
#include <string>

namespace syncopate {

// What the advice assumed for one node.
struct AdvisedNode {
  double step_s = 0;  // its own step time, seconds (0: the advice says nothing usable)
  std::string why;    // how it was derived, for the log: "the base step 0.4 s", "... x 3 (a slow worker)"
};

// Reads advice.json's "cluster" (step_s, jitter, node_slowdowns, else slow_workers / slowdown) for
// node `node_rank`: its expected mean step, base x its slowdown x (1 + jitter). Throws syncopate::Error naming the file when it cannot be read or parsed.
AdvisedNode advised_node(const std::string& advice_path, int64_t node_rank);

class AdviceWatch {
 public:
  // expected_s: AdvisedNode::step_s; window: steps per median; factor: how far off is drift.
  AdviceWatch(AdvisedNode expected, int window = 20, double factor = 2.0);
  // One step's own time. Returns a log line when drift starts or ends, else nothing.
  std::optional<std::string> observe(int64_t step, double own_step_s);
  // The last full window's median over the advised step (0 until a window is full).
  double ratio() const { return ratio_; }
  bool drifting() const { return drifting_; }
  double expected_step_s() const { return expected_.step_s; }

 private:
  AdvisedNode expected_;
  int window_;
  double factor_;
  std::deque<double> recent_;
  double ratio_ = 0;
  bool drifting_ = false;
};

}  // namespace syncopate
