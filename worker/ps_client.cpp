#include "worker/ps_client.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <iostream>
#include <mutex>
#include <thread>
#include <sstream>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/check.h"
#include "common/ps_protocol.h"
#include "common/transport/tcp_connection.h"

namespace syncopate {

struct PsClient::Impl {
  zmq::context_t ctx{1};
  // Liveness: a side thread with its own DEALERs sends HEARTBEAT every second, so that a worker
  // in a long step is not taken for dead by the servers' BSP/SSP bookkeeping.
  std::thread heartbeat;
  std::mutex hb_mu;
  std::condition_variable hb_cv;
  bool hb_stop = false;
  std::vector<zmq::socket_t> socks;
  std::vector<std::string> endpoints;
  std::vector<int64_t> begin;        // shard k holds [begin[k], begin[k+1])
  std::vector<int64_t> version;      // parameter version last pulled from shard k
  uint64_t token;
  std::vector<std::string> curve;  // server public, own public, own secret (Z85); empty = plain
  void secure(zmq::socket_t& s) const {
    if (curve.empty()) return;
    s.set(zmq::sockopt::curve_serverkey, curve[0]);
    s.set(zmq::sockopt::curve_publickey, curve[1]);
    s.set(zmq::sockopt::curve_secretkey, curve[2]);
  }
  int worker, workers;
  double timeout_s;
  // The round in progress: which shards were pushed, with which headers (for resends).
  std::vector<bool> pushed;
  std::vector<MsgHeader> round;

  MsgHeader header(MsgType t, int k) const {
    MsgHeader h;
    h.type = static_cast<int>(t);
    h.token = token;
    h.worker = worker;
    h.workers = workers;
    if (!begin.empty()) {
      h.offset = begin[k];
      h.length = begin[k + 1] - begin[k];
      h.param_version = version[k];
    }
    return h;
  }
  void send(int k, const MsgHeader& h, const void* data, size_t bytes) {
    std::string hdr = encode_header(h);
    auto& s = socks[static_cast<size_t>(k)];
    if (bytes == 0 && h.type != static_cast<int>(MsgType::kPushPull)) {
      s.send(zmq::buffer(hdr), zmq::send_flags::none);
      return;
    }
    s.send(zmq::buffer(hdr), zmq::send_flags::sndmore);
    // Zero-copy: the buffer stays valid until the reply arrives, which implies ZeroMQ is done with it.
    zmq::message_t body(const_cast<void*>(data), bytes, [](void*, void*) {}, nullptr);
    s.send(body, zmq::send_flags::none);
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

  // Receives shard k's reply and copies its data into dst (if given). A reply whose clock is not
  // `expect_clock` (>= 0) belongs to an earlier, resent request and is dropped. When the shard is
  // silent (it may have died and been restarted from its checkpoint; ZeroMQ reconnects by itself)
  // the request is resent with exponential backoff, up to timeout_s in all; the server drops
  // duplicate pushes by clock, so nothing is applied twice.
  MsgHeader recv(int k, float* dst, int64_t expect_clock, const std::function<void()>& resend) {
    auto& sock = socks[static_cast<size_t>(k)];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    double attempt_s = std::min(timeout_s, 5.0);
    for (;;) {
      sock.set(zmq::sockopt::rcvtimeo, static_cast<int>(attempt_s * 1000));
      std::vector<zmq::message_t> parts;
      if (!zmq::recv_multipart(sock, std::back_inserter(parts))) {
        SYN_CHECK(std::chrono::steady_clock::now() < deadline,
                  fmt::format("parameter server {} ({}) did not reply within {} s", k, endpoints[k], timeout_s),
                  "check that syncopate-server is running there (its log), or raise dist.timeout_s");
        std::cerr << fmt::format("[ps] server {} silent for {:.0f} s; resending\n", k, attempt_s);
        resend();
        attempt_s = std::min(attempt_s * 2, 60.0);
        continue;
      }
      MsgHeader h = decode_header(parts[0].data(), parts[0].size());
      SYN_CHECK(h.type != static_cast<int>(MsgType::kError), fmt::format("parameter server {} refused: {}", k, h.text),
                "workers and servers must share token, model and worker count");
      if (expect_clock >= 0 && h.clock != expect_clock) continue;  // reply to an earlier copy
      if (dst) {
        const size_t want = static_cast<size_t>(begin[k + 1] - begin[k]) * sizeof(float);
        SYN_CHECK(parts.size() == 2 && parts[1].size() == want,
                  fmt::format("parameter server {} sent {} bytes, expected {}", k, parts.size() == 2 ? parts[1].size() : 0, want),
                  "server and worker disagree on the sharding");
        std::memcpy(dst, parts[1].data(), want);
        version[k] = h.param_version;
      }
      return h;
    }
  }
};

void PsClient::require_host(const at::Tensor& t, const char* what) {
  SYN_CHECK(t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(),
            fmt::format("PsClient::{} needs a contiguous float32 tensor in host memory", what),
            "this is a bug: GPU replicas stage their buffers through host memory (ParameterUpdate)");
}

std::vector<std::string> PsClient::parse_endpoints(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string e;
  while (std::getline(ss, e, ','))
    if (!e.empty()) out.push_back(e);
  SYN_CHECK(!out.empty(), "dist.mode=ps needs dist.servers", "e.g. --dist.servers=tcp://127.0.0.1:29501,tcp://127.0.0.1:29502");
  return out;
}

PsClient::PsClient(const std::vector<std::string>& endpoints, const std::string& token, int worker, int workers,
                   double timeout_s, const std::string& curve_server_key)
    : impl_(std::make_unique<Impl>()) {
  if (!curve_server_key.empty()) {
    SYN_CHECK(curve_server_key.size() == 40, "dist.curve_server_key is not a 40-character Z85 key",
              "copy the PUBLIC half printed by syncopate-server --generate-curve-keys");
    char pub[41], sec[41];
    SYN_CHECK(zmq_curve_keypair(pub, sec) == 0, "this libzmq has no CURVE support", "install libzmq built with libsodium");
    impl_->curve = {curve_server_key, pub, sec};  // an ephemeral client key pair per worker
  }
  impl_->endpoints = endpoints;
  impl_->token = token_digest(token);
  impl_->worker = worker;
  impl_->workers = workers;
  impl_->timeout_s = timeout_s;
  for (const auto& ep : endpoints) {
    zmq::socket_t s(impl_->ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    impl_->secure(s);
    try {
      s.connect(ep);
    } catch (const zmq::error_t& e) {
      SYN_FAIL(fmt::format("bad parameter-server endpoint '{}': {}", ep, e.what()), "write tcp://IP:PORT");
    }
    impl_->socks.push_back(std::move(s));
  }
  impl_->heartbeat = std::thread([this] { impl_->heartbeat_loop(); });
}

PsClient::~PsClient() = default;

void PsClient::init(at::Tensor& params, const std::vector<std::pair<int64_t, int64_t>>& decay, const AdamWConfig& oc,
                    int64_t start_step) {
  auto& I = *impl_;
  require_host(params, "init");
  const int64_t n = params.numel();
  const int K = static_cast<int>(I.socks.size());
  I.begin = even_bounds(n, K);
  I.version.assign(static_cast<size_t>(K), 0);
  std::vector<int64_t> pairs;
  for (auto& [o, l] : decay) pairs.insert(pairs.end(), {o, l});
  std::vector<MsgHeader> hs;
  std::vector<std::vector<char>> bodies(static_cast<size_t>(K));
  for (int k = 0; k < K; ++k) {
    MsgHeader h = I.header(MsgType::kInit, k);
    h.beta1 = oc.beta1;
    h.beta2 = oc.beta2;
    h.eps = oc.eps;
    h.weight_decay = oc.weight_decay;
    h.clock = start_step;
    auto& b = bodies[static_cast<size_t>(k)];
    b.resize(static_cast<size_t>(h.length) * 4 + pairs.size() * 8);
    std::memcpy(b.data(), params.data_ptr<float>() + h.offset, static_cast<size_t>(h.length) * 4);
    if (!pairs.empty()) std::memcpy(b.data() + h.length * 4, pairs.data(), pairs.size() * 8);
    hs.push_back(h);
  }
  auto send_init = [&](int k) { I.send(k, hs[k], bodies[k].data(), bodies[k].size()); };
  for (int k = 0; k < K; ++k) send_init(k);  // all shards first, so they work in parallel
  for (int k = 0; k < K; ++k) I.recv(k, params.data_ptr<float>() + I.begin[k], -1, [&] { send_init(k); });
}

std::vector<int64_t> PsClient::versions() const { return impl_->version; }

void PsClient::push_shard(int k, const at::Tensor& grads, int64_t clock, double lr, int64_t computed_on) {
  auto& I = *impl_;
  require_host(grads, "push_shard");
  if (I.pushed.empty()) I.pushed.assign(I.socks.size(), false), I.round.resize(I.socks.size());
  MsgHeader& h = I.round[static_cast<size_t>(k)];
  h = I.header(MsgType::kPushPull, k);
  h.clock = clock;
  h.lr = lr;
  if (computed_on >= 0) h.param_version = computed_on;
  I.send(k, h, grads.data_ptr<float>() + h.offset, static_cast<size_t>(h.length) * sizeof(float));
  I.pushed[static_cast<size_t>(k)] = true;
}

double PsClient::gather(const at::Tensor& grads, at::Tensor& params, int64_t clock, double lr) {
  auto& I = *impl_;
  require_host(grads, "gather");
  require_host(params, "gather");
  const int K = static_cast<int>(I.socks.size());
  for (int k = 0; k < K; ++k)
    if (I.pushed.empty() || !I.pushed[static_cast<size_t>(k)]) push_shard(k, grads, clock, lr);
  double stale = 0;
  for (int k = 0; k < K; ++k) {
    auto resend = [&] {
      const MsgHeader& h = I.round[static_cast<size_t>(k)];
      I.send(k, h, grads.data_ptr<float>() + h.offset, static_cast<size_t>(h.length) * sizeof(float));
    };
    stale += static_cast<double>(I.recv(k, params.data_ptr<float>() + I.begin[k], clock, resend).staleness);
  }
  I.pushed.assign(static_cast<size_t>(K), false);
  return stale / K;
}

double PsClient::push_pull(const at::Tensor& grads, at::Tensor& params, int64_t clock, double lr,
                           const std::vector<int64_t>* computed_on) {
  for (int k = 0; k < static_cast<int>(impl_->socks.size()); ++k)
    push_shard(k, grads, clock, lr, computed_on ? (*computed_on)[static_cast<size_t>(k)] : -1);
  return gather(grads, params, clock, lr);
}

std::vector<int64_t> PsClient::shard_bounds() const { return impl_->begin; }

std::vector<int64_t> PsClient::even_bounds(int64_t n, int shards) {
  std::vector<int64_t> b;
  for (int k = 0; k <= shards; ++k) b.push_back(n * k / shards);
  return b;
}

std::string PsClient::stats(int k) {
  auto ask = [&] { impl_->send(k, impl_->header(MsgType::kStats, k), nullptr, 0); };
  ask();
  return impl_->recv(k, nullptr, -1, ask).text;
}

void PsClient::shutdown_servers() {
  for (int k = 0; k < static_cast<int>(impl_->socks.size()); ++k) {
    auto ask = [&] { impl_->send(k, impl_->header(MsgType::kShutdown, k), nullptr, 0); };
    ask();
    impl_->recv(k, nullptr, -1, ask);
  }
}

}  // namespace syncopate
