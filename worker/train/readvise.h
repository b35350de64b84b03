// --dist.mode=auto --dist.readvise_every=N (issue 29, second stage: the switch). Every N steps the
// job's replicas decide together, in one small collective (GradientSync::job_sum), whether
//  - a node's step drifted from what its advice assumed (AdviceWatch): node 0 then asks its
//    launcher for a re-run of the advice on what the run measured, by writing OUT/readvise.request
//    (scripts/launch_node.sh runs syncopate-advise --from-run --window 10 in the background, on node 0's host,
//    while the job goes on, and writes the result to OUT/readvise.advice.json atomically);
//  - node 0 holds a re-advice whose pick differs from the one the run applied: then node 0 shares
//    its text with every replica (the same collective's kind: exact float32 sums), every node writes
//    it to OUT/advice.next.json, checkpoints at this step and its worker exits with kExitSwitch;
//    launch_node.sh restarts it with --resume --dist.advice=OUT/advice.next.json, starting the
//    shards when the new pick is a parameter-server mode (worker/train/mode_switch.h says what
//    carries over). A re-advice that keeps the pick is logged and changes nothing; this run asks
//    for no other while a node still drifts (its watch compares with the first advice), and again
//    once every node was back within the advice at a decision step and one drifts anew.
// The decision happens at steps where every node stands at once: the ring (every step) and local
// SGD on the ring (round boundaries: N a multiple of sync_every). Modes whose nodes never meet
// (parameter servers) or whose membership changes (elastic) have no job_sum: the run says once that
// it cannot re-decide, and goes on.
// Known gaps (helper-32's review): a node that dies inside a decision's collectives fails the others
// (exit 1) while one that completed them may already have exited 75 to switch: their launchers then
// restart them in different modes, which cannot form a job, until --max-restarts is used up (a
// launcher that finds OUT/advice.next.json with a checkpoint resumes in its pick, which covers a node
// killed after it wrote both). A SIGTERM on one node during a decision step fails the fixed ring as
// any preemption of one of its nodes does. Outside scripts/launch_node.sh (srun, torchrun) exit 75
// ends the node: resume it by hand with --resume --dist.advice=OUT/advice.next.json.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace at {
class Tensor;
}
namespace c10 {
struct TensorOptions;
}

namespace syncopate {

// The worker's exit status when it stopped to switch synchronization (a checkpoint at the switch's
// step is written): not a failure, and not the end of the job. EX_TEMPFAIL of sysexits.h.
inline constexpr int kExitSwitch = 75;

// Files in a node's output directory.
inline constexpr const char* kReadviseRequestFile = "readvise.request";     // node 0 asks its launcher
inline constexpr const char* kReadviseAdviceFile = "readvise.advice.json";  // the launcher's answer
inline constexpr const char* kNextAdviceFile = "advice.next.json";          // every node: what it restarts with

class Readvise {
 public:
  // out: this node's output directory; node0_writer: local replica 0 of node 0 (the only one that
  // reads and writes the request and the answer); applied: the advice the run applied (its text).
  Readvise(std::string out, bool node0_writer, std::string applied);
  // At a decision step (every replica of the job, in the same order): `drifting` is this replica's
  // watch (false where it has none); job_sum sums a float tensor over every replica of the job,
  // exactly; options: the tensors' device (a replica's). Returns the advice to switch to (the same text on every
  // replica) when the job switches now, else nothing. Throws syncopate::Error if a collective fails.
  std::optional<std::string> decide(int64_t step, bool drifting, const std::function<void(at::Tensor&)>& job_sum,
                                    const c10::TensorOptions& options);

  // The pick an advice names (recommended.name and its worker flags, one line), or "" when the text
  // is not an advice. Exposed for the tests.
  static std::string pick_of(const std::string& advice_text);

 private:
  std::string out_;
  bool node0_;
  std::string applied_pick_;
  bool requested_ = false;  // node 0 asked for a re-advice and waits for it
  bool settled_ = false;    // node 0 had its answer (kept, or unreadable): no further request in this run
};

}  // namespace syncopate
