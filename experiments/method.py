"""The study method (issue 25, docs/STUDY.md "Method"): budgets with schedules fitted to them,
targets declared before the runs, learning rates tuned on their own seeds with a grid that extends
itself, the held-out set's identity, and paired comparisons with Holm's correction and TOST. Plain
functions of numbers and records (no processes), so each is unit-tested on hand-computed values;
experiments/study.py runs them."""
import json
import math
import os

from cluster_runs import PRESETS
from stats import holm, median_censored, paired, tost

ALPHA = 0.05


class BadInput(SystemExit):
    """Refused input, named before hours of runs (a SystemExit: the scripts end with the message)."""

    def __init__(self, msg):
        super().__init__(f"study: {msg}")


# ---------------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------------

def initial_loss(preset):
    """The loss of an untrained model of `preset`: ln(vocabulary), a uniform prediction."""
    if preset not in PRESETS:
        raise BadInput(f"unknown model preset {preset!r} (known: {', '.join(PRESETS)})")
    return math.log(PRESETS[preset]["vocab"])


def parse_targets(spec):
    """--targets '3.2,2.9,2.7' -> [3.2, 2.9, 2.7] (descending: early, middle, late)."""
    if spec is None or str(spec).strip() == "":
        return []
    out = []
    for x in str(spec).split(","):
        try:
            v = float(x)
        except ValueError:
            raise BadInput(f"--targets: {x!r} is not a number (give absolute validation losses, e.g. 3.2,2.9,2.7)")
        if not v > 0 or math.isinf(v):
            raise BadInput(f"--targets: {x!r} is not a positive loss")
        out.append(v)
    if len(set(out)) != len(out):
        raise BadInput(f"--targets {spec}: a target is given twice")
    return sorted(out, reverse=True)


def check_targets(targets, preset, measured_initial=None):
    """Refuses a target at or above the initial loss (every run 'reaches' it before training), by
    name. The initial loss is ln(vocabulary) for the preset, or the measured first evaluation."""
    init = measured_initial if measured_initial is not None else initial_loss(preset)
    bad = [t for t in targets if t >= init]
    if bad:
        raise BadInput(f"--targets {', '.join(f'{t:g}' for t in bad)}: at or above the initial loss {init:.3f} "
                       f"({'measured' if measured_initial is not None else f'ln(vocabulary) of preset {preset}'}); "
                       "every run reaches it before training")
    return targets


def targets_from_reference(summary, config=None, fractions=(0.25, 0.5, 1.0)):
    """Targets from a separate reference study (its summary.json, already run): the median over its
    seeds of `config`'s validation loss at the given fractions of its token budget (early, middle,
    late). config: default the reference's first configuration."""
    cfgs = summary["configurations"]
    name = config or next(iter(cfgs))
    if name not in cfgs:
        raise BadInput(f"--targets-from: the reference has no configuration {name!r} (it has {', '.join(cfgs)})")
    curves = [cv for cv in cfgs[name].get("curves", {}).values() if cv]
    if not curves:
        raise BadInput(f"--targets-from: {name} has no valid curve in the reference")
    out = []
    for f in fractions:
        vals = sorted(loss_at_tokens(cv, f * cv[-1]["tokens"]) for cv in curves)
        n = len(vals)
        out.append(round(vals[(n - 1) // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2]), 4))
    return sorted(set(out), reverse=True)


def loss_at_tokens(curve, tokens):
    """Validation loss at a global token count (linear between evaluations; the last past the end)."""
    prev = None
    for p in curve:
        if p["tokens"] >= tokens:
            if prev is None or p["tokens"] == prev["tokens"]:
                return p["val_loss"]
            f = (tokens - prev["tokens"]) / (p["tokens"] - prev["tokens"])
            return prev["val_loss"] + f * (p["val_loss"] - prev["val_loss"])
        prev = p
    return curve[-1]["val_loss"]


# ---------------------------------------------------------------------------------------------
# Budgets
# ---------------------------------------------------------------------------------------------

def tokens_per_node_step(preset, batch):
    return batch * PRESETS[preset]["block"]


def token_budget_plan(budget, nodes, batch, preset, evals):
    """Every node's steps such that the job's total tokens equal `budget` (rounded down to whole
    steps; the schedule of every node ends there). Refused when it gives fewer steps than
    evaluations (the budget cannot be reached with a curve)."""
    per_step = nodes * tokens_per_node_step(preset, batch)
    steps = int(budget // per_step)
    if steps < max(1, evals):
        raise BadInput(f"--token-budget {budget:g}: one step of the job is {per_step} tokens ({nodes} nodes x {batch} "
                       f"x {PRESETS[preset]['block']}), so the budget gives {steps} steps per node, fewer than the "
                       f"{evals} evaluations; give at least {per_step * max(1, evals)} tokens")
    return {"steps": steps, "slow_steps": None, "tokens": steps * per_step}


def node_step_times(metrics_by_node, skip=3):
    """Each node's mean seconds per step (communication and waits included) from its step records:
    the training clock between its record `skip` and its last, over the steps between. None for a
    node with too few records."""
    out = []
    for ms in metrics_by_node:
        steps = [m for m in ms if "tokens_per_s" in m]
        if len(steps) < skip + 2:
            out.append(None)
            continue
        key = "time_s" if all("time_s" in m for m in steps) else "unix_s"
        a, b = steps[skip], steps[-1]
        out.append((b[key] - a[key]) / (b["step"] - a["step"]))
    return out


def time_budget_plan(name, budget_s, step_times, slow_nodes, synchronous, evals):
    """Steps per node such that every node's schedule ends at the wall budget: steps = budget / the
    node's measured step time. Nodes modelled alike (the stragglers; the others) share one count
    from their group's mean step time (their measured differences are jitter, not speed); a
    synchronous configuration (ring, BSP, SSP: the nodes step together) gives every node the
    slowest group's count. Returns {"steps" (the fast nodes'), "slow_steps" (the stragglers', or
    None), "step_s": {...}}. Refused by name when a node would do fewer steps than evaluations."""
    if any(t is None or t <= 0 for t in step_times):
        raise BadInput(f"{name}: the calibration measured no step time on node(s) "
                       f"{[i for i, t in enumerate(step_times) if t is None or t <= 0]}")
    slow = [i for i in range(len(step_times)) if i in slow_nodes]
    fast = [i for i in range(len(step_times)) if i not in slow_nodes]
    groups = {g: sum(step_times[i] for i in idx) / len(idx) for g, idx in (("fast", fast), ("slow", slow)) if idx}
    if synchronous:
        groups = {g: max(groups.values()) for g in groups}
    steps = {g: int(budget_s // t) for g, t in groups.items()}
    for g, n in steps.items():
        if n < max(1, evals):
            raise BadInput(f"--time-budget-s {budget_s:g}: {name}'s {'straggler' if g == 'slow' else 'nodes'} take "
                           f"{groups[g]:.3g} s per step (calibration), so the budget gives {n} steps, fewer than the "
                           f"{evals} evaluations; give at least {groups[g] * max(1, evals):.3g} s")
    fast_steps = steps.get("fast", steps.get("slow"))
    slow_steps = steps.get("slow") if "slow" in steps and "fast" in steps and steps["slow"] != steps["fast"] else None
    return {"steps": fast_steps, "slow_steps": slow_steps, "step_s": groups,
            "expected_end_s": {g: steps[g] * groups[g] for g in steps}}


def whole_rounds(name, plan, h, evals):
    """A local-SGD configuration (H inner steps per synchronization) must end on a synchronization
    (the trainer refuses train.steps not a multiple of H): its step counts are rounded down to
    whole rounds. Refused by name when that leaves fewer steps than max(H, evaluations)."""
    if h <= 1:
        return plan
    out = dict(plan)
    for key in ("steps", "slow_steps"):
        if out.get(key) is not None:
            out[key] = out[key] - out[key] % h
            if out[key] < max(h, evals):
                raise BadInput(f"{name}: the budget gives {plan[key]} steps, {out[key]} in whole rounds of "
                               f"H = {h}, fewer than max(H, {evals} evaluations); raise the budget")
    if out.get("slow_steps") == out.get("steps"):
        out["slow_steps"] = None
    out["rounded_to_h"] = h
    return out


def job_tokens(plan, nodes, slow_nodes, per_node_step):
    """The job's total tokens under a plan (fast nodes x steps + stragglers x slow_steps)."""
    n_slow = len([i for i in range(nodes) if i in slow_nodes])
    slow = plan["slow_steps"] if plan.get("slow_steps") is not None else plan["steps"]
    return per_node_step * (plan["steps"] * (nodes - n_slow) + slow * n_slow)


def every_tokens(total_tokens, evals):
    """One evaluation spacing for every configuration (global tokens): the smallest job's total
    over the evaluations, so every configuration evaluates at the same global token counts."""
    return max(1, int(min(total_tokens) // max(1, evals)))


# ---------------------------------------------------------------------------------------------
# Learning rates
# ---------------------------------------------------------------------------------------------

def check_grid(grid, extend, what="--lr-grid"):
    """A grid of one value cannot show its pick is not on an edge: refused unless it may extend."""
    if not grid or any(not (g > 0) for g in grid):
        raise BadInput(f"{what}: multipliers must be positive, got {grid}")
    if len(set(grid)) == 1 and extend <= 0:
        raise BadInput(f"{what} {grid[0]:g}: a grid of one value with no extension (--lr-extend 0); its pick is on "
                       "its edge by construction. Give three or more values, or let the grid extend")
    return sorted(set(grid))


def tune(score, grid, factor=2.0, max_extend=3):
    """Picks the multiplier with the lowest score(m) (None: failed). When the pick lands on an edge of
    the values tried, the grid extends past that edge by `factor`, up to max_extend times; a grid of
    one value extends to both sides first. Returns {"pick", "tried" (sorted), "scores", "edge"
    (None, or "low"/"high" where the pick is still on an edge: under-tuned, reported), "extended"}."""
    tried = sorted(set(grid))
    scores = {}
    extended = 0

    def fill():
        for m in tried:
            if m not in scores:
                scores[m] = score(m)

    if len(tried) == 1 and max_extend > 0:
        tried = [tried[0] / factor, tried[0], tried[0] * factor]
        extended += 1
    fill()
    while True:
        ok = {m: v for m, v in scores.items() if v is not None and not math.isnan(v)}
        if not ok:
            return {"pick": None, "tried": tried, "scores": scores, "edge": None, "extended": extended}
        pick = min(ok, key=ok.get)
        edge = "low" if pick == tried[0] else "high" if pick == tried[-1] else None
        if edge is None or extended >= max_extend:
            return {"pick": pick, "tried": tried, "scores": scores, "edge": edge, "extended": extended}
        tried = [tried[0] / factor] + tried if edge == "low" else tried + [tried[-1] * factor]
        extended += 1
        fill()


def tuning_seeds(spec, headline):
    """--tuning-seeds '1000,1001' -> [1000, 1001]; refused where they meet the headline seeds."""
    seeds = [int(x) for x in str(spec).split(",") if x.strip()]
    common = sorted(set(seeds) & set(headline))
    if not seeds:
        raise BadInput("--tuning-seeds: at least one seed")
    if common:
        raise BadInput(f"--tuning-seeds {spec}: seed(s) {common} are also headline seeds; tuning and headline seeds "
                       "must be disjoint (a pick on seed 0 favours seed 0)")
    return seeds


# ---------------------------------------------------------------------------------------------
# The held-out set
# ---------------------------------------------------------------------------------------------

def check_val_sets(runs):
    """runs: {label ("config seed k"): the run's val_set digests (a list) or None}. Refuses by name to
    compare runs scored on different held-out sets; returns the list of labels whose records carry
    no digest (old runs, or a backend without it), which the report names."""
    by_digest, absent = {}, []
    for label, ds in runs.items():
        if not ds:
            absent.append(label)
            continue
        if len(ds) > 1:
            raise BadInput(f"{label} was scored on {len(ds)} different held-out sets ({', '.join(ds)}) within one run")
        by_digest.setdefault(ds[0], []).append(label)
    if len(by_digest) > 1:
        parts = "; ".join(f"{d}: {', '.join(ls)}" for d, ls in by_digest.items())
        raise BadInput(f"the runs were scored on different held-out sets (val_set digests differ), so their losses do "
                       f"not compare: {parts}")
    return absent


# ---------------------------------------------------------------------------------------------
# Per-seed values and comparisons
# ---------------------------------------------------------------------------------------------

def time_to_target(curve, target):
    """Seconds at which the curve first reaches `target` (linear between evaluations), or None."""
    prev = None
    for p in curve:
        if p["val_loss"] <= target:
            if prev is None or prev["val_loss"] == p["val_loss"]:
                return p["t"]
            f = (prev["val_loss"] - target) / (prev["val_loss"] - p["val_loss"])
            return prev["t"] + f * (p["t"] - prev["t"])
        prev = p
    return None


def target_bracket(curve, target):
    """The evaluation points around the curve's first crossing of `target`: [t before, t at or past]
    (seconds; before the first point: 0, the training clock's start), or None where it never reaches
    it. time_to_target interpolates inside this bracket, so its width bounds the interpolation's
    error (which the paired interval of a time does not include)."""
    prev = None
    for p in curve:
        if p["val_loss"] <= target:
            return [0.0 if prev is None else prev["t"], p["t"]]
        prev = p
    return None


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    if not n:
        return None
    return xs[(n - 1) // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def eval_points(curves, every_tokens=None, job_step_tokens=None):
    """The evaluation points the runs of one configuration actually have (their curve points, every
    one counted: while_waiting and job_final points included): points per run (min, median, max),
    the spacing of consecutive points pooled over the runs (median, min, max, in global tokens, and
    median in seconds), the points taken while node 0 waited for a straggler and the runs ending on a
    job_final point, and `grid`: what the records show about the asked spacing every_tokens =
    N (eval.every_tokens): "exact" where every point but the last lies on successive multiples of N;
    "step" where each lies within one job step (job_step_tokens) at or past the next multiple (the
    first step that crosses it); None otherwise (e.g. an asynchronous mode, whose node 0 evaluates
    when its own tokens x nodes cross a multiple while the record carries the shards' count)."""
    curves = [cv for cv in curves if cv]
    if not curves:
        return None
    counts = [len(cv) for cv in curves]
    dtok = [b["tokens"] - a["tokens"] for cv in curves for a, b in zip(cv, cv[1:])]
    dt = [b["t"] - a["t"] for cv in curves for a, b in zip(cv, cv[1:])]
    grid = None
    if every_tokens:
        n = every_tokens

        def on_grid(cv, tol):
            mids = cv[:-1]
            ks = [p["tokens"] // n for p in mids]
            if any(p["tokens"] - k * n >= tol for p, k in zip(mids, ks)):
                return False
            return all(k2 == k1 + 1 for k1, k2 in zip(ks, ks[1:]))
        if all(on_grid(cv, 1) for cv in curves):
            grid = "exact"
        elif job_step_tokens and all(on_grid(cv, job_step_tokens) for cv in curves):
            grid = "step"
    return {"runs": len(curves), "points": {"min": min(counts), "median": _median(counts), "max": max(counts)},
            "spacing_tokens": {"median": _median(dtok), "min": min(dtok, default=None), "max": max(dtok, default=None)},
            "spacing_s": _median(dt), "every_tokens": every_tokens, "grid": grid,
            "while_waiting": sum(1 for cv in curves for p in cv if p.get("while_waiting")),
            "job_final_runs": sum(1 for cv in curves if cv[-1].get("job_final"))}


def target_key(t):
    return f"{t:g}"


# A wall budget holds to the second: the loss at it is the last evaluation at or before it, a time to target
# counts only at or before it (the same cutoff for both; the float tolerance only absorbs rounding).
BUDGET_TOLERANCE = 1e-9


def at_budget(curve, budget):
    """The curve point a job with this budget ships: with a wall budget ({"kind": "time", "value": s}),
    the last evaluation at or before the budget, None where none is (the report names such runs);
    otherwise (a token budget, which every run's schedule ends at exactly, or none) the last."""
    if not curve:
        return None
    if not budget or budget.get("kind") != "time":
        return curve[-1]
    inside = [p for p in curve if p["t"] <= budget["value"] * (1 + BUDGET_TOLERANCE)]
    return inside[-1] if inside else None


def within_budget(t, budget):
    """A time to target with a wall budget censored (None) past the budget, as the atlas reads it."""
    if t is None or not budget or budget.get("kind") != "time":
        return t
    return t if t <= budget["value"] * (1 + BUDGET_TOLERANCE) else None


def per_seed(seed, run, targets, budget=None):
    """One seed's values for summary.json (run: cluster_runs.summarize's result; budget: the study's
    summary["budget"]). val_loss_at_budget is the loss of the model the job holds when its budget runs
    out (at_budget): the end of the run where its schedule ended at the budget, an earlier evaluation
    where the run overran it (then its schedule had not ended: at_budget_s says which point was read,
    end_s where the run ended). Times to target are censored at a wall budget."""
    curve = run["curve"]
    point = at_budget(curve, budget)
    times = {target_key(t): within_budget(time_to_target(curve, t), budget) for t in targets}
    return {"seed": seed, "final_val_loss": run["final_val_loss"],
            "val_loss_at_budget": point["val_loss"] if point else None,
            "at_budget_s": point["t"] if point else None,
            "end_s": curve[-1]["t"] if curve else None,
            # sim.time_schedule: the run was scored at its budget (it did not end at its step cap first)
            "at_limit": any(pt.get("at_limit", False) for pt in curve),
            "tokens": run.get("tokens"),
            "time_to_target_s": times,
            "time_to_target_bracket_s": {target_key(t): target_bracket(curve, t) if times[target_key(t)] is not None
                                         else None for t in targets},
            "tokens_per_s": run.get("tokens_per_s"), "wall_s": run.get("wall_s"),
            "node_steps": run.get("node_steps"), "val_set": run.get("val_set"), "val_tokens": run.get("val_tokens"),
            "eval_of": run.get("eval_of")}


def reread(p, curve, targets, budget):
    """Updates one seed's per_seed values `p` with every value per_seed reads off a curve (the loss at the
    budget and its point, the end, times to target and their brackets), from `curve`: a report rebuilt from
    the kept curves, or the curves thinned (eval_spacing.py)."""
    v = per_seed(p["seed"], {"curve": curve, "final_val_loss": p.get("final_val_loss")}, targets, budget)
    for key in ("val_loss_at_budget", "at_budget_s", "end_s", "at_limit", "time_to_target_s", "time_to_target_bracket_s"):
        p[key] = v[key]


def target_table(seeds, targets):
    """Per target: how many seeds reached it and the median time with the others censored."""
    return {target_key(t): median_censored([s["time_to_target_s"].get(target_key(t)) for s in seeds])
            for t in targets}


LOWER_IS_BETTER = {"val_loss_at_budget": True, "final_val_loss": True, "tokens_per_s": False}
LOSS_METRICS = ("val_loss_at_budget", "final_val_loss")


def metric_values(seeds, metric):
    """{seed: value} of a metric ("time_to_target_s@3.2" for a target's time)."""
    if metric.startswith("time_to_target_s@"):
        k = metric.split("@", 1)[1]
        return {s["seed"]: s["time_to_target_s"].get(k) for s in seeds}
    return {s["seed"]: s.get(metric) for s in seeds}


def bracket_widths(cfg, metric, seeds):
    """Seconds between the evaluation points around each seed's crossing of a time-to-target
    metric's target (target_bracket), for the given seeds: from per_seed's time_to_target_bracket_s,
    else from the configuration's kept curves; None where neither says."""
    k = metric.split("@", 1)[1]
    target = float(k)
    by_seed = {str(s["seed"]): s for s in cfg.get("per_seed", [])}  # stats.paired names seeds as strings
    out = []
    for seed in map(str, seeds):
        b = (by_seed.get(seed, {}).get("time_to_target_bracket_s") or {}).get(k)
        if b is None and str(seed) in cfg.get("curves", {}):
            b = target_bracket(cfg["curves"][str(seed)], target)
        if b is None:
            return None
        out.append(b[1] - b[0])
    return out


def comparisons(cfgs, pairs, metrics, margin=None, alpha=ALPHA):
    """The report's comparisons: for each pair (a, b) and metric, the paired difference a - b over the
    seeds both have (time to target: only the seeds where both reached it; the rest are counted in
    left_out), with its 95% interval and p, Holm-adjusted across every comparison in the list;
    resolved = p_holm < alpha. Loss metrics with a margin (nats) also get TOST: equivalent within
    +-margin. A difference that is the same in every paired seed (deterministic runs: no seed
    variation) is "deterministic": no p, no Holm rank, never resolved nor equivalent (a zero-width
    interval is not a statistical result). cfgs: {name: {"per_seed": [...]}}."""
    out = []
    for a, b in pairs:
        if a not in cfgs or b not in cfgs:
            continue
        for metric in metrics:
            r = paired(metric_values(cfgs[a]["per_seed"], metric), metric_values(cfgs[b]["per_seed"], metric))
            c = {"a": a, "b": b, "metric": metric, "mean_diff": r["mean_diff"], "ci95": r["ci95"], "p": r["p"],
                 "n": r["n"], "left_out": r["left_out"], "diffs": r["diffs"],
                 "deterministic": bool(r.get("deterministic"))}
            if metric.startswith("time_to_target_s@") and r["seeds"]:
                # The interpolation's error, which the paired interval leaves out: per configuration the
                # median over the paired seeds of the width of the evaluation bracket around the crossing.
                w = {x: bracket_widths(cfgs[x], metric, r["seeds"]) for x in (a, b)}
                if all(v is not None for v in w.values()):
                    c["bracket_s"] = {x: _median(v) for x, v in w.items()}
            if margin and metric in LOSS_METRICS and not c["deterministic"]:
                e = tost(r["diffs"], margin, alpha)
                c["tost"] = {"margin": margin, "p": e["p"], "ci90": e["ci90"], "equivalent": e["equivalent"]}
            out.append(c)
    for c, ph in zip(out, holm([c["p"] for c in out])):
        c["p_holm"] = ph
        c["resolved"] = ph is not None and ph < alpha
    return out


def _fmt(x, d=4):
    return "n/a" if x is None else f"{x:.{d}g}"


def sentence(c):
    """A comparison as the report states it: resolved (with direction), equivalent (TOST with its
    declared margin) or not resolved. Never '≈'."""
    m = c["metric"]
    unit = " s" if m.startswith("time_to_target") else " tokens/s" if m == "tokens_per_s" else " nats"
    what = f"{c['a']} - {c['b']}, {m}"
    seeds = f"{c['n']} paired seeds" + (f", {c['left_out']} left out" + (" (not reached by both)" if m.startswith(
        "time_to_target") else " (missing on one side)") if c["left_out"] else "")
    if c.get("deterministic"):
        return (f"{what}: {_fmt(c['mean_diff'])}{unit} in every one of the {seeds}: deterministic (no seed "
                "variation), not a statistical result; neither resolved nor equivalent.")
    if c["mean_diff"] is None or c["p"] is None:
        return f"{what}: not resolved (fewer than 2 paired seeds; {seeds})."
    body = (f"{_fmt(c['mean_diff'])}{unit} [{_fmt(c['ci95'][0])}, {_fmt(c['ci95'][1])}], p = {_fmt(c['p'], 3)}, "
            f"Holm p = {_fmt(c['p_holm'], 3)}; {seeds}")
    if c["resolved"]:
        lower_better = LOWER_IS_BETTER.get(m, True)
        better = c["a"] if (c["mean_diff"] < 0) == lower_better else c["b"]
        if m.startswith("time_to_target"):
            return f"{what}: {body}. " + time_verdict(c, better)
        return f"{what}: {body}. Resolved: {better} is better."
    if c.get("tost", {}).get("equivalent"):
        t = c["tost"]
        return (f"{what}: {body}. Equivalent within +-{t['margin']:g} nats (TOST p = {_fmt(t['p'], 3)}, 90% interval "
                f"[{_fmt(t['ci90'][0])}, {_fmt(t['ci90'][1])}]).")
    return f"{what}: {body}. Not resolved."


def indicative(c):
    """A resolved time-to-target difference smaller than the wider of the two configurations' median
    evaluation brackets: the test resolves it, but the interpolation between evaluation points that
    gives each time could move it by as much."""
    br = c.get("bracket_s")
    return bool(br and c.get("mean_diff") is not None and abs(c["mean_diff"]) < max(br.values()))


def time_verdict(c, better):
    """A resolved time to target, stated with its evaluation brackets: "resolved" in the sense of the
    paired test (Holm), whose interval does not include the interpolation between evaluation points."""
    target = c["metric"].split("@", 1)[1]
    br = c.get("bracket_s")
    brackets = ("; evaluation brackets: " + ", ".join(f"{x} ~{v:.2g} s" for x, v in br.items()) + " wide"
                if br else "; evaluation brackets not recorded")
    out = (f"Resolved by the paired test: {better} reaches {target} sooner (paired, Holm p = "
           f"{_fmt(c['p_holm'], 3)}{brackets})")
    if indicative(c):
        out += " (smaller than the evaluation spacing: treat as indicative)"
    return out + "."


def load_summary(path):
    with open(os.path.join(path, "summary.json") if os.path.isdir(path) else path) as f:
        return json.load(f)
