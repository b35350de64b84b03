"""A probe made from what a run measured, for `syncopate-advise --from-run RUN` (issue 29, second
stage): the advice a run started from (its node directories' advice.applied.json, written by the
worker in --dist.mode=auto) names the probe it was made from; that probe's job and links are kept,
and each node's step times are replaced by the node's own step times in the run (step_s - wait_s
of the last WINDOW steps of its metrics.jsonl: data, compute and pacing, no communication). The
run measures no link rate of its own, so the links stay as probed (said in the result's notes).
A node's rank is its config.toml's dist.node_rank, or, when that came from the environment, its
directory's name nodeN.

A run directory is either one node's --out directory (metrics.jsonl, config.toml) or a directory
of them (node0/, node1/, ... as scripts/local_cluster.sh writes)."""
import copy
import json
import os
import re
import statistics
import tomllib

APPLIED = "advice.applied.json"  # worker/sync/advice.h kAppliedAdviceFile


class RunError(Exception):
    pass


def node_dirs(paths):
    """The node output directories under `paths` (each holding metrics.jsonl)."""
    found = []
    for p in paths:
        if os.path.isfile(os.path.join(p, "metrics.jsonl")):
            found.append(p)
            continue
        subs = sorted(os.path.join(p, d) for d in os.listdir(p) if os.path.isfile(os.path.join(p, d, "metrics.jsonl"))) \
            if os.path.isdir(p) else []
        if not subs:
            raise RunError(f"{p}: no metrics.jsonl in it nor in a subdirectory: give a run's --out directory "
                           "(or the directory of its nodes' directories)")
        found += subs
    return found


def node_rank(d):
    """config.toml's dist.node_rank when the run set it; else (taken from $NODE_RANK, $RANK, ... at
    start: config.toml keeps -1) the directory's name nodeN, as scripts/local_cluster.sh names them."""
    path = os.path.join(d, "config.toml")
    try:
        with open(path, "rb") as f:
            r = int(tomllib.load(f)["dist"]["node_rank"])
    except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError) as e:
        raise RunError(f"{path}: cannot read dist.node_rank ({e}); is {d} a syncopate-worker output directory?")
    if r >= 0:
        return r
    m = re.fullmatch(r"node(\d+)", os.path.basename(os.path.normpath(d)))
    if not m:
        raise RunError(f"{d}: its rank came from the environment (config.toml's dist.node_rank is -1) and its name is "
                       "not nodeN: name the node directories node0, node1, ... (as scripts/local_cluster.sh does)")
    return int(m.group(1))


def records(d):
    """The records of node directory d's metrics.jsonl (objects only; a line cut by a crash is
    skipped: the others stand)."""
    with open(os.path.join(d, "metrics.jsonl")) as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(r, dict):
                yield r


def progress(d):
    """(the newest step of node directory d's metrics.jsonl, its config.toml's train.steps or None)."""
    newest = max((r["step"] for r in records(d) if type(r.get("step")) is int and "step_s" in r), default=0)
    try:
        with open(os.path.join(d, "config.toml"), "rb") as f:
            steps = int(tomllib.load(f)["train"]["steps"])
    except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError):
        steps = None
    return newest, steps


def own_steps(d, window):
    """The last `window` steps' own times (step_s - wait_s) of node directory d."""
    rows = []
    for r in records(d):
        s, w = r.get("step_s"), r.get("wait_s")
        if isinstance(s, (int, float)) and isinstance(w, (int, float)) and s == s and w == w:  # (NaN is written null)
            rows.append(max(0.0, s - w))
    if not rows:
        raise RunError(f"{d}/metrics.jsonl holds no step with step_s and wait_s")
    return rows[-window:]


def probe_from_run(paths, window=50):
    """(probe, the advice the run started from, notes)."""
    dirs = node_dirs(paths)
    advice_path = next((os.path.join(d, APPLIED) for d in dirs if os.path.isfile(os.path.join(d, APPLIED))), None)
    if advice_path is None:
        raise RunError(f"no {APPLIED} in {', '.join(dirs)}: the run was not started with --dist.mode=auto, so there "
                       "is no advice to re-run; run syncopate-probe and syncopate-advise instead")
    with open(advice_path) as f:
        advice = json.load(f)
    src = advice.get("probe")
    if not src or not os.path.isfile(src):
        raise RunError(f"{advice_path} names the probe {src!r}, which is not there: the links and the job come from "
                       "it; restore it, or run syncopate-probe again")
    with open(src) as f:
        probe = json.load(f)
    new = copy.deepcopy(probe)
    by_rank = {}
    for d in dirs:
        r = node_rank(d)
        if r in by_rank:
            raise RunError(f"{d} and {by_rank[r][0]} are both node {r}: give one run")
        by_rank[r] = (d, own_steps(d, window))
    notes = [f"node step times from the run (the last {window} steps' step_s - wait_s of each node's metrics.jsonl); "
             f"links, exchange rounds and job as probed in {src} (a run measures no link rate)"]
    nodes = []
    for old in probe.get("nodes", []):
        r = old.get("node")
        if r not in by_rank:
            nodes.append(old)
            notes.append(f"node {r}: not in the run given; its probed step times kept")
            continue
        d, s = by_rank.pop(r)
        nodes.append({"node": r, "host": old.get("host", ""), "from_run": d,
                      "step_s": {"samples": s, "min": min(s), "median": statistics.median(s), "mean": statistics.fmean(s),
                                 "max": max(s)}})
    for r, (d, _) in sorted(by_rank.items()):
        notes.append(f"node {r} ({d}) is not in the probe: ignored")
    new["nodes"] = nodes
    # Where the run stands: the step every node has reached (the newest of the slowest node), of its train.steps.
    at = [progress(d) for d in dirs]
    totals = {t for _, t in at if t}
    new["from_run"] = {"dirs": dirs, "probe": src, "advice": advice_path, "window": window,
                       "step": min(s for s, _ in at), "steps": max(totals) if totals else None}
    if len(totals) > 1:
        notes.append(f"the nodes' train.steps differ ({', '.join(map(str, sorted(totals)))}): the largest is taken")
    return new, advice, notes
