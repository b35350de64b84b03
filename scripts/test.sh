#!/usr/bin/env bash
# Sets up (if needed), builds, and runs every test with ctest. Exits non-zero on any failure.
# Usage: scripts/test.sh   (no options)
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
scripts/setup.sh
scripts/build.sh
cd build
ctest --output-on-failure -j "${SYNCOPATE_TEST_JOBS:-2}" --timeout 600
