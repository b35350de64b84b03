// Membership events for the virtual cluster (sim.churn): the same kinds experiments/churn.py
// injects into an emulated job, as a schedule the simulator plays in simulated time.
//
//   "kill9@2.5:1:1.8,join@4.1:3,sigterm@6:0:2.2"
//     kill9@T:W:D    worker W crashes at T s (its step in flight and, in local SGD, its partial round
//                    are lost; the shards count it out after ps.worker_timeout_s); its process is
//                    started again D s later and joins after sim.restart_s
//     sigterm@T:W:D  a preemption notice at T s: worker W finishes its step, leaves (FINISH; local
//                    SGD: its partial round dropped) and is started again D s after it left
//     join@T:W       a new worker W (the next id past sim.workers, in order) is launched at T s and
//                    joins after sim.restart_s
//     (sim.start_s: the first workers' launch to first step; sim.restart_s: a later process's)
// Times count from the moment every first worker has logged its first step (experiments/churn.py's clock).
// A signal reaches a worker's process whatever it is doing: starting, joining, stepping or leaving (a
// SIGTERM to one already leaving is not applied, nor any event to a worker that is down or done).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace syncopate {

struct ChurnEvent {
  enum class Kind { kKill9, kSigterm, kJoin } kind = Kind::kJoin;
  double t_s = 0;      // simulated seconds after the first workers started stepping
  int worker = 0;      // the worker it targets (join: the new worker's id)
  double delay_s = 0;  // kill9 / sigterm: seconds until its process is started again
};

const char* churn_kind_name(ChurnEvent::Kind k);

// Parses sim.churn (empty: no events). `workers`: sim.workers (kill9 and sigterm target an id below
// it or a joiner's; joins take workers, workers + 1, ... in order). Sorted by time (stable). Throws
// syncopate::Error naming the entry and the expected form.
std::vector<ChurnEvent> parse_churn_schedule(const std::string& text, int64_t workers);

// How many joins the schedule has (the worker slots past sim.workers it needs).
int64_t churn_joins(const std::vector<ChurnEvent>& events);

}  // namespace syncopate
