// How this process joins the other replicas of the job. Empty/zero fields are filled from the
// environment the way torchrun and Slurm set it (see resolve_from_environment).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/comm/rendezvous.h"

namespace syncopate {

struct DistConfig {
  std::string mode = "none";     // "none": one replica; "ring": synchronous ring all-reduce between nodes;
                                 // "ps": push/pull to sharded parameter servers (consistency set on the servers);
                                 // "auto": what syncopate-advise recommended for this cluster (the file `advice`)
  std::string advice = "advice.json";  // mode "auto": the advice file of experiments/advise.py (scripts/syncopate-advise);
                                 // its recommended [dist] flags are applied at start (worker/sync/advice.h)
  int64_t readvise_every = 0;    // mode "auto": steps between the job's decisions whether to re-advise and switch
                                 // (worker/train/readvise.h): a node drifted from the advice -> node 0's launcher
                                 // re-runs it; a new pick -> every node checkpoints and restarts in it. Decided at
                                 // the multiples of it where every node stands (local SGD: round ends too); 0 = off
                                 // (the run only logs drift). Needs the ring or ring local SGD at the time
  std::string master_addr = "";  // node 0's IP; "" = $MASTER_ADDR, else the first host of $SLURM_JOB_NODELIST... , else 127.0.0.1
  int64_t master_port = 0;       // rendezvous TCP port on node 0; 0 = $MASTER_PORT, else 29500; -1 = any free port,
                                 // published through rendezvous_file
  std::string rendezvous_file = "";  // with master_port -1: node 0 writes the port it got here (atomically) and the
                                 // other nodes wait for the file (a shared filesystem: tests, one-host launchers,
                                 // Slurm jobs on a shared home). Use a fresh path per job: a file left by an
                                 // earlier job would point the other nodes at a dead port until node 0 rewrites it
  std::string launch = "auto";   // how the launcher laid out processes (docs/ARCHITECTURE.md, "Launch layouts"):
                                 // "node": one process per node drives the node's GPUs (local_replicas of them);
                                 // "gpu": one process per GPU, as torchrun --nproc-per-node=G or srun
                                 // --ntasks-per-node=G start them: each process is a node of the job with one
                                 // replica, on GPU $LOCAL_RANK (else $SLURM_LOCALID); "auto": gpu when the launcher
                                 // started several processes on this host ($LOCAL_WORLD_SIZE > 1, or Slurm tasks
                                 // outnumbering nodes), else node
  int64_t nnodes = 0;            // nodes (processes) in the job; 0 = $NNODES, else $WORLD_SIZE, else $SLURM_NTASKS, else 1
  int64_t node_rank = -1;        // this node; -1 = $NODE_RANK, else $RANK, else $SLURM_PROCID, else 0
  int64_t device = -1;           // launch=gpu: this process's CUDA device; -1 = $LOCAL_RANK, else $SLURM_LOCALID
                                 // (launch=node takes devices 0..local_replicas-1)
  int64_t local_replicas = 0;    // replicas on this node, one thread each: 0 = one per visible GPU (CUDA_VISIBLE_DEVICES),
                                 // or 1 on CPU; N = the first N GPUs, or N CPU replicas (a multi-GPU node in miniature;
                                 // they share the process's train.threads intra-op threads)
  std::string hierarchy = "sliced";  // several local replicas and nodes: "sliced" = reduce-scatter in the node, each
                                 // replica rings its slice over its own TCP lane, all-gather; "root" = reduce to
                                 // replica 0, which rings the whole buffer, broadcast (the simpler scheme, to compare)
  double timeout_s = 60;         // rendezvous deadline and the longest a peer may stay silent, seconds
  double local_timeout_s = 600;  // several local replicas: the longest one waits for the others at a collective or
                                 // for its device (NCCL calls, copies, barriers), seconds; past it the replica fails
                                 // naming the wait. Local replica 0 alone evaluates and checkpoints while the others
                                 // wait at their next collective: keep it above the longest evaluation + checkpoint
  int64_t check_every = 100;     // steps between checks that all replicas hold identical weights; 0 = off
  std::string wire = "f32";      // how gradients and pseudo-gradients travel between nodes: "f32"; "bf16" / "fp16"
                                 // (half the bytes, round to nearest even; fp16 fails naming a value beyond
                                 // +-65504); "int8" (ps only: a scale per 4096 values, with error feedback on
                                 // the sender). Replies (the servers' weights) are f32
  int64_t segment_kb = 256;      // ring pipelining segment, KiB
  int64_t streams = 1;           // ring: TCP streams per neighbour (messages striped across them)
  bool overlap = true;           // ring: reduce gradient buckets during backward (as DDP does)
  int64_t bucket_kb = 25600;     // ring: bucket size cap, KiB (DDP's 25 MiB)
  int64_t first_bucket_kb = 1024;  // ring: the first bucket (last layers' gradients) is smaller, so communication starts early
  std::string clip_scope = "auto";  // which gradient optim.grad_clip bounds: "job" = the job's mean gradient (what
                                 // DDP and the ring do); "node" = each node's own gradient, before it is combined
                                 // (what parameter servers do: BSP then averages clipped node gradients);
                                 // "auto" = node in ps mode, else job. A ring with "node" combines after
                                 // backward (no bucket overlap), so an A/B of ring and BSP can clip alike.
  int64_t sync_every = 1;        // local SGD / DiLoCo: inner optimizer steps between synchronizations of the nodes
                                 // (H). 1 = every step (the per-step modes, unchanged). Inside a node the local
                                 // replicas still average every step; inner AdamW state stays on the node
  std::string outer = "nesterov";  // with sync_every > 1, how the nodes' mean pseudo-gradient (start - now) is applied:
                                 // "average" = the replicas' mean weights (local SGD); "nesterov" = DiLoCo's outer SGD;
                                 // "delayed_nesterov" (ps, asynchronous arrivals): momentum updated once per
                                 // outer_delay arrivals with their mean (common/outer_optimizer.h)
  double outer_lr = 0.7;         // nesterov: outer learning rate (DiLoCo's 0.7)
  double outer_momentum = 0.9;   // nesterov: outer momentum (DiLoCo's 0.9)
  int64_t outer_delay = 0;       // delayed_nesterov: arrivals per momentum update; 0 = the number of nodes
                                 // (dist.elastic: the servers' live members at each arrival, as they join and leave)
  bool ps_overlap = false;       // ps: push/pull on a communication thread while the next step computes
                                 // (one more step of staleness); false = wait for the own round trip
  bool ps_push_in_backward = false;  // ps: push each shard's gradient range as soon as backward finishes it
  double ps_partition_mb = 4;    // ps: each shard's range travels in partitions of at most this many MiB of float32
                                 // values (BytePS's 4 MB), each pushed, applied and pulled back on its own, so a
                                 // worker's link carries one partition's pull while the next one's push goes out and
                                 // the server applies one while the next arrives (docs/PERFORMANCE.md: 1.8x the
                                 // round trip of whole shards on 1 Gbit/s); a shard that fits is one message as
                                 // before; 0 = whole shards always (push, then pull)
  std::string curve_server_key = "";  // ps: the servers' CURVE public key (Z85) from a key file; "" = see ps_encrypt
  std::string ps_encrypt = "auto";   // ps: "auto" = CURVE with the servers' key derived from the job token when one
                                     // is set (as syncopate-server --server.encrypt=auto does); "off" = plain TCP
  bool elastic = false;          // the job's membership may change while it runs. ring (one replica per node): the
                                 // nodes keep a session with syncopate-rendezvous (at MASTER_ADDR:MASTER_PORT); at a
                                 // step boundary a join, a leave (SIGTERM) or a lost node re-forms the ring without
                                 // restarting anyone, every member taking the state of the one furthest along; a lost
                                 // node's share of the global batch is dropped (the lr per step unchanged).
                                 // ps (per-step): (docs/PROTOCOL.md,
                                 // "Joining a running job"): a node joins at the job's clock (node_rank may be
                                 // >= nnodes), pulls the current weights, and takes its data from the servers'
                                 // grants (each sample once, whoever comes and goes); a leaving node (SIGTERM, FINISH)
                                 // is counted out at once. Every node of the job must set it alike
  int64_t min_nodes = 1;         // elastic ring: the fewest nodes the ring goes on with; below it the nodes wait (and
                                 // say for whom) up to min_nodes_wait_s
  double min_nodes_wait_s = 600; // elastic ring: the longest a re-formation waits (below min_nodes), seconds; also the
                                 // longest a joiner waits for the members' next boundary (elastic local SGD: the next
                                 // round's end, so set it above a round's duration)
  double reform_wait_s = 10;     // elastic ring: how long a re-formation waits for a member that neither comes nor
                                 // dies (hung); also the rendezvous service's silence limit for a node's session, seconds.
                                 // Elastic local SGD waits at least dist.timeout_s (members reach a round's end up to a
                                 // round's drift apart)
  std::string servers = "";      // ps: comma-separated server endpoints, tcp://IP:PORT,...; shard k = k-th

  template <class V>
  void fields(V& v) {
    v("mode", mode, "data-parallel mode (auto = the recommendation in dist.advice)",
      std::vector<std::string>{"none", "ring", "ps", "auto"});
    v("advice", advice, "mode=auto: advice.json written by scripts/syncopate-advise (its recommended [dist] flags apply)");
    v("readvise_every", readvise_every, "mode=auto: steps between decisions to re-advise on drift and switch to a "
      "new pick at a checkpoint (0 = off; worker/train/readvise.h)", int64_t{0}, int64_t{1} << 40);
    v("launch", launch, "process layout: one process per node (node), per GPU (gpu), or from the launcher (auto)",
      std::vector<std::string>{"auto", "node", "gpu"});
    v("device", device, "launch=gpu: CUDA device of this process (-1 = LOCAL_RANK / SLURM_LOCALID)", int64_t{-1},
      int64_t{1023});
    v("master_addr", master_addr, "node 0's IP address (default $MASTER_ADDR or 127.0.0.1)");
    v("master_port", master_port, "rendezvous port on node 0 (0 = $MASTER_PORT or 29500; -1 = any free port, see rendezvous_file)",
      int64_t{-1}, int64_t{65535});
    v("rendezvous_file", rendezvous_file, "with master_port=-1: file through which node 0 tells the others its port");
    v("nnodes", nnodes, "nodes in the job (0 = $NNODES / $SLURM_NTASKS / 1)", int64_t{0}, int64_t{4096});
    v("node_rank", node_rank, "this node's rank (-1 = $NODE_RANK / $SLURM_PROCID / 0)", int64_t{-1}, int64_t{4095});
    v("local_replicas", local_replicas, "replicas on this node, one thread each (0 = every visible GPU, or 1 on CPU)",
      int64_t{0}, int64_t{64});
    v("hierarchy", hierarchy, "ring with several local replicas: sliced (a ring lane per replica) or root (replica 0 rings)",
      std::vector<std::string>{"sliced", "root"});
    v("timeout_s", timeout_s, "rendezvous deadline and peer silence limit, seconds", 0.1, 86400.0);
    v("local_timeout_s", local_timeout_s, "longest a local replica waits for the others or its device, seconds", 0.1,
      86400.0);
    v("check_every", check_every, "steps between replica-identity checks (0 = off)", int64_t{0}, int64_t{1} << 40);
    v("wire", wire, "gradient / pseudo-gradient wire format between nodes (int8: ps only)",
      std::vector<std::string>{"f32", "bf16", "fp16", "int8"});
    v("segment_kb", segment_kb, "ring pipelining segment, KiB", int64_t{1}, int64_t{1} << 20);
    v("streams", streams, "ring: TCP streams per neighbour (same on every node)", int64_t{1}, int64_t{16});
    v("overlap", overlap, "ring: all-reduce gradient buckets while backward runs");
    v("bucket_kb", bucket_kb, "ring: gradient bucket cap, KiB", int64_t{1}, int64_t{1} << 24);
    v("first_bucket_kb", first_bucket_kb, "ring: first gradient bucket cap, KiB", int64_t{1}, int64_t{1} << 24);
    v("clip_scope", clip_scope, "gradient clipping bounds the job's mean (job) or each node's gradient (node); auto = node in ps",
      std::vector<std::string>{"auto", "job", "node"});
    v("sync_every", sync_every, "local SGD / DiLoCo: inner steps between node synchronizations (1 = every step)",
      int64_t{1}, int64_t{1} << 30);
    v("outer", outer, "sync_every > 1: outer update (average = mean weights; nesterov = DiLoCo; delayed_nesterov = "
      "async DiLoCo's momentum once per outer_delay arrivals)",
      std::vector<std::string>{"average", "nesterov", "delayed_nesterov"});
    v("outer_delay", outer_delay, "delayed_nesterov: arrivals per momentum update (0 = the nodes; dist.elastic: the live members)", int64_t{0},
      int64_t{1} << 20);
    v("outer_lr", outer_lr, "nesterov outer learning rate", 0.0, 100.0);
    v("outer_momentum", outer_momentum, "nesterov outer momentum", 0.0, 0.999999);
    v("ps_overlap", ps_overlap, "ps: overlap push/pull with the next step (one more step of staleness)");
    v("ps_partition_mb", ps_partition_mb,
      "ps: partitions of at most this many MiB per shard, pushed and pulled in a pipeline (0 = whole shard)", 0.0,
      65536.0);
    v("ps_push_in_backward", ps_push_in_backward,
      "ps: push each shard's gradient as backward finishes it (needs optim.grad_clip=0, ps_overlap=false)");
    v("curve_server_key", curve_server_key, "ps: servers' CURVE public key (Z85, 40 chars); empty = derived from the job token (ps_encrypt=auto, the default)");
    v("ps_encrypt", ps_encrypt, "ps: CURVE from the job token (auto) or plain TCP (off)",
      std::vector<std::string>{"auto", "off"});
    v("elastic", elastic, "nodes may join and leave the running job (ps: the servers grant the data order; ring: "
      "the ring re-forms through syncopate-rendezvous at MASTER_ADDR:MASTER_PORT)");
    v("min_nodes", min_nodes, "elastic ring: fewest nodes it goes on with (below: waits, naming the missing)", int64_t{1},
      int64_t{4096});
    v("min_nodes_wait_s", min_nodes_wait_s, "elastic ring: longest wait below min_nodes, seconds", 0.1, 1e7);
    v("reform_wait_s", reform_wait_s, "elastic ring: wait for a member that neither comes nor dies, seconds", 0.1, 3600.0);
    v("servers", servers, "ps mode: parameter-server endpoints tcp://IP:PORT, comma-separated");
  }
};

// Fills unset fields from MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK (ours), WORLD_SIZE, RANK,
// LOCAL_RANK, LOCAL_WORLD_SIZE (torchrun) or SLURM_PROCID, SLURM_NTASKS, SLURM_NNODES, SLURM_LOCALID,
// SLURM_NTASKS_PER_NODE, SLURM_JOB_NODELIST (Slurm), then defaults, and decides the launch layout
// (launch=gpu: local_replicas 1 on `device`). Refuses layouts that contradict the launcher by name.
// mode "none" forces one node. Idempotent.
void resolve_from_environment(DistConfig& c);

// After resolve_from_environment: a warning for a layout that works but is slow, else "". One
// process per GPU with several on one host (torchrun --nproc-per-node=8) makes every GPU a node of
// the job: their gradients meet over the inter-node transport through host memory, not NCCL.
std::string launch_layout_warning(const DistConfig& c);

// For --print-config: the values resolve_from_environment gives nnodes, node_rank, master_addr and
// master_port here, each with where it came from ("$NNODES", "dist.nnodes", "the default", ...).
// Throws what resolve_from_environment throws.
struct ResolvedField {
  std::string field, value, source;
};
std::vector<ResolvedField> explain_resolution(const DistConfig& c);

// The elastic ring's rendezvous service (syncopate-rendezvous) of a resolved config: MASTER_ADDR
// and MASTER_PORT (-1: the port the service wrote to rendezvous_file, waited for up to timeout_s).
std::pair<std::string, uint16_t> rendezvous_service_address(const DistConfig& c);

// Rendezvous settings of a resolved config (ring mode and the ring benchmark).
RendezvousOptions rendezvous_options(const DistConfig& c, const std::string& token, const std::string& fingerprint);

}  // namespace syncopate
