"""One run of one configuration on an emulated cluster (scripts/local_cluster.sh), and what the
study needs from it: the validation curve on an evaluation-free clock, global tokens, staleness,
the emulation's own health (overrun share, host CPU use). Depends on the core only through its
binaries, scripts and metrics files."""
import contextlib
import fcntl
import glob
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import threading
import time

import scenario as scen

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERRUN_LIMIT = 0.05  # default: a run with more steps over their modelled time than this is invalid
CPU_LIMIT = 0.90      # default: a run whose host CPU use averaged above this is invalid (saturated cores)


_RUNNING = set()          # the process groups run_group started that have not ended (their leaders' Popen)
_RUNNING_LOCK = threading.Lock()
STOP_WAIT_S = 60.0        # how long a stopped group may take for its own cleanup (namespaces, servers) before SIGKILL
_SETPRIV = shutil.which("setpriv")  # util-linux: sets a run's parent-death signal (run_group)


def run_group(cmd, stdout):
    """Runs cmd in a process group of its own (a new session: a terminal's Ctrl-C reaches this
    process only) and returns its exit code. If this thread is interrupted (KeyboardInterrupt,
    SystemExit), or terminate_running() is called from another, the group gets SIGTERM and up to
    STOP_WAIT_S for its own cleanup (local_cluster.sh ends its nodes, servers and namespaces on
    TERM), then SIGKILL; the exception goes on. subprocess.run would SIGKILL the leader alone after
    0.25 s, cutting that cleanup short and leaving the group's other processes running. Where this
    process dies without a chance to stop it (SIGKILL), the group's leader gets SIGTERM from the kernel
    (its parent-death signal, set by util-linux setpriv before it execs cmd), so it cleans up alike."""
    if _SETPRIV:
        cmd = [_SETPRIV, "--pdeathsig", "TERM", "--", *cmd]
    p = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    with _RUNNING_LOCK:
        _RUNNING.add(p)
    try:
        return p.wait()
    except BaseException:
        _stop(p)
        raise
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(p)


def exit_on_sigterm():
    """SIGTERM ends this program as Ctrl-C does: SystemExit(143) in the main thread, so that run_group gives
    the group it is waiting on its TERM and cleanup (by default SIGTERM ends Python at once and leaves the
    running group behind, orphaned). Called first by every script that starts runs and has no SIGTERM handler of
    its own (hindsight.py and switch_midrun.py stop their lanes themselves)."""
    def _term(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _term)


def _stop(p):
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        p.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def terminate_running():
    """Stops every group run_group started and is still waiting on (from any thread); each caller's
    run_group then returns the group's exit code (not 0)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for p in running:
        _stop(p)


def cached_result(d, command):
    """The result.json in run directory d when it was made by `command` and did not fail, else None."""
    try:
        with open(os.path.join(d, "result.json")) as f:
            r = json.load(f)
    except (OSError, ValueError):
        return None
    return r if r.get("command") == command and "failed" not in r else None


_DIGESTS = {}
# What an emulated run executes besides the binaries (local_cluster.sh sources or runs these).
CLUSTER_SCRIPTS = ("local_cluster.sh", "launch_node.sh", "netns.sh", "lib.sh")
# Environment variables the launch scripts read that change a run.
CLUSTER_ENV = ("SYNCOPATE_TBF_QUEUE_MS", "SYNCOPATE_TBF_BURST_MS")


def file_digest(p):
    """sha256 of a file's bytes, cached per (path, size, mtime)."""
    st = os.stat(p)
    key = (p, st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        with open(p, "rb") as f:
            _DIGESTS[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return _DIGESTS[key]


_FIRST_INPUTS = {}  # run_inputs at this program's first run, per backend (_run_once refuses a change)
SIM_BUILT = os.path.join(ROOT, "build", "bin", "syncopate-sim")  # what scripts/build.sh makes
# sim_binary's copies, one folder per build (by its digest): beside the build they come from (scripts and
# tests leave the tree outside build/ as they found it; a fresh build/ starts without them)
SIM_PINS = os.path.join(ROOT, "build", "sim-pins")
_PINNED = []  # this program's copy, once made


def sim_binary():
    """The simulator this program runs, the same file for its whole life: at its first call, a copy of
    SIM_BUILT in SIM_PINS/<its sha256's first 16 hex digits>/ (made once per build, kept). A rebuild
    while a study runs then changes build/bin, not the study's runs: they all come from one build, and
    the path in every run's command line names that build. A later program pins the build it finds, or
    the file SYNCOPATE_SIM names (e.g. the pin under which a study's lanes ran, to publish it from their
    runs after a rebuild)."""
    if not _PINNED and os.environ.get("SYNCOPATE_SIM"):
        pin = os.path.abspath(os.environ["SYNCOPATE_SIM"])
        if not os.path.isfile(pin):
            raise SystemExit(f"study: SYNCOPATE_SIM={pin} is not a file (give a built syncopate-sim, e.g. one under "
                             f"{os.path.relpath(SIM_PINS, ROOT)}/)")
        _PINNED.append(pin)
    if not _PINNED:
        if not os.path.exists(SIM_BUILT):
            return SIM_BUILT  # (run_once reports it missing)
        os.makedirs(SIM_PINS, exist_ok=True)
        tmp = os.path.join(SIM_PINS, f".copy.{os.getpid()}")
        try:
            shutil.copy2(SIM_BUILT, tmp)  # first, then named by the copy's own bytes (a rebuild during the copy is harmless)
            with open(tmp, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            pin = os.path.join(SIM_PINS, digest[:16], "syncopate-sim")
            os.makedirs(os.path.dirname(pin), exist_ok=True)
            if not os.path.exists(pin):
                os.replace(tmp, pin)  # atomic: a concurrent lane finds the whole file or none
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        _PINNED.append(pin)
    return _PINNED[0]


def input_files(sim):
    """The binaries (and for emulated runs the launch scripts) a run executes."""
    bindir = os.path.join(ROOT, "build", "bin")
    if sim:
        return [sim_binary()]
    worker = os.environ.get("SYNCOPATE_WORKER") or os.path.join(bindir, "syncopate-worker")
    return ([worker, os.path.join(os.path.dirname(worker), "syncopate-server")]
            + [os.path.join(ROOT, "scripts", x) for x in CLUSTER_SCRIPTS])


def run_inputs(sim):
    """Everything besides its command line that makes a run what it is, for run_once's cache key: the
    binaries it executes (SYNCOPATE_WORKER's where set, as local_cluster.sh does), for emulated runs the
    launch scripts and the environment they read, the libtorch the binaries load (its library's size and
    time, not its bytes: a reinstall only costs a re-run) and the data cache's files (name, size, time).
    A run is taken back only when all of it is unchanged."""
    parts = [f"{os.path.relpath(p, ROOT)}={file_digest(p) if os.path.exists(p) else 'missing'}"
             for p in input_files(sim)]
    if not sim:
        parts += [f"{k}={os.environ.get(k, '')}" for k in CLUSTER_ENV]
    torch_lib = glob.glob(os.path.join(ROOT, ".venv", "lib", "python*", "site-packages", "torch", "lib",
                                       "libtorch_cpu.so"))
    for p in torch_lib[:1]:
        st = os.stat(p)
        parts.append(f"libtorch_cpu={st.st_size}:{st.st_mtime_ns}")
    cache = os.path.join(ROOT, "data", "cache")
    if os.path.isdir(cache):
        for name in sorted(os.listdir(cache)):
            st = os.stat(os.path.join(cache, name))
            parts.append(f"data/{name}={st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256(";".join(parts).encode()).hexdigest()


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


class CpuSampler:
    """Host CPU utilization (all cores, /proc/stat) sampled every `every` seconds on a thread; each
    sample is kept with the wall-clock time at its end."""

    def __init__(self, every=0.5):
        self.every, self.samples, self._stop = every, [], threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _read():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return sum(v), idle

    def _run(self):
        last = self._read()
        while not self._stop.wait(self.every):
            cur = self._read()
            dt, di = cur[0] - last[0], cur[1] - last[1]
            if dt > 0:
                self.samples.append((time.time(), 1.0 - di / dt))
            last = cur

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    def mean(self, window=None):
        """Mean utilization; window (unix_start, unix_end): only the samples that ended inside it
        (the training: start-up, the deferred scoring of evaluations after it and shutdown are not
        what the emulation's validity is about). None without samples there."""
        v = [u for t, u in self.samples if window is None or window[0] <= t <= window[1] + self.every]
        return sum(v) / len(v) if v else None


# The trainer's evaluation, schedule and overlap flags a study passes to every run (issue 25), in one
# place so that they follow the trainer's names. Each entry: job key -> flags ({} is the value).
TRAINER_FLAGS = {
    "val_windows": ["--eval.val_windows={}"],      # a held-out set of N windows fixed across seeds and configurations
    "defer": ["--eval.defer={}"],                  # evaluate snapshots of the shipped weights after training
    "every_tokens": ["--eval.every_tokens={}"],    # evaluate when the job's global tokens cross multiples of this
    "warmup_frac": ["--schedule.warmup_frac={}"],  # warmup as a fraction of train.steps
    "overlap": ["--emulate.overlap={}"],           # the pacer releases gradient regions at modelled times
}
# With overlap on, what each mode needs besides --emulate.overlap=true (the trainer refuses it otherwise,
# worker/train/run_config.cpp): the ring reduces buckets during backward (dist.overlap) and clips the
# job's gradient, not each node's (clip_scope=node needs the whole gradient first); parameter servers
# push each shard's part as backward finishes it (ps_push_in_backward), which needs clipping off. So
# that every mode clips alike, no mode clips (optim.grad_clip=0) when the study runs with overlap.
# Local SGD sends nothing during backward: it runs without emulate.overlap (clipping off too).
OVERLAP_MODE_FLAGS = {"ring": ["--dist.overlap=true", "--dist.clip_scope=job", "--optim.grad_clip=0"],
                      "ps": ["--dist.ps_push_in_backward=true", "--optim.grad_clip=0"],
                      "local_sgd": ["--optim.grad_clip=0"]}
# Study defaults (docs/STUDY.md, Method): 512 windows = 65,536 tokens at block 128.
STUDY_DEFAULTS = {"val_windows": 512, "defer": True, "overlap": True, "warmup_frac": 0.05}
# Fields of an evaluation record the tooling reads beyond step/time_s/val_loss (absent in old runs).
EVAL_FIELDS = ("eval_of", "val_tokens", "val_set", "global_tokens")
# Flags of an evaluation record a curve point keeps (absent where they do not apply): while_waiting,
# node 0 scoring the servers' values while it waits for a straggler at the job's end; job_final, the
# job's final weights; at_limit, syncopate-sim's score of the shipped weights at exactly the wall budget
# (sim.time_schedule). All are ordinary points of the curve, in time order (a while_waiting record
# shares its step with the job_final one: both are points).
POINT_FLAGS = ("while_waiting", "job_final", "job_final_partial", "at_limit")
# Model shapes the tooling needs before any run (model/gpt_config.cpp): vocabulary and block size.
PRESETS = {"micro": {"vocab": 257, "block": 64}, "tiny": {"vocab": 257, "block": 128},
           "small": {"vocab": 257, "block": 256}, "gpt2": {"vocab": 50257, "block": 1024},
           "gpt2-medium": {"vocab": 50257, "block": 1024}}


def _flag_value(v):
    return ("true" if v else "false") if isinstance(v, bool) else f"{v:.6g}" if isinstance(v, float) else str(v)


def _flags(key, value):
    return [f.format(_flag_value(value)) for f in TRAINER_FLAGS[key]]


def budget(cfg, em, job):
    """(steps per node, the straggler's steps or None). A study's plan (cfg "steps", "slow_steps":
    the token or wall-time budget fitted per configuration, study.plan_budgets) wins. Without one
    (old callers): the job's steps everywhere, except that a configuration that waits for no
    straggler ("elastic") gets slowdown x the steps on its fast nodes."""
    if "steps" in cfg:
        return cfg["steps"], cfg.get("slow_steps")
    if cfg.get("elastic") and em["step_time_s"] > 0 and em["slow_node"] >= 0 and em["slowdown"] > 1:
        return int(round(job["steps"] * em["slowdown"])), job["steps"]
    return job["steps"], None


def sync_every(cfg):
    """A configuration's local-SGD period H (1: per-step synchronization), from its worker flags."""
    h = 1
    for f in cfg.get("worker", []):
        if f.startswith("--dist.sync_every="):
            h = int(f.split("=", 1)[1])
    return h


def worker_flags(job, seed, lr, steps, ring=False, local_sgd=False, paced=True):
    """The worker's flags of one run, the same on the emulated cluster and in the simulator. A job
    with the study method's keys (TRAINER_FLAGS: val_windows, defer, every_tokens, warmup_frac,
    overlap) passes them; without them (old callers) the old flags: eval.every steps, eval.batches,
    warmup_steps, no overlap."""
    flags = [f"--model.preset={job['preset']}", f"--train.steps={steps}",
             f"--train.batch_size={job['batch']}", "--train.threads=1", f"--train.seed={seed}",
             f"--optim.lr={lr:.6g}", f"--schedule.min_lr={lr / 10:.6g}"]
    if job.get("warmup_frac") is not None:
        # warmup_steps = 0 too: the fraction sets the warmup, and a default step count must not be
        # checked against a short run's steps.
        flags += _flags("warmup_frac", job["warmup_frac"]) + ["--schedule.warmup_steps=0"]
    else:
        flags.append(f"--schedule.warmup_steps={job['warmup']}")
    if job.get("every_tokens"):
        flags += _flags("every_tokens", job["every_tokens"])
    else:
        flags.append(f"--eval.every={max(1, job['steps'] // job['evals'])}")
    if job.get("val_windows"):
        flags += _flags("val_windows", job["val_windows"])
    else:
        flags.append(f"--eval.batches={job['eval_batches']}")
    if job.get("defer") is not None:
        flags += _flags("defer", job["defer"])
    flags += ["--eval.sample_tokens=0", "--checkpoint.every=0", "--dist.check_every=0",
              f"--data.cache_dir={ROOT}/data/cache"]
    if job.get("sizes"):  # the scenario's message sizes, scaled as the link is (scenario.scaled_sizes)
        flags += scen.size_flags(job["sizes"])
    if job.get("overlap"):
        # Every mode with its overlap as users would run it: the pacer releases gradient regions at
        # modelled times in the modelled backward (ring buckets reduce, ps pushes leave).
        mode = "local_sgd" if local_sgd else "ring" if ring else "ps"
        flags += _flags("overlap", paced and not local_sgd) + OVERLAP_MODE_FLAGS[mode]
        return flags
    if job.get("overlap") is False:
        flags += _flags("overlap", False)
    flags.append("--dist.overlap=false")  # no mode overlaps communication with compute
    # Like for like: parameter servers combine gradients that each node clipped on its own,
    # so the ring clips each node's gradient before the nodes combine too.
    return flags + ["--dist.clip_scope=node"]


def run_simulator(cmd, out, failed):
    """Runs one syncopate-sim command that writes into `out` (its output in out/sim.log). Returns
    (sim.json, node 0's evaluation records, the run's real seconds). A non-zero exit ends the
    caller with `failed` (what ran), the exit code, the log's path and the command."""
    t0 = time.time()
    with open(os.path.join(out, "sim.log"), "w") as log:
        rc = run_group(cmd, log)
    if rc != 0:
        raise SystemExit(f"{failed} failed (exit {rc}); see {out}/sim.log\ncommand: {' '.join(cmd)}")
    with open(os.path.join(out, "sim.json")) as f:
        sim = json.load(f)
    evals = [m for m in read_jsonl(os.path.join(out, "node0", "metrics.jsonl")) if "val_loss" in m]
    return sim, evals, time.time() - t0


def cluster_command(cfg, em, job, seed, lr, out, trace=False):
    """local_cluster.sh arguments of one run. cfg: {"cluster": [...], "ring": bool}; em: the
    emulation (step_time_s, slow_node, slowdown, jitter, link_gbit, link_burst_ms, latency_ms); job: model,
    batch, steps."""
    cmd = [os.path.join(ROOT, "scripts", "local_cluster.sh"), "--nodes", str(job["nodes"]), "--out", out]
    if not cfg.get("ring"):
        # Like for like: the ring's links are authenticated, not encrypted, so the parameter-server
        # links of a study are too (encryption is measured on its own in docs/PERFORMANCE.md).
        cmd += ["--servers", str(job["servers"]), "--encrypt", "off"] + cfg["cluster"]
    steps, slow_steps = budget(cfg, em, job)
    if em["step_time_s"] > 0:
        cmd += ["--step-time", repr(em["step_time_s"]), "--jitter", repr(em["jitter"])]
        if em["slow_node"] >= 0 and em["slowdown"] > 1:
            cmd += ["--slow-node", str(em["slow_node"]), "--slowdown", repr(em["slowdown"])]
            if slow_steps:
                cmd += ["--slow-steps", str(slow_steps)]
    if em.get("link_gbit"):
        cmd += ["--netns", "--link-gbit", f"{em['link_gbit']:.6g}"]
        if em.get("link_burst_ms"):  # the links' tbf bucket in ms of the rate (absent: netns.sh's default)
            cmd += ["--link-burst-ms", f"{em['link_burst_ms']:.6g}"]
    if em.get("latency_ms"):
        cmd += ["--latency-ms", f"{em['latency_ms']:.6g}"]
    if trace:
        cmd += ["--trace"]  # every process's timeline, merged into OUT/trace.json
    return cmd + ["--"] + worker_flags(job, seed, lr, steps, cfg.get("ring", False), sync_every(cfg) > 1,
                                       em["step_time_s"] > 0) + jitter_tail_flags(em) + cfg.get("worker", [])


def jitter_tail_flags(em):
    """The trainer's heavy-tailed jitter flag where the emulation asks for it (none for exponential jitter)."""
    return [f"--emulate.jitter_tail={em['jitter_tail']!r}"] if em.get("jitter_tail") and em.get("jitter") else []


# local_cluster.sh's server flags and the [ps] fields syncopate-sim takes for them.
PS_FLAGS = {"--consistency": "ps.consistency", "--staleness-bound": "ps.staleness_bound",
            "--mitigation": "ps.mitigation", "--backup-workers": "ps.backup_workers"}
SIM_LOOPBACK_GBIT = 10.0  # the simulator's link where the emulation used plain loopback (no --netns)
SIM_BASE_LATENCY_US = scen.LINK_OWN_LATENCY_MS * 1e3  # the emulated links' own one-way latency, as the simulator takes it


def sim_latency_us(em):
    """The simulator's one-way latency: the emulated links' own (em["latency_us"], default 50 us) plus
    the modelled propagation latency the emulation adds with its delay line (em["latency_ms"])."""
    base = em.get("latency_us")
    return (SIM_BASE_LATENCY_US if base is None else base) + 1e3 * (em.get("latency_ms") or 0.0)


# study.py --schedule-by time: a run's train.steps is this many times its planned (calibrated) steps, a
# cap the budget ends it before (a run whose steps came 3x faster than calibrated would reach it first:
# its report then lists it as ended before the budget).
TIME_SCHEDULE_CAP = 3


def sim_command(cfg, em, job, seed, lr, out):
    """syncopate-sim arguments of the run cluster_command describes: the same workers, servers,
    modelled compute, straggler, links and worker flags, in virtual time."""
    nodes = job["nodes"]
    cmd = [sim_binary(), "--out", out, "--quiet", f"--sim.workers={nodes}",
           f"--dist.mode={'ring' if cfg.get('ring') else 'ps'}"]
    if not cfg.get("ring"):
        cmd += [f"--sim.servers={job['servers']}"]
        flags = cfg["cluster"]
        for i in range(0, len(flags), 2):
            if flags[i] not in PS_FLAGS:
                raise SystemExit(f"study: the simulator has no equivalent of local_cluster.sh {flags[i]}")
            cmd.append(f"--{PS_FLAGS[flags[i]]}={flags[i + 1]}")
    steps, slow_steps = budget(cfg, em, job)
    limit = job.get("time_schedule_s")
    if limit:
        # The schedule by the simulated clock ends every run at the budget, each worker where its clock
        # passes it: the planned steps only cap the run (TIME_SCHEDULE_CAP x them), and a straggler needs
        # no step budget of its own.
        steps, slow_steps = int(math.ceil(steps * TIME_SCHEDULE_CAP)), None
    if em["step_time_s"] <= 0:
        raise SystemExit("study: --backend sim needs a modelled step time (--step-time or a scenario)")
    cmd += [f"--emulate.step_time_s={em['step_time_s']!r}", f"--emulate.jitter={em['jitter']!r}"]
    if em["slow_node"] >= 0 and em["slowdown"] > 1:
        cmd += [f"--sim.slow_workers={em['slow_node']}", f"--emulate.slowdown={em['slowdown']!r}"]
        if slow_steps:
            cmd += [f"--sim.slow_steps={slow_steps}"]
    # link_efficiency: the share of the nominal rate that TCP achieves on the emulated links (1 = all).
    cmd += [f"--sim.link_gbit={(em.get('link_gbit') or SIM_LOOPBACK_GBIT) * em.get('link_efficiency', 1.0):.6g}"]
    if em.get("latency_us") is not None or em.get("latency_ms"):
        cmd += [f"--sim.latency_us={sim_latency_us(em):.6g}"]
    if em.get("sharing"):
        cmd += [f"--sim.sharing={em['sharing']}"]
    if em.get("colocate_servers") and not cfg.get("ring"):
        cmd += ["--sim.colocate_servers=true"]  # shard k shares worker k mod N's link
    if limit:
        cmd += [f"--sim.time_limit_s={limit!r}", "--sim.time_schedule=true"]
    return cmd + worker_flags(job, seed, lr, steps, cfg.get("ring", False), sync_every(cfg) > 1,
                              em["step_time_s"] > 0) + jitter_tail_flags(em) + cfg.get("worker", [])


def calibrate(preset, batch, out):
    """Real compute seconds of one step of `preset` at `batch` on one thread of this machine (median
    of steps 3..8 of an unpaced single-process run)."""
    worker = os.path.join(ROOT, "build", "bin", "syncopate-worker")
    cmd = [worker, "--out", out, "--force", f"--model.preset={preset}", f"--train.batch_size={batch}", "--train.steps=8",
           "--schedule.warmup_steps=1",
           "--train.threads=1", "--eval.every=0", "--eval.sample_tokens=0", "--eval.batches=1",
           "--checkpoint.every=0", f"--data.cache_dir={ROOT}/data/cache"]
    with run_lock(out):  # (lanes of one study share OUT)
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise SystemExit(f"study: the calibration run failed (exit {r.returncode}): {r.stderr.strip()[-500:]}\n"
                             f"command: {' '.join(cmd)}\n(or pass --no-calibrate with a --step-time you trust)")
        cs = sorted(m["compute_s"] for m in read_jsonl(os.path.join(out, "metrics.jsonl")) if "compute_s" in m)[2:]
    return cs[len(cs) // 2]


def refusal(log):
    """The trainer's own words where it refused its arguments (e.g. a held-out set larger than the
    validation split), from the run's log: ': <message>' or ''."""
    try:
        with open(log, errors="replace") as f:
            lines = [l.strip() for l in f if l.strip()]
    except OSError:
        return ""
    for l in lines:
        if "val_windows" in l or "validation split" in l:
            return f": {l[:400]}"
    # The trainer's or simulator's own message first, then any other error line (launchers' last words).
    own = [l for l in lines if l.startswith(("syncopate-worker:", "syncopate-sim:", "syncopate-server:"))]
    errs = own or [l for l in lines if "error" in l.lower() or "refus" in l.lower()]
    return f": {errs[-1][:400]}" if errs else ""


def server_stats(out):
    """The statistics each server logged on exit ({} per shard that logged none)."""
    stats, k = [], 0
    while os.path.exists(os.path.join(out, "logs", f"server{k}.log")):
        with open(os.path.join(out, "logs", f"server{k}.log")) as f:
            lines = [l for l in f if "] stats {" in l]
        stats.append(json.loads(lines[-1].split("] stats ", 1)[1]) if lines else {})
        k += 1
    return stats


def link_stats(out):
    """What the emulated links did beyond bytes over rate, summed over the nodes from OUT/logs/netstats.txt
    (scripts/netns.sh netns_stats): packets the tbf limiters dropped (both ends of every link), TCP's
    segments sent and retransmitted and its retransmission timeouts. None for a run without namespaces."""
    try:
        with open(os.path.join(out, "logs", "netstats.txt")) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    got = {"tbf_dropped": 0, "tcp_out_segs": 0, "tcp_retrans_segs": 0, "tcp_timeouts": 0}
    names = {"TcpOutSegs": "tcp_out_segs", "TcpRetransSegs": "tcp_retrans_segs", "TcpExtTCPTimeouts": "tcp_timeouts"}
    for line in lines:
        if "link: qdisc tbf" in line and "(dropped " in line:
            got["tbf_dropped"] += int(line.split("(dropped ", 1)[1].split(",", 1)[0])
        elif " tcp: " in line:
            for kv in line.split(" tcp: ", 1)[1].split():
                k, _, v = kv.partition("=")
                if k in names and v.isdigit():
                    got[names[k]] += int(v)
    return got


def eval_records(metrics):
    """The evaluation records of a run: node 0's, in the order written. (Every node may evaluate the
    shipped weights, eval_of "servers"/"outer", at its own moments; node 0's are the study's, and at
    the end of a complete run node 0 scores the job's final weights.)"""
    return [m for m in metrics[0] if "val_loss" in m]


def summarize(out, nodes, ring, deferred=False):
    """Per-run figures from the nodes' metrics: the validation curve (evaluation_records) on a
    clock that excludes evaluation time, with the global tokens and the bytes all nodes had sent
    at each point, the held-out set's description, and the emulation's health. deferred: the
    evaluations ran after training (eval.defer), so their time_s is the training clock already."""
    metrics = [read_jsonl(os.path.join(out, f"node{i}", "metrics.jsonl")) for i in range(nodes)]
    steps = [[m for m in ms if "tokens_per_s" in m] for ms in metrics]
    evals = eval_records(metrics)
    # A per-step ring's "tokens" are the job's (every node steps every step together); local SGD's
    # (records with a "round") and a parameter server's are each node's own, summed over the nodes.
    ring = ring and not any("round" in m for m in steps[0])
    # Clock: the training time minus the evaluation time spent before each point (none when deferred).
    # The trainer stamps an evaluation record (time_s, unix_s) when its weights are taken, before it
    # evaluates (records with eval_of, issue 25); older records were stamped after evaluating, so
    # their own eval_s lies before their stamp. Taking a point's own evaluation off its stamp when
    # it came after would move the point before its weights existed (below 0 for an early one).
    curve, spent = [], 0.0
    for m in evals:
        # A deferred evaluation's time_s is on the training clock already (its snapshot's cost is off it).
        # An evaluation while node 0 waits for a straggler (while_waiting) takes no time from the job:
        # the others train on meanwhile, and the job's end (job_final) is stamped when they are done.
        off_clock = deferred or m.get("deferred", False) or m.get("while_waiting", False)
        own = 0.0 if off_clock or "eval_of" in m else m.get("eval_s", 0.0)  # this evaluation's time before its stamp
        spent_before = spent + own
        if not off_clock:
            spent += m.get("eval_s", 0.0)
        at_unix = m["unix_s"] - own if "unix_s" in m else None
        if "global_tokens" in m:
            tokens = m["global_tokens"]
        elif ring:
            tokens = m["tokens"]
        else:  # every node's own tokens at that moment
            tokens = sum(max([s["tokens"] for s in ns if s["unix_s"] <= at_unix] or [0]) for ns in steps)
        t = m["time_s"] - spent_before
        sent = sum(s.get("wire_bytes", 0) for ns in steps for s in ns
                   if (s["unix_s"] <= at_unix if at_unix is not None else s.get("time_s", 0.0) <= t))
        pt = {"t": t, "val_loss": m["val_loss"], "tokens": tokens, "bytes": sent, "step": m["step"]}
        for k in ("eval_of", "val_tokens", "val_set"):
            if k in m:
                pt[k] = m[k]
        for k in POINT_FLAGS:
            if m.get(k):
                pt[k] = True
        curve.append(pt)
    all_steps = [s for ns in steps for s in ns]
    t_start = min(ns[0]["unix_s"] - ns[0]["step_s"] for ns in steps)
    t_end = max(ns[-1]["unix_s"] for ns in steps)
    # The evaluation time inside the steps' span (the last evaluation of a new record starts after it).
    spent = sum(m.get("eval_s", 0.0) for m in evals if not (deferred or m.get("deferred", False)
                                                            or m.get("while_waiting", False))
                and ("unix_s" not in m or m["unix_s"] - (0.0 if "eval_of" in m else m.get("eval_s", 0.0)) < t_end))
    total_tokens = steps[0][-1]["tokens"] if ring else sum(ns[-1]["tokens"] for ns in steps)
    stale = [s.get("staleness", 0.0) for s in all_steps]
    hist = {}
    for s in stale:
        hist[str(round(s))] = hist.get(str(round(s)), 0) + 1
    return {
        "curve": curve,
        "final_val_loss": curve[-1]["val_loss"] if curve else None,
        "wall_s": t_end - t_start - spent,
        "tokens": total_tokens,
        "tokens_per_s": total_tokens / max(t_end - t_start - spent, 1e-9),
        "bytes": sum(s.get("wire_bytes", 0) for s in all_steps),  # sent by all nodes (dist.wire's bytes)
        "bytes_received": sum(s.get("wire_bytes_received", 0) for s in all_steps),  # by all nodes (ps replies: f32)
        "staleness_mean": sum(stale) / len(stale),
        "staleness_max": max(stale),
        "staleness_histogram": hist,
        "overrun_share": sum(1 for s in all_steps if s.get("overrun")) / len(all_steps),
        "wait_share": sum(s.get("wait_s", 0.0) for s in all_steps) / max(sum(s["step_s"] for s in all_steps), 1e-9),
        "compute_s_mean": sum(s.get("compute_s", 0.0) for s in all_steps) / len(all_steps),
        "modelled_s_mean": sum(s.get("modelled_s", 0.0) for s in all_steps) / len(all_steps),
        "eval_s_total": spent,
        "train_window_unix": [t_start, t_end],  # first step's start to the last step's end, all nodes
        # The held-out set: digests and sizes seen in this run's records (None: an old trainer's records).
        "val_set": sorted({p["val_set"] for p in curve if "val_set" in p}) or None,
        "val_tokens": sorted({p["val_tokens"] for p in curve if "val_tokens" in p}) or None,
        "eval_of": sorted({p["eval_of"] for p in curve if "eval_of" in p}) or None,
        # Each node's steps and the training-clock time of its last one (budgets are checked on them).
        "node_steps": [ns[-1]["step"] if ns else 0 for ns in steps],
        "node_end_s": [ns[-1].get("time_s") if ns else None for ns in steps],
    }


def run_once(name, cfg, em, job, seed, lr, out, max_overrun=OVERRUN_LIMIT, max_cpu=CPU_LIMIT, trace=False,
             backend="emulated", reuse=False):
    """Runs one configuration once; returns its summary, or {"failed": reason, "log": path}.
    trace: record the run's timeline (OUT/trace.json, linked from the report). backend "sim": the
    same run in syncopate-sim's virtual time (no host limits to hold: its time is modelled).
    Every finished run writes OUT/run.json: its command line, the digest of what else made it
    (run_inputs) and what only its making measured (host CPU, elapsed time). reuse: when run.json
    names the same command line and inputs, the run is not made again: its figures are read again from
    its files (so a change of the tooling's reading applies) and judged against today's limits; the
    result then carries "reused": True."""
    with run_lock(out):  # lanes of one study (study.py --make-only) may reach the same run: one makes it
        return _run_once(name, cfg, em, job, seed, lr, out, max_overrun, max_cpu, trace, backend, reuse)


@contextlib.contextmanager
def run_lock(out):
    """An exclusive lock on OUT's run, held while it is made or taken back: a second process asking for the
    same run waits, then takes it back (reuse) or makes it again, never both at once. The lock file sits
    beside OUT (.NAME.lock), since OUT itself is emptied; the kernel drops it with a process that dies."""
    parent, leaf = os.path.split(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    with open(os.path.join(parent, f".{leaf}.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run_once(name, cfg, em, job, seed, lr, out, max_overrun, max_cpu, trace, backend, reuse):
    sim = backend == "sim"
    cmd = sim_command(cfg, em, job, seed, lr, out) if sim else cluster_command(cfg, em, job, seed, lr, out, trace)
    log = os.path.join(out, "cluster.log")
    binary = cmd[0] if sim else os.path.join(ROOT, "build", "bin", "syncopate-worker")
    if not os.path.exists(binary) and not os.environ.get("SYNCOPATE_WORKER"):
        return {"failed": f"{binary} is not built (scripts/build.sh)", "log": log}
    line = " ".join(cmd)
    inputs = run_inputs(sim)
    first = _FIRST_INPUTS.setdefault(sim, inputs)
    if inputs != first:
        # A rebuild (or a data or libtorch change) while this program runs: its runs would come from two builds,
        # which no summary may mix (and a later --resume would take back only those of the last one).
        # (The simulator itself is pinned, sim_binary: for it only libtorch or the data can change.)
        raise SystemExit(f"study: the inputs of {'the simulator' if sim else 'the emulated cluster'}'s runs changed "
                         f"while this program ran ({', '.join(os.path.relpath(p, ROOT) for p in input_files(sim))}, "
                         "libtorch or data/cache): its earlier runs came from the inputs before. Do not rebuild, reinstall "
                         "or re-tokenize while a study runs (a test target rebuilds every binary); run the study again: "
                         "--resume takes back the runs whose inputs match the current ones and makes the others")
    made = reusable(out, line, inputs) if reuse else None
    if made is not None:
        r = collect(out, cfg, job, sim, made.get("cpu_util"), made.get("elapsed_s"), max_overrun, max_cpu, log)
        if "failed" not in r:
            return dict(r, reused=True)  # (files no longer readable: made again below)
    # Made from scratch: whatever an earlier making left goes first. (A trainer finding its own final
    # checkpoint in OUT resumes from it and trains nothing: a re-made run would be the old one.)
    real = os.path.realpath(out)
    if real in (os.path.realpath(ROOT), os.path.realpath(os.getcwd())) or os.path.realpath(ROOT).startswith(real + os.sep):
        raise SystemExit(f"run_once: refusing to empty {out} for a run (it holds the repository or the working "
                         "directory); give each run a directory of its own")
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    with open(os.path.join(out, "command.txt"), "w") as f:
        f.write(line + "\n")
    t0 = time.time()
    with CpuSampler() as cpu, open(log, "w") as lf:
        rc = run_group(cmd, lf)
    if rc != 0:
        return {"failed": f"exit {rc}" + refusal(log), "log": log}
    elapsed = time.time() - t0
    r = collect(out, cfg, job, sim, None, elapsed, max_overrun, max_cpu, log)
    if "failed" not in r:
        # Host CPU while the nodes trained (not while they started, scored deferred evaluations or exited).
        cpu_util = None if sim else next((u for u in (cpu.mean(tuple(r["train_window_unix"])), cpu.mean())
                                          if u is not None), None)  # (a run shorter than a sample: all of it)
        judge(r, cpu_util, max_overrun, max_cpu)
        tmp = os.path.join(out, RUN_RECORD + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"command": line, "inputs": inputs, "cpu_util": cpu_util, "elapsed_s": elapsed}, f)
        os.replace(tmp, os.path.join(out, RUN_RECORD))
    return r


RUN_RECORD = "run.json"  # run_once's own record (hindsight.py and switch_midrun.py keep result.json)


def reusable(out, line, inputs):
    """OUT/run.json when it was made by this command line from these inputs, else None."""
    try:
        with open(os.path.join(out, RUN_RECORD)) as f:
            made = json.load(f)
    except (OSError, ValueError):
        return None
    return made if made.get("command") == line and made.get("inputs") == inputs else None


def collect(out, cfg, job, sim, cpu_util, elapsed, max_overrun, max_cpu, log):
    """A finished run's figures from its files, judged against the limits."""
    try:
        r = summarize(out, job["nodes"], cfg.get("ring", False), deferred=bool(job.get("defer")))
    except (OSError, ValueError, KeyError, IndexError) as e:
        return {"failed": f"unreadable metrics: {e}", "log": log}
    r["servers"] = server_stats(out) if not cfg.get("ring") else []
    r["dropped"] = sum(s.get("dropped", 0) for s in r["servers"])
    r["elapsed_s"] = elapsed
    if sim:
        with open(os.path.join(out, "sim.json")) as f:
            r["sim"] = json.load(f)
    else:
        r["links"] = link_stats(out)
    r["log"] = log
    if os.path.exists(os.path.join(out, "trace.json")):
        r["trace"] = os.path.join(out, "trace.json")
    return judge(r, cpu_util, max_overrun, max_cpu)


def judge(r, cpu_util, max_overrun, max_cpu):
    """A run's validity against the limits (the emulation held: few overruns, the host's CPU not saturated)."""
    r["cpu_util"] = cpu_util
    problems = []
    if r["overrun_share"] > max_overrun:
        problems.append(f"{r['overrun_share']:.0%} of steps overran their modelled time")
    if r["cpu_util"] is not None and r["cpu_util"] > max_cpu:
        problems.append(f"host CPU at {r['cpu_util']:.0%}")
    r["valid"] = not problems
    r["invalid_because"] = "; ".join(problems)
    return r
