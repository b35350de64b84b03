#!/usr/bin/env bash
# Configures (once) and builds Syncopate into build/ (binaries in build/bin/). Idempotent.
# Usage: scripts/build.sh [extra cmake -D options]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
source scripts/lib.sh
build_env
if [ ! -f build/build.ninja ] || [ $# -gt 0 ]; then
  cmake -S . -B build -G Ninja -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DSYNCOPATE_PYTHON="$PYTHON" "$@"
fi
# Two cores and LibTorch translation units of ~1 GB each: build with at most 2 jobs.
cmake --build build -j "${SYNCOPATE_JOBS:-2}"
