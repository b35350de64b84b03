#!/usr/bin/env bash
# The one command a first GPU session runs (issue 28): every GPU path checked against a reference
# with stated tolerances, measured, and failed on purpose, into one report (after scripts/build.sh).
#
# Usage: scripts/gpu_check.sh [--dry] [--out DIR] [--gpus G] [--preset P] [--steps N] [--batch B]
#                             [--throughput-steps N] [--section-timeout S] [--peak-tflops X]
#                             [--only SECTION,...]
#
# Sections, each in a process group of its own under a timeout (a watchdog: on expiry the stacks of
# every process of the section are dumped into the report by gdb, else eu-stack, else
# /proc/PID/task/*/stack and wchan (the tool is named), the section is marked `hang`, its processes
# are ended and the next section runs; GNU timeout ends it anyway 300 s later):
#   versions       driver (nvidia-smi), CUDA and NCCL (torch's; and the libnccl the worker links),
#                  torch, GPU model and count; printed first
#   watchdog       a self-test: a section that hangs (a worker training without end, 5 s limit) must
#                  be marked hang with its stacks dumped and its processes ended
#   gpu_tests      the GoogleTests that skip without a GPU (NCCL local group, CUDA checkpointing)
#                  must PASS here, not skip
#   correctness    against references, tolerances in scripts/gpu_check_report.py (TOLERANCES), the
#                  noise floor (two identical runs) beside every comparison, dropout 0:
#                  - 1 GPU x grad_accum=G vs G GPUs x grad_accum=1, fp32 then bf16: the sampler gives
#                    micro-batch m of replica r of R the samples [p + (m R + r) b, + b), so both
#                    layouts take the same G b samples per step (worker/data/window_sampler.h);
#                  - controls: the same with the learning rate x 1.001 (fp32) and x 1.02 (bf16)
#                    must FAIL the comparison (proof that it can);
#                  - overlap on with 1-KiB buckets (one per parameter: every fence) vs overlap off;
#                  - activation checkpointing on vs off (dropout 0.1 in both: the masks replayed);
#                  - 2 nodes x G/2 GPUs joined by the ring, hierarchy sliced vs root, and vs one node;
#                  - the tiny model on GPU fp32 vs the CPU;
#   communication  the project's all-reduce (and reduce-scatter / all-gather when
#                  syncopate-bench-allreduce has --device/--op) at 1, 25, 500 MiB, and its all-reduce
#                  of the whole gradient inside training (wait_s of G replicas with overlap off less
#                  wait_s of 1), beside nccl-tests' *_perf when on PATH and torch.distributed NCCL in
#                  the same run; busbw as nccl-tests: algbw x 2(n-1)/n (all-reduce), x (n-1)/n
#   throughput     worker tokens/s and MFU (peak from the GPU model and the precision used, or
#                  --peak-tflops) on 1 and G GPUs, scaling efficiency, wait_s, buckets launched
#                  during backward (sync.json); beside PyTorch DDP (torchrun --nproc-per-node=1 and G
#                  scripts/ref_gpt_train.py --device cuda --precision bf16, NCCL); one process per GPU
#   failure        a replica failing at backward (SYNCOPATE_FAIL_AT=backward:replica1:2) and a node
#                  missing before the job starts end the run non-zero, naming the cause, within a
#                  bound; a clean run exits 0 within a bound of its last step (a replica failing
#                  before start() inside a node needs a fail point the worker does not have yet:
#                  run when its binary has one, reported skipped otherwise)
# Report: OUT/report.json (every section's status pass/fail/hang/skipped and numbers) and
# OUT/report.md; exit 0 when no section failed or hung. Processes it started are ended and its
# scratch directory (runs, checkpoints) removed on success, failure and Ctrl-C; OUT is kept.
#
# --dry: no GPU. The GPUs are G CPU replicas (--dist.local_replicas=G --train.device=cpu, one
#   thread each; G default 8), preset micro, 10 steps, small sizes, Gloo instead of NCCL, bf16
#   comparisons applied to fp32 runs, MFU not reported; the whole run takes about 1.5-2 minutes on
#   2 cores. It proves the script, not a GPU: the report says "dry run (CPU): no GPU result".
# --out DIR (default runs/gpu_check-<date>), --gpus G (default: every visible GPU), --preset
# (default gpt2, learning rate 6e-4; dry micro, 2e-3), --steps N of the comparisons (default 10,
# at least 3), --throughput-steps N (default 30; dry 10; medians after the first 5), --batch B
# sequences per micro-batch (default 8; dry 4), --section-timeout S (default per section; dry
# 180), --peak-tflops X (one GPU's peak when its model is not in the table), --only SECTION,...
# (versions always runs).
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac  # the header above, nothing started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SELF="$ROOT/scripts/gpu_check.sh"
# shellcheck source=lib.sh
source "$ROOT/scripts/lib.sh"
PY=${SYNCOPATE_PYTHON:-$ROOT/.venv/bin/python}
BIN=${SYNCOPATE_BIN:-$ROOT/build/bin}
REPORT="$ROOT/scripts/gpu_check_report.py"

say() { printf '%s\n' "$*"; }
rep() { "$PY" "$REPORT" "$@"; }
now_us() { echo "${EPOCHREALTIME//[!0-9]/}"; }  # (the locale's radix, whichever it is, removed)
secs_since() { local d=$(( $(now_us) - $1 )); printf '%d.%02d' $((d / 1000000)) $(((d % 1000000) / 10000)); }
# A value of gpu_check_report.py's tables: pyval EXPR (gpu_check_report imported as r).
pyval() { "$PY" -c "import sys; sys.path.insert(0, '$ROOT/scripts'); import gpu_check_report as r; print($1)"; }

# A binary of build/bin, waited for up to 60 s: another build may be relinking it.
need_bin() {
  local b="$BIN/$1" i
  for i in $(seq 1 60); do [ -x "$b" ] && return 0; sleep 1; done
  say "gpu_check.sh: $b is missing (scripts/build.sh)" >&2
  return 1
}

# ---------------------------------------------------------------------------------------------
# The watchdog: run_section NAME LIMIT runs sec_NAME (this script, --run-section NAME) in a session
# and process group of its own, streams its log, and on expiry dumps the stacks of the group's
# processes and ends the group.

stack_of() {  # PID [proc]: its threads' stacks with the best tool here (proc: /proc only); the tool's name on fd 3
  local p=$1 out
  if [ "${2:-}" != proc ] && command -v gdb > /dev/null; then
    # native frames of every thread, then (Python processes: torchrun's workers) their Python frames
    out=$(timeout 60 gdb -p "$p" -batch -nx -iex 'set auto-load safe-path /' -iex 'set debuginfod enabled off' \
            -ex 'set pagination off' -ex 'thread apply all bt' -ex 'thread apply all py-bt' 2>&1 || true)
    if grep -qE '^#[0-9]+ ' <<< "$out"; then printf '%s\n' "$out"; echo gdb >&3; return; fi
    echo "(gdb could not attach: $(tail -n 2 <<< "$out" | tr '\n' ' '))"
  fi
  if [ "${2:-}" != proc ] && command -v eu-stack > /dev/null; then
    out=$(timeout 60 eu-stack -p "$p" 2>&1 || true)
    if grep -qE '^#[0-9]+ ' <<< "$out"; then printf '%s\n' "$out"; echo eu-stack >&3; return; fi
  fi
  local t
  for t in /proc/"$p"/task/*; do
    echo "task ${t##*/} ($(cat "$t/comm" 2>/dev/null)) wchan $(cat "$t/wchan" 2>/dev/null)"
    cat "$t/stack" 2>/dev/null | sed 's/^/  /' || true
  done
  echo /proc >&3
}

# Every descendant of the PIDs, themselves included: torchrun starts its workers in sessions of their
# own, so a section's process group does not hold everything the section started.
descendants() {
  ps -e -o pid=,ppid= | awk -v roots=" $* " '
    { parent[$1] = $2; pids[NR] = $1 }
    END {
      n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1
      do { changed = 0; for (j in pids) { p = pids[j]; if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; changed = 1 } } } while (changed)
      for (p in keep) print p
    }' | sort -n
}

# Ends every section started (their groups, and descendants that left them), as end_spawned does.
end_all() {
  local d p
  d=$(descendants "${SPAWNED[@]:-}")
  for p in $d; do kill -TERM "$p" 2>/dev/null || true; done
  end_spawned
  for p in $d; do kill -KILL "$p" 2>/dev/null || true; done
  return 0
}

on_hang() {  # NAME PGID LIMIT
  local sec="$OUT/sections/$1" g=$2 limit=$3 p comm procs="" tools="" i alive
  local stacks="$sec/stacks.txt" t0 quick=""
  : > "$stacks"
  say "!! $1: no end within $limit s: dumping the stacks of its processes, then ending them"
  t0=$(now_us)
  local all
  all=$( { pgrep -g "$g" || true; descendants "$g"; } | sort -nu)
  for p in $all; do
    # after 180 s of debuggers (many processes, or gdb slow to attach), /proc only for the rest
    [ $(( ($(now_us) - t0) / 1000000 )) -ge 180 ] && quick=proc
    comm=$(cat "/proc/$p/comm" 2>/dev/null) || continue
    procs+="$p:$comm "
    {
      echo "===== pid $p ($comm): $(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | cut -c1-400)"
      case $comm in
        bash|timeout|sleep|tail|setsid) echo "wchan $(cat "/proc/$p/wchan" 2>/dev/null) (a shell of the section: no stack taken)";;
        *) stack_of "$p" "$quick" 3>> "$sec/.tools";;
      esac
    } >> "$stacks" 2>&1
  done
  tools=$(sort -u "$sec/.tools" 2>/dev/null | tr '\n' ',' | sed 's/,$//'); rm -f "$sec/.tools"
  all=$( { echo "$all"; descendants "$g"; } | sort -nu)  # (and whatever started meanwhile)
  kill -TERM -- "-$g" 2>/dev/null || true
  for p in $all; do kill -TERM "$p" 2>/dev/null || true; done
  for i in $(seq 1 50); do
    alive=""
    for p in $all; do kill -0 "$p" 2>/dev/null && alive+="$p "; done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  kill -KILL -- "-$g" 2>/dev/null || true
  for p in $all; do kill -KILL "$p" 2>/dev/null || true; done
  sleep 0.2
  alive=""
  for p in $all; do [ -e "/proc/$p" ] && [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ] && alive+="$p "; done
  rep hang --sec "$sec" --timeout "$limit" --tool "${tools:-none}" --procs "$procs" --alive "$alive" --stacks "$stacks"
}

run_section() {  # NAME LIMIT_S
  local name=$1 limit=$2 sec="$OUT/sections/$1"
  rm -rf "$sec"; mkdir -p "$sec"
  echo "$limit" > "$sec/timeout_s"
  say ""
  say "## $name (timeout ${limit} s)"
  local start; start=$(now_us)
  setsid timeout -k 10 $((limit + 300)) bash "$SELF" --run-section "$name" > "$sec/section.log" 2>&1 < /dev/null &
  local pid=$!
  SPAWNED+=("$pid")
  CURRENT=$name
  tail -s 0.2 -n +1 -f --pid="$pid" "$sec/section.log" 2>/dev/null &
  local tailpid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if [ $(( ($(now_us) - start) / 1000000 )) -ge "$limit" ]; then
      on_hang "$name" "$pid" "$limit"
      break
    fi
    sleep 0.2
  done
  local rc=0
  wait "$pid" || rc=$?
  wait "$tailpid" 2>/dev/null || true  # it prints the rest of the log, then sees the section gone
  echo "$rc" > "$sec/rc"
  secs_since "$start" > "$sec/wall_s"
  CURRENT=""
  say "## $name: exit $rc after $(cat "$sec/wall_s") s"
}

# ---------------------------------------------------------------------------------------------
# Helpers of the sections (they run in the section's process, config from GC_* variables)

section_env() {
  SEC="$GC_OUT/sections/$1"
  RUNS="$GC_WORK/$1"
  mkdir -p "$SEC/runs" "$RUNS"
  DRY=$GC_DRY G=$GC_G PRESET=$GC_PRESET STEPS=$GC_STEPS BATCH=$GC_BATCH
  if [ "$DRY" = 1 ]; then
    DEVICE=(--train.device=cpu --train.threads=1) PREC32=(--train.precision=fp32) PREC16=(--train.precision=fp32)
  else
    DEVICE=(--train.device=cuda) PREC32=(--train.precision=fp32) PREC16=(--train.precision=bf16)
  fi
  BASE=(--model.preset="$PRESET" --model.dropout=0 --train.steps="$STEPS" --train.batch_size="$BATCH"
        --schedule.warmup_steps=2 --eval.every=0 --eval.sample_tokens=0 --eval.batches=1 --checkpoint.every=0
        --checkpoint.keep=1 --dist.check_every="$STEPS" --train.log_every=1000 --data.cache_dir="$ROOT/data/cache"
        --optim.lr="$LR" "${DEVICE[@]}")
  TSTEPS=$GC_TSTEPS
}
# The learning rate, given explicitly (the controls scale it): optim.lr's default for the small
# presets, GPT-2's 6e-4 for gpt2 and gpt2-medium (2e-3 makes a 124M model's first steps erratic,
# and an erratic run amplifies rounding differences between layouts).
case "${GC_PRESET:-}" in gpt2*) LR=0.0006;; *) LR=0.002;; esac

keep_run() {  # NAME: a run's small files into the report (its checkpoints stay in the scratch directory;
  # their optimizer state is deleted unless KEEP_OPTIMIZER=1: a run that another run resumes)
  local d="$RUNS/$1" k="$SEC/runs/$1"
  mkdir -p "$k"
  for f in metrics.jsonl sync.json config.toml; do [ -f "$d/$f" ] && cp "$d/$f" "$k/"; done
  [ "${KEEP_OPTIMIZER:-0}" = 1 ] || rm -f "$d"/checkpoints/*/optimizer.safetensors 2>/dev/null || true
  return 0
}

train() {  # NAME [VAR=value ...] -- WORKER ARGS: one node; exit status returned, a failed run recorded
  # (RESUMING=1: the run's directory is kept, as a resumed run needs its checkpoint)
  local name=$1; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  [ "${RESUMING:-0}" = 1 ] || rm -rf "${RUNS:?}/$name"
  local rc=0
  say "  run $name: syncopate-worker ${*}"
  env "${envs[@]}" "$BIN/syncopate-worker" --out "$RUNS/$name" "${BASE[@]}" "$@" > "$SEC/runs/$name.log" 2>&1 || rc=$?
  keep_run "$name"
  if [ $rc != 0 ]; then
    rep record --sec "$SEC" --name "run $name" --status fail \
      --reason "syncopate-worker exited $rc: $(tail -n 3 "$SEC/runs/$name.log" | tr '\n' ' ' | cut -c1-600)"
  fi
  return $rc
}

train_nodes() {  # NAME NODES -- WORKER ARGS: NODES processes joined by the ring on loopback
  local name=$1 nodes=$2 i rc=0 pids=() cvd=()
  shift 3
  rm -rf "${RUNS:?}/$name"; mkdir -p "$RUNS/$name"
  local port; port=$(free_port)
  if [ "$DRY" = 0 ]; then  # node i takes its share of the visible GPUs
    local all per
    IFS=, read -r -a all <<< "${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((G - 1)))}"
    per=$((G / nodes))
    for i in $(seq 0 $((nodes - 1))); do
      if [ "$per" -ge 1 ]; then cvd+=("$(IFS=,; echo "${all[*]:$((i * per)):$per}")")
      else cvd+=("${all[$((i % G))]}"); fi  # fewer GPUs than nodes: nodes share them (one GPU: all on it)
    done
  fi
  say "  run $name: $nodes nodes, syncopate-worker --dist.mode=ring ${*}"
  for i in $(seq 0 $((nodes - 1))); do
    local e=(SYNCOPATE_TOKEN="gpucheck-$$" MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" NNODES="$nodes" NODE_RANK="$i")
    [ "$DRY" = 0 ] && e+=(CUDA_VISIBLE_DEVICES="${cvd[$i]}")
    env "${e[@]}" "$BIN/syncopate-worker" --out "$RUNS/$name/node$i" "${BASE[@]}" --dist.mode=ring "$@" \
      > "$SEC/runs/$name.node$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || { rc=$?; say "  node $i of $name exited $rc"; }; done
  for i in $(seq 0 $((nodes - 1))); do keep_run "$name/node$i"; done
  if [ $rc != 0 ]; then
    rep record --sec "$SEC" --name "run $name" --status fail \
      --reason "a node exited $rc: $(tail -q -n 2 "$SEC"/runs/"$name".node*.log | tr '\n' ' ' | cut -c1-600)"
  fi
  return $rc
}

compare() {  # NAME RUN_A RUN_B ROW [more gpu_check_report.py compare options]; a run of several nodes: A,B
  local name=$1 a=$2 b=$3 row=$4
  shift 4
  rep compare --sec "$SEC" --name "$name" --a "$RUNS/${a//,/,$RUNS/}" --b "$RUNS/${b//,/,$RUNS/}" --tol "$row" "$@"
}

# ---------------------------------------------------------------------------------------------
# Sections

sec_versions() {
  section_env versions
  local dryflag=()
  [ "$GC_DRY" = 1 ] && dryflag=(--dry)
  rep versions --out "$SEC/versions.json" "${dryflag[@]}" --worker "$BIN/syncopate-worker"
  if [ "$GC_DRY" = 0 ] && [ "$("$PY" -c "import json; print(json.load(open('$SEC/versions.json'))['gpu_count'])")" = 0 ]; then
    rep record --sec "$SEC" --name "a GPU is visible" --status fail \
      --reason "no CUDA device visible to torch (scripts/gpu_check.sh --dry runs the CPU dry mode)"
  else
    rep record --sec "$SEC" --name "versions" --status info --reason "see the table above"
  fi
}

sec__probe() {  # the watchdog's subject: a worker that trains without end (5 s limit)
  section_env _probe
  need_bin syncopate-worker
  "$BIN/syncopate-worker" --out "$RUNS/forever" --model.preset=micro --train.device=cpu --train.threads=1 \
    --train.steps=1000000000 --eval.every=0 --eval.sample_tokens=0 --checkpoint.every=0 --dist.check_every=0 \
    --train.log_every=1000000 --data.cache_dir="$ROOT/data/cache" > "$SEC/worker.log" 2>&1
}

sec_watchdog() {
  section_env watchdog
  rep watchdog --sec "$SEC" --probe "$GC_OUT/sections/_probe"
}

sec_gpu_tests() {
  section_env gpu_tests
  need_bin syncopate_tests
  local log="$SEC/gtest.log" t
  "$BIN/syncopate_tests" --gtest_filter='LocalGroup.Nccl*:GPT.Cuda*:AutocastGuard.Cuda*:Determinism.Cuda*' > "$log" 2>&1 || true
  cat "$log"
  for t in LocalGroup.NcclGroupMatchesTheThreadGroup GPT.CudaCheckpointRecomputeReplaysMasksAndAutocast \
           AutocastGuard.CudaControlLibTorchsCacheServesAStaleCastWithoutTheGuard AutocastGuard.CudaCastsFollowAnInPlaceUpdate \
           AutocastGuard.CudaCheckpointingMatchesAcrossAnInPlaceUpdate Determinism.CudaTwoIdenticalBf16PassesGiveTheSameGradientsBitForBit; do
    if grep -q "^\[       OK \] $t" "$log"; then
      rep record --sec "$SEC" --name "$t" --status pass
    elif grep -q "^\[  SKIPPED \] $t" "$log"; then
      if [ "$GC_DRY" = 1 ]; then
        rep record --sec "$SEC" --name "$t" --status skipped --reason "GPU only: no CUDA device (the test ran and skipped itself)"
      elif [ "$G" -lt 2 ] && [[ $t == LocalGroup.* ]]; then
        rep record --sec "$SEC" --name "$t" --status skipped --reason "one GPU: $(grep -A1 "Skipped" "$log" | tail -n 1)"
      else
        rep record --sec "$SEC" --name "$t" --status fail --reason "skipped on a machine with GPUs: $(grep -A1 "Skipped" "$log" | tail -n 1)"
      fi
    else
      rep record --sec "$SEC" --name "$t" --status fail --reason "not OK: $(grep -E "FAILED|Failure|error" "$log" | head -n 3 | tr '\n' ' ')"
    fi
  done
}

sec_correctness() {
  section_env correctness
  need_bin syncopate-worker
  local fp32_floor="noise floor fp32: two identical runs of 1 x 1" bf16_floor="noise floor bf16: two identical runs of 1 x 1"
  local dryn="" n16=""
  [ "$DRY" = 1 ] && dryn="dry: CPU fp32 runs" n16="dry: fp32 CPU runs under the bf16 row (code path only; the worker's bf16 needs CUDA)"
  # The noise floors: two identical runs of one replica, fp32 and bf16, dropout 0. One replica, so
  # no concurrency of ours is in them: a race in the node's reduction cannot raise the limits that
  # judge it (the G-replica runs repeated are compared against these floors below).
  train one32 -- "${PREC32[@]}" --dist.local_replicas=1 || true
  train one32b -- "${PREC32[@]}" --dist.local_replicas=1 || true
  compare "$fp32_floor" one32 one32b fp32 --expect floor --note "$dryn"
  train one16 -- "${PREC16[@]}" --dist.local_replicas=1 || true
  train one16b -- "${PREC16[@]}" --dist.local_replicas=1 || true
  compare "$bf16_floor" one16 one16b bf16 --expect floor --note "$n16"
  # The same with train.deterministic=true: is the floor the kernels' run-to-run order (then it is 0
  # here), or something of ours? Information, and the floor of a future exact check.
  train det16 -- "${PREC16[@]}" --dist.local_replicas=1 --train.deterministic=true || true
  train det16b -- "${PREC16[@]}" --dist.local_replicas=1 --train.deterministic=true || true
  compare "noise floor bf16 with train.deterministic=true: two identical runs of 1 x 1" det16 det16b bf16 --expect floor --note "$n16"
  # Samples: both layouts take samples [p, p + G b) at every step (see the header); dropout 0.
  if [ "$G" -ge 2 ]; then
    train acc32 -- "${PREC32[@]}" --dist.local_replicas=1 --train.grad_accum="$G" || true
    train rep32 -- "${PREC32[@]}" --dist.local_replicas="$G" || true
    train rep32b -- "${PREC32[@]}" --dist.local_replicas="$G" || true
    train ctl32 -- "${PREC32[@]}" --dist.local_replicas="$G" --optim.lr="$(pyval "$LR * 1.001")" || true
    compare "$G x 1 run twice, fp32 (the node's reduction repeatable)" rep32 rep32b fp32 --floor "$fp32_floor" --note "$dryn"
    compare "layouts fp32: 1 x grad_accum $G vs $G x 1" acc32 rep32 fp32 --floor "$fp32_floor" --note "$dryn"
    compare "control fp32: learning rate x 1.001 must be caught" rep32 ctl32 fp32 --floor "$fp32_floor" --expect differ --note "$dryn"
    if [ "$DRY" = 1 ]; then  # the worker's bf16 needs CUDA: the bf16 rows judge the fp32 runs (their code path only)
      train ctl16 -- "${PREC32[@]}" --dist.local_replicas="$G" --optim.lr="$(pyval "$LR * 1.02")" || true
      compare "$G x 1 run twice, bf16 (the node's reduction repeatable)" rep32 rep32b bf16 --floor "$bf16_floor" --note "$n16"
      compare "layouts bf16: 1 x grad_accum $G vs $G x 1" acc32 rep32 bf16 --floor "$bf16_floor" --note "$n16"
      compare "control bf16: learning rate x 1.02 must be caught" rep32 ctl16 bf16 --floor "$bf16_floor" --expect differ --note "$n16"
    else
      train acc16 -- "${PREC16[@]}" --dist.local_replicas=1 --train.grad_accum="$G" || true
      train rep16 -- "${PREC16[@]}" --dist.local_replicas="$G" || true
      train rep16b -- "${PREC16[@]}" --dist.local_replicas="$G" || true
      train ctl16 -- "${PREC16[@]}" --dist.local_replicas="$G" --optim.lr="$(pyval "$LR * 1.02")" || true
      compare "$G x 1 run twice, bf16 (the node's reduction repeatable)" rep16 rep16b bf16 --floor "$bf16_floor"
      compare "layouts bf16: 1 x grad_accum $G vs $G x 1" acc16 rep16 bf16 --floor "$bf16_floor"
      compare "control bf16: learning rate x 1.02 must be caught" rep16 ctl16 bf16 --floor "$bf16_floor" --expect differ
    fi
    # Overlap: 1-KiB buckets are one per parameter (bucket_bounds cuts at parameters): every
    # gradient region fenced and reduced on its own during backward, against one reduction after it.
    train tiny_buckets -- "${PREC32[@]}" --dist.local_replicas="$G" --dist.overlap=true --dist.bucket_kb=1 --dist.first_bucket_kb=1 || true
    train overlap_off -- "${PREC32[@]}" --dist.local_replicas="$G" --dist.overlap=false || true
    compare "overlap on (1-KiB buckets, one per parameter) vs off" tiny_buckets overlap_off fp32 --floor "$fp32_floor" --note "$dryn"
    if grep -q "bucket reductions started during backward" "$SEC/runs/tiny_buckets.log" 2>/dev/null; then
      rep record --sec "$SEC" --name "tiny buckets reduced during backward" --status pass \
        --reason "$(grep -h "gradient buckets\|during backward" "$SEC/runs/tiny_buckets.log" | tr '\n' ' ')"
    else
      rep record --sec "$SEC" --name "tiny buckets reduced during backward" --status fail \
        --reason "the run's log does not say that buckets were reduced during backward"
    fi
  else
    # One GPU: the noise floors and the controls on 1 x 1, and the inter-node path (2 nodes of one
    # replica, both on the one GPU: host staging, the comm stream, the TCP ring) against 1 replica x
    # grad_accum 2, which takes the same 2 b samples per step.
    train ctl32 -- "${PREC32[@]}" --dist.local_replicas=1 --optim.lr="$(pyval "$LR * 1.001")" || true
    compare "control fp32: learning rate x 1.001 must be caught" one32 ctl32 fp32 --floor "$fp32_floor" --expect differ --note "$dryn"
    train ctl16 -- "${PREC16[@]}" --dist.local_replicas=1 --optim.lr="$(pyval "$LR * 1.02")" || true
    compare "control bf16: learning rate x 1.02 must be caught" one16 ctl16 bf16 --floor "$bf16_floor" --expect differ --note "$n16"
    train acc2 -- "${PREC32[@]}" --dist.local_replicas=1 --train.grad_accum=2 || true
    train_nodes ring2 2 -- "${PREC32[@]}" --dist.local_replicas=1 || true
    compare "2 nodes x 1 (ring; one GPU: both nodes on it) vs 1 x grad_accum 2" ring2/node0,ring2/node1 acc2 fp32 \
      --floor "$fp32_floor" --note "$dryn"
    rep record --sec "$SEC" --name "layouts and overlap across GPUs of one node" --status skipped \
      --reason "one GPU: these compare 1 and G >= 2 GPUs of one node (NCCL)"
  fi
  # Activation checkpointing: dropout 0.1 in both runs (the recompute must replay the forward's masks).
  local rows=("${PREC16[@]}") row=bf16 nck="" reps=$((G >= 2 ? G : 1))
  [ "$DRY" = 1 ] && { row=fp32; nck="dry: CPU fp32"; }
  local half=$((STEPS / 2)) ck
  ck=$(printf 'step_%06d' "$half")
  local ck_floor="noise floor of the checkpointing runs: two identical runs ($reps x 1, dropout 0.1)"
  KEEP_OPTIMIZER=1 train ckpt_off -- "${rows[@]}" --dist.local_replicas="$reps" --model.dropout=0.1 \
    --checkpoint.every="$half" --checkpoint.keep=100 || true
  train ckpt_off_b -- "${rows[@]}" --dist.local_replicas="$reps" --model.dropout=0.1 || true
  compare "$ck_floor" ckpt_off ckpt_off_b "$row" --expect floor --note "$nck"
  train ckpt_on -- "${rows[@]}" --dist.local_replicas="$reps" --model.dropout=0.1 --model.activation_checkpointing=true || true
  compare "activation checkpointing on vs off ($reps x 1, dropout 0.1, $STEPS steps)" ckpt_off ckpt_on "$row" \
    --floor "$ck_floor" --note "$nck"
  # Resume: ckpt_off's checkpoint of step STEPS/2 (weights, AdamW, RNG) resumed in a directory of its
  # own (its metrics up to that step copied), against ckpt_off's uninterrupted run.
  rm -rf "${RUNS:?}/resumed"; mkdir -p "$RUNS/resumed/checkpoints"
  if [ -d "$RUNS/ckpt_off/checkpoints/$ck" ]; then
    cp -r "$RUNS/ckpt_off/checkpoints/$ck" "$RUNS/resumed/checkpoints/"
    echo "$ck" > "$RUNS/resumed/checkpoints/latest"
    "$PY" -c "import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if 'step' not in r or r['step'] <= int(sys.argv[2]): print(l, end='')" "$RUNS/ckpt_off/metrics.jsonl" "$half" \
      > "$RUNS/resumed/metrics.jsonl"
    rm -rf "${RUNS:?}/resumed_seed"; cp -r "$RUNS/resumed" "$RUNS/resumed_seed"
    RESUMING=1 train resumed -- "${rows[@]}" --dist.local_replicas="$reps" --model.dropout=0.1 --resume || true
    # Judged by the row alone, no floor: both runs share steps 1..half exactly, and a resume that
    # restores the wrong state (masks, data position, schedule) must not hide in run-to-run noise.
    compare "resumed at step $half vs uninterrupted ($reps x 1, dropout 0.1, $STEPS steps)" ckpt_off resumed "$row" --note "$nck"
    # The control: resumed with another train.seed (other dropout masks after the resume, as a lost
    # generator state would draw) must be caught.
    RESUMING=1 train resumed_seed -- "${rows[@]}" --dist.local_replicas="$reps" --model.dropout=0.1 --train.seed=4242 --resume || true
    compare "control: resumed with another seed must be caught" ckpt_off resumed_seed "$row" --expect differ --note "$nck"
  else
    rep record --sec "$SEC" --name "resumed at step $half vs uninterrupted" --status fail \
      --reason "ckpt_off wrote no checkpoint $ck (--checkpoint.every=$half)"
  fi
  # Hierarchy: 2 nodes of G/2 replicas each, joined by the ring: the same G b samples per step.
  if [ "$G" -ge 4 ] && [ $((G % 2)) = 0 ]; then
    train_nodes ring_sliced 2 -- "${PREC32[@]}" --dist.local_replicas=$((G / 2)) --dist.hierarchy=sliced || true
    train_nodes ring_root 2 -- "${PREC32[@]}" --dist.local_replicas=$((G / 2)) --dist.hierarchy=root || true
    local sl=ring_sliced/node0,ring_sliced/node1 rt=ring_root/node0,ring_root/node1
    compare "hierarchy sliced vs root (2 nodes x $((G / 2)), ring)" "$sl" "$rt" fp32 --floor "$fp32_floor" --note "$dryn"
    compare "2 nodes x $((G / 2)) (ring, sliced) vs 1 node x $G" "$sl" rep32 fp32 --floor "$fp32_floor" --note "$dryn"
  else
    rep record --sec "$SEC" --name "hierarchy sliced vs root" --status skipped \
      --reason "needs an even G >= 4 (2 nodes of >= 2 GPUs); G = $G"
  fi
  # The tiny model on the GPU in fp32 against the CPU (dry: the CPU with 1 thread against 2).
  local tiny=(--model.preset=tiny --model.dropout=0 --train.precision=fp32 --dist.local_replicas=1)
  if [ "$DRY" = 1 ]; then
    train tiny_a -- "${tiny[@]}" --train.threads=1 || true
    train tiny_b -- "${tiny[@]}" --train.threads=2 || true
    compare "tiny model: CPU 1 thread vs 2 threads" tiny_a tiny_b device --note "dry: stands in for GPU fp32 vs CPU (no GPU)"
  else
    train tiny_gpu -- "${tiny[@]}" --train.device=cuda || true
    train tiny_cpu -- "${tiny[@]}" --train.device=cpu --train.threads=0 || true
    compare "tiny model: GPU fp32 vs CPU fp32" tiny_gpu tiny_cpu device
  fi
}

sec_communication() {
  section_env communication
  need_bin syncopate-bench-allreduce
  local sizes iters backend
  if [ "$DRY" = 1 ]; then sizes=1048576,4194304 iters=5 backend=gloo; else sizes=1048576,26214400,524288000 iters=20 backend=nccl; fi
  local bench="$BIN/syncopate-bench-allreduce" help op
  help=$("$bench" --help 2>&1 || true)
  # The project's collectives among G replicas of one process (the node's LocalGroup, NodeAllreduce).
  local port; port=$(free_port)
  local benv=(SYNCOPATE_TOKEN="gpucheck-$$" MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" NNODES=1 NODE_RANK=0)
  if grep -q -- "--device" <<< "$help" && grep -q -- "--op" <<< "$help"; then
    local dev=cuda; [ "$DRY" = 1 ] && dev=cpu
    for op in all_reduce reduce_scatter all_gather; do
      port=$(free_port)
      env "${benv[@]}" MASTER_PORT="$port" "$bench" --local "$G" --device "$dev" --op "$op" --sizes "$sizes" --iters "$iters" \
        > "$SEC/syncopate_$op.txt" 2>&1 || true
      rep comm --sec "$SEC" --name "syncopate $op" --impl "syncopate LocalGroup ($dev)" --op "$op" --ranks "$G" --table "$SEC/syncopate_$op.txt"
    done
  elif [ "$DRY" = 1 ]; then
    env "${benv[@]}" "$bench" --local "$G" --sizes "$sizes" --iters "$iters" > "$SEC/syncopate_all_reduce.txt" 2>&1 || true
    rep comm --sec "$SEC" --name "syncopate all_reduce" --impl "syncopate LocalGroup (CPU threads)" --op all_reduce --ranks "$G" \
      --table "$SEC/syncopate_all_reduce.txt"
    for op in reduce_scatter all_gather; do
      rep record --sec "$SEC" --name "syncopate $op" --status skipped \
        --reason "syncopate-bench-allreduce has no --op: it times NodeAllreduce's all-reduce only (C++ change needed)"
    done
  else
    rep record --sec "$SEC" --name "syncopate all_reduce / reduce_scatter / all_gather on GPUs" --status skipped \
      --reason "syncopate-bench-allreduce has no --device cuda / --op (it times CPU buffers): C++ change needed, see the report of issue 28"
  fi
  # The project's ring between 2 processes over TCP loopback (the inter-node path), all-reduce.
  port=$(free_port)
  ( env "${benv[@]}" MASTER_PORT="$port" NNODES=2 NODE_RANK=1 "$bench" --sizes "$sizes" --iters "$iters" > /dev/null 2>&1 & \
    env "${benv[@]}" MASTER_PORT="$port" NNODES=2 NODE_RANK=0 "$bench" --sizes "$sizes" --iters "$iters" > "$SEC/syncopate_ring.txt" 2>&1; wait ) || true
  rep comm --sec "$SEC" --name "syncopate ring all_reduce" --impl "syncopate ring (2 processes, TCP loopback)" --op all_reduce \
    --ranks 2 --table "$SEC/syncopate_ring.txt"
  # The same all-reduce inside training, whole gradient buffer: wait_s of G replicas with overlap off
  # (one all-reduce after backward, then clip and update) less wait_s of 1 replica (clip and update).
  if [ "$G" -ge 2 ]; then
    train wait_1 -- "${PREC16[@]}" --train.steps="$TSTEPS" --dist.local_replicas=1 --dist.check_every=0 || true
    train wait_g -- "${PREC16[@]}" --train.steps="$TSTEPS" --dist.local_replicas="$G" --dist.overlap=false --dist.check_every=0 || true
    rep comm-from-wait --sec "$SEC" --name "syncopate all_reduce in training" --one "$RUNS/wait_1/metrics.jsonl" \
      --many "$RUNS/wait_g/metrics.jsonl" --ranks "$G" --preset "$PRESET"
  fi
  # torch.distributed in the same run: NCCL on GPUs (Gloo in the dry run), all three ops.
  say "  torchrun --standalone --nproc-per-node=$G scripts/gloo_allreduce.py --backend $backend"
  env -u NNODES -u NODE_RANK -u MASTER_ADDR -u MASTER_PORT "$PY" -m torch.distributed.run --standalone --nproc-per-node="$G" \
    "$ROOT/scripts/gloo_allreduce.py" --backend "$backend" --ops all_reduce,reduce_scatter,all_gather --sizes "$sizes" \
    --iters "$iters" --json "$SEC/torch.json" > "$SEC/torch.log" 2>&1 || say "  torch.distributed failed: $(tail -n 3 "$SEC/torch.log")"
  for op in all_reduce reduce_scatter all_gather; do
    rep comm --sec "$SEC" --name "torch $op" --impl "torch.distributed $backend" --op "$op" --ranks "$G" --table "$SEC/torch.json" --format json
  done
  # nccl-tests, when installed.
  if [ "$DRY" = 1 ]; then
    rep record --sec "$SEC" --name "nccl-tests" --status skipped --reason "GPU only (dry run)"
  elif command -v all_reduce_perf > /dev/null; then
    local s
    for op in all_reduce reduce_scatter all_gather; do
      command -v "${op}_perf" > /dev/null || continue
      : > "$SEC/nccl_tests_$op.txt"
      for s in ${sizes//,/ }; do "${op}_perf" -b "$s" -e "$s" -g "$G" -n "$iters" >> "$SEC/nccl_tests_$op.txt" 2>&1 || true; done
      rep comm --sec "$SEC" --name "nccl-tests $op" --impl "nccl-tests ${op}_perf" --op "$op" --ranks "$G" \
        --table "$SEC/nccl_tests_$op.txt" --format nccl-tests
    done
  else
    rep record --sec "$SEC" --name "nccl-tests" --status skipped \
      --reason "all_reduce_perf is not on PATH (build github.com/NVIDIA/nccl-tests and add it); torch.distributed NCCL is the reference"
  fi
}

sec_throughput() {
  section_env throughput
  need_bin syncopate-worker
  local prec=bf16 peak="" gpu="" place=() ddp_dev=(--device cuda --precision bf16)
  if [ "$DRY" = 1 ]; then
    prec=fp32 ddp_dev=(--device cpu --precision fp32 --threads 1) place=(--placeholder)
    peak=$(pyval "r.DRY_PLACEHOLDER_PEAK")  # the worker logs mfu against it: its formula is checked, no MFU reported
  else
    gpu=$("$PY" -c "import json; print(json.load(open('$GC_OUT/sections/versions/versions.json'))['gpu_model'])")
    peak=${GC_PEAK:-$(pyval "r.peak_tflops('$gpu', '$prec')[0] or ''")}
  fi
  local p16=(--train.precision="$prec") pk=()
  [ -n "$peak" ] && pk=(--train.peak_tflops="$peak")
  train worker_1 -- "${p16[@]}" "${pk[@]}" --train.steps="$TSTEPS" --dist.local_replicas=1 --dist.check_every=0 || true
  # The precision actually used: below compute capability 8.0 the worker trains in fp32 (it says so),
  # and its MFU is then against the fp32 peak.
  if grep -q "training in fp32 instead" "$SEC/runs/worker_1.log"; then
    prec=fp32
    [ -z "${GC_PEAK:-}" ] && [ "$DRY" = 0 ] && peak=$(pyval "r.peak_tflops('$gpu', 'fp32')[0] or ''")
    pk=(); [ -n "$peak" ] && pk=(--train.peak_tflops="$peak")
  fi
  local tp=(--sec "$SEC" --preset "$PRESET" --precision "$prec" --gpu "$gpu" "${place[@]}")
  [ -n "${GC_PEAK:-}" ] && tp+=(--peak-tflops "$GC_PEAK")
  rep throughput "${tp[@]}" --name "syncopate 1 device" --kind worker --devices 1 --metrics "$RUNS/worker_1/metrics.jsonl"
  if [ "$G" -ge 2 ]; then
    train worker_g -- "${p16[@]}" "${pk[@]}" --train.steps="$TSTEPS" --dist.local_replicas="$G" --dist.check_every=0 || true
    rep throughput "${tp[@]}" --name "syncopate $G devices" --kind worker --devices "$G" --metrics "$RUNS/worker_g/metrics.jsonl" \
      --sync "$RUNS/worker_g/sync.json" --baseline "syncopate 1 device"
  fi
  # PyTorch DDP, the same model, batch and steps, in the same session.
  local data
  data=$(ls "$ROOT"/data/cache/byte-*/*_text_document.bin 2>/dev/null | head -n 1)
  local n
  for n in $(printf '%s\n' 1 "$G" | sort -nu); do  # 1, and G when G > 1
    say "  torchrun --standalone --nproc-per-node=$n scripts/ref_gpt_train.py ${ddp_dev[*]} --preset $PRESET"
    env -u NNODES -u NODE_RANK -u MASTER_ADDR -u MASTER_PORT "$PY" -m torch.distributed.run --standalone --nproc-per-node="$n" \
      "$ROOT/scripts/ref_gpt_train.py" "${ddp_dev[@]}" --preset "$PRESET" --batch "$BATCH" --steps "$TSTEPS" --data "$data" \
      > "$SEC/ddp_$n.log" 2>&1 || say "  DDP on $n failed: $(tail -n 3 "$SEC/ddp_$n.log")"
    local base=() how="one process, no DDP wrapper" plural=""
    if [ "$n" != 1 ]; then
      base=(--baseline "PyTorch DDP 1 device") how="DDP over NCCL" plural=s
      [ "$DRY" = 1 ] && how="DDP over Gloo"
    fi
    rep throughput "${tp[@]}" --name "PyTorch DDP $n device$plural" --kind ddp --devices "$n" \
      --metrics "$SEC/ddp_$n.log" "${base[@]}" --note "torchrun, $how, eager"
  done
  # One process per GPU, as torchrun --nproc-per-node=G starts them (dist.launch=auto -> gpu).
  if [ "$DRY" = 1 ] || [ "$G" -lt 2 ]; then
    rep record --sec "$SEC" --name "one process per GPU (dist.launch=gpu)" --status skipped \
      --reason "GPU only: each process takes the GPU of its LOCAL_RANK$([ "$DRY" = 0 ] && echo "; G = $G")"
  else
    local port r pids=() rc=0; port=$(free_port)
    for r in $(seq 0 $((G - 1))); do
      env SYNCOPATE_TOKEN="gpucheck-$$" WORLD_SIZE="$G" RANK="$r" LOCAL_RANK="$r" LOCAL_WORLD_SIZE="$G" MASTER_ADDR=127.0.0.1 \
        MASTER_PORT="$port" "$BIN/syncopate-worker" --out "$RUNS/pergpu$r" "${BASE[@]}" "${p16[@]}" "${pk[@]}" --dist.mode=ring \
        --train.steps="$TSTEPS" \
        --dist.check_every=0 > "$SEC/runs/pergpu$r.log" 2>&1 &
      pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r" || rc=$?; done
    if [ $rc != 0 ] || ! grep -q "one process per GPU" "$SEC/runs/pergpu0.log"; then
      rep record --sec "$SEC" --name "one process per GPU (dist.launch=gpu)" --status fail \
        --reason "exit $rc; launch layout line: $(grep -h "launch layout" "$SEC/runs/pergpu0.log" | head -n 1)"
    else
      rep throughput "${tp[@]}" --name "syncopate $G processes x 1 GPU" --kind worker --devices "$G" \
        --metrics "$RUNS/pergpu0/metrics.jsonl" --sync "$RUNS/pergpu0/sync.json" --baseline "syncopate 1 device"
    fi
  fi
}

timed_run() {  # NAME BOUND LOG [VAR=value ...] -- ARGS: a worker under timeout BOUND + 30; sets RC, WALL, END
  local name=$1 bound=$2 log=$3; shift 3
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local start; start=$(now_us)
  RC=0
  env "${envs[@]}" timeout -k 5 "$(pyval "int($bound) + 30")" "$BIN/syncopate-worker" --out "$RUNS/$name" "${BASE[@]}" "$@" \
    > "$log" 2>&1 || RC=$?
  END=$(date +%s.%N)
  WALL=$(secs_since "$start")
}

sec_failure() {
  section_env failure
  need_bin syncopate-worker
  local mode=gpu; [ "$DRY" = 1 ] && mode=dry
  local fb eb reps=2
  fb=$(pyval "r.FAIL_BOUND_S['$mode']") eb=$(pyval "r.EXIT_BOUND_S['$mode']")
  [ "$G" -lt 2 ] && reps=1
  local fl=(--train.steps=6 --dist.local_replicas="$reps" "${PREC16[@]}")
  # A replica failing in the middle of its backward (after the later layers' buckets left).
  if [ "$reps" -ge 2 ]; then
    timed_run fail_backward "$fb" "$SEC/fail_backward.log" SYNCOPATE_FAIL_AT=backward:replica1:2 -- "${fl[@]}"
    rep expect-exit --sec "$SEC" --name "replica 1 fails at backward (SYNCOPATE_FAIL_AT=backward:replica1:2)" --rc "$RC" \
      --wall "$WALL" --bound "$fb" --log "$SEC/fail_backward.log" --cause "injected failure in backward"
  else
    rep record --sec "$SEC" --name "replica 1 fails at backward" --status skipped --reason "one GPU: needs 2 replicas"
  fi
  # Before start(): the worker has no fail point there unless built with one (grep its strings).
  if [ "$reps" -lt 2 ]; then
    rep record --sec "$SEC" --name "a replica fails before start() (in one node)" --status skipped \
      --reason "one GPU: needs 2 replicas in the node"
  elif grep -aq "injected failure before start" "$BIN/syncopate-worker"; then
    timed_run fail_start "$fb" "$SEC/fail_start.log" SYNCOPATE_FAIL_AT=start:replica1:0 -- "${fl[@]}"
    rep expect-exit --sec "$SEC" --name "replica 1 fails before start() (SYNCOPATE_FAIL_AT=start:replica1:0)" --rc "$RC" \
      --wall "$WALL" --bound "$fb" --log "$SEC/fail_start.log" --cause "injected failure before start"
  else
    rep record --sec "$SEC" --name "a replica fails before start() (in one node)" --status skipped \
      --reason "syncopate-worker has no fail point before GradientSync::start (C++ change needed: fail_point(\"start\", \"replica<local>\", step) in Trainer::Impl's constructor)"
  fi
  # A node of a 2-node ring that never comes: node 0 fails before any step, naming node 1, within
  # dist.timeout_s (10 s; dry 5 s) + the bound.
  local to=10; [ "$DRY" = 1 ] && to=5
  timed_run ring_missing "$(pyval "$fb + $to")" "$SEC/ring_missing.log" SYNCOPATE_TOKEN="gpucheck-$$" MASTER_ADDR=127.0.0.1 \
    MASTER_PORT="$(free_port)" NNODES=2 NODE_RANK=0 -- "${fl[@]}" --dist.mode=ring --dist.timeout_s="$to"
  rep expect-exit --sec "$SEC" --name "a node that never comes: node 0 of a 2-node ring ends before start()" --rc "$RC" \
    --wall "$WALL" --bound "$(pyval "$fb + $to")" --log "$SEC/ring_missing.log" --cause "node(s) 1 did not connect" \
    --note "dist.timeout_s=$to"
  # A clean run: exit 0, within the bound of its last step (no teardown hang).
  timed_run clean "$fb" "$SEC/clean.log" -- "${fl[@]}"
  rep expect-exit --sec "$SEC" --name "a clean run of $reps replica(s) exits 0 soon after its last step" --rc "$RC" --wall "$WALL" \
    --bound "$fb" --log "$SEC/clean.log" --clean --metrics "$RUNS/clean/metrics.jsonl" --end-unix "$END" --exit-bound "$eb"
}

if [ "${1:-}" = --run-section ]; then  # inside the watchdog (run_section): one section, config from GC_*
  cd "$ROOT"
  "sec_$2"
  exit $?
fi

# ---------------------------------------------------------------------------------------------
# Main

DRY=0 OUT="" GPUS="" PRESET="" STEPS="" TSTEPS="" BATCH="" STIMEOUT="" PEAK="" ONLY=""
ARGS=("$@")
while [ $# -gt 0 ]; do
  case "$1" in
    --dry) DRY=1; shift;;
    --out) OUT=$2; shift 2;;
    --gpus) GPUS=$2; shift 2;;
    --preset) PRESET=$2; shift 2;;
    --steps) STEPS=$2; shift 2;;
    --throughput-steps) TSTEPS=$2; shift 2;;
    --batch) BATCH=$2; shift 2;;
    --section-timeout) STIMEOUT=$2; shift 2;;
    --peak-tflops) PEAK=$2; shift 2;;
    --only) ONLY=$2; shift 2;;
    *) echo "gpu_check.sh: unknown option $1 (see the header of this script)" >&2; exit 2;;
  esac
done
if [ "$DRY" = 1 ]; then
  PRESET=${PRESET:-micro} STEPS=${STEPS:-10} TSTEPS=${TSTEPS:-10} BATCH=${BATCH:-4} GPUS=${GPUS:-8}
else
  PRESET=${PRESET:-gpt2} STEPS=${STEPS:-10} TSTEPS=${TSTEPS:-30} BATCH=${BATCH:-8}
fi
[ "$STEPS" -ge 3 ] || { echo "gpu_check.sh: --steps must be at least 3" >&2; exit 2; }
for s in ${ONLY//,/ }; do
  case $s in versions|watchdog|gpu_tests|correctness|communication|throughput|failure) ;;
    *) echo "gpu_check.sh: --only: no section '$s' (versions watchdog gpu_tests correctness communication throughput failure)" >&2; exit 2;;
  esac
done
[ -x "$PY" ] || { echo "gpu_check.sh: $PY missing (scripts/setup.sh)" >&2; exit 2; }
for b in syncopate-worker syncopate-bench-allreduce syncopate_tests; do need_bin "$b" || exit 2; done
OUT=${OUT:-$ROOT/runs/gpu_check-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/sections" "$OUT/report.json" "$OUT/report.md"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
CURRENT="" DRYFLAG=()
[ "$DRY" = 1 ] && DRYFLAG=(--dry)
T0=$(now_us)
cleanup() {
  trap - EXIT INT TERM
  end_all
  rm -rf "$WORK"
}
on_signal() {
  echo "gpu_check.sh: interrupted${CURRENT:+ in section $CURRENT}: ending every process it started" >&2
  end_all
  [ -n "$CURRENT" ] && echo "interrupted (Ctrl-C or SIGTERM)" > "$OUT/sections/$CURRENT/skipped.txt" 2>/dev/null
  timeout 60 "$PY" "$REPORT" assemble --out "$OUT" "${DRYFLAG[@]}" --interrupted \
    --wall "$(secs_since "$T0")" --command "scripts/gpu_check.sh ${ARGS[*]}" > /dev/null 2>&1 || true
  echo "gpu_check.sh: partial report in $OUT/report.md" >&2
  cleanup
  exit 130
}
trap cleanup EXIT
trap on_signal INT TERM

if [ "$DRY" = 0 ]; then
  VISIBLE=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  GPUS=${GPUS:-$VISIBLE}
  if [ "$VISIBLE" -lt 1 ]; then
    echo "gpu_check.sh: no CUDA device is visible to torch; scripts/gpu_check.sh --dry runs the CPU dry mode" >&2
  elif [ "$GPUS" -gt "$VISIBLE" ]; then
    echo "gpu_check.sh: --gpus $GPUS but $VISIBLE visible" >&2; exit 2
  fi
fi
export GC_DRY=$DRY GC_OUT=$OUT GC_WORK=$WORK GC_G=${GPUS:-0} GC_PRESET=$PRESET GC_STEPS=$STEPS GC_TSTEPS=$TSTEPS GC_BATCH=$BATCH GC_PEAK=$PEAK
limit() {  # SECTION: its timeout
  [ -n "$STIMEOUT" ] && { echo "$STIMEOUT"; return; }
  if [ "$DRY" = 1 ]; then echo 180; return; fi
  case $1 in versions|watchdog) echo 300;; gpu_tests|failure) echo 900;; correctness) echo 3600;; *) echo 1800;; esac
}
wanted() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
say "gpu_check.sh: $([ "$DRY" = 1 ] && echo "DRY RUN (CPU): no GPU result; $GPUS CPU replicas stand in for GPUs" || echo "$GPUS GPU(s)"), preset $PRESET, $STEPS steps ($TSTEPS for throughput), batch $BATCH; report in $OUT"
cd "$ROOT"
run_section versions "$(limit versions)"
if [ "$DRY" = 0 ] && [ "${VISIBLE:-0}" -lt 1 ]; then
  rep assemble --out "$OUT" --wall "$(secs_since "$T0")" --command "scripts/gpu_check.sh ${ARGS[*]}" > /dev/null || true
  echo "gpu_check.sh: stopped: no GPU (report in $OUT/report.md)" >&2
  exit 1
fi
if wanted watchdog; then
  run_section _probe 5
  run_section watchdog "$(limit watchdog)"
fi
for s in gpu_tests correctness communication throughput failure; do
  wanted "$s" && run_section "$s" "$(limit "$s")"
done
rc=0
rep assemble --out "$OUT" "${DRYFLAG[@]}" --wall "$(secs_since "$T0")" \
  --command "scripts/gpu_check.sh ${ARGS[*]}" || rc=$?
exit $rc
