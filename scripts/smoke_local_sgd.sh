#!/bin/bash
# One-seed smoke comparison of per-step and local SGD modes (not a study: no seeds, no intervals):
# 4 nodes on loopback, tiny GPT, 200 steps, batch 8 per node; final validation loss per node and the
# bytes every node sent. (docs/STUDY.md records a run)
# ONLY=name,name runs a subset (the names below); SEED=S another seed; NODES=N another node count;
# STEPS=N another length.
# Usage: scripts/smoke_local_sgd.sh [OUT]   (default OUT: runs/smoke_local_sgd)
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${1:-runs/smoke_local_sgd}; mkdir -p $OUT
COMMON=(--model.preset=tiny --train.steps=${STEPS:-200} --train.batch_size=8 --train.threads=1 --eval.every=50 --eval.batches=8
        --eval.sample_tokens=0 --checkpoint.every=0 --dist.check_every=0 --schedule.warmup_steps=10 --train.seed=${SEED:-1}
        --data.cache_dir=$PWD/data/cache --dist.clip_scope=node)
run() { name=$1; shift; local s=$SECONDS
  [ -n "${ONLY:-}" ] && [[ ",$ONLY," != *",$name,"* ]] && return
  rm -rf "$OUT/$name"
  scripts/local_cluster.sh --nodes "${NODES:-4}" --out "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1; rc=$?
  echo "$name rc=$rc wall=$((SECONDS - s)) s" ; }
run ring -- "${COMMON[@]}"
run diloco10 -- "${COMMON[@]}" --dist.sync_every=10
run diloco10_fp16 -- "${COMMON[@]}" --dist.sync_every=10 --dist.wire=fp16
run asp --servers 2 --consistency asp --encrypt off -- "${COMMON[@]}"
run async_diloco10_avg --servers 2 --consistency asp --encrypt off -- "${COMMON[@]}" --dist.sync_every=10 --dist.outer=average
run async_diloco10 --servers 2 --consistency asp --encrypt off -- "${COMMON[@]}" --dist.sync_every=10 --dist.outer_lr=0.35
run async_diloco10_delayed --servers 2 --consistency asp --encrypt off -- "${COMMON[@]}" --dist.sync_every=10 --dist.outer=delayed_nesterov
run async_diloco10_delayed_035 --servers 2 --consistency asp --encrypt off -- "${COMMON[@]}" --dist.sync_every=10 --dist.outer=delayed_nesterov --dist.outer_lr=0.35
run async_diloco10_int8 --servers 2 --consistency asp --encrypt off -- "${COMMON[@]}" --dist.sync_every=10 --dist.outer_lr=0.35 --dist.wire=int8
.venv/bin/python - "$OUT" <<'PY'
import json, os, sys
OUT = sys.argv[1]
for name in ["ring","diloco10","diloco10_fp16","asp","async_diloco10_avg","async_diloco10","async_diloco10_delayed",
             "async_diloco10_delayed_035","async_diloco10_int8"]:
    d=f"{OUT}/{name}"
    vl=[]; wb=0
    for n in range(64):
        p=f"{d}/node{n}/metrics.jsonl"
        if not os.path.exists(p): continue
        recs=[json.loads(l) for l in open(p)]
        v=[r["val_loss"] for r in recs if "val_loss" in r]
        if v: vl.append(v[-1])
        s=f"{d}/node{n}/sync.json"
        if os.path.exists(s): wb+=json.load(open(s))["wire_bytes"]
    print(f"{name:22s} final val_loss per node {['%.4f'%x for x in vl]}  mean {sum(vl)/max(len(vl),1):.4f}  bytes sent (all nodes) {wb/1e6:.1f} MB")
PY
