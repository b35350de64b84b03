#!/usr/bin/env bash
# Installs everything Syncopate needs to build and test on a fresh Debian machine.
# Idempotent: a second run only checks and exits quickly.
#
# LibTorch comes from, in this order:
#   1. an importable `torch` (system or already in .venv),
#   2. `torch` from PyPI into the project-local virtual environment .venv,
#   3. Debian's libtorch-dev (CPU only, LibTorch 1.13).
# The result is written to .syncopate-env (TORCH_PREFIX, PYTHON) for scripts/build.sh.
# Usage: scripts/setup.sh   (no options)
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

log() { echo "[setup] $*"; }

# --- Debian packages -------------------------------------------------------------------------
APT_PKGS=(cmake ninja-build g++ ccache pkg-config git
          libzmq3-dev cppzmq-dev libsodium-dev libmsgpack-cxx-dev libboost-dev libboost-system-dev
          libgtest-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
          iproute2 python3 python3-venv clang time)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# --- Python environment and LibTorch ---------------------------------------------------------
# The venv sees system site-packages so that an already importable torch is reused.
PY=python3
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  $PY -m venv --system-site-packages .venv
fi
VPY="$ROOT/.venv/bin/python"

TORCH_PREFIX=""
if "$VPY" -c "import torch" >/dev/null 2>&1; then
  TORCH_PREFIX=$("$VPY" -c "import torch; print(torch.utils.cmake_prefix_path)")
else
  log "installing torch from PyPI into .venv (one-time, a few GB)"
  if "$VPY" -m pip install -q torch numpy; then
    TORCH_PREFIX=$("$VPY" -c "import torch; print(torch.utils.cmake_prefix_path)")
  else
    log "PyPI torch failed; falling back to Debian's libtorch-dev"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libtorch-dev >/dev/null
    TORCH_PREFIX=/usr/share/cmake/Torch
  fi
fi

# Python packages used by tests and benchmarks (reference implementations, HF comparisons).
PY_PKGS=(numpy safetensors transformers tokenizers matplotlib tensorboard)
need=()
for p in "${PY_PKGS[@]}"; do
  "$VPY" -c "import $p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  log "installing Python packages: ${need[*]}"
  "$VPY" -m pip install -q "${need[@]}" || log "warning: could not install ${need[*]}; tests that compare against them will fail"
fi

# Megatron-LM's own indexed-dataset reader checks the .bin/.idx files syncopate-data writes. Its
# other dependencies (Transformer Engine, Apex, ...) are not needed for that: --no-deps.
if ! "$VPY" -c "import megatron.core.datasets.indexed_dataset" >/dev/null 2>&1; then
  log "installing megatron-core (its indexed-dataset reader, without dependencies)"
  "$VPY" -m pip install -q --no-deps megatron-core || log "warning: could not install megatron-core; the Megatron reader test will fail"
fi

cat > .syncopate-env <<EOF
TORCH_PREFIX=$TORCH_PREFIX
PYTHON=$VPY
EOF
log "ok (torch: $TORCH_PREFIX)"
