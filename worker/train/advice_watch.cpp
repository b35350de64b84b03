#include "worker/train/advice_watch.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/check.h"

namespace syncopate {

AdvisedNode advised_node(const std::string& path, int64_t node_rank) {
  std::ifstream f(path);
  SYN_CHECK(f.good(), fmt::format("cannot read the applied advice '{}'", path), "it is written at start by the worker in --dist.mode=auto");
  nlohmann::json a;
  try {
    a = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    SYN_FAIL(fmt::format("'{}' is not JSON: {}", path, e.what()), "re-run syncopate-advise");
  }
  AdvisedNode n;
  if (!a.contains("cluster") || !a["cluster"].is_object()) return n;
  const auto& c = a["cluster"];
  const double base = c.value("step_s", 0.0);
  if (!(base > 0)) return n;
  double factor = 1;
  // node_slowdowns: every measured node's factor on the base step (the advisor's calibration);
  // else the slow workers' common slowdown.
  if (c.contains("node_slowdowns") && c["node_slowdowns"].is_object()) {
    const std::string key = std::to_string(node_rank);
    if (c["node_slowdowns"].contains(key) && c["node_slowdowns"][key].is_number()) factor = c["node_slowdowns"][key].get<double>();
  } else if (c.contains("slow_workers") && c["slow_workers"].is_array()) {
    for (const auto& w : c["slow_workers"])
      if (w.is_number_integer() && w.get<int64_t>() == node_rank) factor = c.value("slowdown", 1.0);
  }
  // The advisor's base is a node's fastest step; its jitter, the median of mean / fastest - 1: the
  // step a node was expected to take on average is base x factor x (1 + jitter).
  const double jitter = std::max(0.0, c.value("jitter", 0.0));
  n.step_s = base * std::max(factor, 1e-9) * (1 + jitter);
  n.why = fmt::format("{:.4g} s: the base step {:.4g} s{} x (1 + jitter {:.3g})", n.step_s, base,
                      factor == 1 ? std::string() : fmt::format(" x {:.3g} for this node", factor), jitter);
  return n;
}

AdviceWatch::AdviceWatch(AdvisedNode expected, int window, double factor)
    : expected_(std::move(expected)), window_(std::max(1, window)), factor_(factor) {}

std::optional<std::string> AdviceWatch::observe(int64_t step, double own_step_s) {
  if (!(expected_.step_s > 0) || !(own_step_s >= 0)) return std::nullopt;
  recent_.push_back(own_step_s);
  if (static_cast<int>(recent_.size()) > window_) recent_.pop_front();
  if (static_cast<int>(recent_.size()) < window_) return std::nullopt;
  std::vector<double> v(recent_.begin(), recent_.end());
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  ratio_ = v[v.size() / 2] / expected_.step_s;
  // Drift starts at factor x off and ends only back within sqrt(factor) x (no flapping at the edge).
  const double back = std::sqrt(factor_);
  const bool now = drifting_ ? !(ratio_ < back && ratio_ > 1 / back) : (ratio_ >= factor_ || ratio_ <= 1 / factor_);
  if (now == drifting_) return std::nullopt;
  drifting_ = now;
  if (now)
    return fmt::format("step {}: this node's own step time (median of the last {}) is {:.4g} s, {:.2f}x what the advice "
                       "assumed ({}): the cluster has drifted from the advice; re-run it on what this run measured "
                       "(scripts/syncopate-advise --from-run <the run's output>) to see whether the pick changes",
                       step, window_, v[v.size() / 2], ratio_, expected_.why);
  return fmt::format("step {}: this node's own step time is back within {:.3g}x of the advice's ({:.2f}x)", step, back,
                     ratio_);
}

}  // namespace syncopate
