#!/usr/bin/env bash
# The cluster script as a user runs it: a 2-node ring and a 2-worker/1-server ps run with a
# straggler (modelled compute), on loopback. Checks that every node finished its steps, logged
# staleness and the emulation's timings, and that the server logged its statistics on the way out.
# Then interrupts a run (loopback, and network namespaces when this is root) and checks that no
# process of it and no namespace is left.
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
  --step-time 0.05 --slow-node 1 --slowdown 2 --trace --out "$TMP/ps" -- "${ARGS[@]}" > "$TMP/ps.out"
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
grep -q '"modelled_s":0.1,' "$TMP/ps/node1/metrics.jsonl" || { echo "FAIL: the slow node's modelled time is not 0.05 x 2"; fail=1; }
grep -q '"wait_s"' "$TMP/ps/node0/metrics.jsonl" || { echo "FAIL: no wait_s in the metrics"; fail=1; }
grep -q '\[server 0\] stats {' "$TMP/ps/logs/server0.log" || { echo "FAIL: the server did not log its statistics on exit"; cat "$TMP/ps/logs/server0.log"; fail=1; }
# The run ends with its summary: a row per node with its steps and final validation loss, and where
# the files are.
for run in ring ps; do
  for i in 0 1; do
    grep -qE "^ +$i +10 +[0-9]+\.[0-9]{4} +[0-9]+ " "$TMP/$run.out" ||
      { echo "FAIL: $run: the summary has no row for node $i with 10 steps and a final validation loss"; cat "$TMP/$run.out"; fail=1; }
  done
  grep -q "files: $TMP/$run/node<i>/metrics.jsonl" "$TMP/$run.out" || { echo "FAIL: $run: the summary does not say where the files are"; fail=1; }
done
grep -qE "^ +1 +10 +[0-9.]+ +[0-9]+ +[0-9]+\.[0-9]{2} " "$TMP/ps.out" && ! grep -qE "^ +1 +10 +[0-9.]+ +[0-9]+ +0\.00 " "$TMP/ps.out" ||
  { echo "FAIL: ps: the summary shows no bytes sent by node 1"; cat "$TMP/ps.out"; fail=1; }
# --trace: every process's timeline merged on one clock (shard 0's): the step phases, the modelled
# compute's sleep, each push and pull, the server's apply and the SSP rule holding the fast node.
python3 - "$TMP/ps/trace.json" <<'PY' || fail=1
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"]
names = {e["name"] for e in ev if e.get("ph") == "X"}
need = {"step", "data", "forward", "backward", "reduce and update", "modelled compute (sleep)", "push and pull",
        "apply push", "held: too far ahead of the slowest (ssp)"}
missing = need - names
offsets = t["otherData"]["offsets_us"]
procs = {e["args"]["name"] for e in ev if e.get("name") == "process_name"}
ok = not missing and t["otherData"]["reference_clock"] == "server shard 0" and \
    procs == {"worker node 0", "worker node 1", "server shard 0"} and set(offsets) == procs
# on one host the measured offsets are small (well under a second)
ok = ok and all(abs(v) < 1e6 for v in offsets.values())
pushes = [e for e in ev if e.get("name") == "push and pull"]
ok = ok and len(pushes) == 20 and all(e["dur"] > 0 for e in pushes)
if not ok:
    print("FAIL: trace: missing", missing, "procs", procs, "offsets", offsets, "pushes", len(pushes))
sys.exit(0 if ok else 1)
PY
# A trace path that cannot be written fails at start, naming it.
if "${SYNCOPATE_WORKER:-$ROOT/build/bin/syncopate-worker}" --trace.file=/nonexistent-dir/t.json "${ARGS[@]}" --out "$TMP/badtrace" 2> "$TMP/badtrace.err"; then
  echo "FAIL: an unwritable trace path was accepted"; fail=1
fi
grep -q "/nonexistent-dir/t.json" "$TMP/badtrace.err" || { echo "FAIL: the trace error does not name the path"; cat "$TMP/badtrace.err"; fail=1; }
[ -e "$TMP/badtrace/metrics.jsonl" ] && { echo "FAIL: a run with an unwritable trace started training"; fail=1; }
# A slow node without a modelled step time is refused by name.
if "$ROOT/scripts/local_cluster.sh" --nodes 2 --slow-node 1 --slowdown 2 --out "$TMP/bad" -- "${ARGS[@]}" 2> "$TMP/bad.err"; then
  echo "FAIL: --slow-node without --step-time was accepted"; fail=1
fi
grep -q -- "--step-time" "$TMP/bad.err" || { echo "FAIL: the refusal does not name --step-time"; fail=1; }

# Interrupted runs leave nothing behind: no process whose command line names the run, no namespace.
interrupt() {  # NAME SIGNAL TARGET EXTRA_ARGS...: TARGET "group" (Ctrl-C: the whole foreground group) or
               # "script" (a scheduler or parent ending the script alone: its children must not outlive it)
  local name=$1 sig=$2 target=$3; shift 3
  # Job control gives the run its own process group, as a terminal does; Ctrl-C sends SIGINT to that
  # whole group (without it, bash starts background commands with SIGINT ignored).
  set -m
  "$ROOT/scripts/local_cluster.sh" --nodes 2 --servers 1 "$@" --out "$TMP/$name" -- "${ARGS[@]}" --train.steps=100000 \
    > "$TMP/$name.out" 2>&1 &
  local pid=$! t
  set +m
  # a readiness wait, not a timing check: generous, for a loaded 2-core machine (other tests run alongside)
  for t in $(seq 1 900); do grep -q '"step":2,' "$TMP/$name/node1/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
  grep -q '"step":2,' "$TMP/$name/node1/metrics.jsonl" 2>/dev/null || { echo "FAIL: $name never started"; cat "$TMP/$name.out"; fail=1; }
  if [ "$target" = group ]; then kill "-$sig" -- "-$pid"; else kill "-$sig" "$pid"; fi
  timeout 20 tail --pid="$pid" -f /dev/null || { echo "FAIL: $name did not stop within 20 s of SIG$sig"; fail=1; }
  sleep 0.5
  if pgrep -f "$TMP/$name" > /dev/null; then
    echo "FAIL: $name left processes:"; pgrep -af "$TMP/$name"; fail=1; pkill -9 -f "$TMP/$name" || true
  fi
}
interrupt loopback INT group
if [ "$(id -u)" = 0 ] && ip netns add "sctest$$" 2>/dev/null; then
  ip netns del "sctest$$"
  before=$(ip netns list | wc -l)
  interrupt netns TERM script --netns --link-gbit 1 --link-burst-ms 1
  after=$(ip netns list | wc -l)
  [ "$before" = "$after" ] || { echo "FAIL: namespaces left: $(ip netns list)"; fail=1; }
  # Before the namespaces went, the links' counters and TCP's retransmissions were written (netns_stats).
  # --link-burst-ms 1 at 1 Gbit/s: a bucket of 1 ms of the rate on both ends of every link.
  for w in "node 0 uplink: qdisc tbf [^ ]* root refcnt [0-9]* rate 1Gbit burst 125000b" "node 0 tcp: TcpOutSegs=" \
           "node 1 downlink: qdisc tbf [^ ]* root refcnt [0-9]* rate 1Gbit burst 125000b"; do
    grep -q "$w" "$TMP/netns/logs/netstats.txt" 2>/dev/null ||
      { echo "FAIL: netstats.txt lacks '$w':"; cat "$TMP/netns/logs/netstats.txt" 2>&1; fail=1; }
  done
else
  echo "NOTE: not root or no network namespaces here: the netns interrupt check did not run"
fi
# --link-burst-ms without --netns names what it needs, before anything starts.
rc=0; "$ROOT/scripts/local_cluster.sh" --nodes 2 --link-burst-ms 1 --out "$TMP/burst" -- "${ARGS[@]}" > "$TMP/burst.out" 2>&1 || rc=$?
[ $rc = 2 ] && grep -q "link-burst-ms .*give --netns --link-gbit" "$TMP/burst.out" ||
  { echo "FAIL: --link-burst-ms without --netns was not refused by name (rc $rc)"; cat "$TMP/burst.out"; fail=1; }
[ -d "$TMP/burst/node0" ] && { echo "FAIL: a node started before the refusal"; fail=1; }
# The parameter-server benchmark too: interrupted in namespace mode, it leaves no server behind
# (its processes carry SYNCOPATE_TOKEN=bench-<its PID> in their environment).
left_by() {  # PIDs of processes whose environment holds SYNCOPATE_TOKEN=$1
  local e
  for e in /proc/[0-9]*/environ; do
    { tr '\0' '\n' < "$e"; } 2>/dev/null | grep -qx "SYNCOPATE_TOKEN=$1" && echo "${e//[^0-9]/}"
  done
  return 0
}
if [ "$(id -u)" = 0 ] && ip netns add "sctest$$" 2>/dev/null; then
  ip netns del "sctest$$"
  before=$(ip netns list | wc -l)
  set -m
  "$ROOT/scripts/bench_ps.sh" --workers 2 --servers 2 --bytes 1048576 --iters 1000000 --netns --link-gbit 1 \
    > "$TMP/bench_ps.out" 2>&1 &
  bpid=$!
  set +m
  for t in $(seq 1 100); do [ -n "$(left_by "bench-$bpid")" ] && break; sleep 0.1; done
  [ -n "$(left_by "bench-$bpid")" ] || { echo "FAIL: bench_ps.sh never started its processes"; cat "$TMP/bench_ps.out"; fail=1; }
  sleep 1
  kill -TERM "$bpid"  # the script alone (the version before issue 14 left its servers running here)
  timeout 20 tail --pid="$bpid" -f /dev/null || { echo "FAIL: bench_ps.sh did not stop within 20 s of SIGTERM"; fail=1; }
  sleep 0.5
  left=$(left_by "bench-$bpid")
  [ -z "$left" ] || { echo "FAIL: bench_ps.sh left processes: $left"; kill -9 $left 2>/dev/null; fail=1; }
  [ "$before" = "$(ip netns list | wc -l)" ] || { echo "FAIL: bench_ps.sh left namespaces: $(ip netns list)"; fail=1; }
  if compgen -G "/tmp/syncopate-bench-ps.$bpid.*" > /dev/null; then
    echo "FAIL: bench_ps.sh left its output directory"; rm -rf "/tmp/syncopate-bench-ps.$bpid."*; fail=1
  fi
fi
[ $fail = 0 ] && echo "local cluster: ring and ps runs complete, nothing left after an interrupt"
exit $fail
