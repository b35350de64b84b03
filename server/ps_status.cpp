#include "server/ps_status.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/monotonic_clock.h"
#include "common/check.h"
#include "server/ps_keys.h"
#include "server/ps_protocol.h"

namespace syncopate {
namespace {

double wall_seconds() { return monotonic_seconds(); }

// STATS of one shard over a DEALER of its own; throws syncopate::Error naming what went wrong.
nlohmann::json shard_stats(zmq::context_t& ctx, const std::string& endpoint, const StatusOptions& o) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  const int ms = static_cast<int>(o.timeout_s * 1000);
  s.set(zmq::sockopt::rcvtimeo, ms);
  s.set(zmq::sockopt::sndtimeo, ms);  // no connection (a failed handshake) must not block the poll
  const std::string key = ps_client_server_key(o.token, o.encrypt, o.curve_server_key);
  if (!key.empty()) {
    char pub[41], sec[41];
    SYN_CHECK(zmq_curve_keypair(pub, sec) == 0, "this libzmq has no CURVE support", "install libzmq built with libsodium");
    s.set(zmq::sockopt::curve_serverkey, key);
    s.set(zmq::sockopt::curve_publickey, std::string(pub));
    s.set(zmq::sockopt::curve_secretkey, std::string(sec));
  }
  s.connect(endpoint);
  MsgHeader h;
  h.type = static_cast<int>(MsgType::kStats);
  h.token = token_digest(o.token);
  SYN_CHECK(s.send(zmq::buffer(encode_header(h)), zmq::send_flags::none).has_value(),
            fmt::format("no connection within {} s", o.timeout_s), "is the shard running, with this token and encryption?");
  std::vector<zmq::message_t> parts;
  SYN_CHECK(zmq::recv_multipart(s, std::back_inserter(parts)).has_value() && !parts.empty(),
            fmt::format("no answer within {} s", o.timeout_s),
            "the shard is dead, or the token or encryption differ from the job's");
  const MsgHeader r = decode_reply(parts[0].data(), parts[0].size());
  SYN_CHECK(r.type == static_cast<int>(MsgType::kOk), fmt::format("refused: {}", r.text), "use the job's token");
  return nlohmann::json::parse(r.text);
}

}  // namespace

nlohmann::json poll_status(const std::vector<std::string>& endpoints, const StatusOptions& o, const nlohmann::json& previous) {
  zmq::context_t ctx;
  nlohmann::json shards = nlohmann::json::array();
  std::vector<nlohmann::json> stats;
  for (const auto& ep : endpoints) {
    nlohmann::json e = {{"endpoint", ep}};
    try {
      e["stats"] = shard_stats(ctx, ep, o);
      e["ok"] = true;  // it answered
      if (!e["stats"].contains("clocks")) e["waiting"] = "no worker has joined yet";  // not initialized: nothing to report
      else stats.push_back(e["stats"]);
    } catch (const std::exception& x) {
      e["ok"] = false;
      e["error"] = x.what();
    }
    shards.push_back(e);
  }
  // Per worker, over the shards that answered: its clock (the newest any shard saw), the
  // staleness of its last update (the largest), alive only if every shard sees it alive, silent
  // for the longest any shard has not heard from it.
  size_t workers = 0;
  for (const auto& s : stats) workers = std::max(workers, s["clocks"].size());
  nlohmann::json ws = nlohmann::json::array();
  const double t = wall_seconds();
  int64_t fastest = -1;
  for (size_t w = 0; w < workers; ++w) {
    int64_t clock = -1, stale = 0;
    bool alive = true, reading = false;
    double silent = 0;
    for (const auto& s : stats) {
      if (w >= s["clocks"].size()) continue;
      clock = std::max(clock, s["clocks"][w].get<int64_t>());
      if (s.contains("last_staleness")) stale = std::max(stale, s["last_staleness"][w].get<int64_t>());
      if (s.contains("live")) alive = alive && s["live"][w].get<bool>();
      if (s.contains("reading") && w < s["reading"].size()) reading = reading || s["reading"][w].get<bool>();
      if (s.contains("now_s") && s.contains("last_seen_s"))
        silent = std::max(silent, s["now_s"].get<double>() - s["last_seen_s"][w].get<double>());
    }
    nlohmann::json j = {{"worker", w}, {"clock", clock}, {"staleness", stale}, {"alive", alive}, {"silent_s", silent},
                        {"reading", reading}};
    if (previous.is_object() && previous.contains("workers") && w < previous["workers"].size()) {
      const double dt = t - previous["time_s"].get<double>();
      if (dt > 0) j["clocks_per_s"] = static_cast<double>(clock - previous["workers"][w]["clock"].get<int64_t>()) / dt;
    }
    if (alive) fastest = std::max(fastest, clock);
    ws.push_back(j);
  }
  int straggler = -1;
  int64_t slowest = fastest;
  for (auto& j : ws) {
    j["behind"] = fastest >= 0 ? fastest - j["clock"].get<int64_t>() : 0;
    if (j["alive"].get<bool>() && j["clock"].get<int64_t>() < slowest) {
      slowest = j["clock"].get<int64_t>();
      straggler = j["worker"].get<int>();
    }
  }
  return {{"time_s", t}, {"shards", shards}, {"workers", ws}, {"straggler", straggler}};
}

std::string format_status(const nlohmann::json& p) {
  std::string out;
  for (const auto& s : p["shards"]) {
    if (s.contains("waiting")) {
      out += fmt::format("shard {}: up, {}\n", s["endpoint"].get<std::string>(), s["waiting"].get<std::string>());
    } else if (s["ok"].get<bool>()) {
      const auto& st = s["stats"];
      out += fmt::format("shard {}: {} consistency, version {}, {} of {} workers live, {} duplicates, {} dropped\n",
                         s["endpoint"].get<std::string>(), st.value("consistency", "?"), st.value("version", int64_t{0}),
                         st.value("live_workers", 0), st.value("workers", 0), st.value("duplicates", int64_t{0}),
                         st.value("dropped", int64_t{0}));
    } else {
      out += fmt::format("shard {}: {}\n", s["endpoint"].get<std::string>(), s.value("error", std::string("?")));
    }
  }
  out += fmt::format("{:>6} {:>8} {:>7} {:>10} {:>9} {:>6} {:>9}\n", "worker", "clock", "behind", "clocks/s", "staleness",
                     "alive", "silent_s");
  for (const auto& w : p["workers"]) {
    const std::string rate = w.contains("clocks_per_s") ? fmt::format("{:.2f}", w["clocks_per_s"].get<double>()) : "-";
    out += fmt::format("{:>6} {:>8} {:>7} {:>10} {:>9} {:>6} {:>9.1f}{}\n", w["worker"].get<int>(), w["clock"].get<int64_t>(),
                       w["behind"].get<int64_t>(), rate, w["staleness"].get<int64_t>(), w["alive"].get<bool>() ? "yes" : w.value("reading", false) ? "read" : "DEAD",
                       w["silent_s"].get<double>(), w["worker"].get<int>() == p["straggler"].get<int>() ? "  <- straggler" : "");
  }
  return out;
}

}  // namespace syncopate
