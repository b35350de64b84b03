#!/usr/bin/env bash
# Checks that our binaries bind every libstdc++ symbol they use to libstdc++ itself. PyPI's LibTorch
# exports copies of std::filesystem and other libstdc++ parts (its toolchain's, linked in
# statically) without a version; a reference that binds to them at run time reaches code built
# against another libstdc++ (torch 2.11's std::filesystem::remove_all crashed our checkpoint
# pruning with SIGSEGV that way). CMakeLists.txt puts libstdc++ first on every link line. Three
# checks per executable of BIN_DIR:
#   static   no undefined reference to a symbol libstdc++ defines lacks its version (name@GLIBCXX_x);
#   order    libstdc++.so.6 comes before every LibTorch library (libtorch*, libc10*) in DT_NEEDED: the
#            dynamic linker lets an unversioned definition satisfy a versioned reference, so the
#            order is what actually decides;
#   runtime  `BINARY --help` under LD_DEBUG=bindings LD_BIND_NOW=1: each of its references to a
#            libstdc++ symbol bound to libstdc++.so.6 (or to the binary itself: copy relocations).
# libstdc++ is the one the first binary loads (ldd). Exit 1 naming the binaries and symbols;
# about 1 s per binary.
# Usage: scripts/check_link.sh [BIN_DIR]   (default build/bin)
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${1:-$ROOT/build/bin}
[ -d "$BIN" ] || { echo "check_link.sh: no $BIN (scripts/build.sh)" >&2; exit 2; }
exes=()
for b in "$BIN"/*; do [ -f "$b" ] && [ -x "$b" ] && head -c 4 "$b" | grep -q ELF && exes+=("$b"); done
[ ${#exes[@]} -gt 0 ] || { echo "check_link.sh: no executable in $BIN" >&2; exit 2; }
LIBSTDCXX=$(ldd "${exes[0]}" | awk '$1 ~ /^libstdc\+\+\.so/ {print $3; exit}')
[ -f "${LIBSTDCXX:-}" ] || { echo "check_link.sh: ${exes[0]} loads no libstdc++.so (ldd)" >&2; exit 2; }
defined=$(mktemp); trap 'rm -f "$defined"' EXIT
readelf --dyn-syms -W "$LIBSTDCXX" | awk '$7 != "UND" && $8 != "" {sub(/@.*/, "", $8); print $8}' | sort -u > "$defined"
bad=0
for b in "${exes[@]}"; do
  name=$(basename "$b") problems=""
  # static: undefined, unversioned, defined by libstdc++
  unversioned=$(readelf --dyn-syms -W "$b" | awk '$7 == "UND" && $8 != "" && $8 !~ /@/ {print $8}' | sort -u | comm -12 - "$defined" || true)
  [ -z "$unversioned" ] || problems+="  static: $(wc -l <<< "$unversioned") libstdc++ symbol(s) referenced without a version, e.g. $(head -n 3 <<< "$unversioned" | c++filt | paste -sd';' -)"$'\n'
  # order: libstdc++ before LibTorch in DT_NEEDED
  needed=$(readelf -d "$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  first_torch=$(grep -n -m1 -E '^lib(torch|c10)' <<< "$needed" | cut -d: -f1 || true)
  at_stdcxx=$(grep -n -m1 -E '^libstdc\+\+\.so' <<< "$needed" | cut -d: -f1 || true)
  if [ -n "$first_torch" ] && { [ -z "$at_stdcxx" ] || [ "$at_stdcxx" -gt "$first_torch" ]; }; then
    problems+="  order: DT_NEEDED lists $(sed -n "${first_torch}p" <<< "$needed") before libstdc++.so.6"$'\n'
  fi
  # runtime: where its libstdc++ references bind
  wrong=$(LD_DEBUG=bindings LD_BIND_NOW=1 timeout 20 "$b" --help 2>&1 >/dev/null |
          sed -n "s|.*binding file $b \[0\] to \([^ ]*\) \[0\]: normal symbol \`\([^']*\)'.*|\2 \1|p" |
          awk -v self="$b" 'NR == FNR {lib[$1] = 1; next} ($1 in lib) && $2 != self && $2 !~ /libstdc\+\+\.so/ {print $1 " -> " $2}' "$defined" - |
          sort -u || true)
  [ -z "$wrong" ] || problems+="  runtime: $(wc -l <<< "$wrong") libstdc++ symbol(s) bound elsewhere, e.g. $(head -n 3 <<< "$wrong" | c++filt | paste -sd';' -)"$'\n'
  if [ -n "$problems" ]; then bad=$((bad + 1)); printf '%s:\n%s' "$name" "$problems"; fi
done
if [ "$bad" -gt 0 ]; then
  echo "check_link.sh: $bad of ${#exes[@]} binaries may bind libstdc++ symbols to LibTorch's copies: link libstdc++ first (CMakeLists.txt's add_link_options)" >&2
  exit 1
fi
echo "check_link.sh: ${#exes[@]} binaries, libstdc++ symbols versioned, libstdc++ first, bound to $LIBSTDCXX"
