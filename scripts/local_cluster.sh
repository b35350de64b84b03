#!/usr/bin/env bash
# Simulates a cluster of N nodes on this machine: one syncopate-worker per node, joined through
# the torchrun-style environment (MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK) on loopback.
# Each node writes DIR/node<i>/ (metrics, checkpoints) and its log to DIR/logs/node<i>.log.
# All processes are stopped on exit, on Ctrl-C, or as soon as one of them fails.
#
#   scripts/local_cluster.sh --nodes N --out DIR [--port P] [--max-restarts K] [--servers K]
#                            [--consistency bsp|ssp|asp] [--staleness-bound S] [--mitigation M]
#                            [--slow-node I --slowdown F] [--netns --link-gbit G] -- <worker args>
#
# --servers K starts K syncopate-server shards (on node 0's host, ports MASTER_PORT+1..K) and runs
# the workers in ps mode against them; --slow-node I makes node I a straggler (train.slowdown=F).
#
# Each node runs through scripts/launch_node.sh, so --max-restarts K restarts a failed job from
# its latest checkpoints.
#
# --netns gives every node its own network namespace (10.77.0.<i+1>/24) and a G Gbit/s
# rate-limited link (tbf qdisc on both ends of its veth) through a bridge namespace; needs root.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib.sh"
NODES=2 OUT="" PORT="" NETNS=0 GBIT=1 RESTARTS=0 SERVERS=0 CONSISTENCY=asp BOUND=2 MITIGATION=none SLOW=-1 SLOWDOWN=2 WORKER="${SYNCOPATE_WORKER:-$ROOT/build/bin/syncopate-worker}"
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
    --netns) NETNS=1; shift;;
    --link-gbit) GBIT=$2; shift 2;;
    --) shift; break;;
    *) echo "local_cluster.sh: unknown option $1 (see the header of this script)" >&2; exit 2;;
  esac
done
[ -n "$OUT" ] || { echo "local_cluster.sh: --out DIR is required" >&2; exit 2; }
[ -x "$WORKER" ] || { echo "local_cluster.sh: $WORKER not built; run scripts/build.sh" >&2; exit 2; }
export SYNCOPATE_WORKER=$WORKER
mkdir -p "$OUT/logs"
if [ -z "$PORT" ]; then
  PORT=$(free_port)
fi
export SYNCOPATE_TOKEN=${SYNCOPATE_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export NNODES=$NODES MASTER_PORT=$PORT

PIDS=()
SERVER_PIDS=()
NS_PREFIX="sc$$"
cleanup() {
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] || continue
    pkill -P "$p" 2>/dev/null || true  # the node's worker (child of launch_node.sh)
    kill "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  [ "$NETNS" = 1 ] && netns_down "$NS_PREFIX" "$NODES"
  return 0
}
trap cleanup EXIT INT TERM

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
    sport=$((PORT + 1 + k))
    sargs=(--server.host="$MASTER_ADDR" --server.port="$sport" --server.shard="$k" --dist.consistency="$CONSISTENCY"
           --dist.staleness_bound="$BOUND" --dist.mitigation="$MITIGATION")
    if [ "$NETNS" = 1 ]; then
      netns_run "$NS_PREFIX" 0 "$(dirname "$WORKER")/syncopate-server" "${sargs[@]}" > "$OUT/logs/server$k.log" 2>&1 &
    else
      "$(dirname "$WORKER")/syncopate-server" "${sargs[@]}" > "$OUT/logs/server$k.log" 2>&1 &
    fi
    PIDS+=($!)
    SERVER_PIDS+=($!)
    EPS="$EPS${EPS:+,}tcp://$MASTER_ADDR:$sport"
  done
  MODE_ARGS=(--dist.mode=ps --dist.servers="$EPS")
fi

WORKER_PIDS=()
for i in $(seq 0 $((NODES - 1))); do
  NODE_ARGS=("${MODE_ARGS[@]}")
  [ "$i" = "$SLOW" ] && NODE_ARGS+=(--train.slowdown="$SLOWDOWN")
  if [ "$NETNS" = 1 ]; then
    NODE_RANK=$i netns_run "$NS_PREFIX" "$i" "$ROOT/scripts/launch_node.sh" --max-restarts "$RESTARTS" -- --out "$OUT/node$i" "${NODE_ARGS[@]}" "$@" > "$OUT/logs/node$i.log" 2>&1 &
  else
    NODE_RANK=$i "$ROOT/scripts/launch_node.sh" --max-restarts "$RESTARTS" -- --out "$OUT/node$i" "${NODE_ARGS[@]}" "$@" > "$OUT/logs/node$i.log" 2>&1 &
  fi
  PIDS+=($!)
  WORKER_PIDS+=($!)
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
    echo "[cluster] a node failed (exit $status); stopping the others. Logs:" >&2
    for i in $(seq 0 $((NODES - 1))); do echo "--- node $i ---" >&2; tail -n 5 "$OUT/logs/node$i.log" >&2; done
    exit $status
  fi
done
echo "[cluster] all $NODES nodes finished"
for k in $(seq 0 $((SERVERS - 1))); do
  [ "$SERVERS" -gt 0 ] && echo "[cluster] server $k: $(grep -c . "$OUT/logs/server$k.log") log lines"
done
