#!/usr/bin/env bash
# Ring all-reduce benchmark across N local processes, with torch.distributed's Gloo all-reduce on
# the same N and sizes in the same run for comparison. Prints nccl-tests-style tables:
#   size_bytes time_us algbw_GBps busbw_GBps
#
# Usage: scripts/bench_allreduce.sh --nodes N [--local L] [--sizes a,b,...] [--iters K] [--netns --link-gbit G]
#        [--bucket-mb B] [-- extra args]
# --netns: every node in its own network namespace with a G Gbit/s link (needs root).
# --local L: L replicas per node as threads, all-reduced hierarchically, first "sliced"
#   (reduce-scatter in the node, one ring lane per replica, all-gather), then "root" (reduce to
#   replica 0, which rings, broadcast); then, in the same run, the flat ring of N x L processes
#   (L per node) that one-process-per-replica trainers use, then Gloo on N x L.
# --bucket-mb B: every syncopate run sums each buffer as buckets of B MB, as training does; with
#   --local, the sliced hierarchy runs twice: pipelined across buckets, then the buckets one after
#   the other (--serial), so the pipelining's gain is measured in the same run.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib.sh"
NODES=2 SIZES=1048576,4194304,16777216,67108864 ITERS=10 NETNS=0 GBIT=1 GLOO=1 LOCAL=1 BUCKET_MB=0
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=$2; shift 2;;
    --local) LOCAL=$2; shift 2;;
    --sizes) SIZES=$2; shift 2;;
    --iters) ITERS=$2; shift 2;;
    --netns) NETNS=1; shift;;
    --link-gbit) GBIT=$2; shift 2;;
    --no-gloo) GLOO=0; shift;;
    --bucket-mb) BUCKET_MB=$2; shift 2;;
    --) shift; break;;
    *) echo "bench_allreduce.sh: unknown option $1" >&2; exit 2;;
  esac
done
BENCH="$ROOT/build/bin/syncopate-bench-allreduce"
PY="$ROOT/.venv/bin/python"
[ -x "$BENCH" ] || { echo "build first: scripts/build.sh" >&2; exit 2; }
P="sb$$"
cleanup() {  # every rank runs in a process group of its own (spawn): end them all
  trap - EXIT INT TERM
  end_spawned
  [ "$NETNS" = 1 ] && netns_down "$P" "$NODES"
  return 0
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM
if [ "$NETNS" = 1 ]; then
  source "$ROOT/scripts/netns.sh"
  netns_up "$P" "$NODES" "$GBIT"
  export MASTER_ADDR=10.77.0.1
else
  export MASTER_ADDR=127.0.0.1
fi
export SYNCOPATE_TOKEN=bench-$$

run_all() {  # run_all LABEL PER_NODE CMD...: PER_NODE processes per node, prints rank 0's output
  local label=$1 per=$2 i
  shift 2
  export MASTER_PORT=$(free_port) NNODES=$((NODES * per))
  local out pids=()
  out=$(mktemp)
  for i in $(seq 0 $((NNODES - 1))); do
    if [ "$NETNS" = 1 ]; then
      NODE_RANK=$i GLOO_SOCKET_IFNAME="${P}v$((i / per))" spawn ip netns exec "${P}n$((i / per))" "$@" > "$out.$i" 2>&1
    else
      NODE_RANK=$i spawn "$@" > "$out.$i" 2>&1
    fi
    pids+=("${SPAWNED[-1]}")
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  echo "## $label ($NODES nodes x $LOCAL replicas$([ "$NETNS" = 1 ] && echo ", ${GBIT} Gbit/s links" || echo ", loopback"))"
  if [ $rc -ne 0 ]; then cat "$out".*; return $rc; fi
  cat "$out.0"
  rm -f "$out" "$out".*
}
set -- --bucket-mb "$BUCKET_MB" "$@"
if [ "$LOCAL" -gt 1 ]; then
  run_all "syncopate hierarchical sliced ($LOCAL threads per node, $LOCAL ring lanes$([ "$BUCKET_MB" != 0 ] && echo ", $BUCKET_MB MB buckets pipelined"))" 1 "$BENCH" --local "$LOCAL" --sizes "$SIZES" --iters "$ITERS" "$@"
  [ "$BUCKET_MB" != 0 ] && run_all "syncopate hierarchical sliced, $BUCKET_MB MB buckets one after the other" 1 "$BENCH" --local "$LOCAL" --serial --sizes "$SIZES" --iters "$ITERS" "$@"
  run_all "syncopate hierarchical root ($LOCAL threads per node, replica 0 rings)" 1 "$BENCH" --local "$LOCAL" --hierarchy root --sizes "$SIZES" --iters "$ITERS" "$@"
  run_all "syncopate flat ring ($LOCAL processes per node)" "$LOCAL" "$BENCH" --sizes "$SIZES" --iters "$ITERS" "$@"
else
  run_all "syncopate ring" 1 "$BENCH" --sizes "$SIZES" --iters "$ITERS" "$@"
fi
[ "$GLOO" = 1 ] && run_all "torch.distributed gloo ($LOCAL processes per node)" "$LOCAL" "$PY" "$ROOT/scripts/gloo_allreduce.py" --sizes "$SIZES" --iters "$ITERS"
exit 0
