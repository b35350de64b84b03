"""The study driver shared by ab_sync_async.py and staleness_sweep.py (docs/STUDY.md, "Method"):
every configuration runs on the same emulated cluster (a scenario, or raw knobs) under one budget,
equal tokens (--token-budget, or --steps) or equal wall time (--time-budget-s: a short calibration
run per configuration measures each node's step time and every node's schedule is fitted to end at
the budget); its learning rate is tuned on seeds disjoint from the headline seeds with a grid that
extends itself past an edge pick; every run is scored on one held-out set (the same windows for
every seed and configuration, asked at the same global token counts, on the weights the job would
ship; the report states the points each configuration's records show);
targets are declared before the runs; the report concludes only from paired comparisons over seeds,
Holm-corrected, and claims equivalence only by TOST with a declared margin. Writes
OUT/summary.json, OUT/report.md and plots, and keeps every run under OUT/runs/."""
import argparse
import json
import os
import subprocess
import sys
import time

import cost
import method
import scenario as scen
from cluster_runs import (CPU_LIMIT, OVERRUN_LIMIT, PRESETS, ROOT, STUDY_DEFAULTS, TIME_SCHEDULE_CAP, TRAINER_FLAGS,
                          calibrate, read_jsonl, run_lock, run_once, server_stats, sim_latency_us, summarize, sync_every)
from method import BadInput, time_to_target  # noqa: F401  (time_to_target: validate_sim, crossover)
from stats import fmt_ci, mean_ci95
from plotting import pyplot


def add_args(ap, out_default):
    ap.add_argument("--scenario", help="a TOML scenario (experiments/scenarios/); raw knobs below override it")
    ap.add_argument("--nodes", type=int, help="emulated nodes (default: the scenario's, else 4)")
    ap.add_argument("--steps", type=int, default=60,
                    help="optimizer steps per node: the token budget (nodes x batch x block x steps) when neither "
                    "--token-budget nor --time-budget-s is given")
    ap.add_argument("--token-budget", type=float,
                    help="equal token budget: every run's train.steps such that the job's total tokens equal this "
                    "(its schedule ends there)")
    ap.add_argument("--time-budget-s", type=float,
                    help="equal wall-time budget, emulated seconds: a calibration run per configuration measures each "
                    "node's step time (communication included); each node's steps = budget / its step time")
    ap.add_argument("--calibration-steps", type=int, default=20, help="steps of each --time-budget-s calibration run")
    ap.add_argument("--schedule-by", choices=("steps", "time"), default="steps",
                    help="with --time-budget-s: steps = each run's schedule spans the steps its calibration run says "
                         "fit the budget (it ends past the budget where the step times do not hold, e.g. heavy-tailed "
                         "jitter); time = --backend sim only: the schedule runs by the simulated clock and ends at the "
                         "budget in every run, the shipped weights scored there (syncopate-sim's sim.time_schedule)")
    ap.add_argument("--evals", type=int, default=10,
                    help="evaluation points per run, asked at the same global token counts in every configuration "
                    "(node 0's count; asynchronous modes land elsewhere: the report states the points observed)")
    ap.add_argument("--seeds", type=int, default=3, help="headline seeds 0..N-1 (weights, data order, jitter)")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="the first headline seed (seeds FIRST..FIRST+N-1): a reference study on seeds of its own")
    ap.add_argument("--tuning-seeds", default="1000",
                    help="seeds the learning rates are tuned on (disjoint from the headline seeds)")
    ap.add_argument("--lr-grid", default="0.5,1,2", help="learning-rate multipliers tried per configuration")
    ap.add_argument("--tune", action=argparse.BooleanOptionalAction, default=True,
                    help="--no-tune: every configuration at --base-lr (smoke runs only; the report says NOT tuned)")
    ap.add_argument("--lrs-from", metavar="DIR",
                    help="each configuration's learning rate (and local SGD's outer lr) from another study's tuning "
                    "(DIR/summary.json, tuned on seeds disjoint from this study's headline seeds); nothing is tuned here "
                    "and the report says where the rates came from")
    ap.add_argument("--lr-extend", type=int, default=3,
                    help="times the grid may extend past an edge pick (by --lr-extend-factor); 0: never (then a grid "
                    "of one value is refused)")
    ap.add_argument("--lr-extend-factor", type=float, default=2.0, help="the factor an extension steps by")
    ap.add_argument("--outer-lr-grid", default="0.5,1,2",
                    help="multipliers of a local-SGD configuration's own outer lr, tuned after its inner lr")
    ap.add_argument("--base-lr", type=float, default=2e-3, help="the learning rate the grid multiplies")
    ap.add_argument("--warmup-frac", type=float, default=STUDY_DEFAULTS["warmup_frac"],
                    help="warmup as a fraction of each run's steps (0: --warmup steps)")
    ap.add_argument("--warmup", type=int, default=5, help="warmup steps when --warmup-frac is 0")
    ap.add_argument("--val-windows", type=int, default=STUDY_DEFAULTS["val_windows"],
                    help="held-out windows per evaluation, the same set for every seed and configuration "
                    "(512 x block 128 = 65,536 tokens)")
    ap.add_argument("--defer", action=argparse.BooleanOptionalAction, default=STUDY_DEFAULTS["defer"],
                    help="evaluate snapshots of the shipped weights after training (no node time)")
    ap.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=STUDY_DEFAULTS["overlap"],
                    help="every mode with its communication overlapped with the modelled backward")
    ap.add_argument("--targets", help="target validation losses declared before the runs, e.g. 3.2,2.9,2.7 "
                    "(early, middle, late); each below the initial loss")
    ap.add_argument("--targets-from", help="DIR[:CONFIG]: targets from a separate reference study's summary.json "
                    "(CONFIG's median loss at 1/4, 1/2 and all of its token budget)")
    ap.add_argument("--equivalence-margin", type=float,
                    help="nats: claim 'equivalent' where two one-sided tests put the paired difference within +-margin")
    ap.add_argument("--baseline", help="the configuration every other is compared with (default: the first)")
    ap.add_argument("--compare", help="further pairs the report compares, A:B,C:D")
    ap.add_argument("--preset", help="model preset (default: the scenario's, else tiny)")
    ap.add_argument("--batch", type=int, help="sequences per node per step (default: the scenario's, else 8)")
    ap.add_argument("--servers", type=int, help="parameter-server shards (default: one per node)")
    ap.add_argument("--scaled-sizes", action=argparse.BooleanOptionalAction, default=True,
                    help="with a scenario: scale the ps partitions, ring segments and buckets by the bytes ratio the "
                    "link is scaled by, so the emulation sends as many messages per step as the target would "
                    "(--no-scaled-sizes: the trainer's defaults, sized for the target, not the small model)")
    ap.add_argument("--step-time", type=float, help="modelled compute seconds per step (0: unpaced)")
    ap.add_argument("--slow-node", type=int, help="the straggler's index (-1: none)")
    ap.add_argument("--slowdown", type=float, help="the straggler's factor on the modelled time")
    ap.add_argument("--jitter", type=float, help="mean exponential extra time per step, fraction of the step time")
    ap.add_argument("--jitter-tail", type=float, help="0: exponential jitter; > 1: heavy-tailed (Lomax of this shape, "
                    "the same mean --jitter; 1.5: infinite variance)")
    ap.add_argument("--netns", action="store_true", help="each node in its own network namespace (root)")
    ap.add_argument("--link-gbit", type=float, help="the emulated link rate with --netns, Gbit/s")
    ap.add_argument("--configs", help="comma-separated subset of the configurations")
    ap.add_argument("--make-only", metavar="CONFIGS",
                    help="a lane of a study split across processes: calibrate every configuration of --configs (the "
                    "budget's step counts and the evaluation spacing depend on all of them), then make only these "
                    "configurations' tuning and headline runs and stop without a summary; a later invocation without "
                    "it takes every run back (--resume) and writes the study. Lanes sharing OUT never make one run "
                    "twice at once (run_once locks each run's directory)")
    ap.add_argument("--tensorboard", action="store_true", help="also export every run to OUT/tensorboard/")
    ap.add_argument("--no-trace", action="store_true",
                    help="record no timelines (by default seed 0 of each configuration writes OUT/runs/.../trace.json)")
    ap.add_argument("--max-overrun", type=float, default=OVERRUN_LIMIT,
                    help="a run with a larger share of steps over their modelled time is invalid")
    ap.add_argument("--max-cpu", type=float, default=CPU_LIMIT,
                    help="a run whose host CPU use averaged above this is invalid")
    ap.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=True,
                    help="measure one step's real compute first and lengthen the modelled step if needed")
    ap.add_argument("--backend", choices=["emulated", "sim"], default="emulated",
                    help="emulated: processes on this machine (scripts/local_cluster.sh); sim: syncopate-sim's virtual "
                    "time (any node count; validated against the emulation in docs/STUDY.md)")
    ap.add_argument("--resume", action=argparse.BooleanOptionalAction, default=None,
                    help="take a run back (OUT/runs/.../run.json; its figures read again from its files) instead of "
                    "making it again when the same command line and inputs (binaries, libtorch, data; for emulated runs "
                    "the launch scripts) made it; default: on for --backend sim (deterministic: the "
                    "same result either way), off for emulated runs (each run a new measurement)")
    ap.add_argument("--latency-us", type=float, help="sim: the emulated links' own one-way latency, microseconds "
                    "(default 50); --latency-ms and a scenario's latency come on top")
    ap.add_argument("--latency-ms", type=float, help="modelled one-way propagation latency added to every message, "
                    "emulated ms (default: the scenario's target latency x its time dilation, less the emulated links' own ~0.05 ms; else 0); the emulation "
                    "holds each message this long (scripts/local_cluster.sh --latency-ms), the simulator adds it")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the plan (every run: configuration, lr multiplier, seed, steps) and its estimated "
                    "cost, then exit: starts no process, writes nothing")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", out_default))


def emulation(a):
    """The emulation from the scenario and the raw knobs (raw knobs win), and a description."""
    em = {"step_time_s": 0.3, "slow_node": -1, "slowdown": 1.0, "jitter": 0.0, "jitter_tail": 0.0, "link_gbit": None, "latency_ms": 0.0,
          "preset": "tiny", "batch": 8, "nodes": 4, "dilation": None, "ratio": None, "name": "raw knobs",
          "max_cpu": 0.7}
    sc = None
    if a.scenario:
        try:
            sc = scen.load(a.scenario)
        except scen.ScenarioError as e:
            raise SystemExit(f"study: {e}")
        if a.preset:
            sc["emulation"]["preset"] = a.preset
        if a.batch:
            sc["emulation"]["batch"] = a.batch
        em.update(scen.derive(sc, a.nodes))
    for key, val in (("preset", a.preset), ("batch", a.batch), ("nodes", a.nodes)):
        if val is not None:
            em[key] = val
    # The modelled step must be long enough that every node's real compute (plus servers and
    # transport, a 1.5x margin) keeps this machine's cores below max_cpu.
    cores = os.cpu_count() or 1
    sim = getattr(a, "backend", "emulated") == "sim"
    em["backend"] = "sim" if sim else "emulated"
    if sim and getattr(a, "latency_us", None) is not None:
        em["latency_us"] = a.latency_us
    dry = getattr(a, "dry_run", False)
    real = None
    if a.calibrate and not sim:  # simulated time needs no headroom on this machine's cores
        if dry:  # starts nothing: the last measurement stored on this machine, if any
            m = cost.stored("compute_s", cost.compute_key(em["preset"], em["batch"]))
            real = m["value"] if m else None
            if real is None:
                print("[study] dry run: no compute calibration stored for this preset and batch; the study's own "
                      "calibration may lengthen the modelled step", flush=True)
        else:
            real = calibrate(em["preset"], em["batch"], os.path.join(a.out, "calibration"))
            cost.store_compute(em["preset"], em["batch"], real)
    if real is not None:
        em["real_compute_s"] = real
        em["min_step_time_s"] = 1.5 * em["nodes"] * em["real_compute_s"] / (cores * em["max_cpu"])
        if a.step_time is None and em["step_time_s"] < em["min_step_time_s"]:
            print(f"[study] the modelled step {em['step_time_s']:g} s is lengthened to "
                  f"{round(em['min_step_time_s'] + 0.05, 2):g} s: {em['nodes']} nodes' real compute "
                  f"({em['real_compute_s'] * 1e3:.0f} ms per step, {'stored' if dry else 'measured now'}) must keep "
                  f"this machine's {cores} cores below {em['max_cpu']:.0%}", flush=True)
            em["step_time_s"] = round(em["min_step_time_s"] + 0.05, 2)
            if sc:
                em.update(scen.derive(sc, em["nodes"], em["step_time_s"]))
        if a.step_time is not None and 0 < a.step_time < em["min_step_time_s"]:
            print(f"[study] warning: --step-time {a.step_time} is below the {em['min_step_time_s']:.2f} s this machine "
                  f"needs for {em['nodes']} nodes (real compute {em['real_compute_s'] * 1e3:.0f} ms per step): expect "
                  "overruns and invalid runs", flush=True)
    for key, val in (("step_time_s", a.step_time), ("slow_node", a.slow_node),
                     ("slowdown", a.slowdown), ("jitter", a.jitter),
                     ("jitter_tail", getattr(a, "jitter_tail", None))):
        if val is not None:
            em[key] = val
    if a.link_gbit is not None:
        em["link_gbit"] = a.link_gbit
    if a.netns and not em["link_gbit"]:
        em["link_gbit"] = 1.0
    if sc and a.step_time is not None:
        em.update(scen.derive(sc, em["nodes"], a.step_time))
    if getattr(a, "latency_ms", None) is not None:  # after every derivation: the flag wins over the scenario
        em["latency_ms"] = a.latency_ms
        em.pop("latency_note", None)
    problems = []
    if em["latency_ms"] < 0:
        problems.append(f"--latency-ms {em['latency_ms']} is negative")
    if em["step_time_s"] < 0:
        problems.append(f"--step-time {em['step_time_s']} is negative")
    if em["slowdown"] < 1:
        problems.append(f"--slowdown {em['slowdown']} is below 1 (a straggler is slower, not faster)")
    if em["jitter"] < 0:
        problems.append(f"--jitter {em['jitter']} is negative")
    if em["jitter_tail"] and not em["jitter_tail"] > 1:
        problems.append(f"--jitter-tail {em['jitter_tail']} has no finite mean: 0 (exponential) or a shape above 1")
    if em["slow_node"] >= em["nodes"]:
        problems.append(f"--slow-node {em['slow_node']} but only {em['nodes']} nodes (0..{em['nodes'] - 1})")
    if em["link_gbit"] is not None and em["link_gbit"] <= 0:
        problems.append(f"--link-gbit {em['link_gbit']} must be positive")
    if (em["slowdown"] > 1 or em["jitter"] > 0) and em["step_time_s"] == 0:
        problems.append("a straggler or jitter needs --step-time > 0 (the modelled time it multiplies)")
    if em["link_gbit"] and em["backend"] == "emulated" and os.geteuid() != 0:  # issue 32: say it before any run
        problems.append(f"a {em['link_gbit']:g} Gbit/s emulated link (--netns, --link-gbit or the scenario's link) "
                        "puts every node in a network namespace, which needs root: run as root, or use --backend sim")
    if problems:
        raise SystemExit("study: " + "; ".join(problems))
    if sc and getattr(a, "scaled_sizes", False):
        em["sizes"] = scen.scaled_sizes(sc, em["nodes"], getattr(a, "servers", None) or em["nodes"])
        for w in em["sizes"]["warnings"]:
            print(f"[study] warning: {w}", flush=True)
    return em


def loss_at(curve, t):
    """Validation loss at emulated time t (linear between evaluations), or None past the curve."""
    prev = None
    for p in curve:
        if p["t"] >= t:
            if prev is None or p["t"] == prev["t"]:
                return p["val_loss"]
            f = (t - prev["t"]) / (p["t"] - prev["t"])
            return prev["val_loss"] + f * (p["val_loss"] - prev["val_loss"])
        prev = p
    return None


def declared_targets(a, preset):
    """The study's targets, declared before any run (--targets, or --targets-from a reference study),
    each refused where it is at or above the initial loss."""
    if getattr(a, "targets", None) and getattr(a, "targets_from", None):
        raise BadInput("give --targets or --targets-from, not both")
    if getattr(a, "targets_from", None):
        path, _, config = a.targets_from.partition(":")
        try:
            ref = method.load_summary(path)
        except (OSError, ValueError) as e:
            raise BadInput(f"--targets-from {a.targets_from}: {e}")
        targets = method.targets_from_reference(ref, config or None)
    else:
        targets = method.parse_targets(getattr(a, "targets", None))
    return method.check_targets(targets, preset)


def check_held_out(job, out):
    """A held-out set larger than the validation split is refused by the trainer: a one-step run with
    the study's evaluation flags asks it before hours of runs, and its message is surfaced."""
    worker = os.path.join(ROOT, "build", "bin", "syncopate-worker")
    if not job.get("val_windows") or not os.path.exists(worker):
        return
    d = os.path.join(out, "preflight")
    os.makedirs(d, exist_ok=True)
    cmd = [worker, "--out", d, "--force", f"--model.preset={job['preset']}", f"--train.batch_size={job['batch']}",
           "--train.steps=1", "--schedule.warmup_steps=0", "--train.threads=1", "--eval.every=1",
           "--eval.sample_tokens=0", "--checkpoint.every=0",
           f"--data.cache_dir={ROOT}/data/cache"] + [f.format(job["val_windows"]) for f in TRAINER_FLAGS["val_windows"]]
    with run_lock(d):  # (lanes of one study share OUT: one preflight at a time)
        t0 = time.time()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.time() - t0
    if r.returncode != 0:
        msg = r.stderr.strip().splitlines()
        raise BadInput(f"--val-windows {job['val_windows']}: the trainer refused the held-out set: "
                       f"{msg[-1] if msg else f'exit {r.returncode}'}")
    # The preflight is also the cost estimate's measurement of a run's start-up and of an evaluation.
    cost.store_preflight_run(job["preset"], job["val_windows"], wall, d)


def parse_pairs(spec, names):
    pairs = []
    for p in (spec or "").split(","):
        if not p.strip():
            continue
        a, sep, b = p.partition(":")
        if not sep or a not in names or b not in names or a == b:
            raise BadInput(f"--compare {p!r}: give A:B with two different configurations of this study ({', '.join(names)})")
        pairs.append((a, b))
    return pairs


def eval_windows(job):
    """Held-out windows per evaluation (the old flags: eval.batches x the batch)."""
    return job.get("val_windows") or job.get("eval_batches", 4) * job["batch"]


def modelled_time_plans(configs, names, em, a, slow_nodes):
    """A wall budget's step counts from the modelled step times (the calibration runs measure the real
    ones, communication included): for the estimate before any run. None where it cannot say."""
    step = em["step_time_s"]
    if step <= 0:
        return {n: None for n in names}
    times = [step * (em["slowdown"] if i in slow_nodes else 1.0) * (1.0 + em["jitter"]) for i in range(em["nodes"])]
    out = {}
    for n in names:
        try:
            p = method.time_budget_plan(n, a.time_budget_s, times, slow_nodes, not configs[n].get("elastic"), a.evals)
            out[n] = method.whole_rounds(n, p, sync_every(configs[n]), a.evals)
        except BadInput:
            out[n] = None  # the calibration decides (and refuses by name)
    return out


def tuning_values(grid, factor, extend):
    """(the multipliers tune() tries first, the extensions it may still add): see method.tune."""
    tried = sorted(set(grid))
    if len(tried) == 1 and extend > 0:
        return [tried[0] / factor, tried[0], tried[0] * factor], extend - 1
    return tried, extend


def plan_rows(spec, plans, m):
    """Every run the study will start, in its order, each with its estimated seconds: the calibration
    runs of a wall budget, then per configuration its tuning runs (those that run only when a pick
    lands on an edge marked "if"), its outer-lr tuning, its headline seeds. plans: {name: plan or None}."""
    configs, em, job = spec["configs"], spec["em"], spec["job"]
    backend, nodes, windows = em["backend"], em["nodes"], eval_windows(job)
    rows = []

    def row(kind, name, lr, seed, steps, slow_steps, evals, outer=None, maybe=False, where=None):
        sync = not configs[name].get("elastic")
        est, floor = (None, 0.0) if steps is None else cost.run_s(backend, em, steps, slow_steps, sync, nodes, evals,
                                                                   windows, m, bool(configs[name].get("ring")))
        # A run whose directory already holds a finished run (--resume takes it back if its command line and
        # inputs match; the others, whose lr is decided by the tuning, cannot be looked up before it).
        cached = bool(where and spec.get("cache_dir") and not maybe
                      and os.path.exists(os.path.join(spec["cache_dir"], *where, "run.json")))
        rows.append({"kind": kind, "config": name, "lr": lr, "outer": outer, "seed": seed, "steps": steps,
                     "slow_steps": slow_steps, "maybe": maybe, "s": est, "floor_s": floor, "cached": cached})

    if spec["time_budget_s"]:
        for n in spec["names"]:
            h = sync_every(configs[n])
            row("calibration", n, "1x", spec["tseeds"][0], spec["calibration_steps"] if h == 1 else 2 * h, None, 1,
                where=("calibration", n))
    f = spec["factor"]
    for n in spec.get("make_only") or spec["names"]:  # (a lane makes its configurations' runs only)
        p = plans.get(n)
        steps, slow = (p["steps"], p.get("slow_steps")) if p else (None, None)
        evals = max(1, spec["evals"])
        has_outer = configs[n].get("outer_lr") is not None
        if spec["tune"]:
            first, more = tuning_values(spec["grid"], f, spec["extend"])
            for mult in first:
                for s in spec["tseeds"]:
                    row("tuning", n, f"{mult:g}x", s, steps, slow, evals, "1x" if has_outer else None,
                        where=("runs", n, f"lr{mult:g}" + ("_outer1" if has_outer else ""), f"seed{s}"))
            for k in range(more):
                for s in spec["tseeds"]:
                    row("tuning", n, f"x{f:g} or /{f:g} past the edge pick (extension {k + 1})", s, steps, slow, evals,
                        "1x" if has_outer else None, maybe=True)
            if has_outer:
                first, more = tuning_values(spec["outer_grid"], f, spec["extend"])
                for o in first:
                    if o == 1.0:
                        continue  # the inner tuning ran it at the pick
                    for s in spec["tseeds"]:
                        row("outer tuning", n, "the pick", s, steps, slow, evals, f"{o:g}x")
                for k in range(more):
                    for s in spec["tseeds"]:
                        row("outer tuning", n, "the pick", s, steps, slow, evals,
                            f"x{f:g} or /{f:g} past the edge pick (extension {k + 1})", maybe=True)
        lr, outer = ("the tuned pick", "the tuned pick") if spec["tune"] else ("1x", "1x")
        known = None if spec["tune"] else (1.0, 1.0 if has_outer else None)  # the multipliers, where not tuned here
        if spec.get("fixed"):  # --lrs-from: the other study's rates
            m_, o_ = spec["fixed"]["configurations"][n]
            lr, outer = f"{m_:g}x", None if o_ is None else f"{o_:g}x"
            known = (m_, o_)
        for s in spec["seeds"]:
            row("headline", n, lr, s, steps, slow, evals, outer if has_outer else None,
                where=known and ("runs", n, f"lr{known[0]:g}" + (f"_outer{known[1]:g}" if known[1] is not None else ""),
                                 f"seed{s}"))
    return rows


def plan_totals(rows):
    """Runs and seconds: {"runs", "s"} without the grid extensions, {"worst_runs", "worst_s"} with all; the
    runs found in the run cache ("cached": their count) count as runs but not as seconds."""
    def total(rs):
        return None if any(r["s"] is None for r in rs if not r.get("cached")) else sum(
            r["s"] for r in rs if not r.get("cached"))
    sure = [r for r in rows if not r["maybe"]]
    return {"runs": len(sure), "s": total(sure), "worst_runs": len(rows), "worst_s": total(rows),
            "floor_s": sum(r.get("floor_s") or 0.0 for r in sure if not r.get("cached")),
            "cached": sum(1 for r in rows if r.get("cached"))}


def measurement_runs(spec, measured, dry):
    """The short runs that measure this machine before the study (the estimate's measurements)."""
    if not dry:
        return measured
    em, job, out = spec["em"], spec["job"], []
    if em["backend"] == "emulated" and spec.get("calibrate", True):
        out.append("compute calibration (8 unpaced steps)")
    if job.get("val_windows"):
        out.append("held-out preflight (1 step, 1 evaluation)")
    if (em["backend"] == "sim" and spec.get("calibrate", True)
            and not cost.stored("compute_s", cost.compute_key(em["preset"], em["batch"]))):
        out.append("compute calibration (8 unpaced steps)")
    return out


def print_plan(rows, spec, m, measured, dry):
    """The plan and its cost, printed before the study's first run (with --dry-run, every run too)."""
    names, tune = spec["names"], spec["tune"]
    per_kind = {}
    for r in rows:
        k = per_kind.setdefault(r["kind"], [0, 0])
        k[1] += 1
        k[0] += not r["maybe"]
    tot = plan_totals(rows)
    L = [f"plan: {len(names)} configuration(s) ({', '.join(names)}); headline seeds "
         f"{', '.join(map(str, spec['seeds']))}; " + (
             f"learning rates tuned on seed(s) {', '.join(map(str, spec['tseeds']))}, grid "
             f"{', '.join(f'{g:g}' for g in spec['grid'])} x {spec['base_lr']:g}, extending at most {spec['extend']} "
             f"time(s) by x{spec['factor']:g} past an edge pick" if tune else
             f"learning rates from {spec['lrs_from']}'s tuning" if spec.get("lrs_from") else
             "learning rates NOT tuned (--no-tune)")]
    if "calibration" in per_kind:
        L.append(f"  calibration runs (--time-budget-s, one per configuration): {per_kind['calibration'][0]}")
    for kind, what in (("tuning", "tuning runs (tuning seeds)"), ("outer tuning", "outer-lr tuning runs (tuning seeds)")):
        if kind in per_kind:
            n, worst = per_kind[kind]
            L.append(f"  {what}: {n}" + (f", up to {worst} if every grid extends past an edge pick (worst case)"
                                          if worst > n else ""))
    L.append(f"  headline runs ({len(spec['seeds'])} seed(s) x {len(spec.get('make_only') or names)} configuration(s)): "
             f"{per_kind.get('headline', [0])[0]}")
    L.append(f"  total: {tot['runs']} runs, up to {tot['worst_runs']} (worst case), one at a time"
             + (f"; {tot['cached']} of them found finished in {spec['cache_dir']} (taken back if their inputs match: "
                "not counted in the minutes below)" if tot["cached"] else ""))
    ms = measurement_runs(spec, measured, dry)
    if ms:
        L.append(f"  {'measured first' if not dry else 'before them, short measurement runs'}: {', '.join(ms)}")
    per = []
    if spec.get("make_only"):
        L.append(f"  this lane (--make-only): {', '.join(spec['make_only'])}'s runs, every configuration's calibration")
    for n in spec.get("make_only") or names:
        h = [r["s"] for r in rows if r["config"] == n and r["kind"] == "headline"]
        hf = [r.get("floor_s") for r in rows if r["config"] == n and r["kind"] == "headline"]
        per.append(f"{n} ~{cost.minutes(h[0])}" if h and h[0] is not None else
                   f"{n} at least ~{cost.minutes(hf[0])}" if hf and hf[0] else f"{n} ?")
    if tot["s"] is not None:
        L.append(f"estimated cost: {tot['runs']} runs, ~{cost.minutes(tot['s'])} min in all, up to "
                 f"~{cost.minutes(tot['worst_s'])} min for {tot['worst_runs']} (minutes per run: {', '.join(per)})")
    else:
        L.append(f"estimated cost: at least ~{cost.minutes(tot['floor_s'])} min for {tot['runs']} runs (up to "
                 f"{tot['worst_runs']}), counting only the parts that can be estimated yet: a part below is not measured "
                 f"(minutes per run: {', '.join(per)})")
    L.append("  based on: " + "; ".join(m.basis()))
    if spec["time_budget_s"]:
        L.append("  (a wall budget's step counts here come from the modelled step times; its calibration runs "
                 "measure them, communication included, and the estimate is printed again)")
    if dry:
        L.append("dry run: the runs, in order (nothing started, nothing written):")
        for r in rows:
            approx = "~" if spec["time_budget_s"] and r["kind"] != "calibration" else ""  # until calibrated
            steps = "steps: from the calibration" if r["steps"] is None else (
                f"{approx}{r['steps']} steps/node" + (f" (straggler {approx}{r['slow_steps']})" if r.get("slow_steps")
                                                      else ""))
            L.append(f"  {r['kind']}{' (only if the pick is on an edge)' if r['maybe'] else ''}"
                     f"{' (found finished)' if r.get('cached') else ''}: {r['config']}, "
                     f"lr {r['lr']}" + (f", outer lr {r['outer']}" if r["outer"] else "") + f", seed {r['seed']}, "
                     f"{steps}, " + (f"~{cost.minutes(r['s'])} min" if r["s"] is not None else
                                 f"at least ~{cost.minutes(r['floor_s'])} min" if r.get("floor_s") else "minutes unknown"))
        L.append("dry run: exit without starting anything (drop --dry-run to run the study)")
    print("\n".join(f"[study] {x}" for x in L), flush=True)


def lrs_from(path, configs, names, base_lr, seeds):
    """--lrs-from DIR: {"dir", "tuning_seeds", "configurations": {name: (lr multiplier of base_lr, outer
    multiplier of the configuration's own outer lr, or None)}} from DIR/summary.json (its absolute rates),
    refused by name when it cannot stand for tuning here."""
    if not path:
        return None
    try:
        with open(os.path.join(path, "summary.json")) as f:
            s = json.load(f)
    except (OSError, ValueError) as e:
        raise BadInput(f"--lrs-from {path}: cannot read its summary.json ({e}); give a finished study's directory")
    if not s.get("tuned"):
        raise BadInput(f"--lrs-from {path}: that study did not tune its learning rates; give a tuned one")
    tseeds = s.get("tuning_seeds") or []
    if set(tseeds) & set(seeds):
        raise BadInput(f"--lrs-from {path}: its learning rates were tuned on seed(s) "
                       f"{', '.join(map(str, sorted(set(tseeds) & set(seeds))))}, which are headline seeds here; "
                       "choose other headline seeds (--first-seed)")
    out = {}
    for n in names:
        c = s.get("configurations", {}).get(n)
        if not c or c.get("lr") is None:
            raise BadInput(f"--lrs-from {path}: it has no tuned learning rate for {n}; run {n} in a tuned study "
                           "or leave it out (--configs)")
        own = configs[n].get("outer_lr")
        if own is not None and c.get("outer_lr") is None:
            raise BadInput(f"--lrs-from {path}: {n} has no outer learning rate there; give a study that tuned it")
        out[n] = (c["lr"] / base_lr, None if own is None else c["outer_lr"] / own)
    return {"dir": path, "tuning_seeds": tseeds, "configurations": out}


def run_study(configs, a, title, command, pairs=()):
    """Runs the study (see the module's docstring). pairs: (a, b) comparisons the caller's report
    discusses beyond every configuration against the baseline (e.g. asp_lr_scale against asp)."""
    names = a.configs.split(",") if a.configs else [n for n, c in configs.items() if not c.get("optional")]
    unknown = [n for n in names if n not in configs]
    if unknown:
        raise BadInput(f"unknown configuration(s) {', '.join(unknown)}; choose from {', '.join(configs)}")
    make_only = getattr(a, "make_only", None) and a.make_only.split(",")
    foreign = [n for n in make_only or [] if n not in names]
    if foreign:
        raise BadInput(f"--make-only {a.make_only}: {', '.join(foreign)} not among this "
                       f"study's configurations ({', '.join(names)}); a lane makes a part of the study's own runs")
    # Bad input, named before any run.
    first = getattr(a, "first_seed", 0) or 0
    seeds = list(range(first, first + a.seeds))
    tseeds = method.tuning_seeds(getattr(a, "tuning_seeds", "1000"), seeds)
    extend = getattr(a, "lr_extend", 3)
    tune = getattr(a, "tune", True)
    fixed = lrs_from(getattr(a, "lrs_from", None), configs, names, a.base_lr, seeds)
    if fixed is not None:
        tune = False
    grid = method.check_grid([float(x) for x in a.lr_grid.split(",")], extend) if tune else [1.0]
    outer_grid = method.check_grid([float(x) for x in getattr(a, "outer_lr_grid", "1").split(",")], extend,
                                   "--outer-lr-grid") if tune else [1.0]
    margin = getattr(a, "equivalence_margin", None)
    if margin is not None and not margin > 0:
        raise BadInput(f"--equivalence-margin {margin}: a margin in nats must be positive")
    if getattr(a, "token_budget", None) and getattr(a, "time_budget_s", None):
        raise BadInput("give --token-budget or --time-budget-s, not both (run the study once per budget)")
    for x, flag in ((getattr(a, "token_budget", None), "--token-budget"), (getattr(a, "time_budget_s", None),
                                                                            "--time-budget-s")):
        if x is not None and not x > 0:
            raise BadInput(f"{flag} {x}: must be positive")
    baseline = getattr(a, "baseline", None) or names[0]
    if baseline not in names:
        raise BadInput(f"--baseline {baseline}: not among this study's configurations ({', '.join(names)})")
    extra_pairs = parse_pairs(getattr(a, "compare", None), names)
    em = emulation(a)
    if make_only and not (em["backend"] == "sim" and getattr(a, "resume", None) is not False):
        raise BadInput("--make-only: lanes share their runs through the run cache, so they need --backend sim with "
                       "--resume (emulated runs are each a new measurement, and lanes would load each other's host)")
    for n in names:
        if configs[n].get("backup", 0) >= em["nodes"]:
            raise BadInput(f"{n} uses {configs[n]['backup']} backup workers but there are only "
                           f"{em['nodes']} workers: at most workers - 1")
    targets = declared_targets(a, em["preset"])
    if em["preset"] not in PRESETS:
        raise BadInput(f"preset {em['preset']}: its block size is unknown to the tooling (cluster_runs.PRESETS)")
    job = {"nodes": em["nodes"], "servers": a.servers or em["nodes"], "steps": a.steps, "evals": a.evals,
           "preset": em["preset"], "batch": em["batch"], "warmup": a.warmup, "eval_batches": 4,
           "val_windows": getattr(a, "val_windows", None) or None,
           "defer": getattr(a, "defer", None), "overlap": getattr(a, "overlap", None),
           "warmup_frac": getattr(a, "warmup_frac", None) or None,
           "sizes": em.get("sizes")}
    if getattr(a, "schedule_by", "steps") == "time":
        if not getattr(a, "time_budget_s", None) or em["backend"] != "sim" or not job["warmup_frac"]:
            raise BadInput("--schedule-by time needs --time-budget-s, --backend sim and --warmup-frac > 0 (a schedule "
                           "by the simulated clock ends at the wall budget and warms up over a share of it; the "
                           "trainer's schedule is by steps)")
        job["time_schedule_s"] = a.time_budget_s
    if em["backend"] == "sim" and job["overlap"]:
        # syncopate-sim models the overlap (emulate.overlap) but it is not yet validated against the
        # emulation (experiments/validate_sim.py on a study run with --overlap): a simulated study runs
        # every mode without it, and says so.
        print("[study] the simulator's overlap is not yet validated against the emulation: every mode runs "
              "without it", flush=True)
        job["overlap"] = False
        job["overlap_note"] = "off: the simulator's overlap is not yet validated (--overlap was asked for)"
    per_step = method.tokens_per_node_step(em["preset"], em["batch"])
    slow_nodes = [em["slow_node"]] if em["slow_node"] >= 0 and em["slowdown"] > 1 else []
    dry = getattr(a, "dry_run", False)
    # The token budget's plans need no run; a wall budget's come from its calibration runs (until then,
    # the modelled step times give the estimate's step counts).
    if getattr(a, "time_budget_s", None):
        plans0 = modelled_time_plans(configs, names, em, a, slow_nodes)
    else:
        value = getattr(a, "token_budget", None) or a.steps * em["nodes"] * per_step
        plan = method.token_budget_plan(value, em["nodes"], em["batch"], em["preset"], a.evals)
        plans0 = {n: method.whole_rounds(n, dict(plan), sync_every(configs[n]), a.evals) for n in names}
    measured = []
    if not dry:
        os.makedirs(a.out, exist_ok=True)
        if em.get("real_compute_s") is not None:
            measured.append("compute calibration")
        if job.get("val_windows") and os.path.exists(os.path.join(ROOT, "build", "bin", "syncopate-worker")):
            measured.append("held-out preflight")
        check_held_out(job, a.out)
        if (em["backend"] == "sim" and getattr(a, "calibrate", True)
                and not cost.stored("compute_s", cost.compute_key(em["preset"], em["batch"]))):
            # The simulator's real time is its workers' real gradients: measured once per preset and batch
            # (--no-calibrate: not measured; the estimate says so).
            cost.store_compute(em["preset"], em["batch"],
                               calibrate(em["preset"], em["batch"], os.path.join(a.out, "calibration", "compute")))
            measured.append("compute calibration")
    print(f"[study] {title}\n[study] emulation: {describe(em)}", flush=True)
    spec = {"configs": configs, "names": names, "seeds": seeds, "tseeds": tseeds, "grid": grid, "outer_grid": outer_grid,
            "tune": tune, "lrs_from": getattr(a, "lrs_from", None), "fixed": fixed, "extend": extend, "factor": getattr(a, "lr_extend_factor", 2.0),
            "time_budget_s": getattr(a, "time_budget_s", None), "calibration_steps": getattr(a, "calibration_steps", 20),
            "evals": a.evals, "em": em, "job": job, "base_lr": a.base_lr, "calibrate": getattr(a, "calibrate", True),
            "make_only": make_only,
            # --resume's cache (the plan does not count the runs found in it)
            "cache_dir": a.out if (em["backend"] == "sim" if getattr(a, "resume", None) is None else a.resume)
            else None}
    measurements = cost.Measurements(em["preset"], em["batch"], em["backend"])
    rows = plan_rows(spec, plans0, measurements)
    print_plan(rows, spec, measurements, measured, dry)
    if dry:
        return None
    study_t0 = time.time()
    estimated = plan_totals(rows)

    def usable(r):
        return "failed" not in r and r["valid"]

    resume = spec["cache_dir"] is not None
    # Budgets: every configuration's steps (its schedule ends at the budget), decided before any tuning.
    plans, calibrations = {}, {}
    if getattr(a, "time_budget_s", None):
        kind, value = "time", a.time_budget_s
        cal_job = dict(job, steps=a.calibration_steps, every_tokens=None, evals=1, time_schedule_s=None)
        for n in names:
            d = os.path.join(a.out, "calibration", n)
            # Local SGD: two rounds, timed over the second (H steps with their one synchronization).
            h = sync_every(configs[n])
            steps, skip = (a.calibration_steps, 3) if h == 1 else (2 * h, h - 1)
            cfg = dict(configs[n], steps=steps, slow_steps=None)
            r = run_once(n, cfg, em, dict(cal_job, steps=steps), tseeds[0], a.base_lr, d, 1.0, 1.0,
                         backend=em["backend"], reuse=resume)
            if "failed" in r:
                raise BadInput(f"the calibration run of {n} failed ({r['failed']}); log {r['log']}")
            times = method.node_step_times([read_jsonl(os.path.join(d, f"node{i}", "metrics.jsonl"))
                                            for i in range(em["nodes"])], skip=skip)
            calibrations[n] = times
            synchronous = not configs[n].get("elastic")
            plans[n] = method.time_budget_plan(n, value, times, slow_nodes, synchronous, a.evals)
    else:
        kind = "tokens"
        plans = {n: dict(plan) for n in names}
    plans = {n: method.whole_rounds(n, p, sync_every(configs[n]), a.evals) for n, p in plans.items()}
    totals = {n: method.job_tokens(p, em["nodes"], slow_nodes, per_step) for n, p in plans.items()}
    for n in plans:
        plans[n]["job_tokens"] = totals[n]
    job["every_tokens"] = method.every_tokens(list(totals.values()), a.evals)
    job["steps"] = max(p["steps"] for p in plans.values())
    for n, p in plans.items():
        print(f"[study] {n}: {p['steps']} steps per node" + (f", straggler {p['slow_steps']}" if p.get("slow_steps")
              else "") + f" ({totals[n]} tokens); evaluations every {job['every_tokens']} global tokens", flush=True)
    if kind == "time":  # the calibrated step counts: the estimate again, on them
        est = plan_totals([r for r in plan_rows(spec, plans, measurements) if r["kind"] != "calibration"])
        print(f"[study] estimate on the calibrated steps: ~{cost.minutes(est['s'])} min more, up to "
              f"~{cost.minutes(est['worst_s'])} min", flush=True)
    residuals = {}  # launch_key: each finished run's seconds beyond the estimate's training and evaluations

    runs = {}  # (config, lr multiplier, outer multiplier, seed) -> summary
    budget = {"kind": kind, "value": value}

    def run(name, mult, outer, seed):
        key = (name, mult, outer, seed)
        if key not in runs:
            tag = f"lr{mult:g}" + (f"_outer{outer:g}" if outer is not None else "")
            out = os.path.join(a.out, "runs", name, tag, f"seed{seed}")
            cfg = dict(configs[name], steps=plans[name]["steps"], slow_steps=plans[name].get("slow_steps"))
            if outer is not None:
                cfg["worker"] = list(cfg.get("worker", [])) + [f"--dist.outer_lr={cfg['outer_lr'] * outer:.6g}"]
            r = run_once(name, cfg, em, job, seed, a.base_lr * mult, out, a.max_overrun, a.max_cpu,
                         trace=seed == 0 and not getattr(a, "no_trace", False), backend=em["backend"],
                         reuse=resume)
            r["dir"] = out
            runs[key] = r
            if r.get("reused"):
                print(f"[study] {name} {tag} seed {seed}: reused ({out}/run.json), final val {r['final_val_loss']}",
                      flush=True)
            elif "failed" in r:
                print(f"[study] {name} {tag} seed {seed}: FAILED ({r['failed']}); log {r['log']}", flush=True)
            else:
                residuals.setdefault(cost.launch_key(em["backend"], bool(cfg.get("ring"))), []).append(cost.residual(
                    em["backend"], em, cfg["steps"], cfg["slow_steps"], not configs[name].get("elastic"), em["nodes"],
                    max(1, a.evals), eval_windows(job), r.get("elapsed_s"), measurements))
                health = ("" if em["backend"] == "sim" else
                          f", cpu {r['cpu_util'] or 0:.0%}, overrun {r['overrun_share']:.0%}")
                print(f"[study] {name} {tag} seed {seed}: final val {r['final_val_loss']}, "
                      f"{r['wall_s']:.1f} {'simulated ' if em['backend'] == 'sim' else ''}s{health}"
                      f"{'' if r['valid'] else ' INVALID: ' + r['invalid_because']}", flush=True)
        return runs[key]

    results = {}
    for name in names:
        if make_only and name not in make_only:
            continue  # another lane's
        cfg = configs[name]
        tuning = {}
        has_outer = cfg.get("outer_lr") is not None
        outer0 = 1.0 if has_outer else None

        def score(rs):
            """A learning rate's score: the tuning seeds' mean loss at the budget (method.at_budget: what the
            headline runs are compared on), None where a run failed or has none."""
            pts = [method.at_budget(r["curve"], budget) if usable(r) else None for r in rs]
            return None if any(p is None for p in pts) else sum(p["val_loss"] for p in pts) / len(pts)

        def inner_score(m, name=name, outer0=outer0):
            return score([run(name, m, outer0, s) for s in tseeds])

        best, best_outer = 1.0, outer0
        if fixed is not None:
            best, best_outer = fixed["configurations"][name]
        if tune:
            t = method.tune(inner_score, grid, getattr(a, "lr_extend_factor", 2.0), extend)
            tuning["lr"] = t
            best = t["pick"] if t["pick"] is not None else 1.0
        if tune and has_outer and tuning["lr"]["pick"] is not None:
            def outer_score(o, name=name, best=best):
                return score([run(name, best, o, s) for s in tseeds])
            to = method.tune(outer_score, outer_grid, getattr(a, "lr_extend_factor", 2.0), extend)
            tuning["outer_lr"] = to
            best_outer = to["pick"] if to["pick"] is not None else outer0
        rs = {s: run(name, best, best_outer, s) for s in seeds}
        results[name] = {"lr_multiplier": best, "lr": a.base_lr * best, "outer_multiplier": best_outer,
                         "outer_lr": cfg["outer_lr"] * best_outer if has_outer else None,
                         "tuning": tuning, "runs": rs}
    if make_only:
        made = sum(1 for r in runs.values() if not r.get("reused"))
        print(f"[study] lane done: {', '.join(make_only)}: {len(runs)} runs ({made} made, {len(runs) - made} taken "
              f"back), {time.time() - study_t0:.0f} s; no summary written (run the study without --make-only: every "
              "run is taken back)", flush=True)
        return None
    summary = {"title": title, "command": command, "method": "issue25", "emulation": em, "job": job,
               "budget": budget, "targets": targets,
               # What each lr was scored on (sessions before 38: "final", the end-of-run loss, also past a wall budget)
               "tuning_score": "val_loss_at_budget", "seeds": seeds, "tuning_seeds": tseeds,
               "tuned": tune, "lrs_from": fixed and {k: v for k, v in fixed.items() if k != "configurations"},
               "lr_grid": grid, "outer_lr_grid": outer_grid, "equivalence_margin": margin, "baseline": baseline,
               "pairs": [[x, y] for x, y in extra_pairs] + [[x, y] for x, y in pairs if x in names and y in names],
               "limits": {"overrun": a.max_overrun, "cpu": a.max_cpu}, "calibration": calibrations,
               "configurations": {}}
    took = time.time() - study_t0
    done = len(runs) + len(calibrations)
    reused = [r for r in runs.values() if r.get("reused")]
    summary["cost"] = {"runs": done, "took_s": took, "estimated_s": estimated["s"],
                       "reused_runs": len(reused),  # taken back from an earlier invocation's run.json (--resume)
                       "reused_runs_s": sum(r.get("elapsed_s") or 0.0 for r in reused),  # what making them took then
                       "estimated_worst_s": estimated["worst_s"], "planned_runs": estimated["runs"],
                       "planned_cached": estimated["cached"],  # of planned_runs, found finished (not in estimated_s)
                       "planned_runs_worst": estimated["worst_runs"], "basis": measurements.basis()}
    cost.record_runs(residuals)
    cost.record_study({"command": command, "runs": done, "took_s": round(took, 1),
                       "estimated_s": None if estimated["s"] is None else round(estimated["s"], 1)})
    print(f"[study] {done} runs took {cost.minutes(took)} min"
          + (f" ({len(reused)} of them reused from an earlier invocation)" if reused else "")
          + f" (estimated before them: ~{cost.minutes(estimated['s'])} "
          f"min for {estimated['runs']}, up to ~{cost.minutes(estimated['worst_s'])} min for {estimated['worst_runs']})",
          flush=True)
    for name, v in results.items():
        ok = {s: r for s, r in v["runs"].items() if usable(r)}
        hist = {}
        for r in ok.values():
            for k, c in r["staleness_histogram"].items():
                hist[k] = hist.get(k, 0) + c
        c = {
            "lr": v["lr"], "lr_multiplier": v["lr_multiplier"], "outer_lr": v["outer_lr"],
            "outer_multiplier": v["outer_multiplier"], "plan": plans[name],
            # waits for no straggler (ASP, BSP with backup workers, asynchronous local SGD)
            "elastic": bool(configs[name].get("elastic")),
            "tuning": {k: {"pick": t["pick"], "edge": t["edge"], "extended": t["extended"],
                           "scores": {f"{m:g}": x for m, x in sorted(t["scores"].items())}}
                       for k, t in v["tuning"].items()},
            "valid_runs": len(ok), "runs_total": len(v["runs"]),
            "failed": [{"seed": s, "why": r["failed"], "log": r["log"]} for s, r in v["runs"].items() if "failed" in r],
            "invalid": [{"seed": s, "why": r["invalid_because"], "log": r["log"]}
                        for s, r in v["runs"].items() if "failed" not in r and not r["valid"]],
            "per_seed": [dict(method.per_seed(s, r, targets, summary["budget"]), run_dir=r["dir"]) for s, r in ok.items()],
            "bytes": mean_ci95([r.get("bytes", 0) for r in ok.values()]),
            "bytes_received": mean_ci95([r.get("bytes_received", 0) for r in ok.values()]),
            "staleness": {"mean": mean_ci95([r["staleness_mean"] for r in ok.values()])["mean"],
                          "max": max([r["staleness_max"] for r in ok.values()], default=None), "histogram": hist},
            "dropped_gradients": mean_ci95([r["dropped"] for r in ok.values()])["mean"],
            "wait_share": mean_ci95([r["wait_share"] for r in ok.values()])["mean"],
            "overrun_share": max([r["overrun_share"] for r in v["runs"].values() if "failed" not in r], default=None),
            "cpu_util": max([r["cpu_util"] or 0 for r in v["runs"].values() if "failed" not in r], default=None),
            "curves": {str(s): r["curve"] for s, r in ok.items()},
            "trace": next((r["trace"] for r in v["runs"].values() if "trace" in r), None),
        }
        summary["configurations"][name] = c
    analyse(summary)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    report = write_report(summary, a.out)
    plots(summary, a.out)
    if a.tensorboard:
        export_tensorboard(results, a.out)
    print(report)
    return summary


def analyse(summary):
    """From every configuration's per_seed values: the means with 95% intervals, the per-target reach
    counts and censored medians, the held-out set check (refused where digests differ), the
    comparisons (paired, Holm across the report's list, TOST with the declared margin) and the
    conclusions, which come from the comparisons alone."""
    cfgs = summary["configurations"]
    targets = summary.get("targets") or []
    job, em = summary.get("job", {}), summary.get("emulation", {})
    # One step of the whole job in global tokens (every node's batch): the granularity of a count
    # that advances when the nodes step together.
    job_step = (em["nodes"] * em["batch"] * PRESETS[em["preset"]]["block"]
                if em.get("preset") in PRESETS and em.get("nodes") and em.get("batch") else None)
    for c in cfgs.values():
        ps = c["per_seed"]
        for key in ("final_val_loss", "val_loss_at_budget", "tokens_per_s", "wall_s", "end_s"):
            # Times and rates are never below 0: an interval reaching below is cut there (stats.mean_ci95).
            c[key] = mean_ci95([s.get(key) for s in ps], lower=0.0 if key in ("tokens_per_s", "wall_s", "end_s") else None)
        c["time_to_target"] = method.target_table(ps, targets)
        c["eval_points"] = method.eval_points(list(c.get("curves", {}).values()), job.get("every_tokens"), job_step)
    labels = {f"{n} seed {s['seed']}": s.get("val_set") for n, c in cfgs.items() for s in c["per_seed"]}
    summary["held_out"] = {"absent": method.check_val_sets(labels),
                           "val_set": next((d[0] for d in labels.values() if d), None),
                           "val_tokens": next((s["val_tokens"][0] for c in cfgs.values() for s in c["per_seed"]
                                               if s.get("val_tokens")), None),
                           "eval_of": {n: sorted({e for s in c["per_seed"] for e in (s.get("eval_of") or [])})
                                       for n, c in cfgs.items()}}
    names = list(cfgs)
    base = summary.get("baseline") or (names[0] if names else None)
    pairs = [(n, base) for n in names if n != base]
    for x, y in summary.get("pairs", []):
        if (x, y) not in pairs and (y, x) not in pairs:
            pairs.append((x, y))
    metrics = ["val_loss_at_budget", "tokens_per_s"] + [f"time_to_target_s@{method.target_key(t)}" for t in targets]
    summary["comparisons"] = method.comparisons(cfgs, pairs, metrics, summary.get("equivalence_margin"))
    summary["conclusions"] = conclusions(summary)


def conclusions(summary):
    """Sentences that follow from the numbers: the runs left out, the targets' reach counts, and each
    comparison as resolved, equivalent (TOST) or not resolved."""
    cfgs = summary["configurations"]
    lines = []
    for k, c in cfgs.items():
        if c["valid_runs"] < c["runs_total"]:
            lines.append(f"{k}: {c['runs_total'] - c['valid_runs']} of {c['runs_total']} runs failed or were invalid "
                         f"(left out of every figure).")
        for t, r in c.get("time_to_target", {}).items():
            if r["reached"] < r["n"]:
                lines.append(f"{k}: reached the target {t} in {r['reached']} of {r['n']} seeds (the others censored).")
        for what, t in c.get("tuning", {}).items():
            if t["edge"]:
                lines.append(f"{k}: the {what} pick {t['pick']:g}x is still on the {t['edge']} edge of the grid after "
                             f"{t['extended']} extension(s): under-tuned.")
    b = summary.get("budget", {})
    if b.get("kind") == "time":  # the fitted schedules should end at the budget: say where one did not
        for k, c in cfgs.items():
            for ps in c["per_seed"]:
                if summary.get("job", {}).get("time_schedule_s"):
                    if not ps.get("at_limit"):  # its schedule by the clock had not ended
                        lines.append(f"{k} seed {ps['seed']}: ended at {ps['end_s']:.1f} s, before the {b['value']:g} s "
                                     f"budget, at its step cap ({TIME_SCHEDULE_CAP}x the planned steps): its schedule by "
                                     "the clock had not ended.")
                elif ps.get("end_s") is not None and abs(ps["end_s"] - b["value"]) > 0.1 * b["value"]:
                    lines.append(f"{k} seed {ps['seed']}: its last evaluation is at {ps['end_s']:.1f} s, more than 10% "
                                 f"from the {b['value']:g} s budget (the calibrated step time did not hold).")
    lines += [method.sentence(c) for c in summary.get("comparisons", [])]
    return lines


def rebuild(out, from_runs=False, targets=None):
    """Rewrites OUT/report.md and the plots from OUT/summary.json (after a change of the report);
    targets (a list) re-reads the kept curves against other targets declared now; from_runs re-reads
    every run's metrics first."""
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    if any("per_seed" not in c for c in summary["configurations"].values()):
        raise BadInput(f"{out}/summary.json is an old-method study (no per-seed values): its report cannot be rebuilt "
                       "with the paired method; re-run the study")
    if targets is not None:
        summary["targets"] = method.check_targets(targets, summary["emulation"]["preset"])
    nodes = summary["emulation"]["nodes"]
    for c in summary["configurations"].values():
        if from_runs:
            for s in c["per_seed"]:
                r = summarize(s["run_dir"], nodes, ring=not server_stats(s["run_dir"]),
                              deferred=bool(summary.get("job", {}).get("defer")))
                s.update(method.per_seed(s["seed"], r, summary.get("targets") or [], summary.get("budget")))
                c["curves"][str(s["seed"])] = r["curve"]
        else:  # from the kept curves: every value per_seed reads off a curve
            for s in c["per_seed"]:
                method.reread(s, c["curves"].get(str(s["seed"]), []), summary.get("targets") or [], summary.get("budget"))
    analyse(summary)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    text = write_report(summary, out)
    plots(summary, out)
    return text


def write_report(summary, out):
    em = summary["emulation"]
    sim = em.get("backend") == "sim"
    job = summary.get("job", {})
    b = summary["budget"]
    cfgs = summary["configurations"]
    targets = summary.get("targets") or []
    ho = summary.get("held_out", {})
    budget = (f"equal token budget: {b['value']:.0f} tokens per job (every node of every configuration does the same "
              "steps, a straggler included)" if b["kind"] == "tokens" else
              f"equal wall-time budget: {b['value']:g} s (each node's steps = the budget / its step time, measured by "
              "a short calibration run per configuration)")
    caveat = ""
    if b["kind"] == "tokens" and em.get("slow_node", -1) >= 0 and em.get("slowdown", 1) > 1:
        # Old summaries lack "elastic": a configuration with staleness is taken for asynchronous.
        elastic = [n for n, c in cfgs.items() if (c["elastic"] if "elastic" in c else
                                                  ((c.get("staleness") or {}).get("mean") or 0) > 0)]
        if elastic:
            caveat = (f" Caveat: with equal steps per node, the asynchronous mode's fast nodes ({', '.join(elastic)}) "
                      "idle after their steps while the straggler finishes its own, so a token budget cannot show "
                      "straggler tolerance in throughput; a wall-time budget (--time-budget-s) does.")
    L = [f"# {summary['title']}", "", f"Command: `{summary['command']}`", "", f"Emulation: {describe(em)}.", "",
         "Time: " + ("simulated seconds (syncopate-sim's virtual clock)" if em.get("backend") == "sim" else
                     "emulated seconds on the training clock (evaluation off it)") + ".", "",
         f"Budget: {budget}; "
         + (f"every run's learning-rate schedule ran by the simulated clock (warmup over {job['warmup_frac']:g} of the "
            f"budget, cosine decay to its floor at the budget; sim.time_schedule, a simulator-only schedule, not "
            f"validated against the emulated cluster), so that a run ends at the budget, its shipped weights scored there "
            f"(local SGD: the outer weights, without the inner steps of its unfinished last round); the calibrated "
            f"steps x {TIME_SCHEDULE_CAP} only capped it (a run that reached its cap before the budget is listed below, "
            "if any)." if job.get("time_schedule_s") else
            "every run's learning-rate schedule (warmup "
            + (f"{job['warmup_frac']:g} of its steps" if job.get("warmup_frac") else f"{job.get('warmup')} steps")
            + ", decay to the end) ends at the budget where the calibrated step times hold, so no figure compares an "
            "annealed run with one at peak lr (runs that ended past the budget are listed below, if any).")
         + caveat, "",
         "Evaluation: " + (f"{job['val_windows']} held-out windows" if job.get("val_windows") else "the old per-seed "
                           "held-out batches (no --val-windows)")
         + (f" ({ho['val_tokens']} tokens, set {ho['val_set']})" if ho.get("val_set") else "")
         + f", asked every {job.get('every_tokens')} global tokens as node 0 counts them (eval.every_tokens) and at "
         "the end, "
         + ("deferred (scored after training on snapshots: no node time)" if job.get("defer") else "on the clock")
         + "; evaluated weights: " + ", ".join(f"{n} {'/'.join(e) or 'not recorded'}" for n, e in
                                               ho.get("eval_of", {}).items()) + "."
         + observed_points(cfgs, em), ""]
    if ho.get("absent"):
        L += [f"**Note:** {len(ho['absent'])} run(s) carry no held-out digest (val_set), so the sameness of their "
              f"held-out set is not checked (old trainer or a backend without it): {', '.join(ho['absent'][:8])}"
              + (" ..." if len(ho['absent']) > 8 else "") + ".", ""]
    if not any(e for e in ho.get("eval_of", {}).values()):
        L += ["**Note:** the evaluation records do not say which weights were evaluated (no eval_of): an old trainer's "
              "records, which evaluated node 0's own replica.", ""]
    if b["kind"] == "time":
        # Every run past its wall budget, the earliest read first: "read at" is the evaluation its loss at the
        # budget comes from; a run with none inside the budget has no loss at it and leaves the loss comparisons.
        runs = [(n, p) for n, c in cfgs.items() for p in c["per_seed"] if p.get("end_s") is not None]
        late = sorted([(n, p) for n, p in runs if p.get("at_budget_s") is not None and p["end_s"] > p["at_budget_s"]],
                      key=lambda x: x[1]["at_budget_s"])
        none = [f"{n} seed {p['seed']} (ended {p['end_s']:.1f} s)" for n, p in runs if p.get("at_budget_s") is None]
        if late:
            L += [f"**Note:** {len(late)} run(s) ended past the {b['value']:g} s budget (their modelled steps took "
                  "longer than the calibration's): their loss at the budget is the last evaluation at or before it, "
                  "where the schedule had not ended, and their times to a target are censored at the budget: "
                  + ", ".join(f"{n} seed {p['seed']} (ended {p['end_s']:.1f} s, read at {p['at_budget_s']:.1f} s)"
                              for n, p in late) + ".", ""]
        if none:
            L += [f"**Note:** {len(none)} run(s) have no evaluation at or before the budget, so no loss at it; they are "
                  "left out of every loss comparison: " + ", ".join(none) + ".", ""]
    overlap = job.get("overlap_note") or ("on for every mode (local SGD: nothing to overlap)" if job.get("overlap")
                                          else "off" if job.get("overlap") is False else "not set")
    L += [f"Overlap: {overlap}. "
          f"Targets (declared before the runs): {', '.join(f'{t:g}' for t in targets) if targets else 'none declared'}. "
          f"Seeds: {len(summary['seeds'])} headline ({', '.join(map(str, summary['seeds']))}); "
          + (f"learning rates tuned on seeds {', '.join(map(str, summary['tuning_seeds']))} (disjoint; scored on their "
             + ("loss at the budget" if summary.get("tuning_score") == "val_loss_at_budget" else "end-of-run loss")
             + "), grid "
             f"{', '.join(f'{m:g}' for m in summary['lr_grid'])} x the base lr (outer lr: "
             f"{', '.join(f'{m:g}' for m in summary.get('outer_lr_grid', []))} x the configuration's own), "
             "extended past an edge pick. " if summary.get("tuned", True) else
             f"learning rates from another study's tuning ({summary['lrs_from']['dir']}, tuned on seeds "
             f"{', '.join(map(str, summary['lrs_from']['tuning_seeds']))}, disjoint from these), not tuned here. "
             if summary.get("lrs_from") else
             "learning rates NOT tuned (--no-tune): every configuration at the base lr, which favours whichever mode "
             "it happens to suit; no conclusion of this report stands for tuned configurations. ")
          + "Comparisons are paired over seeds (same initialization, data order and jitter), with 95% t intervals "
          "and Holm's correction across every comparison below; a comparison is resolved when its Holm p < 0.05. "
          + (f"Equivalence is claimed only by TOST within +-{summary['equivalence_margin']:g} nats. "
             if summary.get("equivalence_margin") else "No equivalence margin was declared, so nothing is called "
             "equivalent. ")
          + "A difference that is the same in every paired seed (deterministic runs: no seed variation) is reported "
          "as deterministic, with no p, never resolved nor equivalent: a zero-width interval is not a statistical "
          "result. "
          + ("The simulator's time is modelled, so no host limit (overrun, CPU) applies: every finished run counts."
             if sim else
             f"Runs whose emulation did not hold (overrun share > {summary['limits']['overrun']:.0%} or CPU > "
             f"{summary['limits']['cpu']:.0%}) are left out and listed."), ""]
    if any(c[k].get("clipped") for c in cfgs.values() for k in ("end_s", "tokens_per_s") if c.get(k)):
        L += ["Intervals of times and throughputs that reached below 0 are cut at 0 (a time is never negative).", ""]
    spent = summary.get("cost")
    if spent and spent.get("took_s") is not None:
        L += [f"Cost: {spent['runs']} runs took {cost.minutes(spent['took_s'])} min on this machine (estimated before "
              f"them: ~{cost.minutes(spent.get('estimated_s'))} min for {spent.get('planned_runs')} runs"
              + (f" of which {spent['planned_cached']} were found finished and not counted"
                 if spent.get("planned_cached") else "") + ", up to "
              f"~{cost.minutes(spent.get('estimated_worst_s'))} min for {spent.get('planned_runs_worst')})"
              + (f"; {spent['reused_runs']} of the runs were reused from an earlier invocation (same command line and "
                 f"inputs), whose making took {cost.minutes(spent.get('reused_runs_s'))} min then"
                 if spent.get("reused_runs") else "") + ".", ""]
    secs = "simulated s" if sim else "s"
    head = f"| configuration | lr (outer) | steps/node | valid runs | val loss at budget | end, {secs} | tokens/{secs} |"
    head += "".join(f" reached {t:g} (median {secs}) |" for t in targets)
    head += " MB sent | staleness mean / max (per step: shards' mean) |" + ("" if sim else " overrun (max) | CPU (max) |")
    L += [head, "|" + "---|" * (head.count("|") - 1)]
    for k, c in cfgs.items():
        p = c.get("plan", {})
        steps = f"{p.get('steps')}" + (f" (straggler {p['slow_steps']})" if p.get("slow_steps") else "")
        cells = [f"{k}", f"{c['lr']:.2g}" + (f" ({c['outer_lr']:.2g})" if c.get("outer_lr") else ""), steps,
                 f"{c['valid_runs']}/{c['runs_total']}", fmt_ci(c["val_loss_at_budget"], 4), fmt_ci(c["end_s"]),
                 fmt_ci(c["tokens_per_s"])]
        for t in targets:
            r = c["time_to_target"][method.target_key(t)]
            cells.append(f"{r['reached']}/{r['n']} ({'-' if r['median'] is None else format(r['median'], '.3g')})")
        st = c["staleness"]
        cells += [mbytes(c.get("bytes")),
                  f"{'-' if st['mean'] is None else round(st['mean'], 2)} / {'-' if st['max'] is None else round(st['max'], 1)}"]
        if not sim:  # the emulation's health: meaningless for the simulator's modelled time
            cells += ["-" if c["overrun_share"] is None else format(c["overrun_share"], ".0%"),
                      "-" if c["cpu_util"] is None else format(c["cpu_util"], ".0%")]
        L.append("| " + " | ".join(cells) + " |")
    if any(c["staleness"].get("max") for c in cfgs.values()):
        L += ["", "Staleness: a step's is the parameter versions applied since its weights were read, averaged over "
              "the shards its push went to (hence not a whole number); mean: over every step of every node, then over "
              "the seeds; max: the largest such step value in any seed (a maximum over steps and seeds of a shard "
              "average)."]
    if targets:
        L += ["", "Time to target: per target, the seeds that reached it of the valid seeds and the median time with "
              "the others counted as not reached (censored; no median where half or more did not reach it); the "
              "paired comparisons of time use only the seeds where both reached it, as each line states."]
    L += ["", "## Comparisons", "", "| a | b | metric | a - b | 95% interval | p | Holm p | n | verdict |",
          "|---|---|---|---|---|---|---|---|---|"]
    for c in summary.get("comparisons", []):
        out_n = f" (+{c['left_out']} out)" if c["left_out"] else ""
        verdict = ("deterministic: no seed variation, not a statistical result" if c.get("deterministic") else
                   "resolved (indicative: below the evaluation spacing)" if c["resolved"] and method.indicative(c)
                   else "resolved" if c["resolved"] else "equivalent (TOST)" if c.get("tost", {}).get("equivalent")
                   else "not resolved")
        ci = c["ci95"]
        interval = ("none (no seed variation)" if c.get("deterministic") else
                    "-" if ci[0] is None else f"[{ci[0]:.4g}, {ci[1]:.4g}]")
        L.append(f"| {c['a']} | {c['b']} | {c['metric']} | {method._fmt(c['mean_diff'])} | "
                 f"{interval} | {method._fmt(c['p'], 3)} | "
                 f"{method._fmt(c.get('p_holm'), 3)} | {c['n']}{out_n} | {verdict} |")
    L += ["", "## Conclusions", ""] + [f"- {x}" for x in summary["conclusions"]]
    L += ["", "## Learning-rate tuning (mean " + ("validation loss at the budget" if summary.get("tuning_score") ==
                                               "val_loss_at_budget" else "final validation loss")
          + " over the tuning seeds)", ""]
    for k, c in cfgs.items():
        for what, t in c.get("tuning", {}).items():
            cells = ", ".join(f"{m}x: {'failed' if x is None else format(x, '.4f')}" for m, x in t["scores"].items())
            L.append(f"- {k} {what}: pick {'-' if t['pick'] is None else format(t['pick'], 'g')}x"
                     + (f" (ON THE {t['edge'].upper()} EDGE)" if t["edge"] else "")
                     + f"; extended {t['extended']} time(s); {cells}")
    traced = {k: c["trace"] for k, c in cfgs.items() if c.get("trace")}
    if traced:
        L += ["", "## Timelines", "",
              "One run per configuration (seed 0) with every process's timeline merged on one clock. Open in "
              "https://ui.perfetto.dev; `scripts/merge_traces.py --summary` totals them.", ""]
        L += [f"- {k}: [{os.path.relpath(p, out)}]({os.path.relpath(p, out)})" for k, p in traced.items()]
    for k, c in cfgs.items():
        for f in c["failed"] + c["invalid"]:
            L.append(f"\n{k} seed {f['seed']}: {f['why']} (log: {f['log']})")
    text = "\n".join(L) + "\n"
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


def observed_points(cfgs, em):
    """The report's sentence on the evaluation points each configuration's runs actually have
    (method.eval_points of their curves): "every N global tokens" only where the records show it."""
    parts = []
    for n, c in cfgs.items():
        ep = c.get("eval_points")
        if not ep:
            continue
        pts = ep["points"]
        count = (f"{pts['min']}" if pts["min"] == pts["max"] else f"{pts['min']}-{pts['max']}") + " points per run"
        if ep["while_waiting"]:
            count += (f" ({ep['while_waiting']} of them, over the {ep['runs']} run(s), taken while node 0 waited for "
                      "the straggler at the end)")
        st, sp = ep["spacing_tokens"], ep["spacing_s"]
        if st["median"] is None:
            parts.append(f"{n}: {count}")
            continue
        spacing = (f"median spacing {st['median']:.0f} global tokens"
                   + ("" if st["min"] == st["max"] else f" ({st['min']:.0f}-{st['max']:.0f})") + f" and {sp:.2g} s")
        N = ep.get("every_tokens")
        if ep["grid"] == "exact":
            parts.append(f"{n}: {count}, every {N} global tokens and at the end ({spacing})")
        elif ep["grid"] == "step":
            parts.append(f"{n}: {count}, at the first job step past each multiple of {N} global tokens and at the end "
                         f"({spacing})")
        else:
            parts.append(f"{n}: {count}, {spacing}" + (
                f", not every {N} global tokens (node 0 evaluates when its own tokens x {em.get('nodes')} cross a "
                "multiple; the records carry the job's real count)" if N else ""))
    return (" Evaluation points observed (the runs' curves, every point counted): " + "; ".join(parts) + "."
            if parts else "")


def mbytes(ci):
    """A mean byte count as MB, '-' where none was recorded (builds before the counter)."""
    return "-" if not ci or not ci.get("mean") else f"{ci['mean'] / 1e6:.1f}"


def describe(em):
    parts = [f"{em['nodes']} nodes, preset {em['preset']}, batch {em['batch']}/node"]
    parts.append(f"modelled step {em['step_time_s']:g} s" if em["step_time_s"] else "unpaced compute (no emulation)")
    if em["slow_node"] >= 0 and em["slowdown"] > 1:
        parts.append(f"node {em['slow_node']} {em['slowdown']:g}x slower")
    if em["jitter"]:
        parts.append(f"jitter: heavy-tailed (Lomax, shape {em['jitter_tail']:g}), mean {em['jitter']:g} of the step"
                     if em.get("jitter_tail") else f"jitter: exponential, mean {em['jitter']:g} of the step")
    if em.get("backend") == "sim":
        parts.append(f"links {em['link_gbit'] or 10:.3g} Gbit/s, {sim_latency_us(em):g} us one way "
                     "(syncopate-sim: virtual time)")
    else:
        parts.append(f"links {em['link_gbit']:.3g} Gbit/s (network namespaces)" if em["link_gbit"] else "loopback links")
        if em.get("latency_ms"):
            parts.append(f"{em['latency_ms']:.3g} ms one-way latency added per message (delay line)")
    if em.get("latency_note"):  # the scenario's latency (--latency-ms drops the note)
        parts.append(f"latency: {em['latency_note']}")
    if em.get("ratio") is not None:
        parts.append(f"stands for {em['name']}: comm/compute ratio {em['ratio']:.2f}, "
                     f"time dilation {em['dilation']:.3g} (emulated s per target s)")
    if em.get("sizes"):
        z = em["sizes"]
        parts.append("message sizes scaled by the bytes ratio {:.3g} ({}): {}".format(
            z["bytes_ratio"], ", ".join(f"dist.{f}={v:.3g}" for f, v in z["flags"].items()),
            ", ".join(f"{k.replace('_', ' ')} {c['emulated']} (target {c['target']})" for k, c in z["counts"].items())))
    elif em.get("ratio") is not None:
        parts.append("message sizes: the trainer's defaults (--no-scaled-sizes), not the target's message count")
    return "; ".join(parts)


def band_points(curves, xkey):
    """The x values and, at each, every seed's validation loss, for a band over seeds. Runs with the
    same number of points (the same evaluation points in each) are taken point by point (x: their
    mean). Otherwise (an asynchronous mode, whose runs differ in their points: while_waiting ones
    among them) every run is interpolated linearly at every run's x inside the range all runs cover,
    so no point is dropped nor two different points averaged as one."""
    if len({len(cv) for cv in curves}) == 1:
        n = len(curves[0])
        return ([sum(cv[i].get(xkey, 0) for cv in curves) / len(curves) for i in range(n)],
                [[cv[i]["val_loss"] for cv in curves] for i in range(n)])
    lo = max(cv[0].get(xkey, 0) for cv in curves)
    hi = min(cv[-1].get(xkey, 0) for cv in curves)
    grid = sorted({p.get(xkey, 0) for cv in curves for p in cv if lo <= p.get(xkey, 0) <= hi})

    def at(cv, x):
        prev = None
        for p in cv:
            px = p.get(xkey, 0)
            if px >= x:
                if prev is None or px == prev.get(xkey, 0):
                    return p["val_loss"]
                f = (x - prev.get(xkey, 0)) / (px - prev.get(xkey, 0))
                return prev["val_loss"] + f * (p["val_loss"] - prev["val_loss"])
            prev = p
        return cv[-1]["val_loss"]
    return grid, [[at(cv, x) for cv in curves] for x in grid]


def plots(summary, out):
    plt = pyplot()
    if plt is None:
        return
    cfgs = summary["configurations"]

    def save(fname, xlabel, ylabel, legend=True):
        plt.xlabel(xlabel)
        plt.ylabel(ylabel)
        if legend:
            plt.legend(fontsize=8)
        plt.tight_layout()
        plt.savefig(os.path.join(out, fname), dpi=100)
        plt.close()

    def banded(xkey, fname, xlabel, log_x=False):
        plt.figure(figsize=(7, 4.5))
        if log_x:
            plt.xscale("log")
        lo, hi = float("inf"), float("-inf")  # y range: the mean curves, without stale-gradient spikes
        for k, c in cfgs.items():
            curves = [cv for cv in c["curves"].values() if cv]
            if not curves:
                continue
            xs, ys = band_points(curves, xkey)
            stats = [mean_ci95(y) for y in ys]
            i = list(cfgs).index(k)  # more configurations than the default cycle's 10 colours: tab20's
            line, = plt.plot(xs, [s["mean"] for s in stats], label=k, color=plt.cm.tab20.colors[(2 * i + i // 10) % 20],
                             linestyle="--" if k.endswith("_int8") else "-")
            lo = min(lo, min(s["mean"] for s in stats))
            hi = max(hi, stats[0]["mean"])
            if len(curves) > 1:
                plt.fill_between(xs, [s["ci95"][0] for s in stats], [s["ci95"][1] for s in stats],
                                 color=line.get_color(), alpha=0.2)
        for i, t in enumerate(summary.get("targets") or []):
            plt.axhline(t, color="gray", linestyle=":", label="targets" if i == 0 else None)
        if lo < hi:
            plt.ylim(lo - 0.1, hi + 0.3)  # spikes above the first evaluation are clipped (see the report's table)
        save(fname, xlabel, "validation loss (mean, 95% band)")

    banded("t", "val_loss_vs_time.png", "simulated seconds (syncopate-sim's virtual clock)"
           if summary["emulation"].get("backend") == "sim" else "emulated seconds (training clock)")
    banded("tokens", "val_loss_vs_tokens.png", "global tokens processed")
    if any(pt.get("bytes") for c in cfgs.values() for cv in c["curves"].values() for pt in cv):
        banded("bytes", "val_loss_vs_bytes.png", "bytes sent by all nodes (log scale)", log_x=True)
    plt.figure(figsize=(7, 4.5))
    for k, c in cfgs.items():
        h = c["staleness"]["histogram"]
        if h:
            ks = sorted(h, key=int)
            tot = sum(h.values())
            plt.plot([int(x) for x in ks], [h[x] / tot for x in ks], marker="o", label=k)
    save("staleness.png", "staleness (parameter versions)", "share of updates")
    if any(c.get("tuning", {}).get("lr") for c in cfgs.values()):
        plt.figure(figsize=(7, 4.5))
        for k, c in cfgs.items():
            pts = [(float(m), v) for m, v in c.get("tuning", {}).get("lr", {}).get("scores", {}).items() if v is not None]
            if pts:
                plt.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=k)
        plt.xscale("log", base=2)
        save("lr_sensitivity.png", "learning-rate multiplier", "final validation loss (tuning seeds' mean)")


def export_tensorboard(results, out):
    """Every run's metrics.jsonl (node 0) as TensorBoard scalars under OUT/tensorboard/<config>/seed<k>."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("[study] --tensorboard needs the tensorboard package (pip install tensorboard)", file=sys.stderr)
        return
    from cluster_runs import read_jsonl
    for name, v in results.items():
        for seed, r in v["runs"].items():
            if "failed" in r:
                continue
            metrics = os.path.join(os.path.dirname(r["log"]), "node0", "metrics.jsonl")
            w = SummaryWriter(os.path.join(out, "tensorboard", name, f"seed{seed}"))
            for m in read_jsonl(metrics):
                for key in ("loss", "val_loss", "lr", "grad_norm", "staleness", "tokens_per_s", "wait_s"):
                    if key in m:
                        w.add_scalar(key, m[key], m["step"])
            w.close()


if __name__ == "__main__":
    # python experiments/study.py OUT [--targets 3.2,2.9] [--from-runs]: rebuild OUT's report and plots from
    # its summary.json (other targets re-read the same curves; --from-runs re-reads their metrics too).
    ap = argparse.ArgumentParser(description="rebuild OUT/report.md and plots from OUT/summary.json")
    ap.add_argument("out")
    ap.add_argument("--targets", help="targets declared now, e.g. 3.2,2.9 (default: the study's own)")
    ap.add_argument("--from-runs", action="store_true", help="re-read every run's metrics under OUT/runs/ first")
    args = ap.parse_args()
    print(rebuild(args.out, args.from_runs, method.parse_targets(args.targets) if args.targets else None))
