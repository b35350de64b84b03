// syncopate-bench-allreduce: times the ring all-reduce across the nodes of a job, nccl-tests style.
// Run one process per node with MASTER_ADDR/MASTER_PORT/NNODES/NODE_RANK/SYNCOPATE_TOKEN set
// (scripts/bench_allreduce.sh does this). Node 0 prints one row per size:
//   size_bytes time_us algbw_GBps busbw_GBps
// algbw = size / time; busbw = algbw * 2(n-1)/n (the bytes each link really carries), n counting
// every replica. With --local L each process runs L CPU replicas as threads and all-reduces
// hierarchically (NodeAllreduce: reduce-scatter in the process, one ring lane per replica,
// all-gather), as a node of L GPUs does; scripts/bench_allreduce.sh --local L compares that
// with a flat ring of nodes x L processes in the same run. --bucket-mb B cuts each buffer into
// buckets as training does and pipelines them (--serial: one after the other, for comparison).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <future>
#include <iostream>
#include <optional>
#include <sstream>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/check.h"
#include "common/comm/job_token.h"
#include "common/comm/rendezvous.h"
#include "common/comm/ring_allreduce.h"
#include "worker/sync/dist_config.h"
#include "common/comm/local_group.h"
#include "common/comm/node_allreduce.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

using namespace syncopate;

int main(int argc, char** argv) {
  CLI::App app{"ring all-reduce benchmark"};
  std::string sizes = "1048576,4194304,16777216,67108864";
  int iters = 10, warmup = 3;
  bool bf16 = false;
  int64_t segment_kb = 256;
  app.add_option("--sizes", sizes, "comma-separated buffer sizes, bytes");
  app.add_option("--iters", iters, "timed iterations per size");
  app.add_option("--warmup", warmup, "untimed iterations per size");
  app.add_option("--segment-kb", segment_kb, "pipelining segment, KiB");
  app.add_flag("--bf16-wire", bf16, "send bfloat16");
  int64_t streams = 1;
  app.add_option("--streams", streams, "TCP streams per neighbour");
  int local = 1;
  app.add_option("--local", local, "replicas per process (threads), reduced hierarchically");
  std::string hierarchy = "sliced";
  app.add_option("--hierarchy", hierarchy, "with --local: sliced (a ring lane per replica) or root (replica 0 rings)");
  double bucket_mb = 0;
  app.add_option("--bucket-mb", bucket_mb,
                 "cut each buffer into buckets of this many MB (from its end, as backward produces gradients), "
                 "pipelined across buckets (NodeAllreduce::submit/drain); 0 = one sum of the whole buffer");
  std::string device = "cpu";
  app.add_option("--device", device, "cpu, or cuda: replica l's buffer on GPU l (with --local L, an NCCL group over GPUs 0..L-1)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  std::string op = "all_reduce";
  app.add_option("--op", op, "all_reduce (across nodes and replicas); reduce_scatter or all_gather: inside one node's "
                             "replicas only (--local L >= 2, one process)")
      ->check(CLI::IsMember({"all_reduce", "reduce_scatter", "all_gather"}));
  bool serial = false;
  app.add_flag("--serial", serial, "with --bucket-mb: sum the buckets one after the other (NodeAllreduce::sum)");
  double latency_ms = 0;
  app.add_option("--latency-ms", latency_ms, "emulated one-way latency held on every received message (delay line), ms");
  CLI11_PARSE(app, argc, argv);
  try {
    DistConfig dc;
    dc.mode = "ring";
    dc.timeout_s = 120;
    dc.streams = streams;
    resolve_from_environment(dc);
    RendezvousOptions ro = rendezvous_options(dc, job_token_from_environment(), "bench");
    const Hierarchy h = parse_hierarchy(hierarchy);
    ro.lanes = ring_lanes(h, local);
    ro.latency_s = latency_ms / 1e3;
    Ring ring = connect_ring(ro);
    RingAllreduceOptions opt;
    opt.wire = bf16 ? WireFormat::kBf16 : WireFormat::kF32;
    opt.segment_bytes = static_cast<size_t>(segment_kb) << 10;
    const int n = ring.world * local;
    const bool cuda = device == "cuda";
    std::vector<int> gpus;
    for (int l = 0; cuda && local > 1 && l < local; ++l) gpus.push_back(l);
    std::shared_ptr<LocalGroup> group(local > 1 ? make_local_group(local, gpus, dc.timeout_s) : nullptr);
    SYN_CHECK(op == "all_reduce" || (group && ring.world == 1),
              "--op " + op + " is an in-node collective: it needs --local L >= 2 and one process (NNODES=1)",
              "use --op all_reduce across nodes");
    // busbw as nccl-tests reports it: all-reduce moves 2(n-1)/n of the buffer per rank, the others (n-1)/n.
    const double bus = (op == "all_reduce" ? 2.0 : 1.0) * (n - 1) / std::max(n, 1);
    if (ring.rank == 0) std::cout << "size_bytes time_us algbw_GBps busbw_GBps\n";
    std::vector<size_t> all;
    std::stringstream ss(sizes);
    for (std::string tok; std::getline(ss, tok, ',');) all.push_back(std::stoull(tok));
    // Replica l of this process: its ring lane made once and reused, as the trainer does.
    auto replica = [&](int l) {
      std::unique_ptr<RingAllreducer> lane;
      if (ring.world > 1 && rings(h, l))
        lane = std::make_unique<RingAllreducer>(ring.rank, ring.world, ring.next_of(l), ring.prev_of(l));
      std::optional<c10::DeviceGuard> on;  // this replica's GPU current on its thread
      if (cuda) on.emplace(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(l)));
      const at::TensorOptions where = cuda ? at::TensorOptions().device(at::kCUDA, l) : at::TensorOptions();
      NodeAllreduce ar(group.get(), l, lane.get(), ring.world, h);
      at::Tensor one = at::zeros({1}, where);
      // Every replica of every node at the same point, its device work done (the clock reads after it).
      auto barrier = [&] {
        ar.sum(one, opt);
        if (group) group->barrier(l);
        if (cuda) (void)one.item<float>();
      };
      const int64_t bucket = static_cast<int64_t>(bucket_mb * (1 << 20) / 4);  // elements
      auto sum_all = [&](at::Tensor& buf) {
        if (op == "reduce_scatter") return group->reduce_scatter_sum(l, buf);
        if (op == "all_gather") return group->all_gather(l, buf);
        if (bucket <= 0) return ar.sum(buf, opt);
        for (int64_t hi = buf.numel(); hi > 0; hi -= bucket) {
          at::Tensor b = buf.slice(0, std::max<int64_t>(0, hi - bucket), hi);
          serial ? ar.sum(b, opt) : ar.submit(b, opt);
        }
        ar.drain();
      };
      for (size_t bytes : all) {
        at::Tensor buf = at::ones({static_cast<int64_t>(bytes / 4)}, where);
        for (int i = 0; i < warmup; ++i) sum_all(buf);
        barrier();
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) sum_all(buf);
        barrier();
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
        const double alg = bytes / us / 1e3;
        if (ring.rank == 0 && l == 0)
          std::cout << fmt::format("{} {:.1f} {:.3f} {:.3f}", bytes, us, alg, alg * bus) << std::endl;
      }
    };
    std::vector<std::future<void>> threads;
    for (int l = 1; l < local; ++l) threads.push_back(std::async(std::launch::async, replica, l));
    replica(0);
    for (auto& t : threads) t.get();
  } catch (const Error& e) {
    std::cerr << "syncopate-bench-allreduce: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
