"""The crossover atlas (issue 27): which synchronization reaches each of three targets first, per
cell N x communication/compute ratio x straggler pattern, in syncopate-sim's virtual time, every
cell a full study under the method of docs/STUDY.md (experiments/study.py): equal time budget,
schedules fitted to it, learning rates (and local SGD's outer lr) tuned per configuration and per
cell on a seed of their own, one held-out set, five headline seeds, paired comparisons with Holm.

  python experiments/atlas.py run   [--nodes 8] [--ratios 0.1,1,10] [--patterns none,slow,heavy]
                                    [--configs ...] [--seeds 5] [--steps 300] [--out docs/study/atlas]
                                    [--runs runs/atlas] [--dry-run]
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
runs count as not reached), among the atlas's configurations (CONFIGS; a cell that also ran others
for the published claims, e.g. plain asp and asp_dc_asgd, keeps them out of this family). It is compared with every other configuration, paired over the seeds,
Holm-corrected across those comparisons (method.comparisons); a censored time enters as the budget,
a lower bound of the real time, so the difference is understated and a comparison resolved with it
holds; a comparison must also resolve with the winner's crossings moved to the end of their
evaluation brackets and the other's to the start (interpolation between sparse evaluations of a
convex curve places a crossing late). The winner is "resolved" only where every comparison is;
otherwise the cell says which configurations are not resolved apart from it. Cells already run are kept (OUT/cells/N<n>/r<r>_<pattern>/
summary.json, with the report and plot; every run's files under --runs, not kept in git) and
skipped: the atlas is built across sessions; cells not run are listed as such.
"""
import argparse
import json
import math
import os
import statistics
import sys

import method
from stats import median_censored
from ab_sync_async import CONFIGS as AB_CONFIGS
from ab_sync_async import PAIRS as AB_PAIRS
from cluster_runs import ROOT, exit_on_sigterm
from study import add_args, run_study

PRESET, BATCH, STEP_S, PARAMS = "micro", 2, 0.1, 124_672
PATTERNS = {
    "none": {},
    "slow": {"slow_last": True, "slowdown": 3.0, "jitter": 0.2},
    "heavy": {"jitter": 0.3, "jitter_tail": 1.5},
}
CONFIGS = ["ring", "bsp_backup", "ssp4", "asp_lr_scale", "diloco10", "async_diloco10"]
TARGET_FRACTIONS = (0.2, 0.5, 0.8)
DESIGN_RATIOS = (0.1, 1.0, 10.0)  # the atlas's ratios (the picture shows the ones not run as white)
TARGET_NAMES = ("early", "middle", "late")
REF_SEEDS, FIRST_REF_SEED, TUNING_SEED = 3, 500, 1000
TARGETS_RATIO = 0.1  # the reference whose ring curve sets an N's targets
DEFAULT_OUT = os.path.join(ROOT, "docs", "study", "atlas")   # what is published: atlas.*, cells/, references/
DEFAULT_RUNS = os.path.join(ROOT, "runs", "atlas")          # every run's files (not kept in git)
PUBLISHED = ("summary.json", "report.md", "val_loss_vs_time.png")


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


def cell_name(n, ratio, pattern):
    return os.path.join(f"N{n}", f"r{ratio:g}_{pattern}")


def ref_name(n, ratio):
    return os.path.join(f"N{n}", f"r{ratio:g}")


def cell_dir(out, n, ratio, pattern):
    """A cell's published summary, report and plot (OUT/cells/N<n>/r<r>_<pattern>/)."""
    return os.path.join(out, "cells", cell_name(n, ratio, pattern))


def ref_dir(out, n, ratio):
    return os.path.join(out, "references", ref_name(n, ratio))


def publish(study_out, dest):
    """Copies a finished study's summary, report and plot where the atlas keeps them (atomically per
    file, summary.json last: a cell is kept once its summary is there)."""
    import shutil
    os.makedirs(dest, exist_ok=True)
    for name in sorted(PUBLISHED, key=lambda x: x == "summary.json"):
        src = os.path.join(study_out, name)
        if os.path.exists(src):
            tmp = os.path.join(dest, f".{name}.tmp{os.getpid()}")
            shutil.copyfile(src, tmp)
            os.replace(tmp, os.path.join(dest, name))


def schedule_of(summary):
    """How a cell's runs were scheduled (study.py --schedule-by): "time" or "steps"."""
    return "time" if summary.get("job", {}).get("time_schedule_s") else "steps"


def check_schedule(kept, out, schedule_by):
    """Refuses to keep a cell made by the other schedule (--schedule-by) than this run asks for: a rerun
    would otherwise pass it off as its own."""
    kept_by = schedule_of(kept)
    if kept_by != schedule_by:
        raise SystemExit(f"atlas: the kept cell {out} was scheduled by {kept_by}, this run asks for --schedule-by "
                         f"{schedule_by}: remove the cell to run it again, or ask for --schedule-by {kept_by}")


def study_args(out, n, ratio, pattern, seeds, extra, evals=10, tuning_seeds=str(TUNING_SEED)):
    """study.py's arguments for one cell (or reference). evals and tuning_seeds: the references and the cells of
    sessions 29-36 ran 10 evaluations and one tuning seed (1000); later cells take atlas.py run's --evals and
    --tuning-seeds (each cell's summary records its own)."""
    ap = argparse.ArgumentParser()
    add_args(ap, "atlas")
    p = PATTERNS[pattern]
    argv = ["--backend", "sim", "--nodes", str(n), "--preset", PRESET, "--batch", str(BATCH),
            "--step-time", str(STEP_S), "--link-gbit", f"{link_gbit(n, ratio):.6g}", "--seeds", str(seeds),
            "--tuning-seeds", tuning_seeds, "--lr-extend", "2", "--evals", str(evals), "--no-trace", "--no-overlap",
            "--out", out]
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
        work = os.path.join(a.runs, "references", ref_name(n, ratio))
        args = study_args(work, n, ratio, "none", REF_SEEDS,
                          ["--configs", "ring", "--steps", str(a.steps), "--first-seed", str(FIRST_REF_SEED)])
        run_study(configs_for(n), args, f"Atlas reference N={n} r={ratio:g}",
                  f"python experiments/atlas.py run --nodes {n} --ratios {ratio:g} (reference)")
        publish(work, out)
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
    if len(targets) != len(TARGET_FRACTIONS):
        raise SystemExit(f"atlas: the reference ring at N={n} gives the targets {targets}, not {len(TARGET_FRACTIONS)} "
                         "distinct losses (a flat curve): give it more --steps")
    budgets = {}
    for r, s in refs.items():
        ends = [p["end_s"] for p in s["configurations"]["ring"]["per_seed"] if p.get("end_s")]
        budgets[r] = round(statistics.median(ends), 3)
    return targets, budgets


def cmd_run(a):
    names = a.configs.split(",")
    for n in a.nodes:
        refs = {}
        for r in sorted(set(a.ratios) | {TARGETS_RATIO}) if a.dry_run else a.ratios:
            if a.dry_run:
                print(f"[atlas] N={n} r={r:g}: reference ring, {a.steps} steps/node, seeds "
                      f"{FIRST_REF_SEED}..{FIRST_REF_SEED + REF_SEEDS - 1}, link {link_gbit(n, r):.4g} Gbit/s"
                      + (" (kept)" if load(os.path.join(ref_dir(a.out, n, r), "summary.json")) else ""))
                continue
            refs[r] = reference(a, n, r)
        if a.dry_run:
            for r in a.ratios:
                for pat in a.patterns:
                    kept = load(os.path.join(cell_dir(a.out, n, r, pat), "summary.json"))
                    if kept is not None:
                        check_schedule(kept, cell_dir(a.out, n, r, pat), a.schedule_by)
                    print(f"[atlas] N={n} r={r:g} {pat}: {', '.join(names)} x {a.seeds} seeds"
                          + (" (kept)" if kept is not None else ""))
            continue
        if a.make_only and not all(load(os.path.join(ref_dir(a.out, n, r), "summary.json")) for r in
                                   set(a.ratios) | {TARGETS_RATIO}):
            raise SystemExit(f"atlas: --make-only needs N={n}'s references published first (a reference is one "
                             "configuration, made by one process): run the same command without --make-only")
        targets, budgets = held_to(a, n, refs)
        print(f"[atlas] N={n}: targets {targets} (reference ring at {TARGET_FRACTIONS} of {a.steps} steps); "
              f"budgets {budgets} s", flush=True)
        for r in a.ratios:
            for pat in a.patterns:
                out = cell_dir(a.out, n, r, pat)
                kept = load(os.path.join(out, "summary.json"))
                if kept is not None:
                    if (not math.isclose(kept["budget"]["value"], budgets[r], rel_tol=1e-6) or
                            [round(t, 4) for t in kept.get("targets") or []] != [round(t, 4) for t in targets]):
                        raise SystemExit(f"atlas: the kept cell {out} was held to budget {kept['budget']['value']} s and "
                                         f"targets {kept.get('targets')}, the reference now gives {budgets[r]} s and "
                                         f"{targets}: remove the cell to run it again")
                    check_schedule(kept, out, a.schedule_by)
                    print(f"[atlas] N={n} r={r:g} {pat}: kept", flush=True)
                    continue
                pairs = [(x, y) for x, y in AB_PAIRS if x in names and y in names]
                work = os.path.join(a.runs, "cells", cell_name(n, r, pat))
                args = study_args(work, n, r, pat, a.seeds,
                                  ["--configs", ",".join(names), "--time-budget-s", repr(budgets[r]),
                                   "--targets", ",".join(f"{t:g}" for t in targets), "--schedule-by", a.schedule_by]
                                  + (["--make-only", a.make_only] if a.make_only else []), a.evals, a.tuning_seeds)
                run_study(configs_for(n), args, f"Atlas N={n} r={r:g} {pat}",
                          f"python experiments/atlas.py run --nodes {n} --ratios {r:g} --patterns {pat} "
                          f"--configs {','.join(names)} --seeds {a.seeds} --steps {a.steps} --evals {a.evals} "
                          f"--tuning-seeds {a.tuning_seeds}" + (" --schedule-by time" if a.schedule_by == "time" else ""),
                          pairs)
                if a.make_only:
                    continue  # a lane: the cell is published by the invocation without --make-only
                publish(work, out)
    if not a.dry_run and not a.make_only:
        cmd_build(a)


# ---------------------------------------------------------------------------------------------
# The atlas from the cells' summaries
# ---------------------------------------------------------------------------------------------

def seed_times(summary, cfg, key, budget):
    """{seed: time to target `key`} over every headline seed of the study; None where the seed did not
    reach it within the budget: not reached at all, reached after the budget (a schedule that ran
    long must not count), or the run failed (a diverged run is not a faster one)."""
    seeds = summary.get("seeds") or sorted({p["seed"] for c in summary["configurations"].values()
                                            for p in c.get("per_seed", [])})
    by = {p["seed"]: p for p in cfg.get("per_seed", [])}
    out = {}
    for sd in seeds:
        t = (by.get(sd, {}).get("time_to_target_s") or {}).get(key)
        out[sd] = t if t is not None and t <= budget * (1 + method.BUDGET_TOLERANCE) else None
    return out


def entered(summary, cfg, key, budget, side=None):
    """{seed: (time entered for a paired comparison, its evaluation bracket or None)}: a censored seed
    (seed_times) enters as the budget, a lower bound of its time. side "late" / "early": a reached
    crossing moved to the end (at most the budget) / start of its evaluation bracket, the worst case
    of the interpolation between evaluations."""
    by = {p["seed"]: p for p in cfg.get("per_seed", [])}
    out = {}
    for sd, t in seed_times(summary, cfg, key, budget).items():
        br = (by.get(sd, {}).get("time_to_target_bracket_s") or {}).get(key) if t is not None else None
        v = budget if t is None else t
        if br and side:
            v = min(br[1], budget) if side == "late" else br[0]
        out[sd] = (v, br)
    return out


def median_time(times):
    """Median of {seed: time or None} with the censored as +inf (stats.median_censored); None where censored."""
    return median_censored(list(times.values()))["median"]


def winner_at(summary, key, budget, names=None):
    """The cell's winner at target `key`: the lowest median time within the budget. Each other
    configuration is compared with it, paired over the seeds (method.comparisons on time, with the
    evaluation brackets), Holm across those comparisons, where a seed the other did not reach enters
    as the budget: a lower bound of its time, so the difference is understated. A comparison counts
    as resolved only when Holm's p is below 0.05, the difference favours the winner, and the winner
    reached the target in every seed (otherwise the budget would overstate its lead), and the same
    holds with the winner's crossings at the end of their evaluation brackets and the other's at the
    start (interpolation between evaluations cannot make it). "indicative": resolved but smaller than
    the evaluation spacing around the crossings."""
    if budget is None:
        raise SystemExit("atlas: a cell without a time budget (summary.json budget.value): not an atlas cell")
    cfgs = {k: c for k, c in summary["configurations"].items() if names is None or k in names}
    times = {k: seed_times(summary, c, key, budget) for k, c in cfgs.items()}
    med = {k: median_time(t) for k, t in times.items()}
    reached = {k: sum(v is not None for v in t.values()) for k, t in times.items()}
    failed = [k for k, c in cfgs.items() if not c.get("per_seed")]
    finite = {k: m for k, m in med.items() if m is not None}
    common = {"medians_s": med, "reached": reached, "seeds": len(next(iter(times.values()), {})), "failed": failed}
    if not finite:
        return {"winner": None, "why": "no configuration reached it in half its seeds within the budget",
                "resolved": False, **common}
    w = min(finite, key=finite.get)
    metric = f"time_to_target_s@{key}"

    def bounded(k, side=None):
        return {"per_seed": [{"seed": sd, "time_to_target_s": {key: v},
                              "time_to_target_bracket_s": {key: br if br else [budget, budget]}}
                             for sd, (v, br) in entered(summary, cfgs[k], key, budget, side).items()]}
    pairs = [(k, w) for k in cfgs if k != w]
    comps = method.comparisons({k: bounded(k) for k in cfgs}, pairs, [metric])
    # The same comparisons with the winner's crossings at the end of their evaluation brackets and the
    # others' at the start: linear interpolation between evaluations of a convex curve places a
    # crossing late, more so for a configuration evaluated less often (in time) - a bias the paired
    # test on interpolated times cannot see. A comparison counts for the winner only if it is resolved
    # in this worst case too.
    worst = method.comparisons({k: bounded(k, "late" if k == w else "early") for k in cfgs}, pairs, [metric])
    winner_everywhere = reached[w] == common["seeds"]
    for c, cw in zip(comps, worst):
        c["worst_case"] = {"mean_diff": cw["mean_diff"], "ci95": cw["ci95"], "p_holm": cw.get("p_holm"),
                           "resolved": bool(cw["resolved"] and cw["mean_diff"] is not None and cw["mean_diff"] > 0)}
        interpolated = bool(c["resolved"] and c["mean_diff"] is not None and c["mean_diff"] > 0 and winner_everywhere)
        c["for_winner"] = interpolated and c["worst_case"]["resolved"]
        c["by_interpolation_only"] = interpolated and not c["worst_case"]["resolved"]
        c["indicative"] = bool(c["for_winner"] and method.indicative(c))
    others = sorted((k for k in med if k != w), key=lambda k: math.inf if med[k] is None else med[k])
    runner = others[0] if others else None
    return {
        "winner": w, "median_s": finite[w], "runner_up": runner,
        "runner_up_ratio": med[runner] / finite[w] if runner and med[runner] is not None and finite[w] > 0 else None,
        "vs_ring_ratio": med["ring"] / finite[w] if med.get("ring") and finite[w] > 0 and w != "ring" else None,
        "resolved": bool(comps) and all(c["for_winner"] for c in comps),
        "winner_reached_every_seed": winner_everywhere,
        "not_resolved_from": [c["a"] for c in comps if not c["for_winner"]],
        "resolved_by_interpolation_only": [c["a"] for c in comps if c["by_interpolation_only"]],
        "indicative_against": [c["a"] for c in comps if c["indicative"]],
        "comparisons": [{k: c.get(k) for k in ("a", "b", "mean_diff", "ci95", "p_holm", "resolved", "n", "bracket_s",
                                               "for_winner", "indicative", "worst_case", "by_interpolation_only")}
                        for c in comps],
        **common,
    }


def budget_not_held(summary, budget, share=0.1):
    """Runs whose schedule did not end at the budget: by steps, those whose last evaluation is more than
    `share` of the budget away from it (the calibrated step time did not hold); by the clock
    (--schedule-by time), those not scored at the budget (they reached their step cap first)."""
    by_clock = schedule_of(summary) == "time"
    return [f"{k} seed {p['seed']} ended at {p['end_s']:.1f} s" for k, c in summary["configurations"].items()
            for p in c.get("per_seed", []) if p.get("end_s") is not None and
            (not p.get("at_limit") if by_clock else abs(p["end_s"] - budget) > share * budget)]


def reference_drift(summary, budget):
    """In a cell without stragglers, the ring's median crossing of each target as a share of the
    budget: near 1/5, 1/2 and 4/5 when the cell's ring trains as the reference's did (its own tuned
    lr and seeds); far from them, the targets mean something else in this cell. None without a ring."""
    c = summary["configurations"].get("ring")
    if not c or not budget:
        return None
    out = []
    for t in summary.get("targets") or []:
        m = median_time(seed_times(summary, c, method.target_key(t), budget))
        out.append(None if m is None else round(m / budget, 3))
    return out


def winners(out):
    """(records, table): every cell's per-seed records and, per cell and target, its winner row."""
    records, table = [], []
    for n, r, pat, s, d in cells(out):
        budget = s.get("budget", {}).get("value")
        targets = s.get("targets") or []
        for name, c in s["configurations"].items():
            for p in c.get("per_seed", []):
                records.append({"nodes": n, "ratio": r, "pattern": pat, "config": name, "seed": p["seed"],
                                "lr": c.get("lr"), "time_to_target_s": p.get("time_to_target_s"),
                                "val_loss_at_budget": p.get("val_loss_at_budget"), "end_s": p.get("end_s"),
                                "budget_s": budget, "summary": os.path.relpath(os.path.join(d, "summary.json"), out)})
        late = budget_not_held(s, budget) if budget else []
        drift = reference_drift(s, budget) if pat == "none" else None
        # How the cell was measured (cells differ: sessions 29-36 ran 10 evaluations and tuned on one seed): a
        # verdict is read with its cell's evaluation spacing and tuning, never pooled across the two kinds.
        protocol = {"evals": s.get("job", {}).get("evals"), "tuning_seeds": s.get("tuning_seeds"),
                    "tuning_score": s.get("tuning_score", "final"),
                    "schedule": schedule_of(s)}
        for i, t in enumerate(targets):
            key = method.target_key(t)
            row = {"nodes": n, "ratio": r, "pattern": pat, "target": t,
                   "stage": TARGET_NAMES[i] if len(targets) == len(TARGET_NAMES) else key, "budget_s": budget,
                   "budget_not_held": late, "protocol": protocol,
                   **winner_at(s, key, budget, [k for k in CONFIGS if k in s["configurations"]])}
            if drift is not None and i < len(drift):
                row["ring_at_share_of_budget"] = drift[i]
            row["sentence"] = cell_sentence(row)
            table.append(row)
    return records, table


def cells(out):
    root = os.path.join(out, "cells")
    for nd in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        for cd in sorted(os.listdir(os.path.join(root, nd))):
            s = load(os.path.join(root, nd, cd, "summary.json"))
            if s is None:
                continue
            rpart, _, pat = cd.partition("_")
            yield int(nd[1:]), float(rpart[1:]), pat, s, os.path.join(root, nd, cd)


def cmd_build(a):
    records, table = winners(a.out)
    doc = {"what": "one record per cell x configuration x seed; per cell and target the winner (experiments/atlas.py)",
           "preset": PRESET, "batch": BATCH, "step_s": STEP_S, "patterns": PATTERNS,
           "note": "ring without overlap: the simulator does not model communication overlapping the backward",
           "records": records, "winners": table}
    write_atomic(os.path.join(a.out, "atlas.json"), json.dumps(doc, indent=1))
    md = render(table)
    write_atomic(os.path.join(a.out, "atlas.md"), md)
    picture(table, os.path.join(a.out, "atlas.png"))
    print(md)


def write_atomic(path, text):
    """Whole or not at all (two `run` calls may build at once)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def verdict(w):
    if w["winner"] is None:
        return w.get("why", "no winner")
    if w["resolved"]:
        return f"{w['winner']} (resolved)"
    return f"{w['winner']} not resolved from {', '.join(w['not_resolved_from'])}"


def cell_sentence(w):
    """One cell and target as the atlas states it (docs/STUDY.md quotes these; check_study.py)."""
    seeds = w["seeds"]
    head = f"N={w['nodes']}, ratio {w['ratio']:g}, stragglers {w['pattern']}, {w['stage']} target {w['target']:g}"
    tail = ""
    if w.get("failed"):
        tail += f" Failed in every seed: {', '.join(w['failed'])}."
    if w.get("budget_not_held"):
        tail += f" Budget not held by {len(w['budget_not_held'])} run(s) (ended >10% from it)."
    if w["winner"] is None:
        return f"{head}: {w.get('why', 'no winner')} ({seeds} seeds).{tail}"
    budget = f" of the {w['budget_s']:g} s budget" if w.get("budget_s") else ""
    parts = [f"{head}: first {w['winner']} (reached it in {w['reached'][w['winner']]} of {seeds} seeds), "
             f"median {w['median_s']:.3g} s{budget}"]
    if w.get("runner_up"):
        parts.append(f"runner-up {w['runner_up']}" + (f" at {w['runner_up_ratio']:.2f}x its time"
                                                      if w.get("runner_up_ratio") else " (did not reach it in half its seeds)"))
    if w.get("vs_ring_ratio"):
        parts.append(f"{w['vs_ring_ratio']:.2f}x sooner than the ring (no overlap)")
    elif w["winner"] != "ring" and w["medians_s"].get("ring") is None:
        parts.append("the ring did not reach it in half its seeds")
    if w["resolved"]:
        verdict_ = f"resolved against every other configuration (paired over {seeds} seeds, Holm)"
        if w.get("indicative_against"):
            verdict_ += f", indicative against {', '.join(w['indicative_against'])} (within the evaluation spacing)"
    else:
        verdict_ = f"not resolved from {', '.join(w['not_resolved_from'])} (paired over {seeds} seeds, Holm)"
        if w.get("resolved_by_interpolation_only"):
            verdict_ += (f"; ahead of {', '.join(w['resolved_by_interpolation_only'])} only between evaluation points "
                         "(not with each crossing at the unfavourable end of its bracket)")
        if not w.get("winner_reached_every_seed", True):
            verdict_ += "; the first did not reach it in every seed"
    return "; ".join(parts) + f"; {verdict_}.{tail}"


def render(table):
    L = ["# The crossover atlas (experiments/atlas.py build)", "",
         "| N | ratio | stragglers | target | winner | median s | runner-up | x runner-up | x ring | evals, tuning seeds, "
         "tuned on, schedule by |", "|---|---|---|---|---|---|---|---|---|---|"]
    for w in table:
        fx = (lambda v: "-" if v is None else f"{v:.2f}")
        pr = w.get("protocol") or {}
        L.append(f"| {w['nodes']} | {w['ratio']:g} | {w['pattern']} | {w['stage']} {w['target']:g} | {verdict(w)} | "
                 f"{fx(w.get('median_s'))} | {w.get('runner_up') or '-'} | {fx(w.get('runner_up_ratio'))} | "
                 f"{fx(w.get('vs_ring_ratio'))} | {pr.get('evals', '-')}, "
                 f"{'/'.join(map(str, pr.get('tuning_seeds') or [])) or '-'}, "
                 f"{'loss at budget' if pr.get('tuning_score') == 'val_loss_at_budget' else 'end-of-run loss'}, "
                 f"{'the clock' if pr.get('schedule') == 'time' else 'steps'} |")
    return "\n".join(L) + "\n"


def picture(table, path):
    from plotting import pyplot
    plt = pyplot()
    if plt is None or not table:
        return
    from matplotlib.patches import Patch
    stages = list(dict.fromkeys(w["stage"] for w in table))
    pats = list(PATTERNS)  # every pattern, run or not
    names = CONFIGS
    colors = {k: plt.cm.tab10(i) for i, k in enumerate(names)}
    fig, axes = plt.subplots(len(pats), len(stages), figsize=(3.2 * len(stages), 2.6 * len(pats)), squeeze=False)
    for i, pat in enumerate(pats):
        for j, st in enumerate(stages):
            ax = axes[i][j]
            sub = [w for w in table if w["pattern"] == pat and w["stage"] == st]
            ns = sorted({w["nodes"] for w in table})
            rs = sorted({w["ratio"] for w in table} | set(DESIGN_RATIOS))  # cells not run stay white
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
               [Patch(facecolor="white", edgecolor="k", hatch="///", label="not resolved"),
                Patch(facecolor=(0.85, 0.85, 0.85, 1), label="nobody reached it"),
                Patch(facecolor="white", edgecolor="k", label="not run")],
               loc="lower center", ncol=5, fontsize=8)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    tmp = f"{path}.tmp{os.getpid()}.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


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
    r.add_argument("--steps", type=int, default=300, help="the reference ring's steps per node (sets the budgets)")
    r.add_argument("--evals", type=int, default=40,
                   help="evaluation points per run of a cell (deferred: scored on snapshots after training, so they do "
                   "not change a run, only how finely its crossings are read; the cells of sessions 29-36 ran 10)")
    r.add_argument("--tuning-seeds", default="1000,1001",
                   help="seeds each cell tunes its learning rates on, the score averaged over them (disjoint from "
                   "the headline seeds; the cells of sessions 29-36 tuned on 1000 alone)")
    r.add_argument("--schedule-by", choices=("steps", "time"), default="steps",
                   help="study.py --schedule-by: steps (the cells before session 39: a schedule of the calibrated steps, "
                   "which overruns the budget under heavy-tailed jitter) or time (the schedule by the simulated clock "
                   "ends at the budget in every run)")
    r.add_argument("--make-only", metavar="CONFIGS",
                   help="one lane of the cells (study.py --make-only): make only these configurations' runs, publish "
                   "nothing; run the same command without it afterwards (every run taken back) to publish the cells. "
                   "Two lanes on two cores: --make-only ring,bsp_backup,ssp4 and --make-only "
                   "asp_lr_scale,diloco10,async_diloco10")
    r.add_argument("--dry-run", action="store_true")
    b = sub.add_parser("build", help="atlas.json, atlas.md and atlas.png from the cells run so far")
    q = sub.add_parser("query", help="which configuration for N nodes, this ratio and straggler pattern")
    q.add_argument("--nodes", type=int, required=True)
    q.add_argument("--ratio", type=float, required=True)
    q.add_argument("--pattern", choices=list(PATTERNS), required=True)
    for p in (r, b, q):
        p.add_argument("--out", default=DEFAULT_OUT, help="the published atlas (atlas.json, cells/, references/)")
    r.add_argument("--runs", default=DEFAULT_RUNS, help="where every run's files go (large; not kept in git)")
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
    exit_on_sigterm()
    sys.exit(main() or 0)
