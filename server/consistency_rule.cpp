#include "server/consistency_rule.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "common/check.h"

namespace syncopate {
namespace {

// Bulk synchronous: a clock is applied once every live worker but `backup` has pushed it; every
// waiting worker is then released at once. With backup workers (Chen et al. 2016: N gradients per
// round from N + b workers, N = the job's first worker count less b) a round never takes fewer than
// min(N, live) gradients: while workers are missing (dead, left, not joined yet) the backups are
// used up first, instead of a round completing on the first push (which made every fresh push a
// round of its own: more updates than clocks under churn).
class Bsp : public ConsistencyRule {
 public:
  Bsp(int backup, int aggregate) : backup_(backup), aggregate_(aggregate) {}
  Consistency kind() const override { return Consistency::kBsp; }
  bool drops(int64_t staleness) const override { return backup_ > 0 && staleness > 0; }
  bool sums_clock() const override { return true; }
  bool clock_complete(int pushed, const WorkerClocks& w) const override {
    const int needed = backup_ > 0 ? std::max(std::min(aggregate_, w.live_count), w.live_count - backup_) : w.live_count;
    return pushed > 0 && pushed >= std::max(1, needed);
  }
  std::vector<int> releasable(const std::set<int>& waiting, const WorkerClocks&) const override {
    return {waiting.begin(), waiting.end()};  // called when the clock was applied
  }
  bool holds_replies() const override { return true; }

 private:
  int backup_, aggregate_;
};

// Stale synchronous (Ho et al. 2013): a worker waits while it is more than `bound` clocks ahead
// of the slowest live worker.
class Ssp : public ConsistencyRule {
 public:
  explicit Ssp(int64_t bound) : bound_(bound) {}
  Consistency kind() const override { return Consistency::kSsp; }
  std::vector<int> releasable(const std::set<int>& waiting, const WorkerClocks& w) const override {
    int64_t slowest = std::numeric_limits<int64_t>::max();
    for (size_t i = 0; i < w.clock.size(); ++i)
      if (w.live[i]) slowest = std::min(slowest, w.clock[i]);
    std::vector<int> ready;
    for (int x : waiting)
      if (w.clock[static_cast<size_t>(x)] - slowest <= bound_) ready.push_back(x);
    return ready;
  }
  bool holds_replies() const override { return true; }

 private:
  int64_t bound_;
};

// Fully asynchronous: every push is applied and answered on arrival.
class Asp : public ConsistencyRule {
 public:
  Consistency kind() const override { return Consistency::kAsp; }
  std::vector<int> releasable(const std::set<int>&, const WorkerClocks&) const override { return {}; }
  bool holds_replies() const override { return false; }
};

}  // namespace

Consistency parse_consistency(const std::string& name) {
  if (name == "bsp") return Consistency::kBsp;
  if (name == "ssp") return Consistency::kSsp;
  if (name == "asp") return Consistency::kAsp;
  SYN_FAIL(fmt::format("ps.consistency='{}' is not a consistency model", name), "use bsp, ssp or asp");
}

Mitigation parse_mitigation(const std::string& name) {
  if (name == "none") return Mitigation::kNone;
  if (name == "lr_scale") return Mitigation::kLrScale;
  if (name == "dc_asgd") return Mitigation::kDcAsgd;
  SYN_FAIL(fmt::format("ps.mitigation='{}' is not a staleness mitigation", name), "use none, lr_scale or dc_asgd");
}

std::unique_ptr<ConsistencyRule> make_consistency_rule(const PsConfig& cfg, int workers) {
  const Consistency c = parse_consistency(cfg.consistency);
  SYN_CHECK(cfg.backup_workers == 0 || (c == Consistency::kBsp && cfg.backup_workers < workers),
            fmt::format("ps.backup_workers={} with {} consistency and {} workers", cfg.backup_workers, cfg.consistency,
                        workers),
            "backup workers need consistency bsp and at most workers - 1 of them: lower --ps.backup_workers");
  switch (c) {
    case Consistency::kBsp:
      return std::make_unique<Bsp>(static_cast<int>(cfg.backup_workers), workers - static_cast<int>(cfg.backup_workers));
    case Consistency::kSsp: return std::make_unique<Ssp>(cfg.staleness_bound);
    case Consistency::kAsp: return std::make_unique<Asp>();
  }
  SYN_FAIL("unreachable consistency", "this is a bug");
}

}  // namespace syncopate
