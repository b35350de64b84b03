#!/usr/bin/env bash
# Loader overhead per training step: trains the `tiny` preset for --steps steps and reads the
# trainer's own per-step timings from metrics.jsonl (data_s: assembling the batch from the
# memory-mapped tokens; step_s: the whole step). Prints their means and the ratio.
# Usage: scripts/bench_loader.sh [--steps N] [-- extra syncopate-worker arguments, e.g. --data.train_file=PREFIX]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STEPS=60
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2;;
    --) shift; break;;
    *) echo "unknown option $1" >&2; exit 2;;
  esac
done
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
"$ROOT/build/bin/syncopate-worker" --out "$OUT/run" --model.preset=tiny --train.steps="$STEPS" --eval.every=0 \
  --eval.sample_every=0 --checkpoint.every=0 --train.log_every=1000000 "$@" > "$OUT/log" 2>&1 || { cat "$OUT/log"; exit 1; }
python3 - "$OUT/run/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"data_s"' in l][5:]  # skip warm-up steps
import statistics as st
d = [r["data_s"] for r in rows]
s = [r["step_s"] for r in rows]
print(f"steps {len(rows)}  step ms: mean {st.mean(s) * 1e3:.2f} median {st.median(s) * 1e3:.2f}  "
      f"data ms: mean {st.mean(d) * 1e3:.4f} median {st.median(d) * 1e3:.4f} max {max(d) * 1e3:.3f}  "
      f"data/step: {100 * sum(d) / sum(s):.3f}% of the time (median step {100 * st.median(d) / st.median(s):.3f}%)")
PY
