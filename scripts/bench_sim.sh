#!/usr/bin/env bash
# The simulator's cost per simulated worker-step against the plain trainer's cost per step, in the
# same run: syncopate-worker trains the same model alone (the reference: one forward and backward
# plus AdamW per step), then syncopate-sim runs W virtual workers for S steps each, alternating
# (trainer, sim, trainer, sim, ...) so both see the same machine. Prints per pair the trainer's mean
# step time, the simulator's real seconds per worker-step, their ratio, and where the simulator's
# time went (gradients, update rules, evaluation, the rest: scheduling, links, copies, metrics).
# Usage: scripts/bench_sim.sh [--pairs 2] [--workers 64] [--steps 200] [--preset tiny] [--batch 2]
#                        [--mode ps|ring] [--consistency asp] [--servers 8] [-- extra syncopate-sim flags]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PAIRS=2 WORKERS=64 STEPS=200 PRESET=tiny BATCH=2 MODE=ps CONSISTENCY=asp SERVERS=8
while [ $# -gt 0 ]; do
  case "$1" in
    --pairs) PAIRS=$2; shift 2;; --workers) WORKERS=$2; shift 2;; --steps) STEPS=$2; shift 2;;
    --preset) PRESET=$2; shift 2;; --batch) BATCH=$2; shift 2;; --mode) MODE=$2; shift 2;;
    --consistency) CONSISTENCY=$2; shift 2;; --servers) SERVERS=$2; shift 2;;
    --) shift; break;;
    *) echo "bench_sim.sh: unknown option $1" >&2; exit 2;;
  esac
done
TMP=$(mktemp -d /tmp/bench_sim.XXXXXX)
trap 'rm -rf "$TMP"' EXIT INT TERM
COMMON=(--model.preset="$PRESET" --train.batch_size="$BATCH" --train.threads=1 --eval.sample_tokens=0
        --eval.batches=1 --schedule.warmup_steps=5 --data.cache_dir="$ROOT/data/cache")
for p in $(seq 1 "$PAIRS"); do
  "$ROOT/build/bin/syncopate-worker" --out "$TMP/trainer$p" "${COMMON[@]}" --train.steps="$STEPS" --eval.every=0 \
    --checkpoint.every=0 > "$TMP/trainer$p.log" 2>&1
  "$ROOT/build/bin/syncopate-sim" --out "$TMP/sim$p" --quiet "${COMMON[@]}" --train.steps="$STEPS" \
    --eval.every=$((STEPS / 10)) --sim.workers="$WORKERS" --sim.servers="$SERVERS" --dist.mode="$MODE" \
    --ps.consistency="$CONSISTENCY" --emulate.step_time_s=0.1 "$@" > "$TMP/sim$p.log" 2>&1
done
python3 - "$TMP" "$PAIRS" "$WORKERS" "$STEPS" "$PRESET" "$BATCH" "$MODE" "$CONSISTENCY" "$*" <<'PY'
import json, os, statistics, sys
tmp, pairs, workers, steps, preset, batch, mode, cons, extra = sys.argv[1:]
print(f"syncopate-sim vs syncopate-worker: {workers} workers x {steps} steps, {preset}, batch {batch}, {mode}"
      f"{' ' + cons if mode == 'ps' else ''}, one thread{' ' + extra if extra else ''}")
print("pair | trainer s/step | sim real s/worker-step | ratio | gradients | update rules | eval | rest | sim total s")
ratios = []
for p in range(1, int(pairs) + 1):
    m = [json.loads(l) for l in open(os.path.join(tmp, f"trainer{p}", "metrics.jsonl")) if "step_s" in l]
    trainer = statistics.mean(x["step_s"] for x in m if x["step"] > 5)
    s = json.load(open(os.path.join(tmp, f"sim{p}", "sim.json")))
    per = s["real_s_per_worker_step"]
    ratios.append(per / trainer)
    tot = s["real_s"]
    print(f"{p} | {trainer * 1e3:.2f} ms | {per * 1e3:.2f} ms | {per / trainer:.3f} | {s['gradient_s'] / tot:.1%} | "
          f"{s['update_s'] / tot:.1%} | {s['eval_s'] / tot:.1%} | {s['overhead_share']:.1%} | {tot:.1f}")
print(f"mean ratio {statistics.mean(ratios):.3f} (sim real seconds per worker-step / trainer seconds per step)")
PY
