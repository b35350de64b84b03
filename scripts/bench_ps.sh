#!/usr/bin/env bash
# Parameter-server push-and-pull throughput: W worker processes x K server shards, each worker
# pushing a gradient of --bytes and pulling the parameters back, --iters times. BSP off (asp), so
# workers do not wait for each other. Prints one line per worker and the aggregate.
# Usage: scripts/bench_ps.sh [--workers W] [--servers K] [--bytes B] [--iters N] [--netns --link-gbit G]
#                       [--encrypt auto|off] [--partition-mb M]
# --encrypt auto (default, as a real job): CURVE with keys derived from the job token; off: plain TCP.
# --netns: servers and workers each on their own emulated host with a G Gbit/s link (root).
# --partition-mb M: each shard's range travels in partitions of at most M MiB, pushed, applied and
#   pulled back on their own (dist.ps_partition_mb; default 4, as a worker's); 0 = whole shards, push
#   then pull (also what a build from before partitions does: compare it with SYNCOPATE_BIN=... and 0).
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib.sh"
W=1 K=1 BYTES=67108864 ITERS=10 NETNS=0 GBIT=1 ENCRYPT=auto PART=4
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) W=$2; shift 2;; --servers) K=$2; shift 2;; --bytes) BYTES=$2; shift 2;;
    --iters) ITERS=$2; shift 2;; --netns) NETNS=1; shift;; --link-gbit) GBIT=$2; shift 2;;
    --encrypt) ENCRYPT=$2; shift 2;; --partition-mb) PART=$2; shift 2;;
    *) echo "unknown option $1" >&2; exit 2;;
  esac
done
BIN="${SYNCOPATE_BIN:-$ROOT/build/bin}"  # SYNCOPATE_BIN: another build to compare
P="pb$$"
OUT=""
cleanup() {  # servers and workers run in process groups of their own (spawn): end them all
  trap - EXIT INT TERM
  end_spawned
  [ "$NETNS" = 1 ] && netns_down "$P" $((W + K))
  [ -n "$OUT" ] && rm -rf "$OUT"  # the workers' outputs, also when interrupted
  return 0
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM
export SYNCOPATE_TOKEN=bench-$$ NNODES=$W
[ "$NETNS" = 1 ] && { source "$ROOT/scripts/netns.sh"; netns_up "$P" $((W + K)) "$GBIT"; }
run_on() {  # run_on HOST CMD...: spawned on host HOST of the namespace layout, or on loopback
  local h=$1; shift
  if [ "$NETNS" = 1 ]; then spawn ip netns exec "${P}n$h" "$@"; else spawn "$@"; fi
}
EPS=""
for k in $(seq 0 $((K - 1))); do
  host=127.0.0.1; [ "$NETNS" = 1 ] && host=10.77.0.$((k + 1))
  port=$(free_port)
  run_on "$k" "$BIN/syncopate-server" --server.host="$host" --server.port="$port" --server.shard="$k" --server.encrypt="$ENCRYPT" > /dev/null 2>&1
  EPS="$EPS${EPS:+,}tcp://$host:$port"
done
sleep 0.5
OUT=$(mktemp -d "/tmp/syncopate-bench-ps.$$.XXXXXX")  # named by this PID: tests check it is gone
WP=()
for i in $(seq 0 $((W - 1))); do
  NODE_RANK=$i run_on $((K + i)) "$BIN/syncopate-bench-ps" --servers "$EPS" --bytes "$BYTES" --iters "$ITERS" --encrypt "$ENCRYPT" \
    $([ "$PART" != 0 ] && echo "--partition-mb $PART") > "$OUT/w$i" 2>&1
  WP+=("${SPAWNED[-1]}")
done
for p in "${WP[@]}"; do wait "$p"; done
echo "# $W workers x $K servers, $BYTES bytes, $([ "$NETNS" = 1 ] && echo "${GBIT} Gbit/s links" || echo loopback), partitions of ${PART} MiB (0 = whole shards)"
echo "worker bytes iters time_s push_pull_GBps updates_per_s"
cat "$OUT"/w*
awk '{s+=$5} END {printf "aggregate push_pull_GBps %.3f\n", s}' "$OUT"/w*
