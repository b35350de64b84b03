// The crash-point sweep of issue 26: a real syncopate-server process (server.checkpoint_every=1)
// kills itself (SIGKILL, SYNCOPATE_CRASH_AT=ps_server:<point>:<n>) at one point of its request path
// (after receive, after apply, after checkpoint, after reply) on the n-th push, is restarted on the
// same port from its checkpoint, and the workers (real PsClients, resending while it is down) finish
// their clocks. Every case: BSP / SSP / ASP x whole / partitioned x f32 / int8. Asserted: the crash
// happened, and the exactly-once ledger: every worker's clocks, the number of updates per
// partition and the version are those of an uninterrupted run, and where the mode is deterministic
// (BSP: the mean of a clock; ASP with one worker) the final weights are equal bit for bit.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/comm/wire_format.h"
#include "server/ps_client.h"
#include "tests/test_helpers.h"

using namespace syncopate;

namespace {

constexpr int64_t kValues = 1000;
constexpr int kClocks = 5;

struct Outcome {
  nlohmann::json stats;
  std::vector<at::Tensor> params;  // each worker's after its last reply
  bool crashed = false;
};

// A deterministic gradient of worker w at clock c.
at::Tensor gradient(int w, int c) {
  return torch::sin(torch::arange(kValues, torch::kFloat) * 0.37 + 1.3 * c + 2.1 * w) * 0.05;
}

// Runs `workers` clients for kClocks clocks against one server process; crash_at: "" or
// "ps_server:<point>:<n>". The server is restarted (without the crash) when it dies.
Outcome run_job(const std::string& consistency, bool partitioned, bool int8, const std::string& crash_at) {
  test::TempDir d;
  const int workers = consistency == "asp" ? 1 : 2;  // ASP with one worker is deterministic
  const std::string bin = test::bin_dir() + "/syncopate-server";
  const std::vector<std::string> common = {bin, "--ps.consistency=" + consistency, "--ps.staleness_bound=1",
                                           "--server.checkpoint_dir=" + d.str("ck"), "--server.checkpoint_every=1",
                                           "--server.encrypt=off"};
  const test::ServerPort port = test::any_server_port(d);
  std::vector<std::string> args = common;
  args.insert(args.end(), port.args.begin(), port.args.end());
  std::vector<std::string> env = {"SYNCOPATE_TOKEN=t", "SYNCOPATE_LOG=warn"};
  if (!crash_at.empty()) env.push_back("SYNCOPATE_CRASH_AT=" + crash_at);
  auto server = std::make_unique<test::Process>(args, env, d.str("server1.log"));
  const std::string ep = test::wait_for_line(port.endpoint_file, 60, server.get());

  PsClientOptions o{30};
  o.first_resend_s = 0.3;
  o.wire = int8 ? WireFormat::kInt8 : WireFormat::kF32;
  o.partition_elems = partitioned ? 256 : 0;  // 4 partitions
  std::vector<std::unique_ptr<PsClient>> clients;
  Outcome out;
  for (int w = 0; w < workers; ++w) {
    clients.push_back(std::make_unique<PsClient>(std::vector<std::string>{ep}, "t", w, workers, o));
    out.params.push_back(torch::arange(kValues, torch::kFloat) * 0.01);
    clients.back()->init(out.params.back(), {}, AdamWConfig{});
  }
  std::atomic<int> done{0};
  std::vector<std::string> errors(static_cast<size_t>(workers));
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w)
    threads.emplace_back([&, w] {
      try {
        for (int c = 0; c < kClocks; ++c) push_pull(*clients[w], gradient(w, c), out.params[w], c, 0.01);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(w)] = e.what();
      }
      ++done;
    });
  // The harness: a server that died is started again on its port, from its checkpoint.
  while (done < workers) {
    if (!out.crashed && server->wait(0) != -1) {
      out.crashed = true;
      std::vector<std::string> again = common;
      again.push_back("--server.port=" + ep.substr(ep.rfind(':') + 1));
      server = std::make_unique<test::Process>(again, std::vector<std::string>{"SYNCOPATE_TOKEN=t", "SYNCOPATE_LOG=warn"},
                                               d.str("server2.log"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < workers; ++w)
    EXPECT_EQ(errors[static_cast<size_t>(w)], "") << "worker " << w << "\n" << test::slurp(d.str("server1.log"))
                                                  << test::slurp(d.str("server2.log"));
  out.stats = nlohmann::json::parse(clients[0]->stats(0));
  clients[0]->shutdown_servers();
  server->wait(10);
  return out;
}

}  // namespace

using SweepCase = std::tuple<std::string, bool, bool>;  // consistency, partitioned, int8
class PsCrashSweep : public ::testing::TestWithParam<SweepCase> {};
INSTANTIATE_TEST_SUITE_P(EveryModeLayoutAndWire, PsCrashSweep,
                         ::testing::Combine(::testing::Values("bsp", "ssp", "asp"), ::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<SweepCase>& i) {
                           return fmt::format("{}_{}_{}", std::get<0>(i.param), std::get<1>(i.param) ? "partitioned" : "whole",
                                              std::get<2>(i.param) ? "int8" : "f32");
                         });

// Each case: one uninterrupted run, then one run per crash point.
TEST_P(PsCrashSweep, ARestartedServerAppliesEveryAcknowledgedClockExactlyOnce) {
  const auto& [consistency, partitioned, int8] = GetParam();
  const int workers = consistency == "asp" ? 1 : 2, parts = partitioned ? 4 : 1;
  const Outcome ref = run_job(consistency, partitioned, int8, "");
  EXPECT_FALSE(ref.crashed);
  for (const char* point : {"received", "applied", "checkpointed", "replied"}) {
    SCOPED_TRACE(point);
    // The crash in the middle of the run: the first push of clock 2 to arrive (pushes are counted
    // per server process, every partition's separately).
    const int64_t n = 2 * workers * parts + 1;
    const Outcome got = run_job(consistency, partitioned, int8, fmt::format("ps_server:{}:{}", point, n));
    EXPECT_TRUE(got.crashed) << "the server never reached " << point << " of push " << n;
    const int64_t updates_per_part = consistency == "bsp" ? kClocks : kClocks * workers;
    EXPECT_EQ(got.stats["updates"], updates_per_part * parts) << got.stats.dump();
    EXPECT_EQ(got.stats["version"], updates_per_part) << got.stats.dump();
    EXPECT_EQ(got.stats["clocks"], ref.stats["clocks"]) << got.stats.dump();
    EXPECT_EQ(got.stats["clocks"], nlohmann::json(std::vector<int64_t>(static_cast<size_t>(workers), kClocks - 1)));
    EXPECT_EQ(got.stats["rejected"], 0);
    if (consistency != "ssp") {  // deterministic: the same weights bit for bit
      for (int w = 0; w < workers; ++w)
        EXPECT_TRUE(torch::equal(got.params[w], ref.params[w]))
            << "worker " << w << ": " << (got.params[w] - ref.params[w]).abs().max().item<double>();
    }
  }
}

// server.checkpoint_background: a real server process writing its snapshots in the background
// (every update asks for one, each write held 0.4 s before its files are renamed into place) is
// killed (SIGKILL) with a write in flight, and restarted on its port from its directory. It resumes
// from the newest complete write (no temporary file is left), the worker (resending while it is
// down) finishes its clocks, and the ledger says what the mode promises: the updates acknowledged
// after the newest complete write are lost, none is applied twice (the server's clocks for the
// worker never go back: the first copy of a push resent after the restore is applied, the others
// are answered as duplicates).
TEST(PsCrashBackground, AServerKilledDuringABackgroundWriteResumesFromTheNewestCompleteOne) {
  for (bool partitioned : {false, true}) {
    SCOPED_TRACE(partitioned ? "partitioned" : "whole");
    test::TempDir d;
    const std::string bin = test::bin_dir() + "/syncopate-server";
    const std::vector<std::string> common = {bin, "--ps.consistency=asp", "--server.checkpoint_dir=" + d.str("ck"),
                                             "--server.checkpoint_every=1", "--server.checkpoint_background=true",
                                             "--server.checkpoint_s=0.4", "--server.encrypt=off"};
    const test::ServerPort port = test::any_server_port(d);
    std::vector<std::string> args = common;
    args.insert(args.end(), port.args.begin(), port.args.end());
    auto server = std::make_unique<test::Process>(args, std::vector<std::string>{"SYNCOPATE_TOKEN=t", "SYNCOPATE_LOG=info"},
                                                  d.str("server1.log"));
    const std::string ep = test::wait_for_line(port.endpoint_file, 60, server.get());
    PsClientOptions o{30};
    o.first_resend_s = 0.3;
    o.partition_elems = partitioned ? 256 : 0;
    PsClient client({ep}, "t", 0, 1, o);
    at::Tensor params = torch::arange(kValues, torch::kFloat) * 0.01;
    client.init(params, {}, AdamWConfig{});  // (waits for the write that holds the new partitions)
    constexpr int kSteps = 30;
    int c = 0;
    for (; c < 12; ++c) {  // about 1.2 s: writes go on back to back
      push_pull(client, gradient(0, c), params, c, 0.01);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const nlohmann::json before = nlohmann::json::parse(client.stats(0));
    ASSERT_GE(before["checkpoint_committed"].get<int64_t>(), 1) << "no background write completed before the kill";
    server->kill_hard();
    server->wait(10);
    std::vector<std::string> again = common;
    again.push_back("--server.port=" + ep.substr(ep.rfind(':') + 1));
    server = std::make_unique<test::Process>(again, std::vector<std::string>{"SYNCOPATE_TOKEN=t", "SYNCOPATE_LOG=info"},
                                             d.str("server2.log"));
    for (; c < kSteps; ++c) push_pull(client, gradient(0, c), params, c, 0.01);  // resends until it is back
    const nlohmann::json after = nlohmann::json::parse(client.stats(0));
    const std::string log2 = test::slurp(d.str("server2.log"));
    const size_t at = log2.find("resumed from");
    ASSERT_NE(at, std::string::npos) << log2;
    const int64_t restored = std::stoll(log2.substr(log2.find("(version ", at) + 9));
    // What the restore held: at least the write committed before the stats above asked, at most what
    // had been applied; the pushes after it were each applied once.
    EXPECT_GE(restored, 1);
    EXPECT_LE(restored, 12);
    // (Copies of the push in flight, resent while the server was down and queued by ZeroMQ, arrive
    // together: `duplicates` counts them, the ledger below says none was applied twice.)
    const int64_t parts = partitioned ? 4 : 1;
    // (Partitioned: the parts' files are renamed one after the other at the end of one write, so a
    // part may hold one write more than the lowest, whose version the log names.)
    const int64_t resumed_updates = after["updates"].get<int64_t>() - (kSteps - 12) * parts;
    EXPECT_GE(resumed_updates, restored * parts) << log2;
    EXPECT_LE(resumed_updates, 12 * parts) << log2;
    EXPECT_EQ(after["clocks"][0].get<int64_t>(), kSteps - 1);
    for (const auto& e : std::filesystem::directory_iterator(d.str("ck")))
      EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
    client.shutdown_servers();
    server->wait(10);
  }
}

// server.checkpoint_background in an elastic job: a join and a FINISH are answered without waiting
// for a write of the state (a record of the membership journal, fsync'ed, holds each). A real server
// process, its writes held 1.5 s, is killed (SIGKILL) right after both were acknowledged, with the
// write that would hold them still in flight, and restarted on its port: it re-delivers them over the
// older snapshot. The joiner is a member counted from its join clock and its pushes are applied; the
// finished worker is out.
TEST(PsCrashBackground, AJoinAndAFinishAcknowledgedBeforeTheWriteSurviveAKill) {
  test::TempDir d;
  const std::string bin = test::bin_dir() + "/syncopate-server";
  const std::vector<std::string> common = {bin, "--ps.consistency=asp", "--ps.worker_timeout_s=1000",
                                           "--server.checkpoint_dir=" + d.str("ck"), "--server.checkpoint_every=1000000",
                                           "--server.checkpoint_background=true", "--server.checkpoint_s=1.5",
                                           "--server.encrypt=off"};
  const test::ServerPort port = test::any_server_port(d);
  std::vector<std::string> args = common;
  args.insert(args.end(), port.args.begin(), port.args.end());
  const std::vector<std::string> env = {"SYNCOPATE_TOKEN=t", "SYNCOPATE_LOG=info"};
  auto server = std::make_unique<test::Process>(args, env, d.str("server1.log"));
  const std::string ep = test::wait_for_line(port.endpoint_file, 60, server.get());
  auto since = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  PsClientOptions o{30};
  o.first_resend_s = 0.3;
  o.elastic = true;
  o.samples_per_step = 4;
  at::Tensor pa = torch::arange(kValues, torch::kFloat) * 0.01, pb = pa.clone(), pc = pa.clone();
  PsClient a({ep}, "t", 0, 2, o), b({ep}, "t", 1, 2, o);
  a.init(pa, {}, AdamWConfig{});  // (the job's start waits for the write that holds the new partition)
  b.init(pb, {}, AdamWConfig{});
  int64_t ca = a.start_clock(), cb = b.start_clock();
  for (int i = 0; i < 3; ++i, ++ca, ++cb) {
    push_pull(a, gradient(0, static_cast<int>(ca)), pa, ca, 0.01);
    push_pull(b, gradient(1, static_cast<int>(cb)), pb, cb, 0.01);
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (nlohmann::json::parse(a.stats(0))["membership_records"].get<int64_t>() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a write holds the first joins: the journal is empty
  ASSERT_EQ(nlohmann::json::parse(a.stats(0))["membership_records"].get<int64_t>(), 0);
  auto t0 = std::chrono::steady_clock::now();
  PsClient c({ep}, "t", 2, 3, o);  // a node that joins the running job
  c.init(pc, {}, AdamWConfig{});
  const double join_s = since(t0);
  t0 = std::chrono::steady_clock::now();
  b.finish(cb - 1);
  const double finish_s = since(t0);
  const nlohmann::json before = nlohmann::json::parse(a.stats(0));
  server->kill_hard();  // the write that would hold the join and the FINISH takes 1.5 s: it is in flight
  server->wait(10);
  EXPECT_LT(join_s, 1.0) << "the join waited for a write of the state";
  EXPECT_LT(finish_s, 1.0) << "the FINISH waited for a write of the state";
  EXPECT_EQ(before["membership_records"].get<int64_t>(), 2) << before.dump();
  std::vector<std::string> again = common;
  again.push_back("--server.port=" + ep.substr(ep.rfind(':') + 1));
  server = std::make_unique<test::Process>(again, env, d.str("server2.log"));
  const int64_t cc = c.start_clock();
  push_pull(c, gradient(2, static_cast<int>(cc)), pc, cc, 0.01);  // (resent until the server is back)
  push_pull(a, gradient(0, static_cast<int>(ca)), pa, ca, 0.01);
  const nlohmann::json after = nlohmann::json::parse(a.stats(0));
  const std::string log2 = test::slurp(d.str("server2.log"));
  EXPECT_NE(log2.find("re-delivered 2 join(s) and FINISH(es)"), std::string::npos) << log2;
  EXPECT_TRUE(after["finished"][1].get<bool>()) << after.dump();
  EXPECT_FALSE(after["live"][1].get<bool>()) << after.dump();
  EXPECT_TRUE(after["live"][2].get<bool>()) << after.dump();
  EXPECT_EQ(after["clocks"][2].get<int64_t>(), cc) << "the joiner's push at its join clock was not applied";
  EXPECT_EQ(after["clocks"][0].get<int64_t>(), ca);
  a.shutdown_servers();
  server->wait(10);
}
