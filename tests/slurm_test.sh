#!/usr/bin/env bash
# The sbatch examples (scripts/slurm/) submitted as a user submits them, with stand-ins for sbatch
# (runs the script in the foreground; a log whose directory does not exist fails the job, as with
# Slurm), srun (one task per "node", Slurm's per-task variables) and scontrol (node names that
# resolve to loopback). Checked: the shipped configs/ (their defaults) load in the worker and the
# server; a 3-node ring job and a 3-node parameter-server job with co-located shards, from the
# shipped CPU configs with the user's overrides as the script's arguments, both finish; the ps
# job's shards took the [ps] section of the same file; the job logs land in the submit directory;
# a missing config is named; a token file others can read is refused; an elastic ring job and an
# elastic ps job (ELASTIC=1) that a second submission adds a node to. The jobs are submitted from a
# scratch directory that links to the repository's scripts/, configs/ and build/ (a user's checkout
# as seen from the submit host), so their logs land there and nothing is written in the repository
# itself, where tests running beside this one (help_test.sh) watch for stray files.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib.sh"
TMP=$(mktemp -d)
JOB=t$$
# The jobs' logs are written where they were submitted ($SUB, inside $TMP): removed on every exit.
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM
python3 -c "open('$TMP/corpus.txt','w').write(('def f(x):\n    return x + 1\n' * 4000))"
TINY=(--model.n_embd=32 --model.n_head=2 --model.block_size=32 --train.batch_size=2 --train.steps=8 --train.threads=1
      --schedule.warmup_steps=2 --eval.every=0 --eval.batches=1 --eval.sample_tokens=0 --checkpoint.every=4
      --data.corpus="$TMP/corpus.txt" --data.cache_dir="$TMP/cache")
(umask 077; echo slurm-test-secret > "$TMP/token")
export PATH="$ROOT/tests/fakeslurm:$PATH"
unset SLURM_NTASKS SLURM_NNODES SLURM_JOB_NODELIST SLURM_PROCID CONFIG OUT CONSISTENCY BOUND
export SYNCOPATE_TOKEN_FILE="$TMP/token"
export SYNCOPATE_WORKER="${SYNCOPATE_WORKER:-$ROOT/build/bin/syncopate-worker}"
SERVER="$(dirname "$SYNCOPATE_WORKER")/syncopate-server"
fail=0
SUB="$TMP/submit"
mkdir -p "$SUB"
for d in scripts configs build; do ln -s "$ROOT/$d" "$SUB/$d"; done
cd "$SUB"
# The defaults the scripts name exist, and both programs read every shipped config.
for mode in ring ps elastic_ring; do
  def=$(sed -n 's/.*CONFIG=\${CONFIG:-\([^}]*\)}.*/\1/p' scripts/slurm/$mode.sbatch)
  [ -f "$def" ] || { echo "FAIL: $mode.sbatch defaults to CONFIG=$def, which is not in the repository"; fail=1; }
done
for c in configs/*.toml; do
  "$SYNCOPATE_WORKER" --config "$c" --print-config > "$TMP/print.out" 2>&1 || { echo "FAIL: the worker refuses $c"; cat "$TMP/print.out"; fail=1; }
  "$SERVER" --config "$c" --print-config > "$TMP/print.out" 2>&1 || { echo "FAIL: the server refuses $c"; cat "$TMP/print.out"; fail=1; }
done
[ "$(ls configs/*.toml | wc -l)" -ge 4 ] || { echo "FAIL: configs/ lacks the ring/ps CPU/GPU examples"; fail=1; }

for mode in ring ps; do
  port=$(free_port)
  if ! FAKE_JOB_ID=$JOB-$mode FAKE_LOG="$TMP/$mode" OUT="$TMP/$mode-run" CONFIG=configs/$mode-cpu.toml MASTER_PORT=$port \
       SYNCOPATE_PS_PORT=$(free_ports 3) timeout 180 sbatch --nodes=3 scripts/slurm/$mode.sbatch "${TINY[@]}" \
       > "$TMP/$mode.submit" 2>&1; then
    echo "FAIL: sbatch $mode.sbatch"; cat "$TMP/$mode.submit" slurm-syncopate-$mode-$JOB-$mode.out "$TMP/$mode".* 2>/dev/null | tail -20; fail=1; continue
  fi
  grep -q "config configs/$mode-cpu.toml" "slurm-syncopate-$mode-$JOB-$mode.out" ||
    { echo "FAIL: $mode: no job log in the submit directory saying what ran"; fail=1; }
  for i in 0 1 2; do
    grep -q '"step":8,' "$TMP/$mode-run/node$i/metrics.jsonl" 2>/dev/null || { echo "FAIL: $mode node $i did not train 8 steps"; tail -5 "$TMP/$mode.$i"; fail=1; }
  done
done
grep -q "every worker finished or left: exiting" "$TMP/ps.0" || { echo "FAIL: the ps job's shards did not end with it"; fail=1; }
grep -q '"consistency":"ssp"' "$TMP/ps.0" || { echo "FAIL: the shards did not take [ps] consistency = \"ssp\" from configs/ps-cpu.toml"; grep stats "$TMP/ps.0"; fail=1; }
cmp -s "$TMP/ring-run/node0/checkpoints/step_000008/model.safetensors" "$TMP/ring-run/node2/checkpoints/step_000008/model.safetensors" ||
  { echo "FAIL: the ring nodes ended with different weights"; fail=1; }
# The elastic ring: a 2-node job, then a second submission that adds node 2 to it while it runs
# (JOIN_MASTER / JOIN_NNODES / JOIN_RANK); the joiner joins the running job and all three finish.
port=$(free_port)
FAKE_JOB_ID=$JOB-er FAKE_LOG="$TMP/er" OUT="$TMP/er-run" CONFIG=configs/ring-cpu.toml MASTER_PORT=$port \
  timeout 180 sbatch --nodes=2 scripts/slurm/elastic_ring.sbatch "${TINY[@]}" --train.steps=80 --emulate.step_time_s=0.1 \
  > "$TMP/er.submit" 2>&1 &
er_pid=$!
for _ in $(seq 1 600); do grep -q '"step":10,' "$TMP/er-run/node0/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
FAKE_JOB_ID=$JOB-join FAKE_LOG="$TMP/join" OUT="$TMP/er-run" CONFIG=configs/ring-cpu.toml MASTER_PORT=$port \
  JOIN_MASTER=localhost JOIN_NNODES=2 JOIN_RANK=2 timeout 180 sbatch --nodes=1 scripts/slurm/elastic_ring.sbatch \
  "${TINY[@]}" --train.steps=80 --emulate.step_time_s=0.1 > "$TMP/join.submit" 2>&1 ||
  { echo "FAIL: sbatch elastic_ring.sbatch (join)"; tail -20 "$TMP/join.0" "slurm-syncopate-elastic-ring-$JOB-join.out"; fail=1; }
wait "$er_pid" || { echo "FAIL: sbatch elastic_ring.sbatch"; tail -20 "$TMP/er.0" "$TMP/er.1"; fail=1; }
grep -q "node 2 joined the running job at step" "$TMP/join.0" || { echo "FAIL: elastic ring: node 2 did not join"; tail -20 "$TMP/join.0"; fail=1; }
for i in 0 1 2; do
  grep -q '"step":80,' "$TMP/er-run/node$i/metrics.jsonl" 2>/dev/null || { echo "FAIL: elastic ring node $i did not reach step 80"; fail=1; }
done
grep -q "the job is over" "$TMP/er-run/node0.rendezvous.log" 2>/dev/null ||
  { echo "FAIL: elastic ring: the rendezvous service did not end with the job"; fail=1; }

# The elastic ps job: 2 nodes with ELASTIC=1, then a second submission adds node 2 (JOIN_RANK=2 and
# the job's OUT, whose job.env names the shards): the joiner starts no shard, its worker joins the
# running job at its clock, and all three finish. A join into the fixed ps job above is refused by name.
port=$(free_port)
FAKE_JOB_ID=$JOB-eps FAKE_LOG="$TMP/eps" OUT="$TMP/eps-run" CONFIG=configs/ps-cpu.toml MASTER_PORT=$port ELASTIC=1 \
  SYNCOPATE_PS_PORT=$(free_ports 2) timeout 180 sbatch --nodes=2 scripts/slurm/ps.sbatch "${TINY[@]}" --train.steps=80 \
  --emulate.step_time_s=0.1 > "$TMP/eps.submit" 2>&1 &
eps_pid=$!
for _ in $(seq 1 600); do grep -q '"step":10,' "$TMP/eps-run/node0/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
FAKE_JOB_ID=$JOB-epsjoin FAKE_LOG="$TMP/epsjoin" OUT="$TMP/eps-run" CONFIG=configs/ps-cpu.toml JOIN_RANK=2 \
  timeout 180 sbatch --nodes=1 scripts/slurm/ps.sbatch "${TINY[@]}" --train.steps=80 --emulate.step_time_s=0.1 \
  > "$TMP/epsjoin.submit" 2>&1 ||
  { echo "FAIL: sbatch ps.sbatch (join)"; tail -20 "$TMP/epsjoin.0" "slurm-syncopate-ps-$JOB-epsjoin.out"; fail=1; }
wait "$eps_pid" || { echo "FAIL: sbatch ps.sbatch (elastic)"; tail -20 "$TMP/eps.0" "$TMP/eps.1"; fail=1; }
grep -q "node 2 joined the running job at step" "$TMP/epsjoin.0" ||
  { echo "FAIL: elastic ps: node 2 did not join"; tail -20 "$TMP/epsjoin.0"; fail=1; }
grep -q "\[launch\] shard" "$TMP/epsjoin.0" && { echo "FAIL: elastic ps: the joining node started a shard"; fail=1; }
for i in 0 1 2; do
  grep -q '"step":80,' "$TMP/eps-run/node$i/metrics.jsonl" 2>/dev/null || { echo "FAIL: elastic ps node $i did not reach step 80"; tail -5 "$TMP/eps.$i" "$TMP/epsjoin.0" 2>/dev/null; fail=1; }
done
grep -q "worker 2 joins" "$TMP/eps.0" || { echo "FAIL: elastic ps: shard 0 did not see worker 2 join"; fail=1; }
if FAKE_JOB_ID=$JOB-fixedjoin FAKE_LOG="$TMP/fixedjoin" OUT="$TMP/ps-run" CONFIG=configs/ps-cpu.toml JOIN_RANK=3 \
   sbatch scripts/slurm/ps.sbatch "${TINY[@]}" > /dev/null 2>&1; then
  echo "FAIL: a join into a ps job without ELASTIC=1 was accepted"; fail=1
fi
grep -q "was not started with ELASTIC=1" "slurm-syncopate-ps-$JOB-fixedjoin.out" ||
  { echo "FAIL: the refused join does not say why"; cat "slurm-syncopate-ps-$JOB-fixedjoin.out"; fail=1; }

# The old log path (runs/ is git-ignored, so absent on a fresh clone) fails the job silently: the
# stand-in does what Slurm does.
if FAKE_JOB_ID=$JOB-old sbatch --output="runs-absent-$JOB/slurm-%j.out" scripts/slurm/ring.sbatch > "$TMP/old.out" 2>&1; then
  echo "FAIL: the sbatch stand-in accepted a log in a directory that does not exist"; fail=1
fi
FAKE_JOB_ID=$JOB-missing FAKE_LOG="$TMP/missing" CONFIG="$TMP/none.toml" OUT="$TMP/missing-run" sbatch scripts/slurm/ring.sbatch > /dev/null 2>&1 &&
  { echo "FAIL: a missing config was accepted"; fail=1; }
grep -q "the config '$TMP/none.toml' does not exist" "slurm-syncopate-ring-$JOB-missing.out" ||
  { echo "FAIL: a missing config is not named in the job log"; cat "slurm-syncopate-ring-$JOB-missing.out"; fail=1; }
chmod 644 "$TMP/token"
if FAKE_JOB_ID=$JOB-open OUT="$TMP/open-run" sbatch scripts/slurm/ring.sbatch > /dev/null 2>&1; then echo "FAIL: a token file others can read was accepted"; fail=1; fi
grep -q "chmod 600" "slurm-syncopate-ring-$JOB-open.out" || { echo "FAIL: the refusal does not say chmod 600"; cat "slurm-syncopate-ring-$JOB-open.out"; fail=1; }
[ $fail = 0 ] && echo "slurm examples: PASS"
exit $fail
