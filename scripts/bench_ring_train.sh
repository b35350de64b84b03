#!/usr/bin/env bash
# Training throughput of an N-node ring run against PyTorch DDP (Python, Gloo) with the same
# model, per-node batch and threads, in the same invocation, on loopback.
# Usage: scripts/bench_ring_train.sh [--nodes 2] [--local 1] [--preset tiny] [--batch 16] [--steps 40] [--threads 1]
# --local L: L replicas per node (threads of one worker, dist.local_replicas=L) against L DDP
# processes per node. Batch and threads are per replica.
# Prints global tokens/s (median over steps after the first 5) for both and the ratio.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib.sh"
NODES=2 PRESET=tiny BATCH=16 STEPS=40 THREADS=1 LOCAL=1
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=$2; shift 2;; --local) LOCAL=$2; shift 2;; --preset) PRESET=$2; shift 2;; --batch) BATCH=$2; shift 2;;
    --steps) STEPS=$2; shift 2;; --threads) THREADS=$2; shift 2;;
    *) echo "unknown option $1" >&2; exit 2;;
  esac
done
PY="$ROOT/.venv/bin/python"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$ROOT/scripts/local_cluster.sh" --nodes "$NODES" --out "$TMP/ring" -- --model.preset="$PRESET" \
  --train.batch_size="$BATCH" --train.steps="$STEPS" --train.threads="$THREADS" --train.device=cpu \
  --eval.every=0 --eval.sample_tokens=0 --eval.batches=1 --dist.mode=ring --dist.check_every=0 --dist.local_replicas="$LOCAL" \
  --data.cache_dir="$ROOT/data/cache" > /dev/null
DATA=$(ls "$ROOT"/data/cache/byte-*/*_text_document.bin | head -1)
export NNODES=$((NODES * LOCAL)) MASTER_ADDR=127.0.0.1
export MASTER_PORT=$(free_port)
PIDS=()
for i in $(seq 0 $((NNODES - 1))); do
  NODE_RANK=$i "$PY" "$ROOT/scripts/ref_gpt_train.py" --preset "$PRESET" --batch "$BATCH" --steps "$STEPS" \
    --threads "$THREADS" --data "$DATA" > "$TMP/ddp$i.jsonl" 2>"$TMP/ddp$i.err" &
  PIDS+=($!)
done
for p in "${PIDS[@]}"; do wait "$p"; done
"$PY" - "$TMP" "$NODES" "$BATCH" "$PRESET" "$THREADS" "$LOCAL" <<'PYEOF'
import json, statistics, sys
tmp, nodes, b, preset, threads, local = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
n = nodes * local
T = {"tiny": 128, "small": 256, "gpt2": 1024, "gpt2-medium": 1024}[preset]
ring = [json.loads(l) for l in open(f"{tmp}/ring/node0/metrics.jsonl")]
ring = statistics.median([m["tokens_per_s"] for m in ring if "tokens_per_s" in m][5:])
ddp = [json.loads(l)["dt"] for l in open(f"{tmp}/ddp0.jsonl") if l.startswith("{")]
ddp = n * b * T / statistics.median(ddp[5:])
print("| nodes | replicas/node | preset | batch/replica | threads/replica | ring tok/s | DDP (Gloo) tok/s | ratio |")
print("|---|---|---|---|---|---|---|---|")
print(f"| {nodes} | {local} | {preset} | {b} | {threads} | {ring:.0f} | {ddp:.0f} | {ring / ddp:.2f} |")
PYEOF
