// syncopate-bench-server-update: how fast one parameter-server shard applies updates (parameters
// per second), against what this machine's memory can move, measured in the same run.
//
//   syncopate-bench-server-update [--params N] [--iters K] [--threads T] [--mitigation none|lr_scale|dc_asgd]
//
// An update is ParameterShard::push under ASP: the gradient is taken in, AdamW runs over the
// shard (FlatAdamW), the version advances. AdamW reads parameter, gradient and both moments and
// writes parameter and both moments: at least 28 bytes per parameter. The reference is a STREAM
// triad (a = b + s*c, 12 bytes per element) over arrays of the same size, with the same threads.
// Reported: params/s, the bytes/s that implies at 28 B/param, the triad's bytes/s, and their ratio.
#include <chrono>
#include <iostream>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/check.h"
#include "server/parameter_shard.h"

using namespace syncopate;

int main(int argc, char** argv) {
  CLI::App app{"parameter-server shard update rate vs memory bandwidth"};
  int64_t n = 16 << 20, iters = 20;
  int threads = 1;
  std::string mitigation = "none";
  app.add_option("--params", n, "parameters in the shard")->capture_default_str();
  app.add_option("--iters", iters, "timed updates")->capture_default_str();
  app.add_option("--threads", threads, "ATen intra-op threads (the triad uses as many)")->capture_default_str();
  app.add_option("--mitigation", mitigation, "none, lr_scale or dc_asgd")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    at::set_num_threads(threads);
    using clock = std::chrono::steady_clock;
    auto secs = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };

    PsConfig pc;
    pc.consistency = "asp";
    pc.mitigation = mitigation;
    ParameterShard shard(pc);
    MsgHeader h;
    h.type = static_cast<int>(MsgType::kInit);
    h.workers = 1;
    h.length = n;
    std::vector<float> init(static_cast<size_t>(n), 0.5f), grad(static_cast<size_t>(n), 0.01f);
    shard.init(h, init.data(), nullptr, 0);
    MsgHeader p;
    p.type = static_cast<int>(MsgType::kPushPull);
    p.worker = 0;
    p.length = n;
    p.lr = 1e-3;
    auto push = [&](int64_t i) {
      p.clock = i;
      p.param_version = i;
      shard.push(p, grad.data());
      shard.pulled(0);
    };
    for (int64_t i = 0; i < 3; ++i) push(i);  // warm-up: page in the moments
    auto t0 = clock::now();
    for (int64_t i = 3; i < 3 + iters; ++i) push(i);
    const double update_s = secs(t0, clock::now()) / static_cast<double>(iters);

    at::Tensor a = at::zeros({n}), b = at::ones({n}), c = at::ones({n});
    for (int i = 0; i < 3; ++i) at::add_out(a, b, c, 3.0);
    t0 = clock::now();
    for (int64_t i = 0; i < iters; ++i) at::add_out(a, b, c, 3.0);  // a = b + 3*c
    const double triad_s = secs(t0, clock::now()) / static_cast<double>(iters);

    const double params_per_s = static_cast<double>(n) / update_s;
    const double implied = params_per_s * 28.0, triad = static_cast<double>(n) * 12.0 / triad_s;
    std::cout << "params threads mitigation update_ms params_per_s implied_GBps triad_GBps ratio\n"
              << fmt::format("{} {} {} {:.2f} {:.3e} {:.2f} {:.2f} {:.2f}\n", n, threads, mitigation, update_s * 1e3,
                             params_per_s, implied / 1e9, triad / 1e9, implied / triad);
  } catch (const Error& e) {
    std::cerr << "syncopate-bench-server-update: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
