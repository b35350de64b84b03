#!/usr/bin/env bash
# The checks that need a GPU, in one command, for a machine that has one (after scripts/build.sh):
#   1. the NCCL local group gives the thread group's results (LocalGroup.NcclGroupMatchesTheThreadGroup
#      must PASS here; without a GPU it reports itself skipped);
#   1b. activation checkpointing on the GPU: the recompute replays the forward's dropout masks
#      (CUDA generator) under its bf16 autocast; replicas on two GPUs at once when there are two
#      (GPT.CudaCheckpointRecomputeReplaysMasksAndAutocast must PASS, not skip);
#   2. one node driving every visible GPU (one thread each, NCCL, buckets on a communication
#      stream), bf16, preset P: tokens/s and MFU;
#   3. two simulated nodes of one GPU each, joined by the ring (both on the first visible GPU).
#
# Usage: scripts/gpu_check.sh [--preset gpt2] [--batch 8] [--steps 30] [--peak-tflops 989]
# MFU per device = tokens/s x (6 N + 12 layers x context x width) / (devices of the step x peak)
# (BRIEF.md section 3), logged by the worker itself as `mfu` with --train.peak_tflops: N is the
# run's own parameter count (gpt_train_flops_per_token), the devices are the step's replicas.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PRESET=gpt2 BATCH=8 STEPS=30 PEAK=989
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) PRESET=$2; shift 2;; --batch) BATCH=$2; shift 2;; --steps) STEPS=$2; shift 2;;
    --peak-tflops) PEAK=$2; shift 2;;
    *) echo "gpu_check.sh: unknown option $1 (see the header of this script)" >&2; exit 2;;
  esac
done
BIN="$ROOT/build/bin"
[ -x "$BIN/syncopate_tests" ] || { echo "gpu_check.sh: build first (scripts/build.sh)" >&2; exit 2; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

echo "## 1. NCCL local group"
"$BIN/syncopate_tests" --gtest_filter='LocalGroup.Nccl*' | tee "$OUT/nccl.log"
grep -q "\[  PASSED  \] 1 test" "$OUT/nccl.log" && ! grep -q SKIPPED "$OUT/nccl.log" ||
  { echo "gpu_check.sh: the NCCL test did not pass (skipped means no GPU is visible)" >&2; exit 1; }

echo "## 1b. activation checkpointing and dropout on the GPU"
"$BIN/syncopate_tests" --gtest_filter='GPT.Cuda*' | tee "$OUT/ckpt.log"
grep -q "\[  PASSED  \] 1 test" "$OUT/ckpt.log" && ! grep -q SKIPPED "$OUT/ckpt.log" ||
  { echo "gpu_check.sh: the GPU checkpointing test did not pass" >&2; exit 1; }

COMMON=(--model.preset="$PRESET" --train.batch_size="$BATCH" --train.steps="$STEPS" --train.device=cuda
        --train.precision=bf16 --eval.every=0 --eval.sample_tokens=0 --eval.batches=1 --checkpoint.every=0
        --dist.check_every=10 --train.peak_tflops="$PEAK")
report() {  # report LABEL METRICS: medians after the first 5 steps of tokens/s and of the worker's own
           # per-device MFU (train.peak_tflops; model FLOPs from the run's shape, model/gpt_config.h)
  "$ROOT/.venv/bin/python" - "$1" "$2" "$PEAK" <<'PYEOF'
import json, statistics, sys
label, path, peak = sys.argv[1], sys.argv[2], float(sys.argv[3])
rows = [m for m in map(json.loads, open(path)) if "tokens_per_s" in m][5:]
tok = statistics.median(m["tokens_per_s"] for m in rows)
mfu = statistics.median(m["mfu"] for m in rows)
print(f"{label}: {tok:.0f} tokens/s, MFU {mfu:.3f} per device of {peak:g} TFLOP/s")
PYEOF
}

echo "## 2. one node, every visible GPU"
"$BIN/syncopate-worker" --out "$OUT/node" "${COMMON[@]}" > "$OUT/node.log" 2>&1 || { cat "$OUT/node.log"; exit 1; }
grep "\[dist\]" "$OUT/node.log" || true
report "one node" "$OUT/node/metrics.jsonl"

echo "## 3. two simulated nodes of one GPU each, joined by the ring"
"$ROOT/scripts/local_cluster.sh" --nodes 2 --out "$OUT/ring" -- "${COMMON[@]}" --dist.mode=ring \
  --dist.local_replicas=1 > "$OUT/ring.log" 2>&1 || { cat "$OUT/ring.log" "$OUT"/ring/logs/*.log; exit 1; }
report "2 nodes x 1 GPU" "$OUT/ring/node0/metrics.jsonl"

echo "## 4. one process per GPU, as torchrun --nproc-per-node=G starts them (dist.launch=auto -> gpu)"
G=$("$ROOT/.venv/bin/python" -c 'import torch; print(torch.cuda.device_count())')
if [ "$G" -ge 2 ]; then
  source "$ROOT/scripts/lib.sh"
  PORT=$(free_port)
  PIDS=()
  for r in $(seq 0 $((G - 1))); do
    WORLD_SIZE=$G RANK=$r LOCAL_RANK=$r LOCAL_WORLD_SIZE=$G MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT \
      "$BIN/syncopate-worker" --out "$OUT/pergpu$r" "${COMMON[@]}" --dist.mode=ring > "$OUT/pergpu$r.log" 2>&1 &
    PIDS+=($!)
  done
  for p in "${PIDS[@]}"; do wait "$p" || { cat "$OUT"/pergpu*.log; exit 1; }; done
  grep -q "one process per GPU" "$OUT/pergpu0.log" || { echo "gpu_check.sh: launch layout not detected" >&2; exit 1; }
  report "$G processes x 1 GPU" "$OUT/pergpu0/metrics.jsonl"
else
  echo "one GPU visible: skipped"
fi
