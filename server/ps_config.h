// The parameter servers' rules ([ps]: consistency, staleness, mitigation) and the server process ([server]).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace syncopate {

struct PsConfig {
  std::string consistency = "asp";  // "bsp": wait for every worker's gradient of a clock, apply the mean once;
                                    // "ssp": apply on arrival, hold a worker more than staleness_bound clocks
                                    // ahead of the slowest; "asp": apply every push on arrival
  int64_t staleness_bound = 2;      // SSP bound s, clocks
  std::string mitigation = "none";  // "none", "lr_scale" (lr / staleness), "dc_asgd" (delay compensation)
  double dc_lambda = 0.04;          // DC-ASGD lambda
  int64_t backup_workers = 0;       // BSP only (Chen et al. 2016): apply a clock once all live workers but this many
                                    // have pushed it (the mean of those that came); a gradient computed on parameters
                                    // older than the shard's is late: dropped, counted, and answered with the new
                                    // parameters at once. Needs workers that wait for their round trip: ps_overlap is refused at INIT
  double max_grad_norm = 0;         // a push whose gradient (this shard's range) has a larger L2 norm is refused
                                    // with an ERROR and counted (`rejected`), like a non-finite one; 0 = no bound
  double worker_timeout_s = 30;     // a worker silent this long (no push, pull or heartbeat) leaves the
                                    // BSP/SSP count so the others continue; it rejoins when it speaks again

  template <class V>
  void fields(V& v) {
    v("consistency", consistency, "parameter-server consistency", std::vector<std::string>{"bsp", "ssp", "asp"});
    v("staleness_bound", staleness_bound, "SSP bound, clocks", int64_t{0}, int64_t{1} << 20);
    v("mitigation", mitigation, "staleness mitigation", std::vector<std::string>{"none", "lr_scale", "dc_asgd"});
    v("dc_lambda", dc_lambda, "DC-ASGD lambda", 0.0, 100.0);
    v("backup_workers", backup_workers, "BSP: apply a clock without the last this-many workers (less than the workers)",
      int64_t{0}, int64_t{4095});
    v("max_grad_norm", max_grad_norm, "refuse pushes whose gradient norm on this shard exceeds this (0 = off)", 0.0,
      1e30);
    v("worker_timeout_s", worker_timeout_s, "seconds of silence after which a worker is considered dead", 0.1, 86400.0);
  }
};

struct ServerConfig {
  std::string host = "127.0.0.1";  // address to listen on (only this one); a host name listens on the IPv4 address it resolves to
  int64_t port = 0;                // TCP port; 0 = $MASTER_PORT + 1 + shard (any free port without MASTER_PORT);
                                   // -1 = any free port (the OS picks; endpoint_file tells which)
  int64_t shard = 0;               // this server's index (for the default port and logs)
  std::string endpoint_file = "";  // once listening, the bound endpoint (tcp://IP:PORT) is written here atomically,
                                   // so launchers and tests wait for readiness and learn the port; "" = none
  std::string curve_key_file = ""; // CURVE encryption: file with this server's "PUBLIC SECRET" Z85 keys
                                   // (syncopate-server --generate-curve-keys writes one); "" = plain TCP
  std::string encrypt = "auto";    // "auto": CURVE with keys derived from the job token when one is set (SYNCOPATE_TOKEN;
                                   // not the insecure default) and no curve_key_file; "off": plain TCP
  std::string checkpoint_dir = ""; // where shard_<shard>.safetensors is kept; "" = no checkpoints
  int64_t checkpoint_every = 500;  // updates between checkpoints (one is also written on SHUTDOWN)
  bool checkpoint_background = false;  // true: a checkpoint is a snapshot (a copy of the state, on the request path)
                                       // written by a thread of its own while requests go on; the replies that must
                                       // not leave before what they acknowledge is durable (a join, a FINISH) wait for
                                       // the write that holds it; updates acknowledged since the newest complete write
                                       // are what a crash loses. false: written on the request path, replies after it
  double checkpoint_s = 0;         // emulation: modelled time of one checkpoint of this server's whole range, seconds,
                                   // held before it is renamed into place (a large model's write; 0 = its real duration)
  bool exit_when_done = false;     // exit (after a checkpoint) once every worker has sent FINISH or died, at least one
                                   // finished: a shard started per node by scripts/launch_node.sh ends with its job
  int64_t threads = 1;             // intra-op threads of the shard's update; 0 = LibTorch's default (all cores).
                                   // 1 keeps several shards on one host from spinning on each other's cores
                                   // (measured: 4 shards + 4 workers on 2 cores, ASP push/pull 143 ms -> 4 ms)
  double latency_ms = 0;           // emulation: one-way propagation delay of the links to this server, milliseconds:
                                   // every message in and out is held this long (a userspace delay line, ZmqDelayLine;
                                   // no netem here), so a push/reply round trip takes 2 x latency_ms more; 0 = none

  template <class V>
  void fields(V& v) {
    v("host", host, "IP address (or host name) to listen on");
    v("port", port, "TCP port (0 = MASTER_PORT + 1 + shard, or any free port without MASTER_PORT; -1 = any free port, see endpoint_file)", int64_t{-1},
      int64_t{65535});
    v("endpoint_file", endpoint_file, "file that receives the bound endpoint once listening (readiness and port)");
    v("shard", shard, "server index", int64_t{0}, int64_t{4095});
    v("curve_key_file", curve_key_file, "CURVE key file (PUBLIC SECRET, Z85); empty = keys derived from the job token (encrypt=auto, the default)");
    v("encrypt", encrypt, "CURVE from the job token (auto) or plain TCP (off)", std::vector<std::string>{"auto", "off"});
    v("checkpoint_dir", checkpoint_dir, "directory for shard checkpoints; a restarted server resumes from it");
    v("checkpoint_every", checkpoint_every, "updates between shard checkpoints", int64_t{1}, int64_t{1} << 40);
    v("checkpoint_background", checkpoint_background,
      "write checkpoints from a snapshot on a thread of their own, off the request path");
    v("checkpoint_s", checkpoint_s,
      "emulation: modelled duration of one checkpoint of the server's range, held before it commits, seconds (0 = real)",
      0.0, 86400.0);
    v("exit_when_done", exit_when_done, "exit once every worker has finished (FINISH) or died");
    v("threads", threads, "intra-op threads of the shard's update (0 = all cores)", int64_t{0}, int64_t{4096});
    v("latency_ms", latency_ms, "emulation: one-way delay of every message in and out of this server, ms (0 = none)",
      0.0, 60000.0);
  }
};

}  // namespace syncopate
