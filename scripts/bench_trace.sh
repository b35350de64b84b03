#!/usr/bin/env bash
# Cost of --trace.file: a 2-node ring (loopback) of the `small` preset trained with every process
# tracing and without, alternating (off, on, off, on, ...) so that both see the same machine.
# Prints each pair's median step time and the on/off ratio, then the mean ratio with its 95% interval,
# and the direct cost: events per node-step x the cost of one event (syncopate-bench-trace).
# Usage: scripts/bench_trace.sh [--pairs 4] [--steps 30] [--preset small] [--batch 8] [--mode ring|ps]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PAIRS=4 STEPS=30 PRESET=small BATCH=8 MODE=ring
while [ $# -gt 0 ]; do
  case "$1" in
    --pairs) PAIRS=$2; shift 2;; --steps) STEPS=$2; shift 2;; --preset) PRESET=$2; shift 2;;
    --batch) BATCH=$2; shift 2;; --mode) MODE=$2; shift 2;;
    *) echo "bench_trace.sh: unknown option $1" >&2; exit 2;;
  esac
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
EXTRA=()
[ "$MODE" = ps ] && EXTRA=(--servers 2 --consistency bsp)
run() {  # OUT [--trace]
  local out=$1; shift
  "$ROOT/scripts/local_cluster.sh" --nodes 2 "${EXTRA[@]}" "$@" --out "$out" -- --model.preset="$PRESET" \
    --train.batch_size="$BATCH" --train.steps="$STEPS" --train.threads=1 --eval.every=0 --eval.sample_tokens=0 \
    --eval.batches=1 --checkpoint.every=0 --dist.check_every=0 --schedule.warmup_steps=2 \
    --data.cache_dir="$ROOT/data/cache" > "$out.log" 2>&1
}
for p in $(seq 1 "$PAIRS"); do
  run "$TMP/off$p"
  run "$TMP/on$p" --trace
done
python3 - "$TMP" "$PAIRS" <<'PY'
import json, os, statistics, sys
tmp, pairs = sys.argv[1], int(sys.argv[2])
def median_step(d):
    m = [json.loads(l) for l in open(os.path.join(d, "node0", "metrics.jsonl"))]
    return statistics.median([x["step_s"] for x in m if "step_s" in x and x["step"] > 3])
ratios = []
for p in range(1, pairs + 1):
    off, on = median_step(f"{tmp}/off{p}"), median_step(f"{tmp}/on{p}")
    ratios.append(on / off)
    size = os.path.getsize(f"{tmp}/on{p}/trace.json")
    ev = json.load(open(f"{tmp}/on{p}/trace.json"))["traceEvents"]
    per_step = sum(1 for e in ev if e.get("ph") == "X") / sum(1 for e in ev if e.get("name") == "step")
    print(f"pair {p}: step {off * 1e3:.1f} ms off, {on * 1e3:.1f} ms on, ratio {on / off:.4f} "
          f"(merged trace {size / 1e6:.2f} MB, {per_step:.1f} events per node-step)")
m = statistics.mean(ratios)
t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36}.get(len(ratios), 2.0)
h = t * statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else float("nan")
print(f"tracing on / off: {m:.4f} +- {h:.4f} (95% interval over {len(ratios)} pairs)")
print("cost per event (multiply by the events per node-step above):")
PY
"$ROOT/build/bin/syncopate-bench-trace"
