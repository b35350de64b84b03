#!/usr/bin/env bash
# Network namespaces need root, and the tools say so up front (issue 32): as an unprivileged user
# (setpriv; the test is skipped where it cannot switch user) local_cluster.sh --netns exits 2 with
# a message naming root before any node starts, and a study that asks for an emulated link refuses
# before its first run. Processes of the attempt are ended on every exit.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${SYNCOPATE_PYTHON:-python3}
if [ "$(id -u)" != 0 ] || ! command -v setpriv > /dev/null; then
  echo "netns root check: SKIP (needs root to switch to an unprivileged user)"; exit 0
fi
TMP=$(mktemp -d); chmod 777 "$TMP"
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM
as_nobody() { setsid setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="$TMP" PYTHONDONTWRITEBYTECODE=1 "$@" & PIDS+=($!); wait $!; }
fail=0
as_nobody timeout 60 bash "$ROOT/scripts/local_cluster.sh" --nodes 2 --netns --link-gbit 1 --out "$TMP/cluster" -- --train.steps=2 \
  > "$TMP/cluster.out" 2>&1
rc=$?
[ $rc = 2 ] || { echo "FAIL: local_cluster.sh --netns as a user exited $rc, not 2"; fail=1; }
grep -q "needs root" "$TMP/cluster.out" || { echo "FAIL: local_cluster.sh --netns does not say it needs root"; cat "$TMP/cluster.out"; fail=1; }
ls "$TMP/cluster"/node*/metrics.jsonl > /dev/null 2>&1 && { echo "FAIL: a node started before the root check"; fail=1; }
# The study as a user would see it (os.geteuid answering an unprivileged id: the Python of the
# build may not be readable by another user).
setsid timeout 120 env PYTHONDONTWRITEBYTECODE=1 "$PY" -c 'import os, runpy, sys; os.geteuid = lambda: 65534; sys.argv = sys.argv[1:]; sys.path.insert(0, os.path.dirname(sys.argv[0])); runpy.run_path(sys.argv[0], run_name="__main__")' \
  "$ROOT/experiments/ab_sync_async.py" --nodes 2 --netns --link-gbit 1 --no-calibrate --step-time 0.1 \
  --seeds 1 --configs ring --out "$TMP/ab" > "$TMP/ab.out" 2>&1 &
PIDS+=($!); wait $!
rc=$?
[ $rc != 0 ] || { echo "FAIL: a study with --netns as a user did not refuse"; fail=1; }
grep -q "needs root" "$TMP/ab.out" || { echo "FAIL: the study does not say namespaces need root"; tail -5 "$TMP/ab.out"; fail=1; }
ls "$TMP/ab"/*/ 2>/dev/null | grep -q . && { echo "FAIL: the study started runs before the root check"; ls -R "$TMP/ab" | head; fail=1; }
# A malformed SYNCOPATE_TBF_BURST_MS is refused by name (as root) before any namespace exists.
out=$(SYNCOPATE_TBF_BURST_MS=8ms bash -c 'source "$1/scripts/netns.sh"; netns_up synbt 2 1' _ "$ROOT" 2>&1)
rc=$?
[ $rc = 2 ] && grep -q "SYNCOPATE_TBF_BURST_MS=8ms is not a number of ms" <<< "$out" ||
  { echo "FAIL: a bad SYNCOPATE_TBF_BURST_MS was not refused by name (rc $rc): $out"; fail=1; }
ip netns list | grep -q '^synbt' && { echo "FAIL: a namespace was made before the refusal"; fail=1; ip netns del synbtbr 2>/dev/null; }
[ $fail = 0 ] && echo "netns root check: PASS"
exit $fail
