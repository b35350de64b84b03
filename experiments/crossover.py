"""The crossover map: which synchronization reaches a target validation loss first, as the
cluster grows (N workers), its links slow down (ratio r) and stragglers get worse (slowdown s),
in syncopate-sim's virtual time (validated against the emulated cluster: docs/STUDY.md).

  python experiments/crossover.py [--nodes 8,64,256,1024] [--ratios 0.1,1,10] [--slowdowns 1,4]
        [--seeds 3] [--configs ring,bsp_backup,ssp4,asp_lr_scale,diloco10] [--out runs/crossover]

A cell is (N, r, s). Every worker computes a modelled 0.1 s step of the micro model on 2 sequences;
r is the link's time to move the model's bytes twice (what a ring or a parameter server moves per
step and worker) divided by the compute time, so r = 0.1 is compute-bound and r = 10
communication-bound; s: the highest-numbered eighth of the workers is s times slower (1 = none),
and every step has exponential jitter of mean 0.1. Parameter servers: K = min(N, 16) shards whose
links together carry what the workers' do (K x B_server = N x B). Each run stops at the target
loss (time to target) or at a simulated time limit of --limit x the ring's time in that cell.
Runs are cached under OUT/runs/, so the script can be called again with other cells (fewer seeds
for large N, say) and the map is redrawn from everything run so far. Configurations are compared
seed by seed (the same seed gives every configuration the same initialization, data order and
jitter draws): one is resolved behind the first when the paired difference is above 0 with a
Holm-corrected p < 0.05 (paired t over the seeds, Holm across the cell's comparisons with the
winner), otherwise the map says they are not resolved apart.

Before any run it prints the plan (runs to make, runs cached) and an upper bound of their cost from
this machine's measurements (experiments/cost.py); --dry-run prints every run and exits.

Writes OUT/crossover.json, OUT/report.md, OUT/crossover_N<n>.png heatmaps and OUT/ttt_vs_n.png.
"""
import argparse
import json
import math
import os
import sys

import cost
from cluster_runs import ROOT, exit_on_sigterm, run_simulator, sim_binary
from stats import fmt_ci, holm, mean_ci95
from stats import paired as stats_paired
from study import time_to_target
from plotting import pyplot

PRESET, PARAMS, BATCH, STEP_S, JITTER = "micro", 124_672, 2, 0.1, 0.1
EVAL_BATCHES = 32  # 64 held-out sequences per evaluation: the crossing time is not the evaluation's noise
CONFIGS = {  # name: (syncopate-sim flags, learning rate)
    "ring": (["--dist.mode=ring", "--dist.clip_scope=node"], 2e-3),
    "bsp_backup": (["--dist.mode=ps", "--ps.consistency=bsp", "--ps.backup_workers={backup}"], 2e-3),
    "ssp4": (["--dist.mode=ps", "--ps.consistency=ssp", "--ps.staleness_bound=4"], 1e-3),
    "asp_lr_scale": (["--dist.mode=ps", "--ps.consistency=asp", "--ps.mitigation=lr_scale"], 2e-3),
    "diloco10": (["--dist.mode=ring", "--dist.sync_every=10", "--dist.outer=nesterov"], 2e-3),
}


def link_gbit(ratio):
    """The link rate at which moving the model's float32 bytes twice takes ratio x the step's compute."""
    return 2 * PARAMS * 4 * 8 / (ratio * STEP_S) / 1e9


def command(name, n, ratio, slowdown, seed, out, a, limit_s):
    flags, lr = CONFIGS[name]
    k = min(n, 16)
    cmd = [sim_binary(), "--out", out, "--quiet", f"--sim.workers={n}",
           f"--sim.servers={k}", f"--sim.link_gbit={link_gbit(ratio):.6g}",
           f"--sim.server_link_gbit={link_gbit(ratio) * n / k:.6g}", f"--sim.target_loss={a.target}",
           f"--model.preset={PRESET}", f"--train.batch_size={BATCH}", f"--train.steps={a.steps}", "--train.threads=1",
           f"--train.seed={seed}", f"--optim.lr={lr:g}", f"--schedule.min_lr={lr / 10:g}", "--schedule.warmup_steps=5",
           f"--eval.every={a.eval_every}", f"--eval.batches={EVAL_BATCHES}", f"--emulate.step_time_s={STEP_S}",
           f"--emulate.jitter={JITTER}", f"--data.cache_dir={ROOT}/data/cache"]
    if slowdown > 1:
        cmd += [f"--sim.slow_share={1 / 8}", f"--emulate.slowdown={slowdown:g}"]
    if limit_s:
        cmd += [f"--sim.time_limit_s={limit_s:.6g}"]
    return cmd + [f.format(backup=max(1, n // 8)) for f in flags]


def run_dir(a, name, n, ratio, slowdown, seed):
    return os.path.join(a.out, "runs", f"N{n}", f"r{ratio:g}_s{slowdown:g}", name, f"seed{seed}")


def plan(a, names, nodes, ratios, slows, m):
    """Every run main() makes, in its order: (n, ratio, slowdown, config, seed, cached, estimated
    seconds at most). A run stops at the target or the time limit, so its estimate is the bound:
    every worker doing --steps steps (cost.run_s on the simulator backend)."""
    rows = []
    em = {"step_time_s": STEP_S, "jitter": JITTER, "slow_node": -1, "slowdown": 1.0}
    for n in nodes:
        for ratio in ratios:
            for slow in slows:
                for seed in range(a.seeds):
                    for name in ["ring"] + [x for x in names if x != "ring"]:
                        cached = os.path.exists(os.path.join(run_dir(a, name, n, ratio, slow, seed), "result.json"))
                        est, _ = cost.run_s("sim", em, a.steps, None, True, n, a.steps // a.eval_every + 1,
                                            EVAL_BATCHES * BATCH, m, CONFIGS[name][0][0] == "--dist.mode=ring")
                        rows.append((n, ratio, slow, name, seed, cached, est))
    return rows


def print_plan(rows, m, dry, steps):
    todo = [r for r in rows if not r[5]]
    est = None if any(r[6] is None for r in todo) else sum(r[6] for r in todo)
    L = [f"plan: {len(rows)} runs ({len({r[:3] for r in rows})} cells x seeds x configurations, the ring in every "
         f"cell for the time limit), {len(rows) - len(todo)} cached, {len(todo)} to run, one at a time",
         (f"estimated cost: at most ~{cost.minutes(est)} min (every run stops at the target or the time limit; "
          "the bound counts every worker's --steps steps)" if est is not None else
          "estimated cost: not available: a part below is not measured yet"),
         "  based on: " + "; ".join(m.basis())]
    if dry:
        L.append("dry run: the runs, in order (nothing started, nothing written):")
        L += [f"  N={n} r={ratio:g} s={slow:g} {name} seed {seed}: "
              + ("cached" if cached else f"lr {CONFIGS[name][1]:g}, at most {steps} steps/worker, at most "
                 f"~{cost.minutes(e)} min") for n, ratio, slow, name, seed, cached, e in rows]
        L.append("dry run: exit without starting anything (drop --dry-run to run)")
    print("\n".join(f"[crossover] {x}" for x in L), flush=True)



def run(name, n, ratio, slowdown, seed, a, limit_s=0):
    out = run_dir(a, name, n, ratio, slowdown, seed)
    done = os.path.join(out, "result.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    os.makedirs(out, exist_ok=True)
    cmd = command(name, n, ratio, slowdown, seed, out, a, limit_s)
    sim, evals, real_s = run_simulator(cmd, out, f"crossover: {name} N={n} r={ratio} s={slowdown} seed {seed}")
    # The simulator stops at the first evaluation at or below the target; the crossing itself is
    # placed linearly between that evaluation and the one before (as the studies do).
    curve = [{"t": m["time_s"], "val_loss": m["val_loss"]} for m in evals]
    r = {"config": name, "n": n, "ratio": ratio, "slowdown": slowdown, "seed": seed,
         "time_to_target_s": time_to_target(curve, a.target) if sim["target_reached_s"] >= 0 else None,
         "simulated_s": sim["simulated_s"], "worker_steps": sim["worker_steps"], "real_s": real_s,
         "limit_s": limit_s, "final_val_loss": evals[-1]["val_loss"] if evals else None,
         "command": " ".join(cmd)}
    with open(done, "w") as f:
        json.dump(r, f)
    print(f"[crossover] N={n} r={ratio:g} s={slowdown:g} {name} seed {seed}: "
          f"{'target at %.2f s' % r['time_to_target_s'] if r['time_to_target_s'] else 'not reached by %.2f s' % r['simulated_s']}"
          f" ({r['worker_steps']} worker-steps, {r['real_s']:.0f} s real)", flush=True)
    return r


def collect(out):
    """Every cached run, grouped by cell and configuration."""
    cells = {}
    root = os.path.join(out, "runs")
    for dirpath, _, files in os.walk(root):
        if "result.json" in files:
            with open(os.path.join(dirpath, "result.json")) as f:
                r = json.load(f)
            cells.setdefault((r["n"], r["ratio"], r["slowdown"]), {}).setdefault(r["config"], []).append(r)
    return cells


def paired(cell, w, other):
    """`other` minus the winner `w`, seed by seed (same initialization, data order and jitter draws: a
    paired comparison), as a mean with its 95% interval and the paired t test's two-sided p; a seed
    where `other` missed the target counts at the time limit it ran to (a lower bound of its time)."""
    tw = {r["seed"]: r["time_to_target_s"] for r in cell[w]}
    d = []
    for r in cell[other]:
        if r["seed"] in tw and tw[r["seed"]] is not None:
            t = r["time_to_target_s"] if r["time_to_target_s"] is not None else r["simulated_s"]
            d.append(t - tw[r["seed"]])
    return dict(mean_ci95(d), p=stats_paired(dict(enumerate(d)), {i: 0.0 for i in range(len(d))})["p"])


def judge(cell):
    """The winner of a cell: lowest mean time to target among configurations that reached it in
    every seed. Another configuration is resolved behind it when their paired difference (seed by
    seed; a missed target counts at the time limit) is above 0 with a Holm-corrected p < 0.05 (Holm
    across the cell's comparisons with the winner), else tied with it; the cell is resolved when
    none is tied."""
    stats = {}
    for name, rs in cell.items():
        t = [r["time_to_target_s"] for r in rs]
        stats[name] = dict(mean_ci95([x for x in t if x is not None], lower=0.0), reached=sum(x is not None for x in t),
                           seeds=len(t))
    full = {k: s for k, s in stats.items() if s["reached"] == s["seeds"] and s["mean"] is not None}
    if not full:
        return {"winner": None, "stats": stats, "resolved": False}
    w = min(full, key=lambda k: full[k]["mean"])
    seeds = full[w]["seeds"]
    others = [k for k in stats if k != w]
    if not others:
        return {"winner": w, "resolved": False, "stats": stats, "seeds": seeds}
    diffs = {k: paired(cell, w, k) for k in others}
    for k, ph in zip(others, holm([diffs[k]["p"] for k in others])):
        diffs[k]["p_holm"] = ph
    behind = [k for k in others if diffs[k]["n"] >= 2 and diffs[k]["mean"] > 0 and diffs[k]["p_holm"] is not None
              and diffs[k]["p_holm"] < 0.05]
    tied = [k for k in others if k not in behind]  # not resolved behind the winner at these seeds
    return {"winner": w, "resolved": not tied, "tied": tied, "behind": behind,
            "stats": stats, "seeds": seeds, "paired_vs_winner": diffs}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="8,64,256,1024")
    ap.add_argument("--ratios", default="0.1,1,10", help="link time of the model's bytes twice / compute time")
    ap.add_argument("--slowdowns", default="1,4", help="the slowest eighth's factor (1: no straggler)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--target", type=float, default=3.2, help="validation loss to reach")
    ap.add_argument("--steps", type=int, default=150, help="steps per worker at most (the schedule's length)")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--limit", type=float, default=3.0, help="time limit: this x the ring's time in the cell")
    ap.add_argument("--report-only", action="store_true", help="redraw the report and plots from the cached runs")
    ap.add_argument("--dry-run", action="store_true",
                    help="print every run (cell, configuration, seed, steps) and the estimated cost, then exit: starts "
                    "no process, writes nothing")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "crossover"))
    a = ap.parse_args()
    names = a.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise SystemExit(f"crossover: unknown configuration(s) {', '.join(unknown)}; choose from {', '.join(CONFIGS)}")
    nodes = [int(x) for x in a.nodes.split(",")]
    if any(not 1 <= n <= 4096 for n in nodes):
        raise SystemExit("crossover: --nodes must lie in 1..4096")
    ratios, slows = [float(x) for x in a.ratios.split(",")], [float(x) for x in a.slowdowns.split(",")]
    if any(r <= 0 for r in ratios) or any(s < 1 for s in slows):
        raise SystemExit("crossover: ratios must be > 0 and slowdowns >= 1")
    if not a.report_only:
        measured = [] if a.dry_run else cost.ensure_measured(PRESET, BATCH, EVAL_BATCHES * BATCH, a.out)
        m = cost.Measurements(PRESET, BATCH, "sim")
        if measured:
            print(f"[crossover] measured first: {', '.join(measured)}", flush=True)
        print_plan(plan(a, names, nodes, ratios, slows, m), m, a.dry_run, a.steps)
        if a.dry_run:
            return
    elif a.dry_run:
        print("[crossover] dry run: --report-only starts no run; it rewrites the report and plots")
        return
    os.makedirs(a.out, exist_ok=True)
    if not a.report_only:
        for n in nodes:
            for ratio in ratios:
                for slow in slows:
                    for seed in range(a.seeds):
                        ring = run("ring", n, ratio, slow, seed, a)
                        limit = a.limit * (ring["time_to_target_s"] or ring["simulated_s"])
                        for name in names:
                            if name != "ring":
                                run(name, n, ratio, slow, seed, a, limit)
    cells = collect(a.out)
    result = {"command": "python experiments/crossover.py " + " ".join(sys.argv[1:]), "target": a.target,
              "cells": [dict(n=n, ratio=r, slowdown=s, **judge(c)) for (n, r, s), c in sorted(cells.items())]}
    with open(os.path.join(a.out, "crossover.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(report(result, a.out))
    plots(result, a.out)


def report(res, out):
    L = ["# Crossover map (syncopate-sim)", "", f"Command(s): `{res['command']}` (runs cached; see crossover.py)", "",
         f"Target validation loss {res['target']}; micro model, 2 sequences x 64 tokens per worker-step, modelled step "
         f"{STEP_S} s with jitter {JITTER}; validation on {EVAL_BATCHES} x {BATCH} held-out sequences every "
         "5 steps of worker 0 (DiLoCo: worker 0's own weights, mid-round its inner model, as the trainer evaluates), "
         "the crossing placed linearly between evaluations. First: lowest mean simulated time to target among "
         "configurations that reached it in every seed. Another is resolved behind it when their difference, paired "
         "seed by seed (same initialization, data order and jitter draws; a missed target counts at the time limit), "
         "is above 0 with a Holm-corrected p < 0.05 (paired t, Holm across the cell); otherwise it is not resolved behind it at these seeds.", "",
         "| N | ratio r | slowdown s | seeds | first | not resolved behind it | resolved behind it | time to target per configuration, s (reached) |",
         "|---|---|---|---|---|---|---|---|"]
    for c in res["cells"]:
        per = "; ".join(f"{k} {fmt_ci(s, 3)} ({s['reached']}/{s['seeds']})" for k, s in c["stats"].items())
        L.append(f"| {c['n']} | {c['ratio']:g} | {c['slowdown']:g} | {c.get('seeds', '-')} | {c['winner'] or 'none'} | "
                 f"{', '.join(c.get('tied', [])) or '-'} | {', '.join(c.get('behind', [])) or '-'} | {per} |")
    L += ["", "Paired differences to the winner (other minus winner, seconds, 95% interval over seeds):", ""]
    for c in res["cells"]:
        if c.get("paired_vs_winner"):
            L.append(f"- N={c['n']} r={c['ratio']:g} s={c['slowdown']:g}, {c['winner']} ahead of: " + "; ".join(
                f"{k} by {fmt_ci(d, 3)}" for k, d in sorted(c["paired_vs_winner"].items(),
                                                         key=lambda kv: kv[1]["mean"] if kv[1]["mean"] is not None else 1e30)))
    text = "\n".join(L) + "\n"
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


def plots(res, out):
    plt = pyplot()
    if plt is None:
        return
    names = list(CONFIGS)
    colors = {k: plt.cm.tab10(i) for i, k in enumerate(names)}
    ns = sorted({c["n"] for c in res["cells"]})
    fig, axes = plt.subplots(1, len(ns), figsize=(3.3 * len(ns), 3.2), squeeze=False)
    for ax, n in zip(axes[0], ns):
        cs = [c for c in res["cells"] if c["n"] == n]
        rs, ss = sorted({c["ratio"] for c in cs}), sorted({c["slowdown"] for c in cs})
        for c in cs:
            x, y = rs.index(c["ratio"]), ss.index(c["slowdown"])
            col = colors.get(c["winner"], (0.9, 0.9, 0.9, 1))
            ax.add_patch(plt.Rectangle((x - 0.5, y - 0.5), 1, 1, color=col, alpha=1.0 if c["resolved"] else 0.45))
            tied = c.get("tied", [])
            label = (c["winner"] or "none") + (f"\n= {', '.join(tied[:2])}" + ("..." if len(tied) > 2 else "") if tied else "") \
                + f"\n{c.get('seeds', 0)} seed(s)"
            ax.text(x, y, label, ha="center", va="center", fontsize=7)
        ax.set_xlim(-0.5, len(rs) - 0.5)
        ax.set_ylim(-0.5, len(ss) - 0.5)
        ax.set_xticks(range(len(rs)), [f"{r:g}" for r in rs])
        ax.set_yticks(range(len(ss)), [f"{s:g}x" for s in ss])
        ax.set_xlabel("link ratio r (comm / compute)")
        ax.set_title(f"N = {n}", fontsize=10)
    axes[0][0].set_ylabel("straggler slowdown (1/8 of workers)")
    fig.suptitle("first to the target; '= x': x not resolved behind it (paired, 95%); faded: some tie", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "crossover.png"), dpi=100)
    plt.close(fig)
    keys = sorted({(c["ratio"], c["slowdown"]) for c in res["cells"]})
    fig, axes = plt.subplots(1, len(keys), figsize=(3.3 * len(keys), 3.2), squeeze=False, sharey=True)
    for ax, (r, s) in zip(axes[0], keys):
        for name in names:
            pts = [(c["n"], c["stats"][name]) for c in res["cells"]
                   if c["ratio"] == r and c["slowdown"] == s and name in c["stats"]
                   and c["stats"][name]["reached"] == c["stats"][name]["seeds"] and c["stats"][name]["mean"]]
            if pts:
                ax.plot([p[0] for p in pts], [p[1]["mean"] for p in pts], marker="o", color=colors[name], label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"r = {r:g}, s = {s:g}", fontsize=9)
        ax.set_xlabel("workers N")
    axes[0][0].set_ylabel("simulated seconds to target")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ttt_vs_n.png"), dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    exit_on_sigterm()
    main()
