// The probe's own parameter-server shards under ASP, for syncopate-probe's spread rounds (the job's
// shards run BSP for the probe's BSP rounds; a round trip without BSP's lockstep needs shards that
// reply at once). This node runs the shards of the job's layout that are at its own address, each
// on a thread of this process, listening on an ephemeral port of that address only, with the job's
// token and encryption and the emulated latency; they stop and are joined when the object goes,
// also when the probe failed. A shard that cannot listen is an error naming it.
#pragma once
#include <atomic>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace syncopate {

// Where the spread rounds' shards run: this node's share of the job's layout, or why the rounds cannot
// be timed (then `why_not` says so and `hosted` is empty). A shard runs on the node at its address, so
// every node must be at an address of its own and every shard at one of them.
struct SpreadLayout {
  std::vector<int> hosted;  // the job's shard indices at this node's address, ascending
  std::string why_not;      // empty: the layout is known
};
// nodes: each node's recorded address by rank (nullopt: none recorded); shards: each shard's resolved
// address (nullopt: it did not resolve); endpoints: the shards' endpoints as the job names them (for the
// message); rank: this node.
SpreadLayout spread_layout(const std::vector<std::optional<std::string>>& nodes,
                           const std::vector<std::optional<std::string>>& shards,
                           const std::vector<std::string>& endpoints, int rank);

class ProbeShards {
 public:
  // shards: the job's shard indices this node runs; host: its address; encrypt: the job's
  // dist.ps_encrypt ("auto": CURVE from the token; "off"); latency_ms: emulate.latency_ms.
  ProbeShards(const std::vector<int>& shards, const std::string& host, const std::string& token,
              const std::string& encrypt, double latency_ms);
  ~ProbeShards();
  ProbeShards(const ProbeShards&) = delete;
  ProbeShards& operator=(const ProbeShards&) = delete;

  const std::map<int, std::string>& endpoints() const { return endpoints_; }  // shard -> tcp://HOST:PORT

 private:
  void stop();
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  std::map<int, std::string> endpoints_;
};

}  // namespace syncopate
