// Worker side of the `ps` mode, a small ticketed API in the spirit of ps-lite: one ZeroMQ DEALER
// per parameter-server shard; `push` sends one part's gradient and returns a ticket at once,
// `wait` blocks for that ticket's reply and writes the part's new parameters. Shards are the
// contiguous pieces of the flat parameter vector cut by the one partition rule (Sharding), shard
// k on server k (a large tensor such as the embedding spreads over several servers). Pushing
// every part before waiting for any makes the shards work in parallel.
//
// Parts: each shard's range is pushed as one part, or (partition_elems > 0, dist.ps_partition_mb)
// cut into parts of at most that many values, BytePS's partitions. A server applies and answers
// each part on its own, so on one connection the reply of part p travels back while part p+1 is
// still being pushed: push and pull overlap on a full-duplex link. Replies are matched to pushes by
// (part offset, clock). Parts are numbered in order over the flat vector; bounds() gives them.
//
// Buffer lifetime: a push is sent without copying, and the message holds a reference to the
// tensor it was given, so the memory outlives ZeroMQ's use of it. The caller must not write that
// tensor until wait() returns for its ticket: a reply means the server holds the bytes. A resend
// (a silent server) is a copy made inside wait(), before it returns, so a resend still queued in
// ZeroMQ never carries what the caller writes afterwards (the next step's gradient).
#pragma once
#include <cstdint>
#include <functional>
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
                                      // the next push of the same part (ErrorFeedback); replies are f32
  int64_t partition_elems = 0;        // values per part at most (dist.ps_partition_mb); 0 = a shard's whole
                                      // range is one part. Every worker of a job must use the same (INIT's layout)
  bool overlap = false;               // dist.ps_overlap: told to the servers in INIT (BSP backup workers refuse it)
  bool elastic = false;               // dist.elastic: the job's membership may change; init() joins the running job
                                      // at its clock, and the shards grant each step's data (data_grant())
  int64_t samples_per_step = 0;       // elastic: training samples one step of this worker takes (its grants' size)
};

// A push in flight: part, and the request's sequence number on this client.
struct PsTicket {
  int part = -1;
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
  int64_t bytes_received = 0;  // parameter bytes of the replies taken (INIT's and pushes')
};

// Every tensor passed in lives in host memory, float32, contiguous (a GPU replica stages through
// HostStaging).
// What a push carries and how the shards apply it (INIT's `update`): gradients under the shard's
// AdamW, or local SGD's pseudo-gradients under an outer step ("average", "nesterov").
struct ShardUpdate {
  std::string rule = "adamw";
  double outer_lr = 0.7, outer_momentum = 0.9;
  int64_t outer_delay = 1;  // delayed_nesterov: arrivals per momentum update (0, elastic: the live members)
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
  // first worker's INIT wins; later joiners and restarted workers get the latest). moments (optional):
  // AdamW's state over the whole flat vector, sent with the values (a switch into ps mode from a mode
  // whose nodes held it); a shard that INIT creates starts its AdamW from it.
  void init(at::Tensor& params, const std::vector<std::pair<int64_t, int64_t>>& decay, const AdamWConfig& opt,
            int64_t start_step = 0, const ShardUpdate& update = {}, FlatAdamW* moments = nullptr);
  int shards() const;  // servers
  int parts() const;   // parts pushed independently (after init()): shards() when not partitioned
  // Part p is [bounds()[p], bounds()[p+1]) of the flat vector (after init()), on server server_of(p).
  const std::vector<int64_t>& bounds() const;
  int server_of(int part) const;
  // The parts' bounds for a flat vector of n values over `servers` shards: each shard's range
  // (Sharding) cut into the fewest near-equal pieces of at most partition_elems values (0: whole).
  // server_of_part, when given, receives each part's server.
  static std::vector<int64_t> part_bounds(int64_t n, int servers, int64_t partition_elems,
                                          std::vector<int>* server_of_part = nullptr);

  // Sends part p's gradient `grad` (the part's range only, bounds()[p+1] - bounds()[p] elements),
  // computed at step `clock` on the parameters of version `computed_on` (-1: the version of the
  // last reply of this part), to be applied with learning rate lr. Returns at once. A clock the
  // part had applied when init() registered this worker is a replay the server answers without
  // applying: with int8 it is encoded without touching the residual (nothing of it is delivered).
  PsTicket push(int part, const at::Tensor& grad, int64_t clock, double lr, int64_t computed_on = -1);
  // Waits for the reply to `ticket` and writes the part's new parameters into `into` (the part's
  // range). Resends with backoff while the server is silent (the server drops duplicates by
  // clock), up to timeout_s; throws syncopate::Error naming the server otherwise or when it
  // refused. One thread at a time per server (its parts share one connection).
  PsReply wait(const PsTicket& ticket, at::Tensor& into);

  // int8 wire: the parts' error-feedback residuals (what rounding dropped, owed to each part's next
  // push) as one vector of bounds().back() values, for the worker's checkpoint; set_residuals puts
  // them back after init() (a resumed worker owes what it owed at its checkpoint). No-ops otherwise.
  void residuals(float* out) const;
  void set_residuals(const float* in);
  // Parameter versions of the last replies, per part.
  std::vector<int64_t> versions() const;
  // The newest update count (wire version without its restore epoch) seen of each part, pulls included
  // (versions() stays that of this
  // worker's own replies, for staleness and DC-ASGD).
  std::vector<int64_t> latest_versions() const;
  // BSP (protocol 9): the smallest clock the parts collected next at their last replies to this
  // worker, so every clock below it was applied (or closed, backup workers) on every part; a BSP
  // job's clocks are its steps. -1 under SSP and ASP, or before init().
  int64_t job_round() const;
  // The newest clock of this worker that any shard had applied when init() registered it (-1: none):
  // a worker resumed from an older checkpoint recomputes the clocks up to it, which the shards
  // answer without applying them again.
  int64_t applied_clock() const;
  // The largest restore epoch among the shards' parts when init() registered this worker: 0 when
  // every shard started from a worker's INIT, > 0 when one restored a checkpoint of its own.
  int64_t restored_epoch() const;
  // The clock init() registered this worker at: start_step, or (elastic) the clock it joined the job at.
  int64_t start_clock() const;
  // Elastic: the first sample of this worker's next step in the job's data order, as the job's first
  // part last granted it (init()'s reply, then every push's); -1 otherwise.
  int64_t data_grant() const;
  // Elastic: this worker skipped its step (nothing pushed); the first part grants the next step's
  // data (a PULL of part 0 with `samples`, whose values are not taken). No-op otherwise.
  void skip_data();
  PsClientCounters counters() const;
  // The STATS JSON of shard k.
  std::string stats(int k);
  // Every part's current values from its shard (PULL), into params (the whole flat vector). Applies
  // nothing; resent while a shard is silent.
  void pull(at::Tensor& params);
  // Leaves the rounds (FINISH still reading: this worker pushes no more), then blocks until every
  // other worker of the job has finished (FINISH) or is dead by the shards'
  // liveness, polling shard 0's STATS (poll_s apart): the job's last update has landed; true. False
  // (with a warning) once shard 0 has applied nothing for the client's timeout_s while a worker is
  // still unfinished (e.g. one that died while held by BSP/SSP stays "live"). Heartbeats go on
  // meanwhile, so this worker is not taken for dead. on_poll (optional): called after each poll
  // with shard 0's update count (its version without the restore epoch), e.g. to evaluate the
  // servers' values at points the job passes while this worker waits.
  bool wait_for_other_workers(double poll_s = 0.05, const std::function<void(int64_t)>& on_poll = {});
  // Asks every shard to exit.
  void shutdown_servers();
  // Tells every shard that this worker ended its run normally at `clock` (FINISH): it leaves the
  // BSP/SSP count, and shards started with server.exit_when_done exit once every worker has.
  // still_reading: it pushes no more but reads on (its plain FINISH follows): out of the count now,
  // the shards stay up for it.
  void finish(int64_t clock, bool still_reading = false);
  // INIT's layout of this client: "<K> shards, partition <values>, servers <digest of the endpoints in order>,
  // model <digest>".
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

// Every part's push, then every reply: grads and params are the whole flat vector (host memory).
// Returns the mean staleness over parts. computed_on: per-part versions (null: the last replies').
double push_pull(PsClient& client, const at::Tensor& grads, at::Tensor& params, int64_t clock, double lr,
                 const std::vector<int64_t>* computed_on = nullptr);

}  // namespace syncopate
