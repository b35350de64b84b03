"""Validates syncopate-sim against the emulated cluster, in a way that can fail: takes a finished
emulated study (the output directory of ab_sync_async.py), runs every configuration again in the
simulator with the same emulation (nodes, servers, modelled step, straggler, jitter, link rate),
the same per-node step counts (the study's fitted budget), learning rates and seeds, and checks,
seed by seed, the simulator - emulation differences of each configuration's figures (end time,
throughput, time to each target: relative; validation loss at the budget: nats) and of the
contrasts between configurations the study's report compares (a / b ratios for times, a - b for
losses). A figure passes when the 95% interval of its mean paired difference lies within the
declared tolerance (default +-5% for times, +-0.03 nats for losses); otherwise it fails, naming
why. The old "the two 95% intervals overlap" check is kept as a secondary column only.

  python experiments/validate_sim.py --emulated runs/study/stragglers [--out runs/validate/stragglers]
        [--configs ring,asp] [--latency-us 50] [--time-tolerance 0.05] [--loss-tolerance 0.03]
        [--fit-from runs/study/other [--fit-grid 0.6,0.7,0.8,0.9,1.0]]

--fit-from fits the link efficiency on another emulated study (the one whose simulated throughput
is closest, per seed) and checks this one with it: parameters are never fitted on the runs they
validate. Writes OUT/validation.json, OUT/report.md, OUT/val_loss.png and OUT/staleness.png.
Before any run it prints the runs to make (those done before are reused) and their estimated cost
from this machine's measurements (experiments/cost.py); --dry-run prints every run and exits.
"""
import argparse
import json
import os
import shlex
import sys

import cost
from ab_sync_async import CONFIGS
from cluster_runs import ROOT, reusable, run_inputs, run_once, sim_command, summarize, exit_on_sigterm
from method import per_seed
from stats import fmt_ci, mean_ci95, paired
from study import add_args, loss_at, time_to_target  # noqa: F401
from plotting import pyplot

TIME_FIGURES = ("end_s", "tokens_per_s")  # relative differences; plus time_to_target_s@<target>
LOSS_FIGURES = ("val_loss_at_budget",)    # differences in nats


def figure_kind(metric):
    return "loss" if metric in LOSS_FIGURES else "time"


REACH_MISMATCH_FAILS = 2  # a time to target fails when this many seeds reached it on one side only


def check_figure(emu, sim, kind, tol, reach=False):
    """emu, sim: {seed: value}. The per-seed simulator - emulation differences (relative for times:
    sim / emu - 1; nats for losses), their mean and 95% interval; verdict "pass" when the whole
    interval lies within +-tol, "fail" otherwise (with the reason), "n/a" with fewer than 2 pairs.
    reach (times to a target, None where not reached): the seeds reached on each side are counted,
    and REACH_MISMATCH_FAILS or more seeds reached on one side only fail the figure whatever the
    paired seeds say (those seeds cannot enter the differences)."""
    diffs = {}
    for s_, e in emu.items():
        v = sim.get(s_)
        if e is None or v is None:
            continue
        if kind == "time":
            if e == 0:
                continue
            diffs[s_] = v / e - 1.0
        else:
            diffs[s_] = v - e
    reached = None
    if reach:
        seeds = sorted(set(emu) | set(sim))
        reached = {"emulated": sum(emu.get(s_) is not None for s_ in seeds),
                   "simulated": sum(sim.get(s_) is not None for s_ in seeds), "seeds": len(seeds),
                   "one_side_only": [s_ for s_ in seeds if (emu.get(s_) is None) != (sim.get(s_) is None)]}
    return judge_diffs(diffs, kind, tol, reached)


def judge_diffs(diffs, kind, tol, reached=None):
    """check_figure's verdict from the per-seed differences (and the reach counts of a time to target)."""
    r = paired(diffs, {k: 0.0 for k in diffs})
    out = {"diffs": diffs, "mean": r["mean_diff"], "ci95": r["ci95"], "n": r["n"], "tolerance": tol, "kind": kind}
    one_side = []
    if reached is not None:
        out["reached"] = reached
        one_side = reached["one_side_only"]
    if len(one_side) >= REACH_MISMATCH_FAILS:
        rc = out["reached"]
        out.update(verdict="fail", why=f"reached in {rc['emulated']} of {rc['seeds']} seeds emulated, "
                   f"{rc['simulated']} simulated ({len(one_side)} on one side only)")
    elif r["n"] < 2:
        out.update(verdict="n/a", why=f"{r['n']} paired seed(s)")
    elif -tol <= r["ci95"][0] and r["ci95"][1] <= tol:
        out.update(verdict="pass", why="")
    else:
        half = (r["ci95"][1] - r["ci95"][0]) / 2
        out.update(verdict="fail", why=("the mean difference is outside the tolerance" if abs(r["mean_diff"]) > tol
                                         else "the interval is wider than the tolerance" if half > tol
                                         else "the interval reaches past the tolerance"))
    return out


def contrast(x_a, x_b, kind):
    """Per seed, a configuration's figure against another's: a / b for times, a - b for losses."""
    out = {}
    for s_ in x_a:
        a, b = x_a.get(s_), x_b.get(s_)
        if a is None or b is None or (kind == "time" and b == 0):
            continue
        out[s_] = a / b if kind == "time" else a - b
    return out


def check_contrast(emu_a, emu_b, sim_a, sim_b, kind, tol):
    """The simulator's contrast against the emulation's, seed by seed: for times the ratio of ratios
    minus 1 (check_figure's relative difference), for losses the difference of differences."""
    ce, cs = contrast(emu_a, emu_b, kind), contrast(sim_a, sim_b, kind)
    return check_figure(ce, cs, kind, tol)


def fit_efficiency(errors):
    """errors: {link efficiency: [per-seed relative throughput errors sim / emu - 1]}. The efficiency
    whose mean absolute error is least."""
    scored = {e: sum(abs(x) for x in xs) / len(xs) for e, xs in errors.items() if xs}
    if not scored:
        raise SystemExit("validate_sim: the fit produced no comparable run")
    return min(scored, key=scored.get), scored


def study_args(summary):
    """The emulated study's own arguments, parsed from its recorded command."""
    ap = argparse.ArgumentParser()
    add_args(ap, "x")
    argv = shlex.split(summary["command"])
    return ap.parse_known_args(argv[2:])[0]  # an old study's retired flags (--target-loss) are ignored


def tbf_sharing(em, sa):
    """fifo where a tbf queue of the emulated link (rate x 50 ms latency + burst, as scripts/netns.sh
    sets it) holds a worker's whole push to one shard, so the pushes go out in order; else fair
    (the flows interleave in a queue too short for any one of them)."""
    from scenario import PRESET_PARAMS
    if not em.get("link_gbit"):
        return "fair"
    rate = em["link_gbit"] * 1e9 / 8
    queue = rate * 0.050 + max(16384, rate * 0.008)
    piece = PRESET_PARAMS[em["preset"]] * 4 / (sa.servers or em["nodes"])
    return "fifo" if piece <= queue else "fair"


def overlap(a, b):
    if a["mean"] is None or b["mean"] is None:
        return None
    lo_a, hi_a = a["ci95"] if a.get("ci95") else (a["mean"], a["mean"])
    lo_b, hi_b = b["ci95"] if b.get("ci95") else (b["mean"], b["mean"])
    return lo_a <= hi_b and lo_b <= hi_a


def seed_values(runs, targets):
    """{metric: {seed: value}} from per-run summaries (either backend, treated alike). No budget is passed
    to per_seed: the replay runs the emulated runs' own step counts, so both sides are read at the end of
    the same schedule (val_loss_at_budget here: the end-of-run loss; the time budget's cutoff would compare
    the simulator's clock with the emulation's budget instead of with the emulation)."""
    ps = {s_: per_seed(s_, r, targets) for s_, r in runs.items()}
    vals = {m: {s_: p.get(m) for s_, p in ps.items()} for m in TIME_FIGURES + LOSS_FIGURES}
    for t in targets:
        k = f"{t:g}"
        vals[f"time_to_target_s@{k}"] = {s_: p["time_to_target_s"][k] for s_, p in ps.items()}
    return vals


def study_job(emu, sa):
    """The emulated study's job (its summary's, or for an old study rebuilt from its command)."""
    if "job" in emu:
        return dict(emu["job"])
    em = emu["emulation"]
    return {"nodes": em["nodes"], "servers": sa.servers or em["nodes"], "steps": sa.steps, "evals": sa.evals,
            "preset": em["preset"], "batch": em["batch"], "warmup": sa.warmup, "eval_batches": 4}


def run_dirs(emu, name, c):
    """{seed: the emulated run's directory} of a configuration."""
    if c.get("per_seed"):
        return {str(p["seed"]): p["run_dir"] for p in c["per_seed"]}
    return {s_: os.path.join(emu["_dir"], "runs", name, f"lr{c['lr_multiplier']:g}", f"seed{s_}") for s_ in c["curves"]}


def simulate(emu, sa, em, out, names, targets):
    """Every configuration and seed of an emulated study, both backends' per-run summaries."""
    # A study run with overlap is replayed with it: the simulator models the ring's buckets and the
    # parameter servers' pushes during the modelled backward (emulate.overlap), which is what this
    # validation is for before simulated studies use it.
    job = study_job(emu, sa)
    res = {}
    for name in names:
        c = emu["configurations"][name]
        cfg = sim_cfg(name, c)
        ring = cfg.get("ring", False)
        emu_runs, sim_runs = {}, {}
        for s_, d in sorted(run_dirs(emu, name, c).items()):
            emu_runs[s_] = summarize(d, job["nodes"], ring, deferred=bool(job.get("defer")))
            rd = os.path.join(out, "runs", name, f"seed{s_}")
            # Made before by the same command and binaries: taken back (the simulator is deterministic).
            r = run_once(name, cfg, em, job, int(s_), c["lr"], rd, backend="sim", reuse=True)
            if "failed" in r:
                raise SystemExit(f"validate_sim: {name} seed {s_} failed in the simulator ({r['failed']}); log {r['log']}")
            sim_runs[s_] = r
            print(f"[validate] {name} seed {s_}: emulated final {emu_runs[s_]['final_val_loss']:.4f} / "
                  f"{emu_runs[s_]['wall_s']:.1f} s; simulated {r['final_val_loss']:.4f} / {r['wall_s']:.1f} s "
                  f"({r.get('elapsed_s', 0):.0f} s real)", flush=True)
        res[name] = (emu_runs, sim_runs)
    return res


def sim_cfg(name, c):
    """The configuration as the simulator replays it: the emulated study's steps and outer lr."""
    cfg = dict(CONFIGS[name])
    if c.get("plan"):
        cfg.update(steps=c["plan"]["steps"], slow_steps=c["plan"].get("slow_steps"))
    if c.get("outer_lr") is not None:
        cfg["worker"] = list(cfg.get("worker", [])) + [f"--dist.outer_lr={c['outer_lr']:.6g}"]
    return cfg


def planned(emu, sa, em, out, names, m):
    """The simulator runs simulate() would make: [(config, seed, run dir, cached, estimated s)]."""
    job = study_job(emu, sa)
    inputs = run_inputs(True)
    rows = []
    for name in names:
        c = emu["configurations"][name]
        p = c.get("plan") or {"steps": job["steps"], "slow_steps": None}
        for s_, _ in sorted(run_dirs(emu, name, c).items()):
            rd = os.path.join(out, "runs", name, f"seed{s_}")
            est, _ = cost.run_s("sim", em, p["steps"], p.get("slow_steps"), not CONFIGS[name].get("elastic"),
                                job["nodes"], max(1, job.get("evals") or 1),
                                job.get("val_windows") or job.get("eval_batches", 4) * job["batch"], m,
                                bool(CONFIGS[name].get("ring")))
            line = " ".join(sim_command(sim_cfg(name, c), em, job, int(s_), c["lr"], rd))
            rows.append((name, s_, c["lr"], p["steps"], rd, reusable(rd, line, inputs) is not None, est))
    return rows


def print_plan(rows, m, dry):
    todo = [r for r in rows if not r[5]]
    est = None if any(r[6] is None for r in todo) else sum(r[6] for r in todo)
    L = [f"plan: {len(rows)} simulator runs, {len(rows) - len(todo)} done before (reused), {len(todo)} to run, one at a time",
         (f"estimated cost: ~{cost.minutes(est)} min" if est is not None else
          "estimated cost: not available: a part below is not measured yet"),
         "  based on: " + "; ".join(m.basis())]
    if dry:
        L.append("dry run: the runs, in order (nothing started, nothing written):")
        L += [f"  {name} seed {s_}: " + ("done before" if done else f"lr {lr:.3g}, {steps} steps/node, ~{cost.minutes(e)} min")
              for name, s_, lr, steps, _, done, e in rows]
        L.append("dry run: exit without starting anything (drop --dry-run to run)")
    print("\n".join(f"[validate] {x}" for x in L), flush=True)


def sim_emulation(emu, a, sa, efficiency):
    em = dict(emu["emulation"])
    if em.get("backend") == "sim":
        raise SystemExit("validate_sim: that study is a simulated one; give an emulated one")
    em["backend"], em["latency_us"], em["link_efficiency"] = "sim", a.latency_us, efficiency
    em["sharing"] = a.sharing if a.sharing != "auto" else tbf_sharing(em, sa)
    # In network namespaces (an emulation with a link rate) the emulated cluster runs shard k on node
    # k mod N, sharing that node's link (scripts/local_cluster.sh --netns): by default the simulator
    # places them so (sim.colocate_servers); --servers-on own gives each a link of its own, as the
    # atlas's simulated cells do (a sensitivity reading: the emulation cannot place them so).
    on = getattr(a, "servers_on", "auto")
    em["colocate_servers"] = bool(em.get("link_gbit")) if on == "auto" else on == "nodes"
    return em


def load(path):
    f = os.path.join(path, "summary.json")
    if not os.path.isfile(f):
        raise SystemExit(f"validate_sim: {f} does not exist: --emulated (and --fit-from) name the output directory "
                         "of a finished emulated study, e.g. python experiments/ab_sync_async.py --out runs/ab ... "
                         "(its --backend emulated, the default)")
    try:
        with open(f) as fh:
            emu = json.load(fh)
    except ValueError as e:
        raise SystemExit(f"validate_sim: {f} is not a study's summary ({e}): run the emulated study again")
    if "emulation" not in emu or "configurations" not in emu:
        raise SystemExit(f"validate_sim: {f} is not an emulated study's summary (no 'emulation'/'configurations')")
    emu["_dir"] = os.path.abspath(path)
    return emu, study_args(emu)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--emulated", required=True, help="an emulated study's output directory (with summary.json)")
    ap.add_argument("--out", help="default: runs/validate/<the study's name>")
    ap.add_argument("--configs", help="comma-separated subset of the study's configurations")
    ap.add_argument("--latency-us", type=float, default=50.0, help="the simulator's one-way latency, microseconds")
    ap.add_argument("--sharing", choices=["auto", "fair", "fifo"], default="auto",
                    help="how a sender's simultaneous messages share its link in the simulator; auto: fifo where the "
                    "emulated link's tbf queue (rate x 50 ms + burst, scripts/netns.sh) holds a whole push to one "
                    "shard, else fair")
    ap.add_argument("--servers-on", choices=["auto", "nodes", "own"], default="auto",
                    help="where the simulator puts the parameter-server shards: nodes (shard k on node k mod N's "
                    "link, as the emulation in network namespaces does), own (a link each, as the atlas's simulated "
                    "cells); auto: nodes when the emulation had a link rate")
    ap.add_argument("--against-emulated", metavar="DIR",
                    help="instead of the simulator, a second emulated study with the same command (another --out): the "
                    "emulation's own repeatability under the same rule, the noise floor a simulator check meets")
    ap.add_argument("--link-efficiency", type=float, default=1.0,
                    help="the simulator's links at this share of the emulated nominal rate (TCP's goodput on them); "
                    "with --fit-from, fitted instead")
    ap.add_argument("--fit-from", help="another emulated study: fit the link efficiency on it (--fit-grid), then "
                    "check this study with the fitted value")
    ap.add_argument("--fit-grid", default="0.6,0.7,0.8,0.9,1.0", help="link efficiencies tried by --fit-from")
    ap.add_argument("--time-tolerance", type=float, default=0.05,
                    help="a time figure (end time, throughput, time to target, and time ratios between configurations) "
                    "passes when its paired relative difference's 95%% interval lies within +-this")
    ap.add_argument("--loss-tolerance", type=float, default=0.03,
                    help="nats: the same for validation losses and loss differences between configurations")
    ap.add_argument("--dry-run", action="store_true",
                    help="print every simulator run and the estimated cost, then exit: starts no process, writes nothing")
    a = ap.parse_args()
    if a.time_tolerance <= 0 or a.loss_tolerance <= 0:
        raise SystemExit("validate_sim: tolerances must be positive")
    emu, sa = load(a.emulated)
    if a.against_emulated:
        return repeatability(a, emu)
    out = a.out or os.path.join(ROOT, "runs", "validate", os.path.basename(os.path.normpath(a.emulated)))
    em0 = emu["emulation"]
    measured = [] if a.dry_run else cost.ensure_measured(em0["preset"], em0["batch"],
                                                         study_job(emu, sa).get("val_windows"), out)
    m = cost.Measurements(em0["preset"], em0["batch"], "sim")
    names = a.configs.split(",") if a.configs else list(emu["configurations"])
    rows = planned(emu, sa, sim_emulation(emu, a, sa, a.link_efficiency), out, names, m)
    if a.fit_from:
        femu, fsa = load(a.fit_from)
        for eff in [float(x) for x in a.fit_grid.split(",")]:
            rows = planned(femu, fsa, sim_emulation(femu, a, fsa, eff), os.path.join(out, "fit", f"eff{eff:g}"),
                           list(femu["configurations"]), m) + rows
    if measured:
        print(f"[validate] measured first: {', '.join(measured)}", flush=True)
    print_plan(rows, m, a.dry_run)
    if a.dry_run:
        return
    os.makedirs(out, exist_ok=True)
    efficiency, fit = a.link_efficiency, None
    if a.fit_from:
        if os.path.realpath(a.fit_from) == os.path.realpath(a.emulated):
            raise SystemExit("validate_sim: --fit-from is the study being validated; fit on another study")
        femu, fsa = load(a.fit_from)
        errors = {}
        for eff in [float(x) for x in a.fit_grid.split(",")]:
            fem = sim_emulation(femu, a, fsa, eff)
            runs = simulate(femu, fsa, fem, os.path.join(out, "fit", f"eff{eff:g}"), list(femu["configurations"]), [])
            errors[eff] = [s_r["tokens_per_s"] / e_r["tokens_per_s"] - 1.0 for e_runs, s_runs in runs.values()
                           for s_, e_r in e_runs.items() for s_r in [s_runs[s_]] if e_r["tokens_per_s"]]
        efficiency, scored = fit_efficiency(errors)
        fit = {"from": os.path.abspath(a.fit_from), "grid": scored, "link_efficiency": efficiency}
        print(f"[validate] link efficiency fitted on {a.fit_from}: {efficiency:g}", flush=True)
    em = sim_emulation(emu, a, sa, efficiency)
    targets = emu.get("targets") or ([emu["target_val_loss"]] if emu.get("target_val_loss") else [])
    tols = {"time": a.time_tolerance, "loss": a.loss_tolerance}
    result = {"emulated": emu["_dir"], "command": " ".join(["python"] + sys.argv), "emulation": em, "fit": fit,
              "targets": targets, "tolerances": tols, "configurations": {}, "contrasts": []}
    runs = simulate(emu, sa, em, out, names, targets)
    values = {}
    for name, (emu_runs, sim_runs) in runs.items():
        ve, vs = seed_values(emu_runs, targets), seed_values(sim_runs, targets)
        values[name] = (ve, vs)
        checks = figure_checks(ve, vs, tols)
        agree = {m: overlap(mean_ci95(list(ve[m].values())), mean_ci95(list(vs[m].values()))) for m in ve}
        result["configurations"][name] = {
            "lr": emu["configurations"][name]["lr"], "seeds": sorted(emu_runs), "checks": checks, "agree": agree,
            "emulated": {m: mean_ci95(list(v.values()), lower=0.0 if figure_kind(m) == "time" else None)
                         for m, v in ve.items()},
            "simulated": {m: mean_ci95(list(v.values()), lower=0.0 if figure_kind(m) == "time" else None)
                          for m, v in vs.items()},
            "staleness_histogram": {b: hist(r) for b, r in (("emulated", emu_runs), ("simulated", sim_runs))},
            "curves": {"emulated": [r["curve"] for r in emu_runs.values()],
                       "simulated": [r["curve"] for r in sim_runs.values()]},
            "sim_real_s": sum(r.get("elapsed_s", 0) for r in sim_runs.values())}
    pairs = []
    for c in emu.get("comparisons", []):
        if (c["a"], c["b"]) not in pairs and c["a"] in values and c["b"] in values:
            pairs.append((c["a"], c["b"]))
    if not pairs:  # an old study: every configuration against the first
        pairs = [(n, names[0]) for n in names[1:]]
    conclude(result, values, pairs, tols, out)
    plots(result, out)


def figure_checks(ve, vs, tols):
    """Every figure of one configuration checked: {metric: check_figure's result}."""
    return {m: check_figure(ve[m], vs[m], figure_kind(m), tols[figure_kind(m)], reach=m.startswith("time_to_target"))
            for m in ve}


def sentence(what, ch, again=False):
    """The tool's sentence for one check (quoted in docs/STUDY.md; experiments/check_study.py re-derives it)."""
    side = "the second emulated making - the first" if again else "simulator - emulation"
    if ch["mean"] is None:
        return f"{what}: {side}: no paired seed; n/a ({ch['why']})."
    f = (lambda x: f"{100 * x:+.1f}%") if ch["kind"] == "time" else (lambda x: f"{x:+.4f} nats")
    tol = f"+-{100 * ch['tolerance']:g}%" if ch["kind"] == "time" else f"+-{ch['tolerance']:g} nats"
    ci = "" if ch["ci95"][0] is None else f" [{f(ch['ci95'][0])}, {f(ch['ci95'][1])}]"
    rc = ch.get("reached")
    reach = f"; reached in {rc['emulated']} of {rc['seeds']} seeds emulated, {rc['simulated']} " + (
        "made again" if again else "simulated") if rc else ""
    return (f"{what}: {side} {f(ch['mean'])}{ci} over {ch['n']} paired seed(s), tolerance {tol}{reach}: "
            f"{ch['verdict']}" + (f" ({ch['why']})" if ch["why"] else "") + ".")


def analyse(res):
    """Every check's sentence, judged again from the stored per-seed differences: {"conclusions": [...]}.
    (check_study.py compares these with the sentences the file states.)"""
    again = bool(res.get("against"))
    out = []
    for name, c in res["configurations"].items():
        for m, ch in c["checks"].items():
            j = judge_diffs(ch["diffs"], ch["kind"], ch["tolerance"], ch.get("reached"))
            out.append(sentence(f"{name}, {m}", j, again))
    for ch in res["contrasts"]:
        j = judge_diffs(ch["diffs"], ch["kind"], ch["tolerance"], ch.get("reached"))
        out.append(sentence(f"{ch['a']} against {ch['b']}, {ch['metric']}", j, again))
    return {"conclusions": out}


def conclude(result, values, pairs, tols, out):
    """The contrasts of `pairs`, the overall verdict, the sentences, validation.json and the report (printed)."""
    for x, y in pairs:
        for m in values[x][0]:
            k = figure_kind(m)
            r = check_contrast(values[x][0][m], values[y][0][m], values[x][1][m], values[y][1][m], k, tols[k])
            result["contrasts"].append(dict(r, a=x, b=y, metric=m))
    result["verdict"] = ("fail" if any(c["verdict"] == "fail" for c in all_checks(result)) else
                         "pass" if any(c["verdict"] == "pass" for c in all_checks(result)) else "n/a")
    result["format"] = "syncopate-validation/1"
    result["conclusions"] = analyse(result)["conclusions"]
    with open(os.path.join(out, "validation.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(report(result, out))


def same_runs(x, y, names):
    """The runs both studies made of `names`, as {name: [seeds]}, refused by name where a run's command
    line (its command.txt, the run's own directory taken out) differs between them."""
    both = {}
    for n in names:
        dx, dy = run_dirs(x, n, x["configurations"][n]), run_dirs(y, n, y["configurations"][n])
        both[n] = sorted(set(dx) & set(dy))
        for s_ in both[n]:
            lines = []
            for d in (dx[s_], dy[s_]):
                try:
                    with open(os.path.join(d, "command.txt")) as f:
                        lines.append(f.read().strip().replace(os.path.abspath(d), "RUN").replace(d, "RUN"))
                except OSError:
                    lines.append(None)
            if lines[0] is None or lines[0] != lines[1]:
                raise SystemExit(f"validate_sim: {n} seed {s_} was not made by the same command in both studies "
                                 f"({dx[s_]} and {dy[s_]}): a repeatability check needs the same runs twice")
    return both


def emulated_runs(emu, names, seeds):
    """{name: {seed: per-run summary}} read from an emulated study's run directories (seeds: {name: [seed]})."""
    job = study_job(emu, study_args(emu))
    return {n: {s_: summarize(d, job["nodes"], CONFIGS[n].get("ring", False), deferred=bool(job.get("defer")))
                for s_, d in sorted(run_dirs(emu, n, emu["configurations"][n]).items()) if s_ in seeds[n]}
            for n in names}


def repeatability(a, emu):
    """--against-emulated: the same study made twice, checked by the same rule (no simulator)."""
    other, _ = load(a.against_emulated)
    if other["emulation"].get("backend") == "sim":
        raise SystemExit("validate_sim: --against-emulated takes an emulated study, not a simulated one")
    if os.path.realpath(a.against_emulated) == os.path.realpath(a.emulated):
        raise SystemExit("validate_sim: --against-emulated is the study itself; give the same study made again")
    out = a.out or os.path.join(ROOT, "runs", "validate", os.path.basename(os.path.normpath(a.emulated)) + "_again")
    os.makedirs(out, exist_ok=True)
    names = a.configs.split(",") if a.configs else [n for n in emu["configurations"] if n in other["configurations"]]
    seeds = same_runs(emu, other, names)
    targets = emu.get("targets") or []
    tols = {"time": a.time_tolerance, "loss": a.loss_tolerance}
    first, second = emulated_runs(emu, names, seeds), emulated_runs(other, names, seeds)
    result = {"emulated": emu["_dir"], "against": other["_dir"], "command": " ".join(["python"] + sys.argv),
              "emulation": emu["emulation"], "fit": None, "targets": targets, "tolerances": tols,
              "configurations": {}, "contrasts": []}
    values = {}
    for name in names:
        ve, vs = seed_values(first[name], targets), seed_values(second[name], targets)
        values[name] = (ve, vs)
        result["configurations"][name] = {
            "lr": emu["configurations"][name]["lr"], "seeds": sorted(set(first[name]) & set(second[name])),
            "checks": figure_checks(ve, vs, tols),
            "agree": {m: overlap(mean_ci95(list(ve[m].values())), mean_ci95(list(vs[m].values()))) for m in ve},
            "emulated": {m: mean_ci95(list(v.values())) for m, v in ve.items()},
            "simulated": {m: mean_ci95(list(v.values())) for m, v in vs.items()}}
    conclude(result, values, [(n, names[0]) for n in names[1:]], tols, out)  # (against the first named)


def hist(runs):
    h = {}
    for r in runs.values():
        for k, c in r["staleness_histogram"].items():
            h[k] = h.get(k, 0) + c
    return h


def all_checks(res):
    return [c for cfg in res["configurations"].values() for c in cfg["checks"].values()] + res["contrasts"]


def _cell(c):
    if c["mean"] is None:
        return "-", "-"
    f = (lambda x: f"{100 * x:+.1f}%") if c["kind"] == "time" else (lambda x: f"{x:+.4f}")
    ci = "-" if c["ci95"][0] is None else f"[{f(c['ci95'][0])}, {f(c['ci95'][1])}]"
    return f(c["mean"]), ci


def report(res, out):
    t = res["tolerances"]
    fit = res.get("fit")
    again = res.get("against")
    L = [f"# Simulator vs emulated cluster: {os.path.basename(res['emulated'])}" if not again else
         f"# The emulated cluster against itself: {os.path.basename(res['emulated'])} made twice", "",
         f"Command: `{res['command']}`", ""]
    if again:
        L += [f"The same study made again (`{again}`; the same command apart from --out): the column "
              "\"simulated\" below is that second emulated study, and \"sim - emu\" is second - first. This is the "
              "emulation's own repeatability under the simulator check's rule: the noise floor any simulator "
              "check of these figures meets.", ""]
    L += [
         f"Emulated study: `{res['emulated']}` ({res['emulation']['nodes']} nodes). The simulator ran every configuration "
         "with the same emulation, per-node step counts, learning rates and seeds (links: sharing "
         f"{res['emulation'].get('sharing', 'fair')}, {res['emulation'].get('link_efficiency', 1.0):g} x the emulated "
         f"rate, {res['emulation'].get('latency_us', 50):g} us latency"
         + ("; parameter-server shard k on node k mod N, sharing its link, as the emulation placed them"
            if res["emulation"].get("colocate_servers") else "") + ")"
         + (f"; the link efficiency was fitted on another study, `{fit['from']}`" if fit else
            "; no parameter was fitted on these runs by this script") + "." if not again else
         f"Emulated study: `{res['emulated']}` ({res['emulation']['nodes']} nodes).", "",
         f"Each figure is checked seed by seed: the simulator - emulation difference (relative for times, nats for "
         f"losses), its mean and 95% interval over the seeds; **pass** when the whole interval lies within "
         f"+-{100 * t['time']:g}% (times) or +-{t['loss']:g} nats (losses), otherwise **fail**. Contrasts between "
         "configurations (the pairs the study's report compares) are checked the same way: ratios a / b for times "
         "(their relative difference), differences a - b for losses. Time to target: the seeds where both backends "
         f"reached it; a target reached on one side only in {REACH_MISMATCH_FAILS} or more seeds fails. A fail says "
         "why: the mean outside the tolerance (the backends disagree), the interval wider than the tolerance (the "
         "seeds' spread leaves it open: not shown either way), or the mean inside with the interval reaching past "
         "the tolerance (near its edge). The last column is the old check (the two backends' 95% intervals "
         "overlap), secondary.", "",
         f"**Verdict: {res['verdict'].upper()}** ({sum(c['verdict'] == 'pass' for c in all_checks(res))} pass, "
         f"{sum(c['verdict'] == 'fail' for c in all_checks(res))} fail: "
         f"{sum(c['verdict'] == 'fail' and 'outside' in c['why'] for c in all_checks(res))} with the mean outside, "
         f"{sum(c['verdict'] == 'fail' and 'wider' in c['why'] for c in all_checks(res))} with the interval wider "
         f"than the tolerance, {sum(c['verdict'] == 'fail' and 'reaches past' in c['why'] for c in all_checks(res))} "
         f"with the mean inside and the interval reaching past it, "
         f"{sum(c['verdict'] == 'fail' and c['why'].startswith('reached') for c in all_checks(res))} on reach; "
         f"{sum(c['verdict'] == 'n/a' for c in all_checks(res))} n/a).", "",
         "| configuration | figure | emulated | simulated | sim - emu (mean) | 95% interval | n | verdict | intervals overlap |",
         "|---|---|---|---|---|---|---|---|---|"]
    for name, c in res["configurations"].items():
        for m, ch in c["checks"].items():
            mean, ci = _cell(ch)
            ok = c["agree"].get(m)
            L.append(f"| {name} | {m} | {fmt_ci(c['emulated'][m], 4)} | {fmt_ci(c['simulated'][m], 4)} | {mean} | {ci} | "
                     f"{ch['n']} | {'**fail**' if ch['verdict'] == 'fail' else ch['verdict']}"
                     f"{' (' + ch['why'] + ')' if ch['why'] else ''} | {'-' if ok is None else 'yes' if ok else 'no'} |")
    L += ["", "## Contrasts between configurations", "",
          "| a | b | figure | sim - emu (mean) | 95% interval | n | verdict |", "|---|---|---|---|---|---|---|"]
    for ch in res["contrasts"]:
        mean, ci = _cell(ch)
        L.append(f"| {ch['a']} | {ch['b']} | {ch['metric']} | {mean} | {ci} | {ch['n']} | "
                 f"{'**fail**' if ch['verdict'] == 'fail' else ch['verdict']}{' (' + ch['why'] + ')' if ch['why'] else ''} |")
    text = "\n".join(L) + "\n"
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


def plots(res, out):
    plt = pyplot()
    if plt is None:
        return
    names = list(res["configurations"])
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.4), sharey=True, squeeze=False)
    for ax, name in zip(axes[0], names):
        c = res["configurations"][name]
        for backend, style in (("emulated", "-"), ("simulated", "--")):
            curves = c["curves"][backend]
            n = min(len(cv) for cv in curves)
            xs = [sum(cv[i]["t"] for cv in curves) / len(curves) for i in range(n)]
            st = [mean_ci95([cv[i]["val_loss"] for cv in curves]) for i in range(n)]
            line, = ax.plot(xs, [s["mean"] for s in st], style, label=backend)
            ax.fill_between(xs, [s["ci95"][0] for s in st], [s["ci95"][1] for s in st], color=line.get_color(), alpha=0.2)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("seconds (emulated: training clock; simulated: virtual clock)")
    axes[0][0].set_ylabel("validation loss (mean, 95% band)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "val_loss.png"), dpi=100)
    plt.close(fig)
    ps_names = [n for n in names if any(k != "0" for k in res["configurations"][n]["staleness_histogram"]["emulated"])]
    if ps_names:
        fig, axes = plt.subplots(1, len(ps_names), figsize=(3.2 * len(ps_names), 3.0), squeeze=False)
        for ax, name in zip(axes[0], ps_names):
            for backend, marker in (("emulated", "o"), ("simulated", "x")):
                h = res["configurations"][name]["staleness_histogram"][backend]
                tot = sum(h.values()) or 1
                ks = sorted(h, key=int)
                ax.plot([int(k) for k in ks], [h[k] / tot for k in ks], marker=marker, label=backend)
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("staleness")
        axes[0][0].set_ylabel("share of steps")
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "staleness.png"), dpi=100)
        plt.close(fig)


if __name__ == "__main__":
    exit_on_sigterm()
    main()
