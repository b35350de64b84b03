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


def sim_schedule(events):
    """churn.py's schedule as sim.churn's text: kind@t:node[:delay], comma-separated."""
    out = []
    for e in events:
        if e["kind"] == "join":
            out.append(f"join@{e['t_s']!r}:{e['node']}")
        else:
            out.append(f"{e['kind']}@{e['t_s']!r}:{e['node']}:{e['delay_s']!r}")
    return ",".join(out)


def command(a, name, seed, events, out):
    """The syncopate-sim command line of one run."""
    cfg = churn.CONFIGS[name]
    if cfg["kind"] != "ps":
        raise ValueError(f"{name}: the simulator models elastic parameter servers only; run the ring configurations "
                         "on the emulated cluster (--backend emulated)")
    cmd = [os.path.join(churn.BIN, "syncopate-sim"), "--out", out, "--quiet"] + churn.worker_flags(a, seed)
    cmd += ["--dist.mode=ps", "--dist.elastic=true", f"--ps.consistency={cfg['consistency']}",
            f"--ps.backup_workers={cfg['backup_workers']}", f"--ps.worker_timeout_s={a.worker_timeout_s!r}",
            f"--sim.workers={a.nodes}", f"--sim.servers={churn.SERVERS}", f"--sim.link_gbit={a.sim_link_gbit!r}",
            f"--sim.start_s={a.sim_start_s!r}", f"--sim.eval_workers={a.nodes}", f"--sim.churn={sim_schedule(events)}"]
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
    dropped = lost.get("partial_rounds", 0) + mem.get("dropped", 0) * every
    in_flight = lost.get("in_flight", 0)
    crashes = sum(1 for e in recs if e["applied"] and e["kind"] == "kill9")
    stats = []
    for k in range(churn.SERVERS):
        text = open(os.path.join(out, "logs", f"server{k}.log")).read() if rc == 0 else ""
        stats.append(json.loads(text.split("] stats ", 1)[1]) if "] stats " in text else {})
    acked = sum(1 for d in distinct.values() for x in d if x % every == 0)
    metrics = {
        "goodput": mem.get("goodput"), "useful_samples": mem.get("useful_samples"),
        "present_samples": mem.get("present_samples"), "present_node_s": mem.get("present_s"),
        "samples_per_step": a.batch, "time_to_end_s": sim.get("simulated_s"),
        "time_to_target_s": min(hits) if hits else None, "evaluations": len(evals), "target_loss": target,
        "lost_steps": {"dropped": dropped, "recomputed": 0, "in_flight_at_crash": in_flight,
                       "total": dropped + in_flight},
        "events_planned": len(recs), "events_applied": sum(1 for e in recs if e["applied"]),
        "events_not_possible": sum(1 for e in recs if not e["applied"]),
        "events_happened": sum(1 for e in recs if e["happened"]),
        "events_survived": sum(1 for e in recs if e["survived"]),
        "hangs": 0, "duplicate_data": len(positions) - len(set(positions)), "data_positions": len(positions),
        "rounds_redone": None, "final_val_loss": finals[-1]["val_loss"] if finals else None,
        "longest_stall_s": stall, "steps_logged": logged, "distinct_steps": distinct_n,
        "node_last_step": {str(r): (d[-1] if d else None) for r, d in distinct.items()},
        "server_duplicates": mem.get("duplicates"),
        "exactly_once": churn.exactly_once(cfg, stats, acked, crashes, a.steps // every) if rc == 0 else None,
        "acknowledged_pushes": acked, "overrun_share": None, "cpu_util": None,
        "simulated": True, "real_s": sim.get("real_s"),
    }
    return {"config": name, "seed": seed, "churn": bool(events), "dir": out, "backend": "sim",
            "status": "complete" if complete else "failed", "failure": failure, "events": recs, "hangs": [],
            "incarnations": [], "server_stats": stats, "metrics": metrics, "elapsed_s": elapsed, "t_train0_unix": None,
            "command": cmd}
