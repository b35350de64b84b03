#!/usr/bin/env bash
# Starts this node's syncopate-worker, and restarts the job from its latest checkpoint when it
# fails, up to --max-restarts times. Run the same command on every node with the torchrun-style
# environment (or under Slurm, which sets SLURM_PROCID/SLURM_NTASKS/SLURM_JOB_NODELIST):
#
#   MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NNODES=4 NODE_RANK=<i> SYNCOPATE_TOKEN=<secret> \
#     scripts/launch_node.sh [--max-restarts K] -- --out runs/job --dist.mode=ring [worker args...]
#
# When one node dies, the others stop within dist.timeout_s with an error naming it; every
# node's launcher then restarts its worker with --resume, and they meet again at the rendezvous
# (which checks that all of them resume from the same step).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MAX_RESTARTS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --max-restarts) MAX_RESTARTS=$2; shift 2;;
    --) shift; break;;
    *) echo "launch_node.sh: unknown option $1 (see the header of this script)" >&2; exit 2;;
  esac
done
WORKER="${SYNCOPATE_WORKER:-$ROOT/build/bin/syncopate-worker}"
OUT=""
prev=""
for a in "$@"; do
  [ "$prev" = "--out" ] && OUT=$a
  case "$a" in --out=*) OUT=${a#--out=};; esac
  prev=$a
done
[ -n "$OUT" ] || { echo "launch_node.sh: pass --out DIR to the worker (checkpoints live there)" >&2; exit 2; }

attempt=0
while :; do
  extra=()
  [ -f "$OUT/checkpoints/latest" ] && extra=(--resume)
  echo "[launch] node ${NODE_RANK:-${SLURM_PROCID:-0}} attempt $attempt ${extra[*]}"
  "$WORKER" "$@" "${extra[@]}"
  rc=$?
  [ $rc -eq 0 ] && exit 0
  [ $rc -eq 2 ] && { echo "[launch] configuration error: not restarting" >&2; exit 2; }
  attempt=$((attempt + 1))
  if [ $attempt -gt "$MAX_RESTARTS" ]; then
    echo "[launch] worker failed (exit $rc) and --max-restarts=$MAX_RESTARTS is used up" >&2
    exit $rc
  fi
  echo "[launch] worker failed (exit $rc); restarting from the latest checkpoint in 2 s" >&2
  sleep 2
done
