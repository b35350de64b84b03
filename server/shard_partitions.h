// The partitions of one server's range (dist.ps_partition_mb; BytePS pushes ~4 MB partitions).
// Each partition is a ParameterShard of its own: range, optimizer state, consistency rule, clocks,
// staleness, checkpoint file. A worker pushes each partition as its own message, the server applies
// it and replies with that partition's new values at once, so the reply of one partition travels
// back while the push of the next is still arriving: a full-duplex link carries push and pull
// together instead of one after the other. Every request names its partition by its range (offset,
// length). A server whose INITs say partition = 0 holds one partition, its whole range, as before
// (checkpointed as shard_<k>.safetensors); partition p's file is shard_<k>.at<offset>.safetensors.
//
// The consistency rules hold per partition: under BSP, partition p of clock c is applied once every
// worker's partition p of clock c has arrived, which is the same sum as the whole range's. AdamW,
// the mitigations and the outer optimizers are element-wise, so a partitioned server computes
// exactly what an unpartitioned one does; only ps.max_grad_norm then bounds each partition's norm.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/background_task.h"
#include "server/parameter_shard.h"
#include "server/ps_config.h"

namespace syncopate {

class ShardPartitions {
 public:
  // shard: this server's index (file names); checkpoint_dir "" = no checkpoints.
  // background (server.checkpoint_background): checkpoints are snapshots written by a thread of
  // their own (below); hold_s (server.checkpoint_s): the modelled time of writing the server's whole
  // range, held before the files are renamed into place (a part's write holds its share of it).
  ShardPartitions(const PsConfig& cfg, int shard, std::string checkpoint_dir, int64_t checkpoint_every,
                  bool background = false, double hold_s = 0);
  ~ShardPartitions();

  // INIT: the partition with exactly h's range, made by the first INIT that names it (it must not
  // overlap a partition held, and agree on partitioned or whole), after every check
  // ParameterShard::init makes. Throws syncopate::Error, changing nothing.
  // created (optional): set to whether this INIT made the partition. moments: as ParameterShard::init's.
  ParameterShard& init(const MsgHeader& h, const float* values, const int64_t* decay, size_t pairs, double now_s,
                       bool* created = nullptr, const float* moments = nullptr);
  // The partition a request names by its exact range; throws naming the ranges held.
  ParameterShard& at(const MsgHeader& h);
  bool initialized() const { return !parts_.empty(); }
  size_t size() const { return parts_.size(); }

  // A request that names no range (FINISH): the worker id must be one of the job's.
  void check_worker(const MsgHeader& h) const;
  void seen(int worker, double now_s);
  void seen_reading(int worker, double now_s);  // ParameterShard::seen_reading on every partition
  // Replies released, as (partition, worker): workers expired, or a worker that finished.
  std::vector<std::pair<ParameterShard*, int>> expire(double now_s);
  std::vector<std::pair<ParameterShard*, int>> finish(int worker, bool still_reading = false);
  bool job_done() const;  // every partition's job is over (server.exit_when_done)
  const std::string& consistency() const;

  // Writes partition p's checkpoint when checkpoint_every of its updates have passed since its last
  // one (force: now), atomically. checkpoint_all(): every partition, now (after the background write
  // in flight, if any), on this thread.
  // In the background mode checkpoint() writes nothing: a checkpoint due (or forced) is a snapshot
  // wanted, which pump() takes (every partition, detached copies) once no write is in flight and
  // hands to the writer thread. A reply that must not leave before the state it acknowledges is
  // durable (a join, a FINISH) waits for covering_snapshot()'s number to be committed().
  void checkpoint(ParameterShard& p, bool force = false);
  void checkpoint_all();
  bool background() const { return background_ && !dir_.empty(); }
  // Background mode: the number of the snapshot that will hold the state as of now (one is wanted).
  int64_t covering_snapshot();
  // Background mode: a finished write commits its snapshot (a failed one is logged and wanted again,
  // at most once a second); a wanted snapshot is taken when nothing is in flight, kGroupCommitS after
  // it was first wanted (group commit: the joins of nodes that start together share one write). Cheap
  // when idle.
  void pump();
  static constexpr double kGroupCommitS = 0.05;
  // The newest snapshot whose every file is in place (0: none yet).
  int64_t committed() const { return committed_; }
  // The grant reserve moved on (ParameterShard::durable_due; the flag is cleared once written, so a
  // failed write is retried by the next request): the new mark is written, fsync'ed,
  // to the part's reserve record ("<checkpoint file>.reserve", a number) before the reply: a restore
  // resumes the cursor at the larger of the checkpoint's mark and the record's, so that no sample is
  // granted twice without a checkpoint of the whole state per reserve.
  void make_reserve_durable(ParameterShard& p);
  // The membership journal (background mode): a join or a FINISH is made durable before its reply
  // by a small fsync'ed record of the request in "<dir>/shard_<k>.members", not by a write of the
  // whole state. Every checkpoint file carries the number of the snapshot it holds (metadata
  // "snapshot"), every record the number of the snapshot that will hold it (covering_snapshot(),
  // which it asks for); a restore re-delivers, over each partition's file, the requests recorded
  // after the snapshot that file holds, in order (a join or a FINISH arriving again, which the
  // protocol answers anyway: a worker resends both), and a commit drops the records it covers.
  // Joins are recorded only where they are answered at once (ParameterShard::joins_at_once: ASP); a
  // BSP or SSP join's reply still waits for the write, as do the changes a push makes (a BSP joiner
  // admitted with its round, a worker back) (ps_server). A record identical to one not yet covered
  // (a resent request) is not written again. Returns false, logging the file and the error, if the
  // record cannot be written: the reply must then wait for a write of the state instead.
  bool record_join(const ParameterShard& p, int worker, int64_t clock, int64_t samples, int64_t pushed);
  bool record_finish(int worker, bool still_reading);
  size_t journal_size() const { return journal_.size(); }  // records not yet covered by a committed snapshot
  // Loads every partition file of this shard from the checkpoint directory (removing the temporary
  // files of a write a kill cut short), then re-delivers the membership journal's requests that a
  // file does not hold; returns how many partitions. Throws on a corrupt file, a damaged journal, or
  // on files that overlap (a directory written with another partition size). A journal beside no
  // checkpoint is another run's: removed.
  int load(double now_s);
  int64_t min_version() const;
  // The checkpoint files held, for logs: "DIR/shard_K.safetensors", or "DIR/shard_K.at*.safetensors (N files)".
  std::string checkpoint_files() const;
  // The shard's STATS JSON: the lowest partition's fields (clocks, liveness, per-worker staleness),
  // with `version` the lowest over partitions, `updates`, `duplicates`, `dropped`, `rejected`,
  // `dc_uncompensated` and `staleness_histogram` summed over them (an update counts once per
  // partition), and `partitions` their count (docs/PROTOCOL.md).
  std::string stats_json(int64_t errors, double now_s, int64_t unix_us) const;

 private:
  struct Part {
    std::unique_ptr<ParameterShard> shard;
    bool whole = true;  // INIT partition = 0: the server's whole range
    int64_t last_checkpoint = 0;  // the shard's updates() at its last checkpoint (or snapshot)
    int64_t snapshot = 0;         // loaded: the snapshot number its file holds
  };
  // One record of the membership journal: a join (INIT join = 2 of the part at `offset`) or a FINISH
  // (every part: offset -1), and the snapshot that will hold it.
  struct MemberEvent {
    bool same_request(const MemberEvent& o) const {
      return offset == o.offset && join == o.join && worker == o.worker && clock == o.clock && samples == o.samples &&
             pushed == o.pushed && reading == o.reading;
    }
    int64_t snapshot = 0;
    int64_t offset = -1;
    bool join = false;
    int worker = 0;
    int64_t clock = 0, samples = 0, pushed = -1;  // join()'s arguments
    bool reading = false;                         // FINISH still reading
  };
  std::vector<MemberEvent> journal_;
  // The run these files belong to (made with the first partition, saved in every file and in the
  // journal): a journal of another run (a directory restored from elsewhere beside a leftover one) is
  // not re-delivered (helper-20).
  std::string run_;
  std::string journal_path() const;
  bool record(MemberEvent e);
  void write_journal() const;  // the records held, whole or not at all, fsync'ed (none: the file removed)
  void trim_journal();         // after a commit: the records it covers are dropped
  void replay_journal(double now_s);
  int64_t stamp_for_write() const;
  void save_part(Part& p, int64_t stamp, const std::function<void()>& before_commit);  // on this thread, stamped  // the snapshot number a write of the state as of now holds
  std::string path_of(int64_t offset, bool whole) const;
  std::string describe() const;  // the ranges held, for errors

  PsConfig cfg_;
  int shard_;
  std::string dir_;
  int64_t every_;
  std::map<std::pair<int64_t, int64_t>, Part> parts_;  // by (offset, length)
  double hold_of(const Part& p) const;  // hold_s_'s share for one part's write
  void collect();                       // a finished background write: committed, or logged and wanted again

  // Checkpoint accounting (STATS): files written on the request path and the seconds they took
  // there; snapshots handed to the writer and committed.
  int64_t sync_writes_ = 0, snapshots_ = 0;
  double sync_write_s_ = 0;
  // Background mode.
  const bool background_;
  const double hold_s_;
  bool wanted_ = false;          // a snapshot is wanted (a checkpoint due or forced since the last one taken)
  double wanted_since_ = 0;      // since when (steady seconds)
  void want();
  int64_t taken_ = 0;            // snapshots taken so far (the last one's number)
  int64_t in_flight_ = 0;        // the snapshot being written (0: none)
  int64_t committed_ = 0;        // the newest snapshot written whole
  double retry_after_ = 0;       // after a failed write, no new snapshot before this (steady seconds)
  std::unique_ptr<BackgroundTask> writer_;  // made with the first snapshot
};

}  // namespace syncopate
