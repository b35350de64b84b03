#!/usr/bin/env python3
"""Churn at the issue's scale: a timeline model of goodput per synchronization, whose mechanism costs
are measured on the emulated cluster, checked against the emulated runs it did not measure, and
then played at one membership event per 10 modelled minutes with 30 s checkpoints (issue 30).

    experiments/churn_model.py measure RUN_DIR [RUN_DIR ...] [--seeds A-B] [--out costs.json]
    experiments/churn_model.py validate RUN_DIR [RUN_DIR ...] [--out DIR]
    experiments/churn_model.py scenario --out DIR [--nodes 8] [--hours 4] [--seeds 40] [assumptions ...]

Why a model and not the emulated cluster: the emulation runs in wall time, so an event every 10
minutes needs hours per run; runs/churn_scenario read the scenario at a time scale of 10, which makes
every process start-up 10 times too expensive against the events. The model plays the same seeded
schedules (experiments/churn.py's draw_schedule, unchanged) on a timeline of job steps, with each
mechanism a measured or stated cost. What it models, per configuration (churn.py's names):

  start-up     a process from launch to its first step: U0 (the job's first nodes), U_back (a crashed or
               preempted node relaunched), U_join (a new node); ring_restart: its relaunch is in R below
  tail         last step to exit (final evaluation, FINISH), every node
  checkpoint   every K job steps each node holds C (emulate.checkpoint_s); a preempted node writes one as
               it leaves (C, present time)
  kill -9      the node's step in flight is lost; sync modes stall the job for stall_kill (the elastic
               ring: the abandoned step and the re-formation; BSP: the servers' worker timeout; BSP with a
               backup worker: the round completes without it); local SGD drops the node's partial round
  SIGTERM      the node finishes its step, writes its checkpoint and leaves; local SGD drops its partial
               round; sync modes stall the job for stall_term (a re-formation)
  join         a new node, or a node back after its delay, is admitted at the next step boundary (local
               SGD: round boundary); the elastic rings pause the members for stall_join (the state broadcast)
  ring_restart a kill -9 or SIGTERM fails every node: every launcher restarts its worker, the job waits for
               the lost node's launcher (its delay), then resumes after R seconds from the newest
               checkpoint, recomputing the steps since it; a join is not possible
  useful       node-steps applied once: per step the members present (BSP + b backup workers: members - b,
               the late gradients are dropped), local SGD the rounds a node completed
  goodput      useful node-steps x T / the sum of every process's lifetime (as experiments/churn.py)

measure reads churn.py's own records (churn.json and the nodes' metrics.jsonl) and writes each
configuration's costs (medians over the runs it reads); validate measures on half the seeds and
predicts the other half's goodput (and the reverse), per run, with the error; scenario plays the
issue's scenario with stated costs at scale and reports goodput per configuration against the targets
(>= 0.90 asynchronous, >= 0.80 elastic ring), with the restarting ring measured in the same study.
"""
import argparse
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from churn import CONFIGS, draw_schedule  # noqa: E402

ASYNC = ("ps_asp", "ps_async_local_sgd")
ELASTIC_RING = ("ring_elastic", "ring_diloco_elastic")
COST_KEYS = ("U0", "U_back", "U_join", "tail", "stall_kill", "stall_term", "stall_join", "R", "period", "late_share")


# ---------------------------------------------------------------------------------------------
# The timeline

def simulate(config, events, p, costs):
    """Goodput of one run of `config` under `events` (draw_schedule's list; t_s counted from the moment the
    first nodes have stepped once). p: nodes, steps, step_time, checkpoint_every, checkpoint_s, sync_every,
    and optionally worker_timeout_s (BSP's wait for a dead node), server_machines (present for the whole
    run) and shard_hosts (the nodes whose parameter-server shards run beside them and die with them: every
    push waits from the host's kill or departure until its shard is back, costs["shard_up"] after the host's
    relaunch), and shard_checkpoint_every (server.checkpoint_every: a killed host's shard rolls back to its last
    checkpoint, ShardLedger; 0 or absent: not modelled). costs: COST_KEYS in seconds. Returns a dict (goodput, useful node-steps, present node-s, time to
    end, lost node-steps by cause)."""
    r = (_simulate_async if config in ASYNC else _simulate_sync)(config, events, p, costs)
    servers = p.get("server_machines", 0) * r["time_to_end_s"]
    r["present_node_s"] += servers
    r["server_machine_s"] = servers
    r["goodput"] = r["useful_node_steps"] * p["step_time"] / r["present_node_s"] if r["present_node_s"] > 0 else None
    return r


class ShardLedger:
    """What each parameter-server shard on a node would roll back if its host were killed: the work of the
    updates it applied since its last checkpoint, which a killed shard reloads. A shard writes one when
    server.checkpoint_every of its updates have passed (`every`), and every shard is forced to write at each
    membership change of an elastic job (an admission, a FINISH or SIGTERM, a BSP round released by the
    workers' timeout: ps_server.cpp) -- `durable()`; shard 0, which holds the data grants, also writes when
    its reserve of grants runs out (every `grant_every` grants: 257 per-step, 5 for local SGD rounds;
    parameter_shard.cpp's grant_next). Every push or round updates every shard, so each holds the same
    updates; a shard holds 1/len(hosts) of the parameters, so its rollback costs that share of the work of its
    lost updates (an assumption: the loss of a slice's progress, not measured against the final loss).
    every = 0: not modelled (nothing is lost). The writes themselves are not costed."""

    def __init__(self, hosts, every, grant_every=0):
        self.n, self.every, self.grant_every = len(hosts), every, grant_every
        self.since = {s: 0 for s in hosts}    # updates since the shard's last checkpoint
        self.work = {s: 0.0 for s in hosts}   # the node-steps of those updates
        self.grants = 0                       # shard 0's data grants since its last checkpoint
        self.lost = 0.0

    def update(self, node_steps, grants):
        """One update of every shard, carrying `node_steps` of work and `grants` data grants."""
        for s in self.since:
            self.since[s] += 1
            self.work[s] += node_steps
            if self.every and self.since[s] >= self.every:
                self.since[s], self.work[s] = 0, 0.0
        if 0 in self.since and self.grant_every:
            self.grants += grants
            if self.grants >= self.grant_every:
                self.grants, self.since[0], self.work[0] = 0, 0, 0.0

    def durable(self):
        """A forced checkpoint of every shard (a membership change)."""
        for s in self.since:
            self.since[s], self.work[s] = 0, 0.0
        self.grants = 0

    def killed(self, s):
        """Node-steps lost with host s's kill -9 (its shard reloads its last checkpoint)."""
        if s not in self.since or not self.every:
            return 0.0
        lost = self.work[s] / self.n
        self.since[s], self.work[s] = 0, 0.0
        if s == 0:
            self.grants = 0
        self.lost += lost
        return lost


def _schedule(events, t0):
    return sorted(({**e, "abs": t0 + e["t_s"]} for e in events), key=lambda e: e["abs"])


def _simulate_sync(config, events, p, c):
    """The modes whose members step together: the rings and BSP (per step or per local SGD round)."""
    cfg = CONFIGS[config]
    n0, S, T = p["nodes"], p["steps"], p["step_time"]
    K, C = p["checkpoint_every"], p["checkpoint_s"]
    local = bool(cfg.get("local_sgd"))
    H = p.get("sync_every", 10) if local else 1
    backup = cfg.get("backup_workers", 0)
    ring_restart = config == "ring_restart"
    bsp = cfg.get("kind") == "ps"
    W = p.get("worker_timeout_s", c.get("stall_kill", 0.0))
    P = c.get("period") or T  # a step's wall time (the modelled compute plus the exchange's share)
    launch = {r: 0.0 for r in range(n0)}      # node -> launch of its current incarnation
    ready = {r: c["U0"] for r in range(n0)}   # node -> when it can take its first step
    lifetimes = []
    members = set()
    lost = {"in_flight": 0.0, "partial_rounds": 0.0, "recomputed": 0.0, "backup_dropped": 0.0, "shard_rollback": 0.0}
    pending = _schedule(events, c["U0"] + T)
    relaunch = []     # (time, node): crashed or preempted nodes that come back
    ghosts = []       # BSP + backup: until when each crashed node still counts as a member (its missing push)
    waits = []        # BSP: until when a round waits for a dead member (the timeout, or its return)
    round_steps = {}  # local SGD: node -> its steps in the current round (dropped if it leaves mid-round)
    hosts = set(p.get("shard_hosts") or ()) if bsp else set()  # a host's event takes its shard down with it
    up = c.get("shard_up", 0.0)  # a shard serves this long after its host is back
    ledger = ShardLedger(hosts, p.get("shard_checkpoint_every", 0), 5 if local else 257)  # an update per round
    durables = []  # BSP: when the servers' timeout (or the node's return) releases a dead member's round
    outage_s = []  # each shard outage's length
    t, step, useful = c["U0"], 0, 0.0
    ckpt, prev_ckpt = 0, 0

    def end_incarnation(r, when):
        lifetimes.append(when - launch.pop(r))
        ready.pop(r, None)
        members.discard(r)

    while step < S:
        for d in [d for d in durables if d <= t]:
            durables.remove(d)
            ledger.durable()
        for when, r in [x for x in relaunch if x[0] <= t]:
            relaunch.remove((when, r))
            launch[r] = when
            ready[r] = when + (0.0 if ring_restart else c["U_back"])
        # Admission at a boundary (local SGD: a round's); the fixed ring only at the job's start.
        joiners = [] if ring_restart and step > 0 else [
            r for r, rt in ready.items() if r not in members and rt <= t and step % H == 0]
        if joiners:
            if members and config in ELASTIC_RING:
                t += c["stall_join"]  # the state broadcast (BSP's servers admit a joiner a round ahead: no wait)
            members.update(joiners)
            if step > 0:
                ledger.durable()  # an admission is a membership change: every shard writes
            for r in joiners:
                round_steps[r] = 0
        if not members:  # everyone down or starting: wait for the next arrival
            t = max(t + 1e-9, min(list(ready.values()) + [w for w, _ in relaunch] + [e["abs"] for e in pending] + [t + T]))
            continue
        write_start = write_end = t
        if K > 0 and step > 0 and step % K == 0 and step != ckpt:
            t += C  # every member holds the write; an event in it sees the previous checkpoint as the newest
            prev_ckpt, ckpt = ckpt, step
            write_end = t
        end = t + P
        lost_step, leaving, stall, restarted = False, [], 0.0, False
        while pending and pending[0]["abs"] < end:
            e = pending.pop(0)
            te, r = e["abs"], e["node"]
            if e["kind"] == "join":
                if not ring_restart:  # the fixed ring cannot take it
                    launch[r], ready[r] = te, te + c["U_join"]
                continue
            if r not in launch:
                continue  # the node is down: churn.py does not apply it either
            if r not in members:  # starting up: it ends (kill) or leaves before stepping
                end_incarnation(r, te)
                relaunch.append((te + e["delay_s"], r))
                if r in hosts:  # its shard with it: every round waits until the shard is back
                    waits.append(te + e["delay_s"] + up)
                    outage_s.append(waits[-1] - te)
                    if e["kind"] == "kill9":
                        useful -= ledger.killed(r)  # and reloads its last checkpoint
                    else:
                        ledger.durable()  # a SIGTERM FINISHes: every shard writes
                continue
            if ring_restart:
                if e["kind"] == "sigterm" and step == S - 1:
                    continue  # preempted in the job's last step: the job is done when it stops
                # Every node fails; the job resumes from the newest complete checkpoint once the lost node's
                # launcher is back (a SIGTERM: after its step and its own checkpoint). An event that came while
                # the job was restarting (te before this step's start) delays the resumption, never earlier.
                gone = te if e["kind"] == "kill9" else end + C
                back = gone + e["delay_s"]
                lifetimes.append(gone - launch[r])
                launch[r] = back
                newest = prev_ckpt if write_start <= te < write_end else ckpt
                lost["recomputed"] += (step - newest) * len(members)
                lost["in_flight"] += len(members)
                useful -= (step - newest) * len(members)
                step, ckpt = newest, newest
                t = max(write_start, max(te, back) + c["R"])
                restarted = True
                break
            if e["kind"] == "kill9":
                end_incarnation(r, te)
                relaunch.append((te + e["delay_s"], r))
                lost["in_flight"] += 1
                if local:
                    lost["partial_rounds"] += round_steps.pop(r, 0)
                if backup:
                    # BSP with backup workers: the dead node stays a member until the servers' timeout and is the
                    # round's missing push: nothing waits, nothing is late. More dead members than backup workers
                    # inside the timeout: the round waits until the servers have counted enough of them out.
                    ghosts[:] = sorted(g for g in ghosts + [te + W] if g > te)
                    if len(ghosts) > backup:
                        waits.append(ghosts[len(ghosts) - backup - 1])
                elif bsp:
                    # The round waits for the dead member until the servers count it out (the timeout) or it
                    # is back and joins (a restarted member is counted out of the round it left).
                    waits.append(te + min(W, e["delay_s"] + c["U_back"]))
                elif config in ELASTIC_RING:
                    stall = max(stall, c["stall_kill"])
                    lost_step = not local  # the step in flight is abandoned everywhere and redone
                if r in hosts:  # its shard died with it: the rounds wait until the shard is back
                    waits.append(te + e["delay_s"] + up)
                    outage_s.append(waits[-1] - te)
                    useful -= ledger.killed(r)  # and reloads its last checkpoint
                if bsp:
                    durables.append(te + min(W, e["delay_s"] + c["U_back"]))
            else:
                leaving.append((r, e))
        if restarted:
            continue
        if not lost_step:
            ghosts[:] = [g for g in ghosts if g > t]
            if local:
                for r in members:
                    round_steps[r] = round_steps.get(r, 0) + 1
            else:
                applied = len(members)
                if backup and applied > backup:
                    # The late gradients of a round are dropped: b of the members' by definition (late_share of
                    # them where the emulated cluster's shards measured fewer); a dead member is the missing one.
                    drop = max(0.0, backup - len(ghosts)) * (c.get("late_share") or 1.0)
                    lost["backup_dropped"] += drop
                    applied -= drop
                useful += applied
                if bsp:
                    ledger.update(applied, len(members))
            step += 1
        else:
            lost["in_flight"] += len(members)
        waits[:] = [w for w in waits if w > end]
        # Per-step BSP waits at the step; local SGD's members go on with their inner steps and wait at the
        # round's sum (the round's end), for what is left of the timeout or the return.
        t = max([end + stall] + (waits if not local or step % H == 0 else []))
        round_work = 0.0  # local SGD: the node-steps of the round that ends here (one update per shard)
        for r, e in leaving:
            if r not in members:
                continue
            if local:
                if step % H:
                    lost["partial_rounds"] += round_steps.get(r, 0)
                else:
                    useful += round_steps.get(r, 0)
                    round_work += round_steps.get(r, 0)
                round_steps.pop(r, None)
            end_incarnation(r, end + C)
            relaunch.append((end + C + e["delay_s"], r))
            if bsp:
                ledger.durable()  # its FINISH: every shard writes (its own on the way out too)
            if r in hosts and step < S:  # its shard, TERMed with it, is away until the host is back
                waits.append(end + C + e["delay_s"] + up)
                outage_s.append(waits[-1] - e["abs"])
                if not local or step % H == 0:
                    t = max(t, waits[-1])
            if config in ELASTIC_RING:
                t += c["stall_term"]  # the re-formation (BSP's servers count a FINISHed node out at once)
        if local and step % H == 0:
            for r in members:
                useful += round_steps.get(r, 0)
                round_work += round_steps.get(r, 0)
                round_steps[r] = 0
            if bsp and round_work > 0:
                ledger.update(round_work, len(members))
    lost["shard_rollback"] = ledger.lost
    t_end = t + c["tail"]
    for r in list(launch):
        lifetimes.append(t_end - launch[r])
    return {"useful_node_steps": useful, "present_node_s": sum(lifetimes), "time_to_end_s": t_end, "lost_node_steps": lost,
            "shard_outages_s": outage_s}


def _simulate_async(config, events, p, c):
    """ASP and asynchronous local SGD: every node steps on its own clock. Where a node starts is the servers'
    join_clock (server/parameter_shard.h), taken when it is ready: a node still a live member (back from a
    crash within ps.worker_timeout_s) goes on from its own next clock; a new node, one preempted (it
    FINISHed), or one back after the timeout, from the slowest live node's clock, never below its own (local
    SGD: from the start of that round). A node that has taken its steps leaves; node 0 waits for the last
    one (the job's final evaluation)."""
    cfg = CONFIGS[config]
    n0, S, T = p["nodes"], p["steps"], p["step_time"]
    K, C = p["checkpoint_every"], p["checkpoint_s"]
    H = p.get("sync_every", 10) if cfg.get("local_sgd") else 1
    W = p.get("worker_timeout_s", 30.0)
    P = c.get("period") or T
    lost = {"in_flight": 0.0, "partial_rounds": 0.0, "recomputed": 0.0, "backup_dropped": 0.0, "shard_rollback": 0.0}
    # node -> {launch, at (when its next step starts), count (steps done), up (running), ready (None: stepping)}
    nodes = {r: {"launch": 0.0, "at": c["U0"], "count": 0, "up": True, "ready": None} for r in range(n0)}
    lifetimes, relaunch, finish = [], [], {}
    useful = 0.0
    hosts = set(p.get("shard_hosts") or ())
    ledger = ShardLedger(hosts, p.get("shard_checkpoint_every", 0), 257 if H == 1 else 5)  # a push: an update
    outages = []  # (from, to): a shard is down with its host; a push due inside waits until `to`
    outage_s = []  # each outage's length

    def pushed(step_end):
        """When a push due at step_end is answered: after every shard outage it falls in."""
        moved = True
        while moved:
            moved = False
            for a, b in outages:
                if a <= step_end < b:
                    step_end, moved = b, True
        return step_end

    def shard_down(r, when, back, killed):
        """Host r's shard is down from `when` until `back` + shard_up; a killed one reloads its last checkpoint."""
        nonlocal useful
        if r in hosts:
            outages.append((when, back + c.get("shard_up", 0.0)))
            outage_s.append(outages[-1][1] - when)
            if killed:
                useful -= ledger.killed(r)

    def advance(r, until):
        """Node r takes the steps that end by `until` (with its checkpoint holds)."""
        nonlocal useful
        n = nodes[r]
        while n["up"] and n["ready"] is None and n["count"] < S:
            hold = C if K > 0 and n["count"] > 0 and n["count"] % K == 0 and n.get("held") != n["count"] else 0.0
            step_end = n["at"] + hold + P
            if (n["count"] + 1) % H == 0:  # this step pushes (local SGD: its round's last)
                step_end = pushed(step_end)
            if step_end > until:
                return
            n["held"] = n["count"] if hold else n.get("held")
            n["count"] += 1
            n["at"] = step_end
            if n["count"] % H == 0:
                useful += H  # a step counts when its round is pushed (ASP: H = 1, every step)
                ledger.update(H, 1)
            if n["count"] == S:
                finish[r] = step_end
                ledger.durable()  # its FINISH: every shard writes

    def slowest():
        live = [n["count"] for n in nodes.values() if n["up"] and n["ready"] is None and n["count"] < S]
        return min(live) if live else S

    def settle(until):
        """Every node steps up to `until`; the nodes that become ready before it take their clock then."""
        while True:
            starting = sorted((n["ready"], r) for r, n in nodes.items() if n["up"] and n["ready"] is not None
                              and n["ready"] <= until)
            if not starting:
                break
            when, r = starting[0]
            for q in nodes:
                advance(q, when)
            n = nodes[r]
            member = n.get("died") is not None and when - n["died"] < W
            if not member:
                n["count"] = max(n["count"], (slowest() // H) * H)
            n.update(ready=None, at=when, died=None)
            ledger.durable()  # its admission (INIT join) forces every shard's checkpoint
            if n["count"] >= S:  # the job is at its end: it finds nothing to do and leaves
                finish[r] = when
        for q in nodes:
            advance(q, until)

    def start(r, when, startup, count, died=None):
        old = nodes.get(r, {})
        nodes[r] = {"launch": when, "at": when + startup, "count": count, "up": True, "ready": when + startup,
                    "died": died, "held": old.get("held")}

    for e in _schedule(events, c["U0"] + T):
        te = e["abs"]
        for when, r in sorted(x for x in relaunch if x[0] <= te):
            relaunch.remove((when, r))
            settle(when)
            start(r, when, c["U_back"], nodes[r]["count"], nodes[r].get("died"))
        settle(te)
        if all(not n["up"] or (n["ready"] is None and n["count"] >= S) for n in nodes.values()) and not relaunch:
            break  # the job is over: later events do not happen
        r = e["node"]
        if e["kind"] == "join":
            start(r, te, c["U_join"], 0)
            continue
        n = nodes.get(r)
        if n is None or not n["up"] or n["count"] >= S:
            continue
        if n["ready"] is not None:  # starting up: it ends (kill) or leaves before stepping
            n["up"] = False
            lifetimes.append(te - n["launch"])
            relaunch.append((te + e["delay_s"], r))
            shard_down(r, te, te + e["delay_s"], e["kind"] == "kill9")
            continue
        if e["kind"] == "kill9":
            lost["in_flight"] += 1
            partial = n["count"] % H
            lost["partial_rounds"] += partial
            n["count"] -= partial  # a partial local SGD round is never pushed: it is redone
            n["up"], n["died"] = False, te
            lifetimes.append(te - n["launch"])
            relaunch.append((te + e["delay_s"], r))
            shard_down(r, te, te + e["delay_s"], True)
        else:  # SIGTERM: it finishes the step it is in, writes its checkpoint and leaves (FINISH)
            gone = n["at"] + P if n["at"] <= te else te
            if n["at"] <= te:
                n["count"] += 1
                if n["count"] % H == 0:
                    useful += H
                    ledger.update(H, 1)
                if n["count"] >= S:  # that was its last step: it has finished, and leaves as it would have
                    finish[r] = gone
                    continue
            partial = n["count"] % H
            lost["partial_rounds"] += partial
            n["count"] -= partial
            n["up"], n["died"] = False, None
            lifetimes.append(gone + C - n["launch"])
            relaunch.append((gone + C + e["delay_s"], r))
            shard_down(r, te, gone + C + e["delay_s"], False)  # launch_node.sh TERMs its shards with the worker
            ledger.durable()  # its FINISH: every shard writes
    for when, r in sorted(relaunch):  # the nodes still away come back and take their steps
        settle(when)
        start(r, when, c["U_back"], nodes[r]["count"], nodes[r].get("died"))
    settle(float("inf"))
    lost["shard_rollback"] = ledger.lost
    t_last = max(finish.values())
    for r, n in nodes.items():
        if n["up"]:
            lifetimes.append((t_last if r == 0 else finish[r]) + c["tail"] - n["launch"])
    return {"useful_node_steps": useful, "present_node_s": sum(lifetimes), "time_to_end_s": t_last + c["tail"],
            "lost_node_steps": lost, "shard_outages_s": outage_s}


# ---------------------------------------------------------------------------------------------
# Measuring the costs on churn.py's records

def _steps(run_dir, node):
    path = os.path.join(run_dir, f"node{node}", "metrics.jsonl")
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    m = json.loads(line)
                except ValueError:
                    continue
                if "loss" in m and "step" in m and "unix_s" in m:
                    out.append(m)
    return out


def _gap_after(times, t0, t1):
    """The longest gap between consecutive job-step completions that ends in [t0, t1] (0 if none)."""
    best = 0.0
    for a, b in zip(times, times[1:]):
        if t0 <= b <= t1:
            best = max(best, b - a)
    return best


def measure_run(rec, st):
    """One run's mechanism costs (lists of observations) from churn.py's record and its files."""
    T = st["step_time"]
    n0 = st["nodes"]
    obs = {k: [] for k in COST_KEYS}
    steps = {}
    for inc in rec["incarnations"]:
        steps.setdefault(inc["node"], _steps(rec["dir"], inc["node"]))
    completion = {}
    for ms in steps.values():
        for m in ms:
            completion[m["step"]] = max(completion.get(m["step"], 0.0), m["unix_s"])
    times = sorted(completion.values())
    for inc in rec["incarnations"]:
        lo, hi = inc["start_unix"], inc["end_unix"] or float("inf")
        mine = [m["unix_s"] for m in steps.get(inc["node"], []) if lo <= m["unix_s"] <= hi + 0.5]
        if not mine:
            continue
        mine.sort()
        obs["period"] += [b - a for a, b in zip(mine, mine[1:]) if b - a < 2 * T]
        if rec["config"] != "ring_restart" or (inc["inc"] == 0):
            u = min(mine) - T - lo
            key = "U0" if inc["inc"] == 0 and inc["node"] < n0 else ("U_join" if inc["inc"] == 0 else "U_back")
            obs[key].append(u)
        if inc["ended_by"] == "exit" and inc["end_unix"]:
            obs["tail"].append(inc["end_unix"] - max(mine))
    if CONFIGS[rec["config"]].get("backup_workers") and rec["metrics"].get("steps_logged"):
        obs["late_share"].append(rec["metrics"]["lost_steps"]["dropped"]
                                 / (CONFIGS[rec["config"]]["backup_workers"] * st["steps"]))
    applied = [e for e in rec["events"] if e.get("applied") and e.get("t_applied_unix") is not None]

    def survivors_gap(target, lo, hi):
        """The median over the nodes alive through [lo, hi] (not the target) of each one's longest gap between
        two of its own steps that ends in the window, less a step: what the event cost the others."""
        gaps = []
        for inc in rec["incarnations"]:
            if inc["node"] == target or inc["start_unix"] > lo or (inc["end_unix"] or float("inf")) < hi:
                continue
            mine = sorted(m["unix_s"] for m in steps.get(inc["node"], []) if inc["start_unix"] <= m["unix_s"])
            gaps.append(max(0.0, _gap_after(mine, lo, hi) - T))
        return statistics.median(gaps) if gaps else None

    def alone(e, lo, hi):  # no other event in the window
        return not any(o is not e and lo - 1.0 <= o["t_applied_unix"] <= hi for o in applied)

    for e in applied:
        ta = e["t_applied_unix"]
        if rec["config"] == "ring_restart":
            if e["kind"] in ("kill9", "sigterm"):
                back = e.get("back_unix") or ta
                after = [x for x in times if x > max(ta, back)]
                if after:
                    obs["R"].append(after[0] - T - max(ta, back))
            continue
        span = {"kill9": 2.0, "sigterm": 2.0}.get(e["kind"])
        if span and alone(e, ta, ta + span):
            g = survivors_gap(e["node"], ta, ta + span)
            if g is not None:
                obs["stall_kill" if e["kind"] == "kill9" else "stall_term"].append(g)
        if e["kind"] == "join" or e.get("back_unix"):
            t_join = e.get("back_unix") or ta
            first = [m["unix_s"] for m in steps.get(e["node"], []) if m["unix_s"] > t_join]
            if first and alone(e, first[0] - 0.5, first[0] + 0.5):
                g = survivors_gap(e["node"], first[0] - 0.5, first[0] + 0.5)
                if g is not None:
                    obs["stall_join"].append(g)
    return obs


def load_runs(dirs, seeds=None, churn_only=False):
    out = []
    for d in dirs:
        with open(os.path.join(d, "churn.json")) as f:
            s = json.load(f)
        for rec in s["runs"]:
            if rec.get("status") != "complete":
                continue
            if seeds is not None and rec["seed"] not in seeds:
                continue
            if churn_only and not rec["churn"]:
                continue
            out.append((rec, s["settings"]))
    return out


def measure(runs):
    """Per configuration: the median of each cost over the runs (0 where never observed), and the counts."""
    acc = {}
    for rec, st in runs:
        obs = measure_run(rec, st)
        a = acc.setdefault(rec["config"], {k: [] for k in COST_KEYS})
        for k, v in obs.items():
            a[k] += v
    costs = {}
    for cfg, a in acc.items():
        costs[cfg] = {k: ((statistics.mean if k == "period" else statistics.median)(v) if v else 0.0)
                      for k, v in a.items()}
        costs[cfg]["observations"] = {k: len(v) for k, v in a.items()}
    return costs


def params_of(st):
    return {"nodes": st["nodes"], "steps": st["steps"], "step_time": st["step_time"],
            "checkpoint_every": st["checkpoint_every"], "checkpoint_s": st["checkpoint_s"],
            "sync_every": st.get("sync_every", 10), "worker_timeout_s": st.get("worker_timeout_s", 30.0)}


# ---------------------------------------------------------------------------------------------
# Subcommands

def cmd_measure(a):
    seeds = parse_seeds(a.seeds)
    costs = measure(load_runs(a.dirs, seeds))
    text = json.dumps(costs, indent=1, sort_keys=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


def parse_seeds(spec):
    if not spec:
        return None
    lo, _, hi = spec.partition("-")
    return set(range(int(lo), int(hi or lo) + 1))


def validate(dirs, predict=None):
    """Costs measured on dirs' runs predict predict's runs; without predict, two folds by seed parity (costs
    from one fold predict the other's runs). Returns rows and a summary per configuration."""
    runs = load_runs(dirs)
    folds = [(runs, load_runs(predict))] if predict else [
        ([(r, s) for r, s in runs if r["seed"] % 2 == f], [(r, s) for r, s in runs if r["seed"] % 2 != f]) for f in (0, 1)]
    rows = []
    for train, test in folds:
        costs = measure(train)
        for rec, st in test:
            if rec["config"] not in costs:
                continue
            pred = simulate(rec["config"], rec["events"] if rec["churn"] else [], params_of(st), costs[rec["config"]])
            meas = rec["metrics"]["goodput"]
            rows.append({"config": rec["config"], "seed": rec["seed"], "churn": rec["churn"],
                         "events": [e["kind"] for e in rec["events"]], "measured": meas,
                         "predicted": pred["goodput"], "error": pred["goodput"] - meas})
    summary = {}
    for cfg in sorted({r["config"] for r in rows}):
        errs = [r["error"] for r in rows if r["config"] == cfg]
        churn = [r for r in rows if r["config"] == cfg and r["churn"]]
        calm = [r for r in rows if r["config"] == cfg and not r["churn"]]
        summary[cfg] = {"runs": len(errs), "mean_error": statistics.mean(errs),
                        "mean_abs_error": statistics.mean(abs(x) for x in errs),
                        "max_abs_error": max(abs(x) for x in errs),
                        "churn_runs": len(churn),
                        "churn_mean_abs_error": statistics.mean(abs(r["error"]) for r in churn) if churn else None,
                        "churn_mean_error": statistics.mean(r["error"] for r in churn) if churn else None}
        if churn and calm:  # what the events cost: the runs without events' mean less the churn runs' mean
            summary[cfg]["event_cost_measured"] = (statistics.mean(r["measured"] for r in calm)
                                                   - statistics.mean(r["measured"] for r in churn))
            summary[cfg]["event_cost_predicted"] = (statistics.mean(r["predicted"] for r in calm)
                                                    - statistics.mean(r["predicted"] for r in churn))
    return rows, summary


def cmd_validate(a):
    rows, summary = validate(a.dirs, a.predict)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "validation.json"), "w") as f:
        json.dump({"format": "syncopate-churn-model-validation/1", "dirs": a.dirs, "rows": rows, "summary": summary,
                   "command": " ".join(sys.argv)}, f, indent=1)
    L = ["# The churn goodput model against the emulated cluster", "",
         f"Command: `experiments/churn_model.py {' '.join(sys.argv[1:])}`", "",
         ("Costs measured on the runs of " + ", ".join(f"`{d}`" for d in a.dirs) + " predict the runs of "
          + ", ".join(f"`{d}`" for d in a.predict) + ".") if a.predict else
         ("Two folds by seed parity over the runs of " + ", ".join(f"`{d}`" for d in a.dirs)
          + ": the costs measured on the even seeds predict the odd seeds' runs, and the reverse."),
         "", "Error = predicted - measured goodput, per run (churn.py's own goodput from its records).", "",
         "| configuration | runs | mean error | mean absolute error | largest | churn runs | their mean error | "
         "their mean absolute error | event cost measured | event cost predicted |", "|---|---|---|---|---|---|---|---|---|---|"]
    def f(x, sign=False):
        return "-" if x is None else (f"{x:+.3f}" if sign else f"{x:.3f}")
    for cfg, v in summary.items():
        L.append(f"| {cfg} | {v['runs']} | {f(v['mean_error'], True)} | {f(v['mean_abs_error'])} | {f(v['max_abs_error'])} | "
                 f"{v['churn_runs']} | {f(v['churn_mean_error'], True)} | {f(v['churn_mean_abs_error'])} | "
                 f"{f(v.get('event_cost_measured'))} | {f(v.get('event_cost_predicted'))} |")
    L += ["", "Event cost = the mean goodput of the runs without events less that of the churn runs (they are not "
          "paired seed by seed here: the seeds' schedules differ)."]
    L += ["", "| configuration | seed | events | measured | predicted | error |", "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["config"], r["seed"], not r["churn"])):
        L.append(f"| {r['config']} | {r['seed']} | {', '.join(r['events']) or 'none'} | {r['measured']:.3f} | "
                 f"{r['predicted']:.3f} | {r['error']:+.3f} |")
    with open(os.path.join(a.out, "validation.md"), "w") as f:
        f.write("\n".join(L) + "\n")
    for cfg, v in summary.items():
        ch = (f"  churn runs {v['churn_runs']}: error mean {v['churn_mean_error']:+.3f} |error| {v['churn_mean_abs_error']:.3f}"
              if v["churn_runs"] else "")
        ec = (f"  event cost {v['event_cost_measured']:.3f} measured, {v['event_cost_predicted']:.3f} predicted"
              if "event_cost_measured" in v else "")
        print(f"{cfg:20s} runs {v['runs']:3d}  error mean {v['mean_error']:+.3f}  |error| mean "
              f"{v['mean_abs_error']:.3f}  max {v['max_abs_error']:.3f}{ch}{ec}")


# ---------------------------------------------------------------------------------------------
# The scenario at scale

SCENARIO_CONFIGS = ("ring_restart", "ring_elastic", "ring_diloco_elastic", "ps_bsp", "ps_bsp_backup", "ps_diloco_elastic",
                    "ps_asp", "ps_async_local_sgd")
TARGETS = {"ps_asp": 0.90, "ps_async_local_sgd": 0.90, "ring_elastic": 0.80}


def scenario_costs(a, config):
    """The stated costs at scale (seconds), per configuration; every one is an argument of `scenario`."""
    transfer_state = a.state_gb * 8 / a.link_gbit      # a member's weights and AdamW moments over one link
    transfer_params = a.state_gb / 3 * 8 / a.link_gbit  # the servers' parameters (a third of that state)
    ring = config.startswith("ring")
    c = {"U0": a.startup_s + (transfer_params if not ring else 0.0), "tail": a.tail_s, "stall_term": a.reform_s if ring else 0.0,
         "stall_join": transfer_state if ring else 0.0, "period": a.step_s, "R": a.startup_s + a.restore_s,
         "shard_up": 0.0 if ring else a.shard_up_s}
    c["U_back"] = c["U_join"] = a.startup_s + (transfer_state if ring else transfer_params)
    if not ring:  # server.checkpoint_background: a join and a FINISH wait for the shards' writes that hold them
        joins = getattr(a, "ps_join_writes", 0.0)
        start = getattr(a, "ps_start_writes", None)
        c["U0"] += (joins if start is None else start) * a.checkpoint_s
        for k in ("U_back", "U_join"):
            c[k] += joins * a.checkpoint_s
        c["tail"] += getattr(a, "ps_exit_writes", 0.0) * a.checkpoint_s
    if config == "ring_restart":
        c["U0"] = a.startup_s
    if config in ELASTIC_RING:
        c["stall_kill"] = a.detect_s + a.reform_s  # + the abandoned step (redone), which the timeline adds
    elif config in ("ps_bsp", "ps_diloco_elastic", "ps_bsp_backup"):
        c["stall_kill"] = a.worker_timeout_s   # BSP rounds wait for the servers to count the dead node out
    else:
        c["stall_kill"] = 0.0
    return c


def checkpoint_every(a, config, policy):
    """Steps between checkpoints. 'own': the restarting ring at Young/Daly's optimum for its failures
    (sqrt(2 x C x MTBF), MTBF = the mean time between kills and preemptions), every elastic mode only for a
    whole-job disaster (--disaster-min); 'same': every configuration at the restarting ring's interval."""
    if a.events_per_min <= 0:  # no failures: checkpoints only for a disaster
        return max(1, round(a.disaster_min * 60 / a.step_s))
    mtbf = 60.0 / a.events_per_min / (2.0 / 3.0)  # two kinds of three break the fixed ring
    young = max(1, round(math.sqrt(2 * a.checkpoint_s * mtbf) / a.step_s))
    if policy == "same" or config == "ring_restart":
        return young
    return max(1, round(a.disaster_min * 60 / a.step_s))


def shard_hosts(a):
    """The nodes whose shards die with them: one shard per node of the job's start (launch_node.sh's
    SYNCOPATE_SERVERS=per-node), unless the servers have machines of their own or a reading lets them
    survive their nodes' events (--shards-survive: as on the emulated cluster, whose shards are processes no
    event touches)."""
    if a.server_machines > 0 or getattr(a, "shards_survive", False):
        return []
    return list(range(a.nodes))


def run_scenario(a):
    """Every configuration on the same seeded schedules. Events are drawn over twice the job's length (a
    configuration that takes longer meets the events of its own extra time; those past its end do not
    happen)."""
    steps = round(a.hours * 3600 / a.step_s)
    delay = tuple(float(x) for x in a.delay.split(","))
    rows = []
    for seed in range(a.first_seed, a.first_seed + a.seeds):
        rate = 0.0 if getattr(a, "no_events", False) else a.events_per_min
        ev = draw_schedule(seed, rate, steps, a.step_s, a.nodes, max_events=10 ** 6, start_s=a.start_s,
                           horizon_frac=2.0, delay=delay, recover_s=a.recover_s)
        for cfg in a.configs:
            ps = CONFIGS[cfg]["kind"] == "ps"
            p = {"nodes": a.nodes, "steps": steps, "step_time": a.step_s, "checkpoint_every": checkpoint_every(a, cfg, a.policy),
                 "checkpoint_s": a.checkpoint_s, "sync_every": a.sync_every, "worker_timeout_s": a.worker_timeout_s,
                 "server_machines": a.server_machines if ps else 0,
                 "shard_hosts": shard_hosts(a) if ps else [],
                 "shard_checkpoint_every": a.shard_checkpoint_every}
            r = simulate(cfg, ev, p, scenario_costs(a, cfg))
            writes = (steps // p["checkpoint_every"]) if p["checkpoint_every"] else 0
            t0 = scenario_costs(a, cfg)["U0"] + a.step_s  # events count from the first step's end
            happened = [e for e in ev if t0 + e["t_s"] <= r["time_to_end_s"]]
            rows.append({"config": cfg, "seed": seed, "events": len(happened),
                         "kinds": {k: sum(1 for e in happened if e["kind"] == k) for k in ("kill9", "sigterm", "join")},
                         "checkpoint_every": p["checkpoint_every"],
                         "checkpoint_share": writes * a.checkpoint_s / r["time_to_end_s"],
                         # a worker waits for a shard at most dist.timeout_s, then fails (the model lets it wait)
                         "outages_past_timeout": sum(1 for x in r.get("shard_outages_s", []) if x > a.dist_timeout_s),
                         "shard_outages": len(r.get("shard_outages_s", [])),
                         "rollback_share": r["lost_node_steps"].get("shard_rollback", 0.0) / (a.nodes * steps),
                         **{k: v for k, v in r.items() if k != "shard_outages_s"}})  # (the counts, not every length)
    return rows


def summarize(rows, configs):
    out = {}
    for cfg in configs:
        g = [r["goodput"] for r in rows if r["config"] == cfg]
        out[cfg] = {"seeds": len(g), "mean": statistics.mean(g), "min": min(g), "max": max(g),
                    "checkpoint_share": statistics.mean(r["checkpoint_share"] for r in rows if r["config"] == cfg),
                    "events": statistics.mean(r["events"] for r in rows if r["config"] == cfg),
                    "shard_outages": statistics.mean(r["shard_outages"] for r in rows if r["config"] == cfg),
                    "outages_past_timeout": sum(r["outages_past_timeout"] for r in rows if r["config"] == cfg),
                    "rollback_share": statistics.mean(r["rollback_share"] for r in rows if r["config"] == cfg),
                    "target": TARGETS.get(cfg), "met_in": sum(1 for x in g if cfg in TARGETS and x >= TARGETS[cfg])}
    return out


# The readings beside the base one: one assumption changed at a time (an argument and its value).
VARIANTS = [
    ("base", {}),
    ("no events (the same checkpoints)", {"no_events": True}),
    ("same checkpoints", {"policy": "same"}),
    ("disaster every 10 min", {"disaster_min": 10.0}),
    ("back after 60-300 s", {"delay": "60,300"}),
    ("start-up 60 s", {"startup_s": 60.0}),
    ("start-up 5 s, restore 5 s", {"startup_s": 5.0, "restore_s": 5.0}),
    ("checkpoint 5 s", {"checkpoint_s": 5.0}),
    ("a lost machine (detect 60 s)", {"detect_s": 60.0}),
    ("2 server machines", {"server_machines": 2}),
    ("shards survive their nodes' events", {"shards_survive": True}),
    ("shard up 30 s after its host", {"shard_up_s": 30.0}),
    ("shard rollback not modelled (the earlier reading)", {"shard_checkpoint_every": 0}),
    ("shard checkpoint every 50 updates (its writes not costed)", {"shard_checkpoint_every": 50}),
]


def cmd_scenario(a):
    studies = []
    for name, change in VARIANTS:
        v = argparse.Namespace(**{**vars(a), **change})
        rows = run_scenario(v)
        studies.append({"reading": name, "changed": change, "rows": rows, "summary": summarize(rows, a.configs),
                        "checkpoint_every": {c: checkpoint_every(v, c, v.policy) for c in a.configs}})
    os.makedirs(a.out, exist_ok=True)
    doc = {"format": "syncopate-churn-model-scenario/1", "command": " ".join(["experiments/churn_model.py"] + sys.argv[1:]),
           "assumptions": {k: v for k, v in vars(a).items() if k not in ("func", "cmd", "out")},
           "costs": {c: scenario_costs(a, c) for c in a.configs}, "studies": studies}
    with open(os.path.join(a.out, "scenario.json"), "w") as f:
        json.dump(doc, f, indent=1)
    base = studies[0]
    steps = round(a.hours * 3600 / a.step_s)
    L = ["# Goodput under churn at the issue's scenario (the timeline model)", "",
         f"Command: `{doc['command']}`", "",
         f"Scenario: {a.nodes} nodes at the start, a {a.hours:g} h job ({steps} steps of {a.step_s:g} s), membership "
         f"events at {a.events_per_min:g} per minute (Poisson from {a.start_s:g} s over twice the job's length; "
         "experiments/churn.py's draw_schedule: kill -9, SIGTERM and join in turn, a crashed or preempted node back "
         f"after {a.delay.replace(',', '-')} s, a joiner stays), checkpoints of {a.checkpoint_s:g} s held by every node "
         f"(the restarting ring at Young/Daly's interval for its failures, every elastic mode every {a.disaster_min:g} "
         f"min for a whole-job disaster), {a.seeds} seeds ({a.first_seed}-{a.first_seed + a.seeds - 1}), the same "
         "schedules for every configuration. Parameter servers run on the nodes (no machine of their own), one shard "
         "per node of the job's start, which goes down with its node (kill -9 or SIGTERM) and serves again "
         f"{a.shard_up_s:g} s after the node is back: every push in between waits, unless a reading says otherwise. A "
         "kill -9 stands for the node's processes lost together (its worker and its shards), the node back at the same "
         "address with its disk; a SIGTERM TERMs them together (launch_node.sh's stop_all). A killed shard reloads its "
         f"last checkpoint (server.checkpoint_every = {a.shard_checkpoint_every} updates, and every shard writes one at "
         "each membership change of the elastic job: an admission, a FINISH or SIGTERM, a BSP round released by the "
         "timeout; shard 0 also when its reserve of data grants runs out): the work of the updates it applied since is "
         "lost, its share of the parameters (1 / the shards) of their node-steps, and counts against goodput (the "
         "rollback column). That share is an assumption (a slice's lost progress, not measured on the loss); the "
         "writes are not costed. Not "
         "modelled: a waiting worker's dist.timeout_s, past which it fails instead of waiting (counted below).", "",
         "Stated costs at scale (seconds; arguments of `scenario`, none measured at this scale):", "",
         "| configuration | U0 | U_back = U_join | stall at a kill | stall at a SIGTERM | pause at an admission | R (restart) | tail |",
         "|---|---|---|---|---|---|---|---|"]
    for c, v in doc["costs"].items():
        def cell(key, used=True):
            return f"{v[key]:.1f}" if used else "-"
        restart = c == "ring_restart"
        L.append(f"| {c} | {cell('U0')} | {cell('U_back', not restart)} | {cell('stall_kill', not restart)} | "
                 f"{cell('stall_term', not restart)} | {cell('stall_join', not restart)} | {cell('R', restart)} | "
                 f"{cell('tail')} |")
    L += ["", "Goodput = useful node-steps x step time / the sum of every process's lifetime (experiments/churn.py's "
          "definition: a node that is down is not present, so its absence costs the elastic modes nothing, and the "
          "restarting ring its survivors' waiting; server machines, where a reading has them, are present for the "
          "whole run).", "",
          "## The base reading", "",
          "| configuration | checkpoint every, steps | checkpoint share of the time | events met | shard outages per run | "
          f"outages past dist.timeout_s = {a.dist_timeout_s:g} s, all seeds | shard rollback, share of the job's node-steps | "
          "goodput mean | min | max | target | seeds at or above it |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for cfg, v in base["summary"].items():
        tgt = f"{v['target']:.2f} | {v['met_in']}/{v['seeds']}" if v["target"] else "- | -"
        L.append(f"| {cfg} | {base['checkpoint_every'][cfg]} | {v['checkpoint_share']:.1%} | {v['events']:.1f} | "
                 f"{v['shard_outages']:.1f} | {v['outages_past_timeout']} | {v['rollback_share']:.2%} | {v['mean']:.3f} | "
                 f"{v['min']:.3f} | {v['max']:.3f} | {tgt} |")
    L += ["", "## One assumption at a time (mean goodput over the seeds; min in brackets where a target applies)", "",
          "| reading | changed | " + " | ".join(a.configs) + " | shard outages past dist.timeout_s, all seeds and ps modes |",
          "|---|---|" + "---|" * len(a.configs) + "---|"]
    for st in studies:
        cells = []
        for cfg in a.configs:
            v = st["summary"][cfg]
            mark = ""
            if v["target"]:
                mark = f" ({v['min']:.3f}){'' if v['met_in'] == v['seeds'] else ' below ' + format(v['target'], '.2f')}"
            cells.append(f"{v['mean']:.3f}{mark}")
        ch = ", ".join(f"{k}={val}" for k, val in st["changed"].items()) or "-"
        past = sum(v["outages_past_timeout"] for v in st["summary"].values())
        L.append(f"| {st['reading']} | {ch} | " + " | ".join(cells) + f" | {past} |")
    with open(os.path.join(a.out, "scenario.md"), "w") as f:
        f.write("\n".join(L) + "\n")
    for st in studies:
        print(st["reading"] + ": " + ", ".join(f"{c} {v['mean']:.3f}" for c, v in st["summary"].items()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="each configuration's mechanism costs from churn.py runs")
    m.add_argument("dirs", nargs="+")
    m.add_argument("--seeds", help="A-B: only these seeds")
    m.add_argument("--out")
    v = sub.add_parser("validate", help="predict half the runs from the other half's costs")
    v.add_argument("dirs", nargs="+")
    v.add_argument("--out", required=True)
    v.add_argument("--predict", nargs="+", help="runs to predict with the costs of all of dirs' runs "
                   "(default: each half of dirs' seeds from the other half's costs)")
    sc = sub.add_parser("scenario", help="the issue's scenario at scale, with stated costs")
    sc.add_argument("--out", required=True)
    sc.add_argument("--configs", type=lambda x: x.split(","), default=list(SCENARIO_CONFIGS))
    sc.add_argument("--nodes", type=int, default=8, help="the job's nodes at its start")
    sc.add_argument("--hours", type=float, default=4.0, help="the job's length without churn, hours")
    sc.add_argument("--step-s", type=float, default=1.0, help="a step's time, s (compute and exchange)")
    sc.add_argument("--events-per-min", type=float, default=0.1, help="membership events per minute (0.1: one per 10 min)")
    sc.add_argument("--start-s", type=float, default=60.0, help="the first event no earlier than this, s")
    sc.add_argument("--delay", default="10,30", help="a crashed or preempted node is back after this, s (uniform)")
    sc.add_argument("--policy", choices=("own", "same"), default="own", help="checkpoints: each mode's own "
                    "interval, or every mode at the restarting ring's (see checkpoint_every)")
    sc.add_argument("--server-machines", type=int, default=0, help="ps configurations: machines of their own that the "
                    "servers run on, present for the whole run (0: on the nodes, one shard per node of the job's start, "
                    "down with its node until it is back)")
    sc.add_argument("--shards-survive", action="store_true", help="shards on the nodes that no event takes down (the "
                    "emulated cluster's setting)")
    sc.add_argument("--dist-timeout-s", type=float, default=60.0, help="the workers' dist.timeout_s: a shard outage longer "
                    "than this fails the waiting workers on a real job (the model lets them wait; the report counts them)")
    sc.add_argument("--shard-checkpoint-every", type=int, default=500, help="server.checkpoint_every: updates between "
                    "a shard's checkpoints; a killed shard on a node loses the work of the updates since (0: not modelled)")
    sc.add_argument("--ps-join-writes", type=float, default=0.0, help="ps configurations: a node's start (its join) waits "
                    "for this many shard checkpoint writes of --checkpoint-s (server.checkpoint_background makes a join "
                    "durable before its reply; measured on the emulated cluster: docs/PERFORMANCE.md)")
    sc.add_argument("--ps-start-writes", type=float, default=None, help="ps configurations: the job's first nodes' "
                    "start waits for this many shard writes (default: --ps-join-writes; with the membership journal only "
                    "the write of the shards' creation, once per job)")
    sc.add_argument("--ps-exit-writes", type=float, default=0.0, help="ps configurations: a node's exit (its FINISH to "
                    "every shard) waits for this many shard checkpoint writes of --checkpoint-s")
    sc.add_argument("--shard-up-s", type=float, default=5.0, help="a shard from its host's relaunch to serving again "
                    "(process start and its checkpoint read back), s")
    sc.add_argument("--recover-s", type=float, default=60.0, help="a node is not targeted again for this long after it is back")
    sc.add_argument("--checkpoint-s", type=float, default=30.0, help="a checkpoint's write, s (every node holds it)")
    sc.add_argument("--restore-s", type=float, default=30.0, help="reading a checkpoint back, s (the restarting ring)")
    sc.add_argument("--disaster-min", type=float, default=30.0, help="elastic modes' checkpoint interval, min")
    sc.add_argument("--startup-s", type=float, default=20.0, help="a process from launch to ready, before its state, s")
    sc.add_argument("--tail-s", type=float, default=5.0, help="last step to exit, s")
    sc.add_argument("--state-gb", type=float, default=1.5, help="a node's weights and AdamW moments, GB (GPT-2 124M fp32)")
    sc.add_argument("--link-gbit", type=float, default=10.0, help="a node's link, Gbit/s")
    sc.add_argument("--detect-s", type=float, default=0.0, help="the elastic ring finds a crashed process, s (kill -9: "
                    "its sockets are reset at once; a lost machine takes dist.timeout_s)")
    sc.add_argument("--reform-s", type=float, default=1.0, help="the elastic ring re-forms, s")
    sc.add_argument("--worker-timeout-s", type=float, default=30.0, help="ps.worker_timeout_s: BSP's wait for a dead node")
    sc.add_argument("--sync-every", type=int, default=50, help="local SGD's H, steps")
    sc.add_argument("--seeds", type=int, default=40)
    sc.add_argument("--first-seed", type=int, default=0)
    a = ap.parse_args(argv)
    {"measure": cmd_measure, "validate": cmd_validate, "scenario": cmd_scenario}[a.cmd](a)


if __name__ == "__main__":
    main()
