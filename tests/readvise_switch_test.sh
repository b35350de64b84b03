#!/usr/bin/env bash
# --dist.mode=auto --dist.readvise_every=N (issue 29, second stage; worker/train/readvise.h) as a
# user runs it: a 2-node job through scripts/local_cluster.sh (each node through launch_node.sh),
# advised the ring for a homogeneous cluster; node 1 slows 4x from step 4 (emulate.slowdown_from_step).
#  1. node 1's watch drifts; at the next decision step node 0 asks its launcher for a re-advice, which
#     runs (here a stand-in for syncopate-advise, SYNCOPATE_ADVISE: its pick is the test's to know;
#     the advisor itself is tested by test_advise.py and advice_launch_test.sh) with --from-run on the
#     nodes' directories and --window 10 (the steps since it drifted), while the job goes on;
#  2. the answer picks BSP on parameter servers: at the next decision step every node checkpoints, its
#     worker exits with 75, and its launcher restarts it with --resume in ps mode, starting its shard
#     with the advice's --ps.consistency=bsp (AdamW's moments go to the shards with INIT, protocol 8);
#     the job runs to its last step and every process exits 0;
#  3. every step is logged once on each node, the steps after the switch in ps mode, and the switch's
#     checkpoint was written by the ring;
#  4. a re-advice that keeps the pick changes nothing: the same job with a stand-in that answers the
#     ring again runs to its end on the ring without a restart.
#  5. --dist.readvise_every without --dist.mode=auto is refused by name (exit 2).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib.sh"
BIN=${SYNCOPATE_BIN:-$ROOT/build/bin}
PY=${SYNCOPATE_PYTHON:-python3}
export SYNCOPATE_WORKER=$BIN/syncopate-worker
TMP=$(mktemp -d)
cleanup() { end_spawned; [ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"; }
trap cleanup EXIT
"$PY" -c "open('$TMP/corpus.txt','w').write(('def f(x):\n    return x + 1\n' * 4000))"
ARGS=(--model.preset=micro --train.batch_size=2 --train.threads=1 --train.steps=48 --eval.every=0 --eval.batches=1
      --eval.sample_tokens=0 --checkpoint.every=0 --schedule.warmup_steps=2 --dist.timeout_s=30
      --data.corpus="$TMP/corpus.txt" --data.cache_dir="$TMP/cache" --emulate.slowdown_from_step=4)
fail=0

# The advice the job starts from: the ring, for 0.05 s steps on both nodes.
"$PY" - "$TMP" <<'PY'
import json, sys
tmp = sys.argv[1]
json.dump({"format": "syncopate-advice/1", "probe": f"{tmp}/probe.json",
           "cluster": {"nodes": 2, "step_s": 0.05, "jitter": 0.0, "node_slowdowns": {"0": 1.0, "1": 1.0}},
           "candidates": [{"name": "ring", "predicted_s": {"mean": 5.0}}],
           "recommended": {"name": "ring", "resolved": True, "worker_flags": ["--dist.mode=ring"], "server_flags": []}},
          open(f"{tmp}/first.json", "w"))
PY
# The stand-in advisor: records its arguments, answers PICK (bsp on the servers, or the ring again)
# with node 1 at 4x in its cluster.
cat > "$TMP/advisor.sh" <<'SH'
#!/usr/bin/env bash
set -eu
out=""; prev=""
for a in "$@"; do [ "$prev" = --out ] && out=$a; prev=$a; done
echo "$*" >> "$STANDIN_LOG"
mkdir -p "$out"
if [ "$PICK" = bsp ]; then flags='["--dist.mode=ps"]' server='["--ps.consistency=bsp"]'
else flags='["--dist.mode=ring"]' server='[]'; fi
cat > "$out/advice.json" <<JSON
{"format": "syncopate-advice/1", "cluster": {"nodes": 2, "step_s": 0.05, "jitter": 0.0, "node_slowdowns": {"0": 1.0, "1": 4.0}},
 "candidates": [{"name": "$PICK", "predicted_s": {"mean": 3.0}}],
 "recommended": {"name": "$PICK", "resolved": true, "worker_flags": $flags, "server_flags": $server}}
JSON
SH
chmod +x "$TMP/advisor.sh"
export SYNCOPATE_ADVISE=$TMP/advisor.sh SYNCOPATE_TOKEN=readvisetest
export SYNCOPATE_SERVERS=per-node SYNCOPATE_NODE_HOSTS=127.0.0.1,127.0.0.1

job() {  # NAME PICK: the 2-node job; returns local_cluster.sh's status
  export PICK=$2 STANDIN_LOG=$TMP/$1.standin SYNCOPATE_PS_PORT=$(free_port)
  "$ROOT/scripts/local_cluster.sh" --nodes 2 --out "$TMP/$1" --step-time 0.05 --slow-node 1 --slowdown 4 -- "${ARGS[@]}" \
    --dist.mode=auto --dist.advice="$TMP/first.json" --dist.readvise_every=4 > "$TMP/$1.log" 2>&1
}

# 1-3. The switch to BSP.
if ! job sw bsp; then echo "FAIL: the switching job failed"; tail -n 30 "$TMP"/sw/logs/*.log; exit 1; fi
if grep -q -- "--from-run $TMP/sw --window 10 --out $TMP/sw/node0/readvise0" "$TMP/sw.standin"; then
  echo "ok: node 0's launcher re-advised with --from-run on the nodes' directories, --window 10"
else echo "FAIL: the advisor was not run as expected"; cat "$TMP/sw.standin" 2>/dev/null; fail=1; fi
for i in 0 1; do
  grep -q "stopped after step [0-9]* to switch to bsp" "$TMP/sw/logs/node$i.log" &&
    grep -q "restarting with --resume --dist.advice=$TMP/sw/node$i/advice.next.json" "$TMP/sw/logs/node$i.log" &&
    grep -q "resolves to ps (the advice); shards get --ps.consistency=bsp" "$TMP/sw/logs/node$i.log" &&
    grep -q "AdamW's moments too (to the shards, with their INIT" "$TMP/sw/logs/node$i.log" &&
    grep -q '"consistency":"bsp"' "$TMP/sw/logs/node$i.log" ||
    { echo "FAIL: node $i did not switch to bsp through its launcher"; grep -E "launch|advice|switch" "$TMP/sw/logs/node$i.log" | tail -n 12; fail=1; }
done
if "$PY" - "$TMP/sw" <<'PY'
import json, os, sys
run = sys.argv[1]
switched = set()
for i in (0, 1):
    d = f"{run}/node{i}"
    rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"loss"' in l and '"val_loss"' not in l]
    assert [r["step"] for r in rows] == list(range(1, 49)), (i, [r["step"] for r in rows])
    assert json.load(open(f"{d}/sync.json"))["mode"] == "ps", i
    ck = sorted(int(c.split("_")[-1]) for c in os.listdir(f"{d}/checkpoints") if c.startswith("step_"))
    assert ck, i
    switched.add(ck[0])
    meta = json.load(open(f"{d}/checkpoints/step_{ck[0]:06d}/meta.json"))
    assert "mode = 'ring'" in meta["config"], (i, "the switch's checkpoint was not the ring's")
    assert ck[0] % 4 == 0 and 8 <= ck[0] < 48, ck
(s,) = switched  # both nodes at one step
print(f"switched at step {s}")
PY
then echo "ok: every step logged once on each node; the ring's checkpoint at the switch, ps after it"
else echo "FAIL: the run's record after the switch"; fail=1; fi

# 4. A re-advice that keeps the ring.
if ! job keep ring; then echo "FAIL: the job whose re-advice keeps the ring failed"; tail -n 30 "$TMP"/keep/logs/*.log; exit 1; fi
if grep -q "re-advice on what the run measured keeps ring" "$TMP/keep/logs/node0.log" &&
   ! grep -q "to switch to" "$TMP/keep/logs/node0.log" && ! grep -q "to switch to" "$TMP/keep/logs/node1.log" &&
   grep -q '"mode":"ring"' "$TMP/keep/node1/sync.json"; then
  echo "ok: a re-advice that keeps the pick changes nothing"
else echo "FAIL: the kept pick"; grep -h "advice" "$TMP"/keep/logs/node*.log | tail -n 8; fail=1; fi

# 5. Without --dist.mode=auto.
set +e
NNODES=1 "$BIN/syncopate-worker" --out "$TMP/noauto" "${ARGS[@]}" --dist.readvise_every=4 > "$TMP/noauto.log" 2>&1
rc=$?
set -e
if [ $rc = 2 ] && grep -q "dist.readvise_every=4 without dist.mode=auto" "$TMP/noauto.log"; then echo "ok: readvise without auto refused"
else echo "FAIL: exit $rc"; cat "$TMP/noauto.log"; fail=1; fi
exit $fail
