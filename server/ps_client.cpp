#include "server/ps_client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/check.h"
#include "common/comm/sharding.h"
#include "common/fnv1a.h"
#include "common/trace.h"
#include "common/log.h"
#include "server/handshake_watch.h"
#include "server/zmtp_greeting.h"
#include "server/ps_protocol.h"

namespace syncopate {
namespace {

void require_host(const at::Tensor& t, int64_t numel, const char* what) {
  SYN_CHECK(t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == numel,
            fmt::format("PsClient::{} needs a contiguous float32 tensor of {} elements in host memory", what, numel),
            "this is a bug: GPU replicas stage their buffers through host memory (HostStaging)");
}

}  // namespace

struct PsClient::Impl {
  zmq::context_t ctx{1};
  // Liveness: a side thread with its own DEALERs sends HEARTBEAT every second, so that a worker
  // in a long step is not taken for dead by the servers' BSP/SSP bookkeeping.
  std::thread heartbeat;
  std::mutex hb_mu;
  std::condition_variable hb_cv;
  bool hb_stop = false;
  std::vector<std::string> endpoints;
  std::vector<int64_t> bounds;  // part p holds [bounds[p], bounds[p+1])
  uint64_t token = 0;
  std::vector<std::string> curve;  // server public, own public, own secret (Z85); empty = plain
  int worker = 0, workers = 0;
  PsClientOptions opt;
  std::atomic<int64_t> next_id{0}, pushes{0}, resends{0}, bytes_sent{0}, bytes_received{0};
  std::atomic<int64_t> grant{-1};   // elastic: the first sample of this worker's next step (the first part's reply)
  int64_t start_clock = 0;          // the clock init() registered this worker at
  std::atomic<int64_t> pushed_clock{0};  // the newest clock this worker pushed (FINISH names it)

  // A push whose reply has not been taken by wait(): its header and data, for resends.
  struct Pending {
    MsgHeader header;
    at::Tensor data;
    bool replied = false;   // a reply arrived while waiting for another ticket
    MsgHeader reply;
    zmq::message_t values;  // the reply's data frame
    size_t frames = 0;      // frames of the reply (2: header and values)
    int64_t sent_us = 0;    // tracing: when the push was sent
  };
  struct Server {
    std::mutex mu;  // one caller at a time per server: its socket, and its parts' state
    zmq::socket_t sock;
    std::unique_ptr<HandshakeWatch> watch;  // sock's handshakes (declared after it: stopped first)
    std::chrono::steady_clock::time_point last_greeting{};  // check_handshake's last greeting probe
    ~Server() {
      if (watch) watch->stop();
    }
    std::vector<int> parts;  // the parts it holds, in order
  };
  struct Part {
    int server = 0;
    int64_t version = 0;  // parameter version last pulled
    int64_t latest = 0;   // the newest version seen, a PULL's included
    int64_t init_clock = -1;  // this worker's clock on the part when INIT registered it
    int64_t round = -1;       // BSP: the clock the part collected next at its last reply to this worker
    std::unique_ptr<ErrorFeedback> feedback;  // int8 wire: what rounding dropped, owed to the next push
    at::Tensor wire_buf;  // compressed pushes: the bytes of the last one, reused once nothing holds them
    std::map<int64_t, Pending> pending;  // by ticket id
  };
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<Part> parts;  // after init()

  int64_t length(int p) const { return bounds[p + 1] - bounds[p]; }
  void secure(zmq::socket_t& s) const {
    if (curve.empty()) return;
    s.set(zmq::sockopt::curve_serverkey, curve[0]);
    s.set(zmq::sockopt::curve_publickey, curve[1]);
    s.set(zmq::sockopt::curve_secretkey, curve[2]);
  }
  // Handshakes with server k that fail: another job's server (or this client's token is another
  // job's), refused by name at once instead of after dist.timeout_s of silence. The client's events
  // cannot say why a handshake failed (a server dropping a HELLO it cannot decrypt looks like a
  // proxy in front of a server that is down), so after a failure the server's ZMTP greeting is asked
  // (at most once a second): a live ZeroMQ server that does not encrypt as this client does, or one
  // that does while this client's handshakes failed twice in a row, is not of this job. No greeting
  // (down, restarting, stopped, a proxy) keeps the wait, as for a silent server.
  static constexpr int kSendSlice_ms = 200;
  void check_handshake(int k) {
    Server& sv = *servers[k];
    const int64_t streak = sv.watch->failing();
    const auto now = std::chrono::steady_clock::now();
    if (streak < 1 || now - sv.last_greeting < std::chrono::seconds(1)) return;
    sv.last_greeting = now;
    const auto mechanism = zmtp_mechanism(endpoints[k], 1.0);
    if (!mechanism) return;
    const std::string mine = curve.empty() ? "NULL" : "CURVE";
    const char* hint = curve.empty() ? "give this worker the job's SYNCOPATE_TOKEN (the servers derive their CURVE keys "
                                       "from it), or start the servers with --server.encrypt=off as this client"
                                     : "give workers and servers the same SYNCOPATE_TOKEN (and the same dist.encrypt / "
                                       "dist.curve_server_key), and check that the endpoint is this job's server";
    SYN_CHECK(*mechanism == mine,
              fmt::format("parameter server {} ({}) speaks ZeroMQ with {} security, this worker with {}: it is not a "
                          "server of this job as this worker is set up",
                          k, endpoints[k], *mechanism == "NULL" ? std::string("no") : *mechanism, mine == "NULL" ? std::string("none") : mine),
              hint);
    SYN_CHECK(streak < 2,
              fmt::format("parameter server {} ({}) is up and encrypts, but this worker's handshakes with it failed {} "
                          "times in a row ({}): their keys differ, so it is not a server of this job",
                          k, endpoints[k], streak, sv.watch->last_failure()),
              hint);
  }
  // A request naming no part (STATS, FINISH, SHUTDOWN); part_header adds part p's range.
  MsgHeader header(MsgType t) const {
    MsgHeader h;
    h.type = static_cast<int>(t);
    h.token = token;
    h.worker = worker;
    h.workers = workers;
    return h;
  }
  MsgHeader part_header(MsgType t, int p) const {
    MsgHeader h = header(t);
    h.offset = bounds[p];
    h.length = length(p);
    h.param_version = parts.empty() ? 0 : parts[p].version;
    return h;
  }
  // Sends a header and, optionally, a data frame to server k. `hold` defined: the frame is sent
  // without copying and the message keeps a reference to hold's memory until ZeroMQ is done with
  // it; otherwise the bytes are copied into the message.
  // A DEALER with no connected peer blocks in send: with no server listening, or once a handshake
  // failed with a protocol error (a plain client, another job's CURVE key: ZeroMQ then ends the
  // connection for good). Sends wait in slices of kSendSlice_ms (ZMQ_SNDTIMEO), checking the
  // handshakes between them, at most timeout_s in all, and then fail naming the server.
  void send(int k, const MsgHeader& h, const void* data, size_t bytes, const at::Tensor& hold = {}) {
    const std::string hdr = encode_header(h);
    zmq::socket_t& s = servers[k]->sock;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(opt.timeout_s);
    auto send_frame = [&](auto&& frame, zmq::send_flags flags) {
      for (;;) {
        if (s.send(frame, flags).has_value()) return;
        check_handshake(k);
        SYN_CHECK(std::chrono::steady_clock::now() < deadline,
                  fmt::format("parameter server {} ({}) took no message within {} s: no connection to it", k,
                              endpoints[k], opt.timeout_s),
                  "check that syncopate-server runs there and that token and encryption match (a failed CURVE "
                  "handshake leaves no connection; the server's log names it)");
      }
    };
    if (data == nullptr && h.type != static_cast<int>(MsgType::kPushPull)) {
      send_frame(zmq::buffer(hdr), zmq::send_flags::none);
      return;
    }
    send_frame(zmq::buffer(hdr), zmq::send_flags::sndmore);
    if (hold.defined()) {
      auto* ref = new at::Tensor(hold);
      zmq::message_t body(const_cast<void*>(data), bytes, [](void*, void* r) { delete static_cast<at::Tensor*>(r); }, ref);
      send_frame(body, zmq::send_flags::none);
    } else {
      zmq::message_t body(data, bytes);
      send_frame(body, zmq::send_flags::none);
    }
  }
  void heartbeat_loop() {
    std::vector<zmq::socket_t> hs;
    for (const auto& ep : endpoints) {
      hs.emplace_back(ctx, zmq::socket_type::dealer);
      hs.back().set(zmq::sockopt::linger, 0);
      hs.back().set(zmq::sockopt::sndhwm, 4);
      secure(hs.back());
      hs.back().connect(ep);
    }
    const std::string hdr = encode_header(header(MsgType::kHeartbeat));
    std::unique_lock<std::mutex> l(hb_mu);
    while (!hb_cv.wait_for(l, std::chrono::seconds(1), [&] { return hb_stop; }))
      for (auto& s : hs) s.send(zmq::buffer(hdr), zmq::send_flags::dontwait);
  }
  ~Impl() {
    {
      std::lock_guard<std::mutex> l(hb_mu);
      hb_stop = true;
    }
    hb_cv.notify_all();
    if (heartbeat.joinable()) heartbeat.join();
  }

  // Receives server k's replies until `accept(header)` takes one, which is returned with its data
  // frames. A refused request throws. When the server is silent (it may have died and been
  // restarted from its checkpoint; ZeroMQ reconnects by itself) `resend` runs with exponential
  // backoff, up to timeout_s in all; the server drops duplicate pushes by clock, so nothing is
  // applied twice. The caller holds servers[k]->mu. A reply that answers an INIT's join (join != 0)
  // reaches `accept` only where the caller asked (joins: init()); elsewhere it is a late reply to a
  // resent join and is dropped, never taken for a push's, pull's or FINISH's (protocol 11).
  std::pair<MsgHeader, std::vector<zmq::message_t>> recv(int k, const std::function<bool(const MsgHeader&, std::vector<zmq::message_t>&)>& accept,
                                                          const std::function<void()>& resend, bool joins = false) {
    zmq::socket_t& sock = servers[k]->sock;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(opt.timeout_s);
    double attempt_s = std::min(opt.timeout_s, opt.first_resend_s);
    for (;;) {
      // Waits for a reply, or for the handshake events that say none can come (another job's server).
      const auto attempt_end = std::chrono::steady_clock::now() + std::chrono::duration<double>(attempt_s);
      bool readable = false;
      for (;;) {
        const double left_s = std::chrono::duration<double>(attempt_end - std::chrono::steady_clock::now()).count();
        if (left_s <= 0) break;
        zmq::pollitem_t items[] = {{sock.handle(), 0, ZMQ_POLLIN, 0}, {servers[k]->watch->events().handle(), 0, ZMQ_POLLIN, 0}};
        zmq::poll(items, 2, std::chrono::milliseconds(static_cast<int64_t>(left_s * 1000) + 1));
        if (items[1].revents & ZMQ_POLLIN) check_handshake(k);
        if (items[0].revents & ZMQ_POLLIN) {
          readable = true;
          break;
        }
      }
      std::vector<zmq::message_t> frames;
      if (!readable || !zmq::recv_multipart(sock, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
        SYN_CHECK(std::chrono::steady_clock::now() < deadline,
                  fmt::format("parameter server {} ({}) did not reply within {} s", k, endpoints[k], opt.timeout_s),
                  "check that syncopate-server is running there (its log), or raise dist.timeout_s");
        log::warn("[ps] server {} silent for {:.1f} s; resending", k, attempt_s);
        resend();
        ++resends;
        attempt_s = std::min(attempt_s * 2, 60.0);
        continue;
      }
      MsgHeader h = decode_reply(frames[0].data(), frames[0].size());
      SYN_CHECK(h.type != static_cast<int>(MsgType::kError), fmt::format("parameter server {} refused: {}", k, h.text),
                "workers and servers must share token, model, worker count and dist.ps_partition_mb");
      if ((joins || h.join == 0) && accept(h, frames)) return {h, std::move(frames)};
    }
  }
  // A control request without data (STATS, FINISH, SHUTDOWN) to server k, resent while the server
  // is silent; returns the first reply `accept` takes.
  MsgHeader control(int k, const MsgHeader& h, const std::function<bool(const MsgHeader&)>& accept) {
    std::lock_guard<std::mutex> l(servers[k]->mu);
    auto ask = [&] { send(k, h, nullptr, 0); };
    ask();
    return recv(k, [&](const MsgHeader& r, std::vector<zmq::message_t>& frames) {
      if (accept(r)) return true;
      keep_reply(k, r, frames);  // a pending push's reply, for its wait()
      return false;
    }, ask).first;
  }
  // The part of server k whose range a reply names, or -1.
  int part_named(int k, const MsgHeader& h) const {
    for (int p : servers[k]->parts)
      if (bounds[p] == h.offset && length(p) == h.length) return p;
    return -1;
  }
  // A reply that is not the one being waited for: kept for the wait() of the pending push it
  // answers (same part, same clock), or dropped (an answer to a copy of a request already answered).
  void keep_reply(int k, const MsgHeader& h, std::vector<zmq::message_t>& frames) {
    const int p = part_named(k, h);
    if (p < 0) return;
    for (auto& [id, pend] : parts[p].pending)
      if (!pend.replied && pend.header.clock == h.clock) {
        pend.replied = true;
        pend.reply = h;
        pend.frames = frames.size();
        if (frames.size() == 2) pend.values = std::move(frames[1]);
        return;
      }
  }
  // Sends again every push of server k still unanswered (the caller holds its lock).
  void resend_server(int k) {
    for (int p : servers[k]->parts)
      for (auto& [id, pend] : parts[p].pending) {
        if (pend.replied) continue;
        send(k, pend.header, pend.data.data_ptr(), pend.data.nbytes());  // a copy: ZeroMQ may hold it past wait()
        bytes_sent += static_cast<int64_t>(pend.data.nbytes());
      }
  }
  // While waiting on server k, the pushes still unanswered by the other servers are sent again
  // too: a server that died and came back from its checkpoint may have lost them, and under BSP it
  // would wait for them while this worker waits on server k, which waits for a worker that waits
  // on it (found by the launch test's shard restart). Servers drop duplicates by clock, and a reply
  // to a copy already answered is ignored, so a needless resend costs bytes only. A server another
  // thread is using right now is skipped (its own wait resends).
  void resend_unanswered(int k) {
    for (int j = 0; j < static_cast<int>(servers.size()); ++j) {
      if (j == k) continue;
      std::unique_lock<std::mutex> l(servers[j]->mu, std::try_to_lock);
      if (l.owns_lock()) resend_server(j);
    }
  }
  // Copies a reply's values into dst (part p's range) after checking their size.
  // counted: adds to bytes_received (training traffic; an evaluation's PULL is not).
  void take_values(int p, const zmq::message_t* values, size_t frames, float* dst, bool counted = true) {
    const size_t want = static_cast<size_t>(length(p)) * sizeof(float);
    SYN_CHECK(frames == 2 && values && values->size() == want,
              fmt::format("parameter server {} sent {} bytes for part [{}, +{}), expected {}", parts[p].server,
                          frames == 2 && values ? values->size() : 0, bounds[p], length(p), want),
              "server and worker disagree on the sharding");
    if (want) std::memcpy(dst, values->data(), want);
    if (counted) bytes_received += static_cast<int64_t>(want);
  }
};

std::vector<std::string> PsClient::parse_endpoints(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string e;
  while (std::getline(ss, e, ','))  // "tcp://IP:PORT", or "IP:PORT" (tcp:// is added)
    if (!e.empty()) out.push_back(e.find("://") == std::string::npos ? "tcp://" + e : e);
  SYN_CHECK(!out.empty(), "dist.mode=ps needs dist.servers", "e.g. --dist.servers=tcp://127.0.0.1:29501,tcp://127.0.0.1:29502");
  return out;
}

PsClient::PsClient(const std::vector<std::string>& endpoints, const std::string& token, int worker, int workers,
                   const PsClientOptions& options)
    : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  if (!options.curve_server_key.empty()) {
    SYN_CHECK(options.curve_server_key.size() == 40, "dist.curve_server_key is not a 40-character Z85 key",
              "copy the PUBLIC half printed by syncopate-server --generate-curve-keys");
    char pub[41], sec[41];
    SYN_CHECK(zmq_curve_keypair(pub, sec) == 0, "this libzmq has no CURVE support", "install libzmq built with libsodium");
    I.curve = {options.curve_server_key, pub, sec};  // an ephemeral client key pair per worker
  }
  I.endpoints = endpoints;
  I.token = token_digest(token);
  I.worker = worker;
  I.workers = workers;
  I.opt = options;
  SYN_CHECK(options.partition_elems >= 0, fmt::format("partition of {} values", options.partition_elems),
            "dist.ps_partition_mb must be >= 0 (0 = a shard's whole range in one message)");
  for (const auto& ep : endpoints) {
    auto sv = std::make_unique<Impl::Server>();
    sv->sock = zmq::socket_t(I.ctx, zmq::socket_type::dealer);
    sv->sock.set(zmq::sockopt::linger, 0);
    // No receive high-water mark: every part is pushed before any reply is read, and the replies
    // (one per push, bounded by what this worker sent) must all be kept (the server's ROUTER would
    // drop those past the mark silently). Sends keep the default mark: they wait for the server.
    sv->sock.set(zmq::sockopt::rcvhwm, 0);
    sv->sock.set(zmq::sockopt::sndtimeo, Impl::kSendSlice_ms);  // see send()
    I.secure(sv->sock);
    sv->watch = std::make_unique<HandshakeWatch>(I.ctx, sv->sock, fmt::format("ps-client-{}", I.servers.size()));
    try {
      sv->sock.connect(ep);
    } catch (const zmq::error_t& e) {
      SYN_FAIL(fmt::format("bad parameter-server endpoint '{}': {}", ep, e.what()), "write tcp://IP:PORT");
    }
    I.servers.push_back(std::move(sv));
  }
  I.heartbeat = std::thread([this] { impl_->heartbeat_loop(); });
}

PsClient::~PsClient() = default;

int PsClient::shards() const { return static_cast<int>(impl_->servers.size()); }
int PsClient::parts() const { return static_cast<int>(impl_->parts.size()); }
const std::vector<int64_t>& PsClient::bounds() const { return impl_->bounds; }
int PsClient::server_of(int part) const { return impl_->parts.at(static_cast<size_t>(part)).server; }

std::vector<int64_t> PsClient::part_bounds(int64_t n, int servers, int64_t partition_elems, std::vector<int>* server_of_part) {
  const std::vector<int64_t> shard = Sharding::bounds(n, servers);
  std::vector<int64_t> out{0};
  if (server_of_part) server_of_part->clear();
  for (int k = 0; k < servers; ++k) {
    const int64_t len = shard[k + 1] - shard[k];
    const int64_t pieces = partition_elems > 0 ? std::max<int64_t>(1, (len + partition_elems - 1) / partition_elems) : 1;
    SYN_CHECK(pieces <= kMaxPartitionsPerServer,
              fmt::format("shard {} of {} values would be {} partitions of at most {} values, over the limit of {}", k,
                          len, pieces, partition_elems, kMaxPartitionsPerServer),
              "raise dist.ps_partition_mb (fewer, larger partitions) or add servers");
    const std::vector<int64_t> cut = Sharding::bounds(len, static_cast<int>(pieces));
    const int64_t longest = (len + pieces - 1) / pieces;
    SYN_CHECK(longest <= kMaxMessageBytes / 4,
              fmt::format("shard {} would travel in parts of {} values, beyond the message size limit of {} values "
                          "({} bytes)", k, longest, kMaxMessageBytes / 4, kMaxMessageBytes),
              "add servers, or set dist.ps_partition_mb (at most 16384 MiB per part)");
    for (size_t i = 1; i < cut.size(); ++i) {
      out.push_back(shard[k] + cut[i]);
      if (server_of_part) server_of_part->push_back(k);
    }
  }
  return out;
}

void PsClient::init(at::Tensor& params, const std::vector<std::pair<int64_t, int64_t>>& decay, const AdamWConfig& oc,
                    int64_t start_step, const ShardUpdate& update, FlatAdamW* moments) {
  auto& I = *impl_;
  require_host(params, params.numel(), "init");
  if (moments) {
    require_host(moments->exp_avg(), params.numel(), "init (AdamW's first moments)");
    require_host(moments->exp_avg_sq(), params.numel(), "init (AdamW's second moments)");
  }
  const int K = shards();
  std::vector<int> server_of_part;
  I.bounds = part_bounds(params.numel(), K, I.opt.partition_elems, &server_of_part);
  const int P = static_cast<int>(I.bounds.size()) - 1;
  I.parts = std::vector<Impl::Part>(static_cast<size_t>(P));
  for (auto& sv : I.servers) sv->parts.clear();
  for (int p = 0; p < P; ++p) {
    I.parts[p].server = server_of_part[static_cast<size_t>(p)];
    I.servers[I.parts[p].server]->parts.push_back(p);
  }
  std::vector<int64_t> pairs;
  for (auto& [o, l] : decay) pairs.insert(pairs.end(), {o, l});
  std::vector<MsgHeader> hs;
  std::vector<at::Tensor> bodies(static_cast<size_t>(P));  // bytes; each INIT message holds a reference
  for (int p = 0; p < P; ++p) {
    MsgHeader h = I.part_header(MsgType::kInit, p);
    // A server whose range is one part holds it whole (as without partitions); the layout still
    // carries the setting, so every worker of a job must use the same.
    h.partition = I.servers[I.parts[p].server]->parts.size() > 1 ? I.opt.partition_elems : 0;
    h.beta1 = oc.beta1;
    h.beta2 = oc.beta2;
    h.eps = oc.eps;
    h.weight_decay = oc.weight_decay;
    h.update = update.rule;
    h.wire = wire_dtype(I.opt.wire);
    h.outer_lr = update.outer_lr;
    h.outer_momentum = update.outer_momentum;
    h.outer_delay = update.outer_delay;
    h.clock = start_step;
    h.layout = layout();
    h.overlap = I.opt.overlap;
    h.moments = moments != nullptr;
    h.adam_steps = moments ? moments->steps() : 0;
    const int64_t floats = h.length * (moments ? 3 : 1);  // the values, then (moments) AdamW's first and second
    at::Tensor& b = bodies[static_cast<size_t>(p)];
    b = at::empty({floats * 4 + static_cast<int64_t>(pairs.size()) * 8}, at::kByte);
    auto* bytes = b.data_ptr<uint8_t>();
    if (h.length) std::memcpy(bytes, params.data_ptr<float>() + h.offset, static_cast<size_t>(h.length) * 4);
    if (moments && h.length) {
      std::memcpy(bytes + h.length * 4, moments->exp_avg().data_ptr<float>() + h.offset, static_cast<size_t>(h.length) * 4);
      std::memcpy(bytes + h.length * 8, moments->exp_avg_sq().data_ptr<float>() + h.offset,
                  static_cast<size_t>(h.length) * 4);
    }
    if (!pairs.empty()) std::memcpy(bytes + floats * 4, pairs.data(), pairs.size() * 8);
    hs.push_back(h);
  }
  // Every part's INIT as hs says it (values: with the initial values, which create a part that does
  // not exist yet; else the header alone), then every part's reply (values: take the part's values
  // from it; else it answers a question, join = 1).
  std::vector<MsgHeader> replies(static_cast<size_t>(P));
  auto exchange = [&](bool values) {
    auto body = [&](int p) { return std::make_pair(bodies[p].data_ptr(), static_cast<size_t>(bodies[p].numel())); };
    for (int p = 0; p < P; ++p) {  // all parts first, so the servers work in parallel; zero-copy
      if (hs[p].join == 2) I.send(I.parts[p].server, hs[p], nullptr, 0);
      else I.send(I.parts[p].server, hs[p], body(p).first, body(p).second, bodies[p]);
    }
    for (int k = 0; k < K; ++k) {
      std::lock_guard<std::mutex> l(I.servers[k]->mu);
      std::set<int> unanswered(I.servers[k]->parts.begin(), I.servers[k]->parts.end());
      auto resend = [&] {  // copies
        for (int p : unanswered)
          if (hs[p].join == 2) I.send(k, hs[p], nullptr, 0);
          else I.send(k, hs[p], body(p).first, body(p).second);
      };
      // The reply to this exchange's request (it names the same join: 1 a question, 2 a join, 0 a
      // registration) of a part not answered yet.
      auto accept = [&](const MsgHeader& h, std::vector<zmq::message_t>&) {
        const int p = I.part_named(k, h);
        return unanswered.count(p) > 0 && h.join == hs[static_cast<size_t>(p)].join;
      };
      while (!unanswered.empty()) {
        auto [h, frames] = I.recv(k, accept, resend, /*joins=*/true);
        const int p = I.part_named(k, h);
        replies[static_cast<size_t>(p)] = h;
        if (values) {
          I.take_values(p, frames.size() > 1 ? &frames[1] : nullptr, frames.size(), params.data_ptr<float>() + I.bounds[p]);
          I.parts[p].version = h.param_version;
          I.parts[p].init_clock = h.clock;
          I.parts[p].round = h.round;
          if (h.data >= 0) I.grant = h.data;
        }
        unanswered.erase(p);
      }
    }
  };
  I.start_clock = start_step;
  if (!I.opt.elastic) {
    exchange(true);
  } else {
    // Elastic: every part says at which clock this worker would start (its own next clock where it
    // is a member, else the job's), and it joins every part at the largest (a part whose rounds
    // passed it meanwhile counts the worker from its round being collected: never refused).
    for (auto& h : hs) h.elastic = true, h.samples = I.opt.samples_per_step, h.join = 1;
    exchange(false);
    int64_t k = 0, pushed = -1;
    for (const MsgHeader& r : replies) k = std::max(k, r.clock), pushed = std::max(pushed, r.pushed);
    for (auto& h : hs) h.join = 2, h.clock = k, h.pushed = pushed;  // pushed: whether its grant was used
    exchange(true);
    I.start_clock = k;
  }
  for (int p = 0; p < P; ++p)
    if (I.opt.wire == WireFormat::kInt8 && !I.parts[p].feedback)
      I.parts[p].feedback = std::make_unique<ErrorFeedback>(WireFormat::kInt8, I.length(p));
  if (Tracer::global().on()) record_clock_offsets();
}

void PsClient::record_clock_offsets() {
  for (int k = 0; k < shards(); ++k) {
    Tracer::global().name_track(kTraceTrack + k, fmt::format("shard {} push and pull", k));
    const int64_t t0 = Tracer::now_us();
    const auto j = nlohmann::json::parse(stats(k), nullptr, false);
    const int64_t t1 = Tracer::now_us();
    if (j.is_object() && j.contains("unix_us"))
      Tracer::global().clock_sync(fmt::format("server shard {}", k), 0.5 * static_cast<double>(t0 + t1) - j["unix_us"].get<double>(),
                                  static_cast<double>(t1 - t0));
  }
}

PsTicket PsClient::push(int p, const at::Tensor& grad, int64_t clock, double lr, int64_t computed_on) {
  auto& I = *impl_;
  SYN_CHECK(!I.bounds.empty() && p >= 0 && p < parts(), fmt::format("push to part {} of {} before init or out of range", p, parts()),
            "this is a bug: call init() first");
  require_host(grad, I.length(p), "push");
  Impl::Part& part = I.parts[p];
  std::lock_guard<std::mutex> l(I.servers[part.server]->mu);
  MsgHeader h = I.part_header(MsgType::kPushPull, p);
  h.clock = clock;
  if (clock > I.pushed_clock.load()) I.pushed_clock = clock;
  h.lr = lr;
  h.samples = I.opt.elastic ? I.opt.samples_per_step : 0;  // the data grant of its next step
  if (computed_on >= 0) h.param_version = computed_on;
  const int64_t id = I.next_id++;
  at::Tensor body = grad;  // f32: the gradient itself
  if (I.opt.wire != WireFormat::kF32) {  // compressed into a buffer of its own (kept for resends)
    const int64_t n = static_cast<int64_t>(wire_bytes(I.opt.wire, h.length));
    // Reused when neither a pending ticket nor ZeroMQ still holds the last push's bytes.
    if (!part.wire_buf.defined() || part.wire_buf.use_count() > 1 || part.wire_buf.numel() != n)
      part.wire_buf = at::empty({n}, at::kByte);
    body = part.wire_buf;
    if (part.feedback && clock > part.init_clock) part.feedback->encode(grad.data_ptr<float>(), body.data_ptr<uint8_t>());
    else encode(I.opt.wire, grad.data_ptr<float>(), h.length, body.data_ptr<uint8_t>());  // fp16: a value out of range throws
    h.dtype = wire_dtype(I.opt.wire);
  }
  Impl::Pending& pend = part.pending[id];
  pend.header = h;
  pend.data = body;
  if (Tracer::global().on()) pend.sent_us = Tracer::now_us();
  const size_t bytes = body.nbytes();
  I.send(part.server, h, body.data_ptr(), bytes, body);  // zero-copy; the message holds a reference
  ++I.pushes;
  I.bytes_sent += static_cast<int64_t>(bytes);
  return {p, id};
}

PsReply PsClient::wait(const PsTicket& t, at::Tensor& into) {
  auto& I = *impl_;
  SYN_CHECK(t.part >= 0 && t.part < parts(), "wait on a ticket of no part", "this is a bug");
  const int p = t.part;
  require_host(into, I.length(p), "wait");
  Impl::Part& part = I.parts[p];
  const int k = part.server;
  std::lock_guard<std::mutex> l(I.servers[k]->mu);
  auto it = part.pending.find(t.id);
  SYN_CHECK(it != part.pending.end(), fmt::format("ticket {} of part {} is unknown or was waited for already", t.id, p),
            "this is a bug: wait once per push");
  if (!it->second.replied) {
    // Replies are matched to pushes by part (its range) and clock; a reply to another pending push
    // is kept for its wait(), one to an earlier copy of a request already answered is dropped.
    const int64_t clock = it->second.header.clock;
    auto resend = [&] {
      I.resend_server(k);
      I.resend_unanswered(k);
    };
    auto accept = [&](const MsgHeader& h, std::vector<zmq::message_t>& frames) {
      if (h.clock == clock && I.part_named(k, h) == p) return true;
      I.keep_reply(k, h, frames);
      return false;
    };
    auto [h, frames] = I.recv(k, accept, resend);
    it->second.reply = h;
    it->second.frames = frames.size();
    if (frames.size() == 2) it->second.values = std::move(frames[1]);
    it->second.replied = true;
  }
  Impl::Pending& pend = it->second;
  const PsReply out{pend.reply.staleness, pend.reply.param_version};
  if (pend.sent_us)
    Tracer::global().complete("push and pull", "ps", pend.sent_us, Tracer::now_us(), kTraceTrack + k,
                              fmt::format(R"("clock":{},"offset":{},"bytes":{},"staleness":{})", pend.header.clock,
                                          pend.header.offset, pend.data.nbytes(), out.staleness));
  const size_t frames = pend.frames;
  zmq::message_t values = std::move(pend.values);
  if (pend.reply.data >= 0) I.grant = pend.reply.data;
  part.pending.erase(it);  // before the checks below can throw: a ticket is waited for once
  I.take_values(p, &values, frames, into.data_ptr<float>());
  part.version = out.version;
  part.round = pend.reply.round;
  return out;
}

void PsClient::residuals(float* out) const {
  for (size_t p = 0; p < impl_->parts.size(); ++p)
    if (const auto& f = impl_->parts[p].feedback)
      std::copy(f->residual().begin(), f->residual().end(), out + impl_->bounds[p]);
}

void PsClient::set_residuals(const float* in) {
  for (size_t p = 0; p < impl_->parts.size(); ++p)
    if (auto& f = impl_->parts[p].feedback)
      std::copy(in + impl_->bounds[p], in + impl_->bounds[p + 1], f->residual().begin());
}

std::vector<int64_t> PsClient::versions() const {
  std::vector<int64_t> v;
  for (const auto& part : impl_->parts) v.push_back(part.version);
  return v;
}

std::vector<int64_t> PsClient::latest_versions() const {
  std::vector<int64_t> v;
  for (const auto& p : impl_->parts) v.push_back(std::max(updates_of(p.version), updates_of(p.latest)));
  return v;
}

int64_t PsClient::job_round() const {
  int64_t r = std::numeric_limits<int64_t>::max();
  for (const auto& part : impl_->parts) r = std::min(r, part.round);
  return impl_->parts.empty() ? -1 : r;
}

int64_t PsClient::start_clock() const { return impl_->start_clock; }
int64_t PsClient::data_grant() const { return impl_->grant.load(); }

int64_t PsClient::applied_clock() const {
  int64_t c = -1;
  for (const auto& part : impl_->parts) c = std::max(c, part.init_clock);
  return c;
}

int64_t PsClient::restored_epoch() const {
  int64_t e = 0;
  for (const auto& part : impl_->parts) e = std::max(e, part.version >> kVersionEpochShift);
  return e;
}

PsClientCounters PsClient::counters() const {
  return {impl_->pushes.load(), impl_->resends.load(), impl_->bytes_sent.load(), impl_->bytes_received.load()};
}

std::string PsClient::stats(int k) {
  // STATS' reply is the one OK whose text is its JSON (a push's reply has none).
  auto accept = [](const MsgHeader& h) { return h.type == static_cast<int>(MsgType::kOk) && !h.text.empty(); };
  return impl_->control(k, impl_->header(MsgType::kStats), accept).text;
}

void PsClient::pull(at::Tensor& params) {
  auto& I = *impl_;
  require_host(params, params.numel(), "pull");
  for (int k = 0; k < shards(); ++k) {
    std::lock_guard<std::mutex> l(I.servers[k]->mu);
    std::set<int> unanswered(I.servers[k]->parts.begin(), I.servers[k]->parts.end());
    auto ask = [&] {
      for (int p : unanswered) I.send(k, I.part_header(MsgType::kPull, p), nullptr, 0);
    };
    auto accept = [&](const MsgHeader& h, std::vector<zmq::message_t>& frames) {
      return h.type == static_cast<int>(MsgType::kOk) && frames.size() == 2 && unanswered.count(I.part_named(k, h)) > 0;
    };
    ask();
    while (!unanswered.empty()) {
      auto [h, frames] = I.recv(k, accept, ask);
      const int p = I.part_named(k, h);
      I.take_values(p, &frames[1], frames.size(), params.data_ptr<float>() + I.bounds[p], /*counted=*/false);
      I.parts[p].latest = std::max(I.parts[p].latest, h.param_version);
      unanswered.erase(p);  // the parts' versions stay those of this worker's own replies (staleness, DC-ASGD)
    }
  }
}

void PsClient::skip_data() {
  auto& I = *impl_;
  if (!I.opt.elastic || I.parts.empty()) return;
  const int k = I.parts[0].server;
  std::lock_guard<std::mutex> l(I.servers[k]->mu);
  MsgHeader h = I.part_header(MsgType::kPull, 0);
  h.samples = I.opt.samples_per_step;
  auto ask = [&] { I.send(k, h, nullptr, 0); };
  auto accept = [&](const MsgHeader& r, std::vector<zmq::message_t>& frames) {
    return r.type == static_cast<int>(MsgType::kOk) && frames.size() == 2 && I.part_named(k, r) == 0;
  };
  ask();
  const auto reply = I.recv(k, accept, ask).first;
  if (reply.data >= 0) I.grant = reply.data;
}

bool PsClient::wait_for_other_workers(double poll_s, const std::function<void(int64_t)>& on_poll) {
  // Out of the rounds first: a worker one round behind the others (BSP with backup workers: its
  // gradient counted a round late) would otherwise wait for this one's next push, which never comes,
  // until its timeout, while this one waited for it to finish.
  finish(impl_->pushed_clock.load(), /*still_reading=*/true);
  int64_t updates = -1;
  auto progress_at = std::chrono::steady_clock::now();
  for (;;) {
    const nlohmann::json j = nlohmann::json::parse(stats(0));
    const auto finished = j.at("finished").get<std::vector<bool>>();
    const auto live = j.at("live").get<std::vector<bool>>();
    std::vector<int> waiting;
    for (size_t w = 0; w < finished.size() && w < live.size(); ++w)
      if (static_cast<int>(w) != impl_->worker && !finished[w] && live[w]) waiting.push_back(static_cast<int>(w));
    if (waiting.empty()) return true;
    if (on_poll) on_poll(updates_of(j.at("version").get<int64_t>()));
    const auto now = std::chrono::steady_clock::now();
    if (const int64_t u = j.at("updates").get<int64_t>(); u != updates) updates = u, progress_at = now;
    if (now - progress_at > std::chrono::duration<double>(impl_->opt.timeout_s)) {
      log::warn("[ps] waited for workers {} to finish, but shard 0 applied nothing for {} s: taking the shards' values "
                "without their last updates", fmt::join(waiting, ","), impl_->opt.timeout_s);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(poll_s));
  }
}

void PsClient::shutdown_servers() {
  for (int k = 0; k < shards(); ++k) impl_->control(k, impl_->header(MsgType::kShutdown), [](const MsgHeader&) { return true; });
}

void PsClient::finish(int64_t clock, bool still_reading) {
  for (int k = 0; k < shards(); ++k) {
    MsgHeader h = impl_->header(MsgType::kFinish);
    h.clock = clock;
    if (still_reading) h.data = kFinishStillReading;
    impl_->control(k, h, [&](const MsgHeader& r) { return r.clock == clock && r.type == static_cast<int>(MsgType::kOk) && r.length == 0; });  // a refusal throws in recv
  }
}

std::string PsClient::layout() const {
  std::string eps;
  for (const auto& e : impl_->endpoints) eps += e + ",";
  return fmt::format("{} shards, partition {}, servers {:016x}, model {}", impl_->endpoints.size(), impl_->opt.partition_elems,
                     fnv1a64(eps), impl_->opt.model_digest.empty() ? "-" : impl_->opt.model_digest);
}

double push_pull(PsClient& client, const at::Tensor& grads, at::Tensor& params, int64_t clock, double lr,
                 const std::vector<int64_t>* computed_on) {
  const auto& b = client.bounds();
  std::vector<PsTicket> tickets;
  for (int p = 0; p < client.parts(); ++p)
    tickets.push_back(client.push(p, grads.slice(0, b[p], b[p + 1]), clock, lr,
                                  computed_on ? (*computed_on)[static_cast<size_t>(p)] : -1));
  double stale = 0;
  for (int p = 0; p < client.parts(); ++p) {
    at::Tensor into = params.slice(0, b[p], b[p + 1]);
    stale += static_cast<double>(client.wait(tickets[static_cast<size_t>(p)], into).staleness);
  }
  return client.parts() ? stale / client.parts() : 0;
}

}  // namespace syncopate
