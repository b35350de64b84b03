// One parameter-server shard: a contiguous range of the flat parameter vector, its AdamW state
// (the same FlatAdamW as every other mode), its consistency rule and staleness mitigation. Transport-free: the server
// feeds it decoded messages and sends the replies it says are ready.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/flat_adamw.h"
#include "common/outer_optimizer.h"
#include "server/ps_protocol.h"
#include "server/consistency_rule.h"
#include "server/ps_config.h"

namespace syncopate {

class ParameterShard {
 public:
  explicit ParameterShard(const PsConfig& cfg);
  ~ParameterShard();

  // First INIT defines the range, the worker count, the optimizer and the initial values; later
  // INITs (from the other workers) must match it and are otherwise ignored. decay: [offset, length)
  // pairs in flat-vector coordinates. Throws syncopate::Error on a mismatch.
  // now_s starts every worker's liveness clock (a worker that never speaks expires after the timeout).
  // moments (h.moments, protocol 8): AdamW's first then second moments of the range (2 x length floats),
  // and h.adam_steps their step count: a first INIT starts the shard's AdamW from them (a switch into
  // ps mode from a mode whose nodes held them: worker/train/mode_switch.h); later INITs' are checked.
  void init(const MsgHeader& h, const float* values, const int64_t* decay, size_t decay_pairs, double now_s = 0.0,
            const float* moments = nullptr);
  // The checks init() makes before it changes anything (header fields, AdamW settings, finite values,
  // sane moments, agreement with the range a first INIT fixed); throws syncopate::Error.
  void check_init(const MsgHeader& h, const float* values, const float* moments = nullptr) const;
  bool initialized() const { return initialized_; }
  // A worker (re)registers at step `clock`: its next push is that clock. A worker restarted from a
  // checkpoint older than the clocks this shard already applied for it gets those pushes answered
  // as duplicates, not applied twice (exactly once); the worker's clock never goes back.
  void registered(int worker, int64_t clock);
  // An elastic job's INIT (join=0): a worker without a data grant gets one for its next step.
  void register_samples(int worker, int64_t samples);
  // An elastic worker skipped its step (a non-finite gradient: nothing pushed): its next step gets
  // fresh samples (PULL with `samples`).
  void skip_grant(int worker, int64_t samples);
  static constexpr int kMaxWorkers = 4096;  // worker ids are below this

  // Validates a header against the shard (range, worker id); throws syncopate::Error.
  void check(const MsgHeader& h) const;

  // Applies or buffers a gradient per the consistency rule; returns the workers whose replies are
  // ready now (possibly others that were waiting, possibly none).
  // A gradient with a non-finite value, or (ps.max_grad_norm) a norm above the bound, is refused:
  // syncopate::Error, nothing changed but the `rejected` count. now_s >= 0: the worker is seen
  // alive at that time (after the checks).
  std::vector<int> push(const MsgHeader& h, const float* grad, double now_s = -1);
  // Records that `worker` read the current parameters (version() of now). DC-ASGD keeps the last
  // kBackupsPerWorker such reads per worker, keyed by version: a push names the version its
  // gradient was computed on (param_version), which with dist.ps_overlap is the read before last.
  void pulled(int worker);
  static constexpr size_t kBackupsPerWorker = 2;
  // Elastic membership (INIT's `elastic`; docs/PROTOCOL.md "Joining a running job"). A worker that
  // is not a live member (a new id, one expired or finished) joins in two steps over every part:
  // join_clock() (INIT join=1) says which clock it would start at, and join() (INIT join=2) makes
  // it a member from the largest of those clocks on.
  //   join_clock: a live member's own next clock (under BSP only while its push is held in the
  //   round: a member that asks otherwise restarted, and is told what a joiner is); else under BSP
  //   the round after the one being collected (one round of slack, so that the rounds may go on
  //   while the joiner asks every part), under SSP/ASP the slowest live worker's next clock (a
  //   joiner never slows the others), never below the worker's own next clock.
  int64_t join_clock(int worker) const;
  bool member(int worker) const;  // live, not finished, not waiting to join
  // Whether a join is always answered at once, whatever the state (ASP: no rule holds a reply, so
  // join() never makes a joiner wait for a round or a held push). Only then is a join that arrives
  // again over an older state (a restore's re-delivery, ShardPartitions' membership journal) the same
  // as its first arrival; under BSP and SSP the outcome depends on the rounds (helper-20).
  bool joins_at_once() const { return initialized_ && !rule_->holds_replies(); }
  // `worker` (a new id adds a slot) takes part from `clock` on: its next push is that clock. Under
  // BSP a clock past the round being collected makes it a joiner counted from that round on: false
  // = its reply waits until then (push() or expire() releases it); true = reply now. A part whose
  // rounds passed `clock` (while the worker asked the others) counts it from the round being
  // collected: its pushes of the clocks in between are answered as duplicates. samples: the
  // worker's samples per step, for its data grant.
  // `released`: workers whose held replies a restarted member's leaving released (see join_clock).
  // `pushed`: the newest clock any part received a push of from the worker (INIT join = 2's, the
  // largest of the parts' join = 1 answers, pushed_clock()); -1 = none. A returning worker keeps the
  // data grant it never used, unless a part received a push of the grant's clock: it computed on it.
  // A restarted member whose last push is still held here (in the round being collected) while its
  // join names a later clock (another part completed that round meanwhile): its join waits for the
  // round (false) and takes effect when the held push is released, as if it arrived then: it leaves
  // the round after and counts from `clock` like the other parts say (helper-28's second gap,
  // protocol 11; before, its clock was raised inside the round and this part's later rounds mixed
  // its clock t + 1 with the others' t). rejoining() lists such workers.
  bool join(int worker, int64_t clock, int64_t samples, double now_s, std::vector<int>* released = nullptr,
            int64_t pushed = -1);
  // The newest clock this part counts as done for `worker` (-1: none, or a worker it never had): a push
  // it received, or the clock before the one a join counted it from. The latter can only make a
  // later rejoin skip an unused grant, never reuse a used one.
  int64_t pushed_clock(int worker) const;
  // Workers whose join waits for their held push's release (above), with the clock it names.
  const std::map<int, int64_t>& rejoining() const { return rejoin_; }
  bool elastic() const { return elastic_; }
  // Changes of the live set so far (joins, leaves, expiries, returns); saved.
  int64_t membership_epoch() const { return membership_epoch_; }
  // An elastic job's data order is granted by its first part (offset 0): the first sample of the
  // worker's next step, each sample granted once (a resent push gets the grant it got before).
  // -1: this part grants no data, or the worker has none yet.
  int64_t grant(int worker) const;
  int64_t data_cursor() const { return data_cursor_; }
  // A grant moved the cursor past the reserved mark, which moved on: the server makes the new mark
  // durable (ShardPartitions::make_reserve_durable) before it replies (take_durable_due() clears the flag).
  bool take_durable_due() { return std::exchange(durable_due_, false); }
  bool durable_due() const { return durable_due_; }
  static constexpr int64_t kGrantReserve = 256;  // steps of grants one checkpoint reserves (skipped after a restore)
  static constexpr int64_t kRoundGrantReserve = 4;  // local SGD (an outer update): rounds of grants (H steps each)

  // A push: the worker is alive and (even in an elastic job) a member again if it had expired.
  void revive(int worker, double now_s);
  // Liveness: `seen` marks a worker alive at time now_s (it rejoins if it was dead); `expire`
  // drops workers silent for longer than worker_timeout_s from the BSP/SSP count and returns the
  // replies that this releases.
  void seen(int worker, double now_s);
  // A worker that left the rounds still reading (finish with still_reading) is alive at now_s; any
  // other worker: nothing (a STATS poll brings no one back into the count).
  void seen_reading(int worker, double now_s);
  std::vector<int> expire(double now_s);
  int live_workers() const;
  // FINISH: `worker` ended its run normally. It leaves the BSP/SSP count at once (no timeout to
  // wait for) and stays out until it registers again; returns the replies that this releases.
  // still_reading (FINISH with data = kFinishStillReading): it pushes no more but still reads (node 0
  // waiting to score the job's final weights): it leaves the count the same way, and the job is not
  // over for this shard until its plain FINISH (or its silence past worker_timeout_s).
  std::vector<int> finish(int worker, bool still_reading = false);
  // Every worker has finished or died, and at least one finished, and none still reads: the job is
  // over for this shard (server.exit_when_done).
  bool job_done() const;

  // Atomic checkpoint of everything the shard needs to resume: values, AdamW moments and step,
  // version, clocks, worker count, range, which workers finished, the held workers and (BSP) the
  // sum of their gradients and the clock's lr, so a clock partly collected is not lost. load()
  // returns false if there is no file; throws on a corrupt one.
  // image(): what save() writes, as tensors and the file's metadata; copy = detached copies of the
  // tensors (a snapshot that a background write may read while the shard goes on), else views of
  // the live state. before_commit: as save_safetensors's (a modelled write time held before the rename).
  struct Image {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    std::map<std::string, std::string> metadata;
  };
  Image image(bool copy) const;
  void save(const std::string& path, const std::function<void()>& before_commit = {}) const;
  // metadata (optional): the file's metadata, for what its writer added (ShardPartitions' snapshot number).
  bool load(const std::string& path, double now_s, std::map<std::string, std::string>* metadata = nullptr);
  // The data cursor a restore resumes at (the reserved mark), and a restore's use of a newer mark
  // written since its checkpoint (ShardPartitions' reserve record): the cursor moves up to it.
  int64_t data_reserved() const { return data_reserved_; }
  void resume_cursor_at(int64_t reserved);
  int64_t clock(int worker) const { return clock_[static_cast<size_t>(worker)]; }
  // BSP: the job's frontier, the clock after the newest closed one (a push applied or dropped; of any
  // worker, finished and dead ones included): every clock below it was applied or closed. Not
  // bsp_round(), which counts the live workers only: once the others finished, a worker behind them
  // would see its own clock. -1 under SSP/ASP. O(workers) per reply, like bsp_round().
  int64_t round() const;
  int64_t updates() const { return updates_; }
  const std::string& consistency() const { return cfg_.consistency; }
  int64_t dropped() const { return dropped_; }  // BSP with backup workers: late gradients dropped
  int64_t duplicates() const { return duplicates_; }  // pushes answered as duplicates (a resend, a clock already applied)
  int64_t rejected() const { return rejected_; }  // pushes refused: non-finite, or above ps.max_grad_norm
  static constexpr int64_t kMaxShardLength = int64_t{1} << 36;  // elements (256 GiB of float32)

  const at::Tensor& params() const { return params_; }
  int64_t version() const { return version_; }
  // The version on the wire (ps_protocol.h's wire_version: the restore epoch above the update
  // count). Monotonic across restarts, where version() repeats the numbers a crash lost.
  int64_t wire_version() const { return syncopate::wire_version(epoch_, version_); }
  int64_t epoch() const { return epoch_; }
  int64_t last_staleness(int worker) const;
  const std::string& wire() const { return wire_; }  // the dtype every push must carry
  int64_t offset() const { return offset_; }
  int64_t length() const { return length_; }
  // {"version", "updates", "staleness_histogram": {"0": n, ...}, "consistency", ...}
  // now_s >= 0 adds the server's clock ("now_s"), against which "last_seen_s" (per worker) tells how
  // long each worker has been silent (scripts and syncopate-server --status); unix_us >= 0 adds the
  // server's system clock ("unix_us"), against which tracing workers measure their offset.
  std::string stats_json(int64_t errors, double now_s = -1, int64_t unix_us = -1) const;

 private:
  void apply(const at::Tensor& grad, double lr);
  std::vector<int> release_held();
  WorkerClocks clocks() const { return {clock_, live_, live_workers()}; }

  PsConfig cfg_;
  std::unique_ptr<ConsistencyRule> rule_;  // made by the first INIT (it needs the worker count)
  StalenessMitigation mitigation_;
  bool initialized_ = false;
  int64_t offset_ = 0, length_ = 0;
  int workers_ = 0;
  at::Tensor params_, grad_sum_;
  std::unique_ptr<FlatAdamW> opt_;
  std::unique_ptr<OuterOptimizer> outer_;  // INIT update "average"/"nesterov": pushes are pseudo-gradients
  std::string update_ = "adamw";
  std::string wire_ = "f32";  // the pushes' dtype (INIT's wire)
  std::string layout_;        // INIT's layout (server list and model digests); every worker must send the same
  std::vector<bool> finished_;  // per worker: sent FINISH (and did not register again since)
  std::vector<bool> reading_;   // per worker: left the count with FINISH still_reading, its plain FINISH not yet come
  void leave_if_reading(const std::vector<int>& released);
  double outer_lr_ = 0, outer_mu_ = 0;
  int64_t outer_delay_ = 1;
  int64_t version_ = 0, updates_ = 0;
  int64_t epoch_ = 0;  // restores from a checkpoint so far (saved; one more at every load)
  int64_t staleness_of(int64_t param_version) const;  // a push's, from the wire version it names
  std::map<int64_t, int64_t> staleness_hist_;
  std::vector<int64_t> clock_;        // last clock pushed, per worker (-1: none yet)
  std::vector<int64_t> last_stale_;   // staleness of each worker's last update
  struct Backup {
    int64_t version = -1;
    at::Tensor values;
  };
  std::vector<std::vector<Backup>> backup_;  // DC-ASGD: per worker, its last reads (newest last)
  const Backup* backup_of(int worker, int64_t version) const;
  int64_t dc_uncompensated_ = 0;      // DC-ASGD: pushes computed on a version no longer kept
  at::Tensor dc_buf_;                 // DC-ASGD: the compensated gradient (reused)
  const at::Tensor& delay_compensated(const float* g, const at::Tensor& backup);
  std::set<int> waiting_;             // BSP/SSP: pushed, reply held back
  std::vector<double> last_seen_;     // per worker, seconds
  std::vector<bool> live_;
  int64_t dead_events_ = 0, duplicates_ = 0, dropped_ = 0, rejected_ = 0;
  static int64_t count_nonfinite(const float* v, int64_t n);
  static void check_decay(const int64_t* decay, size_t pairs);  // INIT's pairs: no overflow, none negative
  int64_t dc_backup_values() const;  // DC-ASGD: values held in the workers' saved reads (STATS dc_backup_values)
  double cfg_beta1_ = 0, cfg_beta2_ = 0, cfg_eps_ = 0, cfg_wd_ = 0;  // AdamW settings from INIT (saved)
  std::vector<std::pair<int64_t, int64_t>> decay_;                    // shard-relative decay ranges
  std::vector<int> release_bsp();
  // Elastic membership.
  bool elastic_ = false;
  int64_t membership_epoch_ = 0;
  std::map<int, int64_t> joining_;     // BSP: worker -> the round from which it counts (its reply held until then)
  std::vector<int64_t> grant_;         // per worker: first sample of its next step (-1: none); first part only
  std::vector<int64_t> grant_clock_;   // per worker: the clock its grant is for (a push of it or later took it)
  int64_t data_cursor_ = 0;            // first part: the next sample not granted yet
  int64_t data_reserved_ = 0;          // first part: grants below this are covered by the last checkpoint (saved as
                                       // the cursor, so a restore never grants a sample twice)
  bool durable_due_ = false;           // a grant passed data_reserved_: checkpoint before replying
  bool grants_data() const { return elastic_ && offset_ == 0; }
  // The worker's next step takes [cursor, cursor + samples), for its push of `for_clock` or later.
  void grant_next(int worker, int64_t samples, int64_t for_clock);
  void grow(int workers);                         // slots for worker ids below `workers`
  int64_t bsp_round() const;                      // the clock being collected
  std::vector<int> admit_joiners();               // BSP: joiners whose round has come (or nobody is left to wait for)
  // join()'s change of membership (a member leaving the round, a joiner held or counted at once).
  bool enter(int worker, int64_t clock, std::vector<int>* released);
  std::map<int, int64_t> rejoin_;                 // worker -> its join's clock, applied when its held push is released
  void apply_rejoins(std::vector<int>& released);  // of the workers just released, those with a deferred join
  int bsp_count_ = 0;
  double bsp_lr_ = 0;
};

}  // namespace syncopate
