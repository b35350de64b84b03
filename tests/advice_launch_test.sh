#!/usr/bin/env bash
# --dist.mode=auto as a user runs it (issue 29): the advice's recommendation is what starts.
#  1. a local SGD recommendation (ring, sync_every=4) on a 2-node cluster (scripts/local_cluster.sh):
#     each worker logs what it applied, no shard starts, and the nodes synchronize every 4th step only;
#  2. a parameter-server recommendation (bsp, not the servers' default asp) through scripts/launch_node.sh with SYNCOPATE_SERVERS=
#     per-node: the shards start with the advice's server flags (their exit stats say bsp), the
#     workers run in ps mode;
#  3. a ps recommendation without SYNCOPATE_SERVERS: the launcher refuses by name (exit 2);
#  4. an advice that sets the learning rate: the worker refuses by name (exit 2);
#  5. drift: an advice made for a homogeneous cluster (0.1 s steps) runs on one whose node 1 takes
#     4x that: node 1 logs the drift and writes advice_step_ratio ~4, node 0 stays quiet (~1); each
#     node keeps the advice it started from (advice.applied.json); syncopate-advise --from-run on
#     the run (dry) calibrates node 1 as the straggler;
#  6. switching modes at a checkpoint (worker/train/mode_switch.h) through launch_node.sh: a ps job
#     (its shards hold AdamW) resumed as a ring job: logged with what carries over, runs to its end.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib.sh"
BIN=${SYNCOPATE_BIN:-$ROOT/build/bin}
PY=${SYNCOPATE_PYTHON:-python3}
export SYNCOPATE_WORKER=$BIN/syncopate-worker
TMP=$(mktemp -d)
cleanup() { end_spawned; rm -rf "$TMP"; }
trap cleanup EXIT
"$PY" -c "open('$TMP/corpus.txt','w').write(('def f(x):\n    return x + 1\n' * 4000))"
ARGS=(--model.preset=micro --train.batch_size=2 --train.threads=1 --train.steps=8 --eval.every=0 --eval.batches=1
      --eval.sample_tokens=0 --checkpoint.every=0 --schedule.warmup_steps=2 --dist.timeout_s=30
      --data.corpus="$TMP/corpus.txt" --data.cache_dir="$TMP/cache")
advice() {  # FILE NAME WORKER_FLAGS(JSON list) SERVER_FLAGS(JSON list)
  cat > "$1" <<JSON
{"format": "syncopate-advice/1", "cluster": {"nodes": 2},
 "candidates": [{"name": "$2", "predicted_s": {"mean": 10.0, "lo": 9.0, "hi": 11.0}}],
 "recommended": {"name": "$2", "resolved": true, "worker_flags": $3, "server_flags": $4}}
JSON
}
fail=0

# 1. Local SGD on the ring.
advice "$TMP/diloco.json" diloco4 '["--dist.mode=ring", "--dist.sync_every=4", "--dist.outer=nesterov"]' '[]'
"$ROOT/scripts/local_cluster.sh" --nodes 2 --out "$TMP/ring" -- "${ARGS[@]}" --dist.mode=auto \
  --dist.advice="$TMP/diloco.json" > "$TMP/ring.log" 2>&1 || { echo "FAIL: the auto ring job failed"; tail -n 20 "$TMP"/ring/logs/*.log; exit 1; }
for i in 0 1; do
  grep -q "recommends diloco4, predicted 10 s to the target; applying --dist.mode=ring --dist.sync_every=4" "$TMP/ring/logs/node$i.log" ||
    { echo "FAIL: node $i did not log the applied advice"; cat "$TMP/ring/logs/node$i.log"; fail=1; }
done
if "$PY" - "$TMP/ring" <<'PY'
import json, sys
for i in (0, 1):
    m = [json.loads(l) for l in open(f"{sys.argv[1]}/node{i}/metrics.jsonl") if '"loss"' in l and '"val_loss"' not in l]
    sent = [r["step"] for r in m if r.get("wire_bytes", 0) > 0]
    assert len(m) == 8 and sent == [4, 8], (i, len(m), sent)
    assert json.load(open(f"{sys.argv[1]}/node{i}/sync.json"))["mode"] == "ring"
PY
then echo "ok: the advised local SGD ran (ring, bytes on steps 4 and 8 only)"; else echo "FAIL: not the advised local SGD"; fail=1; fi

# 2. BSP through launch_node.sh with co-located shards.
advice "$TMP/asp.json" bsp '["--dist.mode=ps"]' '["--ps.consistency=bsp"]'
export SYNCOPATE_TOKEN=autotest MASTER_ADDR=127.0.0.1 NNODES=2 MASTER_PORT=$(free_port)
export SYNCOPATE_SERVERS=per-node SYNCOPATE_NODE_HOSTS=127.0.0.1,127.0.0.1 SYNCOPATE_PS_PORT=$(free_port)
for i in 0 1; do
  NODE_RANK=$i spawn "$ROOT/scripts/launch_node.sh" -- --out "$TMP/ps/node$i" "${ARGS[@]}" --dist.mode=auto \
    --dist.advice="$TMP/asp.json" > "$TMP/ps$i.log" 2>&1
done
codes=()
for p in "${SPAWNED[@]}"; do set +e; wait "$p"; codes+=($?); set -e; done  # (as probe_test.sh's wait_spawned)
SPAWNED=()
if [ "${codes[*]}" = "0 0" ]; then echo "ok: the advised ps job finished"; else echo "FAIL: exit codes ${codes[*]}"; tail -n 20 "$TMP"/ps*.log; fail=1; fi
for i in 0 1; do
  grep -q 'resolves to ps (the advice); shards get --ps.consistency=bsp' "$TMP/ps$i.log" || { echo "FAIL: launcher $i did not start bsp shards"; fail=1; }
  grep -q '"consistency":"bsp"' "$TMP/ps$i.log" || { echo "FAIL: shard $i's stats do not say bsp"; grep stats "$TMP/ps$i.log"; fail=1; }
  grep -q '"mode":"ps"' "$TMP/ps/node$i/sync.json" || { echo "FAIL: worker $i did not run ps"; fail=1; }
done

# 3. A ps recommendation without servers.
unset SYNCOPATE_SERVERS
set +e
NODE_RANK=0 "$ROOT/scripts/launch_node.sh" -- --out "$TMP/noservers" "${ARGS[@]}" --dist.mode=auto --dist.advice="$TMP/asp.json" > "$TMP/ns.log" 2>&1
rc=$?
set -e
if [ $rc = 2 ] && grep -q 'recommends a parameter-server mode: set SYNCOPATE_SERVERS' "$TMP/ns.log"; then echo "ok: ps advice without servers refused"
else echo "FAIL: exit $rc"; cat "$TMP/ns.log"; fail=1; fi

# 3b. An advice whose server flags reach beyond [ps] (the shards' address): refused by the launcher.
advice "$TMP/evil.json" bsp '["--dist.mode=ps"]' '["--server.host=0.0.0.0"]'
set +e
SYNCOPATE_SERVERS=per-node NODE_RANK=0 "$ROOT/scripts/launch_node.sh" -- --out "$TMP/evil" "${ARGS[@]}" --dist.mode=auto \
  --dist.advice="$TMP/evil.json" > "$TMP/evil.log" 2>&1
rc=$?
set -e
if [ $rc = 2 ] && grep -q 'may only set --ps.field=value' "$TMP/evil.log"; then echo "ok: server flags beyond [ps] refused"
else echo "FAIL: exit $rc"; cat "$TMP/evil.log"; fail=1; fi

# 3c. mode = "auto" in the job file, and a later --dist.mode=ring on the command line: the launcher
#     follows what the worker resolves (ring: no shards although SYNCOPATE_SERVERS is set).
printf '[dist]\nmode = "auto"\nadvice = "%s"\n' "$TMP/asp.json" > "$TMP/job.toml"
set +e
out=$(SYNCOPATE_SERVERS=per-node NODE_RANK=0 NNODES=1 "$ROOT/scripts/launch_node.sh" -- --out "$TMP/late" --config "$TMP/job.toml" \
  "${ARGS[@]}" --dist.mode=ring 2>&1)
rc=$?
set -e
if [ $rc = 0 ] && grep -q 'resolves to ring: SYNCOPATE_SERVERS ignored' <<< "$out"; then echo "ok: the launcher follows the worker's resolution"
else echo "FAIL: exit $rc"; echo "$out" | tail -n 20; fail=1; fi

# 4. An advice that would change the learning rate.
advice "$TMP/lr.json" lr '["--dist.mode=ring", "--optim.lr=1"]' '[]'
set +e
NNODES=1 "$BIN/syncopate-worker" --out "$TMP/lr" "${ARGS[@]}" --dist.mode=auto --dist.advice="$TMP/lr.json" > "$TMP/lr.log" 2>&1
rc=$?
set -e
if [ $rc = 2 ] && grep -q 'may only set \[dist\] fields' "$TMP/lr.log"; then echo "ok: an advice outside [dist] refused"
else echo "FAIL: exit $rc"; cat "$TMP/lr.log"; fail=1; fi

# 5. Drift from the advice.
"$PY" - "$TMP" <<'PY'
import json, sys
tmp = sys.argv[1]
probe = {"format": "syncopate-probe/1", "complete": True, "missing": [],
         "job": {"nodes": 2, "params": 100000, "preset": "micro", "batch_size": 2, "grad_accum": 1, "block_size": 64,
                 "local_replicas": 1, "tokens_per_node_step": 128, "precision": "fp32", "device": "cpu",
                 "wire_bytes": 4, "emulated_step_s": 0.1},
         "nodes": [{"node": i, "step_s": {"min": 0.1, "mean": 0.1, "samples": [0.1]}} for i in range(2)],
         "links": [{"from": i, "to": 1 - i, "goodput_gbit": 1.0, "rtt_us": {"median": 100}} for i in range(2)]}
json.dump(probe, open(f"{tmp}/probe.json", "w"))
json.dump({"format": "syncopate-advice/1", "probe": f"{tmp}/probe.json",
           "cluster": {"nodes": 2, "step_s": 0.1, "jitter": 0.0, "node_slowdowns": {"0": 1.0, "1": 1.0}, "slow_workers": []},
           "proxy": {"target_loss": 3.0, "seeds": 2, "steps": 100},
           "candidates": [{"name": "ring", "predicted_s": {"mean": 5.0}}],
           "recommended": {"name": "ring", "resolved": True, "worker_flags": ["--dist.mode=ring"], "server_flags": []}},
          open(f"{tmp}/fast.json", "w"))
PY
DRIFT_ARGS=("${ARGS[@]}")
DRIFT_ARGS=("${DRIFT_ARGS[@]/--train.steps=8/--train.steps=30}")
"$ROOT/scripts/local_cluster.sh" --nodes 2 --out "$TMP/drift" --step-time 0.1 --slow-node 1 --slowdown 4 -- "${DRIFT_ARGS[@]}" \
  --dist.mode=auto --dist.advice="$TMP/fast.json" > "$TMP/drift.log" 2>&1 || { echo "FAIL: the drift job failed"; tail -n 20 "$TMP"/drift/logs/*.log; exit 1; }
if grep -q "4.[0-9][0-9]x what the advice assumed" "$TMP/drift/logs/node1.log" && ! grep -q "what the advice assumed" "$TMP/drift/logs/node0.log" &&
   cmp -s "$TMP/fast.json" "$TMP/drift/node1/advice.applied.json" && "$PY" - "$TMP/drift" <<'PY'
import json, sys
for i, lo, hi in ((0, 0.7, 1.5), (1, 3.0, 5.5)):
    r = [json.loads(l).get("advice_step_ratio") for l in open(f"{sys.argv[1]}/node{i}/metrics.jsonl") if '"loss"' in l]
    r = [x for x in r if x is not None]
    assert r and lo <= r[-1] <= hi, (i, r[-3:])
PY
then echo "ok: node 1's drift from the advice reported (4x), node 0 quiet"
else echo "FAIL: drift not reported as expected"; grep -h "advice" "$TMP"/drift/logs/node*.log | tail -n 6; fail=1; fi
out=$("$PY" "$ROOT/experiments/advise.py" --from-run "$TMP/drift" --dry-run 2>&1) || true
if grep -q "stragglers 1 at" <<< "$out"; then echo "ok: the re-advice calibrates node 1 as the straggler"
else echo "FAIL: --from-run"; echo "$out" | tail -n 10; fail=1; fi

# 6. ps -> ring at a checkpoint, as a user takes a new advice.
SW_ARGS=("${ARGS[@]/--checkpoint.every=0/--checkpoint.every=4}")
export SYNCOPATE_TOKEN=switchtest MASTER_ADDR=127.0.0.1 NNODES=2 SYNCOPATE_NODE_HOSTS=127.0.0.1,127.0.0.1
phase() {  # MODE STEPS RESUME: both nodes through launch_node.sh; prints the exit codes
  local mode=$1 steps=$2 resume=$3 i p
  export MASTER_PORT=$(free_port) SYNCOPATE_PS_PORT=$(free_port)
  if [ "$mode" = ps ]; then export SYNCOPATE_SERVERS=per-node; else unset SYNCOPATE_SERVERS; fi
  for i in 0 1; do
    NODE_RANK=$i spawn "$ROOT/scripts/launch_node.sh" --max-restarts 0 -- --out "$TMP/sw/node$i" "${SW_ARGS[@]}" \
      "--train.steps=$steps" --dist.mode="$mode" $resume > "$TMP/sw_${mode}_$steps.$i.log" 2>&1
  done
  local codes=()
  for p in "${SPAWNED[@]}"; do set +e; wait "$p"; codes+=($?); set -e; done
  SPAWNED=()
  echo "${codes[*]}"
}
c1=$(phase ps 4 ""); c2=$(phase ring 8 --resume)
if [ "$c1" = "0 0" ] && [ "$c2" = "0 0" ] && grep -q "switching from ps to ring at this checkpoint" "$TMP/sw_ring_8.0.log" &&
   grep -q "AdamW's moments do not" "$TMP/sw_ring_8.1.log" && "$PY" - "$TMP/sw" <<'PY'
import json, sys
for i in (0, 1):
    steps = [json.loads(l)["step"] for l in open(f"{sys.argv[1]}/node{i}/metrics.jsonl") if '"loss"' in l and '"val_loss"' not in l]
    assert steps == list(range(1, 9)), (i, steps)
PY
then echo "ok: ps -> ring at the step-4 checkpoint: logged, steps 5-8 on the ring"
else echo "FAIL: switch phases exited '$c1' '$c2'"; tail -n 5 "$TMP"/sw_*.log; fail=1; fi
exit $fail
