"""Churn: what nodes that come and go cost a training job, per synchronization, on this machine
(processes on loopback, compute modelled by emulate.step_time_s).

    experiments/churn.py run --out DIR [--seeds 3] [--events-per-min R] [--steps S] [--nodes N] [--configs ...]
                             [--equal-samples] [--eval-every K --target-loss L]
                             [--backend sim --sim-start-s S --sim-restart-s R --sim-exit-s E --sim-jitter J]
    experiments/churn.py report DIR          (rewrites DIR/churn.md and the plot from DIR/churn.json)

For every configuration and seed it starts the servers (ps configurations) and N nodes, injects the
membership events of the seed's schedule, and measures; then runs the same configuration and seed
without events (the reference of the final-loss gap), and with --equal-samples once more without
events for the step budget at which it applies about the churn run's samples (steps x the churn
run's useful samples / the reference's; its schedule ends there): the gap at equal applied samples.
Every process is in a process group of its
own and every group is ended when a run ends, fails, or on Ctrl-C / SIGTERM.

Events (the schedule, drawn from the seed alone, identical for every configuration of a seed, so
that configurations are paired): arrivals of a Poisson process of R events per minute of wall time
from --events-start-s to --horizon-frac x the run's modelled length (steps x step time), at most
--max-events; times count from the moment every first node has logged its first step. Each one is
  kill9    a node crashes (SIGKILL to its process group); it is started again (--resume when it has
           a checkpoint) after a seeded delay;
  sigterm  a preemption notice (SIGTERM): the node finishes its step, checkpoints and leaves; it is
           started again with --resume after a seeded delay (from its exit);
  join     a new node (the next new rank, NNODES = rank + 1) joins the running job and stays.
A kill9 or sigterm targets one of the first N nodes that is up at that time by the schedule's own
plan (its earlier events' delays plus --recover-s); where none is, the event is a join.

Configurations: ps_bsp_backup (BSP, ps.backup_workers=1), ps_asp (ASP), ps_bsp (BSP), ps_ssp (SSP, bound 2
clocks: a node that joins starts at the slowest live member's next clock), every worker with
--dist.elastic=true, 2 server shards; ring_restart (--dist.mode=ring through scripts/launch_node.sh
--max-restarts, checkpoint.every: a lost node fails every node, each launcher restarts its worker and
the job resumes from the newest checkpoint every node holds; a kill9 or sigterm takes the node's
launcher too and a new launcher is started after the delay; a join is not possible and is reported
so); ring_elastic (--dist.mode=ring --dist.elastic=true with a syncopate-rendezvous process: a lost
node's step is abandoned by the others, the ring re-forms without it at the next step boundary, a
preempted node leaves at its step boundary, a joiner or a node back with --resume takes a member's
state and steps on with the job); ring_diloco_elastic (the same with DiLoCo, --dist.sync_every=H
from --sync-every, Nesterov outer step: joins and leaves at round boundaries; a node lost or
preempted mid-round is found at the round's sum and the survivors apply the round with their own
deltas); ps_diloco_elastic and ps_async_local_sgd (local SGD on elastic parameter servers, --sync-every:
BSP shards averaging each round's deltas with a Nesterov outer step, or ASP shards applying each delta
on arrival with delayed Nesterov; a node joins at a round boundary the shards choose, and a node lost or
preempted mid-round drops its partial round). Not built, reported as such with the worker's own refusal:
ps_overlap_elastic (dist.ps_overlap with dist.elastic).

Per run (every definition is repeated in churn.md):
- goodput = useful samples applied / samples the present nodes could have computed in the same wall
  time at the modelled step time, where
    useful samples = samples_per_step x (distinct (node, step) pairs logged in metrics.jsonl, over
                     every incarnation of every node, minus the servers' dropped pushes in steps:
                     sum over shards of dropped x the shard's share of the parameters);
                     ring_diloco_elastic: samples_per_step x H x (sum over the rounds applied of the nodes
                     whose deltas they averaged): a partial round lost with its node is not useful;
                     ps local SGD: samples_per_step x H x (the rounds nodes pushed, i.e. logged their last
                     step, minus the servers' dropped pushes);
    present samples = samples_per_step x (sum over every worker process, or ring launcher, of its
                     lifetime from launch to exit or kill) / emulate.step_time_s;
  samples_per_step = train.batch_size x train.grad_accum. Start-up, waiting and restarts are in the
  denominator: a run without events has goodput < 1 too (its reference row says how much).
- time to end: first worker launched to the last worker's exit.
- time to target (with --eval-every K, every node evaluating every K steps on the same held-out set):
  first worker launched to the first evaluation, by any node, at or below --target-loss; paired by
  seed with the reference where both reached it. Local SGD configurations need K a multiple of H
  (an evaluation at a round boundary reads the outer step's result, not a node's inner weights).
- lost work, steps: dropped (as above; ring_diloco_elastic: node steps computed minus those applied)
  + recomputed (a (node, step) logged more than once: the ring's
  steps past the checkpoint it restarts from, a ps replay answered as a duplicate) + in flight at a
  crash (1 per kill9 of a node that was stepping: it logged a step in the last second; and on the
  ring 1 per worker that failed because a peer was lost: "[launch] worker failed" lines; on the elastic
  ring 1 per step a node abandoned because the ring broke: "the ring broke at step" lines).
- events: planned, applied (the signal reached a live process / the joiner started), happened (the
  logs show it: "joined the running job", the "SIGTERM: node R stopped" line, a SIGKILLed process
  and its next incarnation stepping), survived (the job went on: the target, back, or the joiner
  logged a step after it, and the run completed).
- hangs: a node process alive, its node below train.steps, and no new step line of that node for
  more than --hang-s (start-up counted from its launch); or the run past --run-timeout-s. A hang
  ends the run as failed and is reported.
- duplicate data: data_position values logged more than once across the job's nodes (elastic ps:
  the servers' grants; must be 0); on the elastic ring, whose nodes all log the step's shared
  position, a position logged for more than one step, plus the steps whose nodes logged different
  positions (must be 0). The fixed ring logs no data_position (its order is by step): n/a.
- final validation loss: node 0's job_final record (the job's shipped weights: the servers' after
  every node finished, or the ring's replica) on one held-out set (eval.val_windows, the same for
  every run), paired by seed with the same configuration without events: stats.paired, Holm over
  every comparison of the report; "resolved" only where the Holm p < 0.05, else "not resolved".

--backend sim plays the parameter-server configurations in syncopate-sim's virtual time instead
(experiments/churn_sim.py: the same schedules, flags, shard rules and report; deterministic; validated
against this tool's emulated runs by `churn_sim.py validate`, docs/PERFORMANCE.md "Churn in the simulator").
At the issue's scale (an event per 10 minutes of a job of hours) wall-time emulation cannot go:
experiments/churn_model.py plays the same schedules on a timeline model whose costs it measures from
this tool's records, and checks it against them.

Defaults: 3 nodes, 120 steps of 0.1 s, 3 seeds, 30 events per minute, at most 3 per run, delays 1-3 s.
Measured on this 2-core machine: `churn.py run --out runs/churn` with the defaults took 6 min 26 s when
they were the 4 configurations before ring_elastic (24 runs of 13-21 s each); `--configs
ring_restart,ring_elastic --seeds 3` took 190 s (12 runs; docs/PERFORMANCE.md), so the 5 defaults take
about 8 minutes."""
import argparse
import json
import os
import random
import re
import shlex
import signal
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cluster_runs import CpuSampler  # noqa: E402
from plotting import pyplot  # noqa: E402
from stats import fmt_ci, holm, mean_ci95, paired, tost  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("SYNCOPATE_BIN") or os.path.join(ROOT, "build", "bin")
FORMAT = "syncopate-churn/1"
KINDS = ("kill9", "sigterm", "join")
CONFIGS = {
    "ps_bsp_backup": {"kind": "ps", "consistency": "bsp", "backup_workers": 1},
    "ps_asp": {"kind": "ps", "consistency": "asp", "backup_workers": 0},
    "ps_bsp": {"kind": "ps", "consistency": "bsp", "backup_workers": 0},
    "ps_ssp": {"kind": "ps", "consistency": "ssp", "backup_workers": 0, "staleness_bound": 2},
    "ring_restart": {"kind": "ring"},
    "ring_elastic": {"kind": "ring", "elastic": True},
    "ring_diloco_elastic": {"kind": "ring", "elastic": True, "local_sgd": True},
    "ps_diloco_elastic": {"kind": "ps", "consistency": "bsp", "backup_workers": 0, "local_sgd": True},
    "ps_async_local_sgd": {"kind": "ps", "consistency": "asp", "backup_workers": 0, "local_sgd": True,
                           "outer": "async"},
}
# Local SGD's synchronization every --sync-every steps: DiLoCo (Nesterov outer step; ring_diloco_elastic,
# ps_diloco_elastic, whose BSP shards average the round's deltas), or asynchronous local SGD (ps_async_local_sgd:
# ASP shards apply each node's delta on arrival with delayed Nesterov, experiments/ab_sync_async.py's outer step).
DILOCO_FLAGS = ["--dist.outer=nesterov", "--dist.outer_lr=0.7", "--dist.outer_momentum=0.9"]
ASYNC_LOCAL_SGD_FLAGS = ["--dist.outer=delayed_nesterov", "--dist.outer_momentum=0.9"]  # + --dist.outer_lr=--async-outer-lr


def async_local_sgd_flags(outer_lr):
    return ASYNC_LOCAL_SGD_FLAGS + [f"--dist.outer_lr={outer_lr:g}"]


# A round that the survivors of a lost node applied themselves (worker/sync/elastic_local_sgd_sync.cpp).
ROUND_APPLIED = re.compile(r"the round ending at step (\d+) applied by the (\d+) member")
# Not built: the worker refuses them (the refusal is quoted in the report, asked of the binary).
NOT_BUILT = {
    "ps_overlap_elastic": ["--dist.mode=ps", "--dist.servers=tcp://127.0.0.1:1", "--dist.ps_overlap=true",
                           "--dist.elastic=true"],
}
RING_JOIN = ("not possible: this ring is not elastic (NNODES is fixed at the rendezvous; a node cannot join a "
             "running fixed ring job; ring_elastic is the one that takes joins)")
SERVERS = 2
POLL_S = 0.1
STEPPING_S = 1.0  # a node that logged a step this recently was stepping (its step in flight is lost to a crash)


# ---------------------------------------------------------------------------------------------
# The schedule

def draw_schedule(seed, rate_per_min, steps, step_time, nodes, max_events=3, start_s=1.0, horizon_frac=0.55,
                  delay=(1.0, 3.0), recover_s=4.0):
    """The seed's events: [{"i", "t_s", "kind", "node", "delay_s"}], t_s from the moment every first
    node stepped. Draws the same random numbers per arrival whatever it becomes, so that the
    schedule depends on the seed and these arguments alone (never on a configuration)."""
    rng = random.Random(f"syncopate-churn-{seed}")
    horizon = horizon_frac * steps * step_time
    order = list(KINDS)
    rng.shuffle(order)  # the kinds in a seeded order, taken in turn: three events are one of each
    events, down_until, joins = [], {}, 0
    t = start_s
    while len(events) < max_events and rate_per_min > 0:
        t += rng.expovariate(rate_per_min / 60.0)
        u_node, u_delay = rng.random(), rng.random()
        if t > horizon:
            break
        kind = order[len(events) % len(order)]
        d = round(delay[0] + (delay[1] - delay[0]) * u_delay, 3)
        node = None
        if kind != "join":
            up = [n for n in range(nodes) if down_until.get(n, -1.0) <= t]
            if up:
                node = up[min(int(u_node * len(up)), len(up) - 1)]
                down_until[node] = t + d + recover_s
            else:
                kind = "join"
        if kind == "join":
            node = nodes + joins
            joins += 1
        events.append({"i": len(events), "t_s": round(t, 3), "kind": kind, "node": node, "delay_s": d})
    return events


# ---------------------------------------------------------------------------------------------
# Processes: each in a session and process group of its own; every group is ended at the end.

def _group_alive(pgid):
    """True while a process of group pgid (a session we started: sid == pgid) exists."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and int(fields[3]) == pgid and fields[0] != "Z":
            return True
    return False


class Procs:
    """The groups this script started; end_all() ends every one of them (TERM, then KILL)."""

    def __init__(self):
        self.groups = []  # pgids (= the leaders' pids)
        self.popens = []

    def start(self, cmd, env, log_path, cwd=None):
        with open(log_path, "a") as log:
            p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, cwd=cwd or os.path.dirname(log_path))
        self.groups.append(p.pid)
        self.popens.append(p)
        return p

    def end_all(self, grace_s=5.0):
        live = [g for g in self.groups if _group_alive(g)]
        for g in live:
            try:
                os.killpg(g, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + grace_s
        while live and time.time() < deadline:
            for p in self.popens:
                p.poll()
            live = [g for g in live if _group_alive(g)]
            time.sleep(0.05)
        for g in live:
            try:
                os.killpg(g, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.popens:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.groups, self.popens = [g for g in self.groups if _group_alive(g)], []
        return self.groups  # what is left (nothing, normally)


class _Interrupted(Exception):
    pass


def _on_signal(signum, frame):
    raise _Interrupted(f"signal {signum}")


# ---------------------------------------------------------------------------------------------
# Reading the nodes' metrics while they run (a resumed worker rewrites its file: kept lines are
# copied verbatim, so every distinct line is kept once, with the time it was first seen).

class Tail:
    def __init__(self, path):
        self.path, self.ino, self.offset, self.buf = path, None, 0, b""
        self.seen, self.lines = set(), []

    def poll(self, now):
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        if st.st_ino != self.ino or st.st_size < self.offset:
            self.ino, self.offset, self.buf = st.st_ino, 0, b""
        if st.st_size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        self.buf += data
        *complete, self.buf = self.buf.split(b"\n")
        new = []
        for raw in complete:
            if not raw.strip() or raw in self.seen:
                continue
            try:
                m = json.loads(raw)
            except ValueError:
                continue
            self.seen.add(raw)
            m["_seen_unix"] = now
            self.lines.append(m)
            new.append(m)
        return new


# ---------------------------------------------------------------------------------------------
# One run

def worker_flags(a, seed):
    flags = ["--model.n_embd=32", "--model.n_head=2", "--model.block_size=32", "--train.threads=1",
             f"--eval.every={getattr(a, 'eval_every', 0)}", "--eval.batches=1", "--eval.sample_tokens=0",
             f"--eval.val_windows={a.val_windows}",
             f"--train.batch_size={a.batch}", f"--train.steps={a.steps}", f"--train.seed={seed}",
             "--schedule.warmup_steps=5", f"--emulate.step_time_s={a.step_time!r}",
             f"--checkpoint.every={a.checkpoint_every}", f"--emulate.checkpoint_s={a.checkpoint_s!r}",
             f"--checkpoint.background={'true' if getattr(a, 'checkpoint_background', False) else 'false'}",
             f"--data.corpus={a.corpus}", f"--data.cache_dir={a.cache_dir}",
             "--dist.check_every=0", f"--dist.timeout_s={a.timeout_s!r}", "--train.preempt_grace_s=30"]
    return flags


def exactly_once(cfg, stats, acked, crashes, rounds):
    """Every acknowledged update applied, none twice, as the shards' own counts say (ps). A node's push
    is acknowledged when it logs the step (local SGD: the round's last step); acked counts them over the
    job, crashes the kill -9 events applied, rounds the job's clocks.
    - BSP: each shard applied exactly one update per round, whoever came and went (`updates` == rounds).
    - BSP with backup workers: every acknowledged gradient was either applied in a round or dropped as
      late, once: per shard, the gradients used (its staleness histogram) plus those dropped, minus the
      acknowledged, is in [0, crashes]. The rounds are not the clocks there: a worker dropped after its
      round was applied counts a round late from then on, and joins and departures change a round's size,
      so a job can apply more rounds than it has clocks (reported, not a loss or a duplicate).
    - ASP: each shard's `updates` minus the pushes acknowledged is in [0, crashes]: a crashed node's last
      push may have been applied unanswered; below 0 an acknowledged push was lost, above the crashes one
      was applied twice."""
    per_shard = [s.get("updates") for s in stats]
    if any(u is None for u in per_shard):
        return {"ok": False, "why": "a shard wrote no stats", "updates": per_shard}
    if cfg["consistency"] == "bsp" and cfg.get("backup_workers"):
        taken = [sum(s.get("staleness_histogram", {}).values()) + s.get("dropped", 0) for s in stats]
        extra = [t - acked for t in taken]
        ok = all(0 <= x <= crashes for x in extra)
        return {"ok": ok, "rule": "0 <= used + dropped - acknowledged <= crashes", "updates": per_shard, "rounds": rounds,
                "used_plus_dropped": taken, "acknowledged": acked, "crashes": crashes,
                "why": None if ok else f"used + dropped - acknowledged = {extra} with {crashes} crash(es)"}
    if cfg["consistency"] == "bsp":
        ok = all(u == rounds for u in per_shard)
        return {"ok": ok, "rule": "updates == rounds", "updates": per_shard, "rounds": rounds,
                "why": None if ok else f"shards applied {per_shard} updates for {rounds} rounds"}
    extra = [u - acked for u in per_shard]
    ok = all(0 <= x <= crashes for x in extra)
    return {"ok": ok, "rule": "0 <= updates - acknowledged <= crashes", "updates": per_shard, "acknowledged": acked,
            "crashes": crashes, "why": None if ok else f"updates - acknowledged = {extra} with {crashes} crash(es)"}


class Run:
    """One configuration, one seed, with or without the schedule's events."""

    def __init__(self, a, name, seed, events, out):
        self.a, self.name, self.cfg, self.seed, self.out = a, name, CONFIGS[name], seed, out
        self.ring = self.cfg["kind"] == "ring"
        self.elastic_ring = self.ring and bool(self.cfg.get("elastic"))
        self.restart_ring = self.ring and not self.elastic_ring  # through launch_node.sh --max-restarts
        self.events = [dict(e, applied=False, why_not=None, t_applied_unix=None) for e in events]
        self.procs = Procs()
        self.incs = []  # {"node", "inc", "popen", "start_unix", "end_unix", "rc", "ended_by", "log"}
        self.tails, self.pending, self.hangs = {}, [], []
        self.t_train0 = None
        self.token = os.urandom(8).hex()
        self.eps = ""
        self.master_port = None
        self.failure = None

    # -- starting --
    def env(self, rank, nnodes):
        e = dict(os.environ, SYNCOPATE_TOKEN=self.token, NNODES=str(nnodes), NODE_RANK=str(rank), SYNCOPATE_LOG="info")
        if self.ring:
            e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.master_port),
                     SYNCOPATE_WORKER=os.path.join(BIN, "syncopate-worker"))
        return e

    def start_servers(self):
        eps = []
        for k in range(SERVERS):
            ep_file = os.path.join(self.out, "logs", f"server{k}.endpoint")
            cmd = [os.path.join(BIN, "syncopate-server"), f"--server.shard={k}", "--server.host=127.0.0.1",
                   "--server.port=-1", f"--server.endpoint_file={ep_file}", "--server.encrypt=off",
                   f"--ps.consistency={self.cfg['consistency']}", f"--ps.backup_workers={self.cfg['backup_workers']}",
                   f"--ps.worker_timeout_s={self.a.worker_timeout_s!r}"]
            if "staleness_bound" in self.cfg:
                cmd.append(f"--ps.staleness_bound={self.cfg['staleness_bound']}")
            cmd += self.server_checkpoint_flags(k)
            eps.append(self.start_service(cmd, ep_file, f"server{k}"))
        self.eps = ",".join(eps)

    def start_rendezvous(self):
        """The elastic ring's membership service on a free loopback port (ended with the servers)."""
        port_file = os.path.join(self.out, "logs", "rendezvous.port")
        cmd = [os.path.join(BIN, "syncopate-rendezvous"), "--host", "127.0.0.1", "--port", "-1", "--port-file", port_file]
        self.master_port = int(self.start_service(cmd, port_file, "rendezvous"))

    def start_service(self, cmd, address_file, name):
        """Starts a server or the rendezvous service (ended with the run) and returns the first line of the
        file it writes its address to once it listens."""
        p = self.procs.start(cmd, dict(os.environ, SYNCOPATE_TOKEN=self.token), os.path.join(self.out, "logs", f"{name}.log"))
        self.servers.append(p)
        deadline = time.time() + 60
        while not (os.path.exists(address_file) and os.path.getsize(address_file) > 0):
            if p.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{name} did not start listening (see {self.out}/logs/{name}.log)")
            time.sleep(0.05)
        with open(address_file) as f:
            return f.readline().strip()

    def start_node(self, rank, nnodes):
        inc = sum(1 for i in self.incs if i["node"] == rank)
        node_out = os.path.join(self.out, f"node{rank}")
        log = os.path.join(self.out, "logs", f"node{rank}.{inc}.log")
        flags = worker_flags(self.a, self.seed) + ["--out", node_out]
        if self.restart_ring:
            cmd = [os.path.join(ROOT, "scripts", "launch_node.sh"), "--max-restarts", str(self.a.max_restarts), "--"]
            cmd += flags + ["--dist.mode=ring"]
        else:
            cmd = [os.path.join(BIN, "syncopate-worker")] + flags + (
                ["--dist.mode=ring", "--dist.elastic=true"] + self.local_sgd_flags() if self.elastic_ring else
                ["--dist.mode=ps", f"--dist.servers={self.eps}", "--dist.ps_encrypt=off", "--dist.elastic=true"]
                + self.local_sgd_flags())
            if os.path.exists(os.path.join(node_out, "checkpoints", "latest")):
                cmd.append("--resume")
        p = self.procs.start(cmd, self.env(rank, nnodes), log)
        rec = {"node": rank, "inc": inc, "nnodes": nnodes, "popen": p, "start_unix": time.time(), "end_unix": None,
               "rc": None, "ended_by": None, "log": log, "command": " ".join(shlex.quote(c) for c in cmd)}
        self.incs.append(rec)
        if rank not in self.tails:
            self.tails[rank] = Tail(os.path.join(node_out, "metrics.jsonl"))
        return rec

    def server_checkpoint_flags(self, k):
        """--server-checkpoints: each shard checkpoints as often as the nodes do in modelled time (every
        --checkpoint-every steps of the job: that many steps' updates, each node's push one update per step
        under SSP/ASP, one per round of the nodes under BSP, per --sync-every steps with local SGD), each write held to
        --checkpoint-s, in the background with --checkpoint-background."""
        if not getattr(self.a, "server_checkpoints", False):
            return []
        per_step = 1.0 / self.a.sync_every if self.cfg.get("local_sgd") else 1.0
        pushers = 1 if self.cfg["consistency"] == "bsp" else self.a.nodes  # BSP: one update per round of the nodes
        every = max(1, round(pushers * self.a.checkpoint_every * per_step))
        return [f"--server.checkpoint_dir={os.path.join(self.out, f'server{k}_checkpoints')}",
                f"--server.checkpoint_every={every}", f"--server.checkpoint_s={self.a.checkpoint_s!r}",
                f"--server.checkpoint_background={'true' if self.a.checkpoint_background else 'false'}"]

    def local_sgd_flags(self):
        if not self.cfg.get("local_sgd"):
            return []
        outer = async_local_sgd_flags(self.a.async_outer_lr) if self.cfg.get("outer") == "async" else DILOCO_FLAGS
        return [f"--dist.sync_every={self.a.sync_every}"] + outer

    def alive(self, rank):
        return next((i for i in self.incs if i["node"] == rank and i["end_unix"] is None), None)

    def steps_of(self, rank):
        return [m for m in self.tails[rank].lines if "loss" in m] if rank in self.tails else []

    # -- events --
    def at_boundary(self, e, now):
        """--losses-at-round-boundaries (local SGD): whether a due kill9 or sigterm may go now, so that
        its node drops no partial round: a kill9 just after the node logged a round's last step (it dies
        in the next round's first step, nothing of that round logged), a sigterm while it computes a
        round's last step (it finishes the step, pushes the round, and leaves at the boundary). Judged
        from a step line at most 1.5 polls old; otherwise the event (and those after it, joins included)
        waits, with no bound: usually under a round, but a node that is waiting (for a join, a round)
        holds it longer (2.2 s seen). Anything else goes at once."""
        if not getattr(self.a, "losses_at_round_boundaries", False) or e["kind"] not in ("kill9", "sigterm"):
            return True
        inc = self.alive(e["node"])
        steps = self.steps_of(e["node"])
        if inc is None or not steps:
            return True  # apply() says why it does not happen
        last = steps[-1]
        if now - last["_seen_unix"] > 1.5 * POLL_S:
            return False
        H = self.a.sync_every
        return last["step"] % H == (0 if e["kind"] == "kill9" else H - 1)

    def apply(self, e, now):
        e["t_applied_unix"] = now
        if e["kind"] == "join":
            if self.restart_ring:
                e["why_not"] = RING_JOIN
                return
            # An elastic ring's joiner names the job's starting size (its rank is past it); a ps joiner the new size.
            e["inc"] = self.start_node(e["node"], self.a.nodes if self.elastic_ring else e["node"] + 1)["inc"]
            e["applied"] = True
            return
        inc = self.alive(e["node"])
        if inc is None:
            e["why_not"] = f"node {e['node']} was not running"
            return
        if self.steps_of(e["node"]) and self.steps_of(e["node"])[-1]["step"] >= self.a.steps:
            e["why_not"] = f"node {e['node']} had finished its steps"
            return
        e["inc"] = inc["inc"]
        steps = self.steps_of(e["node"])
        e["target_last_step"] = steps[-1]["step"] if steps else None
        # Stepping: this incarnation logged a step within the last STEPPING_S (not starting, not restarting).
        e["target_stepping"] = bool(steps) and steps[-1]["_seen_unix"] >= max(inc["start_unix"], now - STEPPING_S)
        if e["kind"] == "kill9":
            os.killpg(inc["popen"].pid, signal.SIGKILL)
            inc["ended_by"] = "kill9"
        else:
            os.kill(inc["popen"].pid, signal.SIGTERM)  # the worker, or the fixed ring's launcher, which passes it on
            inc["ended_by"] = "sigterm"
        inc["event"] = e["i"]
        e["applied"] = True

    # -- the loop --
    def execute(self):
        a = self.a
        os.makedirs(os.path.join(self.out, "logs"), exist_ok=True)
        self.servers = []
        t_begin = time.time()
        with CpuSampler() as cpu:
            try:
                if self.elastic_ring:
                    self.start_rendezvous()
                elif self.ring:
                    import socket
                    with socket.socket() as s:
                        s.bind(("127.0.0.1", 0))
                        self.master_port = s.getsockname()[1]
                else:
                    self.start_servers()
                for r in range(a.nodes):
                    self.start_node(r, a.nodes)
                self.loop()
            finally:
                # No signal may cut the cleanup short: a Ctrl-C meanwhile is raised once it is done.
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
                self.finish_servers()
                left = self.procs.end_all()
                now = time.time()
                for i in self.incs:
                    if i["end_unix"] is None:
                        i["popen"].poll()
                        i["end_unix"], i["rc"] = now, i["popen"].returncode
                        i["ended_by"] = i["ended_by"] or "ended by churn.py"
                for t in self.tails.values():
                    t.poll(now)
                if left:
                    self.failure = (self.failure or "") + f"; process groups left running: {left}"
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        self.elapsed_s = time.time() - t_begin
        self.cpu = cpu
        return self.summary()

    def finish_servers(self):
        for p in self.servers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # a server logs its stats on the way out
        for p in self.servers:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass

    def loop(self):
        a = self.a
        t_start = time.time()
        limit = a.run_timeout_s or (3 * a.steps * a.step_time + 60 + 15 * len(self.events))
        todo = list(self.events)
        while True:
            now = time.time()
            for rank, t in self.tails.items():
                t.poll(now)
            # Exits.
            for i in self.incs:
                if i["end_unix"] is not None or i["popen"].poll() is None:
                    continue
                i["end_unix"], i["rc"] = now, i["popen"].returncode
                if i["ended_by"] in ("kill9", "sigterm"):
                    e = self.events[i["event"]]
                    e["exit_rc"] = i["rc"]
                    e["back_planned_unix"] = now + e["delay_s"]
                    self.pending.append((now + e["delay_s"], e))
                    continue
                i["ended_by"] = "exit"
                if i["rc"] != 0:
                    self.failure = f"node {i['node']} (incarnation {i['inc']}) exited with {i['rc']} (log: {i['log']})"
                    return
            # The training clock of the schedule: every first node has logged a step.
            if self.t_train0 is None and all(self.steps_of(r) for r in range(a.nodes)):
                self.t_train0 = now
            if self.t_train0 is not None:
                while todo and now >= self.t_train0 + todo[0]["t_s"] and self.at_boundary(todo[0], now):
                    self.apply(todo.pop(0), now)
            for item in [p for p in self.pending if p[0] <= now]:
                self.pending.remove(item)
                e = item[1]
                rec = self.start_node(e["node"], self.incs[[i["node"] for i in self.incs].index(e["node"])]["nnodes"])
                e["back_inc"], e["back_unix"] = rec["inc"], now
            # Hangs: a live node below its last step without a new step line for longer than the bound.
            for i in self.incs:
                if i["end_unix"] is not None:
                    continue
                steps = self.steps_of(i["node"])
                if steps and steps[-1]["step"] >= a.steps:
                    continue
                last = max([i["start_unix"]] + [m["_seen_unix"] for m in steps])
                if now - last > a.hang_s:
                    self.hangs.append({"node": i["node"], "inc": i["inc"], "silent_since_unix": last, "at_unix": now,
                                       "last_step": steps[-1]["step"] if steps else None})
                    self.failure = f"hang: node {i['node']} logged no step for {now - last:.1f} s (bound {a.hang_s:g} s)"
                    return
            if now - t_start > limit:
                self.hangs.append({"node": None, "at_unix": now, "run_timeout_s": limit})
                self.failure = f"hang: the run did not end within {limit:.0f} s"
                return
            running = any(i["end_unix"] is None for i in self.incs)
            if not running and not self.pending:
                if todo:  # the job ended before these events' times
                    for e in todo:
                        e["why_not"] = "the job had ended before its time"
                return
            time.sleep(POLL_S)

    # -- measuring --
    def server_stats(self):
        out = []
        for k in range(SERVERS if not self.ring else 0):
            try:
                with open(os.path.join(self.out, "logs", f"server{k}.log"), errors="replace") as f:
                    lines = [ln for ln in f if "] stats {" in ln]
                out.append(json.loads(lines[-1].split("] stats ", 1)[1]) if lines else {})
            except (OSError, ValueError):
                out.append({})
        return out

    def exactly_once(self, stats, distinct):
        if self.ring:
            return None
        every = self.a.sync_every if self.cfg.get("local_sgd") else 1
        acked = sum(1 for st in distinct.values() for x in st if x % every == 0)
        crashes = sum(1 for e in self.events if e["applied"] and e["kind"] == "kill9")
        return exactly_once(self.cfg, stats, acked, crashes, self.a.steps // every)

    def log_text(self, rec):
        try:
            with open(rec["log"], errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def evidence(self, e):
        """What the logs show of an event: (happened, [lines])."""
        if not e["applied"]:
            return False, []
        node = e["node"]
        incs = [i for i in self.incs if i["node"] == node]
        grab = []
        steps_after = [m for m in self.steps_of(node) if m.get("unix_s", 0) > e["t_applied_unix"]]
        if e["kind"] == "join":
            text = self.log_text(incs[0]) if incs else ""
            grab = [ln for ln in text.splitlines() if "joined the running job" in ln]
            return bool(grab) and bool(steps_after), grab
        before = next((i for i in incs if i["inc"] == e.get("inc")), None)
        back = next((i for i in incs if i["inc"] == e.get("back_inc")), None)
        if e["kind"] == "sigterm":
            grab = [ln for ln in self.log_text(before).splitlines() if "SIGTERM" in ln] if before else []
            e["stopped_at_step_boundary"] = bool(grab)
            if self.restart_ring:
                # The launcher ends on TERM with 143 after its worker (which stops at its step boundary
                # and checkpoints when it was stepping; a ring already restarting has no step to stop at).
                stopped = e.get("exit_rc") == 143
                if not grab:
                    grab = [f"node {node}: the launcher ended on SIGTERM (143) while its worker was not stepping "
                            "(the ring was restarting)"]
            else:
                stopped = bool(grab) and e.get("exit_rc") == 0
            if before is not None and not stopped:
                errs = [ln for ln in self.log_text(before).splitlines() if "error" in ln.lower()]
                e["exit_note"] = (f"exit {e.get('exit_rc')}" + (f": {errs[-1][:300]}" if errs else "")
                                  + ("" if grab else "; no SIGTERM line in its log"))
        else:
            stopped = e.get("exit_rc") == -signal.SIGKILL
            grab = [f"node {node} incarnation {e.get('inc')} ended by SIGKILL (returncode {e.get('exit_rc')})"]
        if back is not None:
            bt = self.log_text(back)
            grab += [ln for ln in bt.splitlines() if "joined the running job" in ln or "resumed from" in ln
                     or "[launch] node" in ln][:3]
        if self.restart_ring:  # the others' workers failed and their launchers restarted them
            for i in self.incs:
                if i["node"] != node:
                    grab += [ln for ln in self.log_text(i).splitlines() if "[launch] worker failed" in ln][:1]
        return stopped and back is not None and bool(steps_after), grab

    def summary(self):
        a = self.a
        spp = a.batch  # samples per step: batch_size x grad_accum (1)
        ranks = sorted(self.tails)
        step_lines = {r: self.steps_of(r) for r in ranks}
        distinct = {r: sorted({m["step"] for m in step_lines[r]}) for r in ranks}
        logged = sum(len(v) for v in step_lines.values())
        useful_steps_logged = sum(len(v) for v in distinct.values())
        recomputed = logged - useful_steps_logged
        stats = self.server_stats()
        total_len = sum(s.get("length", 0) for s in stats) or 1
        dropped = sum(s.get("dropped", 0) * s.get("length", 0) for s in stats) / total_len
        duplicates_srv = sum(s.get("duplicates", 0) for s in stats)
        in_flight = 0
        for e in self.events:
            if e["applied"] and e["kind"] == "kill9" and e.get("target_stepping"):
                in_flight += 1
        if self.ring:
            lost_line = "the ring broke at step" if self.elastic_ring else "[launch] worker failed"
            for i in self.incs:
                in_flight += sum(1 for ln in self.log_text(i).splitlines() if lost_line in ln)
        ends = [i["end_unix"] for i in self.incs if i["end_unix"] is not None]
        t0 = min(i["start_unix"] for i in self.incs) if self.incs else None
        wall = (max(ends) - t0) if ends and t0 else None
        present = sum((i["end_unix"] or time.time()) - i["start_unix"] for i in self.incs)
        ideal = spp * present / a.step_time if a.step_time > 0 else None
        redone = None
        positions = [m["data_position"] for r in ranks for m in step_lines[r] if "data_position" in m]
        if self.cfg.get("local_sgd") and not self.ring:
            # Local SGD on parameter servers: a node's round is applied when it pushed it, which it did
            # before logging the round's last step; the shards' dropped pushes (late under backup workers)
            # are rounds. A partial round (a node lost or preempted in it, or the job's end) is dropped, and
            # its positions (redone on the same grant) are not data used: a node's last record of each step
            # in a pushed round.
            positions = []
            for r in ranks:
                last = {m["step"]: m for m in step_lines[r]}
                positions += [m["data_position"] for st, m in last.items()
                              if "data_position" in m and ((st - 1) // a.sync_every + 1) * a.sync_every in last]
            pushed_rounds = sum(1 for r in ranks for st in distinct[r] if st % a.sync_every == 0)
            applied_steps = a.sync_every * max(0.0, pushed_rounds - dropped)
            dropped = max(0, useful_steps_logged - applied_steps)
            useful = spp * applied_steps
        elif self.cfg.get("local_sgd"):
            # Local SGD: a step is useful when the round it belongs to was applied with its node's delta. A
            # round applied normally is logged at its last step by its members (world = its contributors); one
            # that the survivors of a lost node applied is logged in their own words (its last step is not:
            # regroup() took the trainer past it), with how many contributed. A lost or preempted node's
            # partial round, and a final partial round, are not applied: dropped.
            contributors = {}
            for r in ranks:
                for m in step_lines[r]:
                    if m["step"] % a.sync_every == 0 and "world" in m:
                        contributors[m["step"]] = m["world"]
            redone = {}  # every member of the re-formed ring logs it: one entry per round
            for i in self.incs:
                for mt in ROUND_APPLIED.finditer(self.log_text(i)):
                    redone[int(mt.group(1))] = int(mt.group(2))
            for end, n in redone.items():
                contributors.setdefault(end, n)
            applied_unlogged = sum(redone.values())  # their last steps, computed and applied, not logged
            applied_steps = a.sync_every * sum(contributors.values())
            dropped = max(0, useful_steps_logged + applied_unlogged - applied_steps)
            useful = spp * applied_steps
        else:
            useful = spp * (useful_steps_logged - dropped)
        if self.elastic_ring:  # every node logs the step's shared position: one per step, none for two steps
            by_step = {}
            for r in ranks:
                for m in step_lines[r]:
                    if "data_position" in m:
                        by_step.setdefault(m["step"], set()).add(m["data_position"])
            owners = {}
            for st, ps in by_step.items():
                for q in ps:
                    owners.setdefault(q, set()).add(st)
            dup_data = (sum(len(v) - 1 for v in owners.values())
                        + sum(1 for ps in by_step.values() if len(ps) > 1))
            positions = sorted(owners)
        else:
            dup_data = (len(positions) - len(set(positions))) if not self.ring else None
        finals = [m for m in (self.tails[0].lines if 0 in self.tails else []) if m.get("job_final") and "val_loss" in m]
        all_steps = sorted(m["unix_s"] for r in ranks for m in step_lines[r])
        stall = max((b - x for x, b in zip(all_steps, all_steps[1:])), default=None)
        # Where each node's state ended: its last step logged, or the job's step it joined at when that is later
        # (a node that joins, or comes back, at the job's last boundary takes the end and steps no more).
        last_step = {r: distinct[r][-1] if distinct[r] else None for r in ranks}
        for i in self.incs:
            for mt in re.finditer(rf"node {i['node']} joined the running job at step (\d+)", self.log_text(i)):
                last_step[i["node"]] = max(last_step[i["node"]] or 0, int(mt.group(1)))
            # BSP: a node behind the servers' rounds ends when they reach the budget (its steps left add nothing).
            if re.search(rf"node {i['node']} ends after its step \d+ of \d+: the servers' rounds reached", self.log_text(i)):
                last_step[i["node"]] = max(last_step[i["node"]] or 0, a.steps)
        complete = (self.failure is None and bool(finals)
                    and all(last_step[r] is not None and last_step[r] >= a.steps for r in ranks))
        happened = []
        for e in self.events:
            if not e["applied"] and e["why_not"] is None:
                e["why_not"] = f"the run ended before its time ({self.failure})"
            ok, lines = self.evidence(e)
            e["happened"] = ok
            e["evidence"] = lines
            e["survived"] = bool(ok and complete)
            if e["t_applied_unix"] is not None and self.t_train0 is not None:
                e["t_applied_s"] = round(e["t_applied_unix"] - self.t_train0, 3)
            happened.append(ok)
        once = self.exactly_once(stats, distinct)
        all_step_records = [m for r in ranks for m in step_lines[r]]
        overrun = (sum(1 for m in all_step_records if m.get("overrun")) / len(all_step_records)
                   if all_step_records else None)
        window = (t0, max(ends)) if ends and t0 else None
        evals = [m for r in ranks for m in self.tails[r].lines if "val_loss" in m and "unix_s" in m]
        target = getattr(a, "target_loss", None) if getattr(a, "eval_every", 0) else None
        hits = [m["unix_s"] for m in evals if target is not None and m["val_loss"] <= target]
        metrics = {
            "goodput": (useful / ideal) if ideal else None,
            "useful_samples": useful, "present_samples": ideal, "present_node_s": present,
            "samples_per_step": spp,
            "time_to_end_s": wall,
            # The first evaluation, by any node (job_final included), at or below --target-loss; None: not reached
            # (or no periodic evaluation, --eval-every 0). Every node evaluates the model it would ship then (see
            # the report's definitions).
            "time_to_target_s": (min(hits) - t0) if hits and t0 else None,
            "evaluations": len(evals), "target_loss": target,
            "lost_steps": {"dropped": dropped, "recomputed": recomputed, "in_flight_at_crash": in_flight,
                           "total": dropped + recomputed + in_flight},
            "events_planned": len(self.events),
            "events_applied": sum(1 for e in self.events if e["applied"]),
            "events_not_possible": sum(1 for e in self.events if not e["applied"]),
            "events_happened": sum(happened),
            "events_survived": sum(1 for e in self.events if e["survived"]),
            "hangs": len(self.hangs),
            "duplicate_data": dup_data,
            "data_positions": len(positions),
            "rounds_redone": len(redone) if redone is not None else None,
            "final_val_loss": finals[-1]["val_loss"] if finals else None,
            "longest_stall_s": stall,
            "steps_logged": logged, "distinct_steps": useful_steps_logged,
            "node_last_step": {str(r): last_step[r] for r in ranks},
            "server_duplicates": duplicates_srv if not self.ring else None,
            "exactly_once": once,
            "acknowledged_pushes": (sum(1 for st in distinct.values() for x in st
                                        if x % (a.sync_every if self.cfg.get("local_sgd") else 1) == 0)
                                    if not self.ring else None),
            "overrun_share": overrun,
            "cpu_util": cpu_mean(self.cpu, window),
        }
        incs = [{k: v for k, v in i.items() if k != "popen"} for i in self.incs]
        return {"config": self.name, "seed": self.seed, "churn": bool(self.events), "dir": self.out,
                "status": "complete" if complete else "failed",
                "failure": self.failure or (None if complete else "incomplete: no job_final evaluation or a node "
                                            "below train.steps"),
                "events": self.events, "hangs": self.hangs, "incarnations": incs, "server_stats": stats,
                "metrics": metrics, "elapsed_s": self.elapsed_s,
                "t_train0_unix": self.t_train0}


def cpu_mean(cpu, window):
    try:
        return cpu.mean(window) if window else cpu.mean()
    except Exception:  # noqa: BLE001  (a sampler with no samples)
        return None


# ---------------------------------------------------------------------------------------------
# Analysis and reports

def not_built():
    """{name: the worker's refusal} for the configurations that are not built (asked of the binary)."""
    out = {}
    for name, flags in NOT_BUILT.items():
        try:
            r = subprocess.run([os.path.join(BIN, "syncopate-worker")] + flags + ["--print-config"],
                               capture_output=True, text=True, timeout=60)
            msg = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
            out[name] = {"flags": flags, "refused": r.returncode != 0, "message": msg}
        except (OSError, subprocess.TimeoutExpired) as e:
            out[name] = {"flags": flags, "refused": None, "message": f"could not ask the worker: {e}"}
    return out


def compare(runs, configs, equal_runs=(), batch_runs=(), time_to_target=False):
    """Churn against the reference, paired by seed, per configuration: final_val_loss and goodput;
    Holm over every comparison. equal_runs: the references at the churn runs' applied samples
    (--equal-samples), whose final-loss gap is tested too. batch_runs: runs without events at the
    reference's steps, wider (report --batch-references): with the reference, a line in
    samples at equal steps, read at the churn run's samples (equal steps and equal samples at once)."""
    comps = []
    for name in configs:
        for metric in ("final_val_loss", "goodput") + (("time_to_target_s",) if time_to_target else ()):
            ch = {str(r["seed"]): r["metrics"].get(metric) for r in runs
                  if r["config"] == name and r["churn"] and r["status"] == "complete"
                  and r["metrics"].get(metric) is not None}
            ref = {str(r["seed"]): r["metrics"].get(metric) for r in runs
                   if r["config"] == name and not r["churn"] and r["status"] == "complete"
                   and r["metrics"].get(metric) is not None}
            p = paired(ch, ref)
            comps.append({"config": name, "metric": metric, "a": "churn", "b": "reference", **p})
    adj = holm([c["p"] for c in comps])
    for c, h in zip(comps, adj):
        c["p_holm"] = h
        if c["n"] and all(d == 0 for d in c["diffs"]):
            c["verdict"] = "identical in every seed (difference 0): nothing to test"
        elif c.get("deterministic"):
            c["verdict"] = "deterministic: no seed variation, not a statistical result"
        elif c["n"] < 2:
            c["verdict"] = f"not resolved (n = {c['n']} paired seeds)"
        elif h is not None and h < 0.05:
            c["verdict"] = "resolved"
        else:
            c["verdict"] = "not resolved"
    def on_line(name, second):  # the gap against each seed's reference and `second` joined by a line in samples
        line = interpolated_references(runs, second, name)
        return dict(loss_gap_within(runs, name, line), outside_max=max((r["outside"] for r in line), default=None))

    for c in comps:
        if c["metric"] != "final_val_loss":
            continue
        c["within_1pct"] = loss_gap_within(runs, c["config"])
        if any(r["config"] == c["config"] for r in equal_runs):
            c["within_1pct_equal_samples"] = loss_gap_within(runs, c["config"], equal_runs)
            c["within_1pct_interpolated"] = on_line(c["config"], equal_runs)
        if any(r["config"] == c["config"] for r in batch_runs):
            c["within_1pct_batch"] = on_line(c["config"], batch_runs)
    for key in ("within_1pct", "within_1pct_equal_samples", "within_1pct_interpolated", "within_1pct_batch"):
        holm_beyond([c[key] for c in comps if c.get(key)])
    return comps


def holm_beyond(gaps):
    """A gap not within 1% is said to lie beyond it only where its one-sided test (the side its mean
    is on) survives Holm over the family's configurations; loss_gap_within's verdict is uncorrected."""
    side = [("above", g["p_above"]) if (g["mean"] or 0) >= 0 else ("below", g["p_below"]) for g in gaps]
    adj = holm([p if not g["equivalent"] else None for g, (_, p) in zip(gaps, side)])
    for g, (where, p), h in zip(gaps, side, adj):
        g["p_beyond_holm"] = h
        if h is None or g["equivalent"] or g["n"] < 2:
            continue
        bound = f"{'+' if where == 'above' else '-'}{LOSS_GAP:.0%}"
        g["verdict"] = (f"not within {LOSS_GAP:.0%}: shown {where} {bound} (one-sided p {p:.3g}, Holm p {h:.3g} over "
                        f"{sum(x is not None for x in adj)} configurations)" if h < 0.05 else
                        f"not shown within {LOSS_GAP:.0%} (TOST p {g['p']:.3g}), nor {where} {bound} (one-sided p "
                        f"{p:.3g}, Holm p {h:.3g}): not resolved")


def equal_budget(a, cfg, churn_metrics, ref_metrics):
    """--equal-samples: the step budget at which a run without events applies about the samples the
    churn run applied: a.steps x the churn run's useful samples / the reference's (so the reference's
    own share of useful samples per step, a backup rule's drops included, carries over), rounded to
    whole steps (local SGD: whole rounds). None where either count is missing."""
    cu, ru = churn_metrics.get("useful_samples"), ref_metrics.get("useful_samples")
    if not cu or not ru:
        return None
    unit = a.sync_every if cfg.get("local_sgd") else 1
    return max(unit, int(round(a.steps * cu / ru / unit)) * unit)


def interpolated_references(runs, equal_runs, name):
    """Per seed, a reference at exactly the churn run's applied samples: the final loss of the two runs
    without events (at equal steps, and at the --equal-samples budget, whose rounding to whole steps or
    rounds leaves it off the churn run's samples by up to a round) joined by a line in useful samples and
    read at the churn run's samples. Where both references applied the same samples, the equal-samples one.
    Each entry records how far outside the two references' samples it reads (0: between them)."""
    def by_seed(rs, churn):
        return {r["seed"]: r for r in rs if r["config"] == name and bool(r["churn"]) == churn and r["status"] == "complete"}
    ch, ref, eq = by_seed(runs, True), by_seed(runs, False), by_seed(equal_runs, False)
    out = []
    for sd in sorted(set(ch) & set(ref) & set(eq)):
        m1, m2 = ref[sd]["metrics"], eq[sd]["metrics"]
        sc, s1, s2 = ch[sd]["metrics"].get("useful_samples"), m1.get("useful_samples"), m2.get("useful_samples")
        l1, l2 = m1.get("final_val_loss"), m2.get("final_val_loss")
        if None in (sc, s1, s2, l1, l2):
            continue
        loss = l2 if s2 == s1 else l1 + (l2 - l1) * (sc - s1) / (s2 - s1)
        outside = 0.0 if s2 == s1 else max(0.0, min(s1, s2) - sc, sc - max(s1, s2)) / abs(s2 - s1)
        out.append({"config": name, "seed": sd, "churn": False, "status": "complete",
                    "metrics": {"final_val_loss": loss, "useful_samples": sc}, "outside": outside})
    return out


LOSS_GAP = 0.01  # issue 30: the final-loss gap against the run without events, as a share of that run's loss


def loss_gap_within(runs, name, refs=None):
    """Issue 30's test of a final-loss gap within 1%: the paired relative gap (churn - reference) /
    reference per seed, two one-sided tests against +-1% (equivalent only where both reject at 0.05),
    with the samples each churn run applied against its reference's. Against the references in `runs`
    the gap is at equal steps, not at equal applied samples (a crashed node's lost steps, or a
    joiner's added ones, change them); `refs` (the --equal-samples runs) are references whose step
    budget, and schedule, end where they have applied about the churn run's samples."""
    ch = {r["seed"]: r["metrics"] for r in runs if r["config"] == name and r["churn"] and r["status"] == "complete"}
    ref = {r["seed"]: r["metrics"] for r in (runs if refs is None else refs)
           if r["config"] == name and not r["churn"] and r["status"] == "complete"}
    seeds = sorted(s for s in ch if s in ref and ch[s]["final_val_loss"] is not None
                   and ref[s]["final_val_loss"] is not None)
    gaps = [ch[s]["final_val_loss"] / ref[s]["final_val_loss"] - 1.0 for s in seeds]
    samples = [ch[s]["useful_samples"] / ref[s]["useful_samples"] for s in seeds if ref[s].get("useful_samples")]
    t = tost(gaps, LOSS_GAP)
    # Beyond the margin, one-sided at 0.05 (the complements of the TOST's two tests): a gap that is not
    # within 1% may be shown outside it, or be neither.
    p_above = 1.0 - t["p_upper"] if t.get("p_upper") is not None else None
    p_below = 1.0 - t["p_lower"] if t.get("p_lower") is not None else None
    if t.get("deterministic"):
        verdict = "no seed variation: not a statistical result"
    elif t["n"] < 2:
        verdict = f"not resolved (n = {t['n']} paired seeds)"
    elif t["equivalent"]:
        verdict = f"within {LOSS_GAP:.0%} (TOST p {t['p']:.3g})"
    elif p_above is not None and p_above < 0.05:
        verdict = f"not within {LOSS_GAP:.0%}: shown above +{LOSS_GAP:.0%} (one-sided p {p_above:.3g})"
    elif p_below is not None and p_below < 0.05:
        verdict = f"not within {LOSS_GAP:.0%}: shown below -{LOSS_GAP:.0%} (one-sided p {p_below:.3g})"
    else:
        verdict = f"not shown within {LOSS_GAP:.0%} (TOST p {t['p']:.3g}), nor beyond it: not resolved"
    missing = sorted(str(sd) for sd in ch if sd not in seeds)
    steps_of = {r["seed"]: r["equal_samples"]["steps"] for r in (refs or [])
                if r["config"] == name and r.get("equal_samples") and r["status"] == "complete"}
    steps = sorted(steps_of[sd] for sd in seeds if sd in steps_of)
    return {"gaps": dict(zip(map(str, seeds), gaps)), "mean": t["mean"], "ci90": t["ci90"], "p": t["p"], "n": t["n"],
            "margin": LOSS_GAP, "equivalent": t["equivalent"], "verdict": verdict,
            "p_above": p_above, "p_below": p_below, "missing_seeds": missing,
            "reference_steps_per_seed": {str(sd): steps_of[sd] for sd in seeds if sd in steps_of},
            "samples_ratio": [min(samples), max(samples)] if samples else None,
            "reference_steps": [steps[0], steps[-1]] if steps else None}


def f3(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def time_to_target_cell(m):
    if m.get("time_to_target_s") is not None:
        return f3(m["time_to_target_s"], 1)
    return "n/a" if m.get("target_loss") is None else "not reached"


def run_cells(r):
    """The Markdown cells of one run (the test reads them back against churn.json)."""
    m = r["metrics"]
    lost = m["lost_steps"]
    kind = ("churn" if r["churn"] else f"reference at equal samples ({r['equal_samples']['steps']} steps)"
            if r.get("equal_samples") else "reference")
    return [r["config"], str(r["seed"]), kind, f3(m["goodput"]),
            f3(m["useful_samples"], 0), f3(m["time_to_end_s"], 1), time_to_target_cell(m),
            f"{f3(lost['total'], 1)} ({f3(lost['dropped'], 1)} / {lost['recomputed']} / {lost['in_flight_at_crash']})",
            f"{m['events_applied']}/{m['events_planned']}", f"{m['events_happened']}", f"{m['events_survived']}",
            str(m["hangs"]), "n/a" if m["duplicate_data"] is None else str(m["duplicate_data"]),
            "n/a" if m.get("exactly_once") is None else ("yes" if m["exactly_once"]["ok"] else "NO"),
            f3(m["final_val_loss"], 4), f3(m["longest_stall_s"], 2), r["status"]]


RUN_HEAD = ["configuration", "seed", "run", "goodput", "useful samples", "time to end, s", "time to target, s",
            "lost steps (dropped / recomputed / in flight)", "events applied/planned", "happened", "survived",
            "hangs", "duplicate data", "updates exactly once", "final val loss", "longest stall, s", "status"]


def definitions(s):
    st = s["settings"]
    return [
        f"- **goodput** = useful samples applied / samples the present nodes could have computed in the same wall "
        f"time at the modelled step time ({st['step_time']:g} s). Useful samples = {st['batch']} samples per step x "
        "(distinct (node, step) pairs in the nodes' metrics.jsonl over all their incarnations, minus the servers' "
        "dropped pushes in steps: each shard's `dropped` x its share of the parameters); for ring_diloco_elastic, "
        f"{st['batch']} x H = {st.get('sync_every', 10)} x the sum over the rounds applied of the nodes whose deltas "
        "they averaged (a round's last step logged with its `world`, or the survivors' `applied by the N member(s)` "
        "line when a lost node broke it): a partial round lost with its node is not useful; for local SGD on "
        f"parameter servers (ps_diloco_elastic, ps_async_local_sgd), {st['batch']} x H x (the rounds the nodes pushed, "
        "i.e. logged their last step, minus the servers' dropped pushes). Present samples = "
        f"{st['batch']} x (sum over every worker process, or ring launcher, of launch-to-exit-or-kill seconds) / "
        f"{st['step_time']:g} s. Start-up, waiting and restarts count against it: a run without events is below 1 too.",
        "- **time to end**: the first worker's launch to the last worker's exit.",
        (f"- **time to target**: the first worker's launch to the first evaluation, by any node, at or below "
         f"{st['target_loss']:g} (validation loss on the same held-out set, every {st['eval_every']} steps and the "
         "job's final one). At that moment a ring node holds the job's replica, a ps node the servers' weights of its "
         "last reply (at most a step old), and a local SGD node (evaluations at round boundaries) the outer step's "
         "result; taking the first of the nodes favours runs with more nodes evaluating (a joiner) by the spread "
         "between nodes' copies. 'not reached': within the run; the paired comparison uses the seeds where both runs "
         "reached it." if st.get("eval_every") else
         "- **time to target**: n/a (no evaluation during the runs: `--eval-every 0`)."),
        "- **lost steps**: dropped (as above; ring_diloco_elastic: node steps computed, logged or redone, minus "
        "those applied — at least the partial rounds lost, fewer where a resumed node's log was cut back to its "
        "checkpoint) + recomputed ((node, step) pairs logged more than once: the ring's "
        "steps past the checkpoint it resumes from, or a ps replay answered as a duplicate) + in flight at a crash "
        "(1 per kill9 of a node that was stepping, i.e. logged a step in the last second; on the ring also 1 per worker "
        "that failed because a peer was lost, "
        "the launchers' `worker failed` lines; on the elastic ring 1 per step a node abandoned because the ring broke, "
        "its `the ring broke at step` lines).",
        "- **events**: applied = the signal reached a live process or the joiner started; happened = the logs show "
        "it (`joined the running job`, the `SIGTERM: node R stopped` line with exit 0, a SIGKILLed process) and the "
        "node, back or new, logged a step after it; survived = happened and the run completed.",
        f"- **hang**: a live node process below train.steps with no new step line for more than {st['hang_s']:g} s "
        "(its start-up counted from its launch), or a run past its time limit; a hang ends the run as failed.",
        "- **duplicate data**: data_position values logged more than once across the job's nodes (the servers' "
        "grants; must be 0 for elastic ps; ps local SGD: the steps of pushed rounds, a node's last record of each "
        "step, since a partial round lost with its node is redone on the same grant); on the elastic ring, whose nodes all log the step's shared position, a "
        "position logged for more than one step plus the steps whose nodes logged different positions (must be 0). "
        "The fixed ring logs no data_position (its order follows the step): n/a.",
        "- **final val loss**: node 0's job_final record (the job's shipped weights) on one held-out set "
        f"({st['val_windows']} windows, the same for every run); the gap is churn - reference of the same "
        "configuration and seed. A join adds a node (more samples per BSP round, more updates under ASP) and a "
        "crash or preemption removes one for a while, so churn may end above or below its reference: the useful "
        "samples column says what each run applied.",
        "- **updates exactly once** (ps): every acknowledged push applied and none twice, by the shards' own "
        "`updates` (a push is acknowledged when its node logs the step; local SGD: the round's last step). BSP: every "
        "shard applied exactly one update per round of the job; BSP with backup workers: every acknowledged gradient "
        "used in a round or dropped as late, once (used + dropped - acknowledged in [0, crashes]; the rounds can "
        "outnumber the clocks there); ASP: each shard's updates minus the acknowledged "
        "pushes is in [0, crashes] (a crashed node's last push may be applied unanswered). n/a on the ring, whose "
        "checks are the duplicate data and every node ending at the job's last step.",
        "- **longest stall**: the longest time between two consecutive step lines of any node of the job.",
    ]


def load_runs(runs_dir, name):
    """The runs of one invocation (RUNS_DIR/NAME/churn.json), or none where it is absent (the study tables)."""
    p = os.path.join(runs_dir, name, "churn.json")
    return json.load(open(p))["runs"] if os.path.exists(p) else []


def run_fields(r):
    """One run's figures as the study tables print them (docs/study/churn_scenario_*/table.py): goodput, lost
    steps, events happened/planned, hangs, duplicate data, exactly once, emulation health, longest stall, end
    time, status, final loss, and the shards' own counts of their checkpoint writes and journal records."""
    m = r["metrics"]
    srv = r.get("server_stats") or []
    return dict(run=r, g=m["goodput"], lost=m["lost_steps"]["total"], ev=f'{m["events_happened"]}/{m["events_planned"]}',
                hang=m["hangs"], dup=m["duplicate_data"], eo=(m.get("exactly_once") or {}).get("ok"),
                over=m["overrun_share"], cpu=m["cpu_util"], stall=m["longest_stall_s"], end=m["time_to_end_s"],
                status=r["status"], fl=m["final_val_loss"],
                snaps=[s.get("checkpoint_snapshots", 0) for s in srv],
                syncw=[s.get("checkpoint_sync_writes", 0) for s in srv],
                syncs=[round(s.get("checkpoint_sync_write_s", 0.0), 1) for s in srv],
                recs=[s.get("membership_records", "-") for s in srv])


def node_phases(r):
    """Where a run's present time went at its edges (the study tables' start-up and tail): each node's start-up,
    its launch to its first step (the nodes that started the job, logged step 1 and ran to the end), and each
    node's tail, its last step to its exit (every incarnation that exited), seconds, from a churn.json run."""
    starts, tails = [], []
    for i in r["incarnations"]:
        f = os.path.join(r["dir"], f"node{i['node']}", "metrics.jsonl")
        if not os.path.exists(f):
            continue
        steps = [json.loads(line) for line in open(f) if '"loss"' in line]
        if not steps:
            continue
        if i["inc"] == 0 and steps[0]["step"] == 1 and i["ended_by"] == "exit":
            starts.append(steps[0]["unix_s"] - i["start_unix"])
        if i["end_unix"] and i["ended_by"] == "exit":
            tails.append(i["end_unix"] - steps[-1]["unix_s"])
    return starts, tails


def reliability(runs):
    """The events of every churn run together (issue 30's "200 consecutive events"): what happened, what
    survived, hangs, and the exactly-once checks; each failure by name."""
    churned = [r for r in runs if r["churn"]]
    evs = [e for r in churned for e in r["events"]]
    applied = [e for e in evs if e["applied"]]
    once = [r for r in churned if r["metrics"].get("exactly_once") is not None]
    L = [f"- {len(evs)} events planned in {len(churned)} runs of {len({r['config'] for r in churned})} "
         f"configuration(s); {len(applied)} applied, {sum(1 for e in applied if e.get('happened'))} happened as the "
         f"logs show, {sum(1 for e in applied if e.get('survived'))} survived (the run completed after them); "
         f"{len(evs) - len(applied)} not possible (a join on the fixed ring, or the run ended first).",
         f"- runs complete: {sum(1 for r in churned if r['status'] == 'complete')} of {len(churned)}; hangs: "
         f"{sum(r['metrics']['hangs'] for r in churned)}; runs with duplicate data: "
         f"{sum(1 for r in churned if r['metrics']['duplicate_data'])}; ps runs whose updates were not exactly once: "
         f"{sum(1 for r in once if not r['metrics']['exactly_once']['ok'])} of {len(once)}."]
    for r in churned:
        if r["status"] != "complete":
            L.append(f"  - {r['config']} seed {r['seed']}: FAILED: {r['failure']}")
        eo = r["metrics"].get("exactly_once")
        if eo is not None and not eo["ok"]:
            L.append(f"  - {r['config']} seed {r['seed']}: updates not exactly once: {eo['why']}")
        for e in r["events"]:
            if e["applied"] and not e.get("survived"):
                L.append(f"  - {r['config']} seed {r['seed']}: event {e['i']} ({e['kind']} node {e['node']}) applied, "
                         f"{'happened' if e.get('happened') else 'not seen in the logs'}, not survived")
    return L


def read_gap_table(comps, key):
    """The Markdown table of a final-loss gap read on a line between two references (comps' `key`)."""
    L = ["| configuration | mean gap | 90% interval | n | verdict | read beyond the two references' samples, at most "
         "(share of the span between them) |", "|---|---|---|---|---|---|"]
    for c in comps:
        g = c[key]
        ci, o = g["ci90"], g.get("outside_max")
        L.append(f"| {c['config']} | {'-' if g['mean'] is None else format(g['mean'], '+.2%')} | "
                 f"{'-' if ci[0] is None else f'[{ci[0]:+.2%}, {ci[1]:+.2%}]'} | {g['n']} | {g['verdict']} | "
                 f"{'-' if o is None else format(o, '.2f')} |")
    return L


def write_report(s, out):
    st = s["settings"]
    runs = s["runs"]
    L = ["# Churn: nodes that come and go", "", f"Command: `{s['command']}`", "",
         f"Machine time: {s['machine_time_s']:.0f} s for {len(runs) + len(s.get('equal_runs', []))} runs ({s['host']}).", "",
         f"Setup: {st['nodes']} nodes, {st['steps']} steps of {st['step_time']:g} s modelled compute, batch {st['batch']} "
         f"(1 sample = {st['block']} tokens), the tiny GPT (n_embd 32, 2 heads, block 32), corpus {st['corpus']}; ps "
         f"configurations with {SERVERS} server shards, ps.worker_timeout_s={st['worker_timeout_s']:g}, every worker "
         f"--dist.elastic=true; checkpoint.every={st['checkpoint_every']} (each write held to "
         f"{st.get('checkpoint_s', 0):g} s, emulate.checkpoint_s; 0: its real duration"
         f"{'; written in the background, checkpoint.background' if st.get('checkpoint_background') else ''}) for every configuration"
         f"{'; the ps shards checkpoint as often in modelled time, each write held as long' + (' and written in the background (server.checkpoint_background)' if st.get('checkpoint_background') else ' on the request path') if st.get('server_checkpoints') else '; the ps shards write no checkpoints'}; ring_restart through "
         f"scripts/launch_node.sh --max-restarts {st['max_restarts']}; ring_elastic with a syncopate-rendezvous process; ring_diloco_elastic too, with "
         f"--dist.sync_every={st.get('sync_every', 10)} {' '.join(DILOCO_FLAGS)} (ps_diloco_elastic: the same flags; "
         f"ps_async_local_sgd: {' '.join(async_local_sgd_flags(st.get('async_outer_lr', 0.35)))}). Events: Poisson, {st['events_per_min']:g} per "
         f"minute of wall time, from {st['events_start_s']:g} s to {st['horizon_frac']:g} x the modelled length, at most "
         f"{st['max_events']} per run, delays {st['delay'][0]:g}-{st['delay'][1]:g} s; seeds "
         f"{', '.join(map(str, s['seeds']))}.", ""]
    if st.get("backend") == "sim":
        L += [f"**Backend: syncopate-sim** (virtual time, experiments/churn_sim.py), not processes: the same schedules, "
              f"flags and shard rules, real gradients, modelled compute and links ({st['sim_link_gbit']:g} Gbit/s), a "
              f"process's start-up modelled as {st['sim_start_s']:g} s (a restart's {st.get('sim_restart_s') or st['sim_start_s']:g} s), "
              f"its exit {st.get('sim_exit_s') or 0:g} s after its last step, step-time jitter {st.get('sim_jitter') or 0:g}, events half a poll after their times, "
              "deterministic. An event applied is one that happened (the simulator applies it at its time). Not measured here: host CPU, steps "
              "over their modelled time, hangs (the simulator fails a run that deadlocks), worker checkpoints (a crashed "
              "local SGD node resumes its inner state as of its last pushed round), messages lost with a crashed process.",
              ""]
    L += ["## Definitions", ""] + definitions(s)
    L += ["", "## Reliability (every run with events)", ""] + reliability(runs)
    L += ["", "## Schedules (the same for every configuration of a seed)", ""]
    for seed, evs in s["schedules"].items():
        desc = "; ".join(f"{e['t_s']:g} s {e['kind']} node {e['node']} (delay {e['delay_s']:g} s)" for e in evs)
        L.append(f"- seed {seed}: {desc or 'no event'}")
    for name in s["configs"]:
        L += ["", f"## {name}", ""]
        if name == "ring_restart":
            L += [f"Joins: {RING_JOIN}; a scheduled join is counted as planned and not applied.", ""]
        L += ["| " + " | ".join(RUN_HEAD) + " |", "|" + "---|" * len(RUN_HEAD)]
        for r in runs + s.get("equal_runs", []):
            if r["config"] == name:
                L.append("| " + " | ".join(run_cells(r)) + " |")
        mine = [r for r in runs if r["config"] == name]
        L.append("")
        for r in mine:
            if r["status"] != "complete":
                L.append(f"- seed {r['seed']} {'churn' if r['churn'] else 'reference'}: FAILED: {r['failure']}")
            for e in r["events"]:
                if e["kind"] == "join" and name == "ring_restart":
                    continue
                if not e.get("happened"):
                    why = e.get("why_not") or e.get("exit_note") or "the logs do not show it (see churn.json)"
                    L.append(f"- seed {r['seed']}: event {e['i']} ({e['kind']} node {e['node']} at {e['t_s']:g} s) "
                             f"did not happen as planned: {why}")
        for churn in (True, False):
            gp = mean_ci95([r["metrics"]["goodput"] for r in mine if r["churn"] == churn and r["status"] == "complete"],
                           lower=0.0)
            L.append(f"- goodput {'with churn' if churn else 'reference'}, mean over complete seeds [95% interval]: "
                     f"{fmt_ci(gp)} (n = {gp['n']})")
        ov = [r["metrics"]["overrun_share"] for r in mine if r["metrics"]["overrun_share"] is not None]
        cp = [r["metrics"]["cpu_util"] for r in mine if r["metrics"]["cpu_util"] is not None]
        L.append(f"- emulation health: steps over their modelled time, largest share in a run: "
                 f"{f3(max(ov) if ov else None)}; host CPU while running, largest mean of a run: {f3(max(cp) if cp else None)}; "
                 f"machine time of these runs: {sum(r['elapsed_s'] for r in mine):.0f} s")
    L += ["", "## Churn against the reference (paired by seed, Holm over every line)", "",
          "| configuration | metric | churn - reference | 95% interval | p | Holm p | n | verdict |",
          "|---|---|---|---|---|---|---|---|"]
    for c in s["comparisons"]:
        ci = c["ci95"]
        interval = "-" if ci[0] is None else f"[{ci[0]:.4g}, {ci[1]:.4g}]"
        L.append(f"| {c['config']} | {c['metric']} | {'-' if c['mean_diff'] is None else format(c['mean_diff'], '.4g')} "
                 f"| {interval} | {'-' if c['p'] is None else format(c['p'], '.3g')} | "
                 f"{'-' if c.get('p_holm') is None else format(c['p_holm'], '.3g')} | {c['n']} | {c['verdict']} |")
    gaps = [c for c in s["comparisons"] if c.get("within_1pct")]
    if gaps:
        L += ["", "## Final-loss gap within 1% (issue 30: relative, paired by seed, two one-sided tests)", "",
              "| configuration | mean gap | 90% interval | n | verdict | churn samples / reference samples |",
              "|---|---|---|---|---|---|"]
        for c in gaps:
            g = c["within_1pct"]
            ci = g["ci90"]
            sr = g["samples_ratio"]
            L.append(f"| {c['config']} | {'-' if g['mean'] is None else format(g['mean'], '+.2%')} | "
                     f"{'-' if ci[0] is None else f'[{ci[0]:+.2%}, {ci[1]:+.2%}]'} | {g['n']} | {g['verdict']} | "
                     f"{'-' if sr is None else f'{sr[0]:.3f}-{sr[1]:.3f}'} |")
    gaps = [c for c in s["comparisons"] if c.get("within_1pct_equal_samples")]
    if gaps:
        L += ["", "## Final-loss gap at equal applied samples (--equal-samples; relative, paired by seed, two one-sided tests)",
              "", "Each reference here ran without events for steps x (the churn run's useful samples / the same seed's "
              "reference's), rounded (local SGD: to whole rounds), its schedule ending at that budget.", "",
              "| configuration | mean gap | 90% interval | n | verdict | churn samples / reference samples | reference steps |",
              "|---|---|---|---|---|---|---|"]
        for c in gaps:
            g = c["within_1pct_equal_samples"]
            ci, sr, rs = g["ci90"], g["samples_ratio"], g["reference_steps"]
            L.append(f"| {c['config']} | {'-' if g['mean'] is None else format(g['mean'], '+.2%')} | "
                     f"{'-' if ci[0] is None else f'[{ci[0]:+.2%}, {ci[1]:+.2%}]'} | {g['n']} | {g['verdict']} | "
                     f"{'-' if sr is None else f'{sr[0]:.3f}-{sr[1]:.3f}'} | {'-' if rs is None else f'{rs[0]}-{rs[1]}'} |")
        inter = [c for c in gaps if c.get("within_1pct_interpolated")]
        if inter:
            L += ["", "The same gap against a reference read at exactly the churn run's applied samples (`interpolated_"
                  "references`): the final losses of the two references, at equal steps and at the rounded budget above, "
                  "joined by a line in useful samples; it removes the rounding to whole rounds that leaves local SGD's "
                  "references up to a round off.", ""] + read_gap_table(inter, "within_1pct_interpolated")
        L += ["", "Per seed: the gap at equal steps, at equal applied samples, and what the longer reference gained "
              "over the equal-steps one (its final loss relative to it).", "",
              "| configuration | seed | reference steps | gap at equal steps | gap at equal samples | reference's gain |",
              "|---|---|---|---|---|---|"]
        for c in gaps:
            g, g0 = c["within_1pct_equal_samples"], c["within_1pct"]
            for sd, x in g["gaps"].items():
                x0 = g0["gaps"].get(sd)
                gain = None if x0 is None else (1 + x0) / (1 + x) - 1  # equal-samples reference / equal-steps one - 1
                L.append(f"| {c['config']} | {sd} | {g['reference_steps_per_seed'].get(sd, '-')} | "
                         f"{'-' if x0 is None else format(x0, '+.2%')} | {x:+.2%} | {'-' if gain is None else format(-gain, '+.2%')} |")
            if g["missing_seeds"]:
                L.append(f"| {c['config']} | {', '.join(g['missing_seeds'])} | no paired reference at equal samples "
                         "(a run failed) | | | |")
    batch = [c for c in s["comparisons"] if c.get("within_1pct_batch")]
    if batch:
        src = sorted({(r.get("width", f"batch {r['batch']}"), r["source"]) for r in s.get("batch_runs", [])})
        L += ["", "## Final-loss gap at equal steps and equal applied samples (report --batch-references)", "",
              f"References at this study's {s['settings']['steps']} steps applying the churn run's samples: per seed, the "
              f"reference above ({s['settings']['nodes']} nodes, batch {s['settings']['batch']}) and a run without events at "
              f"{', '.join(w for w, _ in src)} (`{'`, `'.join(c for _, c in src)}`) joined by a line in useful samples, read "
              "at the churn run's samples. Where the churn run's extra samples came as larger rounds (a joiner), this "
              "reference takes them as larger rounds too, so the gap leaves out what more steps would have gained.", ""]
        L += read_gap_table(batch, "within_1pct_batch")
        L += ["", "| configuration | seed | gap at equal steps and samples |", "|---|---|---|"]
        for c in batch:
            for sd, x in c["within_1pct_batch"]["gaps"].items():
                L.append(f"| {c['config']} | {sd} | {x:+.2%} |")
    L += ["", "## Not built", ""]
    for name, nb in s["not_built"].items():
        L.append(f"- {name} (`{' '.join(nb['flags'])}`): not built; the worker "
                 + ("refuses it: " if nb["refused"] else "answered: ") + f"`{nb['message']}`")
    L.append(f"- ring_restart's joins: {RING_JOIN}.")
    if s.get("plot"):
        L += ["", f"![goodput]({os.path.basename(s['plot'])})"]
    text = "\n".join(L) + "\n"
    with open(os.path.join(out, "churn.md"), "w") as f:
        f.write(text)
    return text


def plot(s, out):
    plt = pyplot()
    if plt is None:
        return None
    names = s["configs"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for k, churn in enumerate((False, True)):
        xs, ys = [], []
        for j, n in enumerate(names):
            for r in s["runs"]:
                if r["config"] == n and r["churn"] == churn and r["metrics"]["goodput"] is not None:
                    xs.append(j + (0.15 if churn else -0.15))
                    ys.append(r["metrics"]["goodput"])
        ax.scatter(xs, ys, label="churn" if churn else "reference", marker="o" if churn else "s")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set_ylabel("goodput")
    ax.set_ylim(0, 1.05)
    ax.legend()
    ax.grid(alpha=0.3)
    path = os.path.join(out, "churn.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the configurations with and without churn")
    r.add_argument("--out", default=os.path.join(ROOT, "runs", "churn"))
    r.add_argument("--seeds", type=int, default=3)
    r.add_argument("--first-seed", type=int, default=0)
    r.add_argument("--events-per-min", type=float, default=30.0, help="Poisson rate of events per minute of wall time")
    r.add_argument("--max-events", type=int, default=3, help="at most this many events per run")
    r.add_argument("--events-start-s", type=float, default=1.0, help="no event before this (after every node stepped)")
    r.add_argument("--horizon-frac", type=float, default=0.55,
                   help="no event after this fraction of the modelled length (steps x step time)")
    r.add_argument("--delay", default="1,3", help="a crashed or preempted node's delay before it comes back, s: LO,HI")
    r.add_argument("--recover-s", type=float, default=4.0,
                   help="the schedule leaves a node alone this long after its return")
    r.add_argument("--steps", type=int, default=120)
    r.add_argument("--nodes", type=int, default=3)
    r.add_argument("--configs", default=",".join(CONFIGS),
                   help=f"of {', '.join(CONFIGS)} (and {', '.join(NOT_BUILT)}: reported as not built)")
    r.add_argument("--step-time", type=float, default=0.1, help="modelled compute seconds per step")
    r.add_argument("--batch", type=int, default=2)
    r.add_argument("--sync-every", type=int, default=10, help="local SGD configurations (ring_diloco_elastic, ps_diloco_elastic, ps_async_local_sgd): inner steps per round")
    r.add_argument("--async-outer-lr", type=float, default=0.1,
                   help="ps_async_local_sgd's --dist.outer_lr (delayed Nesterov, momentum 0.9): 0.1 was tuned on seeds "
                   "1000-1002 of the default setup (docs/study/churn_lossgap10_als/tuning.md; 0.35 diverged); tune it "
                   "on seeds of its own for another setup")
    r.add_argument("--checkpoint-every", type=int, default=10)
    r.add_argument("--checkpoint-s", type=float, default=0.0,
                   help="emulate.checkpoint_s: the modelled duration of one checkpoint write, s (0: the real one)")
    r.add_argument("--checkpoint-background", action="store_true",
                   help="--checkpoint.background=true for every configuration: the periodic checkpoints are written "
                        "from a host-memory snapshot on a background thread (held to --checkpoint-s there), the run's "
                        "last one (its end, a SIGTERM) on the training thread")
    r.add_argument("--server-checkpoints", action="store_true",
                   help="ps configurations: the server shards checkpoint too (--server.checkpoint_dir), as often as the "
                        "nodes in modelled time (nodes x --checkpoint-every steps' updates), each write held to "
                        "--checkpoint-s (server.checkpoint_s), in the background with --checkpoint-background "
                        "(server.checkpoint_background); without it the shards write none")
    r.add_argument("--val-windows", type=int, default=64)
    r.add_argument("--losses-at-round-boundaries", action="store_true",
                   help="local SGD configurations only: a kill9 waits until its node has just logged a round's last "
                        "step, a sigterm until it computes one, so that no partial round is dropped (the events keep "
                        "their order, later ones wait behind, usually by under a round); the control for what "
                        "dropped rounds cost")
    r.add_argument("--eval-every", type=int, default=0,
                   help="eval.every of the workers: evaluate every K steps, for the time to target (0: only the job's "
                        "final evaluation, no time to target); local SGD configurations need a multiple of --sync-every")
    r.add_argument("--target-loss", type=float, default=3.2,
                   help="the validation loss whose first crossing is the time to target (with --eval-every). With the "
                        "defaults (one seed, seen once), ASP crossed 3.2 near step 40 of 120 and the elastic ring near step "
                        "70; DiLoCo (ps) stayed above it")
    r.add_argument("--worker-timeout-s", type=float, default=4.0, help="ps.worker_timeout_s of the servers")
    r.add_argument("--timeout-s", type=float, default=30.0, help="dist.timeout_s of the workers")
    r.add_argument("--max-restarts", type=int, default=20, help="the ring launchers' --max-restarts")
    r.add_argument("--hang-s", type=float, default=30.0, help="a node silent this long while not done is a hang")
    r.add_argument("--run-timeout-s", type=float, default=0.0, help="a run's limit (0: 3 x modelled + 60 s + 15 s/event)")
    r.add_argument("--no-reference", action="store_true", help="skip the runs without events")
    r.add_argument("--equal-samples", action="store_true",
                   help="per configuration and seed, also a run without events whose step budget (and schedule) ends "
                        "where it has applied about the churn run's samples: the final-loss gap at equal applied samples")
    r.add_argument("--corpus", default="system", help="data.corpus (default: the Python standard library)")
    r.add_argument("--backend", choices=("emulated", "sim"), default="emulated",
                   help="emulated: processes on loopback in wall time; sim: syncopate-sim's virtual-time cluster "
                        "(experiments/churn_sim.py: elastic parameter-server configurations only, deterministic)")
    r.add_argument("--sim-start-s", type=float, default=1.0,
                   help="--backend sim: modelled seconds from a worker's launch to its first step (sim.start_s; the "
                        "emulated runs' launch-to-first-step, docs/PERFORMANCE.md)")
    r.add_argument("--sim-restart-s", type=float, default=0.0,
                   help="--backend sim: the same for a restarted or new worker (sim.restart_s; 0 = --sim-start-s)")
    r.add_argument("--sim-exit-s", type=float, default=0.0,
                   help="--backend sim: a worker's last step to its process's exit (sim.exit_s)")
    r.add_argument("--sim-jitter", type=float, default=0.0,
                   help="--backend sim: emulate.jitter of every worker (seeded, per step): without it the simulated nodes "
                        "step in lockstep and arrive at the shards in one fixed order, which biases delayed Nesterov "
                        "(docs/PERFORMANCE.md, 'Churn in the simulator'); a small value gives the seed one other "
                        "ordering, as the emulated nodes' timing noise does")
    r.add_argument("--sim-link-gbit", type=float, default=10.0,
                   help="--backend sim: every worker's and shard's link, Gbit/s (loopback carries more; the tiny model's "
                        "messages take well under a millisecond either way)")
    r.add_argument("--cache-dir", default=os.path.join(ROOT, "data", "cache"))
    p = sub.add_parser("report", help="rewrite DIR/churn.md (and the plot) from DIR/churn.json")
    p.add_argument("dir")
    p.add_argument("--batch-references", metavar="DIR2",
                   help="a churn.py run directory of the same setup and seeds without events (--events-per-min 0 "
                        "--no-reference) at a larger --batch, or on more --nodes at the same batch: the final-loss gap at equal steps and equal applied samples "
                        "at once (each seed's reference and DIR2's run joined by a line in samples); kept in churn.json")
    a = ap.parse_args(argv)
    if a.cmd == "run":
        # Absolute: every process runs in its own log directory.
        a.out, a.cache_dir = os.path.abspath(a.out), os.path.abspath(a.cache_dir)
        if a.corpus != "system":
            a.corpus = os.path.abspath(a.corpus)
        a.delay = tuple(float(x) for x in a.delay.split(","))
        names = [n for n in a.configs.split(",") if n]
        bad = [n for n in names if n not in CONFIGS and n not in NOT_BUILT]
        if bad:
            ap.error(f"unknown configuration(s) {', '.join(bad)}; known: {', '.join(list(CONFIGS) + list(NOT_BUILT))}")
        a.config_list = names
        if a.eval_every < 0:
            ap.error(f"--eval-every {a.eval_every}: give 0 (no evaluation during the run) or a step count")
        local = [n for n in names if CONFIGS.get(n, {}).get("local_sgd")]
        if a.eval_every and local and a.eval_every % a.sync_every:
            ap.error(f"--eval-every {a.eval_every} is not a multiple of --sync-every {a.sync_every}: {', '.join(local)} "
                     "would evaluate a node's weights in the middle of a round, not the job's model; give a multiple")
        if a.losses_at_round_boundaries and [n for n in names if not CONFIGS.get(n, {}).get("local_sgd")]:
            ap.error("--losses-at-round-boundaries applies to local SGD configurations only (ring_diloco_elastic, "
                     "ps_diloco_elastic, ps_async_local_sgd): drop the others from --configs")
        ring = [n for n in names if CONFIGS.get(n, {}).get("kind") == "ring" or n in NOT_BUILT]
        if a.backend == "sim" and ring:
            ap.error(f"--backend sim models elastic parameter servers only: drop {', '.join(ring)} from --configs (the "
                     "ring runs on the emulated cluster)")
        if a.equal_samples and a.no_reference:
            ap.error("--equal-samples needs the references (it scales their budget): drop --no-reference")
    return a


BATCH_CONTROL_KEYS = ("steps", "step_time", "sync_every", "checkpoint_every", "val_windows", "corpus",
                      "worker_timeout_s")


def batch_references(s, d):
    """report --batch-references: DIR2's runs, checked to be the same setup as s but wider -- a larger batch
    on the same nodes, or more nodes at the same batch (local SGD: a joiner's samples come as one more node's
    delta) -- and no event, as references (their own width and command recorded)."""
    try:
        with open(os.path.join(d, "churn.json")) as f:
            b = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"churn: --batch-references {d}: no readable churn.json ({e}); give a churn.py run directory")
    st, bt = s["settings"], b["settings"]
    differ = [k for k in BATCH_CONTROL_KEYS if st.get(k) != bt.get(k)]
    if "ps_async_local_sgd" in s.get("configs", []) and any(r["config"] == "ps_async_local_sgd" for r in b["runs"]) and \
            st.get("async_outer_lr", 0.35) != bt.get("async_outer_lr", 0.35):  # (records before the option: 0.35;
        # it matters only where both compare asynchronous local SGD)
        differ.append("async_outer_lr")
    if differ:
        raise SystemExit(f"churn: --batch-references {d} differs from {s['command']} in {', '.join(differ)}: it must be the "
                         "same setup, only --batch or --nodes larger")
    wider_batch = bt.get("batch", 0) > st.get("batch", 0) and bt.get("nodes") == st.get("nodes")
    wider_nodes = bt.get("nodes", 0) > st.get("nodes", 0) and bt.get("batch") == st.get("batch")
    if not (wider_batch or wider_nodes):
        raise SystemExit(f"churn: --batch-references {d} ran {bt.get('nodes')} nodes at batch {bt.get('batch')}, this study "
                         f"{st.get('nodes')} at batch {st.get('batch')}: run it with a larger --batch on the same nodes, or "
                         "more --nodes at the same batch (one of the two)")
    evented = [f"{r['config']} seed {r['seed']}" for r in b["runs"] if r.get("events")]
    if evented:
        raise SystemExit(f"churn: --batch-references {d} has runs with events ({', '.join(evented[:3])}): run it with "
                         "--events-per-min 0 --no-reference")
    width = f"batch {bt['batch']}" if wider_batch else f"{bt['nodes']} nodes"
    return [dict(r, churn=False, batch=bt["batch"], width=width, source=b["command"]) for r in b["runs"]]


def run_fresh(a, name, seed, events, kind):
    """One run of configuration `name` (events: its churn schedule, [] for a reference) under
    OUT/runs/<name>/<kind>/seed<seed>/, made from nothing: what an earlier run left there is removed."""
    out = os.path.join(a.out, "runs", name, kind, f"seed{seed}")
    shutil.rmtree(out, ignore_errors=True)
    if getattr(a, "backend", "emulated") == "sim":
        import churn_sim  # noqa: E402 (it imports this module)
        return churn_sim.execute(a, name, seed, events, out)
    return Run(a, name, seed, events, out).execute()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    if a.cmd == "report":
        with open(os.path.join(a.dir, "churn.json")) as f:
            s = json.load(f)
        for r in s["runs"]:  # the rule as it is now, from each run's stored shard stats and counts
            if r["metrics"].get("exactly_once") is not None and r.get("server_stats"):
                cfg = CONFIGS[r["config"]]
                every = s["settings"].get("sync_every", 1) if cfg.get("local_sgd") else 1
                crashes = sum(1 for e in r["events"] if e["applied"] and e["kind"] == "kill9")
                acked = r["metrics"].get("acknowledged_pushes", r["metrics"]["distinct_steps"] if every == 1 else None)
                if acked is not None:
                    r["metrics"]["exactly_once"] = exactly_once(cfg, r["server_stats"], acked, crashes,
                                                                s["settings"]["steps"] // every)
        if a.batch_references:
            s["batch_runs"] = batch_references(s, a.batch_references)
        s["comparisons"] = compare(s["runs"], s["configs"], s.get("equal_runs", []), s.get("batch_runs", []),
                                   bool(s["settings"].get("eval_every")))
        s["plot"] = plot(s, a.dir)
        with open(os.path.join(a.dir, "churn.json"), "w") as f:
            json.dump(s, f, indent=1, default=str)
        print(write_report(s, a.dir))
        return 0
    for b in ("syncopate-sim",) if a.backend == "sim" else ("syncopate-worker", "syncopate-server"):
        if not os.path.exists(os.path.join(BIN, b)):
            print(f"churn: {BIN}/{b} is not built (scripts/build.sh)", file=sys.stderr)
            return 2
    runnable = [n for n in a.config_list if n in CONFIGS]
    seeds = list(range(a.first_seed, a.first_seed + a.seeds))
    schedules = {str(sd): draw_schedule(sd, a.events_per_min, a.steps, a.step_time, a.nodes, a.max_events,
                                        a.events_start_s, a.horizon_frac, a.delay, a.recover_s) for sd in seeds}
    os.makedirs(a.out, exist_ok=True)
    plan = [(n, sd, churn) for sd in seeds for n in runnable for churn in ((True,) if a.no_reference else (True, False))]
    print(f"[churn] {len(plan)} runs ({len(runnable)} configurations x {len(seeds)} seeds x "
          f"{'churn' if a.no_reference else 'churn + reference'}), {a.nodes} nodes, {a.steps} steps of {a.step_time:g} s; "
          f"out {a.out}", flush=True)
    for sd, evs in schedules.items():
        print(f"[churn] seed {sd}: " + ("; ".join(f"{e['t_s']:g} s {e['kind']} node {e['node']}" for e in evs)
                                         or "no event"), flush=True)
    old = {sg: signal.signal(sg, _on_signal) for sg in (signal.SIGINT, signal.SIGTERM)}
    t0 = time.time()
    runs, equal_runs, churn_run = [], [], {}
    s = {"format": FORMAT, "command": "experiments/churn.py " + " ".join(shlex.quote(x) for x in argv),
         "host": f"{os.uname().nodename}, {os.cpu_count()} cores", "started_unix_s": t0,
         "settings": {"nodes": a.nodes, "steps": a.steps, "step_time": a.step_time, "batch": a.batch, "block": 32,
                      "checkpoint_every": a.checkpoint_every, "checkpoint_s": a.checkpoint_s,
                      "checkpoint_background": a.checkpoint_background, "server_checkpoints": a.server_checkpoints,
                      "val_windows": a.val_windows,
                      "worker_timeout_s": a.worker_timeout_s, "timeout_s": a.timeout_s, "max_restarts": a.max_restarts,
                      "hang_s": a.hang_s, "events_per_min": a.events_per_min, "max_events": a.max_events,
                      "events_start_s": a.events_start_s, "horizon_frac": a.horizon_frac, "delay": list(a.delay),
                      "recover_s": a.recover_s, "corpus": a.corpus, "servers": SERVERS, "sync_every": a.sync_every,
                      "async_outer_lr": a.async_outer_lr, "eval_every": a.eval_every, "target_loss": a.target_loss,
                      "losses_at_round_boundaries": a.losses_at_round_boundaries, "backend": a.backend,
                      "sim_start_s": a.sim_start_s if a.backend == "sim" else None,
                      "sim_restart_s": a.sim_restart_s if a.backend == "sim" else None,
                      "sim_exit_s": a.sim_exit_s if a.backend == "sim" else None,
                      "sim_jitter": a.sim_jitter if a.backend == "sim" else None,
                      "sim_link_gbit": a.sim_link_gbit if a.backend == "sim" else None},
         "seeds": seeds, "configs": runnable, "schedules": schedules}
    try:
        for name, sd, churn in plan:
            r = run_fresh(a, name, sd, schedules[str(sd)] if churn else [], "churn" if churn else "reference")
            runs.append(r)
            m = r["metrics"]
            print(f"[churn] {name} seed {sd} {'churn' if churn else 'reference'}: {r['status']} in {r['elapsed_s']:.1f} s; "
                  f"goodput {f3(m['goodput'])}, end {f3(m['time_to_end_s'], 1)} s, events "
                  f"{m['events_happened']}/{m['events_planned']} happened, lost {f3(m['lost_steps']['total'], 1)} steps, "
                  f"duplicate data {m['duplicate_data']}, final val loss {f3(m['final_val_loss'], 4)}"
                  + (f"; {r['failure']}" if r["failure"] else ""), flush=True)
            if churn:
                churn_run[(name, sd)] = r
            if a.equal_samples and not churn:  # the churn run of (name, sd) came just before
                ch = churn_run.get((name, sd))
                steps = (equal_budget(a, CONFIGS[name], ch["metrics"], m)
                         if ch and ch["status"] == "complete" and r["status"] == "complete" else None)
                if steps is None:
                    print(f"[churn] {name} seed {sd}: no reference at equal samples (a run failed or counted no samples)",
                          flush=True)
                    continue
                e = run_fresh(argparse.Namespace(**dict(vars(a), steps=steps)), name, sd, [], "equal")
                e["equal_samples"] = {"steps": steps, "churn_useful_samples": ch["metrics"]["useful_samples"],
                                      "reference_useful_samples": m["useful_samples"]}
                equal_runs.append(e)
                print(f"[churn] {name} seed {sd} reference at equal samples ({steps} steps): {e['status']} in "
                      f"{e['elapsed_s']:.1f} s; useful samples {f3(e['metrics']['useful_samples'], 0)} against the churn "
                      f"run's {f3(ch['metrics']['useful_samples'], 0)}, final val loss {f3(e['metrics']['final_val_loss'], 4)}"
                      + (f"; {e['failure']}" if e["failure"] else ""), flush=True)
    except _Interrupted as e:
        print(f"[churn] interrupted ({e}): every process this script started was ended; partial results follow",
              file=sys.stderr, flush=True)
        s["interrupted"] = True
    finally:
        for sg, h in old.items():
            signal.signal(sg, h)
    s["runs"] = runs
    if a.equal_samples:
        s["equal_runs"] = equal_runs
    s["machine_time_s"] = time.time() - t0
    s["comparisons"] = compare(runs, runnable, equal_runs, time_to_target=bool(a.eval_every))
    s["not_built"] = {n: v for n, v in not_built().items()}
    s["plot"] = plot(s, a.out)
    with open(os.path.join(a.out, "churn.json"), "w") as f:
        json.dump(s, f, indent=1, default=str)
    write_report(s, a.out)
    print(f"[churn] {len(runs)} runs in {s['machine_time_s']:.0f} s: {a.out}/churn.md, {a.out}/churn.json", flush=True)
    failed = [r for r in runs + equal_runs if r["status"] != "complete"]
    return 130 if s.get("interrupted") else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
