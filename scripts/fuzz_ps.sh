#!/usr/bin/env bash
# Long fuzzing of the parameter server, both targets for SECONDS each (default 60):
#   1. the header decoder under libFuzzer + ASan + UBSan (scripts/fuzz_ps_header.sh; needs clang);
#   2. the server's whole dispatch over a real socket: random structure-aware request sequences,
#      checking after every refused request that the shard did not change
#      (PsServer.RandomRequestSequencesNeverCrashAndRefusedOnesChangeNothing, which the test suite
#      runs for 3 s).
# Prints the executions of each and exits non-zero on any crash or broken invariant.
# Usage: scripts/fuzz_ps.sh [--seconds N]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SECONDS_EACH=60
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH=$2; shift 2;;
    *) echo "fuzz_ps.sh: unknown option $1 (see the header of this script)" >&2; exit 2;;
  esac
done
status=0
echo "== header decoder (libFuzzer), ${SECONDS_EACH} s"
"$ROOT/scripts/fuzz_ps_header.sh" "$SECONDS_EACH" 2>&1 | grep -E "^Done|ERROR|SUMMARY|crash" || status=1
echo "== server dispatch (request sequences over a socket), ${SECONDS_EACH} s"
SYNCOPATE_FUZZ_SECONDS=$SECONDS_EACH "$ROOT/build/bin/syncopate_tests" \
    --gtest_filter='PsServer.RandomRequestSequencesNeverCrashAndRefusedOnesChangeNothing' 2>&1 \
  | grep -E "^\[fuzz\]|Failure|changed|OK \]|FAILED" || status=1
exit $status
