// The simulator's clock: events ordered by simulated time, ties broken by the order they were
// scheduled in (a sequence number), so that a run is a deterministic function of its config.
#pragma once
#include <cstdint>
#include <queue>
#include <utility>
#include <vector>

#include "common/check.h"

namespace syncopate {

template <class Event>
class EventQueue {
 public:
  // Schedules `e` at simulated time t (seconds); t must not lie before the current time.
  void push(double t, Event e) {
    SYN_CHECK(t >= now_, "an event was scheduled in the past", "a simulator bug: report it with the config");
    heap_.push(Entry{t, seq_++, std::move(e)});
  }
  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  // The earliest event; advances the clock to its time.
  std::pair<double, Event> pop() {
    Entry top = heap_.top();
    heap_.pop();
    now_ = top.t;
    return {top.t, std::move(top.e)};
  }
  double now() const { return now_; }
  uint64_t scheduled() const { return seq_; }

 private:
  struct Entry {
    double t;
    uint64_t seq;
    Event e;
    bool operator>(const Entry& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_;
  double now_ = 0;
  uint64_t seq_ = 0;
};

}  // namespace syncopate
