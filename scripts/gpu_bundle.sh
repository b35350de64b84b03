#!/usr/bin/env bash
# Runs the GPU check (scripts/gpu_check.sh) on a machine that has a GPU and PyTorch but none of our
# build dependencies and no network (such as the lent GPU machines, whose python3 carries
# torch 2.11.0+cu130): the binaries are built here, against the LibTorch that machine's Python
# carries, and travel with the shared libraries it lacks.
#
# Usage: scripts/gpu_bundle.sh build [--torch VERSION] [--work DIR]    (here)
#        scripts/gpu_bundle.sh run [gpu_check.sh options]                (on the GPU machine)
# build: downloads torch==VERSION's wheel (default 2.11.0) and NCCL's wheel at the version that torch
#   pins from PyPI into WORK (default .gpubundle/work), configures WORK/build against them (CUDA from
#   /usr/local/cuda, the rest as scripts/build.sh) and builds the binaries gpu_check.sh needs
#   (2 jobs; ccache), then gathers them, stripped, into .gpubundle/dist/bin and every shared library
#   they load that the GPU machine may lack (ZeroMQ, libsodium, pgm, norm, Kerberos...: not glibc,
#   libstdc++/libgcc, CUDA, NCCL or LibTorch, which come from that machine's torch) into
#   .gpubundle/dist/lib. Idempotent: a second call rebuilds what changed.
# run: puts the machine's torch/lib, its nvidia/*/lib and .gpubundle/dist/lib on LD_LIBRARY_PATH, says
#   which library any binary still misses (and stops), then runs scripts/gpu_check.sh with
#   SYNCOPATE_BIN=.gpubundle/dist/bin and SYNCOPATE_PYTHON=python3 (or $SYNCOPATE_PYTHON).
# The device tool carries .gpubundle/dist (ignored by git) with `carry: [".gpubundle/dist"]`.
case "${1:-}" in -h|--help|"") sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DIST=$ROOT/.gpubundle/dist
TARGETS=(syncopate-worker syncopate-bench-allreduce syncopate_tests syncopate-server)

build() {
  local torch=2.11.0 work=$ROOT/.gpubundle/work
  while [ $# -gt 0 ]; do
    case $1 in
      --torch) torch=$2; shift 2;;
      --work) work=$2; shift 2;;
      *) echo "gpu_bundle.sh build: unknown option $1 (scripts/gpu_bundle.sh --help)" >&2; exit 2;;
    esac
  done
  source scripts/lib.sh
  build_env  # PYTHON (the project's venv), ccache settings
  mkdir -p "$work/wheels" "$work/site"
  local whl
  whl=$(ls "$work"/wheels/torch-"$torch"-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$whl" ]; then
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 "torch==$torch" -d "$work/wheels"
    whl=$(ls "$work"/wheels/torch-"$torch"-*.whl | head -n 1)
  fi
  if [ ! -f "$work/site/torch/.unpacked-$torch" ]; then
    rm -rf "$work/site/torch"
    (cd "$work/site" && unzip -q -o "$whl" 'torch/*')
    touch "$work/site/torch/.unpacked-$torch"
  fi
  # NCCL at the version this torch pins (its headers and the library we link), the other nvidia
  # wheels (only for the linker to resolve LibTorch's own dependencies) from the project's venv.
  local nccl
  nccl=$(unzip -p "$whl" '*/METADATA' | sed -n 's/^Requires-Dist: \(nvidia-nccl-cu[0-9]*==[0-9.]*\).*/\1/p' | head -n 1)
  [ -n "$nccl" ] || { echo "gpu_bundle.sh: torch $torch's wheel pins no nvidia-nccl (a CPU wheel?)" >&2; exit 1; }
  if [ ! -f "$work/site/nvidia/nccl/.unpacked-${nccl#*==}" ]; then
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 "$nccl" -d "$work/wheels"
    rm -rf "$work/site/nvidia/nccl"
    (cd "$work/site" && unzip -q -o "$(ls "$work"/wheels/nvidia_nccl_*-"${nccl#*==}"-*.whl | head -n 1)" 'nvidia/*')
    touch "$work/site/nvidia/nccl/.unpacked-${nccl#*==}"
  fi
  local venv_nv d
  venv_nv=$("$PYTHON" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia"))')
  for d in "$venv_nv"/*; do
    [ "$(basename "$d")" = nccl ] || ln -sfn "$(cd "$d" && pwd)" "$work/site/nvidia/$(basename "$d")"
  done
  if [ ! -f "$work/build/build.ninja" ]; then
    cmake -S . -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/site/torch/share/cmake" -DSYNCOPATE_PYTHON=python3
  fi
  grep -q "SYNCOPATE_NCCL=1" "$work/build/build.ninja" ||
    { echo "gpu_bundle.sh: $work/build was configured without CUDA/NCCL (is /usr/local/cuda there?)" >&2; exit 1; }
  cmake --build "$work/build" -j "${SYNCOPATE_JOBS:-2}" --target "${TARGETS[@]}"
  rm -rf "$DIST"; mkdir -p "$DIST/bin" "$DIST/lib"
  local b lib path
  for b in "${TARGETS[@]}"; do strip -o "$DIST/bin/$b" "$work/build/bin/$b"; done
  # Shared libraries from the system's directories, less those every Linux has or that the GPU
  # machine's CUDA and torch provide (a newer libstdc++ there must not be shadowed by ours).
  for b in "${TARGETS[@]}"; do ldd "$work/build/bin/$b"; done | awk '$2 == "=>" && $3 ~ /^\/(usr\/)?lib/ {print $1, $3}' | sort -u |
    while read -r lib path; do
      case $lib in
        libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|libutil.so*|ld-linux*|libstdc++.so*|libgcc_s.so*|libcuda.so*) ;;
        *) cp -L "$path" "$DIST/lib/$lib";;
      esac
    done
  echo "$torch" > "$DIST/torch_version"
  git rev-parse HEAD > "$DIST/commit" 2>/dev/null || true
  du -sh "$DIST"; ls "$DIST/bin" "$DIST/lib"
}

run() {
  [ -d "$DIST/bin" ] || { echo "gpu_bundle.sh run: no $DIST (scripts/gpu_bundle.sh build, here, carried with the tool)" >&2; exit 2; }
  local py tdir want have
  py=$(command -v "${SYNCOPATE_PYTHON:-python3}") || { echo "gpu_bundle.sh run: no ${SYNCOPATE_PYTHON:-python3} on PATH" >&2; exit 2; }
  tdir=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  want=$(cat "$DIST/torch_version"); have=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')
  [ "$want" = "$have" ] || { echo "gpu_bundle.sh run: the bundle was built against torch $want, $py has $have (scripts/gpu_bundle.sh build --torch $have)" >&2; exit 2; }
  local lp="$DIST/lib:$tdir/lib" d
  for d in "$tdir"/../nvidia/*/lib; do lp+=":$(cd "$d" && pwd)"; done
  export LD_LIBRARY_PATH="$lp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local missing
  missing=$(for b in "$DIST"/bin/*; do ldd "$b" | sed -n "s|^\s*\(\S*\) => not found|$(basename "$b"): \1|p"; done)
  [ -z "$missing" ] || { echo "gpu_bundle.sh run: libraries not found: $missing" >&2; exit 1; }
  SYNCOPATE_BIN=$DIST/bin SYNCOPATE_PYTHON=$py exec "$ROOT/scripts/gpu_check.sh" "$@"
}

case $1 in
  build) shift; build "$@";;
  run) shift; run "$@";;
  *) echo "gpu_bundle.sh: build or run (scripts/gpu_bundle.sh --help)" >&2; exit 2;;
esac
