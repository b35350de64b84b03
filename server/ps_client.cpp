#include "server/ps_client.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/check.h"
#include "common/comm/sharding.h"
#include "common/fnv1a.h"
#include "common/trace.h"
#include "common/log.h"
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
  std::vector<int64_t> bounds;  // shard k holds [bounds[k], bounds[k+1])
  uint64_t token = 0;
  std::vector<std::string> curve;  // server public, own public, own secret (Z85); empty = plain
  int worker = 0, workers = 0;
  PsClientOptions opt;
  std::atomic<int64_t> next_id{0}, pushes{0}, resends{0}, bytes_sent{0};

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
  struct Shard {
    std::mutex mu;  // one caller at a time per shard
    zmq::socket_t sock;
    int64_t version = 0;  // parameter version last pulled
    int64_t init_clock = -1;  // this worker's clock on the shard when INIT registered it
    std::unique_ptr<ErrorFeedback> feedback;  // int8 wire: what rounding dropped, owed to the next push
    at::Tensor wire_buf;  // compressed pushes: the bytes of the last one, reused once nothing holds them
    std::map<int64_t, Pending> pending;  // by ticket id
  };
  std::vector<std::unique_ptr<Shard>> shards;

  void secure(zmq::socket_t& s) const {
    if (curve.empty()) return;
    s.set(zmq::sockopt::curve_serverkey, curve[0]);
    s.set(zmq::sockopt::curve_publickey, curve[1]);
    s.set(zmq::sockopt::curve_secretkey, curve[2]);
  }
  MsgHeader header(MsgType t, int k) const {
    MsgHeader h;
    h.type = static_cast<int>(t);
    h.token = token;
    h.worker = worker;
    h.workers = workers;
    if (!bounds.empty()) {
      h.offset = bounds[k];
      h.length = bounds[k + 1] - bounds[k];
      h.param_version = shards[k]->version;
    }
    return h;
  }
  // Sends a header and, optionally, a data frame. `hold` defined: the frame is sent without
  // copying and the message keeps a reference to hold's memory until ZeroMQ is done with it;
  // otherwise the bytes are copied into the message.
  // A DEALER with no connected peer blocks in send: with no server listening, or a CURVE
  // handshake that fails (another job's key, a plain client), it has none. Sends wait at most
  // timeout_s (ZMQ_SNDTIMEO) and then fail naming the server, like a reply that never comes.
  void send(int k, const MsgHeader& h, const void* data, size_t bytes, const at::Tensor& hold = {}) {
    const std::string hdr = encode_header(h);
    zmq::socket_t& s = shards[k]->sock;
    auto sent = [&](const zmq::send_result_t& r) {
      SYN_CHECK(r.has_value(), fmt::format("parameter server {} ({}) took no message within {} s: no connection to it", k,
                                           endpoints[k], opt.timeout_s),
                "check that syncopate-server runs there and that token and encryption match (a failed CURVE "
                "handshake leaves no connection; the server's log names it)");
    };
    if (data == nullptr && h.type != static_cast<int>(MsgType::kPushPull)) {
      sent(s.send(zmq::buffer(hdr), zmq::send_flags::none));
      return;
    }
    sent(s.send(zmq::buffer(hdr), zmq::send_flags::sndmore));
    if (hold.defined()) {
      auto* ref = new at::Tensor(hold);
      zmq::message_t body(const_cast<void*>(data), bytes, [](void*, void* r) { delete static_cast<at::Tensor*>(r); }, ref);
      sent(s.send(body, zmq::send_flags::none));
    } else {
      zmq::message_t body(data, bytes);
      sent(s.send(body, zmq::send_flags::none));
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
    MsgHeader h;
    h.type = static_cast<int>(MsgType::kHeartbeat);
    h.token = token;
    h.worker = worker;
    const std::string hdr = encode_header(h);
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

  // Receives shard k's replies until `accept(header)` takes one, which is returned with its data
  // frames. A refused request throws. When the shard is silent (it may have died and been
  // restarted from its checkpoint; ZeroMQ reconnects by itself) `resend` runs with exponential
  // backoff, up to timeout_s in all; the server drops duplicate pushes by clock, so nothing is
  // applied twice.
  std::pair<MsgHeader, std::vector<zmq::message_t>> recv(int k, const std::function<bool(const MsgHeader&, std::vector<zmq::message_t>&)>& accept,
                                                          const std::function<void()>& resend) {
    zmq::socket_t& sock = shards[k]->sock;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(opt.timeout_s);
    double attempt_s = std::min(opt.timeout_s, opt.first_resend_s);
    for (;;) {
      sock.set(zmq::sockopt::rcvtimeo, static_cast<int>(attempt_s * 1000));
      std::vector<zmq::message_t> parts;
      if (!zmq::recv_multipart(sock, std::back_inserter(parts))) {
        SYN_CHECK(std::chrono::steady_clock::now() < deadline,
                  fmt::format("parameter server {} ({}) did not reply within {} s", k, endpoints[k], opt.timeout_s),
                  "check that syncopate-server is running there (its log), or raise dist.timeout_s");
        log::warn("[ps] server {} silent for {:.1f} s; resending", k, attempt_s);
        resend();
        ++resends;
        attempt_s = std::min(attempt_s * 2, 60.0);
        continue;
      }
      MsgHeader h = decode_reply(parts[0].data(), parts[0].size());
      SYN_CHECK(h.type != static_cast<int>(MsgType::kError), fmt::format("parameter server {} refused: {}", k, h.text),
                "workers and servers must share token, model and worker count");
      if (accept(h, parts)) return {h, std::move(parts)};
    }
  }
  // A control request without data (STATS, FINISH, SHUTDOWN) to shard k, resent while the shard is
  // silent; returns the first reply `accept` takes. One caller at a time per shard.
  MsgHeader control(int k, const MsgHeader& h, const std::function<bool(const MsgHeader&)>& accept) {
    std::lock_guard<std::mutex> l(shards[k]->mu);
    auto ask = [&] { send(k, h, nullptr, 0); };
    ask();
    return recv(k, [&](const MsgHeader& r, std::vector<zmq::message_t>&) { return accept(r); }, ask).first;
  }
  // While waiting on shard k, the pushes still unanswered by the other shards are sent again
  // too: a shard that died and came back from its checkpoint may have lost them, and under BSP it
  // would wait for them while this worker waits on shard k, which waits for a worker that waits
  // on it (found by the launch test's shard restart). Shards drop duplicates by clock, and a reply
  // to a copy already answered is ignored, so a needless resend costs bytes only. A shard another
  // thread is using right now is skipped (its own wait resends).
  void resend_unanswered(int k) {
    for (int j = 0; j < static_cast<int>(shards.size()); ++j) {
      if (j == k) continue;
      std::unique_lock<std::mutex> l(shards[j]->mu, std::try_to_lock);
      if (!l.owns_lock()) continue;
      for (auto& [id, p] : shards[j]->pending) {
        if (p.replied) continue;
        send(j, p.header, p.data.data_ptr(), p.data.nbytes());
        bytes_sent += static_cast<int64_t>(p.data.nbytes());
      }
    }
  }
  // Copies a reply's values into dst (the shard's range) after checking their size.
  void take_values(int k, const zmq::message_t* values, size_t frames, float* dst) {
    const size_t want = static_cast<size_t>(bounds[k + 1] - bounds[k]) * sizeof(float);
    SYN_CHECK(frames == 2 && values && values->size() == want,
              fmt::format("parameter server {} sent {} bytes, expected {}", k, frames == 2 && values ? values->size() : 0, want),
              "server and worker disagree on the sharding");
    if (want) std::memcpy(dst, values->data(), want);
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
  for (const auto& ep : endpoints) {
    auto sh = std::make_unique<Impl::Shard>();
    sh->sock = zmq::socket_t(I.ctx, zmq::socket_type::dealer);
    sh->sock.set(zmq::sockopt::linger, 0);
    sh->sock.set(zmq::sockopt::sndtimeo, static_cast<int>(std::min(options.timeout_s, 2e6) * 1000));  // see send()
    I.secure(sh->sock);
    try {
      sh->sock.connect(ep);
    } catch (const zmq::error_t& e) {
      SYN_FAIL(fmt::format("bad parameter-server endpoint '{}': {}", ep, e.what()), "write tcp://IP:PORT");
    }
    I.shards.push_back(std::move(sh));
  }
  I.heartbeat = std::thread([this] { impl_->heartbeat_loop(); });
}

PsClient::~PsClient() = default;

int PsClient::shards() const { return static_cast<int>(impl_->shards.size()); }
const std::vector<int64_t>& PsClient::bounds() const { return impl_->bounds; }

void PsClient::init(at::Tensor& params, const std::vector<std::pair<int64_t, int64_t>>& decay, const AdamWConfig& oc,
                    int64_t start_step, const ShardUpdate& update) {
  auto& I = *impl_;
  require_host(params, params.numel(), "init");
  const int K = shards();
  I.bounds = Sharding::bounds(params.numel(), K);
  std::vector<int64_t> pairs;
  for (auto& [o, l] : decay) pairs.insert(pairs.end(), {o, l});
  std::vector<MsgHeader> hs;
  std::vector<at::Tensor> bodies(static_cast<size_t>(K));  // bytes; each INIT message holds a reference
  for (int k = 0; k < K; ++k) {
    MsgHeader h = I.header(MsgType::kInit, k);
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
    at::Tensor& b = bodies[static_cast<size_t>(k)];
    b = at::empty({h.length * 4 + static_cast<int64_t>(pairs.size()) * 8}, at::kByte);
    auto* bytes = b.data_ptr<uint8_t>();
    if (h.length) std::memcpy(bytes, params.data_ptr<float>() + h.offset, static_cast<size_t>(h.length) * 4);
    if (!pairs.empty()) std::memcpy(bytes + h.length * 4, pairs.data(), pairs.size() * 8);
    hs.push_back(h);
  }
  for (int k = 0; k < K; ++k)  // all shards first, so they work in parallel; zero-copy
    I.send(k, hs[k], bodies[k].data_ptr(), static_cast<size_t>(bodies[k].numel()), bodies[k]);
  auto send_init = [&](int k) {  // a resend: a copy
    I.send(k, hs[k], bodies[k].data_ptr(), static_cast<size_t>(bodies[k].numel()));
  };
  for (int k = 0; k < K; ++k) {
    auto [h, parts] = I.recv(k, [](const MsgHeader&, std::vector<zmq::message_t>&) { return true; }, [&] { send_init(k); });
    I.take_values(k, parts.size() > 1 ? &parts[1] : nullptr, parts.size(), params.data_ptr<float>() + I.bounds[k]);
    I.shards[k]->version = h.param_version;
    I.shards[k]->init_clock = h.clock;
    if (I.opt.wire == WireFormat::kInt8 && !I.shards[k]->feedback)
      I.shards[k]->feedback = std::make_unique<ErrorFeedback>(WireFormat::kInt8, I.bounds[k + 1] - I.bounds[k]);
  }
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

PsTicket PsClient::push(int k, const at::Tensor& grad, int64_t clock, double lr, int64_t computed_on) {
  auto& I = *impl_;
  SYN_CHECK(!I.bounds.empty() && k >= 0 && k < shards(), fmt::format("push to shard {} of {} before init or out of range", k, shards()),
            "this is a bug: call init() first");
  require_host(grad, I.bounds[k + 1] - I.bounds[k], "push");
  Impl::Shard& sh = *I.shards[k];
  std::lock_guard<std::mutex> l(sh.mu);
  MsgHeader h = I.header(MsgType::kPushPull, k);
  h.clock = clock;
  h.lr = lr;
  if (computed_on >= 0) h.param_version = computed_on;
  const int64_t id = I.next_id++;
  at::Tensor body = grad;  // f32: the gradient itself
  if (I.opt.wire != WireFormat::kF32) {  // compressed into a buffer of its own (kept for resends)
    const int64_t n = static_cast<int64_t>(wire_bytes(I.opt.wire, h.length));
    // Reused when neither a pending ticket nor ZeroMQ still holds the last push's bytes.
    if (!sh.wire_buf.defined() || sh.wire_buf.use_count() > 1 || sh.wire_buf.numel() != n)
      sh.wire_buf = at::empty({n}, at::kByte);
    body = sh.wire_buf;
    if (sh.feedback) sh.feedback->encode(grad.data_ptr<float>(), body.data_ptr<uint8_t>());
    else encode(I.opt.wire, grad.data_ptr<float>(), h.length, body.data_ptr<uint8_t>());  // fp16: a value out of range throws
    h.dtype = wire_dtype(I.opt.wire);
  }
  Impl::Pending& p = sh.pending[id];
  p.header = h;
  p.data = body;
  if (Tracer::global().on()) p.sent_us = Tracer::now_us();
  const size_t bytes = body.nbytes();
  I.send(k, h, body.data_ptr(), bytes, body);  // zero-copy; the message holds a reference
  ++I.pushes;
  I.bytes_sent += static_cast<int64_t>(bytes);
  return {k, id};
}

PsReply PsClient::wait(const PsTicket& t, at::Tensor& into) {
  auto& I = *impl_;
  SYN_CHECK(t.shard >= 0 && t.shard < shards(), "wait on a ticket of no shard", "this is a bug");
  const int k = t.shard;
  require_host(into, I.bounds[k + 1] - I.bounds[k], "wait");
  Impl::Shard& sh = *I.shards[k];
  std::lock_guard<std::mutex> l(sh.mu);
  auto it = sh.pending.find(t.id);
  SYN_CHECK(it != sh.pending.end(), fmt::format("ticket {} of shard {} is unknown or was waited for already", t.id, k),
            "this is a bug: wait once per push");
  if (!it->second.replied) {
    // Replies are matched to pushes by clock; a reply to another pending push is kept for its
    // wait(), one to an earlier copy of a request already answered is dropped.
    const int64_t clock = it->second.header.clock;
    auto resend = [&] {  // a copy: ZeroMQ may still hold it after this wait() returns
      const Impl::Pending& p = sh.pending.at(t.id);
      const size_t bytes = p.data.nbytes();
      I.send(k, p.header, p.data.data_ptr(), bytes);
      I.bytes_sent += static_cast<int64_t>(bytes);
      I.resend_unanswered(k);
    };
    auto accept = [&](const MsgHeader& h, std::vector<zmq::message_t>& parts) {
      if (h.clock == clock) return true;
      for (auto& [id, p] : sh.pending)
        if (id != t.id && !p.replied && p.header.clock == h.clock) {
          p.replied = true;
          p.reply = h;
          p.frames = parts.size();
          if (parts.size() == 2) p.values = std::move(parts[1]);
          return false;
        }
      return false;
    };
    auto [h, parts] = I.recv(k, accept, resend);
    it->second.reply = h;
    it->second.frames = parts.size();
    if (parts.size() == 2) it->second.values = std::move(parts[1]);
    it->second.replied = true;
  }
  Impl::Pending& p = it->second;
  const PsReply out{p.reply.staleness, p.reply.param_version};
  if (p.sent_us)
    Tracer::global().complete("push and pull", "ps", p.sent_us, Tracer::now_us(), kTraceTrack + k,
                              fmt::format(R"("clock":{},"bytes":{},"staleness":{})", p.header.clock, p.data.nbytes(), out.staleness));
  const size_t frames = p.frames;
  zmq::message_t values = std::move(p.values);
  sh.pending.erase(it);  // before the checks below can throw: a ticket is waited for once
  I.take_values(k, &values, frames, into.data_ptr<float>());
  sh.version = out.version;
  return out;
}

std::vector<int64_t> PsClient::versions() const {
  std::vector<int64_t> v;
  for (const auto& sh : impl_->shards) v.push_back(sh->version);
  return v;
}

int64_t PsClient::applied_clock() const {
  int64_t c = -1;
  for (const auto& sh : impl_->shards) c = std::max(c, sh->init_clock);
  return c;
}

PsClientCounters PsClient::counters() const {
  return {impl_->pushes.load(), impl_->resends.load(), impl_->bytes_sent.load()};
}

std::string PsClient::stats(int k) {
  auto accept = [](const MsgHeader& h) { return h.type == static_cast<int>(MsgType::kOk); };
  return impl_->control(k, impl_->header(MsgType::kStats, k), accept).text;
}

void PsClient::shutdown_servers() {
  for (int k = 0; k < shards(); ++k)
    impl_->control(k, impl_->header(MsgType::kShutdown, k), [](const MsgHeader&) { return true; });
}

void PsClient::finish(int64_t clock) {
  for (int k = 0; k < shards(); ++k) {
    MsgHeader h = impl_->header(MsgType::kFinish, k);
    h.clock = clock;
    impl_->control(k, h, [&](const MsgHeader& r) { return r.clock == clock; });  // a refusal throws in recv
  }
}

std::string PsClient::layout() const {
  std::string eps;
  for (const auto& e : impl_->endpoints) eps += e + ",";
  return fmt::format("{} shards, servers {:016x}, model {}", impl_->endpoints.size(), fnv1a64(eps),
                     impl_->opt.model_digest.empty() ? "-" : impl_->opt.model_digest);
}

double push_pull(PsClient& client, const at::Tensor& grads, at::Tensor& params, int64_t clock, double lr,
                 const std::vector<int64_t>* computed_on) {
  const auto& b = client.bounds();
  std::vector<PsTicket> tickets;
  for (int k = 0; k < client.shards(); ++k)
    tickets.push_back(client.push(k, grads.slice(0, b[k], b[k + 1]), clock, lr,
                                  computed_on ? (*computed_on)[static_cast<size_t>(k)] : -1));
  double stale = 0;
  for (int k = 0; k < client.shards(); ++k) {
    at::Tensor into = params.slice(0, b[k], b[k + 1]);
    stale += static_cast<double>(client.wait(tickets[static_cast<size_t>(k)], into).staleness);
  }
  return client.shards() ? stale / client.shards() : 0;
}

}  // namespace syncopate
