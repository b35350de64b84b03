#include "experiments/sim/network_model.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/check.h"

namespace syncopate {

NetworkModel::NetworkModel(std::vector<double> bytes_per_s, double latency_s)
    : rate_(std::move(bytes_per_s)), up_free_(rate_.size(), 0.0), down_free_(rate_.size(), 0.0),
      sent_(rate_.size(), 0.0), received_(rate_.size(), 0.0), latency_(latency_s) {
  for (size_t e = 0; e < rate_.size(); ++e)
    SYN_CHECK(rate_[e] > 0, fmt::format("endpoint {} has link rate {} bytes/s", e, rate_[e]), "link rates must be > 0");
  SYN_CHECK(latency_ >= 0, fmt::format("latency {} s", latency_), "latency must be >= 0");
}

double NetworkModel::send(int from, int to, double bytes, double t) {
  const size_t a = static_cast<size_t>(from), b = static_cast<size_t>(to);
  SYN_CHECK(a < rate_.size() && b < rate_.size(), fmt::format("message from endpoint {} to {}", from, to),
            "a simulator bug: endpoints are 0..workers+servers-1");
  const double tx = std::max(t, up_free_[a]);
  const double tx_end = tx + bytes / rate_[a];
  up_free_[a] = tx_end;
  const double rx = std::max(tx + latency_, down_free_[b]);
  down_free_[b] = rx + bytes / rate_[b];  // the downlink's own work; a slow sender does not hold it
  const double arrive = std::max(tx_end + latency_, down_free_[b]);
  sent_[a] += bytes;
  received_[b] += bytes;
  return arrive;
}

double ring_allreduce_s(int64_t n, double bytes, double bytes_per_s, double latency_s) {
  if (n <= 1) return 0;
  const double phases = 2.0 * static_cast<double>(n - 1);
  return phases * (latency_s + bytes / (static_cast<double>(n) * bytes_per_s));
}

}  // namespace syncopate
