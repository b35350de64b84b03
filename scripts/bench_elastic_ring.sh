#!/usr/bin/env bash
# What elasticity costs a ring job that never changes: the same N-node ring run with and without
# --dist.elastic=true (scripts/local_cluster.sh on loopback; node 0's launcher starts
# syncopate-rendezvous for the elastic one), alternated R times in one invocation so that both see
# the same machine. Per step the elastic ring adds one all-reduce of one float (every member's
# "change pending" flag: 2(N-1) hops) and heartbeats to the rendezvous service.
# Usage: scripts/bench_elastic_ring.sh [--nodes 3] [--reps 3] [--steps 150] [--latency-ms 0]
#                                      [--step-time 0.02] [--n-embd 64] [--vs "--dist.elastic=true"]
# --vs ARGS: what the second run of each pair adds (default: the elastic ring; e.g.
# "--dist.check_every=1" measures the fixed ring's replica check, another end-of-step collective).
# Prints, per pair, node 0's median step time (steps after the 10th) for both and the ratio, then
# the median of the pairs' ratios and of their differences in milliseconds.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NODES=3 REPS=3 STEPS=150 LATENCY=0 STEP_TIME=0.02 EMBD=64 VS="--dist.elastic=true"
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=$2; shift 2;; --reps) REPS=$2; shift 2;; --steps) STEPS=$2; shift 2;;
    --latency-ms) LATENCY=$2; shift 2;; --step-time) STEP_TIME=$2; shift 2;; --n-embd) EMBD=$2; shift 2;;
    --vs) VS=$2; shift 2;;
    *) echo "bench_elastic_ring.sh: unknown option $1 (see --help)" >&2; exit 2;;
  esac
done
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || PY=python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 -c "open('$TMP/corpus.txt','w').write(('def f(x):\n    return x + 1\n' * 4000))"
ARGS=(--model.n_embd="$EMBD" --model.n_head=2 --model.n_layer=2 --model.block_size=64 --train.batch_size=4
      --train.threads=1 --train.steps="$STEPS" --eval.every=0 --eval.batches=1 --eval.sample_tokens=0
      --checkpoint.every=0 --dist.mode=ring --dist.check_every=0 --emulate.step_time_s="$STEP_TIME"
      --data.corpus="$TMP/corpus.txt" --data.cache_dir="$TMP/cache")
for r in $(seq 1 "$REPS"); do
  for kind in fixed elastic; do
    extra=()
    [ "$kind" = elastic ] && read -r -a extra <<< "$VS"
    "$ROOT/scripts/local_cluster.sh" --nodes "$NODES" --latency-ms "$LATENCY" --out "$TMP/$kind$r" -- \
      "${ARGS[@]}" "${extra[@]}" > "$TMP/$kind$r.log" 2>&1 ||
      { echo "bench_elastic_ring.sh: the $kind run $r failed:" >&2; tail -n 20 "$TMP/$kind$r.log" >&2; exit 1; }
  done
done
"$PY" - "$TMP" "$REPS" "$NODES" "$LATENCY" "$STEP_TIME" "$VS" <<'PYEOF'
import json, statistics, sys
tmp, reps, nodes, lat, st, vs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
def med(path):
    s = [json.loads(l)["step_s"] for l in open(path) if '"step_s"' in l]
    return statistics.median(s[10:])
print(f"{nodes} nodes, latency {lat} ms per hop, modelled compute {st} s per step")
print(f"| pair | fixed ring, ms/step | with {vs}, ms/step | ratio | difference, ms |")
print("|---|---|---|---|---|")
ratios, diffs = [], []
for r in range(1, reps + 1):
    f, e = med(f"{tmp}/fixed{r}/node0/metrics.jsonl"), med(f"{tmp}/elastic{r}/node0/metrics.jsonl")
    ratios.append(e / f)
    diffs.append(1e3 * (e - f))
    print(f"| {r} | {1e3 * f:.2f} | {1e3 * e:.2f} | {e / f:.3f} | {1e3 * (e - f):+.2f} |")
print(f"median ratio {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); "
      f"median difference {statistics.median(diffs):+.2f} ms per step")
PYEOF
