#include "experiments/sim/churn_schedule.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

#include <fmt/format.h>

#include "common/check.h"

namespace syncopate {
namespace {

constexpr const char* kForm = "write kill9@T:W:D, sigterm@T:W:D or join@T:W (T, D seconds >= 0; W a worker id), comma-separated";

double number(const std::string& s, const std::string& entry, const char* what) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  SYN_CHECK(used == s.size() && !s.empty() && std::isfinite(v) && v >= 0,
            fmt::format("sim.churn entry '{}': {} '{}' is not a number >= 0", entry, what, s), kForm);
  return v;
}

}  // namespace

const char* churn_kind_name(ChurnEvent::Kind k) {
  switch (k) {
    case ChurnEvent::Kind::kKill9: return "kill9";
    case ChurnEvent::Kind::kSigterm: return "sigterm";
    case ChurnEvent::Kind::kJoin: return "join";
  }
  return "?";
}

std::vector<ChurnEvent> parse_churn_schedule(const std::string& text, int64_t workers) {
  std::vector<ChurnEvent> out;
  std::stringstream ss(text);
  std::string entry;
  while (std::getline(ss, entry, ',')) {
    entry.erase(std::remove_if(entry.begin(), entry.end(), [](unsigned char c) { return std::isspace(c); }), entry.end());
    if (entry.empty()) continue;
    const size_t at = entry.find('@');
    SYN_CHECK(at != std::string::npos, fmt::format("sim.churn entry '{}' has no '@'", entry), kForm);
    ChurnEvent e;
    const std::string kind = entry.substr(0, at);
    if (kind == "kill9") e.kind = ChurnEvent::Kind::kKill9;
    else if (kind == "sigterm") e.kind = ChurnEvent::Kind::kSigterm;
    else if (kind == "join") e.kind = ChurnEvent::Kind::kJoin;
    else SYN_FAIL(fmt::format("sim.churn entry '{}': unknown kind '{}'", entry, kind), kForm);
    std::vector<std::string> f;
    std::stringstream rest(entry.substr(at + 1));
    std::string part;
    while (std::getline(rest, part, ':')) f.push_back(part);
    const size_t want = e.kind == ChurnEvent::Kind::kJoin ? 2 : 3;
    SYN_CHECK(f.size() == want, fmt::format("sim.churn entry '{}' has {} fields after '@', {} expected", entry, f.size(), want),
              kForm);
    e.t_s = number(f[0], entry, "time");
    const double w = number(f[1], entry, "worker");
    SYN_CHECK(w == std::floor(w) && w < 4096, fmt::format("sim.churn entry '{}': worker '{}' is not an id", entry, f[1]), kForm);
    e.worker = static_cast<int>(w);
    if (want == 3) e.delay_s = number(f[2], entry, "delay");
    out.push_back(e);
  }
  std::stable_sort(out.begin(), out.end(), [](const ChurnEvent& a, const ChurnEvent& b) { return a.t_s < b.t_s; });
  // Joins take the next ids in order; a crash or preemption names a worker that exists by then.
  int64_t next = workers;
  for (const ChurnEvent& e : out) {
    if (e.kind == ChurnEvent::Kind::kJoin) {
      SYN_CHECK(e.worker == next,
                fmt::format("sim.churn: the join at {} s names worker {}, but the next new worker is {}", e.t_s, e.worker, next),
                "number joiners sim.workers, sim.workers + 1, ... in the order of their times");
      ++next;
    } else {
      SYN_CHECK(e.worker < next,
                fmt::format("sim.churn: the {} at {} s names worker {}, which does not exist by then (workers 0..{})",
                            churn_kind_name(e.kind), e.t_s, e.worker, next - 1),
                "name a starting worker or one that joined earlier");
    }
  }
  return out;
}

int64_t churn_joins(const std::vector<ChurnEvent>& events) {
  return std::count_if(events.begin(), events.end(), [](const ChurnEvent& e) { return e.kind == ChurnEvent::Kind::kJoin; });
}

}  // namespace syncopate
