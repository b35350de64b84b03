"""A switch mid-run (issue 29, second stage): a job started with the advisor's pick for a fast,
homogeneous cluster, on which one node slows 3x halfway; with --dist.readvise_every it re-advises on
what it measured and switches at a checkpoint. Is it at least 1.3x sooner than staying with the first
pick, and within 10% of the best static configuration in hindsight?

  python experiments/switch_midrun.py [--seeds 3] [--first-seed 100] [--steps 300] [--slow-from 150]
        [--slowdown 3] [--every 10] [--configs ring,bsp_backup,...] [--readvise-args "--seeds 1"]
        [--out runs/switch] [--report-only] [--publish docs/study/switch]

The cluster is hindsight.py's fast4 (N = 4 in network namespaces, 1 Gbit/s tbf links, 0.1 s modelled
steps with jitter 0.05); its last node takes SLOWDOWN x its step from step SLOW_FROM on
(emulate.slowdown_from_step). The job is the advisor's proxy (micro, 2 sequences per node) over STEPS
steps per node (the schedule ends there), evaluated every 5 steps on node 0 (deferred: off the clock).
The first advice is the one hindsight.py's fast4 scenario wrote for target 3.0 from its probe (OUT of
hindsight.py: runs/hindsight/fast4/advise/t3/advice.json; it picks the ring); run hindsight.py first.
Runs per seed (FIRST..FIRST+S-1):
- "switch": --dist.mode=auto with that advice and --dist.readvise_every=EVERY, every node through
  scripts/launch_node.sh with per-node shards at hand (SYNCOPATE_SERVERS=per-node): node 0's
  launcher re-advises in the background (syncopate-advise --from-run, READVISE_ARGS, niced) while the
  job goes on, and the job switches at the next decision step if the pick changes. Its time includes
  the re-advice's, the checkpoint's, the restart's and the shards' start;
- every advisor candidate fixed from the start (the static configurations), with its own learning
  rate (the switch run keeps the ring's: an advice never sets it); "ring" is also the first pick's
  run without a switch ("stay").
Clock: wall time from the job's start (node 0's first step less its duration) on the hosts' clock
(unix_s), so that a restart's gap counts; evaluations are deferred, and the scoring that the switch's
checkpoint forces on node 0 (logged as scored_snapshots_s) is taken off the clock (unix_curve).
Measured per run: the end (the last step of any node) and the final validation loss of the job's
weights; time to the target, declared as the highest final validation loss of the ring's runs (the
loss at which staying with the first pick finishes, in every seed), linear between evaluations.
Verdicts, from the per-seed data: the switch's speed-up over staying (per-seed ratios of the time to
target, mean with a 95% interval; the paired difference's Holm-corrected test against the ring) and
its ratio to the best static configuration (lowest mean time to target among those that reached it in
every seed; crossover.judge over every configuration with the switch among them). A run whose
emulation did not hold (steps over their modelled time, saturated host CPU) is reported invalid and
left out. Runs are cached under OUT/runs/<config>/seed<k>/ by command line; writes OUT/switch.json
and OUT/report.md; --publish copies them under DIR.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import sys
import time

import advise
import crossover
import hindsight
from cluster_runs import cached_result, read_jsonl, run_once
from method import time_to_target
from stats import fmt_ci, holm, mean_ci95
from stats import paired as stats_paired

FORMAT = "syncopate-switch/1"
SPEEDUP_TARGET = 1.3   # the issue's: the switch at least 1.3x sooner than staying
WITHIN_BEST = 1.10     # and no slower than the best static configuration by more than 10%
SCENARIO = "fast4"
SWITCH_CARRIES = "weights, step, data, AdamW's moments to the shards (protocol 8)"


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=100)
    ap.add_argument("--steps", type=int, default=300, help="steps per node (the schedule's length)")
    ap.add_argument("--slow-from", type=int, default=150, help="the step from which the last node is slow")
    ap.add_argument("--slowdown", type=float, default=3.0)
    ap.add_argument("--every", type=int, default=10, help="--dist.readvise_every of the switch runs")
    ap.add_argument("--configs", default=",".join(advise.CANDIDATES), help="the static configurations")
    ap.add_argument("--readvise-args", default="--seeds 1",
                    help="SYNCOPATE_READVISE_ARGS: the re-advice's options (its latency is the job's time)")
    ap.add_argument("--advice", default=os.path.join(hindsight.ROOT, "runs", "hindsight", SCENARIO, "advise", "t3",
                                                     "advice.json"), help="the first advice")
    ap.add_argument("--out", default=os.path.join(hindsight.ROOT, "runs", "switch"))
    ap.add_argument("--control", action="store_true",
                    help="also the switching job and the ring on the cluster without the slowdown: what re-deciding "
                         "costs where nothing drifts, and whether it switches anyway")
    ap.add_argument("--report-only", action="store_true", help="analyse the cached runs; run nothing")
    ap.add_argument("--publish", metavar="DIR", help="copy switch.json and report.md here")
    a = ap.parse_args(argv)
    a.out = os.path.abspath(a.out)  # cached runs are keyed by their command line, which names their directory
    a.names = [c for c in a.configs.split(",") if c]
    bad = [c for c in a.names if c not in advise.CANDIDATES]
    if bad or "ring" not in a.names:
        ap.exit(2, f"switch_midrun: --configs must name advisor candidates and include ring (the first pick); "
                   f"unknown: {', '.join(bad) or '-'}\n")
    if not 0 < a.slow_from < a.steps or a.every < 1 or a.seeds < 1 or a.slowdown <= 1:
        ap.exit(2, "switch_midrun: need 0 < --slow-from < --steps, --every >= 1, --seeds >= 1, --slowdown > 1\n")
    if not os.path.isfile(a.advice):
        ap.exit(2, f"switch_midrun: the first advice {a.advice} is not there: run experiments/hindsight.py "
                   f"--scenarios {SCENARIO} first (or give --advice)\n")
    return a


def setup(a):
    """(scenario, em, job) of every run: fast4 with its last node slow from --slow-from."""
    s = dict(hindsight.SCENARIOS[SCENARIO], slowdown=a.slowdown)
    with open(a.advice) as f:
        px = json.load(f)["proxy"]
    em, job = hindsight.measured_setup(s, dict(px, steps=a.steps))
    job["evals"] = a.steps // px["eval_every"]
    return s, em, job


def config_of(name, a, nodes):
    """cluster_runs' configuration of one run: a static candidate, or the switching job ("control_X":
    X on the cluster without the slowdown)."""
    name = name.removeprefix("control_")
    slow = [f"--emulate.slowdown_from_step={a.slow_from}"]
    if name != "switch":
        cfg = hindsight.candidate_cfg(name, nodes)
        cfg["worker"] = cfg["worker"] + slow
        return cfg, advise.CANDIDATES[name][1]
    # The job file gives the shards and the workers plain TCP, like the static ps runs (--encrypt off).
    return {"ring": True, "cluster": [], "worker": [
        "--dist.mode=auto", f"--dist.advice={a.advice}", f"--dist.readvise_every={a.every}",
        f"--config={os.path.join(a.out, 'plain_tcp.toml')}"] + slow}, advise.CANDIDATES["ring"][1]


def unix_curve(d):
    """Node 0's evaluations of the job's weights on the hosts' clock from the job's start, and the end.
    The scoring of deferred evaluations that a checkpoint forces on node 0 (the switch's; the trainer
    logs its span as scored_snapshots_s) is taken off every later point and off the end: the static
    runs, which write no checkpoint, score theirs after training. (Approximate for the end: the other
    nodes may have stepped on meanwhile in a parameter-server phase.)"""
    nodes = sorted(x for x in os.listdir(d) if x.startswith("node") and os.path.isdir(os.path.join(d, x)))
    rows = {n: read_jsonl(os.path.join(d, n, "metrics.jsonl")) for n in nodes}
    steps = {n: [m for m in ms if "tokens_per_s" in m] for n, ms in rows.items()}
    scored = [(m["unix_s"], m["scored_snapshots_s"]) for m in rows["node0"] if "scored_snapshots_s" in m]
    off = lambda u: sum(s for at, s in scored if at <= u)  # noqa: E731 (the scoring spans before unix time u)
    start = steps["node0"][0]["unix_s"] - steps["node0"][0]["step_s"]
    last = max(ms[-1]["unix_s"] for ms in steps.values())
    end = last - start - off(last)
    node_ends = {n: ms[-1]["unix_s"] - start - off(ms[-1]["unix_s"]) for n, ms in steps.items()}
    evals = [m for m in rows["node0"] if "val_loss" in m and "unix_s" in m]
    curve = sorted(({"t": m["unix_s"] - start - off(m["unix_s"]), "val_loss": m["val_loss"], "step": m["step"]}
                    for m in evals), key=lambda p: p["t"])
    return curve, end, node_ends


def switch_record(d):
    """What the switching job did: the step it switched at, to what, and the re-advice's own record."""
    log = os.path.join(d, "logs", "node0.log")
    rec = {"switched_at": None, "to": None}
    try:
        with open(log) as f:
            for line in f:
                if "to switch to" in line and "stopped after step" in line:
                    rec["switched_at"] = int(line.split("stopped after step ")[1].split()[0])
                    rec["to"] = line.split("to switch to ")[1].split(" and wrote")[0]
                if "asked node 0's launcher for a re-advice" in line:
                    rec["requested_at"] = int(line.split("step ")[1].split(":")[0])
                if "re-advice on what the run measured keeps" in line:
                    rec["kept"] = line.split("keeps ")[1].split(":")[0]
    except OSError:
        pass
    return rec


def measure(name, seed, a, s, em, job):
    if name.startswith("control_"):  # the same cluster, no node slows
        em = hindsight.emulation(dict(s, slowdown=1.0))
    cfg, lr = config_of(name, a, s["nodes"])
    d = os.path.join(a.out, "runs", name, f"seed{seed}")
    line = " ".join(hindsight.cluster_command(cfg, em, job, seed, lr, d)) + f" readvise_args={a.readvise_args!r}"
    if name.endswith("switch"):  # what the switch carries (a cached run of an older build is made again)
        line += f" carries={SWITCH_CARRIES!r}"
    if (r := cached_result(d, line)) is not None:
        if "node_ends_s" not in r and os.path.isdir(os.path.join(d, "node0")):  # (a run cached before it was kept)
            r["node_ends_s"] = unix_curve(d)[2]
            with open(os.path.join(d, "result.json"), "w") as f:
                json.dump(r, f)
        return r
    if a.report_only or hindsight.STOP.is_set():
        return None
    env = {}  # (run_once empties d before it makes the run)
    if name.endswith("switch"):  # per-node shards at hand for a parameter-server pick, on the nodes' namespace addresses
        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            port = sk.getsockname()[1]
        env = {"SYNCOPATE_SERVERS": "per-node", "SYNCOPATE_PS_PORT": str(port),
               "SYNCOPATE_NODE_HOSTS": ",".join(f"10.77.0.{i + 1}" for i in range(s["nodes"])),
               "SYNCOPATE_READVISE_ARGS": a.readvise_args}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    t0 = time.time()
    try:
        full = run_once(name, cfg, em, job, seed, lr, d)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if hindsight.STOP.is_set():
        shutil.rmtree(d, ignore_errors=True)
        return None
    if "failed" in full:
        r = {"config": name, "seed": seed, "failed": full["failed"], "log": full["log"], "command": line}
    else:
        curve, end, node_ends = unix_curve(d)
        r = {"config": name, "seed": seed, "end_s": end, "node_ends_s": node_ends, "final_val_loss": curve[-1]["val_loss"],
             "valid": full["valid"], "invalid_because": full["invalid_because"],
             "overrun_share": full["overrun_share"], "cpu_util": full["cpu_util"],
             "curve": [[p["t"], p["val_loss"]] for p in curve], "command": line}
        if name.endswith("switch"):
            r["switch"] = switch_record(d)
    with open(os.path.join(d, "result.json.tmp"), "w") as f:
        json.dump(r, f)
    os.replace(os.path.join(d, "result.json.tmp"), os.path.join(d, "result.json"))  # whole or absent
    got = r.get("failed") or (f"end {r['end_s']:.1f} s, final loss {r['final_val_loss']:.4f}"
                              + ("" if r["valid"] else f" (INVALID: {r['invalid_because']})")
                              + (f", switch {r['switch']}" if "switch" in r else ""))
    print(f"[switch] {name} seed {seed}: {got} ({time.time() - t0:.0f} s real)", flush=True)
    return r


def _diff(d, digits=3):
    """'m [lo, hi]' of a stats.paired result."""
    if d["mean_diff"] is None:
        return "n/a"
    if d["ci95"][0] is None:
        return f"{d['mean_diff']:.{digits}g} ({d['n']} seed)"
    return f"{d['mean_diff']:.{digits}g} [{d['ci95'][0]:.{digits}g}, {d['ci95'][1]:.{digits}g}]"


def _p(p):
    return "n/a" if p is None else f"{p:.3g}"


def _verdict(diff, p):
    """How a paired difference (other minus the switch, seconds) and its Holm p read."""
    if p is None or diff["mean"] is None or diff["n"] < 2 or p >= 0.05:
        return "not resolved"
    return "resolved: the switch is sooner" if diff["mean"] > 0 else "resolved: the switch is later"


def analyse(runs, control=None):
    """The verdicts and the conclusion sentences from the per-seed records {config: {seed: record}}
    (valid runs only; a failed switching run is the feature failing and is named). Paired comparisons
    with the switch: its time to target against the ring and the best static configuration (Holm over
    those two) where it reached the target in every seed; else one paired test with its misses counted
    at its end (no correction: the only test of its kind); its end against the ring's; node 0's finish
    and the final loss (descriptive). Pure: check_study.py recomputes it from switch.json's runs."""
    valid = {k: {sd: r for sd, r in v.items() if r and "failed" not in r and r["valid"]} for k, v in runs.items()}
    invalid = {k: {sd: (r.get("failed") or r["invalid_because"]) for sd, r in v.items()
                   if r and ("failed" in r or not r["valid"])} for k, v in runs.items()}
    doc = {"format": FORMAT, "invalid": {k: v for k, v in invalid.items() if v}, "conclusions": []}
    rings = [r["final_val_loss"] for r in valid.get("ring", {}).values()]
    if not rings or not valid.get("switch"):
        doc["conclusions"].append("No valid ring run or no valid switching run: nothing to compare.")
        return doc
    target = max(rings)
    doc["target"] = target
    seeds = sorted(set.intersection(*(set(v) for v in valid.values() if v)))
    doc["paired_seeds"] = seeds
    per = {}
    for k, v in valid.items():
        if not v:
            continue
        per[k] = {}
        for sd in seeds:
            r = v[sd]
            t = time_to_target([{"t": x, "val_loss": y} for x, y in r["curve"]], target)
            per[k][sd] = {"time_to_target_s": t, "end_s": r["end_s"], "final_val_loss": r["final_val_loss"],
                          "node0_end_s": (r.get("node_ends_s") or {}).get("node0")}
    doc["per_seed"] = per
    cell = {k: [{"seed": sd, "time_to_target_s": x["time_to_target_s"], "simulated_s": x["end_s"]}
                for sd, x in v.items()] for k, v in per.items()}
    statics = {k: v for k, v in per.items() if k != "switch"}
    reached_all = {k for k, v in statics.items() if all(x["time_to_target_s"] is not None for x in v.values())}
    full = {k: mean_ci95([x["time_to_target_s"] for x in statics[k].values()]) for k in reached_all}
    best = min(full, key=lambda k: full[k]["mean"]) if full else None
    doc["best_static"] = best
    sw = per["switch"]
    sw_t = mean_ci95([x["time_to_target_s"] for x in sw.values()])
    sw_reached = sum(x["time_to_target_s"] is not None for x in sw.values())
    failed = sorted(sd for sd, r in runs.get("switch", {}).items() if r and "failed" in r)
    doc["switch_failed_seeds"] = failed
    # Paired with the switch (a seed that missed the target counts at its run's end), Holm over the two.
    others = [k for k in dict.fromkeys(["ring", best]) if k]
    diffs = {k: crossover.paired(cell, "switch", k) for k in others} if sw_reached == len(sw) else {}
    for k, ph in zip(diffs, holm([diffs[k]["p"] for k in diffs])):
        diffs[k]["p_holm"] = ph
    doc["paired_vs_switch"] = diffs
    tail = f" ({len(seeds)} seeds, paired; Holm over {len(diffs)} comparisons)"
    if failed:
        doc["conclusions"].append(f"The switching job FAILED in seed(s) {', '.join(map(str, failed))}: the feature did "
                                  "not work there, whatever the other seeds show.")
    if sw_reached < len(sw):
        doc["speedup_met"] = doc["within_best_met"] = False
        # Its misses counted at the run's end (a lower bound of their time), paired with the ring.
        at_end = {sd: x["time_to_target_s"] if x["time_to_target_s"] is not None else x["end_s"] for sd, x in sw.items()}
        ring_t = {sd: x["time_to_target_s"] for sd, x in per["ring"].items()}
        d = stats_paired(ring_t, at_end)
        doc["ring_minus_switch_misses_at_end"] = d
        doc["conclusions"].append(
            f"The switching job reached the target {target:.4f} (the ring's worst final validation loss) in "
            f"{sw_reached} of {len(sw)} seeds only: no speed-up is shown (its misses counted at its end, ring minus "
            f"switch {_diff(d)} s, p {_p(d['p'])}; {len(seeds)} seeds, paired).")
    else:
        ratio = [per["ring"][sd]["time_to_target_s"] / sw[sd]["time_to_target_s"] for sd in seeds]
        sp = mean_ci95(ratio)
        doc["speedup_vs_stay"] = dict(sp, per_seed=ratio)
        doc["speedup_met"] = sp["n"] >= 2 and sp["ci95"][0] >= SPEEDUP_TARGET and not failed
        d = diffs["ring"]
        doc["conclusions"].append(
            f"Switching reached the target {target:.4f} (the ring's worst final validation loss) in {fmt_ci(sw_t)} s "
            f"against {fmt_ci(mean_ci95([x['time_to_target_s'] for x in per['ring'].values()]))} s staying on the ring: "
            f"{fmt_ci(sp)}x per seed, ring minus switch {fmt_ci(d)} s, Holm p {_p(d['p_holm'])}, "
            f"{_verdict(d, d['p_holm'])}; the issue's {SPEEDUP_TARGET}x is "
            f"{'shown' if doc['speedup_met'] else 'not shown'}{tail}.")
        if best:
            r2 = mean_ci95([sw[sd]["time_to_target_s"] / per[best][sd]["time_to_target_s"] for sd in seeds])
            doc["ratio_to_best_static"] = r2
            doc["within_best_met"] = r2["n"] >= 2 and r2["ci95"][1] <= WITHIN_BEST and not failed
            if best != "ring":
                d2 = diffs[best]
                versus = f", {best} minus switch {fmt_ci(d2)} s, Holm p {_p(d2['p_holm'])}, {_verdict(d2, d2['p_holm'])}"
            else:
                versus = " (the ring: the comparison above)"
            doc["conclusions"].append(
                f"The best static configuration in hindsight is {best} ({fmt_ci(full[best])} s to the target); the "
                f"switch's time over it is {fmt_ci(r2)} per seed{versus}; within {WITHIN_BEST}x is "
                f"{'shown' if doc['within_best_met'] else 'not shown'}{tail}.")
    # Descriptive (not the issue's measure: the step budgets are equal, the samples applied are not, and
    # the job's final weights wait for the slow node): node 0, a fast node, finishing its steps.
    n0 = {k: {sd: x["node0_end_s"] for sd, x in v.items()} for k, v in per.items()}
    if all(x is not None for x in list(n0["switch"].values()) + list(n0["ring"].values())):
        r0 = mean_ci95([n0["ring"][sd] / n0["switch"][sd] for sd in seeds])
        dl = stats_paired({sd: x["final_val_loss"] for sd, x in sw.items()},
                          {sd: x["final_val_loss"] for sd, x in per["ring"].items()})
        doc["node0_finish_ratio"], doc["final_loss_switch_minus_ring"] = r0, dl
        doc["conclusions"].append(
            f"Node 0 (a fast node) finished its steps {fmt_ci(r0)}x sooner per seed in the switching job than on the "
            f"ring, with a final validation loss higher by {_diff(dl, 4)} (switch minus ring, p {_p(dl['p'])}); the "
            f"job's final weights were read when its last node was done, {fmt_ci(mean_ci95([x['end_s'] for x in sw.values()]))} s "
            f"against the ring's {fmt_ci(mean_ci95([x['end_s'] for x in per['ring'].values()]))} s.")
    # The job's end (its final weights exist when the last node is done), paired with the ring.
    de = stats_paired({sd: x["end_s"] for sd, x in sw.items()}, {sd: x["end_s"] for sd, x in per["ring"].items()})
    doc["end_switch_minus_ring"] = de
    resolved = de["p"] is not None and de["p"] < 0.05
    er = mean_ci95([per["ring"][sd]["end_s"] / sw[sd]["end_s"] for sd in seeds])
    doc["end_ratio_ring_over_switch"] = er
    doc["end_ratio_clears_target"] = er["n"] >= 2 and er["ci95"][0] is not None and er["ci95"][0] >= SPEEDUP_TARGET
    doc["conclusions"].append(
        f"The job's end (its final weights, when the last node is done), switch minus ring: {_diff(de)} s (p "
        f"{_p(de['p'])}, {('resolved: later' if de['mean_diff'] > 0 else 'resolved: sooner') if resolved else 'not resolved'}"
        f"; {len(seeds)} seeds, paired); the ring's end over the switch's is {fmt_ci(er)}x per seed, "
        f"{'clearing' if doc['end_ratio_clears_target'] else 'not clearing'} the issue's {SPEEDUP_TARGET}x at equal step "
        "budgets (the final losses above).")
    missed = sorted(set(statics) - reached_all)
    if missed:
        doc["conclusions"].append(
            "Missed the target in some seed (final validation loss, mean): " + ", ".join(
                f"{k} {mean_ci95([x['final_val_loss'] for x in statics[k].values()])['mean']:.4f}" for k in missed)
            + f"; the switching job ended at {mean_ci95([x['final_val_loss'] for x in sw.values()])['mean']:.4f}, "
            f"the ring at {mean_ci95([x['final_val_loss'] for x in per['ring'].values()])['mean']:.4f}.")
    doc["switches"] = {sd: valid["switch"][sd].get("switch") for sd in seeds}
    if control:
        doc["control"] = c = analyse_control(control)
        if c["seeds"]:
            switched = [sd for sd, w in c["switched"].items() if w and w.get("switched_at") is not None]
            ratio = c["end_ratio"]
            resolved = ratio["n"] >= 2 and (ratio["ci95"][0] > 1 or ratio["ci95"][1] < 1)
            doc["conclusions"].append(
                f"Where no node slows (control), the switching job's end over the ring's is {fmt_ci(ratio, 4)} per "
                f"seed ({'resolved' if resolved else 'not resolved'}); it switched in {len(switched)} of "
                f"{len(c['seeds'])} seeds.")
    return doc


def analyse_control(runs):
    """Where nothing drifts: did the switching job switch, and what did re-deciding cost (its end over
    the ring's, per seed; the same learning rate, so the same curve unless it switched)?"""
    ok = {k: {sd: r for sd, r in v.items() if r and "failed" not in r and r["valid"]} for k, v in runs.items()}
    seeds = sorted(set(ok.get("control_switch", {})) & set(ok.get("control_ring", {})))
    ratio = [ok["control_switch"][sd]["end_s"] / ok["control_ring"][sd]["end_s"] for sd in seeds]
    return {"seeds": seeds, "end_ratio": mean_ci95(ratio) | {"per_seed": ratio},
            "switched": {sd: ok["control_switch"][sd].get("switch") for sd in seeds},
            "final_val_loss": {k: {sd: ok[k][sd]["final_val_loss"] for sd in seeds} for k in ok},
            "invalid": {k: {sd: (r.get("failed") or r["invalid_because"]) for sd, r in v.items()
                            if r and ("failed" in r or not r["valid"])} for k, v in runs.items()}}


def report(doc, a, s):
    lines = ["# A switch mid-run (issue 29, second stage)", "",
             f"Cluster: {hindsight.describe(dict(s, slowdown=1.0))}; node {s['nodes'] - 1} {a.slowdown:g}x slower from "
             f"step {a.slow_from} of {a.steps}. First pick: {a.advice} (ring). Switch runs: --dist.readvise_every="
             f"{a.every}, re-advice `{a.readvise_args}`. Seeds {doc.get('paired_seeds')}.", ""]
    if "per_seed" in doc:
        lines += [f"Target: {doc['target']:.4f} (the highest final validation loss of the ring's runs).", "",
                  "config | time to target s (mean [95%]) | reached | end s (last node) | node 0's last step s | final val loss",
                  "---|---|---|---|---|---"]
        for k, v in doc["per_seed"].items():
            t = mean_ci95([x["time_to_target_s"] for x in v.values()])
            if any(x["time_to_target_s"] is None for x in v.values()):
                t = mean_ci95([])  # (a mean over the seeds that reached it would flatter a configuration that missed)
            e = mean_ci95([x["end_s"] for x in v.values()])
            fl = mean_ci95([x["final_val_loss"] for x in v.values()])
            reached = sum(x["time_to_target_s"] is not None for x in v.values())
            n0 = mean_ci95([x.get("node0_end_s") for x in v.values()])
            lines.append(f"{k} | {fmt_ci(t)} | {reached}/{len(v)} | {fmt_ci(e)} | {fmt_ci(n0)} | {fmt_ci(fl, 4)}")
        lines.append("")
    lines += ["Conclusions (the tool's):", ""] + [f"- {c}" for c in doc["conclusions"]] + [""]
    lines.append(f"Switches: {json.dumps(doc.get('switches'))}")
    if doc.get("control"):
        lines.append(f"Control switches: {json.dumps(doc['control']['switched'])}")
    if doc.get("invalid"):
        lines.append(f"Invalid or failed runs, left out: {json.dumps(doc['invalid'])}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    s, em, job = setup(a)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "plain_tcp.toml"), "w") as f:
        f.write('[dist]\nps_encrypt = "off"\n\n[server]\nencrypt = "off"\n')
    signal.signal(signal.SIGTERM, hindsight._sigterm)
    runs = {k: {} for k in ["switch"] + a.names}
    order = [(k, sd) for sd in range(a.first_seed, a.first_seed + a.seeds) for k in ["switch"] + a.names]
    try:
        for k, sd in order:  # one at a time: a lane beside a run slows it (hindsight.py's lanes check)
            runs[k][sd] = measure(k, sd, a, s, em, job)
    except KeyboardInterrupt:
        hindsight.STOP.set()
        print("[switch] interrupted: the running cluster was stopped; no interrupted run is kept", file=sys.stderr)
        return 130
    if a.control:
        try:
            for sd in range(a.first_seed, a.first_seed + a.seeds):
                for k in ("control_switch", "control_ring"):
                    runs.setdefault(k, {})[sd] = measure(k, sd, a, s, em, job)
        except KeyboardInterrupt:
            hindsight.STOP.set()
            return 130
    control = {k: runs.pop(k) for k in ("control_switch", "control_ring") if k in runs}
    doc = analyse(runs, control)
    doc.update({"command": "python experiments/switch_midrun.py " + " ".join(sys.argv[1:] if argv is None else argv),
                "scenario": dict(s, slow_from=a.slow_from, steps=a.steps), "every": a.every,
                "readvise_args": a.readvise_args, "first_advice": a.advice,
                "runs": {k: {sd: r for sd, r in v.items()} for k, v in runs.items()}, "control_runs": control})
    with open(os.path.join(a.out, "switch.json"), "w") as f:
        json.dump(doc, f, indent=1)
    text = report(doc, a, s)
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(text)
    print(text)
    if a.publish:
        os.makedirs(a.publish, exist_ok=True)
        for f in ("switch.json", "report.md"):
            shutil.copy(os.path.join(a.out, f), os.path.join(a.publish, f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
