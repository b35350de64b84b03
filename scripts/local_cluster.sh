#!/usr/bin/env bash
# Simulates a cluster of N nodes on this machine: one syncopate-worker per node, joined through
# the torchrun-style environment (MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK) on loopback.
# Each node writes DIR/node<i>/ (metrics, checkpoints) and its log to DIR/logs/node<i>.log.
# All processes are stopped on exit, on Ctrl-C, or as soon as one of them fails: each node and
# server runs in its own process group, and the whole group is ended (namespaces removed too).
#
# Usage: scripts/local_cluster.sh --nodes N --out DIR [--port P] [--max-restarts K] [--servers K]
#                            [--consistency bsp|ssp|asp] [--staleness-bound S] [--mitigation M]
#                            [--backup-workers B] [--step-time S [--slow-node I --slowdown F [--slow-steps N]]
#                            [--jitter X]] [--encrypt auto|off]
#                            [--netns --link-gbit G [--link-burst-ms B]] [--latency-ms L] [--trace] [--probe]
#                            -- <worker args>
#
# --servers K starts K syncopate-server shards (each on a free port it reports in
# OUT/logs/server<k>.endpoint; on node 0's host, or with --netns shard k on host k mod N) and runs
# the workers in ps mode against them; --backup-workers B (bsp) applies a clock without the last B.
# --encrypt auto (default) encrypts the ps links with CURVE keys derived from the job token; off: plain TCP.
# --step-time S models each node's compute: a step lasts S seconds (emulate.step_time_s), node I
# S*F (--slow-node I --slowdown F), every step times (1 + an exponential draw of mean X) with
# --jitter X. The modelled time is fixed per step, never a multiple of the measured compute.
# --slow-steps N gives the slow node N optimizer steps instead of the others' train.steps (an
# asynchronous job's budget is wall time: the straggler does fewer steps in it).
#
# Each node runs through scripts/launch_node.sh, so --max-restarts K restarts a failed job from
# its latest checkpoints.
#
# --trace writes every node's and server's timeline (OUT/logs/trace_*.json, --trace.file) and, once
# all have stopped, merges them into OUT/trace.json (scripts/merge_traces.py; open it in Perfetto).
#
# --latency-ms L gives every link L ms of one-way propagation latency (a userspace delay line: the
# kernels here have no netem): ring nodes hold each message they receive L ms (emulate.latency_ms),
# ps servers hold each message in and out L ms (server.latency_ms), so a ring hop and a push or reply
# each take L ms more.
#
# --probe starts syncopate-probe instead of the worker on every node (same emulation, links and
# arguments): node 0 writes OUT/probe.json for scripts/syncopate-advise. With --servers K
# --consistency bsp the K shards start as for a job and the probe also times the parameter-server
# round trip of the model's size, every node at once.
#
# --netns gives every node its own network namespace (10.77.0.<i+1>/24) and a G Gbit/s
# rate-limited link (tbf qdisc on both ends of its veth) through a bridge namespace; needs root.
# --link-burst-ms B sets that tbf's bucket to B ms of the rate (SYNCOPATE_TBF_BURST_MS, scripts/netns.sh;
# default 8): what an idle link passes at the veth's speed. 1 is closer to a real NIC, which never
# passes a part of a message above its line rate (docs/STUDY.md, sessions 42-43).
# At the end OUT/logs/netstats.txt holds each link's tbf counters (bytes, drops) and each node's TCP
# retransmissions: what the emulated links did beyond bytes over rate.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib.sh"
NODES=2 OUT="" PORT="" NETNS=0 GBIT=1 RESTARTS=0 SERVERS=0 CONSISTENCY=asp BOUND=2 MITIGATION=none BACKUP=0
SLOW=-1 SLOWDOWN=2 SLOW_STEPS=0 STEP_TIME=0 JITTER=0 ENCRYPT=auto TRACE=0 LATENCY=0 BURST="" PROBE=0 WORKER="${SYNCOPATE_WORKER:-$ROOT/build/bin/syncopate-worker}"
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=$2; shift 2;;
    --out) OUT=$2; shift 2;;
    --port) PORT=$2; shift 2;;
    --max-restarts) RESTARTS=$2; shift 2;;
    --servers) SERVERS=$2; shift 2;;
    --consistency) CONSISTENCY=$2; shift 2;;
    --staleness-bound) BOUND=$2; shift 2;;
    --mitigation) MITIGATION=$2; shift 2;;
    --slow-node) SLOW=$2; shift 2;;
    --slowdown) SLOWDOWN=$2; shift 2;;
    --step-time) STEP_TIME=$2; shift 2;;
    --slow-steps) SLOW_STEPS=$2; shift 2;;
    --jitter) JITTER=$2; shift 2;;
    --backup-workers) BACKUP=$2; shift 2;;
    --encrypt) ENCRYPT=$2; shift 2;;
    --netns) NETNS=1; shift;;
    --trace) TRACE=1; shift;;
    --probe) PROBE=1; shift;;
    --link-gbit) GBIT=$2; shift 2;;
    --latency-ms) LATENCY=$2; shift 2;;
    --link-burst-ms) BURST=$2; shift 2;;
    --) shift; break;;
    *) echo "local_cluster.sh: unknown option $1 (see the header of this script)" >&2; exit 2;;
  esac
done
[ -n "$OUT" ] || { echo "local_cluster.sh: --out DIR is required" >&2; exit 2; }
[ -x "$WORKER" ] || { echo "local_cluster.sh: $WORKER not built; run scripts/build.sh" >&2; exit 2; }
if [ "$SLOW" -ge 0 ] && [ "$STEP_TIME" = 0 ]; then
  echo "local_cluster.sh: --slow-node needs --step-time S (the modelled step time that --slowdown multiplies)" >&2; exit 2
fi
if [ "$PROBE" = 1 ] && [ "$SERVERS" != 0 ] && { [ "$CONSISTENCY" != bsp ] || [ "$BACKUP" != 0 ]; }; then
  echo "local_cluster.sh: --probe with --servers times BSP round trips (every node at once): give --consistency bsp and no --backup-workers" >&2; exit 2
fi
if [ -n "$BURST" ]; then
  [ "$NETNS" = 1 ] || { echo "local_cluster.sh: --link-burst-ms sets the emulated links' tbf bucket: give --netns --link-gbit G too" >&2; exit 2; }
  export SYNCOPATE_TBF_BURST_MS=$BURST  # netns.sh checks it (a number of ms) before creating anything
fi
export SYNCOPATE_WORKER=$WORKER
mkdir -p "$OUT/logs"
if [ -z "$PORT" ]; then
  PORT=$(free_port)
fi
export SYNCOPATE_TOKEN=${SYNCOPATE_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export NNODES=$NODES MASTER_PORT=$PORT

PIDS=()
NS_PREFIX="sc$$"
# Every node and server is started by `spawn` (scripts/lib.sh): a process group of its own that
# holds everything it starts (launch_node.sh's worker, `ip netns exec`'s child); cleanup ends
# whole groups (servers log their statistics on the SIGTERM) and removes the namespaces.
cleanup() {
  trap - EXIT INT TERM
  end_spawned
  # The links' counters and TCP's retransmissions, before the namespaces (and they) go.
  [ "$NETNS" = 1 ] && [ -d "$OUT/logs" ] && netns_stats "$NS_PREFIX" "$NODES" > "$OUT/logs/netstats.txt" 2>&1
  [ "$NETNS" = 1 ] && netns_down "$NS_PREFIX" "$NODES"
  if [ "$TRACE" = 1 ] && compgen -G "$OUT/logs/trace_*.json" > /dev/null; then
    python3 "$ROOT/scripts/merge_traces.py" "$OUT/trace.json" "$OUT"/logs/trace_*.json > "$OUT/logs/trace_merge.log" 2>&1 ||
      echo "[cluster] merging the traces failed: $OUT/logs/trace_merge.log" >&2
  fi
  return 0
}
on_signal() { echo "[cluster] interrupted: stopping every node and server" >&2; cleanup; exit 130; }
trap cleanup EXIT
trap on_signal INT TERM

if [ "$NETNS" = 1 ]; then
  source "$ROOT/scripts/netns.sh"
  netns_up "$NS_PREFIX" "$NODES" "$GBIT"
  export MASTER_ADDR=10.77.0.1
else
  export MASTER_ADDR=127.0.0.1
fi

MODE_ARGS=(--dist.mode=ring)
if [ "$SERVERS" -gt 0 ]; then
  EPS=""
  for k in $(seq 0 $((SERVERS - 1))); do
    shost=$MASTER_ADDR
    # With namespaces, shard k lives on host k mod N (colocated with a worker, as ps-lite and
    # BytePS deploy them), so the servers' links add up with the workers' instead of one host's
    # link carrying every push.
    [ "$NETNS" = 1 ] && shost="10.77.0.$((k % NODES + 1))"
    # Any free port: the server writes the endpoint it bound once it listens (no port is picked
    # in advance, so nothing can take it in between), and the workers start after every shard is up.
    rm -f "$OUT/logs/server$k.endpoint"
    sargs=(--server.host="$shost" --server.port=-1 --server.endpoint_file="$OUT/logs/server$k.endpoint" --server.shard="$k"
           --ps.consistency="$CONSISTENCY" --ps.staleness_bound="$BOUND" --ps.mitigation="$MITIGATION"
           --ps.backup_workers="$BACKUP" --server.encrypt="$ENCRYPT" --server.latency_ms="$LATENCY")
    [ "$TRACE" = 1 ] && sargs+=(--trace.file="$OUT/logs/trace_server$k.json")
    if [ "$NETNS" = 1 ]; then
      spawn ip netns exec "${NS_PREFIX}n$((k % NODES))" "$(dirname "$WORKER")/syncopate-server" "${sargs[@]}" > "$OUT/logs/server$k.log" 2>&1
    else
      spawn "$(dirname "$WORKER")/syncopate-server" "${sargs[@]}" > "$OUT/logs/server$k.log" 2>&1
    fi
    PIDS+=("${SPAWNED[-1]}")
  done
  for k in $(seq 0 $((SERVERS - 1))); do
    for _ in $(seq 1 600); do  # up to 60 s
      [ -s "$OUT/logs/server$k.endpoint" ] && break
      kill -0 "${PIDS[$k]}" 2>/dev/null || { echo "[cluster] server $k exited before listening:" >&2; cat "$OUT/logs/server$k.log" >&2; exit 1; }
      sleep 0.1
    done
    [ -s "$OUT/logs/server$k.endpoint" ] || { echo "[cluster] server $k did not start listening within 60 s" >&2; exit 1; }
    EPS="$EPS${EPS:+,}$(head -n1 "$OUT/logs/server$k.endpoint")"
  done
  MODE_ARGS=(--dist.mode=ps --dist.servers="$EPS" --dist.ps_encrypt="$ENCRYPT")
fi

# ps: the servers hold the latency; the probe's own ring (and its round trips) always needs it.
{ [ "$SERVERS" = 0 ] || [ "$PROBE" = 1 ]; } && [ "$LATENCY" != 0 ] && MODE_ARGS+=(--emulate.latency_ms="$LATENCY")
WORKER_PIDS=()
for i in $(seq 0 $((NODES - 1))); do
  NODE_ARGS=("${MODE_ARGS[@]}")
  if [ "$STEP_TIME" != 0 ]; then
    NODE_ARGS+=(--emulate.step_time_s="$STEP_TIME" --emulate.jitter="$JITTER")
    [ "$i" = "$SLOW" ] && NODE_ARGS+=(--emulate.slowdown="$SLOWDOWN")
  fi
  [ "$TRACE" = 1 ] && NODE_ARGS+=(--trace.file="$OUT/logs/trace_node$i.json")
  LAST_ARGS=()  # after the shared worker arguments, so that they win
  [ "$i" = "$SLOW" ] && [ "$SLOW_STEPS" -gt 0 ] && LAST_ARGS+=(--train.steps="$SLOW_STEPS")
  if [ "$PROBE" = 1 ]; then
    CMD=("$(dirname "$WORKER")/syncopate-probe" --out "$OUT/probe.json" "${NODE_ARGS[@]}" "$@" "${LAST_ARGS[@]}")
  else
    CMD=("$ROOT/scripts/launch_node.sh" --max-restarts "$RESTARTS" -- --out "$OUT/node$i" "${NODE_ARGS[@]}" "$@" "${LAST_ARGS[@]}")
  fi
  if [ "$NETNS" = 1 ]; then
    NODE_RANK=$i spawn ip netns exec "${NS_PREFIX}n$i" "${CMD[@]}" > "$OUT/logs/node$i.log" 2>&1
  else
    NODE_RANK=$i spawn "${CMD[@]}" > "$OUT/logs/node$i.log" 2>&1
  fi
  PIDS+=("${SPAWNED[-1]}")
  WORKER_PIDS+=("${SPAWNED[-1]}")
done
echo "[cluster] $NODES nodes, rendezvous $MASTER_ADDR:$PORT, logs in $OUT/logs/"
[ -t 1 ] && tail -n +1 -f "$OUT/logs/node0.log" --pid "${PIDS[0]}" &

declare -A LIVE
for p in "${WORKER_PIDS[@]}"; do LIVE[$p]=1; done
while [ ${#LIVE[@]} -gt 0 ]; do
  done_pid=""
  if wait -n -p done_pid "${!LIVE[@]}"; then
    unset "LIVE[$done_pid]"
  else
    status=$?
    if [ "$PROBE" = 1 ]; then  # the others end by themselves (their ring fails), node 0 writing what it has
      unset "LIVE[$done_pid]"
      PROBE_STATUS=${PROBE_STATUS:-$status}
      continue
    fi
    echo "[cluster] a node failed (exit $status); stopping the others. Logs:" >&2
    for i in $(seq 0 $((NODES - 1))); do echo "--- node $i ---" >&2; tail -n 5 "$OUT/logs/node$i.log" >&2; done
    exit $status
  fi
done
[ "$PROBE" = 1 ] || echo "[cluster] all $NODES nodes finished"
if [ "$PROBE" = 1 ]; then
  cat "$OUT/logs/node0.log"
  if [ -n "${PROBE_STATUS:-}" ]; then
    echo "[cluster] a node failed (exit $PROBE_STATUS); node 0's probe.json, if written, is partial. Logs:" >&2
    for i in $(seq 0 $((NODES - 1))); do echo "--- node $i ---" >&2; tail -n 5 "$OUT/logs/node$i.log" >&2; done
    exit "$PROBE_STATUS"
  fi
  echo "[cluster] probe: $OUT/probe.json (next: scripts/syncopate-advise $OUT/probe.json)"
  exit 0
fi
for k in $(seq 0 $((SERVERS - 1))); do
  [ "$SERVERS" -gt 0 ] && echo "[cluster] server $k: $(grep -c . "$OUT/logs/server$k.log") log lines"
done
# How the run ended, on one screen: per node its steps, final validation loss, tokens/s and bytes
# (from its metrics.jsonl), then where the files are.
python3 - "$OUT" "$NODES" <<'PY' || echo "[cluster] (no summary: the metrics could not be read)"
import json, os, sys
out, nodes = sys.argv[1], int(sys.argv[2])
print(f"[cluster] summary of {out}:")
print(f"  {'node':>4} {'steps':>6} {'final val loss':>14} {'tokens/s':>10} {'sent MB':>9} {'received MB':>11}")
total_tps = total_sent = 0.0
for i in range(nodes):
    steps, val, tokens, time_s, sent, received = 0, None, 0, 0.0, 0, 0
    try:
        for line in open(os.path.join(out, f"node{i}", "metrics.jsonl")):
            m = json.loads(line)
            if "val_loss" in m:
                val = m["val_loss"]
            elif "loss" in m:
                steps, tokens, time_s = m["step"], m.get("tokens", 0), m.get("time_s", 0.0)
                sent += m.get("wire_bytes", 0)
                received += m.get("wire_bytes_received", 0)
    except OSError:
        print(f"  {i:>4} (no metrics.jsonl)")
        continue
    tps = tokens / time_s if time_s > 0 else 0.0
    total_tps += tps
    total_sent += sent
    vl = f"{val:.4f}" if val is not None else "-"
    print(f"  {i:>4} {steps:>6} {vl:>14} {tps:>10.0f} {sent / 1e6:>9.2f} {received / 1e6:>11.2f}")
print(f"  all nodes: {total_tps:.0f} tokens/s, {total_sent / 1e6:.2f} MB sent")
print(f"  files: {out}/node<i>/metrics.jsonl, samples.txt, checkpoints/; logs: {out}/logs/")
PY
