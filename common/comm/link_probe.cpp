#include "common/comm/link_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>

#include "common/check.h"
#include "common/exception_text.h"

namespace syncopate {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kWarmupPings = 3;
constexpr size_t kChunk = size_t{4} << 20;  // a transfer moves through a buffer of this size

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The pinging side, on the link to the next node.
std::vector<double> ping(Connection& next, int pings) {
  std::vector<double> rtt;
  for (int i = 0; i < pings; ++i) {
    uint64_t v = static_cast<uint64_t>(i), back = 0;
    const auto t0 = Clock::now();
    next.send(&v, sizeof v);
    next.recv(&back, sizeof back);
    SYN_CHECK(back == v, "a round trip came back with another value than it took to " + next.peer(),
              "every node of the job must run the same syncopate-probe");
    if (i >= kWarmupPings) rtt.push_back(seconds_since(t0) * 1e6);
  }
  return rtt;
}

// The echoing side, on the link from the previous node.
void echo(Connection& prev, int pings) {
  for (int i = 0; i < pings; ++i) {
    uint64_t v = 0;
    prev.recv(&v, sizeof v);
    prev.send(&v, sizeof v);
  }
}

// One transfer of `size` bytes and its answer; the seconds of its data (less a round trip).
double transfer(Connection& next, std::vector<char>& buf, size_t size, double rtt_s) {
  const uint64_t header = size;
  const auto t0 = Clock::now();
  next.send(&header, sizeof header);
  for (size_t sent = 0; sent < size; sent += std::min(buf.size(), size - sent))
    next.send(buf.data(), std::min(buf.size(), size - sent));
  uint64_t ack = 0;
  next.recv(&ack, sizeof ack);
  SYN_CHECK(ack == size, "the next node acknowledged another size than was sent to " + next.peer(),
            "every node of the job must run the same syncopate-probe");
  // A round trip's worth of the elapsed time is the header's way out and the answer's way back,
  // not the data's; the size grows until the data's own time is `seconds`, so that on a link of
  // long latency the goodput is not a small difference of two large numbers.
  return std::max(seconds_since(t0) - rtt_s, 1e-6);
}

// The sending side: transfers of doubling size until one takes `seconds`, that size `repeats` times
// in all (the fastest counts); then a 0 header ends it.
LinkProbe send_bulk(Connection& next, const LinkProbeOptions& o, double rtt_s) {
  std::vector<char> buf(std::min(kChunk, std::max<size_t>(o.max_bytes, 1)), 1);
  size_t size = std::max<size_t>(o.min_bytes, 1);
  double data_s = transfer(next, buf, size, rtt_s);
  while (data_s < o.seconds && size < o.max_bytes) {
    size = std::min(size * 2, o.max_bytes);
    data_s = transfer(next, buf, size, rtt_s);
  }
  LinkProbe r;
  r.bytes = size;
  auto gbit = [size](double s) { return static_cast<double>(size) * 8 / s / 1e9; };
  r.seconds = data_s;
  r.repeats_gbit.push_back(gbit(data_s));
  for (int i = 1; i < std::max(o.repeats, 1); ++i) {
    const double s = transfer(next, buf, size, rtt_s);
    r.repeats_gbit.push_back(gbit(s));
    r.seconds = std::min(r.seconds, s);
  }
  r.goodput_gbit = gbit(r.seconds);
  const uint64_t end = 0;
  next.send(&end, sizeof end);
  return r;
}

// The receiving side: takes each transfer whole, answers its size.
void receive_bulk(Connection& prev, const LinkProbeOptions& o) {
  std::vector<char> buf(std::min(kChunk, std::max<size_t>(o.max_bytes, 1)));
  for (;;) {
    uint64_t size = 0;
    prev.recv(&size, sizeof size);
    if (size == 0) return;
    SYN_CHECK(size <= o.max_bytes, "the previous node announced a transfer of " + std::to_string(size) +
                                       " bytes, above the probe's limit, on " + prev.peer(),
              "every node of the job must run the same syncopate-probe (same --probe.max_mb)");
    for (uint64_t got = 0; got < size; got += std::min<uint64_t>(buf.size(), size - got))
      prev.recv(buf.data(), std::min<uint64_t>(buf.size(), size - got));
    prev.send(&size, sizeof size);
  }
}

// Runs f on a thread and g here. A failing side shuts the other's connection down, so that it does
// not wait a whole timeout on a dead ring. After both ended: one side's error is rethrown as it is;
// when both failed, one error carries both, the first to fail first (in a ring the first error seen
// can be the echo of a neighbour's shutdown, so both peers are named).
template <class F, class G>
auto both(Connection& fc, F f, Connection& gc, G g) {
  std::atomic<int> first{0};  // 1: f failed first, 2: g did
  auto fut = std::async(std::launch::async, [&] {
    try {
      return f();
    } catch (...) {
      int none = 0;
      first.compare_exchange_strong(none, 1);
      gc.shutdown();
      throw;
    }
  });
  std::exception_ptr gerr, ferr;
  try {
    g();
  } catch (...) {
    int none = 0;
    first.compare_exchange_strong(none, 2);
    gerr = std::current_exception();
    fc.shutdown();
  }
  decltype(fut.get()) result{};
  try {
    result = fut.get();
  } catch (...) {
    ferr = std::current_exception();
  }
  if (ferr && gerr) {  // both: the first, then the other (which of them caused it cannot always be told)
    const bool f_first = first == 1;
    throw Error(exception_text(f_first ? ferr : gerr) + "; then, on the other side: " +
                exception_text(f_first ? gerr : ferr));
  }
  if (ferr) std::rethrow_exception(ferr);
  if (gerr) std::rethrow_exception(gerr);
  return result;
}

}  // namespace

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(q, 0.0, 1.0) * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

LinkProbe probe_link(Connection& next, Connection& prev, const LinkProbeOptions& o) {
  SYN_CHECK(o.pings > kWarmupPings, "the link probe needs more than " + std::to_string(kWarmupPings) + " round trips",
            "raise --probe.pings");
  std::vector<double> rtt = both(next, [&] { return ping(next, o.pings); }, prev, [&] { echo(prev, o.pings); });
  const double rtt_s = quantile(rtt, 0.5) / 1e6;
  LinkProbe r = both(next, [&] { return send_bulk(next, o, rtt_s); }, prev, [&] { receive_bulk(prev, o); });
  r.rtt_us = std::move(rtt);
  return r;
}

std::vector<std::string> ring_all_gather(int rank, int world, Connection& next, Connection& prev, const std::string& mine) {
  std::vector<std::string> all(static_cast<size_t>(world));
  all[static_cast<size_t>(rank)] = mine;
  for (int round = 0; round < world - 1; ++round) {
    const std::string& out = all[static_cast<size_t>((rank - round + world) % world)];
    const size_t from = static_cast<size_t>((rank - round - 1 + world) % world);
    both(
        next,
        [&] {
          const uint64_t n = out.size();
          next.send(&n, sizeof n);
          next.send(out.data(), out.size());
          return 0;
        },
        prev,
        [&] {
          uint64_t n = 0;
          prev.recv(&n, sizeof n);
          SYN_CHECK(n <= (uint64_t{1} << 30), "a record of " + std::to_string(n) + " bytes from " + prev.peer(),
                    "every node of the job must run the same syncopate-probe");
          all[from].resize(n);
          prev.recv(all[from].data(), n);
        });
  }
  return all;
}

}  // namespace syncopate
