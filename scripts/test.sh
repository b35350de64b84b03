#!/usr/bin/env bash
# Sets up (if needed), builds, and runs every test with ctest. Exits non-zero on any failure.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
scripts/setup.sh
scripts/build.sh
cd build
ctest --output-on-failure -j "${SYNCOPATE_TEST_JOBS:-2}" --timeout 600
