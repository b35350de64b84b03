#!/usr/bin/env bash
# The failure and teardown paths under AddressSanitizer: builds build-asan/ (our code instrumented,
# LibTorch as shipped; the first build takes a while on 2 cores, later ones are incremental) and
# runs the tests where a replica or a peer fails mid-step, a node aborts, or a run is torn down
# with communication in flight. A use after free, a double free or a heap overflow fails them.
#   scripts/asan_check.sh [gtest filter]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
[ -f .syncopate-env ] || scripts/setup.sh
source .syncopate-env
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
if [ ! -f build-asan/build.ninja ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSYNCOPATE_ASAN=ON \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DSYNCOPATE_PYTHON="$PYTHON"
fi
cmake --build build-asan -j "${SYNCOPATE_JOBS:-2}" --target syncopate_tests syncopate-worker syncopate-server
FILTER=${1:-'PsTraining.APushRefusedDuringBackward*:LocalGroup.*Abort*:BucketReducer.*:NodeTraining.*:RingFailure*:*Killed*:*Dies*:PsClient.AnUnreachable*:PsServer.Hostile*'}
# LibTorch's allocators are not instrumented: container-overflow checks across that boundary
# report false positives, and leaks at exit are LibTorch's static caches.
export ASAN_OPTIONS=detect_container_overflow=0:detect_leaks=0:abort_on_error=1
build-asan/bin/syncopate_tests --gtest_filter="$FILTER"
