// The parameter-server round trip as a job would see it, for syncopate-probe (issue 29): every node
// of the job pushes a gradient of the model's size to the job's shards and takes their reply (the
// part's new values), all nodes at once, round after round. Under BSP shards (how the probe's servers
// are started) every round is released to every node together, so each round is the exchange that
// BSP, BSP with backup workers and synchronous local SGD pay per step: pushes that converge on the
// shards at once (incast), replies that leave them at once, TCP's losses and retransmissions, the
// shards' own update time. Each round starts `gap_s` after the previous one ended, as a job's next push
// follows its step's compute (back to back, a round's pushes would meet the previous round's replies
// still on the links, which a training step's compute keeps apart). The learning rate is 0: the
// values never change.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "server/ps_client.h"

namespace syncopate {

struct PsRoundProbe {
  std::vector<double> round_s;  // each timed round: push of every part to the reply of the last, seconds (gap excluded)
  int servers = 0;              // shards
  int parts = 0;                // parts pushed per round (dist.ps_partition_mb)
  int64_t bytes_pushed = 0;     // gradient bytes this node sent per round (wire format applied)
  int64_t bytes_received = 0;   // parameter bytes it received per round
};

// Registers `rank` of `world` with the shards at `endpoints` (INIT of `params` zeros, clock 0), runs
// `warmup` untimed then `rounds` timed rounds, each after a pause of gap_s seconds, and leaves (FINISH). Throws syncopate::Error naming the
// shard that failed or stayed silent past options.timeout_s.
PsRoundProbe probe_ps_rounds(const std::vector<std::string>& endpoints, const std::string& token, int rank, int world,
                             const PsClientOptions& options, int64_t params, int rounds, int warmup, double gap_s);

}  // namespace syncopate
