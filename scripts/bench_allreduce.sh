#!/usr/bin/env bash
# Ring all-reduce benchmark across N local processes, with torch.distributed's Gloo all-reduce on
# the same N and sizes in the same run for comparison. Prints nccl-tests-style tables:
#   size_bytes time_us algbw_GBps busbw_GBps
#
#   scripts/bench_allreduce.sh --nodes N [--sizes a,b,...] [--iters K] [--netns --link-gbit G] [-- extra args]
# --netns: every process in its own network namespace with a G Gbit/s link (needs root).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib.sh"
NODES=2 SIZES=1048576,4194304,16777216,67108864 ITERS=10 NETNS=0 GBIT=1 GLOO=1
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=$2; shift 2;;
    --sizes) SIZES=$2; shift 2;;
    --iters) ITERS=$2; shift 2;;
    --netns) NETNS=1; shift;;
    --link-gbit) GBIT=$2; shift 2;;
    --no-gloo) GLOO=0; shift;;
    --) shift; break;;
    *) echo "bench_allreduce.sh: unknown option $1" >&2; exit 2;;
  esac
done
BENCH="$ROOT/build/bin/syncopate-bench-allreduce"
PY="$ROOT/.venv/bin/python"
[ -x "$BENCH" ] || { echo "build first: scripts/build.sh" >&2; exit 2; }
P="sb$$"
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  [ "$NETNS" = 1 ] && netns_down "$P" "$NODES"
  return 0
}
trap cleanup EXIT INT TERM
if [ "$NETNS" = 1 ]; then
  source "$ROOT/scripts/netns.sh"
  netns_up "$P" "$NODES" "$GBIT"
  export MASTER_ADDR=10.77.0.1
else
  export MASTER_ADDR=127.0.0.1
fi
export NNODES=$NODES SYNCOPATE_TOKEN=bench-$$

run_all() {  # run_all LABEL CMD...: one process per node, prints node 0's output
  local label=$1 i
  shift
  export MASTER_PORT=$(free_port)
  PIDS=()
  local out
  out=$(mktemp)
  for i in $(seq 0 $((NODES - 1))); do
    if [ "$NETNS" = 1 ]; then
      NODE_RANK=$i GLOO_SOCKET_IFNAME="${P}v$i" netns_run "$P" "$i" "$@" > "$out.$i" 2>&1 &
    else
      NODE_RANK=$i "$@" > "$out.$i" 2>&1 &
    fi
    PIDS+=($!)
  done
  local rc=0
  for p in "${PIDS[@]}"; do wait "$p" || rc=$?; done
  PIDS=()
  echo "## $label ($NODES nodes$([ "$NETNS" = 1 ] && echo ", ${GBIT} Gbit/s links" || echo ", loopback"))"
  if [ $rc -ne 0 ]; then cat "$out".*; return $rc; fi
  cat "$out.0"
  rm -f "$out" "$out".*
}
run_all "syncopate ring" "$BENCH" --sizes "$SIZES" --iters "$ITERS" "$@"
[ "$GLOO" = 1 ] && run_all "torch.distributed gloo" "$PY" "$ROOT/scripts/gloo_allreduce.py" --sizes "$SIZES" --iters "$ITERS"
exit 0
