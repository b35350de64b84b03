// The parameter servers' per-update rules as small objects, chosen once from the parsed config
// (PsConfig) instead of comparing strings on every push:
//   - ConsistencyRule: when a worker's reply may leave, and whether gradients are applied on
//     arrival or summed for a clock (BSP, BSP with backup workers, SSP with bound s, ASP);
//   - StalenessMitigation: how a stale gradient is treated (none, lr / staleness, DC-ASGD).
// Transport-free and state-free: the shard owns the clocks and the waiting set and asks the rule.
#pragma once
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "server/ps_config.h"

namespace syncopate {

enum class Consistency { kBsp, kSsp, kAsp };
enum class Mitigation { kNone, kLrScale, kDcAsgd };
// The config's names; anything else is an error naming the choices.
Consistency parse_consistency(const std::string& name);
Mitigation parse_mitigation(const std::string& name);

// What the rule sees of the workers: last clock pushed per worker (-1: none yet), and liveness.
struct WorkerClocks {
  const std::vector<int64_t>& clock;
  const std::vector<bool>& live;
  int live_count;
};

class ConsistencyRule {
 public:
  virtual ~ConsistencyRule() = default;
  virtual Consistency kind() const = 0;
  // A fresh push computed on parameters `staleness` versions old is dropped (answered with the
  // new parameters at once, not applied): BSP with backup workers, whose clock went on without it.
  virtual bool drops(int64_t staleness) const { return false; }
  // true: a push is summed with the others of its clock and applied as their mean once the clock
  // is complete (BSP); false: applied on arrival (SSP, ASP).
  virtual bool sums_clock() const { return false; }
  // BSP: the clock is complete with `pushed` gradients.
  virtual bool clock_complete(int pushed, const WorkerClocks& w) const { return false; }
  // Of the workers whose replies are held, those that may go now (after an update, or after a
  // worker expired). ASP holds nobody.
  virtual std::vector<int> releasable(const std::set<int>& waiting, const WorkerClocks& w) const = 0;
  // Whether a worker's reply is held at all once its push is handled.
  virtual bool holds_replies() const = 0;
};

// Checks the combination (backup workers need BSP and fewer than `workers`) with the config
// field's name in the message.
std::unique_ptr<ConsistencyRule> make_consistency_rule(const PsConfig& cfg, int workers);

class StalenessMitigation {
 public:
  explicit StalenessMitigation(const PsConfig& cfg) : kind_(parse_mitigation(cfg.mitigation)), lambda_(cfg.dc_lambda) {}
  Mitigation kind() const { return kind_; }
  // lr_scale (Zhang et al. 2016): the step size divided by the staleness (when above 1).
  double lr(double lr, int64_t staleness) const {
    return kind_ == Mitigation::kLrScale && staleness > 1 ? lr / static_cast<double>(staleness) : lr;
  }
  // DC-ASGD (Zheng et al. 2017) needs the parameters each worker last read.
  bool keeps_backups() const { return kind_ == Mitigation::kDcAsgd; }
  double dc_lambda() const { return lambda_; }

 private:
  Mitigation kind_;
  double lambda_;
};

}  // namespace syncopate
