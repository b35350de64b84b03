"""The crossover atlas (issue 27): which synchronization reaches each of three targets first, per
cell N x communication/compute ratio x straggler pattern, in syncopate-sim's virtual time, every
cell a full study under the method of docs/STUDY.md (experiments/study.py): equal time budget,
schedules fitted to it, learning rates (and local SGD's outer lr) tuned per configuration and per
cell on a seed of their own, one held-out set, five headline seeds, paired comparisons with Holm.

  python experiments/atlas.py run   [--nodes 8] [--ratios 0.1,1,10] [--patterns none,slow,heavy]
                                    [--configs ...] [--seeds 5] [--steps 400] [--out docs/study/atlas/runs]
                                    [--dry-run]
  python experiments/atlas.py build [--out ...]    -> atlas.json, atlas.md, atlas.png next to runs/
  python experiments/atlas.py query --nodes 8 --ratio 1 --pattern slow

A cell: N workers computing a modelled STEP_S step of the `micro` model on BATCH sequences each; the
ratio r is the ring's time to move the gradient (float32, 2(N-1)/N of it each way) over one link
divided by that compute (0.1: compute-bound; 10: communication-bound); patterns:
  none   no straggler, no jitter;
  slow   the last node 3x slower, and exponential jitter of mean 0.2 on every node;
  heavy  heavy-tailed jitter on every node: Lomax of shape 1.5 (infinite variance), mean 0.3.
Parameter servers: one shard per worker, each on a link of the workers' rate.

Per N, first a reference (the ring alone, no straggler, at each ratio, token budget --steps per
node, seeds 500..502, lr tuned on 1000) fixes what every cell of that N is held to, before any
cell runs: the three targets (the reference ring's median validation loss at 1/5, 1/2 and 4/5 of its
steps: early, middle, late; the ring's loss per step does not depend on the ratio) and the cell's
wall-time budget (the reference ring's median end time at that ratio: --steps of a healthy ring).
In a cell with stragglers every configuration gets the healthy ring's time; a configuration that
has not reached a target by then is censored there.

The winner of a cell at a target is the configuration with the lowest median time to it (censored
runs count as not reached). It is compared with every other configuration, paired over the seeds,
Holm-corrected across those comparisons (method.comparisons); a censored time enters as the budget,
a lower bound of the real time, so the difference is understated and a comparison resolved with it
holds. The winner is "resolved" only where every comparison is; otherwise the cell says which
configurations are not resolved apart from it. Cells already run are kept (OUT/N<n>/r<r>_<pattern>/
summary.json) and skipped: the atlas is built across sessions; cells not run are listed as such.
"""
import argparse
import json
import math
import os
import statistics
import sys

import method
from ab_sync_async import CONFIGS as AB_CONFIGS
from ab_sync_async import PAIRS as AB_PAIRS
from cluster_runs import ROOT
from study import add_args, run_study

PRESET, BATCH, STEP_S, PARAMS = "micro", 2, 0.1, 124_672
PATTERNS = {
    "none": {},
    "slow": {"slow_last": True, "slowdown": 3.0, "jitter": 0.2},
    "heavy": {"jitter": 0.3, "jitter_tail": 1.5},
}
CONFIGS = ["ring", "bsp_backup", "ssp4", "asp_lr_scale", "diloco10", "async_diloco10"]
TARGET_FRACTIONS = (0.2, 0.5, 0.8)
TARGET_NAMES = ("early", "middle", "late")
REF_SEEDS, FIRST_REF_SEED, TUNING_SEED = 3, 500, 1000
TARGETS_RATIO = 0.1  # the reference whose ring curve sets an N's targets
DEFAULT_OUT = os.path.join(ROOT, "docs", "study", "atlas")


def link_gbit(n, ratio):
    """The link rate at which the ring's bytes per step (float32 gradient, 2(n-1)/n of it each way)
    take ratio x the modelled compute."""
    return 2 * (n - 1) / n * PARAMS * 4 * 8 / (ratio * STEP_S) / 1e9


def configs_for(n):
    """The configurations at N workers: backup workers N/8 (at least 1) for BSP."""
    out = {k: dict(v) for k, v in AB_CONFIGS.items()}
    b = max(1, n // 8)
    out["bsp_backup"]["cluster"] = ["--consistency", "bsp", "--backup-workers", str(b)]
    out["bsp_backup"]["backup"] = b
    return out


def cell_dir(out, n, ratio, pattern):
    return os.path.join(out, "runs", f"N{n}", f"r{ratio:g}_{pattern}")


def ref_dir(out, n, ratio):
    return os.path.join(out, "runs", f"N{n}", f"reference_r{ratio:g}")


def study_args(out, n, ratio, pattern, seeds, extra):
    ap = argparse.ArgumentParser()
    add_args(ap, "atlas")
    p = PATTERNS[pattern]
    argv = ["--backend", "sim", "--nodes", str(n), "--preset", PRESET, "--batch", str(BATCH),
            "--step-time", str(STEP_S), "--link-gbit", f"{link_gbit(n, ratio):.6g}", "--seeds", str(seeds),
            "--tuning-seeds", str(TUNING_SEED), "--lr-extend", "2", "--evals", "10", "--no-trace", "--out", out]
    if p.get("slow_last"):
        argv += ["--slow-node", str(n - 1), "--slowdown", str(p["slowdown"])]
    if p.get("jitter"):
        argv += ["--jitter", str(p["jitter"])]
    if p.get("jitter_tail"):
        argv += ["--jitter-tail", str(p["jitter_tail"])]
    return ap.parse_args(argv + extra)


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def reference(a, n, ratio):
    """The reference ring at (n, ratio): its summary (run now unless kept)."""
    out = ref_dir(a.out, n, ratio)
    s = load(os.path.join(out, "summary.json"))
    if s is None:
        args = study_args(out, n, ratio, "none", REF_SEEDS,
                          ["--configs", "ring", "--steps", str(a.steps), "--first-seed", str(FIRST_REF_SEED)])
        run_study(configs_for(n), args, f"Atlas reference N={n} r={ratio:g}",
                  f"python experiments/atlas.py run --nodes {n} --ratios {ratio:g} (reference)")
        s = load(os.path.join(out, "summary.json"))
    if s["job"]["steps"] != a.steps:
        raise SystemExit(f"atlas: the kept reference {out} ran {s['job']['steps']} steps per node, this call asks "
                         f"for {a.steps}: every cell of an N is held to one reference; pass --steps "
                         f"{s['job']['steps']} or another --out")
    return s


def held_to(a, n, refs):
    """The targets (from the reference ring at ratio TARGETS_RATIO, whatever ratios this call runs:
    every cell of an N is held to the same targets) and each ratio's time budget."""
    targets = method.targets_from_reference(reference(a, n, TARGETS_RATIO), "ring", TARGET_FRACTIONS)
    budgets = {}
    for r, s in refs.items():
        ends = [p["end_s"] for p in s["configurations"]["ring"]["per_seed"] if p.get("end_s")]
        budgets[r] = round(statistics.median(ends), 3)
    return targets, budgets


def cmd_run(a):
    names = a.configs.split(",")
    for n in a.nodes:
        refs = {}
        for r in a.ratios:
            if a.dry_run:
                print(f"[atlas] N={n} r={r:g}: reference ring, {a.steps} steps/node, seeds "
                      f"{FIRST_REF_SEED}..{FIRST_REF_SEED + REF_SEEDS - 1}, link {link_gbit(n, r):.4g} Gbit/s"
                      + (" (kept)" if load(os.path.join(ref_dir(a.out, n, r), "summary.json")) else ""))
                continue
            refs[r] = reference(a, n, r)
        if a.dry_run:
            for r in a.ratios:
                for pat in a.patterns:
                    kept = load(os.path.join(cell_dir(a.out, n, r, pat), "summary.json")) is not None
                    print(f"[atlas] N={n} r={r:g} {pat}: {', '.join(names)} x {a.seeds} seeds"
                          + (" (kept)" if kept else ""))
            continue
        targets, budgets = held_to(a, n, refs)
        print(f"[atlas] N={n}: targets {targets} (reference ring at {TARGET_FRACTIONS} of {a.steps} steps); "
              f"budgets {budgets} s", flush=True)
        for r in a.ratios:
            for pat in a.patterns:
                out = cell_dir(a.out, n, r, pat)
                kept = load(os.path.join(out, "summary.json"))
                if kept is not None:
                    if (kept["budget"]["value"] != budgets[r] or
                            [round(t, 4) for t in kept.get("targets") or []] != [round(t, 4) for t in targets]):
                        raise SystemExit(f"atlas: the kept cell {out} was held to budget {kept['budget']['value']} s and "
                                         f"targets {kept.get('targets')}, the reference now gives {budgets[r]} s and "
                                         f"{targets}: remove the cell to run it again")
                    print(f"[atlas] N={n} r={r:g} {pat}: kept", flush=True)
                    continue
                pairs = [(x, y) for x, y in AB_PAIRS if x in names and y in names]
                args = study_args(out, n, r, pat, a.seeds,
                                  ["--configs", ",".join(names), "--time-budget-s", f"{budgets[r]:g}",
                                   "--targets", ",".join(f"{t:g}" for t in targets)])
                run_study(configs_for(n), args, f"Atlas N={n} r={r:g} {pat}",
                          f"python experiments/atlas.py run --nodes {n} --ratios {r:g} --patterns {pat}", pairs)
    if not a.dry_run:
        cmd_build(a)


# ---------------------------------------------------------------------------------------------
# The atlas from the cells' summaries
# ---------------------------------------------------------------------------------------------

def median_time(per_seed, key):
    """Median time to target over seeds, censored runs as +inf (None when fewer than half reached)."""
    ts = sorted(math.inf if p.get("time_to_target_s", {}).get(key) is None else p["time_to_target_s"][key]
                for p in per_seed)
    if not ts:
        return None
    m = ts[(len(ts) - 1) // 2] if len(ts) % 2 else 0.5 * (ts[len(ts) // 2 - 1] + ts[len(ts) // 2])
    return None if math.isinf(m) else m


def winner_at(summary, key, budget):
    """The cell's winner at target `key`: the lowest median time; each other configuration compared
    with it paired over seeds (censored times entered as the budget, a lower bound), Holm across them."""
    cfgs = summary["configurations"]
    med = {k: median_time(c["per_seed"], key) for k, c in cfgs.items() if c.get("per_seed")}
    reached = {k: m for k, m in med.items() if m is not None}
    if not reached:
        return {"winner": None, "why": "no configuration reached it in half its seeds within the budget"}
    w = min(reached, key=reached.get)
    metric = "time_at_budget"
    bounded = {k: {"per_seed": [{"seed": p["seed"], metric: (p.get("time_to_target_s", {}).get(key)
                                                              if p.get("time_to_target_s", {}).get(key) is not None
                                                              else budget)} for p in c["per_seed"]]}
               for k, c in cfgs.items() if c.get("per_seed")}
    comps = method.comparisons(bounded, [(k, w) for k in bounded if k != w], [metric])
    others = sorted(((k, m) for k, m in med.items() if k != w), key=lambda x: math.inf if x[1] is None else x[1])
    runner = others[0] if others else None
    return {
        "winner": w, "median_s": reached[w],
        "runner_up": runner[0] if runner else None,
        "runner_up_ratio": (runner[1] / reached[w]) if runner and runner[1] is not None and reached[w] > 0 else None,
        "vs_ring_ratio": (med["ring"] / reached[w]) if med.get("ring") and reached[w] > 0 and w != "ring" else None,
        "resolved": bool(comps) and all(c["resolved"] for c in comps),
        "not_resolved_from": [c["a"] for c in comps if not c["resolved"]],
        "comparisons": [{k: c[k] for k in ("a", "b", "mean_diff", "ci95", "p_holm", "resolved", "n")} for c in comps],
        "medians_s": med,
    }


def cells(out):
    root = os.path.join(out, "runs")
    for nd in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        for cd in sorted(os.listdir(os.path.join(root, nd))):
            if cd.startswith("reference"):
                continue
            s = load(os.path.join(root, nd, cd, "summary.json"))
            if s is None:
                continue
            rpart, _, pat = cd.partition("_")
            yield int(nd[1:]), float(rpart[1:]), pat, s, os.path.join(root, nd, cd)


def cmd_build(a):
    records, table = [], []
    for n, r, pat, s, d in cells(a.out):
        budget = s.get("budget", {}).get("value")
        targets = s.get("targets") or []
        for name, c in s["configurations"].items():
            for p in c.get("per_seed", []):
                records.append({"nodes": n, "ratio": r, "pattern": pat, "config": name, "seed": p["seed"],
                                "lr": c.get("lr"), "time_to_target_s": p.get("time_to_target_s"),
                                "val_loss_at_budget": p.get("val_loss_at_budget"), "budget_s": budget,
                                "summary": os.path.relpath(os.path.join(d, "summary.json"), a.out)})
        for i, t in enumerate(targets):
            key = method.target_key(t)
            w = winner_at(s, key, budget)
            row = {"nodes": n, "ratio": r, "pattern": pat, "target": t,
                   "stage": TARGET_NAMES[i] if i < len(TARGET_NAMES) else key, "budget_s": budget, **w}
            row["sentence"] = cell_sentence(row, len(next(iter(s["configurations"].values()))["per_seed"]))
            table.append(row)
    doc = {"what": "one record per cell x configuration x seed; per cell and target the winner (experiments/atlas.py)",
           "preset": PRESET, "batch": BATCH, "step_s": STEP_S, "patterns": PATTERNS, "records": records,
           "winners": table}
    with open(os.path.join(a.out, "atlas.json"), "w") as f:
        json.dump(doc, f, indent=1)
    md = render(table)
    with open(os.path.join(a.out, "atlas.md"), "w") as f:
        f.write(md)
    picture(table, os.path.join(a.out, "atlas.png"))
    print(md)


def verdict(w):
    if w["winner"] is None:
        return w.get("why", "no winner")
    if w["resolved"]:
        return f"{w['winner']} (resolved)"
    return f"{w['winner']} not resolved from {', '.join(w['not_resolved_from'])}"


def cell_sentence(w, seeds):
    """One cell and target as the atlas states it (docs/STUDY.md quotes these; check_study.py)."""
    head = f"N={w['nodes']}, ratio {w['ratio']:g}, stragglers {w['pattern']}, {w['stage']} target {w['target']:g}"
    if w["winner"] is None:
        return f"{head}: {w.get('why', 'no winner')} ({seeds} seeds)."
    parts = [f"{head}: first {w['winner']}, median {w['median_s']:.3g} s of the {w['budget_s']:g} s budget"]
    if w.get("runner_up"):
        parts.append(f"runner-up {w['runner_up']}" + (f" at {w['runner_up_ratio']:.2f}x its time"
                                                      if w.get("runner_up_ratio") else " (did not reach it in half its seeds)"))
    if w.get("vs_ring_ratio"):
        parts.append(f"{w['vs_ring_ratio']:.2f}x sooner than the ring")
    elif w["winner"] != "ring" and w["medians_s"].get("ring") is None:
        parts.append("the ring did not reach it in half its seeds")
    tail = ("resolved against every other configuration (paired over "
            f"{seeds} seeds, Holm)" if w["resolved"] else
            f"not resolved from {', '.join(w['not_resolved_from'])} (paired over {seeds} seeds, Holm)")
    return "; ".join(parts) + f"; {tail}."


def render(table):
    L = ["# The crossover atlas (experiments/atlas.py build)", "",
         "| N | ratio | stragglers | target | winner | median s | runner-up | x runner-up | x ring |",
         "|---|---|---|---|---|---|---|---|---|"]
    for w in table:
        fx = (lambda v: "-" if v is None else f"{v:.2f}")
        L.append(f"| {w['nodes']} | {w['ratio']:g} | {w['pattern']} | {w['stage']} {w['target']:g} | {verdict(w)} | "
                 f"{fx(w.get('median_s'))} | {w.get('runner_up') or '-'} | {fx(w.get('runner_up_ratio'))} | "
                 f"{fx(w.get('vs_ring_ratio'))} |")
    return "\n".join(L) + "\n"


def picture(table, path):
    from plotting import pyplot
    plt = pyplot()
    if plt is None or not table:
        return
    from matplotlib.patches import Patch
    stages = [s for s in TARGET_NAMES if any(w["stage"] == s for w in table)]
    pats = [p for p in PATTERNS if any(w["pattern"] == p for w in table)]
    names = CONFIGS
    colors = {k: plt.cm.tab10(i) for i, k in enumerate(names)}
    fig, axes = plt.subplots(len(pats), len(stages), figsize=(3.2 * len(stages), 2.6 * len(pats)), squeeze=False)
    for i, pat in enumerate(pats):
        for j, st in enumerate(stages):
            ax = axes[i][j]
            sub = [w for w in table if w["pattern"] == pat and w["stage"] == st]
            ns = sorted({w["nodes"] for w in table})
            rs = sorted({w["ratio"] for w in table})
            for w in sub:
                x, y = rs.index(w["ratio"]), ns.index(w["nodes"])
                c = colors.get(w["winner"], (0.85, 0.85, 0.85, 1))
                ax.add_patch(plt.Rectangle((x, y), 1, 1, facecolor=c, edgecolor="white",
                                           hatch=None if w.get("resolved") else "///"))
            ax.set_xlim(0, len(rs)); ax.set_ylim(0, len(ns))
            ax.set_xticks([k + 0.5 for k in range(len(rs))], [f"{r:g}" for r in rs])
            ax.set_yticks([k + 0.5 for k in range(len(ns))], [str(n) for n in ns])
            ax.set_title(f"{pat}, {st} target", fontsize=9)
            if j == 0:
                ax.set_ylabel("N workers")
            if i == len(pats) - 1:
                ax.set_xlabel("comm / compute ratio")
    fig.legend(handles=[Patch(color=colors[k], label=k) for k in names] +
               [Patch(facecolor="white", edgecolor="k", hatch="///", label="not resolved")],
               loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)


def cmd_query(a):
    doc = load(os.path.join(a.out, "atlas.json"))
    if doc is None:
        raise SystemExit(f"atlas: no {a.out}/atlas.json: run `experiments/atlas.py build` (or run cells first)")
    rows = [w for w in doc["winners"] if w["nodes"] == a.nodes and w["ratio"] == a.ratio and w["pattern"] == a.pattern]
    if not rows:
        done = sorted({(w["nodes"], w["ratio"], w["pattern"]) for w in doc["winners"]})
        print(f"N={a.nodes}, ratio {a.ratio:g}, stragglers {a.pattern}: this cell was not measured. Measured cells: "
              + ("; ".join(f"N={n} r={r:g} {p}" for n, r, p in done) or "none"))
        return 1
    seeds = len({x["seed"] for x in doc["records"] if x["nodes"] == a.nodes and x["ratio"] == a.ratio
                 and x["pattern"] == a.pattern})
    print(f"N={a.nodes}, ratio {a.ratio:g}, stragglers {a.pattern} ({doc['preset']} model in syncopate-sim, {seeds} seeds):")
    for w in rows:
        extra = ""
        if w.get("winner") and w.get("vs_ring_ratio"):
            extra = f"; {w['vs_ring_ratio']:.2f}x sooner than the ring (medians)"
        elif w.get("winner") == "ring":
            extra = "; the ring itself"
        print(f"  {w['stage']} target {w['target']:g}: {verdict(w)}{extra}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the cells not kept yet (references first), then build")
    r.add_argument("--nodes", default="8", help="comma-separated worker counts")
    r.add_argument("--ratios", default="0.1,1,10")
    r.add_argument("--patterns", default="none,slow,heavy")
    r.add_argument("--configs", default=",".join(CONFIGS))
    r.add_argument("--seeds", type=int, default=5)
    r.add_argument("--steps", type=int, default=400, help="the reference ring's steps per node (sets the budgets)")
    r.add_argument("--dry-run", action="store_true")
    b = sub.add_parser("build", help="atlas.json, atlas.md and atlas.png from the cells run so far")
    q = sub.add_parser("query", help="which configuration for N nodes, this ratio and straggler pattern")
    q.add_argument("--nodes", type=int, required=True)
    q.add_argument("--ratio", type=float, required=True)
    q.add_argument("--pattern", choices=list(PATTERNS), required=True)
    for p in (r, b, q):
        p.add_argument("--out", default=DEFAULT_OUT)
    a = ap.parse_args()
    if a.cmd == "run":
        a.nodes = [int(x) for x in a.nodes.split(",")]
        a.ratios = sorted(float(x) for x in a.ratios.split(","))
        a.patterns = a.patterns.split(",")
        bad = [p for p in a.patterns if p not in PATTERNS] + [c for c in a.configs.split(",") if c not in AB_CONFIGS]
        if bad:
            raise SystemExit(f"atlas: unknown pattern(s) or configuration(s): {', '.join(bad)}")
        return cmd_run(a)
    if a.cmd == "build":
        return cmd_build(a)
    return cmd_query(a)


if __name__ == "__main__":
    sys.exit(main() or 0)
