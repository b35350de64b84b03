#!/usr/bin/env bash
# Checks that our binaries bind every libstdc++ symbol they use to libstdc++ itself: an undefined
# dynamic symbol that libstdc++.so defines must carry its version (name@GLIBCXX_x). Without one it
# binds at run time to whichever loaded library exports it first: PyPI's LibTorch exports copies of
# std::filesystem and other libstdc++ parts (its toolchain's, linked in statically), and torch
# 2.11's std::filesystem::remove_all crashed our checkpoint pruning (SIGSEGV) that way.
# CMakeLists.txt puts libstdc++ first on every link line; this guards it.
# Usage: scripts/check_link.sh [BIN_DIR] (default build/bin). Exit 1 naming the binaries and symbols.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${1:-$ROOT/build/bin}
[ -d "$BIN" ] || { echo "check_link.sh: no $BIN (scripts/build.sh)" >&2; exit 2; }
LIBSTDCXX=$(g++ -print-file-name=libstdc++.so.6)
[ -f "$LIBSTDCXX" ] || { echo "check_link.sh: libstdc++.so.6 not found (g++ -print-file-name)" >&2; exit 2; }
defined=$(mktemp); trap 'rm -f "$defined"' EXIT
nm -D --defined-only "$LIBSTDCXX" | awk '{print $3}' | sed 's/@.*//' | sort -u > "$defined"
bad=0 checked=0
for b in "$BIN"/*; do
  [ -x "$b" ] && [ -f "$b" ] && head -c 4 "$b" | grep -q "ELF" || continue
  checked=$((checked + 1))
  unversioned=$(nm -D --undefined-only "$b" | awk '{print $2}' | grep -v "@" | sort -u | comm -12 - "$defined" || true)
  if [ -n "$unversioned" ]; then
    bad=$((bad + 1))
    echo "$(basename "$b"): $(wc -l <<< "$unversioned") libstdc++ symbol(s) without a version, e.g.:"
    head -n 5 <<< "$unversioned" | c++filt | sed 's/^/  /'
  fi
done
[ "$checked" -gt 0 ] || { echo "check_link.sh: no executable in $BIN" >&2; exit 2; }
if [ "$bad" -gt 0 ]; then
  echo "check_link.sh: $bad of $checked binaries bind libstdc++ symbols to whichever library exports them first (LibTorch's copies): link libstdc++ first (CMakeLists.txt's add_link_options)" >&2
  exit 1
fi
echo "check_link.sh: $checked binaries, every libstdc++ symbol versioned"
