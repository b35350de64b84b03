#!/usr/bin/env bash
# The cluster script as a user runs it: a 2-node ring and a 2-worker/1-server ps run with a
# straggler, on loopback. Checks that every node finished its steps and logged staleness.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 -c "open('$TMP/corpus.txt','w').write(('def f(x):\n    return x + 1\n' * 4000))"
ARGS=(--model.n_embd=32 --model.n_head=2 --model.block_size=32 --train.batch_size=2 --train.steps=10
      --train.threads=1 --eval.every=0 --eval.batches=1 --eval.sample_tokens=0 --checkpoint.every=0
      --data.corpus="$TMP/corpus.txt" --data.cache_dir="$TMP/cache")
"$ROOT/scripts/local_cluster.sh" --nodes 2 --out "$TMP/ring" -- "${ARGS[@]}" > "$TMP/ring.out"
"$ROOT/scripts/local_cluster.sh" --nodes 2 --servers 1 --consistency ssp --staleness-bound 1 \
  --slow-node 1 --slowdown 2 --out "$TMP/ps" -- "${ARGS[@]}" > "$TMP/ps.out"
fail=0
for run in ring ps; do
  for i in 0 1; do
    m="$TMP/$run/node$i/metrics.jsonl"
    if ! grep -q '"step":10,"time_s"' "$m" 2>/dev/null && ! grep -q '"staleness":[0-9.]*,"step":10' "$m" 2>/dev/null; then
      echo "FAIL: $run node $i did not reach step 10"; cat "$TMP/$run/logs/node$i.log"; fail=1
    fi
  done
done
grep -q '"staleness"' "$TMP/ps/node1/metrics.jsonl" || { echo "FAIL: no staleness in ps metrics"; fail=1; }
grep -q "listening on tcp://127.0.0.1:" "$TMP/ps/logs/server0.log" || { echo "FAIL: server did not log its endpoint"; fail=1; }
[ $fail = 0 ] && echo "local cluster: ring and ps runs complete"
exit $fail
