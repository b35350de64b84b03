#!/usr/bin/env bash
# The main job on its embedded default: sets up (if needed), builds, and trains a small GPT on the
# byte-tokenized Python standard library of this machine (no download) for a few minutes on CPU
# (or one GPU). Leaves runs/demo/metrics.jsonl, runs/demo/samples.txt and runs/demo/checkpoints/.
# Extra arguments go to syncopate-worker, e.g. scripts/demo.sh --train.steps=100
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
scripts/setup.sh
scripts/build.sh
OUT=${SYNCOPATE_DEMO_OUT:-runs/demo}
rm -rf "$OUT"
build/bin/syncopate-worker --out "$OUT" "$@"
echo
echo "[demo] metrics:     $OUT/metrics.jsonl"
echo "[demo] checkpoints: $OUT/checkpoints/ (latest: $(cat "$OUT/checkpoints/latest"))"
echo "[demo] sample again: build/bin/syncopate-generate --checkpoint $OUT/checkpoints --prompt 'import ' --max-new-tokens 200"
