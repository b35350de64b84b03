#!/usr/bin/env bash
# Soak test of the parameter servers under load (loopback, bounded in time): W workers push and
# pull as fast as they can against K shards (ASP, CURVE from the job token as by default) for M
# minutes. Reports updates/s, round-trip p50/p99 over all workers, each server's resident memory
# after warm-up and at the end, and the ledger: every shard must have applied exactly the pushes
# the workers made (ASP applies each on arrival; a resend is dropped as a duplicate), none lost,
# none twice. Exits 1 if the ledger does not balance.
#
# Usage: scripts/soak_ps.sh [--workers 16] [--servers 2] [--minutes 3] [--bytes 1048576]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib.sh"
W=16 K=2 MIN=3 BYTES=1048576
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) W=$2; shift 2;; --servers) K=$2; shift 2;; --minutes) MIN=$2; shift 2;; --bytes) BYTES=$2; shift 2;;
    *) echo "soak_ps.sh: unknown option $1 (see the header of this script)" >&2; exit 2;;
  esac
done
BIN="${SYNCOPATE_BIN:-$ROOT/build/bin}"
SECS=$(awk -v m="$MIN" 'BEGIN { printf "%d", m * 60 }')
OUT=$(mktemp -d /tmp/syncopate-soak.XXXXXX)
cleanup() { trap - EXIT INT TERM; end_spawned; return 0; }
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM
export SYNCOPATE_TOKEN=soak-$$ NNODES=$W
PORT=$(free_port)
EPS="" SERVER_PIDS=()
for k in $(seq 0 $((K - 1))); do
  spawn "$BIN/syncopate-server" --server.port=$((PORT + k)) --server.shard="$k" --ps.consistency=asp --ps.worker_timeout_s=600 \
    > "$OUT/server$k.log" 2>&1
  SERVER_PIDS+=("${SPAWNED[-1]}")
  EPS="$EPS${EPS:+,}tcp://127.0.0.1:$((PORT + k))"
done
rss() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }
WORKER_PIDS=()
for i in $(seq 0 $((W - 1))); do
  NODE_RANK=$i spawn "$BIN/syncopate-bench-ps" --servers "$EPS" --bytes "$BYTES" --seconds "$SECS" > "$OUT/w$i" 2>&1
  WORKER_PIDS+=("${SPAWNED[-1]}")
done
sleep 10
START_RSS=()
for p in "${SERVER_PIDS[@]}"; do START_RSS+=("$(rss "$p")"); done
for p in "${WORKER_PIDS[@]}"; do wait "$p" || { echo "soak_ps.sh: a worker failed:"; cat "$OUT"/w*; exit 1; }; done
END_RSS=()
for p in "${SERVER_PIDS[@]}"; do END_RSS+=("$(rss "$p")"); done
"$BIN/syncopate-bench-ps" --servers "$EPS" --stats > "$OUT/stats"
python3 - "$OUT" "$W" "$K" "$MIN" "$BYTES" "${START_RSS[*]}" "${END_RSS[*]}" <<'PY'
import glob, json, os, sys
out, W, K, minutes, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
start, end = sys.argv[6].split(), sys.argv[7].split()
pushes, lat = 0, []
for f in glob.glob(os.path.join(out, "w*")):
    for line in open(f):
        p = line.split()
        if p and p[0] == "latency":
            pushes += int(p[2]); lat.append((float(p[3]), float(p[4]), float(p[5])))
stats = [json.loads(l) for l in open(os.path.join(out, "stats"))]
secs = minutes * 60
print(f"soak: {W} workers x {K} shards, {nbytes} bytes per push, {minutes:g} min, CURVE on")
print(f"  pushes by the workers: {pushes} ({pushes / secs:.1f} round trips/s in all)")
print(f"  round trip: p50 {sorted(x[0] for x in lat)[len(lat) // 2]:.1f} ms (median worker), "
      f"p99 {max(x[1] for x in lat):.1f} ms (worst worker), max {max(x[2] for x in lat):.1f} ms")
ok = True
for k, s in enumerate(stats):
    bal = s["updates"] == pushes and s["version"] == pushes
    ok = ok and bal
    print(f"  shard {k}: updates {s['updates']}, version {s['version']}, duplicates {s['duplicates']}, "
          f"bad {s['bad_messages']}, rejected {s['rejected']}; ledger {'balanced' if bal else 'OFF'}; "
          f"RSS {start[k]} MiB after 10 s -> {end[k]} MiB at the end")
sys.exit(0 if ok else 1)
PY
