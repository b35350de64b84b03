#include "server/shard_partitions.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <random>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/log.h"
#include "common/monotonic_clock.h"
#include "common/safetensors.h"

namespace syncopate {

namespace {
// Holds until t0_s + hold_s (a modelled write time; nothing if the write already took longer).
void hold_until(double t0_s, double hold_s) { sleep_until_seconds(t0_s + hold_s); }
}  // namespace

ShardPartitions::ShardPartitions(const PsConfig& cfg, int shard, std::string checkpoint_dir, int64_t checkpoint_every,
                                 bool background, double hold_s)
    : cfg_(cfg), shard_(shard), dir_(std::move(checkpoint_dir)), every_(checkpoint_every), background_(background),
      hold_s_(hold_s) {}
ShardPartitions::~ShardPartitions() = default;  // (writer_ first: it waits for the write in flight)

double ShardPartitions::hold_of(const Part& p) const {
  int64_t total = 0;
  for (const auto& [r, q] : parts_) total += r.second;
  return total > 0 ? hold_s_ * static_cast<double>(p.shard->length()) / static_cast<double>(total) : hold_s_;
}

std::string ShardPartitions::path_of(int64_t offset, bool whole) const {
  return whole ? fmt::format("{}/shard_{}.safetensors", dir_, shard_) : fmt::format("{}/shard_{}.at{}.safetensors", dir_, shard_, offset);
}

std::string ShardPartitions::describe() const {
  if (parts_.empty()) return "none";
  const auto& first = parts_.begin()->first;
  const auto& last = parts_.rbegin()->first;
  return fmt::format("{} partition(s) from [{}, +{}) to [{}, +{})", parts_.size(), first.first, first.second, last.first,
                     last.second);
}

ParameterShard& ShardPartitions::init(const MsgHeader& h, const float* values, const int64_t* decay, size_t pairs,
                                      double now_s, bool* created, const float* moments) {
  if (created) *created = false;
  SYN_CHECK(h.partition >= 0 && (h.partition == 0 || h.length <= h.partition),
            fmt::format("INIT of [{}, +{}) with partition size {}", h.offset, h.length, h.partition),
            "a partition holds at most `partition` values (0 = the whole range): same Syncopate build everywhere");
  const bool whole = h.partition == 0;
  if (auto it = parts_.find({h.offset, h.length}); it != parts_.end()) {
    SYN_CHECK(it->second.whole == whole,
              fmt::format("INIT of [{}, +{}) {}, but this server holds it {}", h.offset, h.length,
                          whole ? "unpartitioned" : "as a partition", it->second.whole ? "unpartitioned" : "as a partition"),
              "every worker must run the same dist.ps_partition_mb");
    it->second.shard->init(h, values, decay, pairs, now_s, moments);  // checks agreement; changes nothing
    return *it->second.shard;
  }
  for (const auto& [range, part] : parts_) {
    const bool overlap = h.offset < range.first + range.second && range.first < h.offset + h.length;
    SYN_CHECK(!overlap && part.whole == whole && !whole,
              fmt::format("INIT of [{}, +{}) ({}), but this server holds {}", h.offset, h.length,
                          whole ? "unpartitioned" : fmt::format("partitions of {} values", h.partition), describe()),
              "every worker must run the same model, server list and dist.ps_partition_mb; a checkpoint directory "
              "written with another partition size must be deleted (or the old size used)");
  }
  int64_t held = 0;
  for (const auto& [range, part] : parts_) held += range.second;
  SYN_CHECK(held + h.length <= ParameterShard::kMaxShardLength,
            fmt::format("INIT of [{}, +{}) beyond this server's {} values", h.offset, h.length, ParameterShard::kMaxShardLength),
            "a server holds at most 2^36 values: add servers");
  SYN_CHECK(static_cast<int64_t>(parts_.size()) < kMaxPartitionsPerServer,
            fmt::format("INIT of a partition beyond this server's limit of {}", kMaxPartitionsPerServer),
            "raise dist.ps_partition_mb (fewer, larger partitions) or add servers");
  auto shard = std::make_unique<ParameterShard>(cfg_);
  shard->init(h, values, decay, pairs, now_s, moments);  // throws before anything is kept
  if (!dir_.empty()) {  // a reserve record left by another run (its checkpoint deleted) is not this partition's
    std::error_code ec;
    std::filesystem::remove(path_of(h.offset, whole) + ".reserve", ec);
  }
  if (parts_.empty() && run_.empty()) run_ = fmt::format("{:016x}", std::random_device{}() * 0x100000000ull + std::random_device{}());
  Part& p = parts_[{h.offset, h.length}];
  p.shard = std::move(shard);
  p.whole = whole;
  if (created) *created = true;
  return *p.shard;
}

ParameterShard& ShardPartitions::at(const MsgHeader& h) {
  SYN_CHECK(!parts_.empty(), "shard not initialized yet", "a worker must send INIT first");
  auto it = parts_.find({h.offset, h.length});
  SYN_CHECK(it != parts_.end(),
            fmt::format("range [{}, +{}) is no partition of this server, which holds {}", h.offset, h.length, describe()),
            "workers and servers disagree on the sharding: same model, server list and dist.ps_partition_mb everywhere");
  return *it->second.shard;
}

void ShardPartitions::check_worker(const MsgHeader& h) const {
  SYN_CHECK(!parts_.empty(), "shard not initialized yet", "a worker must send INIT first");
  MsgHeader named = h;  // any partition answers for the job's worker count
  named.offset = parts_.begin()->first.first;
  named.length = parts_.begin()->first.second;
  parts_.begin()->second.shard->check(named);
}

void ShardPartitions::seen(int worker, double now_s) {
  for (auto& [r, p] : parts_) p.shard->seen(worker, now_s);
}

void ShardPartitions::seen_reading(int worker, double now_s) {
  for (auto& [r, p] : parts_) p.shard->seen_reading(worker, now_s);
}

std::vector<std::pair<ParameterShard*, int>> ShardPartitions::expire(double now_s) {
  std::vector<std::pair<ParameterShard*, int>> out;
  for (auto& [r, p] : parts_)
    for (int w : p.shard->expire(now_s)) out.emplace_back(p.shard.get(), w);
  return out;
}

std::vector<std::pair<ParameterShard*, int>> ShardPartitions::finish(int worker, bool still_reading) {
  std::vector<std::pair<ParameterShard*, int>> out;
  for (auto& [r, p] : parts_)
    for (int w : p.shard->finish(worker, still_reading)) out.emplace_back(p.shard.get(), w);
  return out;
}

bool ShardPartitions::job_done() const {
  if (parts_.empty()) return false;
  for (const auto& [r, p] : parts_)
    if (!p.shard->job_done()) return false;
  return true;
}

const std::string& ShardPartitions::consistency() const { return cfg_.consistency; }

void ShardPartitions::checkpoint(ParameterShard& shard, bool force) {
  if (dir_.empty()) return;
  auto it = parts_.find({shard.offset(), shard.length()});
  SYN_CHECK(it != parts_.end() && it->second.shard.get() == &shard, "checkpoint of a partition this server does not hold",
            "this is a bug");
  Part& p = it->second;
  if (!force && shard.updates() - p.last_checkpoint < every_) return;
  if (background()) {  // a snapshot is wanted: pump() takes it
    want();
    return;
  }
  std::filesystem::create_directories(dir_);
  const double t0 = monotonic_seconds();
  save_part(p, stamp_for_write(), [&] { hold_until(t0, hold_of(p)); });
  p.last_checkpoint = shard.updates();
  ++sync_writes_;
  sync_write_s_ += monotonic_seconds() - t0;
}

void ShardPartitions::checkpoint_all() {
  if (dir_.empty()) return;
  if (writer_) {  // the write in flight first (its snapshot is older than what is written now)
    writer_->wait();
    collect();
  }
  std::filesystem::create_directories(dir_);
  const double t0 = monotonic_seconds();
  const int64_t stamp = stamp_for_write();
  for (auto& [r, p] : parts_) {
    save_part(p, stamp, [&] { hold_until(t0, hold_s_); });
    p.last_checkpoint = p.shard->updates();
    ++sync_writes_;
  }
  sync_write_s_ += monotonic_seconds() - t0;
  // Everything is durable now: every snapshot wanted so far counts as committed, and the journal's
  // records are all covered.
  taken_ = committed_ = stamp;
  wanted_ = false;
  trim_journal();
}

int64_t ShardPartitions::stamp_for_write() const { return background() && wanted_ ? taken_ + 1 : taken_; }

void ShardPartitions::save_part(Part& p, int64_t stamp, const std::function<void()>& before_commit) {
  ParameterShard::Image im = p.shard->image(/*copy=*/false);
  im.metadata["snapshot"] = std::to_string(stamp);
  im.metadata["run"] = run_;
  save_safetensors(path_of(p.shard->offset(), p.whole), im.tensors, im.metadata, before_commit);
  p.snapshot = stamp;
}

void ShardPartitions::want() {
  if (!wanted_) wanted_since_ = monotonic_seconds();
  wanted_ = true;
}

int64_t ShardPartitions::covering_snapshot() {
  want();
  return taken_ + 1;
}

void ShardPartitions::collect() {
  if (in_flight_ > 0 && writer_->idle()) {
    BackgroundTask::Failure f;
    if (writer_->take_failure(&f)) {
      log::error("[server {}] {} failed: {} (hint: free space or fix the permissions of '{}'; the shard keeps its "
                 "previous checkpoint, retries within a second, and holds the replies that wait for it)",
                 shard_, f.label, f.what, dir_);
      want();
      retry_after_ = monotonic_seconds() + 1.0;
    } else {
      committed_ = in_flight_;
      for (auto& [r, p] : parts_) p.snapshot = std::max(p.snapshot, committed_);
      try {
        trim_journal();
      } catch (const std::exception& e) {  // (harmless: a record a file holds is never re-delivered)
        log::warn("[server {}] could not drop the membership records snapshot {} covers: {}", shard_, committed_, e.what());
      }
    }
    in_flight_ = 0;
  }
}

void ShardPartitions::pump() {
  if (!background()) return;
  collect();
  const double now = monotonic_seconds();
  if (!wanted_ || in_flight_ > 0 || parts_.empty() || now < retry_after_ || now < wanted_since_ + kGroupCommitS) return;
  struct File {
    std::string path;
    ParameterShard::Image image;
  };
  std::filesystem::create_directories(dir_);
  auto files = std::make_shared<std::vector<File>>();
  for (auto& [r, p] : parts_) {
    files->push_back({path_of(p.shard->offset(), p.whole), p.shard->image(/*copy=*/true)});
    files->back().image.metadata["snapshot"] = std::to_string(taken_ + 1);  // (what the journal's records are against)
    files->back().image.metadata["run"] = run_;
  }
  if (!writer_) writer_ = std::make_unique<BackgroundTask>();
  // One modelled write of the whole range, held before the first file is renamed into place.
  writer_->submit(fmt::format("shard {}'s checkpoint {}", shard_, taken_ + 1), [files, hold = hold_s_] {
    const double t0 = monotonic_seconds();
    for (const File& f : *files)
      save_safetensors(f.path, f.image.tensors, f.image.metadata, [&] { hold_until(t0, hold); });
  });
  for (auto& [r, p] : parts_) p.last_checkpoint = p.shard->updates();  // (accounted once handed over)
  wanted_ = false;
  in_flight_ = ++taken_;
  ++snapshots_;
}

void ShardPartitions::make_reserve_durable(ParameterShard& shard) {
  if (!shard.durable_due()) return;
  if (dir_.empty()) {
    shard.take_durable_due();
    return;
  }
  auto it = parts_.find({shard.offset(), shard.length()});
  SYN_CHECK(it != parts_.end() && it->second.shard.get() == &shard, "reserve of a partition this server does not hold",
            "this is a bug");
  std::filesystem::create_directories(dir_);
  write_file_atomic(path_of(shard.offset(), it->second.whole) + ".reserve", fmt::format("{}\n", shard.data_reserved()));
  shard.take_durable_due();
}

std::string ShardPartitions::journal_path() const { return fmt::format("{}/shard_{}.members", dir_, shard_); }

bool ShardPartitions::record_join(const ParameterShard& p, int worker, int64_t clock, int64_t samples, int64_t pushed) {
  SYN_CHECK(p.joins_at_once(), "a membership record of a join that a rule may hold", "this is a bug");
  MemberEvent e;
  e.offset = p.offset();
  e.join = true;
  e.worker = worker;
  e.clock = clock;
  e.samples = samples;
  e.pushed = pushed;
  return record(e);
}

bool ShardPartitions::record_finish(int worker, bool still_reading) {
  MemberEvent e;
  e.worker = worker;
  e.reading = still_reading;
  return record(e);
}

bool ShardPartitions::record(MemberEvent e) {
  SYN_CHECK(background(), "a membership record without background checkpoints", "this is a bug");
  // A resent request, recorded and not yet covered by a commit, is not recorded again (no fsync, no
  // snapshot asked for): its re-delivery would be the same. (The latest of the worker's records only:
  // a FINISH between two equal joins must stay between them.)
  for (auto it = journal_.rbegin(); it != journal_.rend(); ++it)
    if (it->worker == e.worker) {
      if (it->same_request(e)) return true;
      break;
    }
  e.snapshot = covering_snapshot();  // (asks for it: a commit keeps the journal short)
  journal_.push_back(e);
  try {
    write_journal();
  } catch (const std::exception& x) {
    journal_.pop_back();
    log::error("[server {}] membership journal '{}': {} (hint: free space or fix the permissions of '{}'; the reply "
               "waits for a write of the state instead)",
               shard_, journal_path(), x.what(), dir_);
    return false;
  }
  return true;
}

void ShardPartitions::write_journal() const {
  if (journal_.empty()) {
    std::error_code ec;
    std::filesystem::remove(journal_path(), ec);
    return;
  }
  nlohmann::json records = nlohmann::json::array();
  for (const MemberEvent& e : journal_)
    records.push_back({{"snapshot", e.snapshot}, {"offset", e.offset}, {"op", e.join ? "join" : "finish"}, {"worker", e.worker},
                       {"clock", e.clock}, {"samples", e.samples}, {"pushed", e.pushed}, {"reading", e.reading}});
  std::filesystem::create_directories(dir_);
  write_file_atomic(journal_path(), nlohmann::json{{"shard", shard_}, {"run", run_}, {"records", records}}.dump() + "\n");
}

void ShardPartitions::trim_journal() {
  const size_t before = journal_.size();
  journal_.erase(std::remove_if(journal_.begin(), journal_.end(), [&](const MemberEvent& e) { return e.snapshot <= committed_; }),
                 journal_.end());
  if (journal_.size() != before) write_journal();
}

void ShardPartitions::replay_journal(double now_s) {
  const std::string path = journal_path();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  const std::string text = read_file(path);
  const std::string hint =
      "it is written whole or not at all, so it was damaged outside Syncopate: restore it, or delete it (the joins "
      "and FINISHes since the newest checkpoint are then forgotten: joiners are told to join again, finished workers "
      "time out)";
  std::vector<MemberEvent> records;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    SYN_CHECK(j.at("shard").get<int>() == shard_, fmt::format("'{}' is shard {}'s", path, j.at("shard").get<int>()), hint);
    if (j.value("run", std::string()) != run_) {  // another run's (the checkpoint files came from elsewhere)
      log::warn("[server {}] '{}' belongs to run '{}', the checkpoint files to run '{}': not re-delivered, removed", shard_,
                path, j.value("run", std::string()), run_);
      std::filesystem::remove(path, ec);
      return;
    }
    for (const auto& r : j.at("records")) {
      MemberEvent e;
      e.snapshot = r.at("snapshot");
      e.offset = r.at("offset");
      const std::string op = r.at("op");
      SYN_CHECK(op == "join" || op == "finish", fmt::format("'{}' holds a record of '{}'", path, op), hint);
      e.join = op == "join";
      e.worker = r.at("worker");
      e.clock = r.at("clock");
      e.samples = r.at("samples");
      e.pushed = r.at("pushed");
      e.reading = r.at("reading");
      SYN_CHECK(e.snapshot >= 1 && e.worker >= 0 && e.worker < ParameterShard::kMaxWorkers && e.clock >= 0,
                fmt::format("'{}' holds a record of worker {} at clock {} for snapshot {}", path, e.worker, e.clock, e.snapshot),
                hint);
      records.push_back(e);
    }
  } catch (const nlohmann::json::exception& e) {
    SYN_FAIL(fmt::format("'{}' is not a membership journal: {}", path, e.what()), hint);
  }
  int64_t newest = taken_;
  int64_t redelivered = 0;
  for (const MemberEvent& e : records) {
    newest = std::max(newest, e.snapshot);
    for (auto& [r, p] : parts_) {
      if (p.snapshot >= e.snapshot || (e.join && r.first != e.offset)) continue;  // the file holds it, or another part's
      SYN_CHECK(!e.join || p.shard->joins_at_once(),
                fmt::format("'{}' holds a join of worker {} to a part whose rule may hold it ({})", path, e.worker,
                            p.shard->consistency()),
                "only ASP joins are recorded: the journal was written by another build or edited; " + hint);
      try {
        if (e.join) p.shard->join(e.worker, e.clock, e.samples, now_s, nullptr, e.pushed);
        else p.shard->finish(e.worker, e.reading);
      } catch (const Error& x) {
        SYN_FAIL(fmt::format("'{}': re-delivering worker {}'s {} refused: {}", path, e.worker, e.join ? "join" : "FINISH",
                             x.what()),
                 hint);
      }
      ++redelivered;
    }
  }
  journal_ = std::move(records);  // (dropped once a snapshot after the restore covers them)
  taken_ = newest;  // (new snapshots are numbered above every record; committed_ stays the newest file's)
  for (auto& [r, p] : parts_) make_reserve_durable(*p.shard);  // (a join re-delivered may have granted)
  if (redelivered > 0)
    log::info("[server {}] re-delivered {} join(s) and FINISH(es) of the membership journal over the checkpoint", shard_,
              redelivered);
}

int ShardPartitions::load(double now_s) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dir_.empty() || !fs::is_directory(dir_, ec)) return 0;
  const std::regex name(fmt::format(R"(shard_{}(\.at(\d+))?\.safetensors)", shard_));
  std::vector<std::pair<std::string, bool>> files;  // path, whole
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string n = e.path().filename().string();
    std::smatch m;
    if (std::regex_match(n, m, name)) files.emplace_back(e.path().string(), !m[1].matched);
  }
  std::sort(files.begin(), files.end());
  for (const auto& [path, whole] : files) {
    remove_temp_files(path);  // a write that a kill cut short
    remove_temp_files(path + ".reserve");
    auto shard = std::make_unique<ParameterShard>(cfg_);
    std::map<std::string, std::string> metadata;
    if (!shard->load(path, now_s, &metadata)) continue;
    // A reserve record newer than the checkpoint: the cursor resumes past every grant it covered.
    if (std::filesystem::exists(path + ".reserve", ec)) {
      const std::string text = read_file(path + ".reserve");
      size_t used = 0;
      int64_t mark = -1;
      try {
        mark = std::stoll(text, &used);
      } catch (const std::exception&) {
      }
      SYN_CHECK(mark >= 0 && text.find_first_not_of(" \n", used) == std::string::npos,
                fmt::format("'{}.reserve' does not hold a data cursor (it reads '{}')", path, text.substr(0, 40)),
                "it is written whole or not at all, so it was damaged outside Syncopate: restore it, or delete it "
                "if the job's data order may repeat samples granted since the checkpoint");
      shard->resume_cursor_at(mark);
    }
    const std::pair<int64_t, int64_t> range{shard->offset(), shard->length()};
    for (const auto& [r, p] : parts_)
      SYN_CHECK(range.first >= r.first + r.second || r.first >= range.first + range.second,
                fmt::format("'{}' holds [{}, +{}), which overlaps another checkpoint of shard {} in {}", path, range.first,
                            range.second, shard_, dir_),
                "the directory mixes partition sizes: delete the files of the run you do not resume");
    Part& p = parts_[range];
    p.last_checkpoint = shard->updates();
    p.shard = std::move(shard);
    p.whole = whole;
    if (run_.empty() && metadata.count("run")) run_ = metadata.at("run");
    try {
      p.snapshot = metadata.count("snapshot") ? std::stoll(metadata.at("snapshot")) : 0;
    } catch (const std::exception&) {
      SYN_FAIL(fmt::format("'{}' names snapshot '{}'", path, metadata.at("snapshot")), "the file is damaged: restore it");
    }
    taken_ = committed_ = std::max(taken_, p.snapshot);
  }
  remove_temp_files(journal_path());
  if (parts_.empty()) {  // a journal beside no checkpoint is another run's
    std::filesystem::remove(journal_path(), ec);
    return 0;
  }
  replay_journal(now_s);
  return static_cast<int>(parts_.size());
}

int64_t ShardPartitions::min_version() const {
  int64_t v = -1;
  for (const auto& [r, p] : parts_) v = v < 0 ? p.shard->version() : std::min(v, p.shard->version());
  return std::max<int64_t>(v, 0);
}

std::string ShardPartitions::checkpoint_files() const {
  if (parts_.size() == 1 && parts_.begin()->second.whole) return path_of(0, true);
  return fmt::format("{}/shard_{}.at*.safetensors ({} files)", dir_, shard_, parts_.size());
}

std::string ShardPartitions::stats_json(int64_t errors, double now_s, int64_t unix_us) const {
  if (parts_.empty()) return nlohmann::json{{"bad_messages", errors}, {"unix_us", unix_us}}.dump();
  nlohmann::json out;
  int64_t length = 0;
  for (const auto& [r, p] : parts_) {
    nlohmann::json j = nlohmann::json::parse(p.shard->stats_json(errors, now_s, unix_us));
    length += r.second;
    if (out.is_null()) {
      out = std::move(j);
      continue;
    }
    out["version"] = std::min(out["version"].get<int64_t>(), j["version"].get<int64_t>());
    for (const char* k : {"updates", "duplicates", "dropped", "rejected", "dc_uncompensated"})
      out[k] = out[k].get<int64_t>() + j[k].get<int64_t>();
    for (auto& [s, n] : j["staleness_histogram"].items())
      out["staleness_histogram"][s] = out["staleness_histogram"].value(s, int64_t{0}) + n.get<int64_t>();
  }
  out["length"] = length;
  out["partitions"] = parts_.size();
  // Checkpoints: files written on the request path and the seconds they held it; background snapshots.
  out["checkpoint_sync_writes"] = sync_writes_;
  out["checkpoint_sync_write_s"] = sync_write_s_;
  out["checkpoint_snapshots"] = snapshots_;
  out["checkpoint_committed"] = committed_;
  out["membership_records"] = journal_.size();
  return out.dump();
}

}  // namespace syncopate
