// ElasticRing: one node's view of an elastic ring's membership (dist.elastic with dist.mode=ring;
// issue 30): its session with syncopate-rendezvous and the links of the current epoch. The
// synchronizations built on it (elastic_ring_sync.cpp: every step; elastic_local_sgd_sync.cpp:
// local SGD / DiLoCo, every round) own their collectives and their state transfer; this class
// forms and re-forms the ring under them:
//   - lost(): a collective on the current ring failed; this node shuts its links, so the failure
//     reaches every member within milliseconds, and the next reform() re-forms;
//   - reform(): asks the service for the next epoch (blocking while it closes), links it, moves
//     the owner's collectives onto it (`relink`) and runs the owner's state transfer (`take`) on
//     it; an epoch that breaks off while it forms is asked for again.
// Torch-free.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "worker/sync/dist_config.h"

namespace at {
class Tensor;
}
namespace syncopate {
class RendezvousSession;
struct Epoch;
struct Ring;
struct JobPosition;

// The members that pass `counts` (1 each, an exact sum over the ring by `sum_exact`): the divisor of
// a mean among them (after a switch, the members at the root's step; the root counts, so >= 1).
float count_members(bool counts, int device, const std::function<void(at::Tensor&)>& sum_exact);

class ElasticRing {
 public:
  // relink(ring): the owner's collectives move onto `ring` (null: none; called before the links
  // close, so that the collectives' threads let go of them first).
  using Relink = std::function<void(std::shared_ptr<Ring>)>;
  ElasticRing(std::shared_ptr<RendezvousSession> session, const DistConfig& dist, double latency_s, Relink relink);
  ~ElasticRing();

  bool formed() const { return formed_; }  // a first epoch was formed
  bool broken() const { return broken_; }  // a collective of the current ring failed: re-form before the next
  bool left() const { return left_; }      // leave() was called: this node is out
  int node() const;                        // this node's rank in the job
  bool pending() const;                    // the service asks the members to come at their next boundary

  // A collective on the current ring failed at (0-based) `step`: logged once, links shut.
  void lost(int64_t step, const std::string& why);
  // lost(step, why) as the callback the elastic collectives take (elastic_agree, elastic_check_identical).
  std::function<void(const std::string&)> lost_at(int64_t step) {
    return [this, step](const std::string& why) { lost(step, why); };
  }
  // Re-forms the ring. `key`: where this node's state stands for the service's choice of the root
  // (the member with the largest key; the lowest rank among equals; -1: none); `step`: the step
  // this node stands at, for the log. take(epoch): the owner's state transfer on the new ring,
  // run by every member of it; returns the position the job goes on from.
  JobPosition reform(int64_t key, int64_t step, const std::function<JobPosition(const Epoch&)>& take);
  // This node leaves (after the owner told the members, if it could): out of the membership at once.
  void leave();
  // The job's last step is done (no join is taken any more).
  void done();

 private:
  std::shared_ptr<Ring> link(const Epoch& e, bool* next_unreachable);
  void drop();

  std::shared_ptr<RendezvousSession> session_;  // (declared first: outlives the ring, whose links live in its context)
  DistConfig dist_;
  double latency_s_;
  Relink relink_;
  std::shared_ptr<Ring> ring_;
  bool formed_ = false, broken_ = false, left_ = false;
};

}  // namespace syncopate
