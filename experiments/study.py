"""The study driver shared by ab_sync_async.py and staleness_sweep.py: every configuration runs on
the same emulated cluster (a scenario, or raw knobs), its learning rate chosen on a small grid
under the same budget, then with several seeds; the report concludes only where 95% intervals
separate. Writes OUT/summary.json, OUT/report.md and plots, and keeps every run under OUT/runs/."""
import argparse
import json
import os
import sys

import scenario as scen
from cluster_runs import CPU_LIMIT, OVERRUN_LIMIT, ROOT, calibrate, run_once, server_stats, summarize
from stats import fmt_ci, mean_ci95, separated
from plotting import pyplot


def add_args(ap, out_default):
    ap.add_argument("--scenario", help="a TOML scenario (experiments/scenarios/); raw knobs below override it")
    ap.add_argument("--nodes", type=int, help="emulated nodes (default: the scenario's, else 4)")
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps per node")
    ap.add_argument("--evals", type=int, default=10, help="validation points per run (>= 10 for studies)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per configuration (weights, data order, jitter)")
    ap.add_argument("--lr-grid", default="0.5,1,2", help="learning-rate multipliers tried per configuration")
    ap.add_argument("--base-lr", type=float, default=2e-3, help="the learning rate the grid multiplies")
    ap.add_argument("--warmup", type=int, default=5, help="warmup steps")
    ap.add_argument("--preset", help="model preset (default: the scenario's, else tiny)")
    ap.add_argument("--batch", type=int, help="sequences per node per step (default: the scenario's, else 8)")
    ap.add_argument("--servers", type=int, help="parameter-server shards (default: one per node)")
    ap.add_argument("--step-time", type=float, help="modelled compute seconds per step (0: unpaced)")
    ap.add_argument("--slow-node", type=int, help="the straggler's index (-1: none)")
    ap.add_argument("--slowdown", type=float, help="the straggler's factor on the modelled time")
    ap.add_argument("--jitter", type=float, help="mean exponential extra time per step, fraction of the step time")
    ap.add_argument("--netns", action="store_true", help="each node in its own network namespace (root)")
    ap.add_argument("--link-gbit", type=float, help="the emulated link rate with --netns, Gbit/s")
    ap.add_argument("--target-loss", default="best",
                    help="validation loss that defines time to target: a number, 'best' (1.02 x the best "
                    "configuration's final mean: how soon each gets near the best) or 'all' (1.02 x the worst "
                    "configuration's final mean: a level every configuration reaches)")
    ap.add_argument("--configs", help="comma-separated subset of the configurations")
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
    ap.add_argument("--latency-us", type=float, help="sim: one-way message latency, microseconds (default 50)")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", out_default))


def emulation(a):
    """The emulation from the scenario and the raw knobs (raw knobs win), and a description."""
    em = {"step_time_s": 0.3, "slow_node": -1, "slowdown": 1.0, "jitter": 0.0, "link_gbit": None,
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
    if a.calibrate and not sim:  # simulated time needs no headroom on this machine's cores
        em["real_compute_s"] = calibrate(em["preset"], em["batch"], os.path.join(a.out, "calibration"))
        em["min_step_time_s"] = 1.5 * em["nodes"] * em["real_compute_s"] / (cores * em["max_cpu"])
        if a.step_time is None and em["step_time_s"] < em["min_step_time_s"]:
            em["step_time_s"] = round(em["min_step_time_s"] + 0.05, 2)
            if sc:
                em.update(scen.derive(sc, em["nodes"], em["step_time_s"]))
        if a.step_time is not None and 0 < a.step_time < em["min_step_time_s"]:
            print(f"[study] warning: --step-time {a.step_time} is below the {em['min_step_time_s']:.2f} s this machine "
                  f"needs for {em['nodes']} nodes (real compute {em['real_compute_s'] * 1e3:.0f} ms per step): expect "
                  "overruns and invalid runs", flush=True)
    for key, val in (("step_time_s", a.step_time), ("slow_node", a.slow_node),
                     ("slowdown", a.slowdown), ("jitter", a.jitter)):
        if val is not None:
            em[key] = val
    if a.link_gbit is not None:
        em["link_gbit"] = a.link_gbit
    if a.netns and not em["link_gbit"]:
        em["link_gbit"] = 1.0
    if sc and a.step_time is not None:
        em.update(scen.derive(sc, em["nodes"], a.step_time))
    problems = []
    if em["step_time_s"] < 0:
        problems.append(f"--step-time {em['step_time_s']} is negative")
    if em["slowdown"] < 1:
        problems.append(f"--slowdown {em['slowdown']} is below 1 (a straggler is slower, not faster)")
    if em["jitter"] < 0:
        problems.append(f"--jitter {em['jitter']} is negative")
    if em["slow_node"] >= em["nodes"]:
        problems.append(f"--slow-node {em['slow_node']} but only {em['nodes']} nodes (0..{em['nodes'] - 1})")
    if em["link_gbit"] is not None and em["link_gbit"] <= 0:
        problems.append(f"--link-gbit {em['link_gbit']} must be positive")
    if (em["slowdown"] > 1 or em["jitter"] > 0) and em["step_time_s"] == 0:
        problems.append("a straggler or jitter needs --step-time > 0 (the modelled time it multiplies)")
    if problems:
        raise SystemExit("study: " + "; ".join(problems))
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


def check_target_rule(rule):
    """--target-loss as given: 'best', 'all' or a number (checked before any run, not after them)."""
    if rule in ("best", "all"):
        return rule
    try:
        return float(rule)
    except (TypeError, ValueError):
        raise SystemExit(f"study: --target-loss {rule!r} is not a number, 'best' or 'all'")


def targets(summary):
    """From the stored curves: the common time (the earliest end of any valid run), every
    configuration's validation loss at it, the target loss, and time to target (emulated and
    target seconds). Budgets can end at different times (a straggler-free configuration's fast
    nodes may finish later or sooner), so the loss at the common time is what compares fairly."""
    cfgs = summary["configurations"]
    ends = [cv[-1]["t"] for c in cfgs.values() for cv in c["curves"].values() if cv]
    t_eq = min(ends) if ends else None
    summary["equal_time_s"] = t_eq
    for c in cfgs.values():
        c["val_loss_at_equal_time"] = mean_ci95([loss_at(cv, t_eq) for cv in c["curves"].values()] if t_eq else [])
    rule = check_target_rule(summary.get("target_rule") or "best")
    means = [c["val_loss_at_equal_time"]["mean"] for c in cfgs.values() if c["val_loss_at_equal_time"]["mean"] is not None]
    if rule in ("best", "all"):
        target = 1.02 * (max(means) if rule == "all" else min(means)) if means else None
    else:
        target = rule
    summary["target_val_loss"] = target
    dil = summary["emulation"].get("dilation")
    for c in cfgs.values():
        ttt = [time_to_target(cv, target) for cv in c["curves"].values()] if target else []
        c["time_to_target_s"] = dict(mean_ci95(ttt), reached=sum(t is not None for t in ttt))
        if dil:
            c["time_to_target_target_s"] = {k: (x / dil if isinstance(x, float) else x)
                                            for k, x in c["time_to_target_s"].items() if k in ("mean", "n")}


def time_to_target(curve, target):
    """Emulated seconds at which the validation curve first reaches `target` (linear between
    evaluation points), or None if it never does."""
    prev = None
    for p in curve:
        if p["val_loss"] <= target:
            if prev is None or prev["val_loss"] == p["val_loss"]:
                return p["t"]
            f = (prev["val_loss"] - target) / (prev["val_loss"] - p["val_loss"])
            return prev["t"] + f * (p["t"] - prev["t"])
        prev = p
    return None


def run_study(configs, a, title, command):
    check_target_rule(a.target_loss)
    em = emulation(a)
    # Configurations marked "optional" run only when named in --configs.
    names = a.configs.split(",") if a.configs else [n for n, c in configs.items() if not c.get("optional")]
    unknown = [n for n in names if n not in configs]
    if unknown:
        raise SystemExit(f"study: unknown configuration(s) {', '.join(unknown)}; choose from {', '.join(configs)}")
    for n in names:
        if configs[n].get("backup", 0) >= em["nodes"]:
            raise SystemExit(f"study: {n} uses {configs[n]['backup']} backup workers but there are only "
                             f"{em['nodes']} workers: at most workers - 1")
    grid = [float(x) for x in a.lr_grid.split(",")]
    job = {"nodes": em["nodes"], "servers": a.servers or em["nodes"], "steps": a.steps, "evals": a.evals,
           "preset": em["preset"], "batch": em["batch"], "warmup": a.warmup, "eval_batches": 4}
    os.makedirs(a.out, exist_ok=True)
    print(f"[study] {title}\n[study] emulation: {describe(em)}", flush=True)
    runs = {}  # (config, multiplier, seed) -> summary

    def run(name, mult, seed):
        key = (name, mult, seed)
        if key not in runs:
            out = os.path.join(a.out, "runs", name, f"lr{mult:g}", f"seed{seed}")
            # Seed 0 of each configuration's chosen rate records a timeline (linked from the report).
            r = run_once(name, configs[name], em, job, seed, a.base_lr * mult, out, a.max_overrun, a.max_cpu,
                         trace=seed == 0 and not getattr(a, "no_trace", False), backend=em["backend"])
            runs[key] = r
            if "failed" in r:
                print(f"[study] {name} lr x{mult:g} seed {seed}: FAILED ({r['failed']}); log {r['log']}", flush=True)
            else:
                print(f"[study] {name} lr x{mult:g} seed {seed}: final val {r['final_val_loss']:.4f}, "
                      f"{r['wall_s']:.1f} s, cpu {r['cpu_util'] or 0:.0%}, overrun {r['overrun_share']:.0%}"
                      f"{'' if r['valid'] else ' INVALID: ' + r['invalid_because']}", flush=True)
        return runs[key]

    def usable(r):
        return "failed" not in r and r["valid"]

    results = {}
    for name in names:
        sens = {}
        for mult in grid if len(grid) > 1 else []:
            r = run(name, mult, 0)
            sens[mult] = r["final_val_loss"] if usable(r) else None
        tried = {m: v for m, v in sens.items() if v is not None}
        best = min(tried, key=tried.get) if tried else grid[0] if len(grid) == 1 else 1.0
        rs = [run(name, best, s) for s in range(a.seeds)]
        results[name] = {"lr_multiplier": best, "lr": a.base_lr * best, "lr_sensitivity": sens,
                         "runs": {s: r for s, r in enumerate(rs)}}

    finals = {n: mean_ci95([r["final_val_loss"] for r in v["runs"].values() if usable(r)]) for n, v in results.items()}
    summary = {"title": title, "command": command, "emulation": em, "target_rule": a.target_loss,
               "seeds": a.seeds, "lr_grid": grid, "limits": {"overrun": a.max_overrun, "cpu": a.max_cpu},
               "configurations": {}}
    for name, v in results.items():
        ok = [r for r in v["runs"].values() if usable(r)]
        hist = {}
        for r in ok:
            for k, c in r["staleness_histogram"].items():
                hist[k] = hist.get(k, 0) + c
        c = {
            "lr": v["lr"], "lr_multiplier": v["lr_multiplier"],
            "lr_sensitivity": {f"{m:g}": x for m, x in v["lr_sensitivity"].items()},
            "valid_runs": len(ok), "runs_total": len(v["runs"]),
            "failed": [{"seed": s, "why": r["failed"], "log": r["log"]} for s, r in v["runs"].items() if "failed" in r],
            "invalid": [{"seed": s, "why": r["invalid_because"], "log": r["log"]}
                        for s, r in v["runs"].items() if "failed" not in r and not r["valid"]],
            "final_val_loss": finals[name],
            "tokens_per_s": mean_ci95([r["tokens_per_s"] for r in ok]),
            "wall_s": mean_ci95([r["wall_s"] for r in ok]),
            "bytes": mean_ci95([r.get("bytes", 0) for r in ok]),
            "bytes_received": mean_ci95([r.get("bytes_received", 0) for r in ok]),
            "staleness": {"mean": mean_ci95([r["staleness_mean"] for r in ok])["mean"],
                          "max": max([r["staleness_max"] for r in ok], default=None), "histogram": hist},
            "dropped_gradients": mean_ci95([r["dropped"] for r in ok])["mean"],
            "wait_share": mean_ci95([r["wait_share"] for r in ok])["mean"],
            "overrun_share": max([r["overrun_share"] for r in v["runs"].values() if "failed" not in r], default=None),
            "cpu_util": max([r["cpu_util"] or 0 for r in v["runs"].values() if "failed" not in r], default=None),
            "curves": {str(s): r["curve"] for s, r in v["runs"].items() if usable(r)},
            "trace": next((r["trace"] for r in v["runs"].values() if "trace" in r), None),
        }
        summary["configurations"][name] = c
    targets(summary)
    summary["conclusions"] = conclusions(summary)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    report = write_report(summary, a.out)
    plots(summary, a.out)
    if a.tensorboard:
        export_tensorboard(results, a.out)
    print(report)
    return summary


def mbytes(ci):
    """A mean byte count as MB, '-' where none was recorded (builds before the counter)."""
    return "-" if not ci or not ci.get("mean") else f"{ci['mean'] / 1e6:.1f}"


def describe(em):
    parts = [f"{em['nodes']} nodes, preset {em['preset']}, batch {em['batch']}/node"]
    parts.append(f"modelled step {em['step_time_s']:g} s" if em["step_time_s"] else "unpaced compute (no emulation)")
    if em["slow_node"] >= 0 and em["slowdown"] > 1:
        parts.append(f"node {em['slow_node']} {em['slowdown']:g}x slower")
    if em["jitter"]:
        parts.append(f"jitter: exponential, mean {em['jitter']:g} of the step")
    if em.get("backend") == "sim":
        parts.append(f"links {em['link_gbit'] or 10:.3g} Gbit/s, {em.get('latency_us', 50):g} us one way "
                     "(syncopate-sim: virtual time)")
    else:
        parts.append(f"links {em['link_gbit']:.3g} Gbit/s (network namespaces)" if em["link_gbit"] else "loopback links")
    if em.get("ratio") is not None:
        parts.append(f"stands for {em['name']}: comm/compute ratio {em['ratio']:.2f}, "
                     f"time dilation {em['dilation']:.3g} (emulated s per target s)")
    return "; ".join(parts)


def conclusions(summary):
    """Sentences that follow from the numbers: comparisons of time to target (configurations that
    reached it in every valid seed), of final validation loss at the shared budget and of
    throughput, each printed as a finding only where the 95% intervals separate."""
    cfgs = summary["configurations"]
    n = summary["seeds"]
    lines = []
    for k, c in cfgs.items():
        if c["valid_runs"] < c["runs_total"]:
            lines.append(f"{k}: {c['runs_total'] - c['valid_runs']} of {c['runs_total']} runs failed or were invalid "
                         f"(left out of every figure).")
        if c["valid_runs"] and c["time_to_target_s"]["reached"] < c["valid_runs"]:
            lines.append(f"{k}: reached the target in {c['time_to_target_s']['reached']} of {c['valid_runs']} valid runs.")

    def compare(key, label, lower_is_better, unit, complete):
        pool = {k: cfgs[k][key] for k in complete}
        if len(pool) < 2:
            return
        order = sorted(pool, key=lambda k: pool[k]["mean"], reverse=not lower_is_better)
        best, b = order[0], pool[order[0]]
        for k in order[1:]:
            o = pool[k]
            if separated(b, o):
                ratio = o["mean"] / b["mean"] if lower_is_better else b["mean"] / o["mean"]
                word = {"time_to_target_s": f"reaches the target {ratio:.2f}x sooner than",
                        "val_loss_at_equal_time": f"is {abs(o['mean'] - b['mean']):.3f} nats lower than",
                        "tokens_per_s": f"processes {ratio:.2f}x the tokens per second of"}[key]
                lines.append(f"{label}: {best} {word} {k} ({fmt_ci(b, 4)} vs {fmt_ci(o, 4)}{unit}; intervals separate).")
            else:
                lines.append(f"{label}: {best} vs {k} not resolved at {n} seeds ({fmt_ci(b, 4)} vs {fmt_ci(o, 4)}{unit}).")

    reached_all = [k for k, c in cfgs.items() if c["time_to_target_s"]["mean"] is not None
                   and c["time_to_target_s"]["reached"] == c["valid_runs"] >= 2]
    with_runs = [k for k, c in cfgs.items() if c["valid_runs"] >= 2]
    compare("time_to_target_s", "Time to target", True, " s", reached_all)
    if len(reached_all) < 2:
        lines.append("Time to target: fewer than two configurations reached it in every valid seed; compare the "
                     "reach counts above and the losses at the common time below.")
    compare("val_loss_at_equal_time", f"Validation loss at t = {summary['equal_time_s'] or 0:.1f} s (every run's "
            "curve reaches it)", True, "", with_runs)
    compare("tokens_per_s", "Throughput", False, " tokens/s", with_runs)
    return lines


def resummarize(summary, out):
    """Re-reads every kept valid run under OUT/runs/ (after a change of cluster_runs.summarize): its
    curve, throughput, wall time and bytes. Validity and failures stay as recorded."""
    nodes = summary["emulation"]["nodes"]
    for name, c in summary["configurations"].items():
        runs = {}
        for seed in c["curves"]:
            d = os.path.join(out, "runs", name, f"lr{c['lr_multiplier']:g}", f"seed{seed}")
            runs[seed] = summarize(d, nodes, ring=not server_stats(d))
        c["curves"] = {seed: r["curve"] for seed, r in runs.items()}
        for key in ("tokens_per_s", "wall_s", "bytes", "bytes_received"):
            c[key] = mean_ci95([r[key] for r in runs.values()])


def rebuild(out, target_rule=None, from_runs=False):
    """Rewrites OUT/report.md and the plots from OUT/summary.json (after a change of the report);
    target_rule ('best', 'all' or a loss) re-reads the runs against another target; from_runs
    re-reads every run's metrics first (resummarize)."""
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    if from_runs:
        resummarize(summary, out)
    if target_rule is not None:
        check_target_rule(target_rule)
        summary["target_rule"] = target_rule
    targets(summary)
    summary["conclusions"] = conclusions(summary)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    text = write_report(summary, out)
    plots(summary, out)
    return text


def write_report(summary, out):
    em = summary["emulation"]
    L = [f"# {summary['title']}", "", f"Command: `{summary['command']}`", "",
         f"Emulation: {describe(em)}.", "",
         f"Target validation loss: {summary['target_val_loss']:.4f} ("
         + ({"best": "1.02 x the best", "all": "1.02 x the worst"}[str(summary["target_rule"])]
            + f" configuration's mean validation loss at t = {summary['equal_time_s'] or 0:.1f} s, the earliest end of "
            "any run" + ("; a level every configuration reaches" if summary["target_rule"] == "all" else "")
            if str(summary["target_rule"]) in ("best", "all") else "given with --target-loss") + ")"
         if summary["target_val_loss"] else
         "Target validation loss: none (no valid run)",
         "",
         f"Every figure is a mean over the valid seeds with its 95% interval (Student's t, {summary['seeds']} seeds). "
         + ("Time is simulated seconds (syncopate-sim) on node 0's clock. " if em.get("backend") == "sim" else
          "Time is emulated seconds on node 0's clock with evaluation time removed. ")
         + (f"Each configuration's learning rate is the best of {', '.join(f'{m:g}x' for m in summary['lr_grid'])} the "
            "base rate on seed 0 under the same budget (final validation loss)" if len(summary["lr_grid"]) > 1 else
            "Learning rates were NOT tuned (a grid of one): every configuration uses the same rate, which favours "
            "whichever mode it happens to suit; the studies in docs/STUDY.md tune each one")
         + ". A configuration that waits for no straggler (ASP, BSP with backup workers) gets the synchronous job's "
         "wall time as its budget: its fast nodes do slowdown x the straggler's steps (waiting for each other they "
         "may end later than the synchronous job; losses are therefore compared at the common time, the earliest "
         "end of any run). "
         f"Runs whose emulation did not hold (overrun share > {summary['limits']['overrun']:.0%} "
         f"or CPU > {summary['limits']['cpu']:.0%}) are left out and listed.", "",
         f"| configuration | lr | valid runs | time to target, s | val loss at {summary['equal_time_s'] or 0:.0f} s | "
         "final val loss | tokens/s | MB sent (received) | staleness mean / max | dropped grads | wait share | overrun (max) | "
         "CPU (max) |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for k, c in summary["configurations"].items():
        t = c["time_to_target_s"]
        ttt = fmt_ci(t) + (f" ({t['reached']}/{c['valid_runs']})" if t["reached"] < c["valid_runs"] else "")
        tgt = c.get("time_to_target_target_s", {}).get("mean")
        ttt += f"; target {tgt:.3g} s" if isinstance(tgt, float) else ""
        st = c["staleness"]
        L.append(f"| {k} | {c['lr']:.2g} | {c['valid_runs']}/{c['runs_total']} | {ttt} | "
                 f"{fmt_ci(c['val_loss_at_equal_time'], 4)} | {fmt_ci(c['final_val_loss'], 4)} | "
                 f"{fmt_ci(c['tokens_per_s'])} | "
                 f"{mbytes(c.get('bytes'))} ({mbytes(c.get('bytes_received'))}) | "
                 f"{st['mean'] if st['mean'] is None else round(st['mean'], 2)} / "
                 f"{st['max'] if st['max'] is None else round(st['max'], 1)} | "
                 f"{'-' if not c['dropped_gradients'] else round(c['dropped_gradients'])} | "
                 f"{'-' if c['wait_share'] is None else format(c['wait_share'], '.0%')} | "
                 f"{'-' if c['overrun_share'] is None else format(c['overrun_share'], '.0%')} | "
                 f"{'-' if c['cpu_util'] is None else format(c['cpu_util'], '.0%')} |")
    L += ["", "## Conclusions", ""] + [f"- {x}" for x in summary["conclusions"]]
    if len(summary["lr_grid"]) > 1:
        L += ["", "## Learning-rate sensitivity (final validation loss, seed 0)", "",
              "| configuration | " + " | ".join(f"{m:g}x" for m in summary["lr_grid"]) + " |",
              "|---|" + "---|" * len(summary["lr_grid"])]
        for k, c in summary["configurations"].items():
            cells = [c["lr_sensitivity"].get(f"{m:g}") for m in summary["lr_grid"]]
            L.append(f"| {k} | " + " | ".join("-" if x is None else f"{x:.4f}" for x in cells) + " |")
    traced = {k: c["trace"] for k, c in summary["configurations"].items() if c.get("trace")}
    if traced:
        L += ["", "## Timelines", "",
              "One run per configuration (seed 0) with every process's timeline merged on one clock: the phases of "
              "each step, each bucket's reduction or each shard's push and pull, the servers' apply and wait in "
              "their consistency rule, the modelled compute's sleep. Open in https://ui.perfetto.dev; "
              "`scripts/merge_traces.py --summary` totals them.", ""]
        L += [f"- {k}: [{os.path.relpath(p, out)}]({os.path.relpath(p, out)})" for k, p in traced.items()]
    for k, c in summary["configurations"].items():
        for f in c["failed"] + c["invalid"]:
            L.append(f"\n{k} seed {f['seed']}: {f['why']} (log: {f['log']})")
    text = "\n".join(L) + "\n"
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


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
            curves = list(c["curves"].values())
            if not curves:
                continue
            npts = min(len(cv) for cv in curves)
            xs = [sum(cv[i].get(xkey, 0) for cv in curves) / len(curves) for i in range(npts)]
            stats = [mean_ci95([cv[i]["val_loss"] for cv in curves]) for i in range(npts)]
            i = list(cfgs).index(k)  # more configurations than the default cycle's 10 colours: tab20's
            line, = plt.plot(xs, [s["mean"] for s in stats], label=k, color=plt.cm.tab20.colors[(2 * i + i // 10) % 20],
                             linestyle="--" if k.endswith("_int8") else "-")
            lo = min(lo, min(s["mean"] for s in stats))
            hi = max(hi, stats[0]["mean"])
            if len(curves) > 1:
                plt.fill_between(xs, [s["ci95"][0] for s in stats], [s["ci95"][1] for s in stats],
                                 color=line.get_color(), alpha=0.2)
        if summary["target_val_loss"]:
            plt.axhline(summary["target_val_loss"], color="gray", linestyle=":", label="target")
        if lo < hi:
            plt.ylim(lo - 0.1, hi + 0.3)  # spikes above the first evaluation are clipped (see the report's table)
        save(fname, xlabel, "validation loss (mean, 95% band)")

    banded("t", "val_loss_vs_time.png", "emulated seconds (evaluation excluded)")
    banded("tokens", "val_loss_vs_tokens.png", "global tokens processed")
    if any(pt.get("bytes") for c in cfgs.values() for cv in c["curves"].values() for pt in cv):
        banded("bytes", "val_loss_vs_bytes.png", "bytes sent by all nodes (log scale)", log_x=True)
    names = [k for k, c in cfgs.items() if c["time_to_target_s"]["mean"] is not None]
    if names:
        plt.figure(figsize=(7, 4.5))
        m = [cfgs[k]["time_to_target_s"]["mean"] for k in names]
        err = [[x - cfgs[k]["time_to_target_s"]["ci95"][0] for k, x in zip(names, m)],
               [cfgs[k]["time_to_target_s"]["ci95"][1] - x for k, x in zip(names, m)]]
        plt.bar(names, m, yerr=err, capsize=4)
        plt.xticks(rotation=30, ha="right")
        save("time_to_target.png", "configuration", "emulated seconds to target (95% CI)", legend=False)
    plt.figure(figsize=(7, 4.5))
    for k, c in cfgs.items():
        h = c["staleness"]["histogram"]
        if h:
            ks = sorted(h, key=int)
            tot = sum(h.values())
            plt.plot([int(x) for x in ks], [h[x] / tot for x in ks], marker="o", label=k)
    save("staleness.png", "staleness (parameter versions)", "share of updates")
    if len(summary["lr_grid"]) > 1:
        plt.figure(figsize=(7, 4.5))
        for k, c in cfgs.items():
            pts = [(float(m), v) for m, v in c["lr_sensitivity"].items() if v is not None]
            if pts:
                plt.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=k)
        plt.xscale("log", base=2)
        save("lr_sensitivity.png", "learning-rate multiplier", "final validation loss (seed 0)")


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
    # python experiments/study.py OUT [--target-loss best|all|LOSS] [--from-runs]: rebuild OUT's report and
    # plots from its summary.json (another target re-reads the same runs; --from-runs their metrics too).
    ap = argparse.ArgumentParser(description="rebuild OUT/report.md and plots from OUT/summary.json")
    ap.add_argument("out")
    ap.add_argument("--target-loss", help="a number, 'best' or 'all' (default: the study's own rule)")
    ap.add_argument("--from-runs", action="store_true", help="re-read every run's metrics under OUT/runs/ first")
    args = ap.parse_args()
    print(rebuild(args.out, args.target_loss, args.from_runs))
