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
from cluster_runs import read_jsonl, run_once
from method import time_to_target
from stats import fmt_ci, mean_ci95

FORMAT = "syncopate-switch/1"
SPEEDUP_TARGET = 1.3   # the issue's: the switch at least 1.3x sooner than staying
WITHIN_BEST = 1.10     # and no slower than the best static configuration by more than 10%
SCENARIO = "fast4"


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
    ap.add_argument("--report-only", action="store_true", help="analyse the cached runs; run nothing")
    ap.add_argument("--publish", metavar="DIR", help="copy switch.json and report.md here")
    a = ap.parse_args(argv)
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
    """cluster_runs' configuration of one run: a static candidate, or the switching job."""
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
    evals = [m for m in rows["node0"] if "val_loss" in m and "unix_s" in m]
    curve = sorted(({"t": m["unix_s"] - start - off(m["unix_s"]), "val_loss": m["val_loss"], "step": m["step"]}
                    for m in evals), key=lambda p: p["t"])
    return curve, end


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
    cfg, lr = config_of(name, a, s["nodes"])
    d = os.path.join(a.out, "runs", name, f"seed{seed}")
    line = " ".join(hindsight.cluster_command(cfg, em, job, seed, lr, d)) + f" readvise_args={a.readvise_args!r}"
    try:
        with open(os.path.join(d, "result.json")) as f:
            r = json.load(f)
        if r.get("command") == line and "failed" not in r:
            return r
    except (OSError, ValueError):
        pass
    if a.report_only or hindsight.STOP.is_set():
        return None
    if os.path.isdir(d):
        shutil.rmtree(d)
    env = {}
    if name == "switch":  # per-node shards at hand for a parameter-server pick, on the nodes' namespace addresses
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
        curve, end = unix_curve(d)
        r = {"config": name, "seed": seed, "end_s": end, "final_val_loss": curve[-1]["val_loss"],
             "valid": full["valid"], "invalid_because": full["invalid_because"],
             "overrun_share": full["overrun_share"], "cpu_util": full["cpu_util"],
             "curve": [[p["t"], p["val_loss"]] for p in curve], "command": line}
        if name == "switch":
            r["switch"] = switch_record(d)
    with open(os.path.join(d, "result.json"), "w") as f:
        json.dump(r, f)
    got = r.get("failed") or (f"end {r['end_s']:.1f} s, final loss {r['final_val_loss']:.4f}"
                              + ("" if r["valid"] else f" (INVALID: {r['invalid_because']})")
                              + (f", switch {r['switch']}" if "switch" in r else ""))
    print(f"[switch] {name} seed {seed}: {got} ({time.time() - t0:.0f} s real)", flush=True)
    return r


def analyse(runs, a):
    """The verdicts from the per-seed records {config: {seed: record}} (valid runs only)."""
    valid = {k: {sd: r for sd, r in v.items() if r and "failed" not in r and r["valid"]} for k, v in runs.items()}
    invalid = {k: {sd: (r.get("failed") or r["invalid_because"]) for sd, r in v.items()
                   if r and ("failed" in r or not r["valid"])} for k, v in runs.items()}
    rings = [r["final_val_loss"] for r in valid["ring"].values()]
    doc = {"format": FORMAT, "invalid": {k: v for k, v in invalid.items() if v}}
    if not rings:
        doc["verdict"] = "no valid ring run: nothing to compare with"
        return doc
    target = max(rings)
    doc["target"] = target
    seeds = sorted(set.intersection(*(set(v) for v in valid.values()))) if valid else []
    doc["paired_seeds"] = seeds
    per = {}
    for k, v in valid.items():
        per[k] = {}
        for sd in seeds:
            r = v[sd]
            t = time_to_target([{"t": x, "val_loss": y} for x, y in r["curve"]], target)
            per[k][sd] = {"time_to_target_s": t, "end_s": r["end_s"], "final_val_loss": r["final_val_loss"]}
    doc["per_seed"] = per
    cell = {k: [{"seed": sd, "time_to_target_s": x["time_to_target_s"], "simulated_s": x["end_s"]}
                for sd, x in v.items()] for k, v in per.items()}
    doc["judge"] = crossover.judge(cell) if seeds else None
    statics = {k: v for k, v in per.items() if k != "switch"}
    full = {k: mean_ci95([x["time_to_target_s"] for x in v.values()])["mean"] for k, v in statics.items()
            if v and all(x["time_to_target_s"] is not None for x in v.values())}
    doc["best_static"] = min(full, key=full.get) if full else None
    sw = per.get("switch", {})
    if sw and all(x["time_to_target_s"] is not None for x in sw.values()):
        ratio = [per["ring"][sd]["time_to_target_s"] / sw[sd]["time_to_target_s"] for sd in seeds]
        doc["speedup_vs_stay"] = mean_ci95(ratio)
        doc["speedup_vs_stay"]["per_seed"] = ratio
        sw_mean = mean_ci95([x["time_to_target_s"] for x in sw.values()])["mean"]
        if doc["best_static"]:
            doc["ratio_to_best_static"] = sw_mean / full[doc["best_static"]]
            # Paired too: per seed, the switch's time over the best static configuration's.
            doc["ratio_to_best_static_paired"] = mean_ci95(
                [sw[sd]["time_to_target_s"] / per[doc["best_static"]][sd]["time_to_target_s"] for sd in seeds])
        j = doc["judge"] or {}
        pv = (j.get("paired_vs_winner") or {})
        doc["speedup_met"] = doc["speedup_vs_stay"]["ci95"][0] >= SPEEDUP_TARGET if len(ratio) >= 2 else None
        doc["within_best_met"] = doc.get("ratio_to_best_static", 9) <= WITHIN_BEST
        # A switching job that failed is the feature failing, not an emulation that did not hold.
        failed = [sd for sd, r in runs.get("switch", {}).items() if r and "failed" in r]
        doc["switch_failed_seeds"] = failed
        if failed:
            doc["speedup_met"] = doc["within_best_met"] = False
        doc["switch_vs_winner"] = pv.get("switch") if j.get("winner") != "switch" else "switch is the winner"
    else:
        doc["speedup_vs_stay"] = None
        doc["verdict"] = "the switching job missed the target in some seed"
    doc["switches"] = {sd: valid.get("switch", {}).get(sd, {}).get("switch") for sd in seeds}
    return doc


def report(doc, a, s):
    lines = [f"# A switch mid-run (issue 29, second stage)", "",
             f"Cluster: {hindsight.describe(dict(s, slowdown=1.0))}; node {s['nodes'] - 1} {a.slowdown:g}x slower from "
             f"step {a.slow_from} of {a.steps}. First pick: {a.advice} (ring). Switch runs: --dist.readvise_every="
             f"{a.every}, re-advice `{a.readvise_args}`. Seeds {doc.get('paired_seeds')}.", ""]
    if "target" not in doc:
        return "\n".join(lines + [doc.get("verdict", "")]) + "\n"
    lines += [f"Target: {doc['target']:.4f} (the highest final validation loss of the ring's runs).", "",
              "config | time to target s (mean [95%]) | reached | end s | final val loss", "---|---|---|---|---"]
    for k, v in doc["per_seed"].items():
        t = mean_ci95([x["time_to_target_s"] for x in v.values()])
        e = mean_ci95([x["end_s"] for x in v.values()])
        fl = mean_ci95([x["final_val_loss"] for x in v.values()])
        reached = sum(x["time_to_target_s"] is not None for x in v.values())
        lines.append(f"{k} | {fmt_ci(t)} | {reached}/{len(v)} | {fmt_ci(e)} | {fmt_ci(fl, 4)}")
    lines.append("")
    sp = doc.get("speedup_vs_stay")
    if sp:
        lines.append(f"Speed-up of the switch over staying with the ring (per-seed ratios of the time to target): "
                     f"{fmt_ci(sp)}; per seed {', '.join(f'{x:.2f}' for x in sp['per_seed'])}; the issue's "
                     f"{SPEEDUP_TARGET}x {'met by the whole interval' if doc['speedup_met'] else 'not shown'}.")
        lines.append(f"Ratio to the best static configuration in hindsight ({doc['best_static']}): "
                     f"{doc.get('ratio_to_best_static', float('nan')):.3f} of the means, per-seed ratios "
                     f"{fmt_ci(doc['ratio_to_best_static_paired']) if doc.get('ratio_to_best_static_paired') else 'n/a'} "
                     f"(the issue's {WITHIN_BEST}, on the means: {'met' if doc['within_best_met'] else 'not met'}).")
        if doc.get("switch_failed_seeds"):
            lines.append(f"Switching runs that FAILED (counted against the feature): seeds {doc['switch_failed_seeds']}.")
    j = doc.get("judge") or {}
    lines.append(f"crossover.judge over every configuration: winner {j.get('winner')}, "
                 f"{'resolved' if j.get('resolved') else 'not resolved from ' + ', '.join(j.get('tied', []))}.")
    lines.append(f"Switches: {json.dumps(doc.get('switches'))}")
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
    doc = analyse(runs, a)
    doc.update({"command": "python experiments/switch_midrun.py " + " ".join(sys.argv[1:] if argv is None else argv),
                "scenario": dict(s, slow_from=a.slow_from, steps=a.steps), "every": a.every,
                "readvise_args": a.readvise_args, "first_advice": a.advice,
                "runs": {k: {sd: r for sd, r in v.items()} for k, v in runs.items()}})
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
