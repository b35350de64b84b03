#!/usr/bin/env bash
# Every script answers --help (issue 32): scripts/*.sh, the Python tools under scripts/ and the
# experiments' command-line tools each exit 0 and print a usage line that names them, and start
# nothing: no process of theirs is left running, and nothing in the repository was written
# (a script that took --help for an argument would have made a directory or started a run).
# lib.sh and netns.sh are libraries (sourced, not run). Python runs with $SYNCOPATE_PYTHON.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${SYNCOPATE_PYTHON:-python3}
TMP=$(mktemp -d)
cleanup() {  # a script that started something despite --help: its process group ends here
  for g in "$TMP"/pgid.*; do [ -f "$g" ] && kill -KILL -- "-$(cat "$g")" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
export PYTHONDONTWRITEBYTECODE=1
cd "$TMP"  # a script that writes relative to its working directory writes here, where it is seen too
touch "$TMP/marker"
sleep 1  # mtimes: anything written after this is newer than the marker
fail=0 n=0
check() {  # NAME CMD...
  local name=$1; shift
  n=$((n + 1))
  setsid bash -c 'echo $$ > "$0"; exec "$@"' "$TMP/pgid.$n" "$@" --help > "$TMP/out.$n" 2>&1 < /dev/null &
  local pid=$! rc
  ( sleep 120; kill -KILL -- "-$pid" 2>/dev/null ) & local watchdog=$!
  wait "$pid"; rc=$?
  kill "$watchdog" 2>/dev/null; wait "$watchdog" 2>/dev/null
  if [ "$rc" != 0 ]; then echo "FAIL: $name --help exited $rc"; tail -5 "$TMP/out.$n"; fail=1; fi
  grep -qiE "^ *usage: .*$(basename "$name" | sed 's/\./\\./g')" "$TMP/out.$n" ||
    { echo "FAIL: $name --help printed no usage line naming it"; head -5 "$TMP/out.$n"; fail=1; }
  local g; g=$(cat "$TMP/pgid.$n" 2>/dev/null)
  if [ -n "$g" ] && pgrep -g "$g" > /dev/null; then
    echo "FAIL: $name --help left processes running:"; pgrep -a -g "$g"; kill -KILL -- "-$g" 2>/dev/null; fail=1
  fi
  rm -f "$TMP/pgid.$n"
}
for f in "$ROOT"/scripts/*.sh; do
  case $(basename "$f") in lib.sh|netns.sh) continue;; esac
  check "scripts/$(basename "$f")" bash "$f"
done
for f in "$ROOT"/scripts/*.py "$ROOT"/experiments/*.py; do
  # experiments/ modules that are libraries of the tools, not tools
  case $(basename "$f") in method.py|plotting.py|scenario.py|stats.py|cluster_runs.py|study.py|run_probe.py) continue;; esac
  check "${f#$ROOT/}" "$PY" "$f"
done
written=$(find "$ROOT" "$TMP" -newer "$TMP/marker" -not -path "$ROOT/build*" -not -path "$ROOT/.git*" \
          -not -path "$TMP/out.*" -not -path "$TMP" -not -path "$TMP/pgid.*" -print 2>/dev/null | head -20)
[ -z "$written" ] || { echo "FAIL: --help wrote files:"; echo "$written"; fail=1; }
[ $fail = 0 ] && echo "help: PASS ($n scripts answer --help)"
exit $fail
