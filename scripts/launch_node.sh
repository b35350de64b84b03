#!/usr/bin/env bash
# Starts one node of a job: its syncopate-worker and, in ps mode, the parameter-server shards that
# live on this node; restarts them from their checkpoints when they fail, up to --max-restarts
# times. Run the same command on every node (README "On real machines"; scripts/slurm/ has sbatch
# examples). The environment is torchrun's, or Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_NODELIST):
#
#   MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NNODES=4 NODE_RANK=<i> SYNCOPATE_TOKEN_FILE=~/.syncopate_token \
# Usage: scripts/launch_node.sh [--max-restarts K] [--server-arg ARG ...] -- --out runs/job [worker args...]
#        scripts/launch_node.sh --role probe [--server-arg ARG ...] -- --out probe.json [probe args...]
#        scripts/launch_node.sh --role servers     (prints the shard list SYNCOPATE_SERVERS resolves to)
#
# Ring mode: nothing more (the worker meets the others at MASTER_ADDR:MASTER_PORT).
# Parameter-server mode: set SYNCOPATE_SERVERS, the same on every node; the launcher adds
# --dist.mode=ps --dist.servers=<the shard list> to the worker's arguments.
#   SYNCOPATE_SERVERS=per-node[:K]   K shards (default 1) on every node, co-located with its worker
#                    (as BytePS and ps-lite deploy them). Shard k = j*NNODES + i is node i's j-th and
#                    listens on HOST_i:(SYNCOPATE_PS_PORT + k). HOST_i is the i-th entry of
#                    SYNCOPATE_NODE_HOSTS (addresses or names, comma-separated), or under Slurm the
#                    i-th host of SLURM_JOB_NODELIST; SYNCOPATE_PS_PORT defaults to MASTER_PORT + 1.
#   SYNCOPATE_SERVERS=H:P,H:P,...    an explicit shard list (shard k is the k-th entry), with
#     SYNCOPATE_SERVER_LAYOUT=colocated (default): node i starts the shards k with k mod NNODES == i
#                    (each must name an address of that node);
#     SYNCOPATE_SERVER_LAYOUT=dedicated: workers' nodes start none; on each server host run
#                    scripts/launch_node.sh --role server --shard k [--max-restarts K] [--server-arg ARG ...]
# --server-arg ARG (repeatable) passes ARG to every shard, e.g. --server-arg --ps.consistency=bsp.
# --role probe runs syncopate-probe instead of the worker (and this node's shards under BSP, with
# SYNCOPATE_SERVERS), for scripts/syncopate-advise: the same command on every node.
# The worker's --config FILE goes to the co-located shards too (they read its [ps] and [server]
# sections); dedicated shards take it as --server-arg --config=FILE.
# A shard binds only its own address, keeps its checkpoint in OUT/server<k>/ (SYNCOPATE_SERVER_DIR
# for --role server) and resumes from it when restarted; it exits by itself once every worker has
# finished or died (server.exit_when_done), and this launcher waits for that before it exits, so
# that a slower node's worker can still push to the shards of a node that is done.
#
# --dist.mode=auto among the worker's arguments (with --dist.advice=FILE, default advice.json: what
# scripts/syncopate-advise wrote): the launcher reads the advice's recommendation. A parameter-server
# recommendation starts the shards of SYNCOPATE_SERVERS (required then) with the advice's server flags
# (before any --server-arg, which still wins); a ring or local SGD one starts none (SYNCOPATE_SERVERS
# is then ignored, with a note). The worker applies the advice's [dist] flags itself.
# With --dist.readvise_every=N too (worker/train/readvise.h), the job re-decides while it runs: when a
# node drifts from the advice, node 0's worker asks this launcher (OUT/readvise.request), which runs
# syncopate-advise --from-run on the nodes' output directories (SYNCOPATE_READVISE_RUNS, default the
# parent of --out: node 0 must read every node's directory, as under scripts/local_cluster.sh or a
# shared home) in the background, niced, with SYNCOPATE_READVISE_ARGS (e.g. "--seeds 1"); if the new
# pick differs, every worker checkpoints at a decision step and exits 75, and its launcher restarts it
# with --resume --dist.advice=OUT/advice.next.json, stopping the earlier phase's shards and starting
# the new pick's (from the workers' weights: an earlier phase's shard directories are moved aside).
#
# Elastic ring (--dist.mode=ring --dist.elastic=true): node 0's launcher also starts
# syncopate-rendezvous on MASTER_ADDR:MASTER_PORT (the membership service every node keeps a session
# with), unless SYNCOPATE_RENDEZVOUS=external (you run `scripts/launch_node.sh --role rendezvous` on
# a host that outlives the nodes: the job cannot re-form without it). Node 0's launcher keeps the
# service after its own worker ends (done, preempted or failed) until the job is over (the last step
# done and every node's session ended, or 10 minutes without any node); a TERM/INT to that launcher
# ends it at once, so on hosts that can be reclaimed use the external one. A node added to a running job
# is one more launcher with its own NODE_RANK (>= NNODES); a failed worker restarted by its launcher
# (--max-restarts) re-joins the running ring with a member's state instead of restarting the job.
#
# When one node dies, the others stop within dist.timeout_s with an error naming it (fixed ring),
# re-form without it (elastic ring) or go on without it (ps, asynchronous modes); every launcher
# restarts its worker with --resume.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/build/bin"
WORKER="${SYNCOPATE_WORKER:-$BIN/syncopate-worker}"
SERVER="${SYNCOPATE_SERVER:-$(dirname "$WORKER")/syncopate-server}"
MAX_RESTARTS=0 ROLE=node SHARD=-1 SERVER_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --max-restarts) MAX_RESTARTS=$2; shift 2;;
    --server-arg) SERVER_ARGS+=("$2"); shift 2;;
    --role) ROLE=$2; shift 2;;
    --shard) SHARD=$2; shift 2;;
    --) shift; break;;
    *) echo "launch_node.sh: unknown option $1 (see the header of this script)" >&2; exit 2;;
  esac
done
die() { echo "launch_node.sh: $*" >&2; exit 2; }
RENDEZVOUS="${SYNCOPATE_RENDEZVOUS_BIN:-$(dirname "$WORKER")/syncopate-rendezvous}"
NNODES=${NNODES:-${SLURM_NTASKS:-1}}
NODE=${NODE_RANK:-${SLURM_PROCID:-0}}

# The nodes' hosts, as given (a shard resolves a name to the address it binds).
node_hosts() {
  local list=${SYNCOPATE_NODE_HOSTS:-}
  if [ -z "$list" ] && [ -n "${SLURM_JOB_NODELIST:-}" ] && command -v scontrol > /dev/null; then
    list=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)
  fi
  [ -n "$list" ] || die "SYNCOPATE_SERVERS=per-node needs the nodes' addresses: set SYNCOPATE_NODE_HOSTS=h0,h1,... (or run under Slurm)"
  IFS=, read -ra hs <<< "$list"
  [ "${#hs[@]}" -ge "$NNODES" ] || die "SYNCOPATE_NODE_HOSTS names ${#hs[@]} hosts for NNODES=$NNODES"
  echo "${hs[*]:0:$NNODES}"
}

# The shard list every node derives the same way (comma-separated tcp://IP:PORT).
shard_list() {
  local spec=$1
  if [[ $spec == per-node* ]]; then
    local per=1 base=${SYNCOPATE_PS_PORT:-$(( ${MASTER_PORT:-29500} + 1 ))} hosts k j i list=""
    [[ $spec == per-node:* ]] && per=${spec#per-node:}
    [[ $per =~ ^[1-9][0-9]*$ ]] || die "SYNCOPATE_SERVERS=$spec: the shards per node must be a positive integer"
    read -ra hosts <<< "$(node_hosts)" || exit 2
    [ "${#hosts[@]}" -ge "$NNODES" ] || exit 2
    for j in $(seq 0 $((per - 1))); do
      for i in $(seq 0 $((NNODES - 1))); do
        k=$((j * NNODES + i))
        list="$list${list:+,}tcp://${hosts[$i]}:$((base + k))"
      done
    done
    echo "$list"
  else
    local e list=""
    IFS=, read -ra eps <<< "$spec"
    for e in "${eps[@]}"; do
      e=${e#tcp://}
      [[ $e =~ ^[^:]+:[0-9]+$ ]] || die "SYNCOPATE_SERVERS entry '$e' is not HOST:PORT (or use per-node[:K])"
      list="$list${list:+,}tcp://$e"
    done
    echo "$list"
  fi
}

# --role server: one shard, restarted from its checkpoint when it fails. Signals reach the shard
# (which checkpoints on the way out).
run_shard() {  # K ENDPOINT DIR
  local k=$1 ep=$2 dir=$3 attempt=0 rc child
  local host=${ep#tcp://}; host=${host%:*}
  local port=${ep##*:}
  trap '[ -n "${child:-}" ] && kill -TERM "$child" 2>/dev/null; wait; exit 143' TERM INT
  while :; do
    echo "[launch] shard $k on $ep attempt $attempt"
    "$SERVER" --server.host="$host" --server.port="$port" --server.shard="$k" --server.checkpoint_dir="$dir" \
      --server.exit_when_done=true "${SERVER_ARGS[@]}" &
    child=$!
    wait "$child"; rc=$?
    [ $rc -eq 0 ] && exit 0
    [ $rc -eq 2 ] && { echo "[launch] shard $k: configuration error, not restarting" >&2; exit 2; }
    attempt=$((attempt + 1))
    [ $attempt -gt "$MAX_RESTARTS" ] && { echo "[launch] shard $k failed (exit $rc); --max-restarts=$MAX_RESTARTS used up" >&2; exit $rc; }
    echo "[launch] shard $k failed (exit $rc); restarting from its checkpoint in 1 s" >&2
    sleep 1
  done
}

SERVERS_LIST=""
[ -n "${SYNCOPATE_SERVERS:-}" ] && { SERVERS_LIST=$(shard_list "$SYNCOPATE_SERVERS") || exit 2; }
IFS=, read -ra EPS <<< "$SERVERS_LIST"

# --role servers: prints the job's shard list (what every node derives from SYNCOPATE_SERVERS) and
# exits; scripts/slurm/ps.sbatch records it for nodes added to the running job later.
if [ "$ROLE" = servers ]; then
  [ -n "$SERVERS_LIST" ] || die "--role servers needs SYNCOPATE_SERVERS (e.g. per-node:2)"
  echo "$SERVERS_LIST"
  exit 0
fi

if [ "$ROLE" = server ]; then
  [ -n "$SERVERS_LIST" ] || die "--role server needs SYNCOPATE_SERVERS (the job's shard list)"
  [ "$SHARD" -ge 0 ] && [ "$SHARD" -lt "${#EPS[@]}" ] || die "--role server needs --shard k in 0..$((${#EPS[@]} - 1))"
  run_shard "$SHARD" "${EPS[$SHARD]}" "${SYNCOPATE_SERVER_DIR:-server$SHARD}"
fi
# --role rendezvous: the elastic ring's membership service on MASTER_ADDR:MASTER_PORT (not restarted:
# a new service knows no members; the nodes then fail naming it at their next re-formation).
if [ "$ROLE" = rendezvous ]; then
  exec "$RENDEZVOUS" --host "${MASTER_ADDR:-127.0.0.1}" --port "${MASTER_PORT:-29500}" --exit-when-done --idle-exit-s 600
fi
# --role probe: syncopate-probe in place of the worker (README "Which synchronization for this
# cluster"), with the arguments after --. With SYNCOPATE_SERVERS (colocated) this node's shards start
# first under BSP, without checkpoints, so that the probe times the parameter servers' round trip
# too; they are the probe's (its layout), end when every node's probe has left them, and the job
# starts its own afterwards. Dedicated shard hosts run --role server --server-arg --ps.consistency=bsp.
if [ "$ROLE" = probe ]; then
  PROBE_BIN=${SYNCOPATE_PROBE_BIN:-$(dirname "$WORKER")/syncopate-probe}
  SHARD_PIDS=() PROBE_PID=""
  stop_probe() { for p in $PROBE_PID "${SHARD_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done; wait; }
  trap 'stop_probe; exit 143' TERM INT
  if [ -n "$SERVERS_LIST" ] && [ "${SYNCOPATE_SERVER_LAYOUT:-colocated}" = colocated ]; then
    for k in "${!EPS[@]}"; do
      [ $((k % NNODES)) = "$NODE" ] || continue
      ep=${EPS[$k]#tcp://}
      echo "[launch] probe: shard $k on tcp://$ep (bsp)"
      "$SERVER" --server.host="${ep%:*}" --server.port="${ep##*:}" --server.shard="$k" --server.exit_when_done=true \
        "${SERVER_ARGS[@]}" --ps.consistency=bsp --ps.backup_workers=0 &
      SHARD_PIDS+=($!)
    done
  fi
  DIST_SERVERS=()
  [ -n "$SERVERS_LIST" ] && DIST_SERVERS=(--dist.servers="$SERVERS_LIST")
  "$PROBE_BIN" "$@" "${DIST_SERVERS[@]}" &
  PROBE_PID=$!
  wait "$PROBE_PID"
  rc=$?
  PROBE_PID=""
  if [ $rc -eq 0 ]; then
    # Every node's probe registered with the shards and leaves them: they end by themselves once the
    # last node has (a node that died past their worker timeout counts as left).
    for p in "${SHARD_PIDS[@]}"; do wait "$p"; done
  else
    stop_probe  # a probe that failed may never have reached the shards, which would then wait forever
  fi
  exit $rc
fi
[ "$ROLE" = node ] || die "--role is node (default), server, servers, rendezvous or probe"

OUT="" CONFIG="" prev=""
for a in "$@"; do
  [ "$prev" = "--out" ] && OUT=$a
  [ "$prev" = "--config" ] && CONFIG=$a
  case "$a" in --out=*) OUT=${a#--out=};; --config=*) CONFIG=${a#--config=};; esac
  prev=$a
done
[ -n "$OUT" ] || die "pass --out DIR to the worker (checkpoints live there)"

# The worker's own resolution of its arguments' [dist] section, as JSON (--print-config: the last
# --dist.mode wins, a config file counts; MASTER_ADDR/MASTER_PORT as given here), so that the
# launcher and the worker cannot disagree. (A placeholder server list where none is set: the
# worker's ps mode needs one to print its config.) On failure the worker's error is on stderr.
resolve_dist() {  # WORKER ARGS...
  local printed err="${TMPDIR:-/tmp}/launch_node.$$.err"
  printed=$("$WORKER" "$@" --dist.servers="${SERVERS_LIST:-tcp://127.0.0.1:1}" --print-config 2> "$err") ||
    { cat "$err" >&2; rm -f "$err"; return 1; }
  rm -f "$err"
  PRINTED=$printed "${SYNCOPATE_PYTHON:-python3}" -c 'import json, os, re, tomllib
d = tomllib.loads(re.sub(r"  # this run: .*", "", os.environ["PRINTED"]))["dist"]
d["master_addr"] = d["master_addr"] or os.environ.get("MASTER_ADDR") or "127.0.0.1"
d["master_port"] = d["master_port"] or int(os.environ.get("MASTER_PORT") or 29500)
print(json.dumps(d))'
}

# --dist.mode=auto: the advice decides whether this job has shards, and their flags.
AUTO=0 prev=""
for a in "$@"; do
  [ "$a" = --dist.mode=auto ] && AUTO=1
  [ "$prev" = "--dist.mode" ] && [ "$a" = auto ] && AUTO=1
  prev=$a
done
[ -n "$CONFIG" ] && grep -Eq '^[[:space:]]*mode[[:space:]]*=[[:space:]]*"auto"' "$CONFIG" 2>/dev/null && AUTO=1
ALL_SERVERS_LIST=$SERVERS_LIST USER_SERVER_ARGS=("${SERVER_ARGS[@]}")
NEXT_ADVICE=()  # after a switch (exit kExitSwitch): --dist.advice=OUT/advice.next.json, the job's new pick
# A node that switched earlier (this launcher restarted, a requeue) resumes in the pick it switched to:
# its newest checkpoint may be the switch's, and the other nodes restart in that pick.
[ "$AUTO" = 1 ] && [ -f "$OUT/advice.next.json" ] && [ -f "$OUT/checkpoints/latest" ] && NEXT_ADVICE=(--dist.advice="$OUT/advice.next.json")
READVISE=0      # dist.readvise_every of the advice in force (node 0 re-advises on the worker's request)
# Sets SERVERS_LIST, EPS and SERVER_ARGS from the advice the worker's arguments resolve to.
apply_auto() {
  SERVERS_LIST=$ALL_SERVERS_LIST SERVER_ARGS=("${USER_SERVER_ARGS[@]}")
  IFS=, read -ra EPS <<< "$SERVERS_LIST"
  [ "$AUTO" = 1 ] || return 0
  # (a ps recommendation without SYNCOPATE_SERVERS is refused below, by name)
  local dist advised
  dist=$(resolve_dist "$@" "${NEXT_ADVICE[@]}") || exit 2
  advised=$(DIST=$dist "${SYNCOPATE_PYTHON:-python3}" - <<'PY'
import json, os, sys
cfg = json.loads(os.environ["DIST"])
mode, path = cfg["mode"], cfg["advice"]
print(mode, int(cfg.get("readvise_every", 0)))
if mode == "ps":
    try:
        flags = json.load(open(path))["recommended"].get("server_flags", [])
    except Exception as e:
        sys.exit(f"launch_node.sh: --dist.mode=auto: cannot read the server flags in {path}: {e!r}")
    for f in flags:
        if not (isinstance(f, str) and f.startswith("--ps.") and "=" in f and not any(c.isspace() for c in f)):
            sys.exit(f"launch_node.sh: --dist.mode=auto: {path} gives the servers {f!r}; an advice may only set "
                     "--ps.field=value (addresses, ports and security stay the launcher's)")
        print(f)
PY
) || exit 2
  read -r ADVISED_MODE READVISE <<< "$(head -n1 <<< "$advised")"
  if [ "$ADVISED_MODE" = ps ]; then
    [ -n "$SERVERS_LIST" ] || die "--dist.mode=auto: the advice recommends a parameter-server mode: set SYNCOPATE_SERVERS (e.g. per-node)"
    local advised_server
    mapfile -t advised_server < <(tail -n +2 <<< "$advised")
    SERVER_ARGS=("${advised_server[@]}" "${SERVER_ARGS[@]}")
    echo "[launch] --dist.mode=auto: the worker resolves to ps (the advice); shards get ${advised_server[*]:-no extra flags}"
  else
    [ -n "$SERVERS_LIST" ] && echo "[launch] --dist.mode=auto: the worker resolves to $ADVISED_MODE: SYNCOPATE_SERVERS ignored, no shards"
    SERVERS_LIST="" EPS=()
  fi
}
apply_auto "$@"

# An elastic ring: node 0 hosts the rendezvous service (the worker resolves the mode and the address).
RDV_PID=""
if grep -q elastic <<< "$* $( [ -n "$CONFIG" ] && cat "$CONFIG" 2>/dev/null)" && [ "$NODE" = 0 ] &&
   [ "${SYNCOPATE_RENDEZVOUS:-}" != external ]; then
  dist=$(resolve_dist "$@" 2>/dev/null) || dist='{"mode": "none", "elastic": false}'
  read -r rmode relastic raddr rport < <(DIST=$dist "${SYNCOPATE_PYTHON:-python3}" -c 'import json, os
d = json.loads(os.environ["DIST"])
print(d["mode"], str(d["elastic"]).lower(), d.get("master_addr", "-"), d.get("master_port", 0))')
  if [ "$rmode" = ring ] && [ "$relastic" = true ]; then
    echo "[launch] elastic ring: syncopate-rendezvous on $raddr:$rport"
    mkdir -p "$(dirname "$OUT")"
    # It outlives this node's worker (a node that leaves or fails must not take the job's membership
    # with it): it ends by itself once the job's last step is done and every session ended, or after
    # 10 minutes without any node; this launcher waits for it, and ends it only on TERM/INT.
    "$RENDEZVOUS" --host "$raddr" --port "$rport" --exit-when-done --idle-exit-s 600 > "$OUT.rendezvous.log" 2>&1 &
    RDV_PID=$!
  fi
fi

PS_ARGS=() SHARD_PIDS=() PHASE=0
# This node's co-located shards of SERVERS_LIST; PS_ARGS for its worker.
start_shards() {
  PS_ARGS=()
  [ -n "$SERVERS_LIST" ] || return 0
  PS_ARGS=(--dist.mode=ps --dist.servers="$SERVERS_LIST")
  [ "$AUTO" = 1 ] && PS_ARGS=(--dist.servers="$SERVERS_LIST")  # (the advice sets the mode)
  if [ "${SYNCOPATE_SERVER_LAYOUT:-colocated}" = colocated ]; then
    local k a fwd
    for k in "${!EPS[@]}"; do
      [ $((k % NNODES)) -eq "$NODE" ] || continue
      # After a switch the shards start from the workers' INIT (worker/train/mode_switch.h): an
      # earlier ps phase's checkpoints are kept aside, not restored.
      [ "$PHASE" -gt 0 ] && [ -d "$OUT/server$k" ] && mv "$OUT/server$k" "$OUT/server$k.before-switch$PHASE"
      # Each shard supervised by this script in its server role (same process group as this
      # launcher: a scheduler ending the node's group ends them too).
      fwd=()
      # The job file goes to the shards too: they take its [ps] / [server] sections (and skip the
      # worker's); --server-arg values still win over it.
      [ -n "$CONFIG" ] && fwd+=(--server-arg "--config=$CONFIG")
      for a in "${SERVER_ARGS[@]}"; do fwd+=(--server-arg "$a"); done
      SYNCOPATE_SERVER_DIR="$OUT/server$k" "$0" --role server --shard "$k" --max-restarts "$MAX_RESTARTS" "${fwd[@]}" &
      SHARD_PIDS+=($!)
    done
  elif [ "${SYNCOPATE_SERVER_LAYOUT}" != dedicated ]; then
    die "SYNCOPATE_SERVER_LAYOUT=${SYNCOPATE_SERVER_LAYOUT} is not colocated or dedicated"
  fi
}
start_shards

# dist.readvise_every (node 0): the worker asks for a re-advice (OUT/readvise.request) when a node
# drifted from the advice; this launcher runs syncopate-advise --from-run on the nodes' output
# directories (SYNCOPATE_READVISE_RUNS, default the parent of --out: they must be readable here) in
# the background while the job goes on, with SYNCOPATE_READVISE_ARGS (e.g. "--seeds 1"), and hands
# the answer to the worker as OUT/readvise.advice.json (worker/train/readvise.h).
ADVISOR_PID="" READVISE_N=0
readvise_start() {
  [ -z "$ADVISOR_PID" ] || return 0
  rm -f "$OUT/readvise.request" "$OUT/readvise.advice.json"  # (an answer left from an earlier request is not this one's)
  local dir="$OUT/readvise$READVISE_N" runs=${SYNCOPATE_READVISE_RUNS:-$(dirname "$OUT")}
  READVISE_N=$((READVISE_N + 1))
  echo "[launch] node 0: a node drifted from the advice: re-advising on what the run measured in $runs (log $dir.log); the job goes on meanwhile"
  # (word splitting of SYNCOPATE_READVISE_ARGS is meant: options for the advisor)
  # shellcheck disable=SC2086
  # Without SYNCOPATE_SERVERS this job cannot start shards: the re-advice picks among the ring's candidates.
  local no_servers=()
  [ -n "$ALL_SERVERS_LIST" ] || no_servers=(--no-servers)
  ( nice -n 10 "${SYNCOPATE_ADVISE:-$ROOT/scripts/syncopate-advise}" --from-run "$runs" --window 10 --out "$dir" \
      "${no_servers[@]}" ${SYNCOPATE_READVISE_ARGS:-} > "$dir.log" 2>&1 &&
    cp "$dir/advice.json" "$OUT/readvise.advice.json.tmp" && mv "$OUT/readvise.advice.json.tmp" "$OUT/readvise.advice.json" ) &
  ADVISOR_PID=$!
}
readvise_poll() {
  [ -n "$ADVISOR_PID" ] && ! kill -0 "$ADVISOR_PID" 2>/dev/null || return 0
  local r=0
  wait "$ADVISOR_PID" || r=$?
  ADVISOR_PID=""
  if [ $r = 0 ]; then echo "[launch] node 0: the re-advice is ready ($OUT/readvise.advice.json): the worker decides at its next decision step"
  else echo "[launch] node 0: the re-advice failed (exit $r): see $OUT/readvise$((READVISE_N - 1)).log; the job goes on as advised" >&2; fi
}
child=""
rc=0
stop_all() {
  [ -n "$child" ] && kill -TERM "$child" 2>/dev/null
  [ -n "$ADVISOR_PID" ] && pkill -TERM -P "$ADVISOR_PID" 2>/dev/null && kill -TERM "$ADVISOR_PID" 2>/dev/null
  for p in "${SHARD_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  [ -n "$RDV_PID" ] && kill -TERM "$RDV_PID" 2>/dev/null
  wait
}
# On the way out (not a signal): the rendezvous service stays until the job is over (the other
# nodes re-form through it); a configuration error ends it at once.
at_exit() {
  # (A service no node ever reached is ended: node 0 failed before the job formed.)
  if [ -n "$RDV_PID" ] && [ "$rc" != 2 ] && kill -0 "$RDV_PID" 2>/dev/null &&
     grep -q "has a session" "$OUT.rendezvous.log" 2>/dev/null; then
    echo "[launch] node $NODE is out of the job; its host keeps the rendezvous service until the job is over"
    wait "$RDV_PID" 2>/dev/null
    RDV_PID=""
  fi
  stop_all
}
trap 'stop_all; exit 143' TERM INT
trap 'at_exit' EXIT

attempt=0
while :; do
  extra=()
  [ -f "$OUT/checkpoints/latest" ] && extra=(--resume)
  echo "[launch] node $NODE attempt $attempt ${extra[*]}"
  "$WORKER" "$@" "${NEXT_ADVICE[@]}" "${PS_ARGS[@]}" "${extra[@]}" &
  child=$!
  if [ "$NODE" = 0 ] && [ "$READVISE" -gt 0 ]; then  # the worker's requests for a re-advice, while it runs
    while kill -0 "$child" 2>/dev/null; do
      [ -f "$OUT/readvise.request" ] && readvise_start
      readvise_poll
      sleep 0.5
    done
  fi
  wait "$child"; rc=$?
  child=""
  if [ $rc -eq 75 ]; then  # kExitSwitch (worker/train/readvise.h): a checkpoint at the switch's step is written
    [ -f "$OUT/advice.next.json" ] || { echo "[launch] the worker exited to switch but wrote no $OUT/advice.next.json" >&2; exit 1; }
    if [ -n "$ADVISOR_PID" ]; then pkill -TERM -P "$ADVISOR_PID" 2>/dev/null; kill -TERM "$ADVISOR_PID" 2>/dev/null; wait "$ADVISOR_PID" 2>/dev/null; ADVISOR_PID=""; fi
    for p in "${SHARD_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done  # the earlier phase's shards
    SHARD_PIDS=()
    PHASE=$((PHASE + 1))
    NEXT_ADVICE=(--dist.advice="$OUT/advice.next.json")
    echo "[launch] node $NODE: the job switches synchronization at its checkpoint: restarting with --resume ${NEXT_ADVICE[*]}"
    apply_auto "$@"
    start_shards
    continue
  fi
  if [ $rc -eq 0 ]; then
    if [ ${#SHARD_PIDS[@]} -gt 0 ]; then
      echo "[launch] node $NODE done; its shards exit once every worker has finished or left"
      for p in "${SHARD_PIDS[@]}"; do wait "$p" || rc=$?; done
      SHARD_PIDS=()
    fi
    exit $rc
  fi
  [ $rc -eq 2 ] && { echo "[launch] configuration error: not restarting" >&2; exit 2; }
  attempt=$((attempt + 1))
  if [ $attempt -gt "$MAX_RESTARTS" ]; then
    echo "[launch] worker failed (exit $rc) and --max-restarts=$MAX_RESTARTS is used up" >&2
    exit $rc
  fi
  echo "[launch] worker failed (exit $rc); restarting from the latest checkpoint in 2 s" >&2
  sleep 2
done
