#!/usr/bin/env bash
# scripts/launch_node.sh as a user runs it on three machines: a 3-node BSP parameter-server job
# with one shard co-located on every node (SYNCOPATE_SERVERS=per-node), on loopback (distinct
# ports) and, as root, in network namespaces (every node a host of its own address). Node 2 trains
# fewer steps than the others: its FINISH must let them go on at once (the servers' worker timeout
# is 600 s, so nothing else can release them before the deadline). Every shard exits by itself
# after the last worker, with a checkpoint; every launcher exits 0; nothing is left running.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib.sh"
source "$ROOT/scripts/netns.sh"
TMP=$(mktemp -d)
NS=""
cleanup() { end_spawned; [ -n "$NS" ] && netns_down "$NS" 3; rm -rf "$TMP"; }
trap cleanup EXIT
python3 -c "open('$TMP/corpus.txt','w').write(('def f(x):\n    return x + 1\n' * 4000))"
ARGS=(--model.n_embd=32 --model.n_head=2 --model.block_size=32 --train.batch_size=2 --train.threads=1
      --eval.every=0 --eval.batches=1 --eval.sample_tokens=0 --checkpoint.every=4 --dist.timeout_s=60
      --schedule.warmup_steps=2
      --data.corpus="$TMP/corpus.txt" --data.cache_dir="$TMP/cache")
fail=0
# Three consecutive free loopback ports (shard k listens on base + k).
free_base() {
  python3 - <<'PY'
import socket
for _ in range(200):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); base = s.getsockname()[1]; s.close()
    try:
        held = []
        for k in range(3):
            t = socket.socket(); t.bind(("127.0.0.1", base + k)); held.append(t)
        for t in held: t.close()
        print(base); break
    except OSError:
        for t in held: t.close()
PY
}

# Waits (until T0 + LIMIT s) for each SPAWNED[INDEX] and fails unless it exited 0; LOGS (a glob) is
# printed on failure.
launchers_exit0() {  # NAME T0 LIMIT LOGS INDEX...
  local name=$1 t0=$2 limit=$3 logs=$4 i pid rc
  shift 4
  for i in "$@"; do
    pid=${SPAWNED[$i]} rc=0
    while kill -0 "$pid" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "FAIL: $name: launcher $i still running after $limit s"; tail -n 20 $logs; fail=1; continue
    fi
    wait "$pid" || rc=$?
    [ $rc = 0 ] || { echo "FAIL: $name: launcher $i exited $rc"; tail -n 20 $logs; fail=1; }
  done
}

run_job() {  # NAME HOSTS PS_PORT [NETNS_PREFIX]
  local name=$1 hosts=$2 port=$3 ns=${4:-} i steps t0
  mkdir -p "$TMP/$name"
  SPAWNED=()
  t0=$(date +%s)
  for i in 0 1 2; do
    steps=8; [ $i = 2 ] && steps=4
    local cmd=(env NNODES=3 NODE_RANK=$i MASTER_ADDR=127.0.0.1 MASTER_PORT=1 SYNCOPATE_TOKEN=launch-test
               SYNCOPATE_SERVERS=per-node SYNCOPATE_NODE_HOSTS="$hosts" SYNCOPATE_PS_PORT="$port"
               "$ROOT/scripts/launch_node.sh" --server-arg --ps.consistency=bsp --server-arg --ps.worker_timeout_s=600
               -- --out "$TMP/$name/node$i" "${ARGS[@]}" --train.steps=$steps)
    [ -n "$ns" ] && cmd=(ip netns exec "${ns}n$i" "${cmd[@]}")
    spawn "${cmd[@]}" > "$TMP/$name/node$i.log" 2>&1
  done
  launchers_exit0 "$name" "$t0" 240 "$TMP/$name/node*.log" 0 1 2  # a deadline far below the 600 s that only FINISH avoids
  end_spawned
  for i in 0 1 2; do
    steps=8; [ $i = 2 ] && steps=4
    grep -q "\"step\":$steps," "$TMP/$name/node$i/metrics.jsonl" 2>/dev/null ||
      { echo "FAIL: $name node $i did not reach step $steps"; tail -n 20 "$TMP/$name/node$i.log"; fail=1; }
    grep -q "\[server $i\] every worker finished or left: exiting" "$TMP/$name/node$i.log" ||
      { echo "FAIL: $name shard $i did not exit with its job"; tail -n 20 "$TMP/$name/node$i.log"; fail=1; }
    grep -q "\[server $i\] stats {.*\"dead_events\":0," "$TMP/$name/node$i.log" ||
      { echo "FAIL: $name shard $i took a worker for dead (FINISH should have ended it)"; fail=1; }
    [ -f "$TMP/$name/node$i/server$i/shard_$i.safetensors" ] || { echo "FAIL: $name shard $i left no checkpoint"; fail=1; }
    grep -q "listening on tcp://${hosts%%,*}" "$TMP/$name/node0.log" || { echo "FAIL: $name shard 0 not on its node's address"; fail=1; }
  done
  # BSP over three workers: node 2's four clocks were averaged with the others' (version 8 at the end).
  grep -q '\[server 0\] stats {.*"version":8[,}]' "$TMP/$name/node0.log" || { echo "FAIL: $name shard 0 did not apply 8 clocks"; grep stats "$TMP/$name/node0.log"; fail=1; }
  if pgrep -f "$TMP/$name" > /dev/null; then echo "FAIL: $name left processes:"; pgrep -af "$TMP/$name"; fail=1; fi
  echo "$name: $(( $(date +%s) - t0 )) s"
}

base=$(free_base)
run_job loopback 127.0.0.1,127.0.0.1,127.0.0.1 "$base"
if [ "$(id -u)" = 0 ] && ip netns add "lnt$$" 2>/dev/null; then
  ip netns del "lnt$$"
  NS="lnt$$"
  netns_up "$NS" 3 1
  run_job netns 10.77.0.1,10.77.0.2,10.77.0.3 29500 "$NS"  # every host has its own ports
  netns_down "$NS" 3
  NS=""
else
  echo "network namespaces: not root, skipped"
fi

# A shard killed mid-run is restarted by its node's launcher, resumes from its checkpoint, and the
# job ends as usual: the workers resend what the dead shard had not answered, to every shard that
# has not answered (under BSP a worker waiting on another shard must still resend to the restarted
# one, or the two wait for each other). A checkpoint after every update, written before the reply,
# makes every clock applied exactly once on every shard, the restarted one included.
restart_job() {
  local base i rc pid t0
  base=$(free_base)
  mkdir -p "$TMP/restart"
  SPAWNED=()
  t0=$(date +%s)
  for i in 0 1 2; do
    NNODES=3 NODE_RANK=$i SYNCOPATE_TOKEN=launch-test SYNCOPATE_SERVERS=per-node \
      SYNCOPATE_NODE_HOSTS=127.0.0.1,127.0.0.1,127.0.0.1 SYNCOPATE_PS_PORT="$base" \
      spawn "$ROOT/scripts/launch_node.sh" --max-restarts 2 --server-arg --ps.consistency=bsp \
      --server-arg --server.checkpoint_every=1 -- --out "$TMP/restart/node$i" "${ARGS[@]}" --train.steps=60 \
      > "$TMP/restart/node$i.log" 2>&1
  done
  for _ in $(seq 1 1200); do grep -q '"step":15,' "$TMP/restart/node1/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
  pkill -KILL -f "syncopate-server.*--server.checkpoint_dir=$TMP/restart/node1/server1" ||
    { echo "FAIL: restart: no shard 1 to kill"; fail=1; }
  launchers_exit0 restart "$t0" 240 "$TMP/restart/node*.log" 0 1 2
  for i in 0 1 2; do
    grep -q '"step":60,' "$TMP/restart/node$i/metrics.jsonl" || { echo "FAIL: restart: node $i did not reach step 60"; fail=1; }
  done
  end_spawned
  grep -q "\[launch\] shard 1 failed (exit 137); restarting from its checkpoint" "$TMP/restart/node1.log" ||
    { echo "FAIL: restart: shard 1 was not restarted"; tail -n 20 "$TMP/restart/node1.log"; fail=1; }
  grep -q "\[server 1\] resumed from .*shard_1.safetensors" "$TMP/restart/node1.log" ||
    { echo "FAIL: restart: shard 1 did not resume from its checkpoint"; fail=1; }
  # Every clock applied exactly once on every shard, the restarted one included.
  for i in 0 1 2; do
    grep -q "\[server $i\] stats {.*\"version\":60[,}]" "$TMP/restart/node$i.log" ||
      { echo "FAIL: restart: shard $i did not end at version 60"; grep "stats" "$TMP/restart/node$i.log" | cut -c1-300; fail=1; }
  done
  if pgrep -f "$TMP/restart" > /dev/null; then echo "FAIL: restart left processes:"; pgrep -af "$TMP/restart"; fail=1; fi
  echo "restart: $(( $(date +%s) - t0 )) s"
}
restart_job

# Elastic (issue 30): a shard on a dedicated "host" (--role server), two nodes start a BSP job with
# --dist.elastic=true, a third launcher joins the running job with its own NNODES=3 / NODE_RANK=2,
# then node 1's launcher gets SIGTERM (a preemption notice): its worker finishes the step, writes a
# checkpoint and leaves at once (the servers' worker timeout is 600 s: only its FINISH can release
# the others in time). The others end the job; the shard exits with it, one update per round.
elastic_job() {  # [NETNS_PREFIX]: then the shard and node 0 on host 0 (10.77.0.1), node i on host i
  local ns=${1:-} base t0 i pid rc addr=127.0.0.1 d=elastic
  base=$(free_base)
  [ -n "$ns" ] && addr=10.77.0.1 d=elastic_netns base=29600
  mkdir -p "$TMP/$d"
  SPAWNED=()
  t0=$(date +%s)
  local env=(env SYNCOPATE_TOKEN=launch-test SYNCOPATE_SERVERS=$addr:$base SYNCOPATE_SERVER_LAYOUT=dedicated)
  on_host() {  # HOST: the prefix that runs a command in that host's namespace (none on loopback)
    HOST=()
    if [ -n "$ns" ]; then HOST=(ip netns exec "${ns}n$1"); fi
  }
  on_host 0
  spawn "${HOST[@]}" "${env[@]}" SYNCOPATE_SERVER_DIR="$TMP/$d/server0" "$ROOT/scripts/launch_node.sh" --role server \
    --shard 0 --server-arg --ps.consistency=bsp --server-arg --ps.worker_timeout_s=600 > "$TMP/$d/server.log" 2>&1
  node() {  # RANK NNODES
    on_host "$1"
    spawn "${HOST[@]}" "${env[@]}" NNODES=$2 NODE_RANK=$1 "$ROOT/scripts/launch_node.sh" -- --out "$TMP/$d/node$1" "${ARGS[@]}" \
      --train.steps=80 --emulate.step_time_s=0.1 --dist.elastic=true > "$TMP/$d/node$1.log" 2>&1
  }
  node 0 2; node 1 2
  for _ in $(seq 1 1200); do grep -q '"step":10,' "$TMP/$d/node0/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
  node 2 3
  local n
  for _ in $(seq 1 1200); do
    n=$(grep -c '"loss"' "$TMP/$d/node2/metrics.jsonl" 2>/dev/null || true)
    [ "${n:-0}" -ge 2 ] && break; sleep 0.1
  done
  kill -TERM "${SPAWNED[2]}"  # node 1's launcher
  launchers_exit0 "$d" "$t0" 240 "$TMP/$d/*.log" 1 3 0  # node 0, node 2, then the shard's launcher
  wait "${SPAWNED[2]}" 2>/dev/null || true
  end_spawned
  grep -q "joined the running job at step" "$TMP/$d/node2.log" || { echo "FAIL: $d: node 2 did not join"; tail -n 20 "$TMP/$d/node2.log"; fail=1; }
  grep -q "SIGTERM: node 1 stopped after step" "$TMP/$d/node1.log" || { echo "FAIL: $d: node 1 did not stop on SIGTERM"; tail -n 20 "$TMP/$d/node1.log"; fail=1; }
  ls -d "$TMP/$d/node1/checkpoints/step_"* > /dev/null 2>&1 || { echo "FAIL: $d: node 1 wrote no checkpoint"; fail=1; }
  for i in 0 2; do
    grep -q '"step":80,' "$TMP/$d/node$i/metrics.jsonl" || { echo "FAIL: $d: node $i did not reach step 80"; fail=1; }
  done
  grep -q "listening on tcp://$addr:$base" "$TMP/$d/server.log" || { echo "FAIL: $d: the shard did not listen on $addr:$base"; fail=1; }
  grep -q '\[server 0\] stats {.*"dead_events":0,' "$TMP/$d/server.log" ||
    { echo "FAIL: $d: the shard waited out a worker's timeout"; fail=1; }
  grep -q '\[server 0\] stats {.*"version":80[,}]' "$TMP/$d/server.log" ||
    { echo "FAIL: $d: the shard did not apply one update per round"; grep stats "$TMP/$d/server.log" | cut -c1-300; fail=1; }
  if pgrep -f "$TMP/$d" > /dev/null; then echo "FAIL: $d left processes:"; pgrep -af "$TMP/$d"; fail=1; fi
  echo "elastic ps ${ns:+(network namespaces)}: $(( $(date +%s) - t0 )) s"
}
elastic_job

# The elastic ring through the launchers: node 0's starts syncopate-rendezvous; node 1's worker is
# killed (SIGKILL) and its launcher restarts it with --resume: it re-joins the running ring with a
# member's state, nobody else restarts, and both end at the last step. With a namespace prefix,
# every node is a host of its own address (the rendezvous service on 10.77.0.1, node 0's host; each
# node's ring listener on the address it reaches the service from).
elastic_ring_job() {  # [NETNS_PREFIX]
  local ns=${1:-} port t0 i pid rc wpid addr=127.0.0.1 d=ering cmd
  port=$(free_port)
  [ -n "$ns" ] && addr=10.77.0.1 d=ering_netns port=29500
  mkdir -p "$TMP/$d"
  SPAWNED=()
  t0=$(date +%s)
  for i in 0 1; do
    cmd=(env SYNCOPATE_TOKEN=launch-test MASTER_ADDR=$addr MASTER_PORT=$port NNODES=2 NODE_RANK=$i
      "$ROOT/scripts/launch_node.sh" --max-restarts 1 -- --out "$TMP/$d/node$i" "${ARGS[@]}" --train.steps=80
      --emulate.step_time_s=0.1 --dist.mode=ring --dist.elastic=true --dist.check_every=1 --checkpoint.every=10)
    [ -n "$ns" ] && cmd=(ip netns exec "${ns}n$i" "${cmd[@]}")
    spawn "${cmd[@]}" > "$TMP/$d/node$i.log" 2>&1
  done
  for _ in $(seq 1 1200); do grep -q '"step":15,' "$TMP/$d/node1/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
  wpid=$(pgrep -f "syncopate-worker.*$TMP/$d/node1" | head -n1)
  [ -n "$wpid" ] && kill -KILL "$wpid" || { echo "FAIL: $d: node 1's worker not found"; fail=1; }
  launchers_exit0 "$d" "$t0" 180 "$TMP/$d/*.log" 0 1
  end_spawned
  grep -q "syncopate-rendezvous on $addr:$port" "$TMP/$d/node0.log" || { echo "FAIL: $d: node 0's launcher started no rendezvous service"; fail=1; }
  # node 0's launcher did not end the service with its worker: it ended by itself at the job's end
  # (once node 0's own session closed, so the launcher may find it gone already)
  grep -q "the job is over" "$TMP/$d/node0.rendezvous.log" || { echo "FAIL: $d: the service did not end with the job"; cat "$TMP/$d/node0.rendezvous.log"; fail=1; }
  grep -q "signal 15" "$TMP/$d/node0.rendezvous.log" && { echo "FAIL: $d: node 0's launcher ended the service"; fail=1; }
  grep -q "joined the running job at step" "$TMP/$d/node1.log" || { echo "FAIL: $d: node 1 did not re-join"; tail -n 20 "$TMP/$d/node1.log"; fail=1; }
  grep -q "node 1 attempt 1 --resume" "$TMP/$d/node1.log" || { echo "FAIL: $d: node 1's launcher did not restart it"; fail=1; }
  grep -q "node 0 attempt 1" "$TMP/$d/node0.log" && { echo "FAIL: $d: node 0 was restarted"; fail=1; }
  for i in 0 1; do
    grep -q '"step":80,' "$TMP/$d/node$i/metrics.jsonl" || { echo "FAIL: $d: node $i did not reach step 80"; fail=1; }
  done
  if pgrep -f "$TMP/$d" > /dev/null || pgrep -f "syncopate-rendezvous --host $addr --port $port" > /dev/null; then
    echo "FAIL: $d left processes:"; pgrep -af "$TMP/$d|syncopate-rendezvous"; fail=1
  fi
  echo "elastic ring ${ns:+(network namespaces)}: $(( $(date +%s) - t0 )) s"
}
elastic_ring_job
if [ "$(id -u)" = 0 ] && ip netns add "lnt$$" 2>/dev/null; then
  ip netns del "lnt$$"
  NS="lnt$$"
  netns_up "$NS" 3 1
  elastic_ring_job "$NS"
  elastic_job "$NS"  # the elastic ps job's join and leave, every node a host of its own address
  netns_down "$NS" 3
  NS=""
fi

# One process per GPU as torchrun --nproc-per-node=2 starts them (the same command line, torchrun's
# variables): each process is a node of the job (dist.launch=auto -> gpu; on CPU one replica each),
# and '{node}' in --out gives each its own directory. The two ring nodes end identical.
torchrun_style() {
  local port r pids=()
  port=$(free_port)
  for r in 0 1; do
    WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port SYNCOPATE_TOKEN=t \
      "${SYNCOPATE_WORKER:-$ROOT/build/bin/syncopate-worker}" --out "$TMP/torchrun/node{node}" "${ARGS[@]}" \
      --train.steps=6 --dist.mode=ring --dist.check_every=3 > "$TMP/torchrun$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}" || { echo "FAIL: torchrun-style process $r failed"; cat "$TMP/torchrun$r.log"; fail=1; }; done
  grep -q "launch layout: one process per GPU" "$TMP/torchrun0.log" || { echo "FAIL: the per-GPU layout was not detected"; cat "$TMP/torchrun0.log"; fail=1; }
  for r in 0 1; do
    grep -q '"step":6,' "$TMP/torchrun/node$r/metrics.jsonl" 2>/dev/null || { echo "FAIL: torchrun-style node $r did not write its own run"; fail=1; }
  done
  cmp -s "$TMP/torchrun/node0/checkpoints/step_000006/model.safetensors" "$TMP/torchrun/node1/checkpoints/step_000006/model.safetensors" ||
    { echo "FAIL: the two torchrun-style ring nodes ended with different weights"; fail=1; }
}
torchrun_style

# Bad input: a per-node layout without the nodes' addresses is refused by name, before anything starts.
if NNODES=2 NODE_RANK=0 SYNCOPATE_SERVERS=per-node "$ROOT/scripts/launch_node.sh" -- --out "$TMP/bad" 2> "$TMP/bad.err"; then
  echo "FAIL: per-node without SYNCOPATE_NODE_HOSTS accepted"; fail=1
fi
grep -q "SYNCOPATE_NODE_HOSTS" "$TMP/bad.err" || { echo "FAIL: the refusal does not name SYNCOPATE_NODE_HOSTS"; cat "$TMP/bad.err"; fail=1; }
[ $fail = 0 ] && echo "launch_node: PASS"
exit $fail
