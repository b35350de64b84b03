"""Advice against hindsight (issue 29): does the advisor pick what running every candidate would
have picked, and how close are its predicted times to the measured ones?

  python experiments/hindsight.py [--scenarios fast4,slowlink4,...] [--seeds 3] [--first-seed 100]
        [--advice-seeds 3] [--steps 150] [--target-loss 3.0] [--lanes 1] [--out runs/hindsight]
        [--dry-run] [--report-only] [--publish docs/study/hindsight]

For every scenario (an emulated cluster: N nodes in network namespaces, a tbf-limited link per
node, a modelled step with jitter, optionally one slow node and a one-way latency), in order:
1. probe: scripts/local_cluster.sh --probe measures the cluster as a user would (probe.json);
2. advise: experiments/advise.py predicts every candidate's time to target from the probe in the
   simulator (seeds 0..A-1) and recommends one;
3. hindsight: every candidate runs on the same emulated cluster (scripts/local_cluster.sh) with the
   advisor's own flags and learning rates, the same model, batch, schedule and evaluation, on seeds
   FIRST..FIRST+S-1 (not the advisor's seeds: a prediction must hold for runs it has not seen),
   and its time to the target is measured (training clock; evaluations deferred, off the clock).

The job is the advisor's proxy itself (micro, 2 sequences per node, 150 steps): what is measured is
the advisor's calibration from a probe plus the simulator's fidelity, not how well a small proxy's
loss curve stands for a larger model's (that is not measured here; advice.json states it). The
advisor has no parameter fitted on these scenarios (its learning rates are crossover.py's, its
straggler threshold 1.5x); none of them is one of the emulated studies the simulator was validated on.

Per scenario the analysis gives (analyse(), recomputed by check_study.py from the per-seed data):
- the advised candidate's measured mean time against the best in hindsight (lowest measured mean
  among candidates that reached the target in every seed): regret = advised / best, within 1.10x or
  not; whether the two are resolved apart by the paired, Holm-corrected test of crossover.judge;
- every candidate's predicted mean against its measured mean: relative error (where both reached
  the target in every seed);
- Kendall's tau-b between the predicted and the measured order of those candidates.
Overall: the share of scenarios within 1.10x (target: 90%), the median absolute relative error of
the predictions (target: 15% or less), the median tau (target: 0.8 or more). A scenario with an
emulated run that did not hold (steps over their modelled time, saturated host CPU) is reported
invalid and left out of the overall figures, never mixed in.

Runs are cached under OUT/<scenario>/ (probe/, advise/, runs/<config>/seed<k>/result.json, each made
again when its command changed), so the study can be extended over sessions. Writes OUT/hindsight.json,
OUT/report.md and OUT/hindsight.png; --publish copies those three and every scenario's probe.json and
advice.json under DIR (the study's record in the repository).
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

import advise
import crossover
from cluster_runs import PS_FLAGS, ROOT, cluster_command, run_once
from method import time_to_target
from stats import fmt_ci, kendall_tau_b, mean_ci95

FORMAT = "syncopate-hindsight/1"
WITHIN = 1.10        # the bound on advised / best-in-hindsight
ERROR_TARGET = 0.15  # median absolute relative error of the predicted times
TAU_TARGET = 0.8     # Kendall's tau between the predicted and the measured order
SHARE_TARGET = 0.9   # share of scenarios within WITHIN
# name: nodes, modelled step (s), link (Gbit/s per node), slowdown of the last node (1: none),
# jitter (mean of the exponential extra time, a fraction of the step), one-way latency (ms).
# r (the advisor's ratio: the micro model's float32 bytes twice over the link / the step) is in
# the comment; the validated range of the simulator is N 4..8, r 0.32..4, slowdown 1..3.
SCENARIOS = {
    "fast4": dict(nodes=4, step_s=0.1, link_gbit=1.0, slowdown=1.0, jitter=0.05, latency_ms=0.0),        # r 0.08
    "straggler4": dict(nodes=4, step_s=0.1, link_gbit=0.2, slowdown=3.0, jitter=0.2, latency_ms=0.0),    # r 0.4
    "slowlink4": dict(nodes=4, step_s=0.1, link_gbit=0.02, slowdown=1.0, jitter=0.05, latency_ms=0.0),   # r 4
    "jitter6": dict(nodes=6, step_s=0.1, link_gbit=0.1, slowdown=1.0, jitter=0.6, latency_ms=0.0),       # r 0.8
    "mixed6": dict(nodes=6, step_s=0.1, link_gbit=0.04, slowdown=2.0, jitter=0.1, latency_ms=0.0),       # r 2
    "latency3": dict(nodes=3, step_s=0.2, link_gbit=0.5, slowdown=1.5, jitter=0.1, latency_ms=10.0),     # r 0.08
    "wan8": dict(nodes=8, step_s=0.1, link_gbit=0.01, slowdown=1.0, jitter=0.1, latency_ms=5.0),         # r 8
}


def describe(s):
    slow = f", node {s['nodes'] - 1} {s['slowdown']:g}x slower" if s["slowdown"] > 1 else ""
    lat = f", {s['latency_ms']:g} ms one way" if s["latency_ms"] else ""
    return (f"N = {s['nodes']}, {s['link_gbit']:g} Gbit/s links, {s['step_s']:g} s steps with jitter "
            f"{s['jitter']:g}{slow}{lat}")


def emulation(s):
    """The cluster_runs emulation of a scenario (slow node: the last one; node 0 evaluates)."""
    slow = s["slowdown"] > 1
    return {"step_time_s": s["step_s"], "jitter": s["jitter"], "slow_node": s["nodes"] - 1 if slow else -1,
            "slowdown": s["slowdown"] if slow else 1.0, "link_gbit": s["link_gbit"], "latency_ms": s["latency_ms"]}


def probe_command(s, out):
    em = emulation(s)
    cmd = [os.path.join(ROOT, "scripts", "local_cluster.sh"), "--probe", "--nodes", str(s["nodes"]), "--out", out,
           "--step-time", repr(s["step_s"]), "--jitter", repr(s["jitter"]), "--netns", "--link-gbit", f"{s['link_gbit']:g}"]
    if em["slow_node"] >= 0:
        cmd += ["--slow-node", str(em["slow_node"]), "--slowdown", repr(s["slowdown"])]
    if s["latency_ms"]:
        cmd += ["--latency-ms", f"{s['latency_ms']:g}"]
    return cmd + ["--", f"--model.preset={advise.PRESET}", f"--train.batch_size={advise.BATCH}", "--train.threads=1"]


def probe(name, s, out):
    """OUT/<scenario>/probe/probe.json, measured again only when the probe's command changed."""
    d = os.path.join(out, name, "probe")
    cmd = probe_command(s, d)
    line = " ".join(cmd)
    path = os.path.join(d, "probe.json")
    try:
        with open(os.path.join(d, "command.txt")) as f:
            if f.read().strip() == line and os.path.exists(path):
                return path
    except OSError:
        pass
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(os.path.dirname(d), exist_ok=True)
    print(f"[hindsight] {name}: probing ({describe(s)})", flush=True)
    log = os.path.join(os.path.dirname(d), "probe.log")
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0 or not os.path.exists(path):
        raise SystemExit(f"hindsight: the probe of {name} failed (exit {rc}); see {log}\ncommand: {line}")
    with open(os.path.join(d, "command.txt"), "w") as f:
        f.write(line + "\n")
    return path


def advise_dir(out, name):
    return os.path.join(out, name, "advise")


def run_advisor(name, probe_path, out, a):
    """The advisor's advice.json for the scenario (its simulated runs are cached by advise.py)."""
    d = advise_dir(out, name)
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "advise.py"), probe_path, "--out", d,
           "--seeds", str(a.advice_seeds), "--steps", str(a.steps), "--target-loss", f"{a.target_loss:g}"]
    print(f"[hindsight] {name}: advising", flush=True)
    os.makedirs(d, exist_ok=True)
    log = os.path.join(out, name, "advise.log")
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"hindsight: the advisor failed on {name} (exit {rc}); see {log}\ncommand: {' '.join(cmd)}")
    with open(os.path.join(d, "advice.json")) as f:
        return json.load(f)


def predicted_per_seed(out, name, adv):
    """{candidate: {seed: predicted seconds on the cluster or None}} from the advisor's cached runs."""
    scale = adv["proxy"]["time_scale"]
    res = {}
    for c in adv["candidates"]:
        res[c["name"]] = {}
        for seed in range(adv["proxy"]["seeds"]):
            r = advise.cached(advise_dir(out, name), c["name"], seed)
            t = r.get("time_to_target_s") if r else None
            res[c["name"]][str(seed)] = t * scale if t is not None else None
    return res


def measured_setup(s, adv, a):
    """(em, job) of the hindsight runs: the advisor's proxy job (model, batch, steps, warmup, evaluation)
    on the scenario's emulated cluster, with the advisor's server count."""
    px = adv["proxy"]
    job = {"nodes": s["nodes"], "servers": px["servers"], "preset": px["preset"], "batch": px["batch"],
           "steps": px["steps"], "warmup": 5, "evals": px["steps"] // px["eval_every"], "eval_batches": px["eval_batches"],
           "defer": True}
    return emulation(s), job


def candidate_cfg(name, n):
    """cluster_runs' configuration of an advisor candidate: its worker flags (mode, H, outer
    optimizer) and, on parameter servers, its server flags as local_cluster.sh takes them."""
    flags = advise.sim_flags(name, n)
    cluster = []
    back = {v: k for k, v in PS_FLAGS.items()}  # ps.consistency -> --consistency
    for f in flags:
        if f.startswith("--ps."):
            key, value = f[2:].split("=", 1)
            cluster += [back[key], value]
    worker = [f for f in flags if f.startswith("--dist.") and not f.startswith("--dist.clip_scope=")]
    return {"ring": not advise.is_ps(name), "cluster": cluster, "worker": worker}


def result_path(out, scen, name, seed):
    return os.path.join(out, scen, "runs", name, f"seed{seed}", "result.json")


def measure(scen, s, adv, name, seed, a):
    """One hindsight run (cached by command): its time to target on the training clock."""
    em, job = measured_setup(s, adv, a)
    cfg = candidate_cfg(name, s["nodes"])
    lr = advise.CANDIDATES[name][1]
    d = os.path.dirname(result_path(a.out, scen, name, seed))
    line = " ".join(cluster_command(cfg, em, job, seed, lr, d))
    try:
        with open(os.path.join(d, "result.json")) as f:
            r = json.load(f)
        if r.get("command") == line:
            return r
    except (OSError, ValueError):
        pass
    if os.path.isdir(d):
        shutil.rmtree(d)
    t0 = time.time()
    full = run_once(name, cfg, em, job, seed, lr, d)
    if "failed" in full:
        r = {"config": name, "seed": seed, "failed": full["failed"], "log": full["log"], "command": line}
    else:
        r = {"config": name, "seed": seed, "time_to_target_s": time_to_target(full["curve"], a.target_loss),
             "end_s": full["wall_s"], "final_val_loss": full["final_val_loss"], "valid": full["valid"],
             "invalid_because": full["invalid_because"], "overrun_share": full["overrun_share"],
             "cpu_util": full["cpu_util"], "curve": [[p["t"], p["val_loss"]] for p in full["curve"]], "command": line}
    with open(os.path.join(d, "result.json"), "w") as f:
        json.dump(r, f)
    got = ("failed: " + r["failed"]) if "failed" in r else (
        f"target at {r['time_to_target_s']:.2f} s" if r["time_to_target_s"] is not None else
        f"not reached by {r['end_s']:.2f} s") + ("" if r.get("valid", True) else f" (INVALID: {r['invalid_because']})")
    print(f"[hindsight] {scen} {name} seed {seed}: {got} ({time.time() - t0:.0f} s real)", flush=True)
    return r


# --------------------------------------------------------------------------------------------
# Analysis (pure: check_study.py recomputes it from hindsight.json's per-seed data)

def _judge(per_seed, end):
    """crossover.judge on {name: {seed: time or None}}; a missed target counts at the run's end
    (`end`: {name: {seed: seconds}}), which judge reads as simulated_s."""
    cell = {k: [{"seed": sd, "time_to_target_s": t, "simulated_s": end.get(k, {}).get(sd, math.inf)}
                for sd, t in v.items()] for k, v in per_seed.items()}
    return crossover.judge(cell)


def _full_mean(v):
    """The mean of a candidate's per-seed times where it reached the target in every seed, else None."""
    xs = list(v.values())
    return sum(xs) / len(xs) if xs and all(x is not None for x in xs) else None


def analyse_scenario(sc):
    """Adds the scenario's figures and sentence to sc (its predicted/measured per-seed data)."""
    meas, pred, adv = sc["measured"], sc["predicted"], sc["advised"]
    invalid = sorted(f"{k} seed {sd}" for k, v in sc["invalid_runs"].items() for sd in v)
    failed = sorted(f"{k} seed {sd}" for k, v in sc["failed_runs"].items() for sd in v)
    head = f"{sc['name']} ({sc['describe']})"
    if invalid or failed:
        sc.update(valid=False, sentence=f"{head}: not evaluated: the emulation did not hold in "
                  + ", ".join(invalid + failed) + " (reported invalid, left out of the overall figures).")
        return sc
    j = _judge(meas, sc["end_s"])
    mm = {k: _full_mean(v) for k, v in meas.items()}
    pm = {k: _full_mean(v) for k, v in pred.items()}
    best = j["winner"]
    sc["valid"] = True
    sc["best"] = best
    sc["measured_mean_s"] = mm
    sc["predicted_mean_s"] = pm
    sc["measured_ci"] = {k: mean_ci95([x for x in v.values() if x is not None], lower=0.0) for k, v in meas.items()}
    errors = {k: pm[k] / mm[k] - 1.0 for k in mm if mm[k] and pm.get(k) is not None}
    sc["relative_error"] = errors
    both = sorted(errors)
    sc["tau"] = kendall_tau_b([pm[k] for k in both], [mm[k] for k in both]) if len(both) >= 3 else None
    if best is None:
        sc["regret"] = None
        sc["sentence"] = f"{head}: no candidate reached the target in every seed when run; the advice cannot be checked."
        return sc
    if mm.get(adv) is None:
        sc["regret"] = math.inf
        sc["within"] = False
        reached = sum(x is not None for x in meas[adv].values())
        verdict = f"missed the target in {len(meas[adv]) - reached} of {len(meas[adv])} seeds when run"
    else:
        sc["regret"] = mm[adv] / mm[best]
        sc["within"] = sc["regret"] <= WITHIN
        verdict = (f"took {fmt_ci(sc['measured_ci'][adv], 3)} s when run, {sc['regret']:.2f}x the best's "
                   f"({'within' if sc['within'] else 'outside'} {WITHIN:.2f}x)")
    if adv == best:
        apart = "it was the best in hindsight"
    else:
        d = j.get("paired_vs_winner", {}).get(adv)
        res = "resolved behind it" if adv in j.get("behind", []) else "not resolved from it"
        apart = f"the best in hindsight was {best} at {fmt_ci(sc['measured_ci'][best], 3)} s; {adv} is {res}"
        if d and d.get("p_holm") is not None:
            apart += f" (paired over {d['n']} seeds, Holm-corrected p = {d['p_holm']:.3g})"
    pa = pm.get(adv)
    sc["sentence"] = (f"{head}: the advisor picked {adv} (predicted {pa:.3g} s); it {verdict}; {apart}."
                      if pa is not None else f"{head}: the advisor picked {adv}; it {verdict}; {apart}.")
    return sc


def analyse(doc):
    """Recomputes every scenario's figures and the overall ones; returns doc with 'conclusions'."""
    for sc in doc["scenarios"]:
        analyse_scenario(sc)
    valid = [sc for sc in doc["scenarios"] if sc["valid"] and sc.get("regret") is not None]
    errors = [abs(e) for sc in valid for e in sc["relative_error"].values()]
    taus = [sc["tau"] for sc in valid if sc["tau"] is not None]
    within = sum(1 for sc in valid if sc.get("within"))
    overall = {"scenarios": len(doc["scenarios"]), "evaluated": len(valid), "within": within,
               "within_share": within / len(valid) if valid else None,
               "median_abs_error": statistics.median(errors) if errors else None, "errors": len(errors),
               "median_tau": statistics.median(taus) if taus else None,
               "tau_range": [min(taus), max(taus)] if taus else None}
    doc["overall"] = overall
    concl = [sc["sentence"] for sc in doc["scenarios"]]
    if valid:
        concl.append(
            f"Across {len(valid)} evaluated scenario(s) of {len(doc['scenarios'])}, the advised configuration was within "
            f"{WITHIN:.2f}x of the best found by running every candidate in {within} ({overall['within_share']:.0%}; "
            f"the target is {SHARE_TARGET:.0%}: {'met' if overall['within_share'] >= SHARE_TARGET else 'not met'}).")
    if errors:
        concl.append(
            f"The predicted times to target were off the measured ones by a median of {overall['median_abs_error']:.0%} "
            f"over {len(errors)} (scenario, configuration) pairs that reached the target in every seed both ways "
            f"(the target is {ERROR_TARGET:.0%} or less: {'met' if overall['median_abs_error'] <= ERROR_TARGET else 'not met'}).")
    if taus:
        concl.append(
            f"The predicted order of the configurations had a median Kendall tau of {overall['median_tau']:.2f} with the "
            f"measured order (from {overall['tau_range'][0]:.2f} to {overall['tau_range'][1]:.2f} over {len(taus)} "
            f"scenario(s); the target is {TAU_TARGET:g} or more: {'met' if overall['median_tau'] >= TAU_TARGET else 'not met'}).")
    doc["conclusions"] = concl
    return doc


# --------------------------------------------------------------------------------------------

def scenario_record(name, s, adv, out, a):
    """A scenario's raw data: the advice, the per-seed predictions and measurements."""
    names = [c["name"] for c in adv["candidates"]]
    seeds = list(range(a.first_seed, a.first_seed + a.seeds))
    meas, end, invalid, failed = {}, {}, {}, {}
    for k in names:
        meas[k], end[k] = {}, {}
        for sd in seeds:
            try:
                with open(result_path(out, name, k, sd)) as f:
                    r = json.load(f)
            except (OSError, ValueError):
                failed.setdefault(k, []).append(str(sd) + " (not run)")
                continue
            if "failed" in r:
                failed.setdefault(k, []).append(str(sd))
                continue
            if not r["valid"]:
                invalid.setdefault(k, []).append(str(sd))
            meas[k][str(sd)] = r["time_to_target_s"]
            end[k][str(sd)] = r["end_s"]
    return {"name": name, "scenario": s, "describe": describe(s), "advised": adv["recommended"]["name"],
            "advice_resolved": adv["recommended"]["resolved"], "calibrated": adv["cluster"],
            "validated": adv["validated"], "predicted": predicted_per_seed(out, name, adv), "measured": meas,
            "end_s": end, "invalid_runs": invalid, "failed_runs": failed, "hindsight_seeds": seeds,
            "advice_seeds": list(range(adv["proxy"]["seeds"]))}


def report(doc, out):
    lines = ["# Advice against hindsight", "", f"Command: `{doc['command']}`", "",
             "Each scenario: probed, advised from the probe (simulator, seeds 0..A-1), then every candidate run on the "
             "same emulated cluster (seeds " + ", ".join(map(str, doc["scenarios"][0]["hindsight_seeds"])) + "); times are "
             f"seconds to validation loss {doc['target_loss']:g} on the training clock.", ""]
    lines += ["## Conclusions", ""] + [f"- {c}" for c in doc["conclusions"]] + [""]
    for sc in doc["scenarios"]:
        lines += [f"## {sc['name']}: {sc['describe']}", "",
                  f"Calibrated from the probe: N = {sc['calibrated']['nodes']}, step {sc['calibrated']['step_s']:.3g} s, "
                  f"link {sc['calibrated']['link_gbit']:.3g} Gbit/s, r = {sc['calibrated']['ratio']:.2g}, slowdown "
                  f"{sc['calibrated']['slowdown']:.2f}x, jitter {sc['calibrated']['jitter']:.2f}; the simulator's "
                  f"validated range: {'inside' if sc['validated'].get('inside') else 'outside'}.", "",
                  "| configuration | predicted s | measured s [95%] | reached | error |", "|---|---|---|---|---|"]
        for k in sc["measured"]:
            pm = sc.get("predicted_mean_s", {}).get(k)
            ci = sc.get("measured_ci", {}).get(k)
            e = sc.get("relative_error", {}).get(k)
            reached = sum(x is not None for x in sc["measured"][k].values())
            mark = " (advised)" if k == sc["advised"] else ""
            mark += " (best)" if k == sc.get("best") else ""
            lines.append(f"| {k}{mark} | {pm:.3g} |" if pm is not None else f"| {k}{mark} | missed |")
            lines[-1] += f" {fmt_ci(ci, 3) if ci and ci.get('mean') is not None else '-'} | {reached}/{len(sc['measured'][k])} |" \
                         f" {e:+.0%} |" if e is not None else \
                f" {fmt_ci(ci, 3) if ci and ci.get('mean') is not None else '-'} | {reached}/{len(sc['measured'][k])} | - |"
        tau = sc.get("tau")
        lines += ["", f"Kendall tau (predicted vs measured order): {tau:.2f}" if tau is not None else "", ""]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def plot(doc, out):
    from plotting import pyplot
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 5))
    lo, hi = math.inf, 0.0
    for sc in doc["scenarios"]:
        pts = [(sc["predicted_mean_s"][k], sc["measured_mean_s"][k]) for k in sc.get("relative_error", {})]
        if not pts:
            continue
        ax.scatter([p for p, _ in pts], [m for _, m in pts], label=sc["name"], s=18)
        lo, hi = min(lo, *[min(p) for p in pts]), max(hi, *[max(p) for p in pts])
    if hi > 0:
        xs = [lo * 0.8, hi * 1.2]
        ax.plot(xs, xs, "k-", lw=0.8)
        ax.fill_between(xs, [x / (1 + ERROR_TARGET) for x in xs], [x * (1 + ERROR_TARGET) for x in xs], color="0.9")
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("predicted time to target (s)")
    ax.set_ylabel("measured time to target (s)")
    ax.set_title(f"Advice against hindsight (band: +-{ERROR_TARGET:.0%})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "hindsight.png"), dpi=120)
    plt.close(fig)


def write(doc, out):
    with open(os.path.join(out, "hindsight.json"), "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    report(doc, out)
    plot(doc, out)


def publish(out, dest, names):
    os.makedirs(dest, exist_ok=True)
    for f in ("hindsight.json", "report.md", "hindsight.png"):
        shutil.copy(os.path.join(out, f), os.path.join(dest, f))
    for n in names:
        os.makedirs(os.path.join(dest, n), exist_ok=True)
        shutil.copy(os.path.join(out, n, "probe", "probe.json"), os.path.join(dest, n, "probe.json"))
        shutil.copy(os.path.join(advise_dir(out, n), "advice.json"), os.path.join(dest, n, "advice.json"))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, in order (default: all)")
    ap.add_argument("--seeds", type=int, default=3, help="hindsight seeds per candidate (default 3)")
    ap.add_argument("--first-seed", type=int, default=100, help="the first hindsight seed (the advisor's are 0..A-1)")
    ap.add_argument("--advice-seeds", type=int, default=3, help="the advisor's --seeds (default 3)")
    ap.add_argument("--steps", type=int, default=150, help="the advisor's --steps, and every run's")
    ap.add_argument("--target-loss", type=float, default=3.0, help="the advisor's --target-loss (default 3.0)")
    ap.add_argument("--lanes", type=int, default=1, help="emulated runs at once (each in its own namespaces)")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "hindsight"))
    ap.add_argument("--dry-run", action="store_true", help="print the scenarios and runs; start nothing")
    ap.add_argument("--report-only", action="store_true", help="analyse what is cached; run nothing")
    ap.add_argument("--publish", help="copy the study's record under this directory")
    a = ap.parse_args(argv)
    unknown = [n for n in a.scenarios.split(",") if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    if a.seeds < 2 or a.advice_seeds < 2:
        ap.error("--seeds and --advice-seeds must be 2 or more (paired intervals need two seeds)")
    if a.first_seed < a.advice_seeds:
        ap.error(f"--first-seed {a.first_seed} overlaps the advisor's seeds 0..{a.advice_seeds - 1}: "
                 "the hindsight runs must be seeds the advice has not seen")
    if a.lanes < 1:
        ap.error("--lanes must be 1 or more")
    a.argv = argv
    return a


def run_lanes(jobs, lanes):
    """Runs the callables in `jobs` with at most `lanes` at once, in order."""
    if lanes == 1:
        for j in jobs:
            j()
        return
    it = iter(jobs)
    lock = threading.Lock()
    errors = []

    def lane():
        while True:
            with lock:
                j = next(it, None)
            if j is None or errors:
                return
            try:
                j()
            except BaseException as e:  # noqa: BLE001  (SystemExit from a run: end every lane)
                errors.append(e)
                return
    ts = [threading.Thread(target=lane) for _ in range(lanes)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    names = a.scenarios.split(",")
    os.makedirs(a.out, exist_ok=True)
    if a.dry_run:
        for n in names:
            s = SCENARIOS[n]
            print(f"{n}: {describe(s)}\n  probe: {' '.join(probe_command(s, os.path.join(a.out, n, 'probe')))}")
            print(f"  advise: seeds 0..{a.advice_seeds - 1}, {a.steps} steps, target {a.target_loss:g}; then "
                  f"{len(advise.CANDIDATES)} candidates x seeds {a.first_seed}..{a.first_seed + a.seeds - 1} emulated")
        return 0
    records = []
    for n in names:
        s = SCENARIOS[n]
        if a.report_only:
            try:
                with open(os.path.join(advise_dir(a.out, n), "advice.json")) as f:
                    adv = json.load(f)
            except OSError:
                print(f"[hindsight] {n}: not advised yet, left out", flush=True)
                continue
        else:
            # Probes alone (no other lane running): the probe's step times and link rates are what it measures.
            adv = run_advisor(n, probe(n, s, a.out), a.out, a)
            print(f"[hindsight] {n}: advised {adv['recommended']['name']}", flush=True)
            jobs = [(lambda k=k, sd=sd: measure(n, s, adv, k, sd, a)) for sd in range(a.first_seed, a.first_seed + a.seeds)
                    for k in (c["name"] for c in adv["candidates"])]
            run_lanes(jobs, a.lanes)
        records.append(scenario_record(n, s, adv, a.out, a))
    if not records:
        raise SystemExit("hindsight: no scenario has been advised yet (run without --report-only)")
    doc = analyse({"format": FORMAT, "command": "python experiments/hindsight.py " + " ".join(argv),
                   "target_loss": a.target_loss, "steps": a.steps, "scenarios": records})
    write(doc, a.out)
    for c in doc["conclusions"]:
        print(c)
    print(f"wrote {a.out}/hindsight.json, report.md, hindsight.png")
    if a.publish:
        publish(a.out, a.publish, [r["name"] for r in records])
        print(f"published under {a.publish}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
