// Worker side of the `ps` mode, a small ticketed API in the spirit of ps-lite: one ZeroMQ DEALER
// per parameter-server shard; `push` sends shard k's gradient and returns a ticket at once,
// `wait` blocks for that ticket's reply and writes the shard's new parameters. Shards are the
// contiguous pieces of the flat parameter vector cut by the one partition rule (Sharding), shard
// k on server k (a large tensor such as the embedding spreads over several servers). Pushing
// every shard before waiting for any makes the shards work in parallel.
//
// Buffer lifetime: a push is sent without copying, and the message holds a reference to the
// tensor it was given, so the memory outlives ZeroMQ's use of it. The caller must not write that
// tensor until wait() returns for its ticket: a reply means the server holds the bytes. A resend
// (a silent server) is a copy made inside wait(), before it returns, so a resend still queued in
// ZeroMQ never carries what the caller writes afterwards (the next step's gradient).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/comm/wire_format.h"
#include "common/flat_adamw.h"

namespace syncopate {

struct PsClientOptions {
  double timeout_s = 60;              // longest wait for one reply, resends included, seconds
  double first_resend_s = 5;          // silence before the first resend, seconds; doubles per resend up to 60
  std::string curve_server_key = "";  // the servers' CURVE public key (Z85) to encrypt and
                                      // authenticate every connection; "" = plain TCP
  std::string model_digest = "";      // what the job's workers must agree on besides the server list (the run's model
                                      // digest); INIT's layout carries both, and a shard refuses a worker whose differs
  WireFormat wire = WireFormat::kF32; // how pushes travel (dist.wire); int8 carries its rounding error into
                                      // the next push to the same shard (ErrorFeedback); replies are f32
};

// A push in flight: shard, and the request's sequence number on this client.
struct PsTicket {
  int shard = -1;
  int64_t id = -1;
};

// What the server said of a push.
struct PsReply {
  int64_t staleness = 0;  // parameter versions applied between reading the weights and this update
  int64_t version = 0;    // the shard's parameter version after it
};

// Counters since construction (tests and logs read them; nothing is printed).
struct PsClientCounters {
  int64_t pushes = 0;      // pushes sent (resends not counted)
  int64_t resends = 0;     // requests sent again after the server was silent
  int64_t bytes_sent = 0;  // gradient bytes of pushes and resends
};

// Every tensor passed in lives in host memory, float32, contiguous (a GPU replica stages through
// HostStaging).
// What a push carries and how the shards apply it (INIT's `update`): gradients under the shard's
// AdamW, or local SGD's pseudo-gradients under an outer step ("average", "nesterov").
struct ShardUpdate {
  std::string rule = "adamw";
  double outer_lr = 0.7, outer_momentum = 0.9;
  int64_t outer_delay = 1;  // delayed_nesterov: arrivals per momentum update
};

class PsClient {
 public:
  // endpoints: tcp://IP:PORT of each shard; worker: this worker's id of `workers`.
  PsClient(const std::vector<std::string>& endpoints, const std::string& token, int worker, int workers,
           const PsClientOptions& options = {});
  ~PsClient();
  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  // Sends INIT (range, AdamW settings, initial values, decay ranges, the clock this worker starts
  // at, the update rule) to every shard and loads the shards' current values into params (the
  // first worker's INIT wins; later joiners and restarted workers get the latest).
  void init(at::Tensor& params, const std::vector<std::pair<int64_t, int64_t>>& decay, const AdamWConfig& opt,
            int64_t start_step = 0, const ShardUpdate& update = {});
  int shards() const;
  // Shard k is [bounds()[k], bounds()[k+1]) of the flat vector (after init()).
  const std::vector<int64_t>& bounds() const;

  // Sends shard k's gradient `grad` (the shard's range only, bounds()[k+1] - bounds()[k] elements),
  // computed at step `clock` on the parameters of version `computed_on` (-1: the version of the
  // last reply of this shard), to be applied with learning rate lr. Returns at once.
  PsTicket push(int shard, const at::Tensor& grad, int64_t clock, double lr, int64_t computed_on = -1);
  // Waits for the reply to `ticket` and writes the shard's new parameters into `into` (the shard's
  // range). Resends with backoff while the server is silent (the server drops duplicates by
  // clock), up to timeout_s; throws syncopate::Error naming the server otherwise or when it
  // refused. One thread at a time per shard.
  PsReply wait(const PsTicket& ticket, at::Tensor& into);

  // Parameter versions of the last replies, per shard.
  std::vector<int64_t> versions() const;
  // The newest clock of this worker that any shard had applied when init() registered it (-1: none):
  // a worker resumed from an older checkpoint recomputes the clocks up to it, which the shards
  // answer without applying them again.
  int64_t applied_clock() const;
  PsClientCounters counters() const;
  // The STATS JSON of shard k.
  std::string stats(int k);
  // Asks every shard to exit.
  void shutdown_servers();
  // Tells every shard that this worker ended its run normally at `clock` (FINISH): it leaves the
  // BSP/SSP count, and shards started with server.exit_when_done exit once every worker has.
  void finish(int64_t clock);
  // INIT's layout of this client: "<K> shards, servers <digest of the endpoints in order>, model <digest>".
  std::string layout() const;

  static std::vector<std::string> parse_endpoints(const std::string& comma_separated);
  // Timeline tracks of the shards' round trips: kTraceTrack + k.
  static constexpr int kTraceTrack = 1000;

 private:
  // Tracing: this process's clock against every shard's (a STATS round trip each), as clock_sync events.
  void record_clock_offsets();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Every shard's push, then every reply: grads and params are the whole flat vector (host memory).
// Returns the mean staleness over shards. computed_on: per-shard versions (null: the last replies').
double push_pull(PsClient& client, const at::Tensor& grads, at::Tensor& params, int64_t clock, double lr,
                 const std::vector<int64_t>* computed_on = nullptr);

}  // namespace syncopate
