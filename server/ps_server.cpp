#include "server/ps_server.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <iostream>
#include <sstream>
#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/monotonic_clock.h"
#include "common/atomic_file.h"
#include "common/check.h"
#include "common/crash_point.h"
#include "common/comm/wire_format.h"
#include "common/log.h"
#include "common/trace.h"
#include "server/ps_keys.h"
#include "server/handshake_watch.h"
#include "server/ps_protocol.h"
#include "server/shard_partitions.h"
#include "server/zmq_delay_line.h"

namespace syncopate {

struct PsServer::Impl {
  ServerConfig scfg;
  ShardPartitions parts;  // this server's range: one partition, or dist.ps_partition_mb's pieces
  uint64_t token;
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::router};  // the workers' side, bound in run()
  std::unique_ptr<ZmqDelayLine> delay;  // server.latency_ms > 0: between sock and the loop
  zmq::socket_t* io = &sock;            // what the loop reads and replies on: sock, or the delay line's end
  std::map<int, zmq::message_t> identity;  // worker -> its DEALER identity, for deferred replies
  int64_t errors = 0;
  int64_t pushes = 0;  // PUSH_PULL requests received by this process (SYNCOPATE_CRASH_AT=ps_server:<point>:<n>)
  std::vector<float> decoded;  // a compressed push, decoded (reused)
  // Tracing: pushes the consistency rule holds ((worker, partition offset) -> arrival), and the workers' named tracks.
  std::map<std::pair<int, int64_t>, int64_t> held_since;
  // (worker, partition offset): the worker's next reply from that partition answers its INIT join = 2
  // (sent at once, or held until its round); it carries join = 2 so that a late reply to a resent join
  // is never taken for a push's (protocol 11). Not saved: after a restart the worker resends its join.
  std::set<std::pair<int, int64_t>> join_owed;
  std::set<int> traced_workers;
  static constexpr int kWorkerTrack = 1000;  // worker w's track: kWorkerTrack + w

  static double now() { return monotonic_seconds(); }

  Impl(const ServerConfig& s, const PsConfig& p, const std::string& tok)
      : scfg(s),
        parts(p, s.shard, s.checkpoint_dir, s.checkpoint_every, s.checkpoint_background, s.checkpoint_s),
        token(token_digest(tok)),
        raw_token(tok) {}
  std::string raw_token;  // for the token-derived CURVE keys

  // Background checkpoints (server.checkpoint_background): a reply that acknowledges what must be
  // durable first and that no record of the membership journal holds (a new partition's creation, a
  // membership change a push made) waits for the snapshot that holds it. durable_need: (worker, partition offset) -> that snapshot's number (the newest asked
  // for; kept once committed, one entry per worker and partition); every reply to the worker from
  // that partition waits for it (a resent request's too). deferred: replies waiting.
  std::map<std::pair<int, int64_t>, int64_t> durable_need;
  struct Deferred {
    int64_t snapshot;
    std::function<void()> send;
  };
  std::vector<Deferred> deferred;
  // Background checkpoints: partition offset -> the snapshot that holds its creation. A job without
  // elastic membership answers no INIT of the partition before it is committed (its workers push
  // right after their INIT); an elastic job's joins wait for it.
  std::map<int64_t, int64_t> part_need;

  // Background checkpoints: `worker`'s replies from `shard` wait for the write that holds the
  // partition's creation, while it is not committed (part_need).
  void wait_for_creation(const ParameterShard& shard, int worker) {
    const auto p = part_need.find(shard.offset());
    if (p == part_need.end() || p->second <= parts.committed()) return;
    int64_t& need = durable_need[{worker, shard.offset()}];
    need = std::max(need, p->second);
  }

  // What `worker`'s next reply from `shard` acknowledges is durable before it leaves: written now
  // (synchronous checkpoints) or held for the snapshot that will hold it (background).
  void durable_before_reply(ParameterShard& shard, int worker) {
    if (parts.background()) durable_need[{worker, shard.offset()}] = parts.covering_snapshot();
    else parts.checkpoint(shard, true);
  }

  // Takes a wanted snapshot, and sends the replies whose snapshot is now committed (in order).
  void flush_deferred() {
    parts.pump();
    if (deferred.empty()) return;
    std::vector<Deferred> waiting;
    std::vector<Deferred> due;
    for (auto& d : deferred) (d.snapshot <= parts.committed() ? due : waiting).push_back(std::move(d));
    deferred = std::move(waiting);
    for (auto& d : due) d.send();  // (a reply that needs a newer snapshot meanwhile is deferred again)
  }

  void send(const zmq::message_t& id, const MsgHeader& h, const void* data, size_t bytes) {
    std::string hdr = encode_header(h);
    zmq::message_t idc(id.data(), id.size());
    io->send(idc, zmq::send_flags::sndmore);
    io->send(zmq::buffer(hdr), bytes || h.type == static_cast<int>(MsgType::kOk) ? zmq::send_flags::sndmore : zmq::send_flags::none);
    if (bytes || h.type == static_cast<int>(MsgType::kOk)) io->send(zmq::buffer(data, bytes), zmq::send_flags::none);
  }

  // Partition `shard`'s values to `worker`. clock: the request this answers (a push answered at
  // once); -1 = the worker's last clock (an INIT, a PULL, a held reply released).
  // own: the reply answers the worker's own request being handled (its push, pull or registration),
  // never its join: it neither carries nor uses up a join = 2 tag (a late push of a worker's previous
  // process, arriving after its join, must not take the join's tag).
  // Whether it answers a join is decided here, when the reply is made, also for a reply that then
  // waits for a background write: each copy of a resent join gets a reply tagged as its answer.
  void reply_params(ParameterShard& shard, int worker, int64_t clock = -1, bool own = false) {
    if (identity.find(worker) == identity.end()) return;  // (see send_reply)
    const bool answers_join = !own && join_owed.erase({worker, shard.offset()}) > 0;
    if (auto need = durable_need.find({worker, shard.offset()}); need != durable_need.end() && need->second > parts.committed()) {
      // What it acknowledges is not durable yet (background checkpoints): it leaves with the write.
      deferred.push_back({need->second, [this, &shard, worker, clock, answers_join] { send_reply(shard, worker, clock, answers_join); }});
      return;
    }
    send_reply(shard, worker, clock, answers_join);
  }

  void send_reply(ParameterShard& shard, int worker, int64_t clock, bool answers_join) {
    const auto to = identity.find(worker);
    // A worker this process has not heard from (a held push restored from a checkpoint, released
    // before the worker resent): nowhere to send; its resend is answered (the shard knows the clock).
    if (to == identity.end()) return;
    if (auto held = held_since.find({worker, shard.offset()}); held != held_since.end()) {  // (tracing) the wait in the rule ends
      Tracer::global().complete(parts.consistency() == "bsp" ? "held: waiting for the clock's other workers"
                                                             : "held: too far ahead of the slowest (ssp)",
                                "server", held->second, Tracer::now_us(), kWorkerTrack + worker);
      held_since.erase(held);
    }
    MsgHeader r;
    r.type = static_cast<int>(MsgType::kOk);
    r.worker = worker;
    r.offset = shard.offset();  // names the partition: replies to one server's partitions share a connection
    r.length = shard.length();
    r.param_version = shard.wire_version();  // monotonic across restarts (the shard's epoch)
    r.staleness = shard.last_staleness(worker);
    r.clock = clock >= 0 ? clock : shard.clock(worker);  // lets the worker match replies to (possibly resent) requests
    r.data = shard.grant(worker);                         // an elastic job's first part: the data of its next step
    r.round = shard.round();                              // BSP: where the job's clocks stand
    r.join = answers_join ? 2 : 0;                        // which request it answers
    shard.pulled(worker);
    send_params(to->second, r, shard.params());
  }

  // Like send(), but the body is `t` itself, sent without a copy: the message keeps a reference
  // to the tensor until ZeroMQ has sent it (the shard copies on write meanwhile).
  void send_params(const zmq::message_t& id, const MsgHeader& h, const at::Tensor& t) {
    if (t.numel() == 0) return send(id, h, nullptr, 0);
    std::string hdr = encode_header(h);
    zmq::message_t idc(id.data(), id.size());
    auto* keep = new at::Tensor(t);
    zmq::message_t body(keep->data_ptr(), static_cast<size_t>(t.numel()) * sizeof(float),
                        [](void*, void* hint) { delete static_cast<at::Tensor*>(hint); }, keep);
    io->send(idc, zmq::send_flags::sndmore);
    io->send(zmq::buffer(hdr), zmq::send_flags::sndmore);
    io->send(body, zmq::send_flags::none);
  }

  // The worker's DEALER identity, for replies sent later; copied only when it changed (a
  // reconnect), not on every message (a partitioned push is one message per partition).
  void remember(int worker, const zmq::message_t& id) {
    auto it = identity.find(worker);
    if (it == identity.end()) identity.emplace(worker, zmq::message_t(id.data(), id.size()));
    else if (it->second != id) it->second = zmq::message_t(id.data(), id.size());
  }

  void error(const zmq::message_t& id, const std::string& what) {
    ++errors;
    MsgHeader r;
    r.type = static_cast<int>(MsgType::kError);
    r.text = what;
    send(id, r, nullptr, 0);
  }

  // The STATS JSON: the partitions' (merged), or only the count of bad messages before any INIT.
  // unix_us: the server's system clock, against which tracing workers measure their offset.
  std::string stats() const { return parts.stats_json(errors, now(), Tracer::now_us()); }

  // Tracing: the push's apply (or buffering) on the server's thread; a held push waits on the worker's track.
  void trace_push(const MsgHeader& h, int64_t t0, const std::vector<int>& ready) {
    Tracer& t = Tracer::global();
    if (traced_workers.insert(h.worker).second) t.name_track(kWorkerTrack + h.worker, fmt::format("worker {}", h.worker));
    t.complete("apply push", "server", t0, Tracer::now_us(), -1,
               fmt::format(R"("worker":{},"clock":{},"offset":{},"bytes":{})", h.worker, h.clock, h.offset, h.length * 4));
    if (std::find(ready.begin(), ready.end(), h.worker) == ready.end()) held_since[{h.worker, h.offset}] = t0;
  }

  // Replies released by something other than a push (a worker expired, or FINISH): each partition
  // that applied a clock is checkpointed (per server.checkpoint_every) before any of them leaves,
  // as a push's replies are: durable before acknowledged. (Background checkpoints: a snapshot is
  // wanted, and the replies, acknowledging updates, leave at once.)
  void release(const std::vector<std::pair<ParameterShard*, int>>& ready) {
    std::set<ParameterShard*> saved;
    for (auto [shard, w] : ready)  // (forced in an elastic job: the membership changed, joiners may be admitted)
      if (saved.insert(shard).second) parts.checkpoint(*shard, shard->elastic());
    for (auto [shard, w] : ready) reply_params(*shard, w);
  }

  // server.exit_when_done: every worker has finished or died (at least one finished).
  bool done() {
    if (!scfg.exit_when_done || !parts.job_done()) return false;
    parts.checkpoint_all();
    flush_deferred();  // (everything is durable now: the replies that waited for it leave)
    log::info("[server {}] every worker finished or left: exiting (server.exit_when_done)", scfg.shard);
    return true;
  }

  // Returns false on SHUTDOWN, or once the job is done (server.exit_when_done).
  bool handle(std::vector<zmq::message_t>& frames) {
    const zmq::message_t& id = frames[0];
    try {
      SYN_CHECK(frames.size() >= 2 && frames.size() <= 3, fmt::format("message of {} frames", frames.size()),
                "expected [header] or [header, data]");
      MsgHeader h = decode_header(frames[1].data(), frames[1].size());
      SYN_CHECK(h.token == token, "wrong job token", "give workers and servers the same SYNCOPATE_TOKEN");
      const size_t data_bytes = frames.size() == 3 ? frames[2].size() : 0;
      // Every request is checked whole before it changes anything (liveness included).
      switch (static_cast<MsgType>(h.type)) {
        case MsgType::kInit: {
          SYN_CHECK(h.length >= 0 && h.length <= ParameterShard::kMaxShardLength,
                    fmt::format("INIT length {} is not a length", h.length), "send 0..2^36 values");
          // (A join at a clock, join = 2, names a part that exists and carries no values.) The values, with
          // `moments` AdamW's two moments after them (3 x length floats), then the decay pairs.
          SYN_CHECK(!(h.join == 2 && h.moments), "INIT joining at a clock with moments", "a join carries no values");
          const size_t floats = static_cast<size_t>(h.length) * (h.moments ? 3 : 1);
          SYN_CHECK((h.join == 2 && data_bytes == 0) || (data_bytes >= floats * 4 && (data_bytes - floats * 4) % 16 == 0),
                    fmt::format("INIT data of {} bytes for {} values{}", data_bytes, h.length,
                                h.moments ? " and their AdamW moments" : ""),
                    "send values (then, with moments, the first and second moments) then decay pairs");
          const char* d = frames.size() == 3 && data_bytes > 0 ? static_cast<const char*>(frames[2].data()) : nullptr;
          std::vector<int64_t> pairs(data_bytes > 0 ? (data_bytes - floats * 4) / 8 : 0);
          if (!pairs.empty()) std::memcpy(pairs.data(), d + floats * 4, pairs.size() * 8);
          bool created = false;
          const float* values = reinterpret_cast<const float*>(d);
          ParameterShard& shard = parts.init(h, values, pairs.data(), pairs.size() / 2, now(), &created,
                                             h.moments && d ? values + h.length : nullptr);
          // Durable before acknowledged: a partition the workers were told exists is in the checkpoint
          // directory before the reply (a restart before its first update still knows it).
          // (Background checkpoints: every INIT's reply from the partition waits for the snapshot that
          // holds it, part_need; in an elastic job only the joins do, which wait for a later one.)
          if (created && parts.background()) part_need[shard.offset()] = parts.covering_snapshot();
          else if (created) parts.checkpoint(shard, true);
          if (h.join == 1) {  // an elastic worker asks at which clock it would start (changes nothing)
            MsgHeader r;
            r.type = static_cast<int>(MsgType::kOk);
            r.worker = h.worker;
            r.offset = shard.offset();
            r.length = shard.length();
            r.join = 1;
            r.clock = shard.join_clock(h.worker);
            r.pushed = shard.pushed_clock(h.worker);  // the joiner tells the first part (join = 2): a used grant
            send(id, r, nullptr, 0);
            return true;
          }
          if (h.join == 2) {  // it joins at the largest of those clocks
            std::vector<int> released;  // a restarted member left the round, which may have completed it
            const int64_t epoch = shard.membership_epoch();
            const bool now_member = shard.join(h.worker, h.clock, h.samples, now(), &released, h.pushed);
            remember(h.worker, id);
            // Durable before acknowledged: the membership it joins (or waits to join) and its grant.
            parts.make_reserve_durable(shard);
            // (Background checkpoints: the join is a record of the membership journal, fsync'ed now, so
            // its reply waits for no write of the state, only, at the job's start, for the one that
            // holds the partition's creation.)
            // Under BSP and SSP (a join that a round may hold: its re-delivery over an older state
            // could differ, helper-20), or where the record cannot be written, the reply waits for the
            // write of the state that holds the join, as without the journal.
            if (parts.background() && shard.joins_at_once() &&
                parts.record_join(shard, h.worker, h.clock, h.samples, h.pushed)) {
              wait_for_creation(shard, h.worker);
            } else if (!parts.background() || shard.membership_epoch() != epoch || !durable_need.count({h.worker, shard.offset()})) {
              // (Background: a resent join that changed nothing waits for the write its first copy waits
              // for, not a newer one: resends every 5 s must not chase the writes.)
              durable_before_reply(shard, h.worker);
            }
            join_owed.insert({h.worker, shard.offset()});  // its next reply here (not to a request of its own) answers this join
            for (int w : released) reply_params(shard, w);
            if (now_member) reply_params(shard, h.worker);  // else with the round it counts from
            log::info("[server {}] worker {} joins part [{}, +{}) at clock {}{}", scfg.shard, h.worker, shard.offset(),
                      shard.length(), h.clock, now_member ? "" : " (from that round on)");
            return true;
          }
          shard.check(h);
          shard.registered(h.worker, h.clock);  // first: a worker that had finished takes part again
          if (shard.elastic()) shard.register_samples(h.worker, h.samples);
          parts.seen(h.worker, now());
          remember(h.worker, id);
          parts.make_reserve_durable(shard);
          if (!shard.elastic()) wait_for_creation(shard, h.worker);
          reply_params(shard, h.worker, -1, /*own=*/true);
          return true;
        }
        case MsgType::kPushPull: {
          const int64_t n = ++pushes;
          crash_point("ps_server", "received", n);  // recovery tests: a kill at each point of the request path
          ParameterShard& shard = parts.at(h);
          shard.check(h);  // the dtype is the shard's wire format (mixed formats refused)
          const WireFormat wire = wire_format_of_dtype(h.dtype);
          SYN_CHECK(data_bytes == wire_bytes(wire, h.length),
                    fmt::format("gradient of {} bytes for {} values in {}", data_bytes, h.length, h.dtype),
                    "send length values in the shard's wire format");
          const float* grad = frames.size() == 3 ? static_cast<const float*>(frames[2].data()) : nullptr;
          if (wire != WireFormat::kF32 && h.length > 0) {  // decoded into the server's own buffer (reused)
            if (decoded.size() < static_cast<size_t>(h.length)) decoded.resize(static_cast<size_t>(h.length));
            decode(wire, static_cast<const uint8_t*>(frames[2].data()), data_bytes, h.length, decoded.data());
            grad = decoded.data();
          }
          const int64_t t0 = Tracer::global().on() ? Tracer::now_us() : 0;
          const int64_t epoch = shard.membership_epoch();
          std::vector<int> ready = shard.push(h, grad, now());  // throws, changing nothing, on a refused gradient
          crash_point("ps_server", "applied", n);
          remember(h.worker, id);
          if (t0) trace_push(h, t0, ready);
          // Durable before acknowledged: a checkpoint due now is written before the replies go out,
          // so a restarted shard never lacks an update a worker was told about (with
          // server.checkpoint_every=1 a crash loses no acknowledged update at all).
          // An elastic job's membership change (a joiner admitted with the round, a worker back) is
          // checkpointed at once too (background checkpoints: a snapshot is taken for it, and the
          // replies do not wait), and a grant past the reserved mark moves the mark, made durable first.
          const bool membership_changed = shard.membership_epoch() != epoch;
          parts.make_reserve_durable(shard);
          parts.checkpoint(shard, membership_changed);
          // Background checkpoints: a membership change a push made (a joiner admitted with the round,
          // a worker back) is acknowledged once durable: the replies it releases wait for the write.
          if (membership_changed && parts.background())
            for (int w : ready) durable_before_reply(shard, w);
          crash_point("ps_server", "checkpointed", n);
          for (int w : ready) reply_params(shard, w, w == h.worker ? h.clock : -1, /*own=*/w == h.worker);
          crash_point("ps_server", "replied", n);
          return true;
        }
        case MsgType::kPull: {
          ParameterShard& shard = parts.at(h);
          shard.check(h);
          parts.seen(h.worker, now());
          remember(h.worker, id);
          // An elastic worker that skipped its step (nothing pushed) asks the first part for the
          // next step's data with `samples`: the skipped step's samples are not taken again.
          if (h.samples > 0 && shard.elastic()) shard.skip_grant(h.worker, h.samples);
          parts.make_reserve_durable(shard);
          reply_params(shard, h.worker, -1, /*own=*/true);
          return true;
        }
        case MsgType::kStats: {
          parts.seen_reading(h.worker, now());  // a worker that left the rounds polls STATS while it waits: alive
          MsgHeader r;
          r.type = static_cast<int>(MsgType::kOk);
          r.text = stats();
          send(id, r, nullptr, 0);
          return true;
        }
        case MsgType::kHeartbeat:
          parts.seen(h.worker, now());  // liveness only (a worker id out of range is ignored); no reply
          return true;
        case MsgType::kFinish: {
          parts.check_worker(h);
          SYN_CHECK(h.data == -1 || h.data == kFinishStillReading,
                    fmt::format("FINISH with data {} (-1: finished; {}: still reading)", h.data, kFinishStillReading),
                    "the peer sent a corrupt header, or runs another Syncopate build");
          const bool reading = h.data == kFinishStillReading;
          const auto released = parts.finish(h.worker, reading);
          // Durable before acknowledged: FINISH is part of the checkpoint (a restarted shard must not
          // wait for a worker that finished), written with the clocks it released before any reply.
          // Background checkpoints: it is a record of the membership journal, fsync'ed now (a resend
          // is one more record, re-delivered the same); the replies it released (updates) leave at once.
          // (Where the record cannot be written, the reply waits for the write of the state that holds it.)
          MsgHeader r;
          r.type = static_cast<int>(MsgType::kOk);
          r.clock = h.clock;
          if (!parts.background()) parts.checkpoint_all();
          if (!parts.background() || parts.record_finish(h.worker, reading))
            send(id, r, nullptr, 0);
          else
            deferred.push_back({parts.covering_snapshot(), [this, to = std::string(static_cast<const char*>(id.data()), id.size()), r] {
                                  send(zmq::message_t(to.data(), to.size()), r, nullptr, 0);
                                }});
          for (auto [shard, w] : released) reply_params(*shard, w);  // the others no longer wait for it
          log::info("[server {}] worker {} {} at clock {}", scfg.shard, h.worker,
                    reading ? "left the rounds (still reading)" : "finished", h.clock);
          return !done();
        }
        case MsgType::kShutdown: {
          parts.checkpoint_all();
          flush_deferred();
          MsgHeader r;
          r.type = static_cast<int>(MsgType::kOk);
          send(id, r, nullptr, 0);
          return false;
        }
        default:
          SYN_FAIL(fmt::format("message type {} is not a request", h.type), "send INIT, PUSH_PULL, PULL, STATS, HEARTBEAT, FINISH or SHUTDOWN");
      }
    } catch (const Error& e) {
      error(id, e.what());
    } catch (const std::exception& e) {
      error(id, std::string("internal error: ") + e.what());
    }
    return true;
  }
};

namespace {
// server.host as ZeroMQ can bind it: a numeric address as it is, a host name (Slurm's node list
// names hosts) as the IPv4 address it resolves to, like the ring's listeners (common/comm/transport).
std::string ipv4_of(const std::string& host) {
  in_addr numeric{};
  if (host == "*" || ::inet_pton(AF_INET, host.c_str(), &numeric) == 1 || host.find(':') != std::string::npos) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  SYN_CHECK(::getaddrinfo(host.c_str(), nullptr, &hints, &found) == 0 && found != nullptr,
            fmt::format("server.host '{}' is neither an IP address nor a host name that resolves to one", host),
            "use a numeric address such as 10.0.0.1, or a name this host resolves (getent hosts NAME)");
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof(text));
  ::freeaddrinfo(found);
  return text;
}
}  // namespace

PsServer::PsServer(const ServerConfig& s, const PsConfig& p, const std::string& token)
    : impl_(std::make_unique<Impl>(s, p, token)) {}
PsServer::~PsServer() = default;

void PsServer::run(const std::function<void(const std::string&)>& on_listening,
                   const std::function<bool()>& stop_requested) {
  auto& s = impl_->sock;
  s.set(zmq::sockopt::maxmsgsize, kMaxMessageBytes + 4096);  // a part's values and its header frame
  // No high-water mark on replies: a ROUTER drops a message silently when the peer's pipe is full,
  // and a worker pushes every part (up to kMaxPartitionsPerServer) before it reads a reply. What is
  // queued is bounded by the requests the workers sent, one reply each.
  s.set(zmq::sockopt::sndhwm, 0);
  if (!impl_->scfg.curve_key_file.empty()) {  // CURVE: encrypted and authenticated transport
    std::istringstream keys(read_file(impl_->scfg.curve_key_file));
    std::string pub, sec;
    keys >> pub >> sec;
    SYN_CHECK(pub.size() == 40 && sec.size() == 40,
              fmt::format("'{}' does not hold a Z85 CURVE key pair", impl_->scfg.curve_key_file),
              "create one with syncopate-server --generate-curve-keys > FILE");
    s.set(zmq::sockopt::curve_server, 1);
    s.set(zmq::sockopt::curve_secretkey, sec);
  } else if (ps_encrypt_from_token(impl_->scfg.encrypt, impl_->raw_token)) {
    s.set(zmq::sockopt::curve_server, 1);  // keys from the job token (server/ps_keys.h)
    s.set(zmq::sockopt::curve_secretkey, ps_server_keys_from_token(impl_->raw_token).secret_z85);
  }
  s.set(zmq::sockopt::linger, 0);
  // Connections that fail the handshake (a client of another job, a plain one where this server
  // encrypts) reach nothing here; they are logged, at most every 10 s, so that an operator sees them.
  HandshakeWatch watch(impl_->ctx, s, "ps-server");
  int64_t failures_logged = 0;
  auto last_log = std::chrono::steady_clock::now() - std::chrono::seconds(10), last_read = last_log;
  const std::string host = ipv4_of(impl_->scfg.host);  // ZeroMQ binds addresses (or interfaces), not host names
  const std::string ep = fmt::format("tcp://{}:{}", host, impl_->scfg.port == 0 ? std::string("*") : std::to_string(impl_->scfg.port));
  try {
    s.bind(ep);
  } catch (const zmq::error_t& e) {
    SYN_FAIL(fmt::format("cannot listen on {}: {}", ep, e.what()), "the port may be in use: pick another --server.port");
  }
  if (impl_->parts.load(Impl::now()) > 0)  // (and removes the temporary files of a write cut short)
    log::info("[server {}] resumed from {} (version {})", impl_->scfg.shard, impl_->parts.checkpoint_files(),
              impl_->parts.min_version());
  const std::string bound = s.get(zmq::sockopt::last_endpoint);
  log::info("[server {}] listening on {}", impl_->scfg.shard, bound);
  if (!impl_->scfg.endpoint_file.empty()) publish_file(impl_->scfg.endpoint_file, bound + "\n");  // readiness, and the port
  if (on_listening) on_listening(bound);
  if (impl_->scfg.latency_ms > 0) {
    impl_->delay = std::make_unique<ZmqDelayLine>(impl_->ctx, s, impl_->scfg.latency_ms / 1e3);
    impl_->io = &impl_->delay->inner();
    log::info("[server {}] emulated link latency: every message held {} ms each way", impl_->scfg.shard,
              impl_->scfg.latency_ms);
  }
  zmq::socket_t& in = *impl_->io;
  // Wake up to expire silent workers; with background checkpoints, often enough that a reply waiting
  // for a write leaves within 20 ms of its end.
  in.set(zmq::sockopt::rcvtimeo, impl_->parts.background() ? 20 : 200);
  for (;;) {
    try {
      impl_->flush_deferred();  // (a snapshot's copy can fail, bad_alloc: the server goes on, the replies wait)
    } catch (const std::exception& e) {
      log::error("[server {}] background checkpoint: {}", impl_->scfg.shard, e.what());
    }
    if (impl_->delay) impl_->delay->check();
    // Off the per-message path: the events are read at most once a second, far below what fills the
    // monitor's queue (about 2000 events; a failing client retries every 100 ms).
    const auto t = std::chrono::steady_clock::now();
    if (t - last_read >= std::chrono::seconds(1) && (last_read = t, watch.failing(), watch.failures() > failures_logged) &&
        t - last_log >= std::chrono::seconds(10)) {
      log::warn("[server {}] {} connection(s) failed the handshake ({} in all; the latest: {}): a client of another job "
                "(another SYNCOPATE_TOKEN or CURVE key), an unencrypted one, or a connection closed mid-handshake (a "
                "worker killed, a port probe); nothing of theirs reaches the shards",
                impl_->scfg.shard, watch.failures() - failures_logged, watch.failures(), watch.last_failure());
      failures_logged = watch.failures();
      last_log = std::chrono::steady_clock::now();
    }
    if (stop_requested && stop_requested()) {
      impl_->parts.checkpoint_all();  // a stopped server loses no update it has applied
      impl_->flush_deferred();
      break;
    }
    impl_->release(impl_->parts.expire(Impl::now()));
    if (impl_->done()) break;
    std::vector<zmq::message_t> frames;
    try {
      if (!zmq::recv_multipart(in, std::back_inserter(frames))) continue;
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;  // a signal: check stop_requested
      throw;
    }
    if (!impl_->handle(frames)) break;
  }
  // The last replies (FINISH's, SHUTDOWN's) are still in the delay line: let them leave first.
  if (impl_->delay) impl_->delay->flush(2 * impl_->scfg.latency_ms / 1e3 + 2.0);
  watch.failing();  // (the events so far, for the count below)
  watch.stop();     // (the delay line's thread is gone: this thread owns the ROUTER again)
  log::info("[server {}] connections: {} handshake(s) completed, {} failed", impl_->scfg.shard, watch.successes(),
            watch.failures());
  log::info("[server {}] stats {}", impl_->scfg.shard, impl_->stats());
}

}  // namespace syncopate
