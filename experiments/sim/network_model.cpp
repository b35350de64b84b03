#include "experiments/sim/network_model.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "common/check.h"

namespace syncopate {

NetworkModel::NetworkModel(std::vector<double> bytes_per_s, double latency_s, bool fifo, std::vector<int> link_of)
    : rate_(std::move(bytes_per_s)), up_free_(rate_.size(), 0.0), down_free_(rate_.size(), 0.0),
      sent_(rate_.size(), 0.0), received_(rate_.size(), 0.0), link_of_(std::move(link_of)), latency_(latency_s),
      fifo_(fifo) {
  for (size_t e = 0; e < rate_.size(); ++e)
    SYN_CHECK(rate_[e] > 0, fmt::format("endpoint {} has link rate {} bytes/s", e, rate_[e]), "link rates must be > 0");
  SYN_CHECK(latency_ >= 0, fmt::format("latency {} s", latency_), "latency must be >= 0");
  if (link_of_.empty())
    for (size_t e = 0; e < rate_.size(); ++e) link_of_.push_back(static_cast<int>(e));
  for (size_t e = 0; e < link_of_.size(); ++e)
    SYN_CHECK(link_of_[e] >= 0 && static_cast<size_t>(link_of_[e]) < rate_.size(),
              fmt::format("endpoint {} on link {} of {}", e, link_of_[e], rate_.size()), "a simulator bug: one link per endpoint");
}

size_t NetworkModel::link(int e) const {
  SYN_CHECK(e >= 0 && static_cast<size_t>(e) < link_of_.size(), fmt::format("endpoint {} of {}", e, link_of_.size()),
            "a simulator bug: endpoints are 0..workers+servers-1");
  return static_cast<size_t>(link_of_[static_cast<size_t>(e)]);
}

double NetworkModel::send(int from, int to, double bytes, double t) { return send_batch(from, {to}, {bytes}, t)[0]; }

std::vector<double> NetworkModel::send_batch(int from, const std::vector<int>& to, const std::vector<double>& bytes,
                                             double t, const std::vector<int>* flow) {
  SYN_CHECK(to.size() == bytes.size() && (!flow || flow->size() == to.size()), fmt::format("a batch from endpoint {}", from),
            "a simulator bug: one size (and flow) per message");
  const size_t a = link(from);
  // Messages to an endpoint of the sender's own link arrive when handed over; the rest cross links.
  // (Without shared links every message crosses one: no copy of the batch.)
  if (std::none_of(to.begin(), to.end(), [&](int e) { return link(e) == a; })) return send_remote(a, to, bytes, t, flow);
  std::vector<size_t> remote;
  for (size_t i = 0; i < to.size(); ++i)
    if (link(to[i]) != a) remote.push_back(i);
  std::vector<double> arrive(to.size(), t);
  if (remote.empty()) return arrive;
  std::vector<int> rto, rflow;
  std::vector<double> rbytes;
  for (size_t i : remote) {
    rto.push_back(to[i]), rbytes.push_back(bytes[i]);
    if (flow) rflow.push_back((*flow)[i]);
  }
  const std::vector<double> r = send_remote(a, rto, rbytes, t, flow ? &rflow : nullptr);
  for (size_t j = 0; j < remote.size(); ++j) arrive[remote[j]] = r[j];
  return arrive;
}

std::vector<double> NetworkModel::send_remote(size_t a, const std::vector<int>& to, const std::vector<double>& bytes,
                                              double t, const std::vector<int>* flow) {
  double total = 0;
  for (double x : bytes) total += x;
  const double tx = std::max(t, up_free_[a]);
  if (flow && !fifo_) return send_flows(a, to, bytes, *flow, tx, total);
  // Fair: the flows share the uplink, all are out at the batch's end. FIFO: each leaves after its
  // own bytes, the next starting where it ended.
  double start = tx, end = tx + total / rate_[a];
  std::vector<double> arrive(to.size());
  for (size_t i = 0; i < to.size(); ++i) {
    const size_t b = link(to[i]);
    if (fifo_) end = start + bytes[i] / rate_[a];
    const double rx = std::max(start + latency_, down_free_[b]);
    down_free_[b] = rx + bytes[i] / rate_[b];  // the downlink's own work; a slow sender does not hold it
    arrive[i] = std::max(end + latency_, down_free_[b]);
    received_[b] += bytes[i];
    if (fifo_) start = end;
  }
  up_free_[a] = fifo_ ? start : end;
  sent_[a] += total;
  return arrive;
}

std::vector<double> NetworkModel::send_flows(size_t a, const std::vector<int>& to, const std::vector<double>& bytes,
                                             const std::vector<int>& flow, double tx, double total) {
  std::map<int, double> flow_total, flow_sent;
  for (size_t i = 0; i < to.size(); ++i) flow_total[flow[i]] += bytes[i];
  // Bytes the uplink has carried, over every flow, when one flow has sent c of its own (processor sharing).
  auto carried = [&](double c) {
    double sum = 0;
    for (const auto& [f, total_f] : flow_total) sum += std::min(total_f, c);
    return sum;
  };
  std::vector<double> arrive(to.size());
  for (size_t i = 0; i < to.size(); ++i) {
    const size_t b = link(to[i]);
    double& c = flow_sent[flow[i]];
    const double start = tx + carried(c) / rate_[a];  // its first byte leaves after its flow's earlier messages
    c += bytes[i];
    const double end = tx + carried(c) / rate_[a];
    const double rx = std::max(start + latency_, down_free_[b]);
    down_free_[b] = rx + bytes[i] / rate_[b];
    arrive[i] = std::max(end + latency_, down_free_[b]);
    received_[b] += bytes[i];
  }
  up_free_[a] = tx + total / rate_[a];
  sent_[a] += total;
  return arrive;
}

double ring_allreduce_s(int64_t n, double bytes, double bytes_per_s, double latency_s) {
  if (n <= 1) return 0;
  const double phases = 2.0 * static_cast<double>(n - 1);
  return phases * (latency_s + bytes / (static_cast<double>(n) * bytes_per_s));
}

}  // namespace syncopate
