#!/usr/bin/env bash
# The sbatch examples (scripts/slurm/) run as Slurm would run them, with stand-ins for srun (one
# task per "node", Slurm's per-task variables) and scontrol (node names that resolve to loopback):
# a 3-node ring job and a 3-node parameter-server job with co-located shards both finish, from a
# token file readable only by its owner; a token file others can read is refused.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib.sh"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 -c "open('$TMP/corpus.txt','w').write(('def f(x):\n    return x + 1\n' * 4000))"
cat > "$TMP/job.toml" <<TOML
[model]
n_embd = 32
n_head = 2
block_size = 32
[train]
batch_size = 2
steps = 8
threads = 1
[schedule]
warmup_steps = 2
[eval]
every = 0
batches = 1
sample_tokens = 0
[data]
corpus = "$TMP/corpus.txt"
cache_dir = "$TMP/cache"
TOML
(umask 077; echo slurm-test-secret > "$TMP/token")
export PATH="$ROOT/tests/fakeslurm:$PATH" SLURM_NTASKS=3 SLURM_NNODES=3 SLURM_JOB_NODELIST='n[1-3]'
export SYNCOPATE_TOKEN_FILE="$TMP/token" CONFIG="$TMP/job.toml"
export SYNCOPATE_WORKER="${SYNCOPATE_WORKER:-$ROOT/build/bin/syncopate-worker}"
fail=0
cd "$ROOT"
for mode in ring ps; do
  port=$(free_port)
  if ! SLURM_JOB_ID=$mode FAKE_LOG="$TMP/$mode" OUT="$TMP/$mode-run" MASTER_PORT=$port SYNCOPATE_PS_PORT=$((port % 30000 + 20000)) \
       timeout 180 bash scripts/slurm/$mode.sbatch > "$TMP/$mode.out" 2>&1; then
    echo "FAIL: $mode.sbatch"; cat "$TMP/$mode.out" "$TMP/$mode".* 2>/dev/null | tail -20; fail=1; continue
  fi
  for i in 0 1 2; do
    grep -q '"step":8,' "$TMP/$mode-run/node$i/metrics.jsonl" 2>/dev/null || { echo "FAIL: $mode node $i did not train 8 steps"; tail -5 "$TMP/$mode.$i"; fail=1; }
  done
done
grep -q "every worker finished or left: exiting" "$TMP/ps.0" || { echo "FAIL: the ps job's shards did not end with it"; fail=1; }
cmp -s "$TMP/ring-run/node0/checkpoints/step_000008/model.safetensors" "$TMP/ring-run/node2/checkpoints/step_000008/model.safetensors" ||
  { echo "FAIL: the ring nodes ended with different weights"; fail=1; }
chmod 644 "$TMP/token"
if bash scripts/slurm/ring.sbatch > "$TMP/open.out" 2>&1; then echo "FAIL: a token file others can read was accepted"; fail=1; fi
grep -q "chmod 600" "$TMP/open.out" || { echo "FAIL: the refusal does not say chmod 600"; cat "$TMP/open.out"; fail=1; }
[ $fail = 0 ] && echo "slurm examples: PASS"
exit $fail
