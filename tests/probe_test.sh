#!/usr/bin/env bash
# syncopate-probe end to end, as a user runs it (scripts/local_cluster.sh --probe, real processes; the
# sections run in the order 1, 5, 6, 2, 3, 4):
#  1. three nodes on loopback with modelled compute (node 2 3x slower) and 20 ms of emulated latency:
#     probe.json is complete, every node and ring link is there, the step times are the modelled
#     ones (the straggler's 3x included), each round trip holds the latency both ways, every node's
#     ring all-reduce rounds of the model's size are there and hold its 4 latency hops;
#  2. a node that dies after the rendezvous (SYNCOPATE_CRASH_AT=probe:links:2): node 0 still writes
#     probe.json, "complete": false, naming the links it lacks; the others exit non-zero, not hang;
#  3. a node that never comes: the rendezvous times out and node 0's partial probe.json names it;
#  5. with the job's shards under BSP and 10 ms of emulated latency: every node's parameter-server round
#     trips of the model's size, the latency kept on the ring's links too (run after 1); --probe
#     --servers under another consistency is refused by name;
#  4. as root, in network namespaces with 0.2 Gbit/s tbf links: every link's goodput within 10% of it,
#     a parameter-server round trip (2 shards on nodes 0 and 1) no faster than node 2's link allows,
#     and every node's ring all-reduce no faster than its link brings it its share
#     (TCP/IP's framing alone takes 4.4%: 1448 B of payload per 1514 B frame; the probe takes the
#     fastest of 3 transfers, as one that a descheduled receiver stalled read 0.179 under CI's load).
#  6. scripts/launch_node.sh --role probe on two nodes with SYNCOPATE_SERVERS=per-node: the launchers
#     start each node's shard under BSP, every node's round trips are there, no shard is left;
#     a failed probe's launcher ends its shard and exits non-zero.
# Everything started is ended on exit (local_cluster.sh's process groups, spawn/end_spawned).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib.sh"
BIN=${SYNCOPATE_BIN:-$ROOT/build/bin}
PY=${SYNCOPATE_PYTHON:-python3}
export PROBE_TEST_EXPERIMENTS=$ROOT/experiments  # the assertions read a probe as the advisor does
TMP=$(mktemp -d)
cleanup() { end_spawned; rm -rf "$TMP"; }
trap cleanup EXIT
ARGS=(--model.preset=micro --train.batch_size=2 --train.threads=1 --probe.steps=6 --probe.warmup=1
      --probe.pings=8 --probe.seconds=0.1 --probe.max_mb=16 --dist.timeout_s=20)
fail=0
wait_spawned() {  # waits for every spawned process: their exit codes in `codes`, in spawn order
  codes=()
  for p in "${SPAWNED[@]}"; do
    set +e; wait "$p"; codes+=($?); set -e
  done
  SPAWNED=()
}
check() {  # NAME PYTHON-ASSERTIONS (probe.json as p)
  if "$PY" - "$2" <<PY
import json, sys
p = json.load(open(sys.argv[1]))
$3
PY
  then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi
}

# 1. Loopback, modelled compute, a 3x straggler, emulated latency.
SYNCOPATE_WORKER=$BIN/syncopate-worker "$ROOT/scripts/local_cluster.sh" --probe --nodes 3 --out "$TMP/lo" \
  --step-time 0.05 --slow-node 2 --slowdown 3 --latency-ms 20 -- "${ARGS[@]}" > "$TMP/lo.log" 2>&1 ||
  { echo "FAIL: local_cluster.sh --probe exited non-zero"; tail -n 30 "$TMP/lo.log"; exit 1; }
grep -q "goodput" "$TMP/lo.log" || { echo "FAIL: no table printed"; fail=1; }
check "loopback: complete, every node and link, modelled steps, latency both ways" "$TMP/lo/probe.json" '
assert p["format"] == "syncopate-probe/1" and p["complete"] is True and p["missing"] == [], p["missing"]
assert [n["node"] for n in p["nodes"]] == [0, 1, 2]
assert sorted((l["from"], l["to"]) for l in p["links"]) == [(0, 1), (1, 2), (2, 0)]
assert p["job"]["nodes"] == 3 and p["job"]["params"] > 100000 and p["job"]["emulated_step_s"] == 0.05
for n in p["nodes"]:
    want = 0.15 if n["node"] == 2 else 0.05
    assert len(n["step_s"]["samples"]) == 6
    assert want <= n["step_s"]["min"] < want + 0.03, (n["node"], n["step_s"])   # paced to the modelled time
    assert n["memory"]["rss_peak_bytes"] > 10 << 20 and n["memory"]["host_available_bytes"] > 0, n["memory"]
assert "ps" not in p                                       # no servers, no parameter-server rounds
rx = p["ring_exchange"]
assert rx["rounds"] == 10 and 0.05 <= rx["gap_s"] < 0.08 and sorted(n["node"] for n in rx["nodes"]) == [0, 1, 2], rx
for n in rx["nodes"]:
    assert len(n["round_s"]["samples"]) == 10, n
    # 2 (n - 1) = 4 hops of 20 ms one way; a node that starts its round late finds its first message
    # waiting, but its own contribution still goes 3 hops before the all-reduce brings it back
    assert n["round_s"]["min"] >= 3 * 0.02, n["round_s"]
    assert n["bytes_sent"] >= 2 * 2 / 3 * 4 * p["job"]["params"] - 64, n   # 2 (n - 1) / n of the model, float32
for l in p["links"]:
    assert l["rtt_us"]["min"] >= 40000, l["rtt_us"]          # 20 ms each way
    assert l["rtt_us"]["median"] < 40000 + 200000, l["rtt_us"]
    assert l["goodput_gbit"] > 0 and l["bytes"] >= 1 << 20
'

# 5. With the job's shards (--servers 2 --consistency bsp): every node's parameter-server round trips.
SYNCOPATE_WORKER=$BIN/syncopate-worker "$ROOT/scripts/local_cluster.sh" --probe --nodes 3 --out "$TMP/ps" \
  --servers 2 --consistency bsp --encrypt off --step-time 0.05 --latency-ms 10 -- "${ARGS[@]}" --probe.ps_rounds=5 \
  > "$TMP/ps.log" 2>&1 ||
  { echo "FAIL: local_cluster.sh --probe --servers exited non-zero"; tail -n 30 "$TMP/ps.log"; exit 1; }
grep -q "parameter-server round trips" "$TMP/ps.log" || { echo "FAIL: no round-trip table printed"; fail=1; }
grep -q "shard 1: tcp://127.0.0.1:[0-9]* at the address of nodes 0, 1, 2 (one host)" "$TMP/ps.log" ||
  { echo "FAIL: where the shards run is not printed"; fail=1; }
grep -q "spread rounds to ASP shards not timed: nodes share the address" "$TMP/ps.log" ||
  { echo "FAIL: why the spread rounds were skipped is not printed"; fail=1; }
check "loopback with servers: every node's BSP round trips of the model's size" "$TMP/ps/probe.json" '
assert p["complete"] is True and p["missing"] == [], p["missing"]
for l in p["links"]:
    assert l["rtt_us"]["min"] >= 20000, l["rtt_us"]          # the emulated 10 ms each way, servers or not
for n in p["ps"]["nodes"]:
    assert n["round_s"]["min"] >= 0.02, n["round_s"]         # the servers hold every message 10 ms too
ps = p["ps"]
assert ps["servers"] == 2 and ps["rounds"] == 5 and len(ps["endpoints"]) == 2, ps
assert 0.05 <= ps["gap_s"] < 0.08, ps["gap_s"]              # a base step apart: the modelled 0.05 s
assert sorted(n["node"] for n in ps["nodes"]) == [0, 1, 2]
P = p["job"]["params"]
for n in ps["nodes"]:
    assert len(n["round_s"]["samples"]) == 5 and 0 < n["round_s"]["min"] <= n["round_s"]["median"] < 5, n
    assert n["bytes_pushed"] >= 4 * P and n["bytes_received"] >= 4 * P, (n, P)   # f32 both ways, headers on top
    assert n["bytes_pushed"] < 4 * P + 65536, (n, P)
# Where the shards run: every node and shard at 127.0.0.1 (one host), so the advisor cannot tell which
# node link a shard shares, and says so.
import os; sys.path.insert(0, os.environ["PROBE_TEST_EXPERIMENTS"]); import advise
assert [n["address"] for n in p["nodes"]] == ["127.0.0.1"] * 3, p["nodes"]
assert ps["endpoint_addresses"] == ["127.0.0.1"] * 2, ps
placed = advise.calibrate(p)["placement"]
assert placed["placement"] is None and "nodes share an address" in placed["why"], placed
# Nor which node would host the probe ASP shards: the spread rounds are skipped, and say why.
assert "nodes" not in p["ps_spread"] and "nodes share the address 127.0.0.1" in p["ps_spread"]["skipped"], p["ps_spread"]
assert advise.calibrate(p)["exchanges"]["ps_spread"] is None
'
SYNCOPATE_WORKER=$BIN/syncopate-worker "$ROOT/scripts/local_cluster.sh" --probe --nodes 2 --out "$TMP/psasp" \
  --servers 1 -- "${ARGS[@]}" > "$TMP/psasp.log" 2>&1 && { echo "FAIL: --probe --servers under asp accepted"; fail=1; } ||
  { grep -q "consistency bsp" "$TMP/psasp.log" && echo "ok: --probe --servers without bsp refused by name" ||
    { echo "FAIL: no named refusal"; cat "$TMP/psasp.log"; fail=1; }; }

# 6. As on real machines: scripts/launch_node.sh --role probe on each of two nodes, SYNCOPATE_SERVERS=per-node
#    (each node's launcher starts its shard under BSP): every node's round trips, and every shard gone after.
base=$("$PY" - <<'PY'
import socket
for _ in range(200):
    held = []
    try:
        s = socket.socket(); s.bind(("127.0.0.1", 0)); base = s.getsockname()[1]; held.append(s)
        t = socket.socket(); t.bind(("127.0.0.1", base + 1)); held.append(t)
        print(base); break
    except OSError:
        pass
    finally:
        for x in held: x.close()
PY
)
port=$(free_port)
for i in 0 1; do
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port NNODES=2 NODE_RANK=$i SYNCOPATE_TOKEN=probe-launch SYNCOPATE_SERVERS=per-node \
    SYNCOPATE_NODE_HOSTS=127.0.0.1,127.0.0.1 SYNCOPATE_PS_PORT=$base \
    spawn "$ROOT/scripts/launch_node.sh" --role probe -- --out "$TMP/launch.json" "${ARGS[@]}" --probe.ps_rounds=3 \
    > "$TMP/launch$i.log" 2>&1
done
wait_spawned
if [ "${codes[*]}" = "0 0" ]; then echo "ok: launch_node.sh --role probe exits 0 on every node"
else echo "FAIL: launch_node.sh --role probe exit codes ${codes[*]}"; tail -n 20 "$TMP"/launch*.log; fail=1; fi
check "launch_node.sh --role probe: the shards of SYNCOPATE_SERVERS timed, every node" "$TMP/launch.json" '
assert p["complete"] is True, p["missing"]
assert p["ps"]["servers"] == 2 and len(p["ps"]["nodes"]) == 2 and len(p["ring_exchange"]["nodes"]) == 2, p["ps"]
'
[ -n "$base" ] || { echo "FAIL: no two consecutive free ports"; exit 1; }
if pgrep -f "syncopate-server.*--server.port=$base( |$)" > /dev/null || pgrep -f "syncopate-server.*--server.port=$((base + 1))( |$)" > /dev/null; then
  echo "FAIL: a probe shard outlived its launcher"; fail=1
else echo "ok: no probe shard left running"; fi
# A probe that fails (its peer never comes: the rendezvous times out) never reached the shards, which
# would wait for it forever: its launcher ends them and exits non-zero.
port=$(free_port)
t0=$SECONDS
MASTER_ADDR=127.0.0.1 MASTER_PORT=$port NNODES=2 NODE_RANK=0 SYNCOPATE_TOKEN=probe-launch SYNCOPATE_SERVERS=per-node \
  SYNCOPATE_NODE_HOSTS=127.0.0.1,127.0.0.1 SYNCOPATE_PS_PORT=$base \
  spawn "$ROOT/scripts/launch_node.sh" --role probe -- --out "$TMP/launch_fail.json" "${ARGS[@]}" --dist.timeout_s=3 \
  > "$TMP/launch_fail.log" 2>&1
wait_spawned
if [ "${codes[0]}" != 0 ] && [ $((SECONDS - t0)) -lt 60 ] && ! pgrep -f "syncopate-server.*--server.port=$base( |$)" > /dev/null; then
  echo "ok: a failed probe's launcher exits ${codes[0]} in $((SECONDS - t0)) s and ends its shard"
else echo "FAIL: a failed probe's launcher: exit ${codes[0]} after $((SECONDS - t0)) s"; tail -n 10 "$TMP/launch_fail.log"; fail=1; fi

# 2. A node dies after the rendezvous: partial, named.
export SYNCOPATE_TOKEN=probetest MASTER_ADDR=127.0.0.1 NNODES=3
export MASTER_PORT=$(free_port)
for i in 0 1 2; do
  NODE_RANK=$i SYNCOPATE_CRASH_AT=probe:links:2 spawn "$BIN/syncopate-probe" --out "$TMP/dead.json" "${ARGS[@]}" \
    --dist.timeout_s=5 > "$TMP/dead$i.log" 2>&1
done
wait_spawned
if [ "${codes[0]}" = 1 ] && [ "${codes[1]}" != 0 ] && [ "${codes[2]}" != 0 ]; then echo "ok: every node exited non-zero (${codes[*]})"
else echo "FAIL: exit codes ${codes[*]}"; tail -n 5 "$TMP"/dead*.log; fail=1; fi
grep -q 'the result is partial' "$TMP/dead0.log" || { echo "FAIL: node 0 did not say the result is partial"; cat "$TMP/dead0.log"; fail=1; }
check "a node that dies: node 0's probe.json says what is missing" "$TMP/dead.json" '
assert p["complete"] is False
assert len(p["nodes"]) == 3, "the step records were gathered before the links"
links = {m["what"]: m["why"] for m in p["missing"] if m["what"].startswith("link ")}
assert sorted(links) == ["link 0->1", "link 1->2", "link 2->0"], p["missing"]
assert "node 2" in links["link 0->1"], links   # node 0 failed on its link from node 2: that is who is named
assert len(p["links"]) == 0
'

# 3. A node that never comes.
export MASTER_PORT=$(free_port)
for i in 0 1; do
  NODE_RANK=$i spawn "$BIN/syncopate-probe" --out "$TMP/absent.json" "${ARGS[@]}" --dist.timeout_s=3 > "$TMP/absent$i.log" 2>&1
done
wait_spawned
[ "${codes[0]}" = 1 ] && echo "ok: node 0 exits 1 when a node never comes" || { echo "FAIL: node 0 exit ${codes[0]}"; fail=1; }
check "a node that never comes: named in the partial probe.json" "$TMP/absent.json" '
assert p["complete"] is False and len(p["nodes"]) == 1
why = {m["what"]: m["why"] for m in p["missing"]}
assert "node(s) 2 did not connect" in why["the ring"], p["missing"]   # the absent node, named
assert "nodes 1..2" in why, p["missing"]
'
unset SYNCOPATE_TOKEN MASTER_ADDR NNODES MASTER_PORT

# 4. Network namespaces with rate-limited links.
if [ "$(id -u)" = 0 ] && command -v ip > /dev/null; then
  SYNCOPATE_WORKER=$BIN/syncopate-worker "$ROOT/scripts/local_cluster.sh" --probe --nodes 3 --out "$TMP/ns" --netns \
    --link-gbit 0.2 --servers 2 --consistency bsp --encrypt off -- "${ARGS[@]}" --probe.seconds=1 --probe.max_mb=64 \
    --probe.ps_rounds=5 --probe.spread_rounds=5 > "$TMP/ns.log" 2>&1 ||
    { echo "FAIL: local_cluster.sh --probe --netns exited non-zero"; tail -n 30 "$TMP/ns.log"; exit 1; }
  check "netns: every link's goodput within 10% of the 0.2 Gbit/s tbf rate" "$TMP/ns/probe.json" '
assert p["complete"] is True
for l in p["links"]:
    assert abs(l["goodput_gbit"] / 0.2 - 1) <= 0.10, l
    assert len(l["repeats_gbit"]) == 3 and l["goodput_gbit"] == max(l["repeats_gbit"]), l
print("  goodput Gbit/s:", [round(l["goodput_gbit"], 4) for l in p["links"]])
# Each node at the address of its namespace, shard k at that of node k (local_cluster.sh --netns): the
# advisor finds the shards on nodes 0 and 1, sharing their links.
import os; sys.path.insert(0, os.environ["PROBE_TEST_EXPERIMENTS"]); import advise
addrs = [n["address"] for n in sorted(p["nodes"], key=lambda n: n["node"])]
assert len(set(addrs)) == 3 and all(a.startswith("10.") for a in addrs), addrs
assert p["ps"]["endpoint_addresses"] == addrs[:2], (p["ps"]["endpoint_addresses"], addrs)
placed = advise.calibrate(p)["placement"]
assert placed["placement"] == "nodes" and placed["shard_nodes"] == [0, 1], placed
# The parameter-server rounds cannot beat the links. Shard k runs on node k (local_cluster.sh --netns), so
# node 2 hosts none: its round pushes the whole gradient (4 P bytes) up its own link and, after the BSP
# release, takes the whole model back down it, each at 0.2 Gbit/s less what its tbf lets through at once
# after the gap between rounds (its burst: 8 ms of the rate, netns.sh). (Nodes 0 and 1 have no such
# floor of their own: the replies of a shard to the others overlap their next gap.)
P = p["job"]["params"]
rate = 0.2e9 / 8
burst = max(16384, rate * 0.008)
floor = 2 * max(0.0, 4 * P - burst) / rate
rounds = {n["node"]: n["round_s"] for n in p["ps"]["nodes"]}
assert rounds[2]["min"] >= 0.9 * floor, (rounds[2], floor)
# A ring all-reduce brings every node 2 (n - 1) / n of the model down its own link before it ends.
ring_floor = max(0.0, 2 * 2 / 3 * 4 * P - burst) / rate
for n in p["ring_exchange"]["nodes"]:
    assert n["round_s"]["min"] >= 0.9 * ring_floor, (n["round_s"], ring_floor)
print("  ring round s (min):", [round(n["round_s"]["min"], 4) for n in p["ring_exchange"]["nodes"]],
      "floor", round(ring_floor, 4))
print("  ps round s (min, median):", [(round(r["min"], 4), round(r["median"], 4)) for _, r in sorted(rounds.items())],
      "node 2 floor", round(floor, 4))
# The spread rounds: the probe'"'"'s own ASP shards at the job'"'"'s shards'"'"' addresses (nodes 0 and 1), every
# node'"'"'s round trips timed; node 2 hosts none, so its round still carries the model up and down its link.
sp = p["ps_spread"]
assert "skipped" not in sp and sp["consistency"] == "asp" and sp["servers"] == 2 and sp["rounds"] == 5, sp
assert [e.split("//")[1].rsplit(":", 1)[0] for e in sp["endpoints"]] == addrs[:2], (sp["endpoints"], addrs)
assert all(e not in p["ps"]["endpoints"] for e in sp["endpoints"]), sp["endpoints"]   # their own shards
assert sorted(n["node"] for n in sp["nodes"]) == [0, 1, 2], sp["nodes"]
for n in sp["nodes"]:
    assert len(n["round_s"]["samples"]) == 5 and n["bytes_pushed"] >= 4 * P and n["bytes_received"] >= 4 * P, n
# Under ASP a shard replies as soon as its own part is in, so the reply of one shard may come down node 2'"'"'s
# link while its push to the other still goes up (which TCP connection finishes first is TCP'"'"'s choice): BSP'"'"'s
# floor (the whole model up, then the whole model down) does not bound these rounds, and an assertion on it
# failed once in three runs (0.0195 s against 0.9 x 0.0239 s). What does: the whole gradient up, then at
# least the last part'"'"'s reply down (4 P / parts bytes; near-equal parts) after it, each less what a bucket
# passes at once.
spread = {n["node"]: n["round_s"] for n in sp["nodes"]}
parts2 = {n["node"]: n["parts"] for n in sp["nodes"]}[2]
spread_floor = (max(0.0, 4 * P - burst) + max(0.0, 4 * P / parts2 - burst)) / rate
assert spread[2]["min"] >= 0.9 * spread_floor, (spread[2], spread_floor)
cl = advise.calibrate(p)
advise.use_spread_rounds(cl, "asp")   # (--spread-calibration asp; the default, none, leaves them unused)
assert cl["exchanges"]["ps_spread"]["servers"] == 2 and advise.exchange_pattern("asp_lr_scale", cl) == "ps_spread"
print("  spread round s (min, median):", [(round(r["min"], 4), round(r["median"], 4)) for _, r in sorted(spread.items())],
      "node 2 floor", round(spread_floor, 4))
'
else
  echo "network namespaces: not root, skipped"
fi
exit $fail
