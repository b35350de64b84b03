"""churn.py's --backend sim: one configuration and seed of a churn study played by syncopate-sim, the
virtual-time cluster, instead of processes on loopback (experiments/sim/churn_schedule.h).

The same schedule (sim.churn: the events' times from when the first workers step, their nodes and
delays), the same worker flags, the same elastic parameter-server rules (the shards' own code), real
gradients; compute and links are modelled, a process's start-up is --sim-start-s. Deterministic: a seed
and a schedule give the same run every time, so a churn run and its reference differ by the events
alone, not by arrival order on a shared machine. Not modelled: the ring (fixed or elastic), worker
checkpoints (a crashed local SGD node resumes its inner state as of its last pushed round), messages
lost with a crashed process (what it sent before arrives).

The record has the keys an emulated run's has (churn.Run.execute), so that churn.py's comparisons,
final-loss tests and report read both; what the simulator cannot measure (host CPU, steps over their
modelled time, hangs beyond its deadlock check) is None or 0 and named in the report."""
import json
import os
import subprocess
import time

import churn


def sim_schedule(events, lag_s=0.0):
    """churn.py's schedule as sim.churn's text: kind@t:node[:delay], comma-separated. lag_s: added to every
    time (the emulation applies an event at its first poll past the time: half a poll late on average)."""
    out = []
    for e in events:
        t = round(e["t_s"] + lag_s, 6)
        if e["kind"] == "join":
            out.append(f"join@{t!r}:{e['node']}")
        else:
            out.append(f"{e['kind']}@{t!r}:{e['node']}:{e['delay_s']!r}")
    return ",".join(out)


def command(a, name, seed, events, out):
    """The syncopate-sim command line of one run."""
    cfg = churn.CONFIGS[name]
    if cfg["kind"] != "ps":
        raise ValueError(f"{name}: the simulator models elastic parameter servers only; run the ring configurations "
                         "on the emulated cluster (--backend emulated)")
    if cfg.get("local_sgd") and a.checkpoint_every != a.sync_every:
        raise ValueError(f"{name}: --checkpoint-every {a.checkpoint_every} with --sync-every {a.sync_every}: the simulator's "
                         "crashed node resumes its inner state as of its last round, which is its checkpoint only when "
                         "the two are equal; give them the same value")
    cmd = [os.path.join(churn.BIN, "syncopate-sim"), "--out", out, "--quiet"] + churn.worker_flags(a, seed)
    cmd += ["--dist.mode=ps", "--dist.elastic=true", f"--ps.consistency={cfg['consistency']}",
            f"--ps.backup_workers={cfg['backup_workers']}", f"--ps.worker_timeout_s={a.worker_timeout_s!r}",
            f"--sim.workers={a.nodes}", f"--sim.servers={churn.SERVERS}", f"--sim.link_gbit={a.sim_link_gbit!r}",
            f"--sim.start_s={a.sim_start_s!r}", f"--sim.restart_s={a.sim_restart_s!r}", f"--sim.exit_s={a.sim_exit_s!r}",
            f"--sim.eval_workers={a.nodes}", f"--sim.churn={sim_schedule(events, churn.POLL_S / 2)}"]
    if getattr(a, "sim_jitter", 0):
        cmd.append(f"--emulate.jitter={a.sim_jitter!r}")
    if "staleness_bound" in cfg:
        cmd.append(f"--ps.staleness_bound={cfg['staleness_bound']}")
    if cfg.get("local_sgd"):
        outer = churn.async_local_sgd_flags(a.async_outer_lr) if cfg.get("outer") == "async" else churn.DILOCO_FLAGS
        cmd += [f"--dist.sync_every={a.sync_every}"] + outer
    # Flags of the emulated workers that mean nothing in simulated time.
    drop = ("--checkpoint.", "--emulate.checkpoint_s", "--dist.check_every", "--dist.timeout_s", "--train.preempt_grace_s")
    return [c for c in cmd if not c.startswith(drop)]


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def execute(a, name, seed, events, out):
    """Runs one simulation and returns churn.py's record of it."""
    cfg = churn.CONFIGS[name]
    os.makedirs(out, exist_ok=True)
    cmd = command(a, name, seed, events, out)
    t0 = time.time()
    with open(os.path.join(out, "sim.log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    elapsed = time.time() - t0
    failure = None if rc == 0 else f"syncopate-sim exited {rc} (see {out}/sim.log)"
    sim = {}
    if rc == 0:
        with open(os.path.join(out, "sim.json")) as f:
            sim = json.load(f)
    mem = sim.get("membership", {})
    every = a.sync_every if cfg.get("local_sgd") else 1
    workers = a.nodes + sum(1 for e in events if e["kind"] == "join")
    lines = {r: read_jsonl(os.path.join(out, f"node{r}", "metrics.jsonl")) for r in range(workers)}
    steps = {r: [m for m in ls if "loss" in m] for r, ls in lines.items()}
    distinct = {r: sorted({m["step"] for m in s}) for r, s in steps.items()}
    # Data positions as churn.Run counts them: local SGD the last record of each step in a pushed round.
    positions = []
    for r, s in steps.items():
        last = {m["step"]: m for m in s}
        positions += [m["data_position"] for st, m in last.items()
                      if "data_position" in m and ((st - 1) // every + 1) * every in last]
    logged = sum(len(s) for s in steps.values())
    distinct_n = sum(len(d) for d in distinct.values())
    # Useful samples as churn.Run counts them from the logs (not the shards' own count, sim.json's): per-step
    # modes every distinct (node, step) logged minus the shards' dropped pushes (by their share of the
    # parameters: 2 equal shards); local SGD the rounds whose last step a node logged, H steps each, minus the
    # dropped ones. A crashed node's push that reached the shards unlogged is not counted, as emulated.
    finals = [m for m in lines.get(0, []) if m.get("job_final") and "val_loss" in m]
    evals = [m for ls in lines.values() for m in ls if "val_loss" in m]
    target = getattr(a, "target_loss", None) if getattr(a, "eval_every", 0) else None
    hits = [m["time_s"] for m in evals if target is not None and m["val_loss"] <= target]
    times = sorted(m["time_s"] for s in steps.values() for m in s)
    stall = max((b - x for x, b in zip(times, times[1:])), default=None)
    applied = {e["i"]: e["applied"] for e in mem.get("events", [])}
    # (The simulator refuses to end with a worker short of its budget, a deadlock: rc != 0.)
    complete = rc == 0 and bool(finals)
    if rc == 0 and not complete:
        failure = "incomplete: no job_final evaluation"
    recs = []
    for e in events:
        ok = bool(applied.get(e["i"]))
        recs.append(dict(e, applied=ok, why_not=None if ok else "its worker was not up (simulated)", happened=ok,
                         survived=ok and complete, t_applied_s=e["t_s"] if ok else None))
    lost = mem.get("lost_steps", {})
    in_flight = lost.get("in_flight", 0)
    crashes = sum(1 for e in recs if e["applied"] and e["kind"] == "kill9")
    stats = []
    for k in range(churn.SERVERS):
        text = ""
        if rc == 0:
            with open(os.path.join(out, "logs", f"server{k}.log")) as f:
                text = f.read()
        stats.append(json.loads(text.split("] stats ", 1)[1]) if "] stats " in text else {})
    acked = sum(1 for d in distinct.values() for x in d if x % every == 0)
    srv_dropped = sum(s_.get("dropped", 0) for s_ in stats) / max(1, len(stats))
    spp = a.batch
    if cfg.get("local_sgd"):
        pushed_rounds = sum(1 for d in distinct.values() for st in d if st % every == 0)
        applied_steps = every * max(0.0, pushed_rounds - srv_dropped)
        dropped = max(0.0, distinct_n - applied_steps)
    else:
        dropped = srv_dropped
        applied_steps = distinct_n - dropped
    useful = spp * applied_steps
    present = mem.get("present_s")
    ideal = spp * present / a.step_time if present else None
    last_step = {r: (d[-1] if d else None) for r, d in distinct.items()}
    for r, ls in lines.items():  # a node that joins at the job's last boundary takes the end and steps no more
        for m in ls:
            if "joined_at_step" in m:
                last_step[r] = max(last_step[r] or 0, m["joined_at_step"])
    metrics = {
        "goodput": useful / ideal if ideal else None, "useful_samples": useful,
        "present_samples": ideal, "present_node_s": present,
        "samples_per_step": a.batch, "time_to_end_s": sim.get("simulated_s"),
        "time_to_target_s": min(hits) if hits else None, "evaluations": len(evals), "target_loss": target,
        "lost_steps": {"dropped": dropped, "recomputed": logged - distinct_n, "in_flight_at_crash": in_flight,
                       "total": dropped + logged - distinct_n + in_flight},
        "events_planned": len(recs), "events_applied": sum(1 for e in recs if e["applied"]),
        "events_not_possible": sum(1 for e in recs if not e["applied"]),
        "events_happened": sum(1 for e in recs if e["happened"]),
        "events_survived": sum(1 for e in recs if e["survived"]),
        "hangs": 0, "duplicate_data": len(positions) - len(set(positions)), "data_positions": len(positions),
        "rounds_redone": None, "final_val_loss": finals[-1]["val_loss"] if finals else None,
        "longest_stall_s": stall, "steps_logged": logged, "distinct_steps": distinct_n,
        "node_last_step": {str(r): v for r, v in last_step.items()},
        "goodput_shards": mem.get("goodput"),  # the simulator's own count: the pushes the shards applied
        "server_duplicates": mem.get("duplicates"),
        "exactly_once": churn.exactly_once(cfg, stats, acked, crashes, a.steps // every) if rc == 0 else None,
        "acknowledged_pushes": acked, "overrun_share": None, "cpu_util": None,
        "simulated": True, "real_s": sim.get("real_s"),
    }
    return {"config": name, "seed": seed, "churn": bool(events), "dir": out, "backend": "sim",
            "status": "complete" if complete else "failed", "failure": failure, "events": recs, "hangs": [],
            "incarnations": [], "server_stats": stats, "metrics": metrics, "elapsed_s": elapsed, "t_train0_unix": None,
            "command": cmd}


# ---------------------------------------------------------------------------------------------
# Calibration and validation against the emulated cluster

TIME_TOL, LOSS_TOL = 0.05, 0.03  # the method issue's tolerances (experiments/validate_sim.py)


def summary(vals):
    vals = sorted(vals)
    if not vals:
        return None
    mid = len(vals) // 2
    return {"median": vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2, "min": vals[0], "max": vals[-1],
            "n": len(vals)}


def start_up(emu):
    """The emulated references' start-up: launch to first step of each node that started the job (median,
    and every value), from an emulated churn.json (sim.start_s). None: no process records (a simulated study)."""
    vals = []
    for r in emu["runs"]:
        if not r["churn"] and r["status"] == "complete" and r.get("incarnations"):
            vals += churn.node_phases(r)[0]
    return summary(vals)


def phases(emu):
    """From an emulated study's records: sim.start_s (the first nodes' launch to first step), sim.restart_s
    (a restarted or new node's launch to its first step after it) and sim.exit_s (a node's last step to its
    process's exit, nodes other than 0, whose exit waits for the job's end)."""
    first, later, tails = [], [], []
    for r in emu["runs"]:
        if r["status"] != "complete":
            continue
        for i in r.get("incarnations", []):
            f = os.path.join(r["dir"], f"node{i['node']}", "metrics.jsonl")
            steps = [m for m in read_jsonl(f) if "loss" in m
                     and m["unix_s"] >= i["start_unix"] and (i["end_unix"] is None or m["unix_s"] <= i["end_unix"])]
            if not steps:
                continue
            if i["inc"] == 0 and steps[0]["step"] == 1:
                first.append(steps[0]["unix_s"] - i["start_unix"])
            elif i["inc"] > 0 or steps[0]["step"] > 1:
                later.append(steps[0]["unix_s"] - i["start_unix"])
            if i["ended_by"] == "exit" and i["end_unix"] and i["node"] != 0:
                tails.append(i["end_unix"] - steps[-1]["unix_s"])
    return {"start_s": summary(first), "restart_s": summary(later), "exit_s": summary(tails)}


def by_seed(s, name, churned, metric):
    return {str(r["seed"]): r["metrics"].get(metric) for r in s["runs"]
            if r["config"] == name and bool(r["churn"]) == churned and r["status"] == "complete"}


def validate(emu, sim):
    """Per configuration of both studies: the figures and contrasts of PLAN.md, each checked by
    validate_sim's rule (the whole 95% interval of per-seed simulator - emulation differences within
    the tolerance)."""
    from validate_sim import check_contrast, check_figure  # noqa: E402
    out = {}
    for name in [c for c in emu["configs"] if c in sim["configs"]]:
        checks = {}
        for churned, label in ((True, "churn"), (False, "reference")):
            checks[f"goodput, {label}"] = check_figure(by_seed(emu, name, churned, "goodput"),
                                                        by_seed(sim, name, churned, "goodput"), "time", TIME_TOL)
            checks[f"final val loss, {label}"] = check_figure(by_seed(emu, name, churned, "final_val_loss"),
                                                               by_seed(sim, name, churned, "final_val_loss"), "loss",
                                                               LOSS_TOL)
        checks["goodput, churn / reference"] = check_contrast(
            by_seed(emu, name, True, "goodput"), by_seed(emu, name, False, "goodput"),
            by_seed(sim, name, True, "goodput"), by_seed(sim, name, False, "goodput"), "time", TIME_TOL)
        checks["final-loss gap, churn - reference"] = check_contrast(
            by_seed(emu, name, True, "final_val_loss"), by_seed(emu, name, False, "final_val_loss"),
            by_seed(sim, name, True, "final_val_loss"), by_seed(sim, name, False, "final_val_loss"), "loss", LOSS_TOL)
        out[name] = checks
    return out


def validation_report(emu, sim, checks, emu_dir, sim_dir):
    L = ["# The simulator's churn backend against the emulated cluster", "",
         f"Emulated: `{emu['command']}` ({emu_dir}, {emu['machine_time_s']:.0f} s). Simulated: `{sim['command']}` "
         f"({sim_dir}, {sim['machine_time_s']:.0f} s), sim.start_s {sim['settings'].get('sim_start_s')}.", "",
         f"Rule (validate_sim.check_figure): per seed simulator - emulation (relative for goodput, nats for losses); "
         f"pass when the whole 95% interval of their mean lies within +-{TIME_TOL:.0%} (goodput) or +-{LOSS_TOL} nats "
         "(losses); contrasts compare each side's churn run with its own reference first.", "",
         "| configuration | figure | mean difference | 95% interval | n | verdict |", "|---|---|---|---|---|---|"]
    for name, cs in checks.items():
        for fig, c in cs.items():
            pct = c["kind"] == "time"
            f = (lambda x: f"{x:+.2%}") if pct else (lambda x: f"{x:+.4f}")
            ci = c["ci95"]
            L.append(f"| {name} | {fig} | {'-' if c['mean'] is None else f(c['mean'])} | "
                     f"{'-' if ci[0] is None else f'[{f(ci[0])}, {f(ci[1])}]'} | {c['n']} | {c['verdict']}"
                     f"{': ' + c['why'] if c.get('why') else ''} |")
    L += ["", "Per seed (emulated / simulated):", "",
          "| configuration | seed | goodput churn | goodput reference | loss churn | loss reference | gap emulated | gap simulated |",
          "|---|---|---|---|---|---|---|---|"]
    for name in checks:
        e = {k: by_seed(emu, name, ch, m) for k, ch, m in (("gc", True, "goodput"), ("gr", False, "goodput"),
                                                            ("lc", True, "final_val_loss"), ("lr", False, "final_val_loss"))}
        s = {k: by_seed(sim, name, ch, m) for k, ch, m in (("gc", True, "goodput"), ("gr", False, "goodput"),
                                                            ("lc", True, "final_val_loss"), ("lr", False, "final_val_loss"))}
        for sd in sorted(set(e["lc"]) | set(s["lc"]), key=int):
            def pair(k, fmt):
                a, b = e[k].get(sd), s[k].get(sd)
                return f"{'-' if a is None else format(a, fmt)} / {'-' if b is None else format(b, fmt)}"
            def gap(d):
                a, b = d["lc"].get(sd), d["lr"].get(sd)
                return "-" if a is None or b is None else f"{a / b - 1:+.2%}"
            L.append(f"| {name} | {sd} | {pair('gc', '.3f')} | {pair('gr', '.3f')} | {pair('lc', '.4f')} | "
                     f"{pair('lr', '.4f')} | {gap(e)} | {gap(s)} |")
    return "\n".join(L) + "\n"


def main(argv=None):
    import argparse
    import sys
    ap = argparse.ArgumentParser(description="Calibrate and validate churn.py's simulator backend against the "
                                             "emulated cluster (the two studies' churn.json).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("calibrate", help="print sim.start_s from an emulated study's references")
    c.add_argument("emu")
    v = sub.add_parser("validate", help="check a simulated study against an emulated one of the same setup and seeds")
    v.add_argument("emu")
    v.add_argument("sim")
    v.add_argument("--out", help="directory for validation.md and validation.json (default: the simulated study's)")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    def load(d):
        with open(os.path.join(d, "churn.json")) as f:
            return json.load(f)
    if a.cmd == "calibrate":
        su = phases(load(a.emu))
        if su["start_s"] is None:
            raise SystemExit("churn_sim: the study has no complete reference with its processes' records (an emulated one "
                             "is needed)")
        print(json.dumps(su))
        return 0
    emu, sim = load(a.emu), load(a.sim)
    keys = ("nodes", "steps", "step_time", "batch", "sync_every", "async_outer_lr", "events_per_min", "max_events",
            "delay", "worker_timeout_s", "val_windows")
    diff = [k for k in keys if emu["settings"].get(k) != sim["settings"].get(k)]
    if diff or emu["seeds"] != sim["seeds"] or sim["settings"].get("backend") != "sim":
        raise SystemExit(f"churn_sim: not the same setup ({', '.join(diff) or 'seeds or backend'} differ)")
    checks = validate(emu, sim)
    out = a.out or a.sim
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "validation.json"), "w") as f:
        json.dump({"emulated": a.emu, "simulated": a.sim, "checks": checks, "start_up": start_up(emu)}, f, indent=1)
    text = validation_report(emu, sim, checks, a.emu, a.sim)
    with open(os.path.join(out, "validation.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
