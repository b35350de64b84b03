#!/usr/bin/env bash
# Peak resident memory (VmHWM, from GNU time) of a worker in ps mode and in ring mode: 2 nodes on
# loopback, the same model and steps, 1 server shard for ps. Prints one line per mode and node.
#
# Usage: scripts/bench_memory.sh [--bin DIR] [--preset small] [--steps 20] [--out DIR] [-- WORKER ARGS]
#
# WORKER ARGS come last on every worker's command line (e.g. --model.n_embd=768 for a model
# whose size dominates the process's memory).
# --bin DIR: where syncopate-worker and syncopate-server live (default build/bin), so that an
# older build can be measured in the same run as the current one.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/build/bin" PRESET=small STEPS=20 OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$(cd "$2" && pwd); shift 2;;
    --preset) PRESET=$2; shift 2;;
    --steps) STEPS=$2; shift 2;;
    --out) OUT=$2; shift 2;;
    --) shift; break;;
    *) echo "bench_memory.sh: unknown option $1 (see the header of this script)" >&2; exit 2;;
  esac
done
[ -x /usr/bin/time ] || { echo "bench_memory.sh: needs GNU time (apt-get install time)" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d /tmp/syncopate-mem.XXXXXX)}
WRAP="$OUT/bin"
mkdir -p "$WRAP"
# local_cluster.sh runs $SYNCOPATE_WORKER and the server next to it: a wrapper pair in WRAP.
cat > "$WRAP/syncopate-worker" <<WRAPPER
#!/usr/bin/env bash
exec /usr/bin/time -f "%M" -o "\$PWD/rss.\$NODE_RANK.\$\$" "$BIN/syncopate-worker" "\$@"
WRAPPER
chmod +x "$WRAP/syncopate-worker"
ln -sf "$BIN/syncopate-server" "$WRAP/syncopate-server"
echo "# model: --model.preset=$PRESET $*"
ARGS=(--model.preset="$PRESET" --train.steps="$STEPS" --train.batch_size=4 --train.grad_accum=1
      --eval.every=0 --eval.sample_tokens=0 --checkpoint.every=0 --train.threads=1 "$@")
for mode in ps ring; do
  dir="$OUT/$mode"
  rm -rf "$dir" && mkdir -p "$dir"
  extra=()
  [ "$mode" = ps ] && extra=(--servers 1 --consistency bsp)
  (cd "$dir" && SYNCOPATE_WORKER="$WRAP/syncopate-worker" "$ROOT/scripts/local_cluster.sh" --nodes 2 --out "$dir/run" \
      "${extra[@]}" -- "${ARGS[@]}" > "$dir/cluster.log" 2>&1) || { echo "bench_memory.sh: $mode run failed, see $dir" >&2; exit 1; }
  for n in 0 1; do
    kib=$(cat "$dir"/rss."$n".* | tail -1)
    echo "$mode node $n peak_rss_mib $(awk -v k="$kib" 'BEGIN {printf "%.1f", k / 1024}')"
  done
done
