#!/usr/bin/env bash
# What the overlap-aware pacer buys the ring (issue 25): a 2-node ring on rate-limited links in
# network namespaces (root), the modelled step (emulate.step_time_s) against the ring's time,
# with the gradient buckets released at their modelled moments during the modelled backward
# (emulate.overlap=true, dist.overlap=true) and without overlap (the whole gradient reduced after
# the modelled step), alternating in one invocation. Prints the median step time of each and the
# ratio; the ideal with overlap is about max(compute, forward + ring), without compute + ring.
# Usage: scripts/bench_overlap.sh [--step-time 0.4] [--link-gbit 0.048] [--steps 30] [--bucket-kb 256] [--rounds 2]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STEP=0.4 GBIT=0.048 STEPS=30 BUCKET=256 ROUNDS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --step-time) STEP=$2; shift 2;; --link-gbit) GBIT=$2; shift 2;; --steps) STEPS=$2; shift 2;;
    --bucket-kb) BUCKET=$2; shift 2;; --rounds) ROUNDS=$2; shift 2;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0;;
    *) echo "bench_overlap.sh: unknown option $1 (see --help)" >&2; exit 2;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "bench_overlap.sh: needs root (network namespaces and tbf links)" >&2; exit 2; }
TMP=$(mktemp -d /tmp/bench_overlap.XXXXXX)
trap 'rm -rf "$TMP"' EXIT INT TERM
run() {  # $1: name, $2: overlap true|false
  "$ROOT/scripts/local_cluster.sh" --nodes 2 --out "$TMP/$1" --netns --link-gbit "$GBIT" --step-time "$STEP" -- \
    --model.preset=tiny --train.batch_size=8 --train.steps="$STEPS" --train.threads=1 --train.device=cpu \
    --eval.every=0 --eval.sample_tokens=0 --eval.batches=1 --checkpoint.every=0 --dist.mode=ring --dist.check_every=0 \
    --dist.clip_scope=job --dist.overlap="$2" --emulate.overlap="$2" --dist.bucket_kb="$BUCKET" \
    --dist.first_bucket_kb=$((BUCKET / 4)) --data.cache_dir="$ROOT/data/cache" > "$TMP/$1.log" 2>&1 \
    || { cat "$TMP/$1.log" >&2; exit 1; }
}
for r in $(seq 1 "$ROUNDS"); do run "on$r" true; run "off$r" false; done
"$ROOT/.venv/bin/python" - "$TMP" "$ROUNDS" "$STEP" "$GBIT" <<'PYEOF'
import json, statistics, sys
tmp, rounds, step, gbit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
def med(name):
    m = [json.loads(l) for l in open(f"{tmp}/{name}/node0/metrics.jsonl")]
    return statistics.median([x["step_s"] for x in m if "step_s" in x][3:])
on = [med(f"on{r}") for r in range(1, rounds + 1)]
off = [med(f"off{r}") for r in range(1, rounds + 1)]
print(f"| modelled step s | link Gbit/s | overlap on: median step s | off | off / on |")
print("|---|---|---|---|---|")
for a, b in zip(on, off):
    print(f"| {step} | {gbit} | {a:.3f} | {b:.3f} | {b / a:.2f} |")
PYEOF
