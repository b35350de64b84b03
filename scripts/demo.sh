#!/usr/bin/env bash
# The main job on its embedded default: sets up (if needed), builds, and runs a short A/B of
# synchronous vs asynchronous training on an emulated cluster of this machine: 4 nodes (processes on
# loopback, compute modelled so that each node behaves like a machine with its own accelerator),
# node 3 three times slower with 10% jitter, ring all-reduce vs ASP under an equal wall-time budget
# of 20 emulated seconds (steps and schedules fitted to it per node from a calibration run),
# learning rates tuned on a separate seed, 3 headline seeds each, the tiny GPT on the
# byte-tokenized Python standard library (no download). About 12 minutes on 2 cores (14-16 runs;
# the plan and its estimated cost are printed first). Leaves runs/demo/report.md, runs/demo/summary.json and the
# plots (runs/demo/*.png).
#
# Usage: scripts/demo.sh                 the A/B (extra arguments go to experiments/ab_sync_async.py)
#   scripts/demo.sh --single [...]  one process training the tiny GPT for ~2 minutes instead, into
#                                   runs/demo-single/ (replaced on every run; the A/B's runs/demo/
#                                   is left alone); extra arguments go to syncopate-worker,
#                                   e.g. --train.steps=100
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
scripts/setup.sh
scripts/build.sh
OUT=${SYNCOPATE_DEMO_OUT:-runs/demo}
if [ "${1:-}" = "--single" ]; then
  shift
  OUT=${SYNCOPATE_DEMO_SINGLE_OUT:-runs/demo-single}
  build/bin/syncopate-worker --out "$OUT" --force "$@"   # --force: a rerun replaces the last one
  echo
  echo "[demo] metrics:     $OUT/metrics.jsonl"
  echo "[demo] checkpoints: $OUT/checkpoints/ (latest: $(cat "$OUT/checkpoints/latest"))"
  echo "[demo] sample again: build/bin/syncopate-generate --checkpoint $OUT/checkpoints --prompt 'import ' --max-new-tokens 200"
  exit 0
fi
rm -rf "$OUT"
.venv/bin/python experiments/ab_sync_async.py --out "$OUT" --nodes 4 --configs ring,asp \
  --slow-node 3 --slowdown 3 --jitter 0.1 --time-budget-s 20 --seeds 3 --lr-grid 0.5,1,2 --lr-extend 1 \
  --targets 3.6,3.3 --evals 5 "$@"
echo
echo "[demo] report:  $OUT/report.md"
echo "[demo] summary: $OUT/summary.json"
echo "[demo] plots:   $OUT/val_loss_vs_time.png $OUT/val_loss_vs_tokens.png $OUT/time_to_target.png $OUT/staleness.png"
echo "[demo] the full studies (8 nodes, scenarios, learning-rate grid): docs/STUDY.md"
