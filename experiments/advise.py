"""The advisor (issue 29): which synchronization should my job use, on this cluster?

  python experiments/advise.py probe.json [--target-loss L] [--seeds 3] [--steps 150]
        [--configs ring,bsp_backup,...] [--out DIR] [--dry-run]
  (scripts/syncopate-advise is the same command)

Reads the probe.json that syncopate-probe measured on the user's cluster and:
1. Calibrates the cluster: N nodes; the base step T = the median over nodes of each node's fastest
   step (min); a node's slowdown = its min / T, and nodes at 1.5x or more are stragglers (the
   largest factor stands for all of them); jitter = the median over nodes of mean / min - 1 (the
   emulation's model: step = base x slowdown x (1 + X), X exponential with mean jitter); the link
   rate B = the slowest ring link's goodput; one-way latency = the median over links of RTT / 2.
   The ratio r = (time to move the model's bytes twice over B) / T, as crossover.py defines it.
2. Replays the cluster in syncopate-sim as crossover.py does: the micro model, a modelled 0.1 s
   step, the link rate that keeps r, the latency dilated by 0.1 / T, the stragglers and jitter as
   measured, K servers (--servers K; else the shard count the probe's BSP round trips went to, the
   job's layout; else min(N, 16), said in the assumptions) whose links together carry the workers'
   (K x B_server = N x B); or the K servers on nodes 0..K-1 sharing those nodes' links instead
   (as scripts/local_cluster.sh --netns and launch_node.sh start them; sim.colocate_servers): where
   the probe found every shard at a node's address (each node's "address" against
   ps.endpoint_addresses), or with --server-placement nodes; --server-placement dedicated forces the
   first, which is also taken where the probe does not tell (said in the assumptions).
   Candidates: ring, bsp_backup, ssp4, asp_lr_scale, diloco10 (crossover.CONFIGS, same learning
   rates), diloco50 (ring, H = 50, Nesterov) and async_local_sgd (ps, ASP, H = 10, delayed
   Nesterov); seeds 0..S-1; each run stops at the target loss or at --limit x the ring's time
   (the ring always runs: it sets the limit). Runs are cached under OUT/runs/<config>/seed<k>/
   (result.json; a cached run made with another command is run again).
   Where the probe timed the job's exchanges at the model's size (ring_exchange: the ring's
   all-reduce; ps: the BSP round trip to the job's shards), each pattern's messages get the share of
   the link rate that makes the simulated exchange take the measured round (--sim.ring_goodput for
   ring and DiLoCo, --sim.ps_goodput for the parameter-server candidates; solved from two simulated
   exchanges cached under OUT/calibration/, clamped to [0.001, 4] and said so);
   Where it also timed spread rounds (ps_spread: the round trip to ASP shards on the job's nodes,
   node r starting r/N of a step after node 0), --spread-calibration asp gives that pattern's share
   to ASP and asynchronous local SGD, async to SSP as well; the default, none, keeps BSP's share for
   every parameter-server candidate (session 42's development check: the spread share brought ASP
   closer and SSP farther, docs/STUDY.md; on six held-out clusters, session 42, not resolved);
   --no-exchange-calibration models every message at the bulk goodput B instead, and
   --calibration-only writes OUT/calibration.json and stops there.
3. Ranks them by mean time to target (95% interval over seeds) and names the winner; another is
   resolved behind it by the paired, Holm-corrected test of crossover.judge, else "not resolved".
   Proxy seconds map to the cluster's as x T / 0.1 (the proxy keeps the ratios, not the loss curve).
   The rest of a run (--from-fraction F; --from-run prints where the run stands): each time runs
   from when the candidate's own run stood at step F x --steps to the target, so a re-advice ranks
   what is left, not whole runs; a candidate's first steps in the simulator stand in for what the
   job ran before, and a target some candidate reached by that step is refused (nothing left to rank).
4. Writes OUT/advice.json (syncopate-advice/1) and OUT/advice.toml ([dist] for syncopate-worker,
   [ps] for syncopate-server; both take it with --config), and prints a table and the advice.

The target (default 3.0, below crossover.py's 3.2): the micro model passes 3.2 in its first ~25
steps at N = 4, where the number of optimizer updates, not the cluster, decides: a parameter
server applies every worker's gradient as an update of its own (N small updates per round against
the ring's one), and on a fast homogeneous 4-node cluster SSP(4) was then resolved ahead of the
ring (6 seeds); at 3.0 and 2.9 the ring was resolved ahead of every other candidate there. Pick a
target past the initial drop; --steps must be a multiple of every candidate's H (10, 50).

--dry-run prints the calibrated cluster, the proxy and the runs it would make; it starts nothing
and writes nothing. A malformed probe is refused with exit code 2 and the field named.
"""
import argparse
import json
import math
import os
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time

import cluster_runs
import cost
import run_probe
import crossover
import scenario
from cluster_runs import ROOT, run_simulator
from stats import fmt_ci
from study import time_to_target

FORMAT = "syncopate-probe/1"
ADVICE_FORMAT = "syncopate-advice/1"
PRESET, BATCH, STEP_S, EVAL_BATCHES = crossover.PRESET, crossover.BATCH, crossover.STEP_S, crossover.EVAL_BATCHES
STRAGGLER_AT = 1.5  # a node whose fastest step is this many times the cluster's base step is a straggler
# How the probe's step times become the simulated nodes' compute (--compute-model):
#   stragglers (the default): nodes at STRAGGLER_AT or more are stragglers, the largest factor for all of
#     them, every other node at the base step; jitter = the median over nodes of mean / min - 1;
#   per-node: every node at its own measured factor (min / T, whatever its size: a 1.4x node is not
#     modelled at the base step), node r on the proxy's worker r (an unmeasured node at 1); jitter = the
#     pooled estimate, each node's (mean - min) / min x n / (n - 1) (the exponential's unbiased estimate
#     from n samples) weighted by its samples. Session 47's h_slow5s (docs/STUDY.md) showed the first's
#     optimism: a 1.4x node and jitter 0.3 calibrated as no straggler and jitter 0.225, every
#     candidate's same-seed simulation 9-29% fast;
#   per-node-factors: the ablation of the two: every node at its own factor, the jitter the median's.
COMPUTE_MODELS = ("stragglers", "per-node", "per-node-factors")
MAX_SERVERS = 16
# name: (syncopate-sim flags, learning rate); crossover's five, then the two local-SGD variants added here.
CANDIDATES = dict(crossover.CONFIGS)
CANDIDATES["diloco50"] = (["--dist.mode=ring", "--dist.sync_every=50", "--dist.outer=nesterov"],
                          crossover.CONFIGS["diloco10"][1])
CANDIDATES["async_local_sgd"] = (["--dist.mode=ps", "--ps.consistency=asp", "--dist.sync_every=10",
                                  "--dist.outer=delayed_nesterov"], crossover.CONFIGS["diloco10"][1])
# The emulated studies the simulator was validated against (docs/STUDY.md, "Validated before it is
# believed"): scenario file and node count; their ratio, straggler and jitter come from the scenario.
VALIDATED_STUDIES = [("stragglers", 4), ("stragglers", 8), ("comm_bound", 8)]
VALIDATED_CONFIGS = {"ring", "bsp_backup"}  # of the candidates (also validated: bsp, ssp1, asp, not candidates)


class ProbeError(ValueError):
    pass


def sim_binary():
    return os.path.join(os.environ.get("SYNCOPATE_BIN") or os.path.join(ROOT, "build", "bin"), "syncopate-sim")


# --------------------------------------------------------------------------------------------
# 1. The probe and the calibration

def load_probe(path):
    """The probe's JSON object; ProbeError (one line, naming what is wrong and what to do)."""
    if not os.path.exists(path):
        raise ProbeError(f"{path}: no such file; run syncopate-probe on the cluster first (it writes probe.json)")
    try:
        with open(path) as f:
            probe = json.load(f)
    except ValueError as e:
        raise ProbeError(f"{path}: not valid JSON ({e}); run syncopate-probe again (the file may be cut short)") from e
    except OSError as e:
        raise ProbeError(f"{path}: cannot read it ({e.strerror})") from e
    if not isinstance(probe, dict):
        raise ProbeError(f"{path}: the top level must be a JSON object written by syncopate-probe")
    fmt = probe.get("format")
    if fmt != FORMAT:
        raise ProbeError(f"{path}: format is {fmt!r}, expected {FORMAT!r}: not a probe of syncopate-probe "
                         "(or from another version of it); run syncopate-probe again")
    return probe


def _number(value, field, src, positive=True, integer=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and
                                                                         not math.isfinite(value)):
        raise ProbeError(f"{src}: {field} = {value!r} must be a number; run syncopate-probe again")
    if integer and int(value) != value:
        raise ProbeError(f"{src}: {field} = {value!r} must be a whole number")
    if positive and value <= 0:
        raise ProbeError(f"{src}: {field} = {value!r} must be > 0 (a time, rate or size); the measurement failed "
                         "there: run syncopate-probe again")
    return int(value) if integer else float(value)


def _object(value, field, src):
    if not isinstance(value, dict):
        raise ProbeError(f"{src}: {field} must be a JSON object, got {type(value).__name__}")
    return value


def pooled_jitter(base, means, counts):
    """The jitter of step = base x (1 + X), X exponential: each node's (mean - min) / min, scaled by
    n / (n - 1) (the sample minimum sits 1/n of the mean excess above the base), weighted by its n
    samples. A node that gave only min and mean (no samples) counts as one sample, unscaled; the probe
    gives 20 per node."""
    num = den = 0.0
    for k, lo in base.items():
        n = max(counts.get(k, 0), 1)
        excess = (means[k] - lo) / lo
        num += n * (excess * n / (n - 1) if n > 1 else excess)
        den += n
    return max(0.0, num / den)


def calibrate(probe, src="probe.json", compute_model="stragglers"):
    """The cluster the probe measured (see the module's docstring), with "assumptions" (what the
    advice takes as given) and "warnings" (an incomplete probe). ProbeError names a bad field."""
    assumptions, warnings = [], []
    job = _object(probe.get("job", {}), "job", src)
    if "params" not in job:
        raise ProbeError(f"{src}: job.params is missing (the model's parameter count); run syncopate-probe again")
    params = _number(job["params"], "job.params", src, integer=True)
    if "wire_bytes" in job:
        wire = _number(job["wire_bytes"], "job.wire_bytes", src, integer=True)
    else:
        wire = 4
        assumptions.append("job.wire_bytes is not in the probe: 4 bytes per value (float32) assumed")
    nodes = probe.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise ProbeError(f"{src}: nodes is {'missing' if nodes is None else 'empty or not a list'}: no node was "
                         "measured; run syncopate-probe on every node of the job")
    n = len(nodes)
    if "nodes" in job:
        n = _number(job["nodes"], "job.nodes", src, integer=True)
        if n < len(nodes):
            raise ProbeError(f"{src}: job.nodes = {n} but nodes lists {len(nodes)} measured nodes")
    if n > 4096:
        raise ProbeError(f"{src}: job.nodes = {n}: the simulator takes at most 4096 nodes")
    complete = probe.get("complete", True)
    if not isinstance(complete, bool):
        raise ProbeError(f"{src}: complete = {complete!r} must be true or false")
    missing = probe.get("missing") or []
    if not isinstance(missing, list):
        raise ProbeError(f"{src}: missing must be a list of {{\"what\", \"why\"}}")
    what_missing = [f"{m.get('what', '?')}" + (f" ({m['why']})" if m.get("why") else "") if isinstance(m, dict)
                    else str(m) for m in missing]
    if len(nodes) < n and complete:
        complete = False
        what_missing.append(f"{n - len(nodes)} of job.nodes = {n} nodes not in nodes")
    if not complete:
        warnings.append("the probe is incomplete: " + ("; ".join(what_missing) or "it does not say what is missing")
                        + "; the advice uses what was measured")
        assumptions.append("incomplete probe (" + ("; ".join(what_missing) or "unspecified") + "): the calibration "
                           "uses the nodes and links that were measured; an unmeasured node is taken as running at "
                           "the base step without jitter beyond the others', an unmeasured link as no slower than the "
                           "slowest measured one")
    ids, base, means, counts = [], {}, {}, {}
    for i, nd in enumerate(nodes):
        where = f"nodes[{i}]"
        nd = _object(nd, where, src)
        node_id = _number(nd.get("node", i), f"{where}.node", src, positive=False, integer=True)
        if not 0 <= node_id < n or node_id in base:
            raise ProbeError(f"{src}: {where}.node = {node_id} must be a distinct rank in 0..{n - 1}")
        if "step_s" not in nd:
            raise ProbeError(f"{src}: {where}.step_s is missing (the node's step times); run syncopate-probe again")
        st = _object(nd["step_s"], f"{where}.step_s", src)
        samples = st.get("samples") or []
        if not isinstance(samples, list):
            raise ProbeError(f"{src}: {where}.step_s.samples must be a list of seconds")
        samples = [_number(x, f"{where}.step_s.samples[{k}]", src) for k, x in enumerate(samples)]
        if "min" in st:
            lo = _number(st["min"], f"{where}.step_s.min", src)
        elif samples:
            lo = min(samples)
        else:
            raise ProbeError(f"{src}: {where}.step_s has neither min nor samples; run syncopate-probe again")
        if "mean" in st:
            mean = _number(st["mean"], f"{where}.step_s.mean", src)
        elif samples:
            mean = sum(samples) / len(samples)
        else:
            mean = lo
            assumptions.append(f"node {node_id}: no mean step time nor samples: no jitter taken for it")
        if mean < lo * (1 - 1e-9):
            raise ProbeError(f"{src}: {where}.step_s.mean = {mean} is below its min = {lo}")
        ids.append(node_id)
        base[node_id], means[node_id] = lo, mean
        counts[node_id] = len(samples)
    T = statistics.median(base.values())
    slowdowns = {k: v / T for k, v in base.items()}
    slow = sorted(k for k, s in slowdowns.items() if s >= STRAGGLER_AT)
    factor = max((slowdowns[k] for k in slow), default=1.0)
    median_jitter = max(0.0, statistics.median(means[k] / base[k] - 1 for k in ids))
    if compute_model in ("per-node", "per-node-factors"):
        factor = max(slowdowns.values())
        jitter = pooled_jitter(base, means, counts) if compute_model == "per-node" else median_jitter
        assumptions.append(f"every node at its own measured factor (min / T; --compute-model {compute_model}): "
                           + ", ".join(f"node {k} {slowdowns[k]:.3f}x" for k in sorted(ids)))
        noisy = [k for k in ids if counts[k] > 1 and
                 (means[k] - base[k]) / base[k] > jitter * (1 + 3 / math.sqrt(counts[k]))]
        if noisy and compute_model == "per-node":
            assumptions.append("node(s) " + ", ".join(f"{k} ({(means[k] - base[k]) / base[k]:.3g})" for k in noisy)
                               + f" jitter more than 3 standard errors above the pooled {jitter:.3g}: the simulator "
                               "takes one jitter for every node, so the synchronous modes' waits for them are "
                               "modelled short (optimistic)")
    else:
        jitter = median_jitter
        if len(slow) > 1 and min(slowdowns[k] for k in slow) < factor * 0.95:
            assumptions.append("stragglers " + ", ".join(f"node {k} {slowdowns[k]:.2f}x" for k in slow) + ": the "
                               f"simulator takes one slowdown factor for all of them, the largest ({factor:.2f}x), so "
                               "the stragglers are modelled as at least as slow as they are (pessimistic for the "
                               "synchronous modes)")
        mild = [k for k in ids if 1.1 <= slowdowns[k] < STRAGGLER_AT]
        if mild:
            assumptions.append("nodes " + ", ".join(f"{k} ({slowdowns[k]:.2f}x)" for k in mild) + " are slower than "
                               f"the base step but below the straggler threshold {STRAGGLER_AT}x: modelled at the base "
                               "step (--compute-model per-node models each node as measured)")

    links = probe.get("links") or []
    if not isinstance(links, list):
        raise ProbeError(f"{src}: links must be a list of the ring's links")
    if n > 1 and not links:
        raise ProbeError(f"{src}: links is {'missing' if probe.get('links') is None else 'empty'} but the job has "
                         f"{n} nodes: the link rate is unknown; run syncopate-probe with every node up")
    rates, rtts = [], []
    for i, ln in enumerate(links):
        where = f"links[{i}]"
        ln = _object(ln, where, src)
        if "goodput_gbit" in ln:
            rates.append(_number(ln["goodput_gbit"], f"{where}.goodput_gbit", src))
        elif "bytes" in ln and "seconds" in ln:
            rates.append(_number(ln["bytes"], f"{where}.bytes", src) * 8
                         / _number(ln["seconds"], f"{where}.seconds", src) / 1e9)
            assumptions.append(f"{where}: no goodput_gbit, taken as bytes x 8 / seconds")
        else:
            raise ProbeError(f"{src}: {where}.goodput_gbit is missing (and no bytes and seconds to derive it); "
                             "run syncopate-probe again")
        rtt = ln.get("rtt_us")
        if rtt is not None:
            rtt = _object(rtt, f"{where}.rtt_us", src)
            if "median" in rtt:
                rtts.append(_number(rtt["median"], f"{where}.rtt_us.median", src, positive=False))
    expected_links = n if n > 2 else n - 1
    if n > 1 and complete and len(links) < expected_links:
        warnings.append(f"links lists {len(links)} of the ring's {expected_links} links; the link rate is the slowest "
                        "of those")
    if n > 1 and not rtts:
        assumptions.append("no link has rtt_us.median: latency taken as 0 (only the rate is modelled)")
    link = min(rates) if rates else None
    latency_us = statistics.median(rtts) / 2 if rtts else 0.0
    ratio = 2 * params * wire * 8 / (link * 1e9) / T if link else 0.0
    emulated = job.get("emulated_step_s", 0) or 0
    if emulated:
        emulated = _number(emulated, "job.emulated_step_s", src)
        assumptions.append(f"the probed cluster is an emulation (job.emulated_step_s = {emulated:g} s); its measured "
                           f"base step is {T:.4g} s")
    created = probe.get("created_unix_s")
    if isinstance(created, (int, float)) and not isinstance(created, bool):
        age_h = (time.time() - created) / 3600
        if age_h > 24:
            warnings.append(f"the probe is {age_h / 24:.1f} days old; a cluster's load and links change: probe again "
                            "if in doubt")
    ex = {pat: exchange_rounds(probe, pat, n, src, warnings) for pat in EXCHANGES}
    placed = probed_placement(probe, nodes, ids, src)
    return {"placement": placed, "nodes": n, "step_s": T, "node_slowdowns": {str(k): slowdowns[k] for k in sorted(ids)},
            "compute_model": compute_model, "exchanges": ex,
            "slow_workers": slow, "slowdown": factor, "jitter": jitter, "link_gbit": link,
            "latency_ms": latency_us / 1e3, "ratio": ratio, "params": params, "wire_bytes": wire,
            "measured_nodes": len(nodes), "measured_links": len(links), "complete": complete,
            "hosts": {k: nd.get("host") for k, nd in zip(ids, nodes)}, "job": job,
            "assumptions": assumptions, "warnings": warnings}


# pattern -> the probe's section of its rounds: the ring's all-reduce, the BSP round trip to the job's
# shards (every node at once), the round trip to ASP shards in the job's layout with the nodes' pushes
# spread over a step (syncopate-probe's spread rounds, where the shards run on the job's nodes).
EXCHANGES = {"ring": "ring_exchange", "ps": "ps", "ps_spread": "ps_spread"}


def is_async_ps(name):
    """A parameter-server candidate whose pushes are not held in BSP's lockstep (SSP, ASP, asynchronous
    local SGD): they arrive spread out."""
    return is_ps(name) and "--ps.consistency=bsp" not in CANDIDATES[name][0]


SPREAD_FOR = {"asp": "ASP and asynchronous local SGD", "async": "SSP, ASP and asynchronous local SGD"}


def takes_spread(name, spread_for):
    """Whether the candidate takes the spread rounds' share under --spread-calibration `spread_for`
    ("asp": pushes that never wait for another node; "async": SSP's too)."""
    ssp = "--ps.consistency=ssp" in CANDIDATES[name][0]
    return is_async_ps(name) and (spread_for == "async" or (spread_for == "asp" and not ssp))


def exchange_pattern(name, cl):
    """The probe's exchange whose share of the link rate the candidate's messages get: the ring's for the
    ring and DiLoCo; the spread rounds' where the probe timed them and --spread-calibration gives them to
    this candidate (use_spread_rounds records which, as ps_spread.for); else the BSP round trips'."""
    if not is_ps(name):
        return "ring"
    sp = cl["exchanges"].get("ps_spread")
    return "ps_spread" if sp and takes_spread(name, sp.get("for")) else "ps"


def use_spread_rounds(cl, spread_for):
    """--spread-calibration: which candidates take the probe's spread rounds (ps_spread.for), or none
    (the section dropped, the BSP rounds' share for every parameter-server candidate, said so)."""
    sp = cl["exchanges"].get("ps_spread")
    if not sp:
        return
    if spread_for == "none":
        cl["exchanges"]["ps_spread"] = None
        cl["assumptions"].append(
            "the probe's spread rounds to ASP shards are not used (--spread-calibration none, the default): every "
            "parameter-server candidate takes the BSP rounds' share (session 42's development check: the spread share "
            "brought ASP's predictions closer and SSP's farther, docs/STUDY.md; on six held-out clusters, session 42, not resolved)")
    else:
        sp["for"] = spread_for


def candidate_order(names):
    """The candidates run, in order: the ring first (it always runs: it sets the time limit), then `names`."""
    return ["ring"] + [x for x in names if x != "ring"]


def patterns_used(cl, names):
    """The exchange patterns the candidates `names` take their share from (exchange_pattern), in EXCHANGES'
    order; "ps" also where the probe timed no rounds at all (the assumption says so)."""
    used = {exchange_pattern(x, cl) for x in names}
    return [p for p in EXCHANGES if p in used]


def _address(value, field, src):
    if value is not None and not (isinstance(value, str) and value):
        raise ProbeError(f"{src}: {field} = {value!r} must be an address string or null")
    return value


def probed_placement(probe, nodes, ids, src):
    """Where the job's shards run, from the addresses the probe recorded (syncopate-probe: each node's
    "address", the one its peers reach it at, and ps.endpoint_addresses, each shard's): {"placement":
    "nodes" (every shard at a node's address: it shares that node's link), "dedicated" (none is), or
    None (not known: the probe recorded no addresses, the nodes share one address as on loopback, a
    shard's host did not resolve, or some shards are on nodes and some are not), "shard_nodes": the node
    of each shard (None: a host of its own or not known), "why": a sentence}."""
    ps = probe.get("ps")
    if not isinstance(ps, dict) or "endpoint_addresses" not in ps:
        return {"placement": None, "shard_nodes": [], "why": "the probe recorded no shard addresses (no parameter-server "
                "round trips, or a probe from before syncopate-probe recorded them)"}
    shards = ps["endpoint_addresses"]
    if not isinstance(shards, list):
        raise ProbeError(f"{src}: ps.endpoint_addresses must be a list (one address or null per shard)")
    shards = [_address(x, f"ps.endpoint_addresses[{k}]", src) for k, x in enumerate(shards)]
    addr = {node_id: _address(nd.get("address"), f"nodes[{i}].address", src)
            for i, (node_id, nd) in enumerate(zip(ids, nodes))}
    if any(v is None for v in addr.values()):
        return {"placement": None, "shard_nodes": [None] * len(shards),
                "why": "the probe recorded no address for node(s) " + ", ".join(str(k) for k, v in addr.items() if v is None)}
    if len(set(addr.values())) < len(addr):
        return {"placement": None, "shard_nodes": [None] * len(shards), "why": "nodes share an address (one host, as on "
                "loopback): which shard shares which node's link is not known"}
    at = {v: k for k, v in addr.items()}
    on = [at.get(x) for x in shards]
    unresolved = [k for k, x in enumerate(shards) if x is None]
    if unresolved:
        return {"placement": None, "shard_nodes": on, "why": "shard(s) " + ", ".join(map(str, unresolved)) +
                " have hosts the probe could not resolve"}
    if all(x is not None for x in on):
        return {"placement": "nodes", "shard_nodes": on, "why": "every shard runs at a node's address (" +
                ", ".join(f"shard {k} on node {x}" for k, x in enumerate(on)) + ")"}
    if all(x is None for x in on):
        return {"placement": "dedicated", "shard_nodes": on, "why": "no shard runs at a node's address"}
    return {"placement": None, "shard_nodes": on, "why": "some shards run at nodes' addresses (" +
            ", ".join(f"shard {k} on node {x}" for k, x in enumerate(on) if x is not None) + "), the others not: the "
            "simulator models all on nodes or all on hosts of their own"}


PLACEMENT_FROM = {  # where the servers' placement came from: (the dry run's label, the assumption's words)
    "--server-placement": ("--server-placement", "given by --server-placement"),
    "first": ("the first advice's", "the first advice's, which the run started from"),
    "probe": ("as probed", "where the probe found them"),
    "default": ("not probed: dedicated", "not known from the probe, so dedicated hosts are assumed; give "
                "--server-placement nodes if the shards run on the job's nodes")}


def server_placement(cl, a):
    """(placement, where it came from): --server-placement where given (or the first advice's with
    --from-run), else the probe's (probed_placement), else dedicated hosts, said in the assumptions."""
    if a.server_placement:
        return a.server_placement, a.placement_from
    p = (cl.get("placement") or {}).get("placement")
    return (p, "probe") if p else ("dedicated", "default")


def exchange_rounds(probe, pattern, n, src, warnings):
    """The probe's rounds of one exchange pattern at the model's size, every node at once (syncopate-probe:
    "ring_exchange", the ring's all-reduce; "ps", the parameter servers' BSP round trip), or None when it
    timed none or not on every node (a partial exchange is not the job's): {"round_s": the median over
    nodes of each node's median round, "gap_s": the pause between rounds, "nodes": nodes measured,
    "servers": shards (ps)}."""
    key = EXCHANGES[pattern]
    sec = probe.get(key)
    if sec is None:
        return None
    sec = _object(sec, key, src)
    if "skipped" in sec and "nodes" not in sec:  # (the spread rounds, where the shards are not on the nodes)
        return None
    recs = sec.get("nodes")
    if not isinstance(recs, list):
        raise ProbeError(f"{src}: {key}.nodes must be a list of the nodes' rounds")
    medians = []
    for i, r in enumerate(recs):
        where = f"{key}.nodes[{i}]"
        r = _object(r, where, src)
        rs = _object(r.get("round_s", {}), f"{where}.round_s", src)
        if "median" not in rs:
            raise ProbeError(f"{src}: {where}.round_s.median is missing; run syncopate-probe again")
        medians.append(_number(rs["median"], f"{where}.round_s.median", src))
    if len(recs) < n:
        warnings.append(f"{key}.nodes lists {len(recs)} of {n} nodes: the probe's {pattern} rounds are not used "
                        "(an exchange without every node is not the job's); probe again")
        return None
    out = {"round_s": statistics.median(medians), "nodes": len(recs),
           "gap_s": _number(sec.get("gap_s", 0), f"{key}.gap_s", src, positive=False)}
    if pattern != "ring":
        out["servers"] = _number(sec.get("servers", 0), f"{key}.servers", src, integer=True)
    return out


def server_count(cl, a):
    """(K, where K came from): the job's shard count. --servers K where given; else the shards the
    probe's parameter-server round trips went to (the job's layout, as the user started it); else
    min(N, MAX_SERVERS), which is an assumption the advice states."""
    if a.servers:
        return a.servers, a.servers_from
    ps = cl["exchanges"].get("ps")
    if ps and ps.get("servers", 0) > 0:
        return ps["servers"], "probe"
    return min(cl["nodes"], MAX_SERVERS), "default"


def proxy(cl, a):
    """The simulated stand-in of the cluster `cl` (see the module's docstring)."""
    n = cl["nodes"]
    k, k_from = server_count(cl, a)
    placement, placement_from = server_placement(cl, a)
    link = crossover.link_gbit(cl["ratio"]) if cl["ratio"] > 0 else crossover.link_gbit(1e-4)
    # The stragglers go to the highest-numbered workers (as crossover places them): worker 0 evaluates
    # the model, and which rank is slow changes no mode's schedule otherwise.
    slow = list(range(n - len(cl["slow_workers"]), n))
    # --compute-model per-node: node r's factor on worker r (its rank in the job, so worker 0 evaluates
    # as node 0 does, a shard's node keeps its shard, and a same-seed replay keeps each node's jitter
    # draws); an unmeasured node at the base step. None of them a one-factor straggler.
    each = ([cl["node_slowdowns"].get(str(r), 1.0) for r in range(n)]
            if cl.get("compute_model") in ("per-node", "per-node-factors") else [])
    if each:
        slow = []
    return {"compute_model": cl.get("compute_model", "stragglers"), "worker_slowdowns": each,
            "preset": PRESET, "step_s": STEP_S, "batch": BATCH, "link_gbit": link, "servers": k, "servers_from": k_from,
            "server_link_gbit": link * n / k, "latency_us": cl["latency_ms"] * 1e3 * STEP_S / cl["step_s"],
            "slow_workers": slow, "slowdown": cl["slowdown"] if slow else 1.0, "jitter": cl["jitter"],
            "server_placement": placement, "placement_from": placement_from, "target_loss": a.target_loss, "seeds": a.seeds, "steps": a.steps,
            "eval_every": a.eval_every, "eval_batches": EVAL_BATCHES, "limit": a.limit, "time_scale": cl["step_s"] / STEP_S}


EXCHANGE_ROUNDS = 10  # rounds of the simulated exchange the probe's rounds are held against
GOODPUT_RANGE = (1e-3, 4.0)  # syncopate-sim's bounds of sim.ps_goodput and sim.ring_goodput


def exchange_gap(cl, px, pattern):
    """The simulated exchange's modelled compute per round, proxy seconds: the probe's pause between
    rounds, or back to back (1e-4 s) for a probe that made none."""
    return max(1e-4, cl["exchanges"][pattern]["gap_s"] / px["time_scale"])


def exchange_command(px, cl, out, pattern, goodput=1.0):
    """syncopate-sim of the probe's exchange on the proxy: EXCHANGE_ROUNDS rounds of the model a
    modelled step apart as the probe's (no jitter, no straggler): the ring's all-reduce or BSP rounds
    on the links and servers every parameter-server candidate gets, every worker at once; or (ps_spread)
    ASP rounds with worker r starting r / N of a step after worker 0; every transfer at `goodput` x
    the rate."""
    if pattern != "ring":
        on_nodes = px.get("server_placement", "dedicated") == "nodes"
        mode = ["--dist.mode=ps", "--ps.consistency=" + ("bsp" if pattern == "ps" else "asp"), f"--sim.servers={px['servers']}",
                "--sim.colocate_servers=true" if on_nodes else f"--sim.server_link_gbit={px['server_link_gbit']:.6g}",
                f"--sim.ps_goodput={goodput:.6g}"]
        if pattern == "ps_spread":  # worker r begins r / N of a step after worker 0, as the probe's nodes did
            mode.append(f"--sim.spread_start_s={exchange_gap(cl, px, pattern):.6g}")
    else:
        mode = ["--dist.mode=ring", f"--sim.ring_goodput={goodput:.6g}"]
    return [sim_binary(), "--out", out, "--quiet", f"--sim.workers={cl['nodes']}", f"--sim.link_gbit={px['link_gbit']:.6g}",
            f"--sim.latency_us={px['latency_us']:.6g}", f"--model.preset={PRESET}", f"--train.batch_size={BATCH}",
            f"--train.steps={EXCHANGE_ROUNDS}", "--train.threads=1", "--train.seed=0", f"--eval.every={EXCHANGE_ROUNDS}",
            "--eval.batches=1", f"--emulate.step_time_s={exchange_gap(cl, px, pattern):.6g}", "--emulate.jitter=0",
            f"--data.cache_dir={ROOT}/data/cache"] + mode


def simulated_round(cl, px, out, pattern, goodput):
    """The simulated exchange's round at `goodput`, proxy seconds: its time per round less the modelled
    step. Cached under OUT/calibration/<pattern>_g<goodput>/ (made again when its command changes)."""
    d = os.path.join(out, "calibration", f"{pattern}_g{goodput:g}")
    gap, n = exchange_gap(cl, px, pattern), cl["nodes"]
    late = gap * (n - 1) / n if pattern == "ps_spread" else 0.0  # the last worker's later start
    r, _ = simulated(d, exchange_command(px, cl, d, pattern, goodput), f"advise: the simulated {pattern} exchange",
                     lambda sim, _e, _s: {"round_s": (sim["simulated_s"] - late) / (sim["worker_steps"] / n) - gap})
    return r["round_s"]


def exchange_goodput(cl, px, out, pattern):
    """The share of the link rate the probe's rounds of `pattern` achieved, solved so that the simulated
    exchange takes the measured round: a simulated round is fixed + transfer / goodput (latency hops
    and the FINISH's tail do not scale with the rate, every transfer does), so two simulated exchanges,
    at goodput 1 and 1/2, give both parts. None when the probe timed no such rounds. "clamped" where
    the measured round lies outside what GOODPUT_RANGE can reproduce (a round at or near the fixed part:
    the nodes' rounds overlap one another's pauses, as a node that ends its round first starts the
    next one first and finds its peers' messages already there, which the simulated exchange, every
    node starting together, does not model; or the latency the probe measured is not the exchange's)."""
    if not cl["exchanges"].get(pattern):
        return None
    m1 = simulated_round(cl, px, out, pattern, 1.0)
    m2 = simulated_round(cl, px, out, pattern, 0.5)
    transfer = max(m2 - m1, 1e-12)
    fixed = m1 - transfer
    measured = cl["exchanges"][pattern]["round_s"] / px["time_scale"]
    g = transfer / (measured - fixed) if measured > fixed else math.inf
    lo, hi = GOODPUT_RANGE
    return {"pattern": pattern, "modelled_round_s": m1, "fixed_s": fixed, "measured_round_s": measured,
            "goodput": min(hi, max(lo, g)), "clamped": not lo <= g <= hi}


# --------------------------------------------------------------------------------------------
# 2. The simulated runs

def sync_every(name):
    for f in CANDIDATES[name][0]:
        if f.startswith("--dist.sync_every="):
            return int(f.split("=", 1)[1])
    return 1


def sim_flags(name, n):
    return [f.format(backup=max(1, n // 8)) for f in CANDIDATES[name][0]]


def worker_flags(name, n):
    """The real worker's flags of a candidate: its [dist] flags (the proxy's clip scope and the
    learning rate are not among them: the user's stay theirs)."""
    return [f for f in sim_flags(name, n) if f.startswith("--dist.") and not f.startswith("--dist.clip_scope=")]


def server_flags(name, n):
    return [f for f in sim_flags(name, n) if f.startswith("--ps.")]


def is_ps(name):
    return "--dist.mode=ps" in CANDIDATES[name][0]


def sim_command(name, seed, px, cl, out, limit_s):
    flags, lr = CANDIDATES[name]
    n = cl["nodes"]
    on_nodes = px.get("server_placement", "dedicated") == "nodes"
    servers = ["--sim.colocate_servers=true"] if on_nodes else [f"--sim.server_link_gbit={px['server_link_gbit']:.6g}"]
    cmd = [sim_binary(), "--out", out, "--quiet", f"--sim.workers={n}", f"--sim.servers={px['servers']}",
           f"--sim.link_gbit={px['link_gbit']:.6g}", *servers,
           f"--sim.latency_us={px['latency_us']:.6g}", f"--sim.target_loss={px['target_loss']:g}",
           f"--model.preset={PRESET}", f"--train.batch_size={BATCH}", f"--train.steps={px['steps']}",
           "--train.threads=1", f"--train.seed={seed}", f"--optim.lr={lr:g}", f"--schedule.min_lr={lr / 10:g}",
           "--schedule.warmup_steps=5", f"--eval.every={px['eval_every']}", f"--eval.batches={EVAL_BATCHES}",
           f"--emulate.step_time_s={STEP_S}", f"--emulate.jitter={px['jitter']:.6g}",
           f"--data.cache_dir={ROOT}/data/cache"]
    if px["slow_workers"]:
        cmd += ["--sim.slow_workers=" + ",".join(map(str, px["slow_workers"])), f"--emulate.slowdown={px['slowdown']:.6g}"]
    if px.get("worker_slowdowns"):
        cmd += ["--sim.worker_slowdowns=" + ",".join(f"{x:.4g}" for x in px["worker_slowdowns"])]
    if limit_s:
        cmd += [f"--sim.time_limit_s={limit_s:.6g}"]
    g = (px.get("goodput") or {}).get(exchange_pattern(name, cl))
    if g is not None:
        cmd += [f"--sim.{'ps' if is_ps(name) else 'ring'}_goodput={g['goodput']:.4g}"]
    return cmd + sim_flags(name, n)


def run_dir(out, name, seed):
    return os.path.join(out, "runs", name, f"seed{seed}")


def cached(out, name, seed):
    """The cached result.json of a run, or None."""
    try:
        with open(os.path.join(run_dir(out, name, seed), "result.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def simulated(d, cmd, what, summarise):
    """(result, made now): the result.json in d where cmd made it; else cmd run afresh in d (the
    simulator; `what` names it in a failure) and summarise(sim.json, node 0's evaluations, real
    seconds) stored there with the command, so that a run made with another probe or other settings
    is never taken for this one."""
    line = " ".join(cmd)
    try:
        with open(os.path.join(d, "result.json")) as f:
            r = json.load(f)
        if r.get("command") == line:
            return r, False
    except (OSError, ValueError):
        pass
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    r = dict(summarise(*run_simulator(cmd, d, what)), command=line)
    with open(os.path.join(d, "result.json"), "w") as f:
        json.dump(r, f)
    return r, True


def run(name, seed, px, cl, out, limit_s=0.0):
    """One simulated run (or its cached result when made with the same command)."""
    d = run_dir(out, name, seed)

    def summarise(sim, evals, real_s):
        curve = [{"t": m["time_s"], "val_loss": m["val_loss"]} for m in evals]
        return {"config": name, "n": cl["nodes"], "seed": seed,
                "time_to_target_s": time_to_target(curve, px["target_loss"]) if sim["target_reached_s"] >= 0 else None,
                "simulated_s": sim["simulated_s"], "worker_steps": sim["worker_steps"], "real_s": real_s,
                "limit_s": limit_s, "final_val_loss": evals[-1]["val_loss"] if evals else None}
    r, fresh = simulated(d, sim_command(name, seed, px, cl, d, limit_s), f"advise: the simulated run {name} seed {seed}",
                         summarise)
    if fresh:
        got = f"target at {r['time_to_target_s']:.2f} s" if r["time_to_target_s"] is not None else \
            f"not reached by {r['simulated_s']:.2f} s"
        print(f"[advise] {name} seed {seed}: {got} simulated ({r['worker_steps']} worker-steps, {r['real_s']:.1f} s "
              "real)", flush=True)
    return r


def plan(names, px, cl, out):
    """(name, seed, cached?, estimated real seconds at most or None) of every run, in order."""
    m = cost.Measurements(PRESET, BATCH, "sim")
    em = {"step_time_s": STEP_S, "jitter": px["jitter"], "slow_node": -1, "slowdown": 1.0}
    rows = []
    for seed in range(px["seeds"]):
        for name in names:
            est, _ = cost.run_s("sim", em, px["steps"], None, True, cl["nodes"], px["steps"] // px["eval_every"] + 1,
                                EVAL_BATCHES * BATCH, m, CANDIDATES[name][0][0] == "--dist.mode=ring")
            r = cached(out, name, seed)
            rows.append((name, seed, r is not None, est))
    return rows, m


def step_time(d, step):
    """Proxy seconds at which every worker of the simulated run in d had ended its step `step` (the
    slowest's time: the job stands at a step once each node has done it, as run_probe.progress
    reads a run); None where a worker's run ended before it (at the target, or its time limit)."""
    nodes = sorted(x for x in os.listdir(d) if x.startswith("node")) if os.path.isdir(d) else []
    latest = None
    for nd in nodes:
        at = next((m["time_s"] for m in cluster_runs.read_jsonl(os.path.join(d, nd, "metrics.jsonl"))
                   if m.get("step") == step and "step_s" in m), None)
        if at is None:
            return None
        latest = at if latest is None else max(latest, at)
    return latest


def rest_of_run(results, out, step):
    """(results for the rest of a run that stands at `step` (--from-fraction), [(name, seed) whose
    run reached the target by then]). Each run's time to target and its end, less the time it took
    to stand at that step: the candidate's own first steps in the simulator stand in for the job's.
    A run that reached the target by then has no rest to rank (the caller refuses). A miss (its time
    limit came first) counts at the time it ran past the step, a lower bound of its rest as a miss
    counts in crossover.judge; where it never stood at the step, at its whole run's time."""
    rest, early = {}, []
    for name, rs in results.items():
        rest[name] = []
        for r in rs:
            at = step_time(run_dir(out, name, r["seed"]), step)
            t = r["time_to_target_s"]
            if t is not None and (at is None or t <= at):
                early.append((name, r["seed"]))
            if at is None:
                rest[name].append(dict(r, from_step=step, at_step_s=None))
                continue
            rest[name].append(dict(r, from_step=step, at_step_s=at,
                                   time_to_target_s=t - at if t is not None else None,
                                   simulated_s=max(0.0, r["simulated_s"] - at)))
    return rest, early


# --------------------------------------------------------------------------------------------
# 3. Ranking and advice

def bytes_per_step(name, cl):
    """Bytes one node sends (and receives) per optimizer step on the user's cluster."""
    n, p, w = cl["nodes"], cl["params"], cl["wire_bytes"]
    per = p * w if is_ps(name) else scenario.ring_factor(n) * p * w
    return per / sync_every(name)


def validation(cl, names, servers=None):
    """Whether the cluster lies inside what the simulator was validated on (docs/STUDY.md); `servers`,
    the advised shard count (the validated studies ran one shard per node: fewer is outside)."""
    notes, ns, rs, ss, js = [], [], [], [], []
    try:
        for sc_name, n in VALIDATED_STUDIES:
            d = scenario.derive(scenario.load(os.path.join(ROOT, "experiments", "scenarios", f"{sc_name}.toml")), nodes=n)
            ns.append(n)
            rs.append(d["ratio"] * 2 / scenario.ring_factor(n))  # the scenario's ring ratio in crossover's terms
            ss.append(d["slowdown"] if d["slow_node"] >= 0 else 1.0)
            js.append(d["jitter"])
    except (scenario.ScenarioError, OSError) as e:
        return {"inside": False, "notes": [f"the validated range is unknown: {e}"]}
    rng = {"nodes": [min(ns), max(ns)], "ratio": [min(rs), max(rs)], "slowdown": [1.0, max(ss)]}
    inside = True
    if not rng["nodes"][0] <= cl["nodes"] <= rng["nodes"][1]:
        inside = False
        notes.append(f"N = {cl['nodes']} is outside the validated {rng['nodes'][0]}..{rng['nodes'][1]} nodes")
    if not rng["ratio"][0] * 0.95 <= cl["ratio"] <= rng["ratio"][1] * 1.05:
        inside = False
        notes.append(f"ratio r = {cl['ratio']:.3g} is outside the validated {rng['ratio'][0]:.2g}..{rng['ratio'][1]:.2g}")
    if cl["slowdown"] > rng["slowdown"][1] * 1.05:
        inside = False
        notes.append(f"straggler factor {cl['slowdown']:.2f}x is beyond the validated {rng['slowdown'][1]:g}x")
    if servers is not None and servers < cl["nodes"] and any(is_ps(x) for x in names):
        inside = False
        notes.append(f"K = {servers} shard(s) for {cl['nodes']} nodes: the validated studies ran one shard per node, "
                     "so fewer shards than nodes (their links carrying several nodes' pushes) are outside it")
    if cl["jitter"] > max(js) * 1.05:
        notes.append(f"jitter {cl['jitter']:.3g} is beyond the validated {max(js):g} (not counted in 'inside')")
    if inside:
        notes.append(f"N = {cl['nodes']}, r = {cl['ratio']:.3g} and straggler factor {cl['slowdown']:.2f}x lie inside "
                     f"the validated {rng['nodes'][0]}..{rng['nodes'][1]} nodes, r {rng['ratio'][0]:.2g}.."
                     f"{rng['ratio'][1]:.2g}, factor 1..{rng['slowdown'][1]:g}x")
    notes.append("validated (docs/STUDY.md, 'Validated before it is believed', an older method marked superseded): "
                 + "; ".join(f"{s} at N = {n} (r = {r:.2g}, straggler {x:g}x, jitter {j:g})"
                             for (s, n), r, x, j in zip(VALIDATED_STUDIES, rs, ss, js)))
    notes.append("there, the simulator was about 8% optimistic for BSP on lossy links, and at r ~ 4 its wall times "
                 "were ~20% short until the links' measured efficiency (0.77) was applied")
    unvalidated = [x for x in names if x not in VALIDATED_CONFIGS]
    if unvalidated:
        notes.append("never validated against the emulation: " + ", ".join(unvalidated)
                     + " (of the candidates only ring and bsp_backup were)")
    rng["jitter"] = [min(js), max(js)]
    return {"inside": inside, "range": rng, "notes": notes}


def interval(s, scale):
    if s["mean"] is None:
        return {"mean": None, "lo": None, "hi": None}
    return {"mean": s["mean"] * scale, "lo": s["ci95"][0] * scale, "hi": s["ci95"][1] * scale}


def toml_value(v):
    for conv in (int, float):
        try:
            x = conv(v)
            return repr(x) if conv is float else str(x)
        except ValueError:
            pass
    if v in ("true", "false"):
        return v
    return json.dumps(v)


def toml_text(name, wf, sf, probe_path):
    L = [f"# syncopate-advise: {name}, for the cluster of {probe_path} (see advice.json next to this file).",
         "# The job's other fields (model, data, train, optim: the learning rate included) stay the job's own.",
         "# syncopate-worker reads [dist] and skips [ps]; syncopate-server reads [ps] and skips [dist].", "", "[dist]"]
    L += [f"{f.split('=', 1)[0][len('--dist.'):]} = {toml_value(f.split('=', 1)[1])}" for f in wf]
    if any(f == "--dist.mode=ps" for f in wf):
        L.append("# servers: the shards' endpoints, added by scripts/launch_node.sh (SYNCOPATE_SERVERS)")
    L += ["", "[ps]"]
    L += [f"{f.split('=', 1)[0][len('--ps.'):]} = {toml_value(f.split('=', 1)[1])}" for f in sf] or \
         ["# no parameter-server fields: this mode runs no servers"]
    return "\n".join(L) + "\n"


def run_line(name, cl, wf, sf, advice_path):
    """A launch_node.sh command line (run on every node, NODE_RANK set per node) for the advice: the
    user's own job file with --dist.mode=auto, which applies the advice's [dist] flags (the launcher
    starts shards with its server flags only for a ps recommendation)."""
    n = cl["nodes"]
    hosts = [cl["hosts"].get(k) for k in range(n)]
    env = [f"MASTER_ADDR={hosts[0] or '<node 0 address>'}", "MASTER_PORT=29500", f"NNODES={n}",
           "NODE_RANK=<this node's rank>", "SYNCOPATE_TOKEN_FILE=~/.syncopate_token"]
    if is_ps(name):
        env += ["SYNCOPATE_SERVERS=per-node", "SYNCOPATE_NODE_HOSTS=" + ",".join(h or f"<node {k} address>"
                                                                             for k, h in enumerate(hosts))]
    parts = env + ["scripts/launch_node.sh", "--", "--out", "runs/job", "--config", "<your job file>",
                   "--dist.mode=auto", f"--dist.advice={os.path.abspath(advice_path)}"]
    return " ".join(p if "<" in p or p.startswith("SYNCOPATE_TOKEN_FILE=~") else shlex.quote(p) for p in parts)


def pick(results, names, j=None):
    """The advice's pick from the runs' results ({name: [result per seed]}): crossover.judge's winner
    (the lowest mean time among the candidates that reached the target in every seed); where none
    did, the best by seeds reached, then mean time, then mean final loss (not a finding)."""
    j = j or crossover.judge({k: results[k] for k in names})
    if j["winner"] is not None:
        return j["winner"]

    def mean(v):
        v = [x for x in v if x is not None]
        return sum(v) / len(v) if v else math.inf

    def key(k):
        s = j["stats"][k]
        return (-s["reached"], s["mean"] if s["mean"] is not None else math.inf,
                mean([r["final_val_loss"] for r in results[k]]))
    return min(names, key=key)


def leave_one_out(results, names):
    """{seed: the pick without that seed's runs} (each seed's runs of every candidate left out in
    turn), or {} where that is not tested: fewer than 3 seeds common to every candidate (a pick
    needs 2), or no candidate reached the target in every seed (the fallback pick is not a finding).
    Which candidates may win is decided once, on every seed: a candidate that missed the target in
    one seed cannot win with that seed left out, since the seed's miss stays in the data and no
    added seed takes it away (the pick would read as seed-decided for a reason seeds cannot fix)."""
    seeds = sorted(set.intersection(*[{r["seed"] for r in results[k]} for k in names]))
    if len(seeds) < 3:
        return {}
    j = crossover.judge({k: results[k] for k in names})
    eligible = [k for k in names if j["stats"][k]["reached"] == j["stats"][k]["seeds"]
                and j["stats"][k]["mean"] is not None]
    if not eligible:
        return {}
    return {sd: pick({k: [r for r in results[k] if r["seed"] != sd] for k in eligible}, eligible) for sd in seeds}


def outer_rounds_at_target(out, name, seeds, target):
    """Local SGD (H > 1): {seed: the outer rounds done when the seed's run first scored at or below
    `target`, or None where it never did}, read from node 0's evaluations in the advisor's run
    directories. The weights a local SGD job ships change only at an outer round, so its time to target
    is one of a few round times and which one a seed hits can split the seeds (session 44's i_slow7:
    diloco50 reached 3.0 at the first round in 3 of 6 advice seeds, at the second in 3). None for H = 1."""
    h = sync_every(name)
    if h <= 1:
        return None
    got = {}
    for sd in seeds:
        try:
            evals = [m for m in cluster_runs.read_jsonl(os.path.join(run_dir(out, name, sd), "node0", "metrics.jsonl"))
                     if "val_loss" in m]
        except (OSError, ValueError):  # no curve kept: the round is not known
            return None
        hit = next((m for m in evals if m["val_loss"] <= target), None)
        got[str(sd)] = None if hit is None else int(hit["step"]) // h
    return got


SPLIT_RATIO = 1.5   # seeds' outer rounds at the target this far apart (latest / earliest) are a split


def seed_split(rounds):
    """'round 1 in 3 seeds, round 2 in 3' where a local SGD candidate's seeds reached the target at
    outer rounds SPLIT_RATIO or more apart (a time to target the mean over seeds hides: diloco50 at
    round 1 or 2 is twice the time), or some seed never did; else None. Rounds closer than that
    (diloco10 at 7, 8 or 10) are the seeds' ordinary spread, which the interval already shows."""
    if not rounds:
        return None
    counts = {}
    for v in rounds.values():
        counts[v] = counts.get(v, 0) + 1
    reached = [v for v in counts if v is not None]
    # Round 0 (scored before the first outer round) against any later round is a split too.
    if len(counts) < 2 or (None not in counts and min(reached) > 0 and max(reached) < SPLIT_RATIO * min(reached)):
        return None
    return ", ".join(f"{'never' if k is None else f'round {k}'} in {c} seed{'s' if c > 1 else ''}"
                     for k, c in sorted(counts.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))


def stability_text(st, resolved=True):
    """The why's sentence on the leave-one-seed-out check. A pick that holds is one whose order of
    means is not one seed's doing; that is not a resolution (an unresolved pick says so), and where
    seeds were added until it held, the stop depended on the data, so its intervals and tests are
    read as optimistic."""
    if not st:
        return None
    if st["stable"] is None:
        return "not tested for a seed-decided pick (" + st["untested"] + ")"
    sequential = ("; its intervals and tests come after seeds added until the pick held, a stop that "
                  "depended on the data, so read them as optimistic" if st["seeds_added"] else "")
    if st["stable"]:
        return ((f"the pick holds with any one of its {st['seeds']} seeds left out" if resolved else
                 f"the order of the means holds with any one of its {st['seeds']} seeds left out, which is not a "
                 "resolution")
                + (f" ({st['seeds_added']} seed(s) added by --stability-seeds)" if st["seeds_added"] else "")
                + sequential)
    flips = sorted({p for p in st["leave_one_out"].values() if p != st["pick"]})
    return (f"seed-decided: leaving one of its {st['seeds']} seeds out changes the pick to {', '.join(flips)}"
            + (f" even after {st['seeds_added']} added seed(s)" if st["seeds_added"] else
               "; --stability-seeds K adds seeds until it holds") + sequential)


def advise(cl, px, names, results, a, probe_path):
    """advice.json's content from the runs' results ({name: [result per seed]})."""
    j = crossover.judge({k: results[k] for k in names})
    scale = px["time_scale"]
    n = cl["nodes"]
    cands = []
    for name in names:
        s = j["stats"][name]
        cands.append({"name": name, "predicted_s": interval(s, scale), "proxy_s": interval(s, 1.0),
                      "reached": s["reached"], "seeds": s["seeds"], "bytes_per_step": bytes_per_step(name, cl),
                      "sync_every": sync_every(name), "worker_flags": worker_flags(name, n),
                      "server_flags": server_flags(name, n), "lr_in_proxy": CANDIDATES[name][1],
                      "resolved_behind_winner": name in j.get("behind", []),
                      "per_seed_s": {str(r["seed"]): (r["time_to_target_s"] * scale if r["time_to_target_s"] is not None
                                                      else None) for r in results[name]},
                      "outer_rounds_at_target": outer_rounds_at_target(
                          a.out, name, [r["seed"] for r in results[name]], px["target_loss"]) if not a.from_step else None,
                      "final_val_loss_mean": (lambda v: sum(v) / len(v) if v else None)(
                          [r["final_val_loss"] for r in results[name] if r["final_val_loss"] is not None])})
    w = pick(results, names, j)
    if j["winner"] is not None:
        ws = j["stats"][w]
        tied, behind = j.get("tied", []), j.get("behind", [])
        why = (f"lowest mean predicted time {rest_phrase(a)}to target {fmt_ci(interval_stats(ws, scale), 3)} s on this cluster "
               f"(proxy {fmt_ci(ws, 3)} s), reached in {ws['reached']}/{ws['seeds']} seeds; ")
        if not tied:
            why += "every other candidate is resolved behind it (paired over seeds, Holm-corrected p < 0.05)"
        else:
            why += (f"not resolved from {', '.join(tied)} at {ws['seeds']} seeds (paired, Holm-corrected); "
                    + (f"resolved ahead of {', '.join(behind)}; " if behind else "")
                    + "more seeds (--seeds) may separate them")
        resolved = j["resolved"]
    else:
        resolved = False
        why = (f"no candidate reached the target loss {px['target_loss']:g} in every seed; {w} is the best by seeds "
               "reached, then time, then final loss: not a finding. Raise --target-loss or --steps and run again")
    st = getattr(a, "stability", None)
    if st:
        why += "; " + stability_text(st, resolved)
    split = [f"{c['name']} ({seed_split(c['outer_rounds_at_target'])})" for c in cands
             if seed_split(c["outer_rounds_at_target"])]
    if split:
        why += ("; the seeds of " + "; ".join(split) + " reached the target at different outer rounds: its time to "
                "target is decided by which round a run's seed reaches it at, not by the cluster alone")
    wc = next(c for c in cands if c["name"] == w)
    return {"format": ADVICE_FORMAT, "probe": os.path.abspath(probe_path), "created_unix_s": time.time(),
            "command": "python experiments/advise.py " + " ".join(shlex.quote(x) for x in a.argv),
            "cluster": {k: cl[k] for k in ("nodes", "step_s", "slow_workers", "slowdown", "jitter", "link_gbit",
                                           "latency_ms", "ratio", "params", "wire_bytes", "node_slowdowns",
                                           "measured_nodes", "measured_links", "complete", "exchanges", "placement")},
            "proxy": {k: px[k] for k in ("preset", "step_s", "link_gbit", "latency_us", "target_loss", "seeds", "steps",
                                         "batch", "servers", "servers_from", "server_link_gbit", "slow_workers", "slowdown", "jitter",
                                         "eval_every", "eval_batches", "limit", "time_scale", "server_placement",
                                         "placement_from", "goodput", "calibration", "compute_model",
                                         "worker_slowdowns")}
                      | ({"base_seeds": px["base_seeds"]} if "base_seeds" in px else {}),
            "assumptions": assumptions(cl, px, names) + ([
                f"the rest of a run: from step {a.from_step} of the proxy's {px['steps']} (fraction "
                f"{a.from_fraction:.3g} of the job's steps done); each candidate's predicted time is from the time "
                f"its own run in the simulator stood at step {a.from_step} (every worker past it) to the target: its "
                "own first steps stand in for what the job ran before (the job's state at a switch is not "
                "modelled), a switch's cost (restart, steps since the newest checkpoint, AdamW moments that do not "
                "carry over) is not counted, and the time limit is still the ring's whole run x --limit"]
                                                         if a.from_step else []),
            "from_step": a.from_step, "from_fraction": a.from_fraction,
            "validated": validation(cl, names, px["servers"]),
            "stability": st,
            "candidates": cands,
            "recommended": {"name": w, "worker_flags": wc["worker_flags"], "server_flags": wc["server_flags"],
                            "resolved": resolved, "why": why, "not_resolved_from": j.get("tied", [])
                            if j["winner"] is not None else [c["name"] for c in cands if c["name"] != w]},
            "run": run_line(w, cl, wc["worker_flags"], wc["server_flags"], os.path.join(a.out, "advice.json")),
            "warnings": cl["warnings"]}


def rest_phrase(a):
    return f"from step {a.from_step} of {a.steps} " if a.from_step else ""


def interval_stats(s, scale):
    """A mean_ci95 result scaled by `scale` (for fmt_ci)."""
    out = dict(s)
    if s["mean"] is not None:
        out["mean"] = s["mean"] * scale
        out["ci95"] = [s["ci95"][0] * scale, s["ci95"][1] * scale]
    return out


EXCHANGE_WHAT = {"ring": ("the ring's all-reduce", "ring all-reduces"),
                 "ps": ("parameter-server messages", "BSP round trips to the servers"),
                 "ps_spread": ("the asynchronous candidates' parameter-server messages",
                               "round trips to ASP shards with the pushes spread out")}


def exchange_what(p, cl):
    """EXCHANGE_WHAT[p][0], the spread rounds' naming the candidates --spread-calibration gave them to."""
    sp = cl["exchanges"].get("ps_spread") if p == "ps_spread" else None
    return f"the parameter-server messages of {SPREAD_FOR[sp['for']]}" if sp and sp.get("for") else EXCHANGE_WHAT[p][0]


def calibration_assumptions(cl, px, names):
    """What the advice takes of the probe's exchange rounds, per pattern its candidates use."""
    A = []
    patterns = patterns_used(cl, names)
    if px.get("calibration") == "off":
        return [f"the probe's exchange rounds are not used (--no-exchange-calibration): "
                f"{' and '.join(exchange_what(p, cl) for p in patterns)} at the links' measured bulk goodput"]
    for p in patterns:
        what, rounds = exchange_what(p, cl), EXCHANGE_WHAT[p][1]
        ex, g = cl["exchanges"].get(p), (px.get("goodput") or {}).get(p)
        if g is None:
            if ex is None:
                how = ("scripts/local_cluster.sh --probe --servers K --consistency bsp" if p == "ps" else
                       "syncopate-probe --probe.ring_rounds=10")
                A.append(f"the probe timed no {rounds} ({how} does): {what} at the links' measured bulk goodput")
            else:
                A.append(f"the probe's {rounds} are not applied ({px.get('calibration', 'not run')}): {what} at the "
                         "links' measured bulk goodput")
            continue
        t = px["time_scale"]
        text = (f"{what} get {g['goodput']:.3g} x the link rate: the probe's {rounds} of the model's size, "
                + ("node r starting r/N of a gap after node 0" if p == "ps_spread" else "every node at once")
                + f", {ex['gap_s']:.3g} s apart, took {ex['round_s']:.4g} s (the median over {ex['nodes']} nodes), "
                f"against the simulator's {g['modelled_round_s'] * t:.4g} s at the links' rate ({g['fixed_s'] * t:.3g} s "
                "of it latency and other costs that do not scale with the rate)")
        if g["clamped"]:
            text += (f"; clamped to [{GOODPUT_RANGE[0]:g}, {GOODPUT_RANGE[1]:g}]: no goodput in that range reproduces "
                     "the measured round (the nodes' rounds overlapped one another's pauses, or the exchange's latency "
                     "is not the one the links' round trips showed): the simulator stays pessimistic for it")
        if g["goodput"] > 1:
            text += ("; above 1: the links passed more than their measured bulk rate in exchanges this short (a rate "
                     "limiter's burst after the pause, or a link faster than its bulk transfer showed)")
        elif g["goodput"] < 1:
            text += "; below 1: losses, retransmissions, incast or the servers' own time slowed the exchange"
        if p == "ps" and any(is_async_ps(x) and exchange_pattern(x, cl) == "ps" for x in names):
            text += (" (BSP's pattern, every node at once; the asynchronous candidates' pushes spread out: where the "
                     "spread rounds were not timed (the probe times them only where the shards run on the job's nodes) "
                     "or not given to them (--spread-calibration), they get the same share, which made their times "
                     "pessimistic by up to 2x on slow links in the advice-against-hindsight check, docs/STUDY.md)")
        A.append(text)
    return A


# Where the advised shard count came from (proxy.servers_from): (the dry run's word, the assumption's words).
SERVERS_FROM = {"--servers": ("--servers", "--servers"),
                "first": ("the first advice's", "the advice the run started from"),
                "probe": ("as probed", "the shards the probe's round trips went to"),
                "default": (f"min(N, {MAX_SERVERS}): not probed",
                            f"min(N, {MAX_SERVERS}): the probe timed no parameter-server round trips, so the job's "
                            "shard count is not known; give --servers K (or probe with the job's servers)")}


def server_assumption(cl, px):
    """Where the parameter servers are taken to be, and how many."""
    k = px["servers"]
    where = (f"on nodes 0..{min(k, cl['nodes']) - 1} (shard k on node k mod N), sharing those nodes' links"
             if px.get("server_placement") == "nodes" else
             f"on hosts of their own at {px['server_link_gbit'] / px['link_gbit']:.3g} x the nodes' link each, so that "
             "their links together carry the workers' (K x B_server = N x B)")
    text = (f"servers: K = {k} shard(s) ({SERVERS_FROM[px.get('servers_from', 'default')][1]}), {where} (placement "
            f"{PLACEMENT_FROM[px.get('placement_from', '--server-placement')][1]}")
    placed = cl.get("placement") or {}
    if placed.get("why"):
        text += f"; the probe: {placed['why']}"
    text += ")"
    on = placed.get("shard_nodes") or []
    if px.get("server_placement") == "nodes" and all(x is not None for x in on) and on != [
            j % cl["nodes"] for j in range(len(on))]:
        text += ("; the simulator puts shard k on node k mod N, not on the nodes the probe found: which nodes "
                 "carry a shard is modelled only as how many")
    ex = cl["exchanges"].get("ps")
    if ex and ex["servers"] != k:
        text += (f"; the probe's round trips went to {ex['servers']} shard(s), the candidates use {k}: the "
                 "parameter servers' share of the link rate was measured on another layout than the one advised")
    return text


def assumptions(cl, px, names):
    A = list(cl["assumptions"])
    A.append(f"the proxy keeps the cluster's ratios, not its model's loss curve: the micro model ({crossover.PARAMS} "
             f"parameters, {BATCH} sequences per worker-step) learns in place of the job's {cl['params']}-parameter "
             f"model, and predicted seconds on the cluster = proxy seconds x T / {STEP_S:g} = x {px['time_scale']:.4g}")
    A.append(f"communication/compute ratio r = (2 x params x wire_bytes x 8 / link) / T = {cl['ratio']:.3g} "
             f"(the slowest ring link, {cl['link_gbit']:.3g} Gbit/s, for every link)" if cl["link_gbit"] else "one node: no link")
    A.append(server_assumption(cl, px))
    A.append(f"latency: {cl['latency_ms'] * 1e3:.3g} us one way (median RTT / 2), dilated to {px['latency_us']:.3g} us "
             "in the proxy")
    if px.get("compute_model") == "per-node":
        A.append(f"jitter {cl['jitter']:.3g} = the nodes' pooled (mean - min) / min x n / (n - 1), modelled as "
                 "exponential (--compute-model per-node)")
    else:
        A.append(f"jitter {cl['jitter']:.3g} = the median over nodes of mean / min - 1, modelled as exponential")
    if px.get("worker_slowdowns"):
        A.append("every node at its own measured factor, node r on the proxy's worker r ("
                 + ", ".join(f"{x:.3g}" for x in px["worker_slowdowns"]) + "; an unmeasured node at 1)")
    if cl["slow_workers"] and not px.get("worker_slowdowns"):
        A.append(f"stragglers: node(s) {', '.join(map(str, cl['slow_workers']))} at {cl['slowdown']:.2f}x (one factor, "
                 "the largest, for every straggler); in the proxy they are workers "
                 f"{', '.join(map(str, px['slow_workers']))} (the highest ranks: worker 0 evaluates)")
    A.append("learning rates are crossover.py's, chosen at 8 nodes (2e-3; SSP 1e-3; diloco50 and async_local_sgd "
             "take diloco10's), not tuned for this cluster; worker_flags carry no --optim.lr: the job's stays its own")
    A.append("the proxy's ring clips each node's gradient (dist.clip_scope=node, as crossover.py); the flags leave "
             "the job's clip scope as it is")
    A.append(f"bsp_backup: {max(1, cl['nodes'] // 8)} backup worker(s) (N / 8, at least 1)")
    if "async_local_sgd" in names:
        A.append("async_local_sgd: ps, ASP, H = 10, outer delayed Nesterov (outer_delay = the nodes; the live members in an elastic job), accepted by "
                 "syncopate-sim")
    A.append("bytes_per_step: what one node sends (and receives) per optimizer step on the cluster: ring "
             "2(N-1)/N x params x wire_bytes, ps params x wire_bytes, local SGD / DiLoCo that divided by H")
    A.append(f"time to target: validation loss {px['target_loss']:g} on {EVAL_BATCHES * BATCH} held-out sequences "
             f"every {px['eval_every']} steps of worker 0, the crossing placed linearly; a run stops there or at "
             f"{px['limit']:g} x the ring's time; a seed that missed counts at the limit in the paired test")
    A += calibration_assumptions(cl, px, names)
    used = any((px.get("goodput") or {}).values())
    A.append("the simulator models no packet loss" + (" (beyond what the measured goodput absorbs)" if used else "")
             + ", no per-message CPU cost, no hierarchy inside a node, and no overlap of communication with compute "
             "(docs/STUDY.md)")
    return A


# --------------------------------------------------------------------------------------------
# Printing

def fmt_bytes(b):
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= f:
            return f"{b / f:.3g} {unit}"
    return f"{b:.0f} B"


def fmt_interval(i):
    if i["mean"] is None:
        return "n/a"
    if i["lo"] == i["hi"]:
        return f"{i['mean']:.3g}"
    return f"{i['mean']:.3g} [{i['lo']:.3g}, {i['hi']:.3g}]"


def compute_phrase(cl):
    """The calibrated nodes' speeds, as the cluster line says them."""
    if cl.get("compute_model") in ("per-node", "per-node-factors"):
        f = cl["node_slowdowns"].values()
        return f"nodes at {min(f):.3g}-{max(f):.3g}x (each as measured)"
    if cl["slow_workers"]:
        return f"stragglers {', '.join(map(str, cl['slow_workers']))} at {cl['slowdown']:.2f}x"
    return "no straggler"


def describe(cl, px):
    L = [f"cluster: N = {cl['nodes']} nodes ({cl['measured_nodes']} measured), base step T = {cl['step_s']:.4g} s, "
         f"jitter {cl['jitter']:.3g}, "
         + compute_phrase(cl)
         + (f", link {cl['link_gbit']:.4g} Gbit/s (slowest of {cl['measured_links']}), latency "
            f"{cl['latency_ms'] * 1e3:.3g} us one way, ratio r = {cl['ratio']:.3g}" if cl["link_gbit"] else "")
         + f", {cl['params']} parameters x {cl['wire_bytes']} wire bytes",
         f"proxy: {px['preset']} model, modelled step {px['step_s']:g} s, link {px['link_gbit']:.4g} Gbit/s, "
         + f"{px['servers']} servers ({SERVERS_FROM[px.get('servers_from', 'default')][0]}) "
         + (f"on nodes 0..{px['servers'] - 1} sharing their links"
            if px.get("server_placement") == "nodes" else f"at {px['server_link_gbit']:.4g} Gbit/s")
         + f" ({PLACEMENT_FROM[px.get('placement_from', '--server-placement')][0]})"
         + f", latency {px['latency_us']:.3g} us"
         + (f", workers {','.join(map(str, px['slow_workers']))} at {px['slowdown']:.2f}x" if px["slow_workers"] else "")
         + (", workers at " + ",".join(f"{x:.3g}" for x in px["worker_slowdowns"]) + "x (per node)"
            if px.get("worker_slowdowns") else "")
         + f", jitter {px['jitter']:.3g}; target loss {px['target_loss']:g}, {px['steps']} steps at most, "
         f"{px['seeds']} seed(s), limit {px['limit']:g} x the ring's time; proxy s x {px['time_scale']:.4g} = cluster s"]
    return L


def table(adv):
    w = adv["recommended"]["name"]
    rows = [("candidate", "predicted s to target [95%]", "reached", "bytes/step/node", "verdict")]
    for c in sorted(adv["candidates"], key=lambda c: (c["predicted_s"]["mean"] is None,
                                                      c["predicted_s"]["mean"] or 0.0)):
        if c["name"] == w:
            verdict = "recommended" + ("" if adv["recommended"]["resolved"] else " (not resolved)")
        elif c["resolved_behind_winner"]:
            verdict = "resolved behind"
        else:
            verdict = f"not resolved from {w}"
        if c["reached"] < c["seeds"]:
            verdict += f"; missed the target in {c['seeds'] - c['reached']} seed(s)"
        if seed_split(c.get("outer_rounds_at_target")):
            verdict += f"; reached at {seed_split(c['outer_rounds_at_target'])}"
        rows.append((c["name"], fmt_interval(c["predicted_s"]), f"{c['reached']}/{c['seeds']}",
                     fmt_bytes(c["bytes_per_step"]), verdict))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return ["  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows]


# --------------------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(prog=os.environ.get("SYNCOPATE_ADVISE_PROG") or "advise.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probe", nargs="?", help="probe.json written by syncopate-probe (not with --from-run)")
    ap.add_argument("--from-run", nargs="+", metavar="RUN",
                    help="re-advise a run started with --dist.mode=auto: its nodes' step times as measured in the "
                         "run replace the probe's (experiments/run_probe.py); the target, seeds and steps are the "
                         "first advice's unless given; says whether the pick changes")
    ap.add_argument("--window", type=int, default=50, metavar="STEPS",
                    help="--from-run: each node's step time from its last STEPS steps (default 50; the run's "
                         "re-decision, --dist.readvise_every, passes half its drift watch's window of 20: at its first drift the last 10 steps "
                         "came after the change; a node's calibrated step is its fastest in the window)")
    ap.add_argument("--from-fraction", type=float, default=None, metavar="F",
                    help="advise the rest of a run that has done the fraction F of its steps (0 <= F < 1): each "
                         "candidate's predicted time runs from its own step F x --steps in the simulator to the "
                         "target, which every candidate must reach after that step (default 0: a whole run; "
                         "--from-run prints where the run stands)")
    ap.add_argument("--target-loss", type=float, default=None,
                    help="validation loss of the proxy model to reach (default 3.0; see the note above on 3.2)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per candidate (0..S-1; default 3)")
    ap.add_argument("--stability-seeds", type=int, default=0, metavar="K",
                    help="where the pick changes with one seed left out (seed-decided), add seeds S, S+1, ... of "
                         "every candidate until it holds, at most K (default 0: report it, add none)")
    ap.add_argument("--steps", type=int, default=None, help="steps per worker at most (the schedule's length; default 150)")
    ap.add_argument("--eval-every", type=int, default=5, help="steps of worker 0 between evaluations")
    ap.add_argument("--limit", type=float, default=3.0, help="time limit of a run: this x the ring's time")
    ap.add_argument("--configs", default=",".join(CANDIDATES),
                    help="candidates, comma-separated (the ring always runs: it sets the time limit)")
    ap.add_argument("--no-servers", action="store_true",
                    help="the job has no parameter servers to start (scripts/launch_node.sh without SYNCOPATE_SERVERS): "
                         "leave the parameter-server candidates out of --configs")
    ap.add_argument("--servers", type=int, default=None, metavar="K",
                    help="the job's parameter-server shards (default: the shard count the probe's BSP round trips "
                         "went to, else min(N, 16), stated as an assumption; with --from-run, the first advice's)")
    ap.add_argument("--server-placement", choices=("dedicated", "nodes"), default=None,
                    help="where the parameter servers run: dedicated hosts whose links together carry the workers', "
                         "or nodes 0..K-1 sharing their links (scripts/local_cluster.sh --netns, launch_node.sh); "
                         "default: where the probe found the shards (their addresses against the nodes'), else "
                         "dedicated, stated as an assumption; with --from-run, the first advice's")
    ap.add_argument("--compute-model", choices=COMPUTE_MODELS, default=None,
                    help="how the probe's step times become the simulated nodes: stragglers (default): nodes at "
                         f"{STRAGGLER_AT}x the base step or more at the largest factor, the rest at the base step, "
                         "jitter the nodes' median; per-node: every node at its own factor, jitter pooled over the "
                         "nodes' samples; per-node-factors: the ablation, every node at its own factor and the "
                         "median jitter (docs/STUDY.md, session 48); with --from-run, the first advice's")
    ap.add_argument("--no-exchange-calibration", action="store_true",
                    help="every message at the links' measured bulk goodput, even where the probe timed the ring's "
                         "all-reduce or the parameter servers' round trips at the model's size (the ablation of that "
                         "calibration)")
    ap.add_argument("--spread-calibration", choices=("none", "asp", "async"), default="none",
                    help="where the probe timed spread rounds to ASP shards: none (default): every parameter-server "
                         "candidate takes the BSP round trips' share; asp: ASP and asynchronous local SGD take the "
                         "spread rounds' share; async: SSP too (docs/STUDY.md, session 42)")
    ap.add_argument("--no-spread-calibration", dest="spread_calibration", action="store_const", const="none",
                    help="the same as --spread-calibration none (the name session 42's records ran with)")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "advise"),
                    help="writes advice.json, advice.toml and runs/<config>/seed<k>/ here")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the calibrated cluster, the proxy and the runs it would make; start nothing, write nothing")
    ap.add_argument("--calibration-only", action="store_true",
                    help="calibrate from the probe (the cluster, the proxy, each exchange's goodput: two short "
                         "simulated exchanges per pattern), write OUT/calibration.json and stop: what the simulator "
                         "takes from a probe, e.g. to compare probes of one cluster")
    a = ap.parse_args(argv)
    a.out = os.path.abspath(a.out)  # cached runs are keyed by their command line, which names their directory
    if a.window < 1:
        ap.exit(2, "advise: --window must be >= 1\n")
    if bool(a.probe) == bool(a.from_run):
        ap.exit(2, "advise: give a probe.json, or --from-run RUN (not both)\n")
    a.first = None  # --from-run: the advice the run started from
    a.servers_from = "--servers"  # where a.servers came from (SERVERS_FROM): "first" when --from-run supplies it
    a.placement_from = "--server-placement"  # likewise a.server_placement (PLACEMENT_FROM)
    if a.from_run:
        try:
            probe, a.first, notes = run_probe.probe_from_run(a.from_run, window=a.window)
        except (run_probe.RunError, OSError, json.JSONDecodeError) as e:
            ap.exit(2, f"advise: {e}\n")
        for n in notes:
            print(f"[advise] {n}", flush=True)
        if a.dry_run:  # writes nothing under --out
            a.probe = os.path.join(tempfile.mkdtemp(prefix="syncopate-from-run-"), "probe.from-run.json")
        else:
            os.makedirs(a.out, exist_ok=True)
            a.probe = os.path.join(a.out, "probe.from-run.json")
        with open(a.probe, "w") as f:
            json.dump(probe, f, indent=1)
        at = probe["from_run"]
        if a.from_fraction is None and at.get("steps"):
            print(f"[advise] the run stands at step {at['step']} of {at['steps']}: whole runs are ranked; "
                  f"--from-fraction {at['step'] / at['steps']:.3g} ranks the rest of it (with a target loss it has "
                  "not reached)", flush=True)
        first_px = a.first.get("proxy") or {}
        origin = {"servers": "servers_from", "server_placement": "placement_from"}  # where each came from
        for k in ("target_loss", "seeds", "steps", "servers", "server_placement", "compute_model"):
            # seeds: the first advice's own, before any --stability-seeds added to it (else a re-advice
            # would start from those and add more)
            v = first_px.get("base_seeds", first_px.get(k)) if k == "seeds" else first_px.get(k)
            if getattr(a, k) is None and v is not None:
                setattr(a, k, v)
                if k in origin:
                    setattr(a, origin[k], "first")
    a.target_loss = 3.0 if a.target_loss is None else a.target_loss
    a.compute_model = "stragglers" if a.compute_model is None else a.compute_model
    a.seeds = 3 if a.seeds is None else a.seeds
    a.steps = 150 if a.steps is None else a.steps
    names = [x for x in a.configs.split(",") if x]
    unknown = [x for x in names if x not in CANDIDATES]
    if a.no_servers and not unknown:
        names = [x for x in names if not is_ps(x)]
    if unknown or not names:
        ap.exit(2, f"advise: unknown configuration(s) {', '.join(unknown) or '(none given)'}; choose from "
                   f"{', '.join(CANDIDATES)}\n")
    if a.servers is not None and not 1 <= a.servers <= 4096:
        ap.exit(2, f"advise: --servers {a.servers} is not in 1..4096: give the job's parameter-server shard count\n")
    if a.stability_seeds < 0:
        ap.exit(2, f"advise: --stability-seeds {a.stability_seeds} is negative: give how many seeds may be added\n")
    if a.seeds < 1 or a.steps < 1 or a.eval_every < 1 or a.limit <= 0 or a.target_loss <= 0:
        ap.exit(2, "advise: --seeds, --steps and --eval-every must be >= 1, --limit and --target-loss > 0\n")
    a.from_fraction = 0.0 if a.from_fraction is None else a.from_fraction
    if not 0.0 <= a.from_fraction < 1.0:
        ap.exit(2, f"advise: --from-fraction {a.from_fraction:g} is not in [0, 1): "
                   + ("the run has done all its steps; nothing is left to advise\n" if a.from_fraction >= 1.0 else
                      "give the fraction of the job's steps already run\n"))
    a.from_step = int(a.from_fraction * a.steps + 0.5)  # in the proxy's steps
    uneven = [f"{x} (H = {sync_every(x)})" for x in names if a.steps % sync_every(x)]
    if uneven:  # the simulator refuses a local-SGD run whose last round would never reach the job's weights
        hs = sorted({sync_every(x) for x in names})
        lcm = math.lcm(*hs)
        ap.exit(2, f"advise: --steps {a.steps} is not a multiple of the synchronization interval of "
                   f"{', '.join(uneven)}: use a multiple of {lcm} (e.g. {max(lcm, a.steps // lcm * lcm)}), or leave "
                   "those out of --configs\n")
    a.names, a.argv = names, list(argv)
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cl = calibrate(load_probe(a.probe), a.probe, a.compute_model)
        use_spread_rounds(cl, a.spread_calibration)
    except ProbeError as e:
        print(f"advise: {e}", file=sys.stderr)
        return 2
    for w in cl["warnings"]:
        print(f"[advise] warning: {w}", file=sys.stderr, flush=True)
    if cl["nodes"] == 1:
        print("[advise] one node: nothing to synchronize; run the job with --dist.mode=none", flush=True)
        if a.dry_run:
            return 0
        os.makedirs(a.out, exist_ok=True)
        adv = {"format": ADVICE_FORMAT, "probe": os.path.abspath(a.probe), "created_unix_s": time.time(),
               "command": "python experiments/advise.py " + " ".join(shlex.quote(x) for x in a.argv),
               "cluster": {k: cl[k] for k in ("nodes", "step_s", "slow_workers", "slowdown", "jitter", "link_gbit",
                                              "latency_ms", "ratio", "params")},
               "proxy": None, "assumptions": cl["assumptions"], "validated": {"inside": False, "notes": ["one node"]},
               "candidates": [], "recommended": {"name": "none", "worker_flags": ["--dist.mode=none"], "server_flags": [],
                                                 "resolved": True, "why": "one node: nothing to synchronize"},
               "run": "scripts/launch_node.sh -- --out runs/job --dist.mode=none", "warnings": cl["warnings"]}
        write(adv, a.out, a.probe)
        return 0
    px = proxy(cl, a)
    if not 1e-6 <= px["link_gbit"] <= 1e5:
        print(f"advise: the ratio r = {cl['ratio']:.3g} (links {cl['link_gbit']:.3g} Gbit/s for a {cl['step_s']:.3g} s "
              f"step) needs a proxy link of {px['link_gbit']:.3g} Gbit/s, outside the simulator's 1e-6..1e5; check "
              "the probe's goodput_gbit and step_s", file=sys.stderr)
        return 2
    order = candidate_order(a.names)
    for line in describe(cl, px):
        print(f"[advise] {line}", flush=True)
    if not os.path.exists(sim_binary()):
        if a.dry_run:
            print(f"[advise] note: {sim_binary()} is not built yet (scripts/build.sh builds it)", flush=True)
        else:
            print(f"advise: {sim_binary()} is missing; build it first (scripts/build.sh)", file=sys.stderr)
            return 2
    px["goodput"] = {p: None for p in EXCHANGES}
    measured = [p for p in patterns_used(cl, order) if cl["exchanges"].get(p)]
    if a.no_exchange_calibration:
        px["calibration"] = "off"
        print("[advise] --no-exchange-calibration: every message at the links' measured bulk goodput", flush=True)
    elif a.dry_run:
        px["calibration"] = "dry run"
        for p in measured:
            print(f"[advise] the probe timed {EXCHANGE_WHAT[p][1]} ({cl['exchanges'][p]['round_s']:.4g} s): a run "
                  "would hold them against the simulator's exchange (two short simulated runs)", flush=True)
    else:
        px["calibration"] = "applied"
        os.makedirs(a.out, exist_ok=True)
        for p in measured:
            g = px["goodput"][p] = exchange_goodput(cl, px, a.out, p)
            print(f"[advise] {EXCHANGE_WHAT[p][1]}: measured {cl['exchanges'][p]['round_s']:.4g} s, the simulator's "
                  f"{g['modelled_round_s'] * px['time_scale']:.4g} s at the links' rate: {exchange_what(p, cl)} get "
                  f"{g['goodput']:.3g} x the link rate (--sim.{'ring' if p == 'ring' else 'ps'}_goodput)" + (" (clamped)" if g["clamped"] else ""),
                  flush=True)
            if g["clamped"]:
                print(f"[advise] warning: the measured {EXCHANGE_WHAT[p][1]} lie outside what a goodput in "
                      f"{list(GOODPUT_RANGE)} reproduces: the advice's times for them are the clamp's", file=sys.stderr)
    if a.calibration_only and not a.dry_run:
        path = os.path.join(a.out, "calibration.json")
        doc = {"format": "syncopate-calibration/1", "probe": os.path.abspath(a.probe),
               "command": "python experiments/advise.py " + " ".join(shlex.quote(x) for x in a.argv),
               "cluster": {k: v for k, v in cl.items() if k not in ("assumptions", "warnings")},
               "proxy": px, "assumptions": calibration_assumptions(cl, px, order)}
        os.makedirs(a.out, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(path + ".tmp", path)
        print(f"[advise] wrote {path} (--calibration-only: no candidate run)", flush=True)
        return 0
    rows, m = plan(order, px, cl, a.out)
    todo = [r for r in rows if not r[2]]
    est = None if any(r[3] is None for r in todo) else sum(r[3] for r in todo)
    print(f"[advise] plan: {len(rows)} simulated runs ({len(order)} candidates x {a.seeds} seeds"
          + ("" if "ring" in a.names else "; the ring for the time limit only") + f"), {len(rows) - len(todo)} "
          f"cached, {len(todo)} to run, one at a time"
          + (f", and {len(order)} more per added seed where the pick is seed-decided (--stability-seeds "
             f"{a.stability_seeds}: at most {len(order) * a.stability_seeds} more)" if a.stability_seeds else "")
          + "; estimated at most "
          + (f"~{cost.minutes(est)} min" if est is not None else "(not available: " + "; ".join(
              b for b in m.basis() if "NOT" in b) + ")"), flush=True)
    if a.dry_run:
        for name, seed, is_cached, e in rows:
            print(f"[advise]   {name} seed {seed}: " + ("cached (if made with the same command)" if is_cached else
                  f"lr {CANDIDATES[name][1]:g}, {' '.join(sim_flags(name, cl['nodes']))}, at most {a.steps} steps/"
                  "worker"), flush=True)
        print("[advise] dry run: nothing started, nothing written (drop --dry-run to run)", flush=True)
        return 0
    os.makedirs(a.out, exist_ok=True)
    whole = {name: [] for name in order}

    def add_seed(seed):
        ring = run("ring", seed, px, cl, a.out)
        whole["ring"].append(ring)
        limit = a.limit * (ring["time_to_target_s"] or ring["simulated_s"])
        for name in order[1:]:
            whole[name].append(run(name, seed, px, cl, a.out, limit))

    def ranked():
        return rest_of_run(whole, a.out, a.from_step) if a.from_step else (whole, [])

    for seed in range(a.seeds):
        add_seed(seed)
    # Does the pick hold with any one seed left out? Where it does not (a seed-decided pick), add
    # seeds of every candidate, one at a time, up to --stability-seeds.
    added = 0
    while True:
        results, early = ranked()
        now = pick(results, a.names)
        loo = leave_one_out(results, a.names)
        reached_all = crossover.judge({k: results[k] for k in a.names})["winner"] is not None
        stable = all(p == now for p in loo.values()) if loo else None
        untested = (None if loo else "no candidate reached the target in every seed" if not reached_all
                    else "fewer than 3 seeds: a pick without one of them needs 2")
        # Stop where the pick holds, where it cannot be tested (no candidate reached the target in every
        # seed: more seeds do not change that), at K added, or where the rest of a run is already past it;
        # fewer than 3 seeds is untested too, and added seeds make it testable.
        untestable = stable is None and not reached_all
        if stable or untestable or added >= a.stability_seeds or any(n in a.names for n, _ in early):
            break
        print(f"[advise] " + (f"seed-decided: without one seed the pick {now} becomes "
                               f"{', '.join(sorted({p for p in loo.values() if p != now}))}" if loo else
                               "fewer than 3 seeds to test the pick with one left out")
              + f"; adding seed {a.seeds + added} (--stability-seeds {a.stability_seeds})", flush=True)
        add_seed(a.seeds + added)
        added += 1
    px["seeds"] = a.seeds + added
    px["base_seeds"] = a.seeds   # what a re-advice (--from-run) starts from, before its own added seeds
    a.stability = {"pick": now, "seeds": a.seeds + added, "seeds_added": added, "max_added": a.stability_seeds,
                   "leave_one_out": {str(sd): p for sd, p in loo.items()}, "stable": stable, "untested": untested,
                   "rule": "the pick with each seed's runs of every candidate left out in turn; a pick that changes "
                           "is seed-decided, and --stability-seeds K adds seeds (every candidate) until it holds or K "
                           "are added"}
    if a.from_step:
        early = [f"{n} seed {sd}" for n, sd in early if n in a.names]
        if early:
            print(f"advise: the rest of a run from step {a.from_step} of {a.steps} cannot be ranked at the target loss "
                  f"{px['target_loss']:g}: the simulator reached it by that step in {', '.join(early)}, so the rest has "
                  "no target ahead of it there; give a lower --target-loss (one every candidate reaches after that "
                  "step), or --from-fraction 0 for a whole run", file=sys.stderr, flush=True)
            return 2
        print(f"[advise] the rest of the run: times from the step {a.from_step} of {a.steps} of each candidate's own "
              "run", flush=True)
    adv = advise(cl, px, a.names, results, a, a.probe)
    write(adv, a.out, a.probe)
    print("\n".join(table(adv)))
    rec = adv["recommended"]
    print(f"recommended: {rec['name']}" + ("" if rec["resolved"] else " (not resolved: "
                                              + (", ".join(rec["not_resolved_from"]) or "see why") + ")")
          + f"; worker {' '.join(rec['worker_flags'])}" + (f"; servers {' '.join(rec['server_flags'])}"
                                                            if rec["server_flags"] else ""))
    print(f"why: {rec['why']}")
    print(f"validated: {'inside' if adv['validated']['inside'] else 'OUTSIDE'} the simulator's validated range: "
          + adv["validated"]["notes"][0])
    print(f"run (on every node): {adv['run']}")
    print(f"wrote {os.path.join(a.out, 'advice.json')} and {os.path.join(a.out, 'advice.toml')} "
          "(syncopate-worker/-server --config advice.toml; the learning rate stays the job's)")
    if a.first is not None:  # --from-run: against the advice the run started from
        before = (a.first.get("recommended") or {}).get("name")
        print(f"re-advice: the pick {'is unchanged' if before == rec['name'] else 'changes'}: {before} -> "
              f"{rec['name']}" + ("" if rec["resolved"] else " (the new pick is not resolved: see why)")
              + ("; to take it, stop the job and start it again from its newest checkpoint with --resume "
                 "--dist.mode=auto --dist.advice=" + os.path.join(a.out, "advice.json") + " (weights, step and data "
                 "position carry over, AdamW's moments too unless the switch is to or from per-step parameter "
                 "servers)" if before != rec["name"] else ""))
    return 0


def write(adv, out, probe_path):
    rec = adv["recommended"]
    tmp = os.path.join(out, "advice.json.tmp")
    with open(tmp, "w") as f:
        json.dump(adv, f, indent=2)
        f.write("\n")
    os.replace(tmp, os.path.join(out, "advice.json"))
    with open(os.path.join(out, "advice.toml"), "w") as f:
        f.write(toml_text(rec["name"], rec["worker_flags"], rec["server_flags"], probe_path))


def _terminated(signum, frame):
    """SIGTERM (a launcher ending a re-advice, scripts/launch_node.sh): the simulated runs, each in its
    own session, are stopped with it instead of outliving it. From a thread of its own: this handler
    runs inside the main thread's wait for a run (run_group), and waiting for that process here as
    well deadlocked on the interrupted wait (seen when a hindsight run was stopped: the simulator
    killed, never reaped, advise.py asleep). SystemExit unwinds that wait, and run_group stops its
    group too."""
    threading.Thread(target=cluster_runs.terminate_running, name="advise-terminate").start()
    raise SystemExit(143)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated)
    sys.exit(main())
