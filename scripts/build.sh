#!/usr/bin/env bash
# Configures (once) and builds Syncopate into build/ (binaries in build/bin/). Idempotent.
# Usage: scripts/build.sh [extra cmake -D options]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
[ -f .syncopate-env ] || scripts/setup.sh
# shellcheck disable=SC1091
source .syncopate-env
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
if [ ! -f build/build.ninja ] || [ $# -gt 0 ]; then
  cmake -S . -B build -G Ninja -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DSYNCOPATE_PYTHON="$PYTHON" "$@"
fi
# Two cores and LibTorch translation units of ~1 GB each: build with at most 2 jobs.
cmake --build build -j "${SYNCOPATE_JOBS:-2}"
