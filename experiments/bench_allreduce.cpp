// syncopate-bench-allreduce: times the ring all-reduce across the nodes of a job, nccl-tests style.
// Run one process per node with MASTER_ADDR/MASTER_PORT/NNODES/NODE_RANK/SYNCOPATE_TOKEN set
// (scripts/bench_allreduce.sh does this). Node 0 prints one row per size:
//   size_bytes time_us algbw_GBps busbw_GBps
// algbw = size / time; busbw = algbw * 2(n-1)/n (the bytes each link really carries).
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/check.h"
#include "common/job_token.h"
#include "common/rendezvous.h"
#include "common/ring_allreduce.h"
#include "worker/dist_config.h"

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
  CLI11_PARSE(app, argc, argv);
  try {
    DistConfig dc;
    dc.mode = "ring";
    dc.timeout_s = 120;
    dc.streams = streams;
    resolve_from_environment(dc);
    Ring ring = connect_ring(rendezvous_options(dc, job_token_from_environment(), "bench"));
    RingAllreduceOptions opt;
    opt.bf16_wire = bf16;
    opt.segment_bytes = static_cast<size_t>(segment_kb) << 10;
    const int n = ring.world;
    RingAllreducer ar(ring.rank, n, *ring.next, *ring.prev);  // as the trainer does: made once, reused
    auto barrier = [&] {
      float x = 0;
      ar.sum(&x, 1);
    };
    if (ring.rank == 0) std::cout << "size_bytes time_us algbw_GBps busbw_GBps\n";
    std::stringstream ss(sizes);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
      const size_t bytes = std::stoull(tok), count = bytes / 4;
      std::vector<float> buf(count, 1.0f);
      for (int i = 0; i < warmup; ++i) ar.sum(buf.data(), count, opt);
      barrier();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) ar.sum(buf.data(), count, opt);
      barrier();
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
      const double alg = bytes / us / 1e3;
      if (ring.rank == 0)
        std::cout << fmt::format("{} {:.1f} {:.3f} {:.3f}", bytes, us, alg, alg * 2.0 * (n - 1) / n) << std::endl;
    }
  } catch (const Error& e) {
    std::cerr << "syncopate-bench-allreduce: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
