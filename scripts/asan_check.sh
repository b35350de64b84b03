#!/usr/bin/env bash
# The failure and teardown paths under AddressSanitizer: builds the worker and server into
# build-asan/ (our code instrumented at -O1, LibTorch as shipped; the first build takes a while on
# 2 cores, later ones are incremental) and runs the multi-process tests where a replica or a peer
# fails mid-step, a node aborts, or a run is torn down with communication in flight, from the
# regular test binary pointed at those binaries (SYNCOPATE_TEST_BIN). A use after free, a double
# free or a heap overflow makes the process abort with ASan's report, which fails the test.
# Usage: scripts/asan_check.sh [gtest filter]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
source scripts/lib.sh
build_env
if [ ! -f build-asan/build.ninja ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE= -DCMAKE_CXX_FLAGS=-O1 -DSYNCOPATE_ASAN=ON \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DSYNCOPATE_PYTHON="$PYTHON"
fi
cmake --build build-asan -j "${SYNCOPATE_JOBS:-2}" --target syncopate-worker syncopate-server
[ -x build/bin/syncopate_tests ] || scripts/build.sh
FILTER=${1:-'PsTraining.APushRefusedDuringBackward*:PsTraining.AReplicaFailingMidBackward*:PsTraining.*Killed*:PsCheckpointCrash.*:*ReplicaFails*:*NodeDies*:*Dead*:PsServer.Hostile*'}
# LibTorch's allocators are not instrumented: container-overflow checks across that boundary
# report false positives, and leaks at exit are LibTorch's static caches.
export ASAN_OPTIONS=detect_container_overflow=0:detect_leaks=0:abort_on_error=1
export SYNCOPATE_TEST_BIN="$ROOT/build-asan/bin"
build/bin/syncopate_tests --gtest_filter="$FILTER"
