#!/usr/bin/env python3
"""The comparisons, tolerances, MFU peaks and report of scripts/gpu_check.sh (issue 28).

usage: gpu_check_report.py COMMAND [options]   (gpu_check.sh calls it; it is also importable)

  versions  --out FILE [--dry] [--worker BIN]   driver, CUDA, NCCL, torch, GPUs -> JSON; prints them
  compare   --sec DIR --name N --a RUN --b RUN --tol ROW [--floor CHECK] [--expect match|differ|floor] [--note T]
            two runs' per-step loss and grad_norm (metrics.jsonl) and final weights (their last
            checkpoint's model.safetensors) under the tolerance row ROW of TOLERANCES; a run of
            several nodes is their directories joined by commas
  record    --sec DIR --name N --status pass|fail|skipped|info [--reason T] [--numbers JSON]
  comm      --sec DIR --name N --impl LABEL --op OP --ranks R --table FILE [--format bench|json|nccl-tests]
  comm-from-wait --sec DIR --name N --one METRICS --many METRICS --ranks G --preset P
            the all-reduce of the whole gradient in training: wait_s(G replicas, overlap off) - wait_s(1)
  throughput --sec DIR --name N --kind worker|ddp --devices D --metrics FILE --preset P --precision P
            [--gpu NAME] [--peak-tflops X] [--placeholder] [--sync FILE] [--baseline CHECK]
  expect-exit --sec DIR --name N --rc RC --wall S --bound S --log FILE (--cause TEXT | --clean)
            [--metrics FILE --end-unix T --exit-bound S]
  watchdog  --sec DIR --probe DIR               the watchdog's self-test from its probe section
  hang      --sec DIR --timeout S --tool T --stacks FILE [--procs "PID:COMM ..."] [--alive "PID ..."]
            the watchdog's hang.json for a section
  rejudge   --out DIR   every comparison of OUT/sections judged again from its recorded metrics
            (today's rows and floor rule); then assemble
  assemble  --out DIR [--dry] [--wall S] [--command TEXT] [--interrupted]
            every section's result -> OUT/report.json and OUT/report.md; exit 0 when the verdict is pass

A run directory is what syncopate-worker --out writes: metrics.jsonl (one JSON object per step:
step, loss, grad_norm, tokens_per_s, wait_s, mfu with --train.peak_tflops, ...), sync.json (the
synchronization's counters) and checkpoints/<latest>/model.safetensors (the final weights when the
run had --checkpoint.every=0: its last step is always checkpointed).
"""
import argparse
import json
import math
import os
import platform
import re
import shutil
import statistics
import struct
import subprocess
import sys
import time

SCHEMA = "syncopate-gpu-check/1"

# ---------------------------------------------------------------------------------------------
# Tolerances: one row per kind of comparison. A comparison passes when every metric is within its
# row (an "expect differ" control passes when at least one is not). Bitwise equality is not asked
# for: flash-attention's backward (atomics) and NCCL's reduction order are nondeterministic on a
# GPU, and the two layouts sum the same gradients in different orders.
#
#   loss_rtol       per step, |loss_a - loss_b| <= loss_rtol * max(|loss_a|, |loss_b|), every step
#   grad_norm_rtol  the same for the logged gradient norm (before clipping)
#   param_rel_l2    final weights, ||a - b||_2 / ||a||_2 over every parameter at once
#   param_ulps_p99  final weights, the 99th percentile over every element of the distance in fp32
#                   units in the last place (ordinal distance of the bit patterns). The maximum is
#                   reported but does not decide: AdamW turns gradients that are rounding noise
#                   into O(lr) updates (the key bias's gradient is exactly zero in exact arithmetic:
#                   softmax ignores a per-query constant), and an element near zero that changes
#                   sign is ~1e9 ulps away, so the maximum is large even between correct runs
#                   (measured below: 1.8e9 for a reordering alone). p99 leaves out 1% of elements;
#                   param_rel_l2 still sees a corrupted region of any size.
#
# Measured on CPU (dry mode's micro preset, 10 steps, warmup 2, lr 2e-3; `scripts/gpu_check.sh
# --dry`): 1 replica x grad_accum 8 vs 8 replicas x 1 (a reordering of the same sums) differ by
# loss 1.3e-7, grad_norm 1.0e-7, rel_l2 1.3e-7, ulps p99 29; the learning rate scaled by 1.001
# moves them to 1.1e-4, 5.7e-5, 9.6e-5, 3.1e5, and by 1.01 to 1.1e-3, 5.8e-4, 9.6e-4, 3.1e6.
# The fp32 row sits 17-200x above the reordering and 3-600x below a 0.1% change of every update;
# a wrong result of the kind these checks hunt (a bucket reduced before its gradient was final, a
# lost or doubled slice, a stale replica) changes a whole region's update by O(1), far beyond all
# rows. Measured on the first GPU (H200, gpt2 preset, batch 8, 10 steps, lr 6e-4; session 27):
# two identical 1-GPU runs are NOT identical: fp32 loss 1.1e-5, grad_norm 6.0e-5, rel_l2 3.0e-7,
# ulps p99 270; bf16 7.1e-3, 4.7e-2, 4.2e-4, 4.3e5 (cuBLAS and SDPA's backward reduce in a
# run-dependent order, and 10 steps from initialisation at this learning rate amplify it) - above
# the fp32 grad_norm row and every bf16 row but rel_l2. So a comparison given its noise floor (two
# identical runs of the same section) is judged against each limit raised to FLOOR_FACTOR x the
# floor's value where that is larger (the report marks such limits); the floor itself is "info"
# when it exceeds a row, never a failure, and the controls (must differ) are judged against the
# same raised limits: a floor so large that it hides a 0.1% (fp32) or 2% (bf16) change of the
# learning rate fails its control, and with it the verdict. On that GPU the controls stayed
# 90-3000x above the floor (bf16 loss 0.66 vs 7.1e-3; fp32 0.037 vs 1.1e-5).
FLOOR_FACTOR = 2.0
# A floor beyond FLOOR_CAP x its row is a failure, not information: identical runs that far apart
# are a fault (a race, an uninitialised buffer), and limits raised that far would hide one. (On the
# H200 the largest was bf16 grad_norm at 9.4x; the floors are measured on one replica, no
# concurrency of ours in them, and a G-replica pair repeated is judged against them.)
FLOOR_CAP = 20.0
TOLERANCES = {
    # fp32 on both sides, same kernels, reduction order differs: 17-200x the measured reordering.
    # (On a GPU the worker's fp32 is true fp32: LibTorch leaves TF32 matmuls off.)
    "fp32": {"loss_rtol": 2e-5, "grad_norm_rtol": 2e-5, "param_rel_l2": 1e-5, "param_ulps_p99": 512},
    # bf16 autocast (fp32 weights, optimizer and gradient reduction): a weight moved by reordering
    # noise flips its bf16 rounding now and then, and a flipped input changes a product by up to one
    # bf16 ulp (2^-8 relative). Loss is an average over every token, so it moves far less than that;
    # 1e-3 leaves room for that and for 30 steps of growth. Weights: p99 within one bf16 ulp
    # (65536 fp32 ulps), rel_l2 1e-3 (a 2% change of the learning rate exceeds both).
    "bf16": {"loss_rtol": 1e-3, "grad_norm_rtol": 5e-3, "param_rel_l2": 1e-3, "param_ulps_p99": 65536},
    # A GPU's fp32 against the CPU's: other kernels (cuBLAS / MKL, SDPA's), not only another order:
    # per operation ~1e-6 relative instead of ~1e-7, so 10x the fp32 row.
    "device": {"loss_rtol": 2e-4, "grad_norm_rtol": 2e-4, "param_rel_l2": 1e-4, "param_ulps_p99": 8192},
}
TOLERANCE_NOTES = {
    "fp32": "same kernels, another reduction order (layouts, overlap, hierarchy, noise floor)",
    "bf16": "bf16 autocast, fp32 weights and reduction",
    "device": "GPU fp32 against CPU fp32 (other kernels)",
}

# Bounds of the failure section (seconds): a failing replica must end its run, non-zero, naming the
# cause, within FAIL_BOUND_S of the start (a hang is a bug); a successful run must end within
# EXIT_BOUND_S of its last metrics record (no teardown hang: NCCL communicators, threads).
FAIL_BOUND_S = {"gpu": 120.0, "dry": 30.0}
EXIT_BOUND_S = {"gpu": 20.0, "dry": 5.0}

# Peak dense TFLOP/s of one GPU by model and the precision its matmuls actually ran at, from
# NVIDIA's datasheets (figures quoted "with sparsity" halved). First match of the name wins.
# fp32: the worker's fp32 is true fp32 (LibTorch leaves TF32 off), so CUDA cores, not tensor cores.
# Any other GPU: give --peak-tflops; MFU is not reported against a guess.
PEAK_TFLOPS = [
    (r"H100.*PCIe", "H100 PCIe", {"bf16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    (r"H100.*NVL", "H100 NVL", {"bf16": 835.0, "tf32": 418.0, "fp32": 60.0}),
    (r"H100", "H100 SXM", {"bf16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    (r"H200.*NVL", "H200 NVL", {"bf16": 835.0, "tf32": 418.0, "fp32": 60.0}),
    (r"H200", "H200 SXM (H100 SXM's compute)", {"bf16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    (r"A100", "A100", {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5}),
]
# Dry mode: the worker's own MFU formula is checked against this one at a placeholder peak. It is
# not a CPU's peak and no MFU is reported against it.
DRY_PLACEHOLDER_PEAK = 1.0

# Model shapes (vocab, context, layers, heads, width): model/gpt_config.cpp's presets.
PRESETS = {"micro": (257, 64, 2, 2, 64), "tiny": (257, 128, 2, 4, 128), "small": (257, 256, 4, 8, 256),
           "gpt2": (50257, 1024, 12, 12, 768), "gpt2-medium": (50257, 1024, 24, 16, 1024)}

STATUSES = ("pass", "fail", "hang", "skipped")
CHECK_STATUSES = ("pass", "fail", "skipped", "info")


# ---------------------------------------------------------------------------------------------
# Reading runs

def read_metrics(path):
    """The step records of a metrics.jsonl (those with tokens_per_s), in order."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                m = json.loads(line)
                if "tokens_per_s" in m:
                    rows.append(m)
    return rows


# Syncopate's checkpoint weights (worker/checkpoint/checkpoint.cpp, model/hf_weights.cpp): a
# safetensors file, header `__metadata__` {"format": "pt", "syncopate.n_head", "syncopate.vocab_size"},
# float32 tensors under Hugging Face GPT-2 names (the head tied to wte, stored once). The reader
# refuses anything else by name instead of comparing garbage.
CHECKPOINT_FORMAT = {"format": "pt", "required_metadata": ("syncopate.n_head", "syncopate.vocab_size"),
                     "dtype": "F32"}


def read_safetensors(path):
    """{name: float32 numpy array} of a Syncopate checkpoint's model.safetensors (format checked)."""
    import numpy as np
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: {len(data)} bytes, not a safetensors file")
    n = struct.unpack("<Q", data[:8])[0]
    if n > len(data) - 8:
        raise ValueError(f"{path}: header of {n} bytes in a file of {len(data)}")
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    if meta.get("format") != CHECKPOINT_FORMAT["format"]:
        raise ValueError(f"{path}: __metadata__.format is {meta.get('format')!r}, expected "
                         f"{CHECKPOINT_FORMAT['format']!r} (not a Syncopate checkpoint?)")
    missing = [k for k in CHECKPOINT_FORMAT["required_metadata"] if k not in meta]
    if missing:
        raise ValueError(f"{path}: __metadata__ lacks {', '.join(missing)} (not a Syncopate checkpoint?)")
    base, body = 8 + n, len(data) - 8 - n
    out, covered = {}, 0
    for name, info in header.items():
        if info.get("dtype") != CHECKPOINT_FORMAT["dtype"]:
            raise ValueError(f"{path}: tensor {name} is {info.get('dtype')}, expected F32")
        shape = [int(d) for d in info["shape"]]
        lo, hi = (int(x) for x in info["data_offsets"])
        count = math.prod(shape)
        if not (0 <= lo <= hi <= body) or hi - lo != 4 * count:
            raise ValueError(f"{path}: tensor {name}: offsets [{lo}, {hi}) do not hold {shape} float32 "
                             f"in a body of {body} bytes")
        out[name] = np.frombuffer(data, dtype="<f4", count=count, offset=base + lo).reshape(shape)
        covered += hi - lo
    if covered != body:
        raise ValueError(f"{path}: tensors cover {covered} of the body's {body} bytes")
    return out


def final_checkpoint(run):
    """(step, directory) of a run's newest checkpoint (checkpoints/latest)."""
    root = os.path.join(run, "checkpoints")
    with open(os.path.join(root, "latest")) as f:
        name = f.read().strip()
    d = os.path.join(root, name)
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    return int(meta["step"]), d


def read_run(run):
    """(step records, final weights {name: array}, final checkpoint step) of a run directory, or of
    a job of several nodes given as their directories joined by commas: each node logs the mean loss
    of its own replicas, so the job's loss is the mean over its (equal-sized) nodes; grad_norm is
    the job's on every node and the weights are node 0's (the worker's replica-identity check,
    dist.check_every, holds the others to them)."""
    dirs = run.split(",")
    rows = read_metrics(os.path.join(dirs[0], "metrics.jsonl"))
    if len(dirs) > 1:
        others = [read_metrics(os.path.join(d, "metrics.jsonl")) for d in dirs[1:]]
        for d, o in zip(dirs[1:], others):
            if [r["step"] for r in o] != [r["step"] for r in rows]:
                raise ValueError(f"node {d} logged other steps than node {dirs[0]}")
        rows = [dict(r, loss=sum([r["loss"]] + [o[i]["loss"] for o in others]) / len(dirs)) for i, r in enumerate(rows)]
    step, d = final_checkpoint(dirs[0])
    return rows, read_safetensors(os.path.join(d, "model.safetensors")), step


# ---------------------------------------------------------------------------------------------
# Comparisons (plain functions of plain data: tests/test_gpu_check.py feeds them synthetic input)

def _rel(a, b):
    scale = max(abs(a), abs(b))
    return 0.0 if a == b else (abs(a - b) / scale if scale > 0 else math.inf)


def compare_series(a, b, rtol, key):
    """Per-step relative difference of `key` between two lists of step records (same steps)."""
    sa, sb = [r["step"] for r in a], [r["step"] for r in b]
    out = {"steps": len(a), "max_abs": 0.0, "max_rel": 0.0, "worst_step": None, "limit_rel": rtol}
    if sa != sb or not a:
        out.update(ok=False, error=f"the runs logged different steps ({len(sa)}: {sa[:3]}... vs {len(sb)}: {sb[:3]}...)")
        return out
    for ra, rb in zip(a, b):
        x, y = float(ra[key]), float(rb[key])
        if not (math.isfinite(x) and math.isfinite(y)):
            out.update(ok=False, error=f"step {ra['step']}: {key} is not finite ({x}, {y})", worst_step=ra["step"])
            return out
        r = _rel(x, y)
        if out["worst_step"] is None or r > out["max_rel"]:
            out["max_rel"], out["worst_step"] = r, ra["step"]
        out["max_abs"] = max(out["max_abs"], abs(x - y))
    out["ok"] = out["max_rel"] <= rtol
    return out


def compare_losses(a, b, tol):
    return compare_series(a, b, tol["loss_rtol"], "loss")


def compare_grad_norms(a, b, tol):
    return compare_series(a, b, tol["grad_norm_rtol"], "grad_norm")


def ulp_distance(a, b):
    """Elementwise distance of two float32 arrays in units in the last place: the difference of
    their bit patterns mapped to ordered integers (-0 and +0 are 0 apart; across zero, the ulps
    down to zero and up again). int64 array."""
    import numpy as np

    def ordinal(x):
        i = np.ascontiguousarray(x, dtype=np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(ordinal(a) - ordinal(b))


def compare_params(pa, pb, tol):
    """Final weights {name: float32 array} of two runs: global relative L2 difference and the
    distribution of ulp distances (p50, p99 decisive, max with its tensor)."""
    import numpy as np
    out = {"limit_rel_l2": tol["param_rel_l2"], "limit_ulps_p99": tol["param_ulps_p99"]}
    if sorted(pa) != sorted(pb) or any(pa[k].shape != pb[k].shape for k in pa):
        out.update(ok=False, error="the runs' weights differ in names or shapes")
        return out
    names = sorted(pa)
    a = np.concatenate([np.asarray(pa[k], dtype=np.float32).ravel() for k in names])
    b = np.concatenate([np.asarray(pb[k], dtype=np.float32).ravel() for k in names])
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        bad = [k for k in names if not (np.isfinite(pa[k]).all() and np.isfinite(pb[k]).all())]
        out.update(ok=False, error=f"non-finite weights in {', '.join(bad[:5])}")
        return out
    diff = a.astype(np.float64) - b.astype(np.float64)
    norm = float(np.linalg.norm(a.astype(np.float64)))
    u = ulp_distance(a, b)
    worst, worst_u = None, -1
    for k in names:
        m = int(ulp_distance(pa[k], pb[k]).max()) if pa[k].size else 0
        if m > worst_u:
            worst, worst_u = k, m
    out.update(
        elements=int(a.size),
        max_abs=float(np.abs(diff).max()) if a.size else 0.0,
        rel_l2=float(np.linalg.norm(diff) / norm) if norm > 0 else (0.0 if not diff.any() else math.inf),
        ulps_p50=float(np.percentile(u, 50)) if a.size else 0.0,
        ulps_p99=float(np.percentile(u, 99)) if a.size else 0.0,
        ulps_max=int(u.max()) if a.size else 0,
        ulps_max_tensor=worst,
        differing=float(np.mean(u > 0)) if a.size else 0.0)
    out["ok"] = out["rel_l2"] <= tol["param_rel_l2"] and out["ulps_p99"] <= tol["param_ulps_p99"]
    return out


FLOOR_KEYS = {"loss_rtol": "loss_max_rel", "grad_norm_rtol": "grad_norm_max_rel", "param_rel_l2": "param_rel_l2",
              "param_ulps_p99": "param_ulps_p99"}


def floor_raised(tol, floor_metrics):
    """(limits, names of those raised): each limit of the row raised to FLOOR_FACTOR x the noise
    floor's value of the same metric where that is larger (see FLOOR_FACTOR)."""
    out, raised = dict(tol), []
    for k, m in FLOOR_KEYS.items():
        v = (floor_metrics or {}).get(m)
        if isinstance(v, (int, float)) and math.isfinite(v) and FLOOR_FACTOR * v > out[k]:
            out[k] = FLOOR_FACTOR * v
            raised.append(k)
    return out, raised


def judge(metrics, tol, floor_metrics, expect, errors=False):
    """status, the limits used, those raised by the floor and those exceeded, for a comparison's
    metrics (compare_run_data's) under the row `tol`, its noise floor's metrics and `expect`."""
    lim, raised = floor_raised(tol, floor_metrics if expect != "floor" else None)
    exceeded = []
    if not errors:
        for k, name in (("loss_rtol", "loss"), ("grad_norm_rtol", "grad_norm"), ("param_rel_l2", "param_rel_l2"),
                        ("param_ulps_p99", "param_ulps_p99")):
            if metrics[FLOOR_KEYS[k]] > lim[k]:
                exceeded.append(name)
    if errors:
        status = "fail"
    elif expect == "differ":
        status = "pass" if exceeded else "fail"
    elif expect == "floor":  # two identical runs: how nondeterministic this machine is, not a verdict
        wild = [k for k in FLOOR_KEYS if metrics[FLOOR_KEYS[k]] > FLOOR_CAP * tol[k]]
        status = "fail" if wild else "info" if exceeded else "pass"
    else:
        status = "fail" if exceeded else "pass"
    out = {"status": status, "tolerance": lim, "raised_by_floor": raised, "exceeded": exceeded}
    if expect == "floor" and status == "fail" and not errors:
        out["error"] = f"identical runs differ beyond {FLOOR_CAP:g} x the row: a fault, not noise"
    return out


def compare_run_data(a, b, tol, floor=None, expect="match"):
    """The whole comparison of two runs' data: a = (step records, weights), b likewise. Returns a
    check: status pass/fail, the metrics, the limits, which limits were exceeded, and the noise
    floor's metrics (another check's) beside them, each limit raised to FLOOR_FACTOR x the floor's
    value where larger. expect="differ" (a sensitivity control) passes only when some limit is
    exceeded: a comparison that cannot fail proves nothing; expect="floor" (the floor itself) is
    "info" when it exceeds the row."""
    # (the limits, raised by the floor or not, are judge's: these only measure)
    loss = compare_losses(a[0], b[0], tol)
    gn = compare_grad_norms(a[0], b[0], tol)
    params = compare_params(a[1], b[1], tol)
    errors = [x["error"] for x in (loss, gn, params) if "error" in x]
    metrics = {"loss_max_rel": loss["max_rel"], "loss_max_abs": loss["max_abs"], "loss_worst_step": loss["worst_step"],
               "grad_norm_max_rel": gn["max_rel"],
               **{f"param_{k}": v for k, v in params.items() if k not in ("ok", "error") and not k.startswith("limit")}}
    check = {"kind": "compare", "expect": expect, "metrics": metrics, "steps": loss["steps"]}
    check.update(judge(metrics, tol, (floor or {}).get("metrics"), expect, bool(errors)))
    if errors:
        check["error"] = "; ".join(errors)
    if floor is not None:
        check["floor"] = floor
    return check


# ---------------------------------------------------------------------------------------------
# Communication, throughput and MFU

BUS_FACTOR = {"all_reduce": lambda n: 2.0 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n}


def bus_bandwidth(op, size_bytes, time_s, ranks):
    """nccl-tests' convention: algbw = S / t (S: the whole buffer), busbw = algbw x factor(op, n):
    2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter and all-gather. GB/s (1e9 bytes)."""
    alg = size_bytes / time_s / 1e9
    return alg, alg * BUS_FACTOR[op](ranks)


def parse_bench_table(text):
    """Rows of syncopate-bench-allreduce / gloo_allreduce.py: `size_bytes time_us algbw_GBps busbw_GBps`."""
    rows = []
    for line in text.splitlines():
        p = line.split()
        if len(p) == 4 and p[0].isdigit():
            rows.append({"size": int(p[0]), "time_us": float(p[1]), "algbw": float(p[2]), "busbw": float(p[3])})
    return rows


def parse_nccl_tests(text):
    """Out-of-place rows of nccl-tests (all_reduce_perf, ...): size count type redop root time algbw busbw #wrong ..."""
    rows = []
    for line in text.splitlines():
        p = line.split()
        if len(p) >= 9 and p[0].isdigit() and p[1].isdigit():
            try:
                rows.append({"size": int(p[0]), "time_us": float(p[5]), "algbw": float(p[6]), "busbw": float(p[7])})
            except ValueError:
                continue
    return rows


def check_bandwidth_rows(rows, op, ranks, rtol=0.02):
    """Each row's numbers are finite and positive and its busbw is the one its size and time give
    (within rtol: the tables round to 3 decimals). Returns the problems, empty when none."""
    problems = []
    if not rows:
        return ["no rows"]
    for r in rows:
        if not all(math.isfinite(r[k]) and r[k] > 0 for k in ("time_us", "algbw")) or r["busbw"] < 0:
            problems.append(f"size {r['size']}: non-positive or non-finite numbers {r}")
            continue
        alg, bus = bus_bandwidth(op, r["size"], r["time_us"] * 1e-6, ranks)
        if abs(bus - r["busbw"]) > rtol * max(bus, 1e-3) + 0.01:  # (tables round to 2-3 decimals)
            problems.append(f"size {r['size']}: busbw {r['busbw']} but size/time gives {bus:.3f} ({op}, {ranks} ranks)")
    return problems


def gpt_num_params(shape):
    """model/gpt_config.cpp's gpt_num_params for (vocab, context, layers, heads, width), qkv_bias on."""
    V, T, L, _, C = shape
    padded = (V + 63) // 64 * 64
    per_block = 2 * 2 * C + C * 3 * C + 3 * C + C * C + C + C * 4 * C + 4 * C + 4 * C * C + C
    return padded * C + T * C + L * per_block + 2 * C


def gpt_train_flops_per_token(shape):
    """model/gpt_config.cpp's gpt_train_flops_per_token: 6 N + 12 layers x context x width."""
    _, T, L, _, C = shape
    return 6.0 * gpt_num_params(shape) + 12.0 * L * T * C


def peak_tflops(gpu_name, precision):
    """(TFLOP/s, label) of one GPU at the precision its matmuls ran at, or (None, why)."""
    for pattern, label, table in PEAK_TFLOPS:
        if gpu_name and re.search(pattern, gpu_name, re.IGNORECASE):
            if precision in table:
                return table[precision], f"{label} {precision} dense"
            return None, f"{label}: no {precision} peak in the table"
    return None, f"no peak for GPU {gpu_name!r}: give --peak-tflops"


def mfu(tokens_per_s, flops_per_token, devices, peak):
    """Model FLOP utilisation per device: tokens/s x FLOPs/token / (devices x peak TFLOP/s)."""
    return tokens_per_s * flops_per_token / (devices * peak * 1e12)


def steady(values, skip=5):
    """The values after the first `skip` (warm-up), or the second half when there are few."""
    if len(values) > 2 * skip:
        return values[skip:]
    return values[len(values) // 2:] or values


def median_steady(values, skip=5):
    v = steady(values, skip)
    return statistics.median(v) if v else None


# ---------------------------------------------------------------------------------------------
# Sections and the report

def append_check(sec, check):
    os.makedirs(sec, exist_ok=True)
    check.setdefault("status", "info")
    if check["status"] not in CHECK_STATUSES:
        raise ValueError(f"check status {check['status']!r} not in {CHECK_STATUSES}")
    with open(os.path.join(sec, "checks.jsonl"), "a") as f:
        f.write(json.dumps(check, sort_keys=True) + "\n")
    return check


def read_checks(sec):
    p = os.path.join(sec, "checks.jsonl")
    if not os.path.exists(p):
        return []
    with open(p) as f:
        return [json.loads(line) for line in f if line.strip()]


def find_check(sec, name):
    for c in read_checks(sec):
        if c.get("name") == name:
            return c
    return None


def _read(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def section_status(sec):
    """A section directory's result: status, reason, checks, wall time, hang details. hang.json
    (the watchdog's) makes it a hang; a non-zero exit of the section or a failed check a fail; every
    check skipped (or skipped.txt) a skip; otherwise a pass."""
    name = os.path.basename(sec.rstrip("/"))
    checks = read_checks(sec)
    rc_text = _read(os.path.join(sec, "rc"))
    rc = int(rc_text) if rc_text and rc_text.strip().lstrip("-").isdigit() else None
    wall = _read(os.path.join(sec, "wall_s"))
    out = {"name": name, "checks": checks, "rc": rc, "wall_s": float(wall) if wall else None,
           "timeout_s": float(_read(os.path.join(sec, "timeout_s"), "0") or 0) or None}
    hang = _read(os.path.join(sec, "hang.json"))
    skipped = _read(os.path.join(sec, "skipped.txt"))
    failed = [c for c in checks if c["status"] == "fail"]
    if hang:
        h = json.loads(hang)
        out.update(status="hang", hang=h,
                   reason=f"no end within {h.get('timeout_s')} s: stacks of {len(h.get('processes', []))} process(es) "
                          f"by {h.get('stack_tool')} in {h.get('stacks_file')}")
    elif failed:
        out.update(status="fail", reason="; ".join(f"{c['name']}: {c.get('reason') or c.get('error') or 'out of tolerance'}"
                                                   for c in failed)[:2000])
    elif rc not in (0, None):
        tail = (_read(os.path.join(sec, "section.log"), "") or "").strip().splitlines()[-8:]
        out.update(status="fail", reason=f"the section exited {rc}: " + " | ".join(tail))
    elif rc is None and not checks and not skipped:
        out.update(status="fail", reason="the section did not run to its end (no exit status)")
    elif not checks and not skipped:
        out.update(status="fail", reason="the section recorded no check")
    elif skipped or (checks and all(c["status"] == "skipped" for c in checks)):
        out.update(status="skipped", reason=(skipped or "; ".join(f"{c['name']}: {c.get('reason', '')}" for c in checks)).strip())
    else:
        out.update(status="pass", reason="")
    return out


SECTION_ORDER = ["versions", "watchdog", "gpu_tests", "correctness", "communication", "throughput", "failure"]


def assemble(out_dir, dry, wall_s=None, command="", interrupted=False):
    """report.json and report.md from OUT/sections/*; returns the report."""
    sec_root = os.path.join(out_dir, "sections")
    names = [n for n in SECTION_ORDER if os.path.isdir(os.path.join(sec_root, n))]
    names += sorted(n for n in (os.listdir(sec_root) if os.path.isdir(sec_root) else [])
                    if n not in names and not n.startswith("_") and os.path.isdir(os.path.join(sec_root, n)))
    sections = [section_status(os.path.join(sec_root, n)) for n in names]
    versions = {}
    vp = os.path.join(sec_root, "versions", "versions.json")
    if os.path.exists(vp):
        with open(vp) as f:
            versions = json.load(f)
    bad = [s["name"] for s in sections if s["status"] in ("fail", "hang")]
    verdict = "fail" if bad or interrupted or not sections else "pass"
    counts = {st: sum(s["status"] == st for s in sections) for st in STATUSES}
    headline = ("dry run (CPU): no GPU result" if dry else f"GPU run on {versions.get('gpu_model', '?')} x {versions.get('gpu_count', '?')}")
    report = {"schema": SCHEMA, "dry": bool(dry), "gpu_result": not dry, "headline": headline, "verdict": verdict,
              "failed_sections": bad, "interrupted": bool(interrupted), "counts": counts,
              "created_unix": time.time(), "wall_s": wall_s, "command": command, "host": platform.node(),
              "versions": versions, "tolerances": TOLERANCES, "tolerance_notes": TOLERANCE_NOTES,
              "failure_bounds_s": {"fail": FAIL_BOUND_S["dry" if dry else "gpu"], "exit": EXIT_BOUND_S["dry" if dry else "gpu"]},
              "sections": sections}
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    md = render_markdown(report)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(md)
    return report


def _fmt(x, digits=3):
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if x == 0:
            return "0"
        if not math.isfinite(x):
            return str(x)
        if abs(x) >= 1e5 or abs(x) < 1e-3:
            return f"{x:.{digits - 1}e}"
        return f"{x:.{digits}g}"
    return str(x)


def _compare_row(c):
    m = c.get("metrics", {})
    f = (c.get("floor") or {}).get("metrics", {})

    def both(key, digits=2):
        v = _fmt(m.get(key), digits)
        return v + (f" ({_fmt(f.get(key), digits)})" if f else "")
    lim, up = c.get("tolerance", {}), c.get("raised_by_floor", [])

    def limit(key):  # the limit used; "f" marks one raised to FLOOR_FACTOR x the noise floor
        return _fmt(lim.get(key)) + (" f" if key in up else "")
    what = {"differ": " (control: must differ)", "floor": " (noise floor)"}.get(c.get("expect"), "")
    return (f"| {c['name']} | **{c['status']}**{what} | "
            f"{both('loss_max_rel')} / {limit('loss_rtol')} | {both('grad_norm_max_rel')} / {limit('grad_norm_rtol')} | "
            f"{both('param_rel_l2')} / {limit('param_rel_l2')} | {both('param_ulps_p50')} | "
            f"{both('param_ulps_p99')} / {limit('param_ulps_p99')} | {_fmt(m.get('param_ulps_max'))} "
            f"({m.get('param_ulps_max_tensor', '')}) | {', '.join(c.get('exceeded', [])) or '-'} | "
            f"{(c.get('error') or c.get('note') or '')} |")


def render_markdown(r):
    L = []
    dry = r["dry"]
    L.append(f"# Syncopate GPU check: {'DRY RUN (CPU): no GPU result' if dry else r['headline']}")
    L.append("")
    if dry:
        L.append("**dry run (CPU): no GPU result.** The GPUs were replaced by CPU thread replicas "
                 "(`--dist.local_replicas=N --train.device=cpu`); this report shows that the script's "
                 "comparisons, timeouts and report work, not that anything works on a GPU.")
        L.append("")
    L.append(f"**Verdict: {r['verdict'].upper()}**" + (f" (failed: {', '.join(r['failed_sections'])})" if r["failed_sections"] else "")
             + (" (interrupted)" if r.get("interrupted") else "")
             + f". Sections: " + ", ".join(f"{v} {k}" for k, v in r["counts"].items() if v)
             + (f". Wall time {r['wall_s']:.0f} s." if r.get("wall_s") else "."))
    if r.get("command"):
        L.append("")
        L.append(f"Command: `{r['command']}` on {r.get('host', '?')}")
    L.append("")
    v = r.get("versions") or {}
    if v:
        L.append("## Versions")
        L.append("")
        L.append("| driver | CUDA (torch) | NCCL (torch) | NCCL (worker links) | torch | GPU | GPUs |")
        L.append("|---|---|---|---|---|---|---|")
        L.append(f"| {v.get('driver')} | {v.get('cuda')} | {v.get('nccl')} | {v.get('worker_nccl')} | {v.get('torch')} | "
                 f"{v.get('gpu_model')} | {v.get('gpu_count')} |")
        L.append("")
    L.append("## Sections")
    L.append("")
    L.append("| section | status | wall s | timeout s | reason |")
    L.append("|---|---|---|---|---|")
    for s in r["sections"]:
        L.append(f"| {s['name']} | **{s['status']}** | {_fmt(s.get('wall_s'))} | {_fmt(s.get('timeout_s'))} | "
                 f"{(s.get('reason') or '').replace('|', '/')[:400]} |")
    L.append("")
    L.append("## Tolerances")
    L.append("")
    L.append("| row | loss rel | grad_norm rel | weights rel L2 | weights ulps p99 | for |")
    L.append("|---|---|---|---|---|---|")
    for k, t in r["tolerances"].items():
        L.append(f"| {k} | {_fmt(t['loss_rtol'])} | {_fmt(t['grad_norm_rtol'])} | {_fmt(t['param_rel_l2'])} | "
                 f"{_fmt(t['param_ulps_p99'])} | {r['tolerance_notes'].get(k, '')} |")
    L.append("")
    L.append("A comparison passes when every value is within its row; a control (must differ) passes when "
             "one is not. Values in parentheses: the noise floor, the same metric between two identical "
             f"runs; a limit marked f is raised to {FLOOR_FACTOR:g} x that floor (the machine's own run-to-run "
             "nondeterminism exceeds the row); a noise floor beyond its row is shown as info. ulps: distance of fp32 bit patterns; p99 decides, the maximum is shown (with its tensor) "
             f"but AdamW makes it large between correct runs. Failure bounds: a failing replica ends its run within "
             f"{r['failure_bounds_s']['fail']:g} s, a successful run exits within {r['failure_bounds_s']['exit']:g} s of its last step.")
    L.append("")
    for s in r["sections"]:
        if s["name"] == "versions":
            continue
        L.append(f"## {s['name']}: {s['status']}")
        L.append("")
        if s.get("reason"):
            L.append(f"{s['reason']}")
            L.append("")
        if s.get("hang"):
            h = s["hang"]
            L.append(f"Hang: stacks by `{h.get('stack_tool')}` of {len(h.get('processes', []))} process(es) in "
                     f"`{h.get('stacks_file')}`; first lines:")
            L.append("")
            L.append("```")
            L.extend((h.get("excerpt") or "").splitlines()[:25])
            L.append("```")
            L.append("")
        comps = [c for c in s["checks"] if c.get("kind") == "compare"]
        if comps:
            L.append("| comparison | status | loss max rel / limit | grad_norm max rel / limit | weights rel L2 / limit "
                     "| ulps p50 | ulps p99 / limit | ulps max (tensor) | exceeded | note |")
            L.append("|---|---|---|---|---|---|---|---|---|---|")
            L.extend(_compare_row(c) for c in comps)
            L.append("")
        comm = [c for c in s["checks"] if c.get("kind") == "comm"]
        if comm:
            L.append("| implementation | op | ranks | size bytes | time us | algbw GB/s | busbw GB/s | status |")
            L.append("|---|---|---|---|---|---|---|---|")
            for c in comm:
                if not c.get("rows"):
                    L.append(f"| {c.get('impl')} | {c.get('op')} | {c.get('ranks')} | - | - | - | - | "
                             f"{c['status']}: {c.get('reason', '')} |")
                for row in c.get("rows", []):
                    L.append(f"| {c['impl']} | {c['op']} | {c['ranks']} | {row['size']} | {_fmt(row['time_us'])} | "
                             f"{_fmt(row['algbw'])} | {_fmt(row['busbw'])} | {c['status']} |")
            L.append("")
        tp = [c for c in s["checks"] if c.get("kind") == "throughput"]
        if tp:
            L.append("| run | kind | devices | precision | tokens/s | MFU per device | peak | scaling eff. | wait_s median | "
                     "buckets during backward | status | note |")
            L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for c in tp:
                L.append(f"| {c['name']} | {c.get('run_kind')} | {c.get('devices')} | {c.get('precision')} | "
                         f"{_fmt(c.get('tokens_per_s'), 4)} | {_fmt(c.get('mfu'))} | {c.get('peak_label') or 'n/a'} | "
                         f"{_fmt(c.get('scaling_efficiency'))} | {_fmt(c.get('wait_s'))} | {c.get('overlap') or '-'} | "
                         f"{c['status']} | {c.get('note', '')} |")
            L.append("")
            ratios = []
            for c in tp:
                if c.get("run_kind") == "worker" and c.get("tokens_per_s"):
                    d = [x for x in tp if x.get("run_kind") == "ddp" and x.get("devices") == c["devices"] and x.get("tokens_per_s")]
                    if d:
                        ratios.append(f"{c['name']}: {c['tokens_per_s'] / d[0]['tokens_per_s']:.2f}")
            if ratios:
                L.append("Syncopate / PyTorch DDP tokens/s at the same device count: " + "; ".join(ratios) + ".")
                L.append("")
        other = [c for c in s["checks"] if c.get("kind") not in ("compare", "comm", "throughput")]
        if other:
            L.append("| check | status | detail |")
            L.append("|---|---|---|")
            for c in other:
                nums = c.get("numbers") or {}
                detail = c.get("reason") or c.get("note") or ""
                if nums:
                    detail += (" " if detail else "") + ", ".join(f"{k}={_fmt(v) if not isinstance(v, str) else v}"
                                                                 for k, v in nums.items())
                L.append(f"| {c['name']} | **{c['status']}** | {detail.replace('|', '/')[:600]} |")
            L.append("")
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------------------------------------
# Command line

def cmd_versions(a):
    v = {"dry": a.dry}
    try:
        import torch
        v["torch"] = torch.__version__
        built_cuda = torch.version.cuda
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() or a.dry else None
        except Exception as e:  # noqa: BLE001 (a build without NCCL)
            nccl = f"none ({type(e).__name__})"
        visible = torch.cuda.is_available()
        if a.dry:
            v["cuda"] = f"none (dry run; torch built with CUDA {built_cuda})" if built_cuda else "none (dry run)"
            v["nccl"] = f"none (dry run; torch built with NCCL {nccl})" if nccl else "none (dry run)"
            v["gpu_model"], v["gpu_count"], v["gpus"] = "none (dry run)", 0, []
        else:
            v["cuda"] = built_cuda
            v["nccl"] = nccl
            v["gpu_count"] = torch.cuda.device_count() if visible else 0
            v["gpus"] = [{"name": torch.cuda.get_device_name(i),
                          "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
                          "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
                         for i in range(v["gpu_count"])]
            v["gpu_model"] = v["gpus"][0]["name"] if v["gpus"] else "none"
    except Exception as e:  # noqa: BLE001
        v["torch"] = f"not importable: {e}"
    smi = shutil.which("nvidia-smi")
    if a.dry or not smi:
        v["driver"] = "none (dry run)" if a.dry else "none (no nvidia-smi)"
    else:
        try:
            p = subprocess.run([smi, "--query-gpu=driver_version,name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=60)
            v["driver"] = p.stdout.strip().splitlines()[0].split(",")[0].strip() if p.returncode == 0 and p.stdout.strip() else \
                f"unknown (nvidia-smi exited {p.returncode})"
            v["nvidia_smi"] = p.stdout.strip()
        except (subprocess.TimeoutExpired, OSError) as e:
            v["driver"] = f"unknown (nvidia-smi: {e})"
    v["worker_nccl"] = "none"
    if a.worker and shutil.which("ldd"):
        try:
            p = subprocess.run(["ldd", a.worker], capture_output=True, text=True, timeout=60)
            for line in p.stdout.splitlines():
                if "libnccl" in line and "=>" in line:
                    path = line.split("=>")[1].split("(")[0].strip()
                    real = os.path.realpath(path)
                    v["worker_nccl"] = os.path.basename(real) + ("" if not a.dry else " (linked; unused in a dry run)")
        except (subprocess.TimeoutExpired, OSError):
            pass
    v["python"] = platform.python_version()
    v["host"] = platform.node()
    v["cpus"] = os.cpu_count()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(v, f, indent=1, sort_keys=True)
    for k in ("driver", "cuda", "nccl", "worker_nccl", "torch", "gpu_model", "gpu_count"):
        print(f"  {k:12s} {v.get(k)}")
    return 0


def cmd_compare(a):
    tol = TOLERANCES[a.tol]
    floor = None
    if a.floor:
        f = find_check(a.sec, a.floor)
        floor = {"name": a.floor, "metrics": f.get("metrics", {})} if f else {"name": a.floor, "metrics": {},
                                                                                "missing": True}
    try:
        ra, pa, sa = read_run(a.a)
        rb, pb, sb = read_run(a.b)
    except (OSError, ValueError, KeyError) as e:
        check = {"kind": "compare", "status": "fail", "error": f"cannot read the runs: {e}", "tolerance": dict(tol),
                 "metrics": {}, "exceeded": [], "expect": a.expect}
    else:
        check = compare_run_data((ra, pa), (rb, pb), tol, floor, a.expect)
        if sa != sb:
            check.update(status="fail", error=f"final checkpoints at different steps ({sa}, {sb})")
    check.update(name=a.name, tol_row=a.tol, a=a.a, b=a.b)
    if a.note:
        check["note"] = a.note
    append_check(a.sec, check)
    m = check.get("metrics", {})
    print(f"  {a.name}: {check['status']} (loss {_fmt(m.get('loss_max_rel'))}, grad_norm {_fmt(m.get('grad_norm_max_rel'))}, "
          f"rel_l2 {_fmt(m.get('param_rel_l2'))}, ulps p99 {_fmt(m.get('param_ulps_p99'))}"
          f"{'; exceeded ' + ','.join(check['exceeded']) if check.get('exceeded') else ''}"
          f"{'; ' + check['error'] if check.get('error') else ''})")
    return 0


def cmd_record(a):
    c = {"kind": "record", "name": a.name, "status": a.status}
    if a.reason:
        c["reason"] = a.reason
    if a.numbers:
        c["numbers"] = json.loads(a.numbers)
    append_check(a.sec, c)
    print(f"  {a.name}: {a.status}{' (' + a.reason + ')' if a.reason else ''}")
    return 0


def cmd_comm(a):
    c = {"kind": "comm", "name": a.name, "impl": a.impl, "op": a.op, "ranks": a.ranks}
    text = _read(a.table, "") if a.table else ""
    if a.format == "json":
        try:
            rows = [r for r in json.loads(text or "[]") if r.get("op") == a.op]
        except ValueError:
            rows = []
    elif a.format == "nccl-tests":
        rows = parse_nccl_tests(text)
    else:
        rows = parse_bench_table(text)
    rows = [{k: r[k] for k in ("size", "time_us", "algbw", "busbw")} for r in rows]
    problems = check_bandwidth_rows(rows, a.op, a.ranks)
    c["rows"] = rows
    c["status"] = "fail" if problems else "info"
    if problems:
        c["reason"] = "; ".join(problems)
    append_check(a.sec, c)
    for r in rows:
        print(f"  {a.impl:36s} {a.op:15s} {r['size']:>12d} B  {r['time_us']:>10.1f} us  busbw {r['busbw']:.3f} GB/s")
    if problems:
        print(f"  {a.impl} {a.op}: {'; '.join(problems)}")
    return 0


def allreduce_from_wait(one_rows, many_rows, ranks, nbytes):
    """The project's all-reduce of the whole gradient as it runs in training, derived from two runs
    of the same model: G replicas with dist.overlap=false (after backward the step waits for one
    all-reduce of the flat gradient, then clips and updates) and 1 replica (clips and updates
    only). time = median wait_s(G) - median wait_s(1); a row like the benchmarks' (None if the
    difference is not positive)."""
    w1 = median_steady([r["wait_s"] for r in one_rows])
    wg = median_steady([r["wait_s"] for r in many_rows])
    if w1 is None or wg is None or wg - w1 <= 0:
        return None, {"wait_1": w1, "wait_g": wg}
    t = wg - w1
    alg, bus = bus_bandwidth("all_reduce", nbytes, t, ranks)
    return {"size": nbytes, "time_us": t * 1e6, "algbw": alg, "busbw": bus}, {"wait_1": w1, "wait_g": wg}


def cmd_comm_from_wait(a):
    nbytes = 4 * gpt_num_params(PRESETS[a.preset])
    c = {"kind": "comm", "name": a.name, "impl": "syncopate in training (wait_s(G, overlap off) - wait_s(1))",
         "op": "all_reduce", "ranks": a.ranks}
    try:
        row, waits = allreduce_from_wait(read_metrics(a.one), read_metrics(a.many), a.ranks, nbytes)
    except (OSError, ValueError, KeyError) as e:
        row, waits = None, {"error": str(e)}
    c["waits"] = waits
    if row is None:
        c.update(rows=[], status="fail", reason=f"no positive all-reduce time from the runs' wait_s ({waits})")
    else:
        c.update(rows=[row], status="info")
    append_check(a.sec, c)
    print(f"  {c['impl']}: " + (f"{row['size']} B in {row['time_us']:.1f} us, busbw {row['busbw']:.3f} GB/s" if row else c["reason"]))
    return 0


def cmd_throughput(a):
    c = {"kind": "throughput", "name": a.name, "run_kind": a.kind, "devices": a.devices, "precision": a.precision}
    shape = PRESETS[a.preset]
    fpt = gpt_train_flops_per_token(shape)
    try:
        if a.kind == "worker":
            rows = read_metrics(a.metrics)
            tok = median_steady([r["tokens_per_s"] for r in rows])
            c["wait_s"] = median_steady([r["wait_s"] for r in rows])
            worker_mfu = median_steady([r["mfu"] for r in rows]) if rows and "mfu" in rows[-1] else None
            c["steps"] = len(rows)
        else:  # ddp: ref_gpt_train.py's lines {"step", "dt", "tokens"} (rank 0)
            lines = [json.loads(l) for l in (_read(a.metrics, "") or "").splitlines() if l.startswith("{")]
            tok = median_steady([r["tokens"] / r["dt"] for r in lines])
            worker_mfu = None
            c["steps"] = len(lines)
        if tok is None:
            raise ValueError("no step records")
    except (OSError, ValueError, KeyError) as e:
        c.update(status="fail", reason=f"cannot read {a.metrics}: {e}")
        append_check(a.sec, c)
        print(f"  {a.name}: fail ({c['reason']})")
        return 0
    c["tokens_per_s"] = tok
    c["flops_per_token"] = fpt
    peak, label = (a.peak_tflops, "given by --peak-tflops") if a.peak_tflops else peak_tflops(a.gpu or "", a.precision)
    notes = []
    if a.placeholder:
        peak, label = None, None
        notes.append("MFU n/a: dry run")
    # The worker logged mfu (--train.peak_tflops) against the same peak (dry: a placeholder):
    # its formula (model/gpt_config.cpp) and this file's must agree.
    formula_peak = DRY_PLACEHOLDER_PEAK if a.placeholder else peak
    if worker_mfu is not None and formula_peak:
        ours = mfu(tok, fpt, a.devices, formula_peak)
        agree = abs(ours - worker_mfu) <= 0.01 * max(abs(worker_mfu), 1e-12)
        c["mfu_formula_check"] = {"worker": worker_mfu, "report": ours, "agree": agree, "peak_tflops": formula_peak}
        notes.append(f"the worker's MFU formula {'agrees' if agree else 'DISAGREES'} with the report's"
                     + (" (at a placeholder peak, not a CPU's)" if a.placeholder else ""))
        if not agree:
            c["status"] = "fail"
            c["reason"] = f"worker mfu {worker_mfu} vs report {ours} at {formula_peak} TFLOP/s"
    if a.placeholder:
        pass
    elif peak:
        c["mfu"] = mfu(tok, fpt, a.devices, peak)
        c["peak_tflops"], c["peak_label"] = peak, f"{peak:g} ({label})"
    else:
        c["peak_label"] = None
        notes.append(f"MFU n/a: {label}")
    if a.sync and os.path.exists(a.sync):
        with open(a.sync) as f:
            s = json.load(f)
        if s.get("reduced"):
            c["overlap"] = f"{s.get('launched_early')}/{s.get('reduced')} of {s.get('regions')} regions"
        c["sync"] = s
    if a.baseline:
        b = find_check(a.sec, a.baseline)
        if b and b.get("tokens_per_s"):
            c["scaling_efficiency"] = tok / (a.devices / b["devices"] * b["tokens_per_s"])
            c["scaling_baseline"] = a.baseline
    if a.note:
        notes.append(a.note)
    c["note"] = "; ".join(notes)
    c.setdefault("status", "info")
    append_check(a.sec, c)
    print(f"  {a.name}: {tok:.0f} tokens/s on {a.devices} device(s)"
          f"{', MFU %.3f' % c['mfu'] if 'mfu' in c else ''}"
          f"{', scaling efficiency %.2f' % c['scaling_efficiency'] if 'scaling_efficiency' in c else ''}"
          f"{', wait_s %.4f' % c['wait_s'] if c.get('wait_s') is not None else ''}")
    return 0


def cmd_expect_exit(a):
    log = _read(a.log, "") or ""
    c = {"kind": "failure", "name": a.name,
         "numbers": {"rc": a.rc, "wall_s": round(a.wall, 2), "bound_s": a.bound}}
    problems = []
    if a.clean:
        if a.rc != 0:
            problems.append(f"exited {a.rc}, expected 0")
        if a.metrics:
            rows = read_metrics(a.metrics) if os.path.exists(a.metrics) else []
            if rows and a.end_unix:
                tail = a.end_unix - rows[-1]["unix_s"]
                c["numbers"]["exit_after_last_step_s"] = round(tail, 2)
                c["numbers"]["exit_bound_s"] = a.exit_bound
                if tail > a.exit_bound:
                    problems.append(f"exited {tail:.1f} s after its last step (bound {a.exit_bound:g} s)")
            elif not rows:
                problems.append("no step records")
    else:
        if a.rc == 0:
            problems.append("exited 0: the failure was not noticed")
        elif a.rc in (124, 137) or a.rc > 128:
            problems.append(f"exit status {a.rc}: killed (by the bound's timeout or a signal), not a clean error exit")
        if a.cause and a.cause not in log:
            problems.append(f"its log does not name the cause ('{a.cause}')")
    if a.wall > a.bound:
        problems.append(f"took {a.wall:.1f} s (bound {a.bound:g} s)")
    c["status"] = "fail" if problems else "pass"
    if problems:
        c["reason"] = "; ".join(problems) + " | log: " + " / ".join(log.strip().splitlines()[-3:])
    else:
        c["reason"] = ("exited 0" if a.clean else f"exited {a.rc} naming '{a.cause}'") + f" in {a.wall:.1f} s"
    if a.note:
        c["reason"] += f" ({a.note})"
    append_check(a.sec, c)
    print(f"  {a.name}: {c['status']} ({c['reason']})")
    return 0


def cmd_watchdog(a):
    h = _read(os.path.join(a.probe, "hang.json"))
    c = {"kind": "watchdog", "name": "a hung section is detected, its stacks dumped, its processes ended"}
    if not h:
        c.update(status="fail", reason="the probe section was not marked hang")
    else:
        h = json.loads(h)
        stacks = _read(h.get("stacks_file") or "", "") or ""
        # gdb / eu-stack frames (#N), kernel frames ([<...>]), or /proc's per-task wchan lines
        frames = len(re.findall(r"^(\s*#\d+|\s*\[<|Thread |task \d+ )", stacks, re.MULTILINE))
        alive = h.get("alive_after_kill", [])
        problems = []
        if not h.get("processes"):
            problems.append("no process was found in the hung section")
        if frames == 0:
            problems.append(f"the stacks file holds no frames ({h.get('stack_tool')})")
        if alive:
            problems.append(f"processes still alive after the kill: {alive}")
        c["numbers"] = {"stack_tool": h.get("stack_tool"), "processes": len(h.get("processes", [])), "frames": frames,
                        "timeout_s": h.get("timeout_s")}
        c.update(status="fail" if problems else "pass", reason="; ".join(problems) or
                 f"hung probe (syncopate-worker training without end) marked hang after {h.get('timeout_s')} s; "
                 f"{frames} frame lines from {len(h.get('processes', []))} process(es) by {h.get('stack_tool')}; group ended")
    append_check(a.sec, c)
    print(f"  watchdog self-test: {c['status']} ({c['reason']})")
    return 0


def write_hang(sec, timeout_s, tool, procs, alive, stacks_file):
    """The watchdog's record of a hung section (hang.json): what it found, the tool that took the
    stacks, whether anything survived the kill, and the stacks' first frames for the report."""
    stacks = _read(stacks_file, "") or ""
    lines = stacks.splitlines()
    # the excerpt: each process's header and its first frames
    excerpt, per = [], 0
    noise = ("[New LWP", "[Thread debugging", "Using host libthread_db", "warning:", "[Inferior", "Download",
             "Undefined command", "To enable", "To completely", "line to your", "For more information", "\t",
             "\"Auto-loading")
    for line in lines:
        if not line.strip() or line.startswith(noise) or re.match(r"\d+\t", line):
            continue
        if line.startswith("====="):
            per = 0
        if per < 12:
            excerpt.append(line[:200])
        per += 1
    h = {"timeout_s": timeout_s, "stack_tool": tool, "stacks_file": stacks_file,
         "processes": [p for p in procs.split() if p], "alive_after_kill": [p for p in alive.split() if p],
         "stack_lines": len(lines), "excerpt": "\n".join(excerpt[:80])}
    with open(os.path.join(sec, "hang.json"), "w") as f:
        json.dump(h, f, indent=1)
    return h


def cmd_hang(a):
    h = write_hang(a.sec, a.timeout, a.tool, a.procs, a.alive, a.stacks)
    print(f"  hang recorded: {len(h['processes'])} process(es), stacks by {h['stack_tool']} "
          f"({h['stack_lines']} lines) in {h['stacks_file']}"
          f"{'; STILL ALIVE: ' + ' '.join(h['alive_after_kill']) if h['alive_after_kill'] else ''}")
    return 0


def rejudge_sections(out):
    """Every comparison of OUT/sections judged again from its recorded metrics under today's rows
    and floor rule (judge): the same numbers, today's verdicts. A check named "noise floor..."
    recorded before floors were marked (expect match) is judged as a floor. Returns the number of
    comparisons whose status changed."""
    changed = 0
    root = os.path.join(out, "sections")
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        sec = os.path.join(root, name)
        checks = read_checks(sec)
        if not any(c.get("kind") == "compare" for c in checks):
            continue
        for c in checks:
            if c.get("kind") != "compare" or c.get("tol_row") not in TOLERANCES or not c.get("metrics"):
                continue
            if c.get("name", "").startswith("noise floor") and c.get("expect") == "match":
                c["expect"] = "floor"
            before = c.get("status")
            c.update(judge(c["metrics"], TOLERANCES[c["tol_row"]], (c.get("floor") or {}).get("metrics"),
                           c.get("expect", "match"), bool(c.get("error"))))
            changed += c["status"] != before
        with open(os.path.join(sec, "checks.jsonl"), "w") as f:
            for c in checks:
                f.write(json.dumps(c, sort_keys=True) + "\n")
    return changed


def cmd_rejudge(a):
    n = rejudge_sections(a.out)
    print(f"rejudged {a.out}: {n} comparison(s) changed status (scripts/gpu_check_report.py assemble --out {a.out} writes the report)")
    return 0


def cmd_assemble(a):
    r = assemble(a.out, a.dry, a.wall, a.command, a.interrupted)
    print(_read(os.path.join(a.out, "report.md"), ""))
    print(f"report: {os.path.join(a.out, 'report.md')} and report.json; verdict {r['verdict']}")
    return 0 if r["verdict"] == "pass" else 1


def main(argv=None):
    ap = argparse.ArgumentParser(prog="gpu_check_report.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter, usage=argparse.SUPPRESS)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("versions")
    p.add_argument("--out", required=True)
    p.add_argument("--dry", action="store_true")
    p.add_argument("--worker")
    p = sub.add_parser("compare")
    for k in ("--sec", "--name", "--a", "--b"):
        p.add_argument(k, required=True)
    p.add_argument("--tol", required=True, choices=sorted(TOLERANCES))
    p.add_argument("--floor")
    p.add_argument("--expect", default="match", choices=["match", "differ", "floor"])
    p.add_argument("--note")
    p = sub.add_parser("record")
    p.add_argument("--sec", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--status", required=True, choices=CHECK_STATUSES)
    p.add_argument("--reason")
    p.add_argument("--numbers")
    p = sub.add_parser("comm")
    for k in ("--sec", "--name", "--impl", "--op"):
        p.add_argument(k, required=True)
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--table")
    p.add_argument("--format", default="bench", choices=["bench", "json", "nccl-tests"])
    p = sub.add_parser("comm-from-wait")
    for k in ("--sec", "--name", "--one", "--many", "--preset"):
        p.add_argument(k, required=True)
    p.add_argument("--ranks", type=int, required=True)
    p = sub.add_parser("throughput")
    for k in ("--sec", "--name", "--metrics", "--preset", "--precision"):
        p.add_argument(k, required=True)
    p.add_argument("--kind", required=True, choices=["worker", "ddp"])
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--gpu")
    p.add_argument("--peak-tflops", type=float)
    p.add_argument("--placeholder", action="store_true")
    p.add_argument("--sync")
    p.add_argument("--baseline")
    p.add_argument("--note")
    p = sub.add_parser("expect-exit")
    for k in ("--sec", "--name", "--log"):
        p.add_argument(k, required=True)
    p.add_argument("--rc", type=int, required=True)
    p.add_argument("--wall", type=float, required=True)
    p.add_argument("--bound", type=float, required=True)
    p.add_argument("--cause")
    p.add_argument("--clean", action="store_true")
    p.add_argument("--metrics")
    p.add_argument("--end-unix", type=float)
    p.add_argument("--exit-bound", type=float, default=10.0)
    p.add_argument("--note")
    p = sub.add_parser("watchdog")
    p.add_argument("--sec", required=True)
    p.add_argument("--probe", required=True)
    p = sub.add_parser("hang")
    p.add_argument("--sec", required=True)
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--tool", required=True)
    p.add_argument("--procs", default="")
    p.add_argument("--alive", default="")
    p.add_argument("--stacks", required=True)
    p = sub.add_parser("rejudge")
    p.add_argument("--out", required=True)
    p = sub.add_parser("assemble")
    p.add_argument("--out", required=True)
    p.add_argument("--dry", action="store_true")
    p.add_argument("--wall", type=float)
    p.add_argument("--command", default="")
    p.add_argument("--interrupted", action="store_true")
    a = ap.parse_args(argv)
    return {"versions": cmd_versions, "compare": cmd_compare, "record": cmd_record, "comm": cmd_comm, "comm-from-wait": cmd_comm_from_wait,
            "throughput": cmd_throughput, "expect-exit": cmd_expect_exit, "watchdog": cmd_watchdog,
            "rejudge": cmd_rejudge,
            "hang": cmd_hang, "assemble": cmd_assemble}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
