"""What a study costs, said before it starts (issue 32): the runs it will start, by kind, and the
minutes they take on this machine, estimated from measurements, never from a constant.

The measurements come from the short runs the tools already make, and are stored so that a later
study (and a --dry-run, which starts nothing) can use them:
  - compute_s: real seconds of one step of a preset at a batch on one thread (cluster_runs.calibrate,
    the median of steps 3..8 of an unpaced run);
  - startup_s and eval_s_per_window: from the held-out preflight (study.check_held_out, one step
    and one evaluation): the process's wall time less its step and its evaluation, and the
    evaluation's seconds per held-out window;
  - launch_s: per backend, what finished runs took beyond the model below (starting the nodes and
    servers, shutting down, what the model misses), the median of the latest runs.
A run's estimate: its training time + its evaluations + the launch overhead, where training is the
modelled clock for the emulated backend (steps x modelled step x the straggler's factor where
nodes wait for it x (1 + jitter); or, unpaced, the measured compute with the nodes sharing the
cores) and, for the simulator, every worker-step's real gradient (worker-steps x compute_s; its
virtual time costs nothing). Stored in runs/study_cost.json ($SYNCOPATE_STUDY_COST overrides)."""
import datetime
import json
import math
import os
import statistics
import subprocess
import time

from cluster_runs import ROOT, TRAINER_FLAGS, calibrate, read_jsonl

LAUNCH_HISTORY = 50  # finished runs kept per backend


def path():
    return os.environ.get("SYNCOPATE_STUDY_COST") or os.path.join(ROOT, "runs", "study_cost.json")


def load():
    try:
        with open(path()) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def _save(d):
    p = path()
    os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
    tmp = f"{p}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(d, f, indent=1)
    os.replace(tmp, p)


def _now():
    return datetime.datetime.now().isoformat(timespec="seconds")


def store(section, key, value, how):
    d = load()
    d.setdefault(section, {})[key] = {"value": value, "measured": _now(), "how": how, "cores": os.cpu_count()}
    _save(d)


def stored(section, key):
    """{"value", "measured", "how"} or None."""
    v = load().get(section, {}).get(key)
    return v if isinstance(v, dict) and isinstance(v.get("value"), (int, float)) else None


def compute_key(preset, batch):
    return f"{preset}/batch{batch}"


def store_compute(preset, batch, seconds):
    store("compute_s", compute_key(preset, batch), seconds, "calibration run: median step of 8 unpaced steps, 1 thread")


def store_preflight(preset, windows, wall_s, step_s, eval_s):
    """The held-out preflight's wall time, its one step and its one evaluation of `windows` windows."""
    store("startup_s", preset, max(0.0, wall_s - step_s - eval_s), "held-out preflight: wall time less its step and evaluation")
    if windows:
        store("eval_s_per_window", preset, eval_s / windows, f"held-out preflight: one evaluation of {windows} windows")


def launch_key(backend, ring):
    """Launch overheads are kept per backend and transport (parameter servers start more processes)."""
    return f"{backend}/{'ring' if ring else 'ps'}"


def record_runs(residuals):
    """Finished runs' seconds beyond the model (elapsed - modelled training - evaluations):
    {launch_key: [seconds, ...]}."""
    d = load()
    for key, rs in residuals.items():
        rs = [r for r in rs if r is not None and math.isfinite(r)]
        if rs:
            h = d.setdefault("launch_s", {}).setdefault(key, [])
            h.extend(round(r, 3) for r in rs)
            del h[:-LAUNCH_HISTORY]
    _save(d)


def record_study(entry):
    d = load()
    studies = d.setdefault("studies", [])
    studies.append(dict(entry, when=_now()))
    del studies[:-20]
    _save(d)


class Measurements:
    """What the estimate rests on for one preset, batch and backend, each value with where it came
    from (None where nothing is measured yet)."""

    def __init__(self, preset, batch, backend):
        self.preset, self.batch, self.backend = preset, batch, backend
        self.compute = stored("compute_s", compute_key(preset, batch))
        self.startup = stored("startup_s", preset)
        self.eval_window = stored("eval_s_per_window", preset)
        self.launch = {}  # launch_key: (median seconds, runs it rests on)
        for ring in (True, False):
            h = load().get("launch_s", {}).get(launch_key(backend, ring), [])
            if len(h) >= 3:
                self.launch[launch_key(backend, ring)] = (statistics.median(h[-20:]), min(len(h), 20))
        self.cores = os.cpu_count() or 1

    def overhead_s(self, ring=True):
        """Seconds a run takes besides training and evaluating: the launch overhead of this machine's
        finished runs of the backend and transport where there are some, else the preflight's
        start-up; never below 0."""
        got = self.launch.get(launch_key(self.backend, ring))
        if got is not None:
            return max(0.0, got[0])
        return self.startup["value"] if self.startup else None

    def basis(self):
        """Where each part of the estimate comes from, in words."""
        def when(m):
            return f"measured {m['measured']}"
        parts = []
        if self.backend == "sim":
            parts.append(f"training: worker-steps x {self.compute['value'] * 1e3:.0f} ms real compute per step "
                         f"({self.preset}, batch {self.batch}; {when(self.compute)})" if self.compute else
                         f"training: NOT estimated (no compute measurement of {self.preset}, batch {self.batch} stored "
                         "yet; a study without --dry-run measures it first)")
        else:
            parts.append("training: the modelled clock (steps x modelled step x the straggler's factor where nodes "
                         "wait for it x (1 + jitter); communication not counted)")
        parts.append(f"evaluation: {self.eval_window['value'] * 1e3:.2f} ms per held-out window "
                     f"(held-out preflight, {when(self.eval_window)})" if self.eval_window else
                     "evaluation: NOT estimated (no held-out preflight stored yet)")
        for key, (sec, n) in sorted(self.launch.items()):
            parts.append(f"launch and shutdown ({key.split('/')[1]}): {max(0.0, sec):.1f} s per run, the median "
                         f"overhead beyond the above of this machine's last {n} finished {key} runs")
        if len(self.launch) < 2:
            parts.append(f"start-up{' (the others)' if self.launch else ''}: {self.startup['value']:.1f} s per run "
                         f"(held-out preflight, {when(self.startup)})" if self.startup else
                         "start-up: NOT estimated (nothing measured yet)")
        return parts


def training_s(backend, em, steps, slow_steps, synchronous, nodes, m):
    """The real seconds of one run's training (see the module's docstring), or None (not measurable)."""
    straggler = em["slow_node"] >= 0 and em["slowdown"] > 1
    slow = slow_steps if slow_steps is not None else steps
    if backend == "sim":
        if not m.compute:
            return None
        worker_steps = steps * (nodes - (1 if straggler else 0)) + (slow if straggler else 0)
        return worker_steps * m.compute["value"]
    st = em["step_time_s"]
    if st <= 0:  # unpaced: the nodes' real compute, sharing this machine's cores
        return None if not m.compute else max(steps, slow) * m.compute["value"] * max(1.0, nodes / m.cores)
    j = 1.0 + em["jitter"]
    fast_t = steps * st * j * (em["slowdown"] if straggler and synchronous else 1.0)
    slow_t = slow * st * em["slowdown"] * j if straggler else 0.0
    return max(fast_t, slow_t)


def eval_s(backend, evaluations, windows, nodes, m):
    """Seconds of a run's evaluations: in the emulation every node scores its snapshots (the nodes
    share the cores); in the simulator one worker does."""
    if not evaluations or not windows:
        return 0.0
    if not m.eval_window:
        return None
    share = 1.0 if backend == "sim" else max(1.0, nodes / m.cores)
    return evaluations * windows * m.eval_window["value"] * share


def run_s(backend, em, steps, slow_steps, synchronous, nodes, evaluations, windows, m, ring=True):
    """(one run's estimated seconds, or None where a part is not measured; the sum of the parts that
    are measured: a lower bound)."""
    parts = [training_s(backend, em, steps, slow_steps, synchronous, nodes, m),
             eval_s(backend, evaluations, windows, nodes, m), m.overhead_s(ring)]
    known = sum(p for p in parts if p is not None)
    return (None if any(p is None for p in parts) else known), known


def residual(backend, em, steps, slow_steps, synchronous, nodes, evaluations, windows, elapsed, m):
    """A finished run's seconds beyond training and evaluation (recorded for the next estimate)."""
    t = training_s(backend, em, steps, slow_steps, synchronous, nodes, m)
    e = eval_s(backend, evaluations, windows, nodes, m)
    return None if t is None or e is None or elapsed is None else elapsed - t - e


def minutes(s):
    """Seconds as minutes for the plan: 2 decimals under 6 s, 1 under 10 min, whole minutes past."""
    return "?" if s is None else f"{s / 60:.2f}" if s < 6 else f"{s / 60:.1f}" if s < 600 else f"{s / 60:.0f}"


def preflight(preset, batch, windows, out):
    """A one-step run with one evaluation of `windows` held-out windows, timed: stores the start-up
    and the evaluation's seconds per window (what study.check_held_out measures as it checks the
    held-out set). False where the trainer is not built or the run failed."""
    worker = os.path.join(ROOT, "build", "bin", "syncopate-worker")
    if not os.path.exists(worker):
        return False
    cmd = [worker, "--out", out, "--force", f"--model.preset={preset}", f"--train.batch_size={batch}",
           "--train.steps=1", "--schedule.warmup_steps=0", "--train.threads=1", "--eval.every=1",
           "--eval.sample_tokens=0", "--checkpoint.every=0",
           f"--data.cache_dir={ROOT}/data/cache"] + [f.format(windows) for f in TRAINER_FLAGS["val_windows"]]
    t0 = time.time()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return r.returncode == 0 and store_preflight_run(preset, windows, time.time() - t0, out)


def store_preflight_run(preset, windows, wall_s, out):
    """Stores a finished preflight's measurements from its metrics (False where they are missing)."""
    try:
        ms = read_jsonl(os.path.join(out, "metrics.jsonl"))
        step = next(m for m in ms if "step_s" in m)
        ev = next(m for m in ms if "val_loss" in m)
    except (OSError, ValueError, StopIteration):
        return False
    store_preflight(preset, windows, wall_s, step["step_s"], ev.get("eval_s", 0.0) + ev.get("deferred_eval_s", 0.0))
    return True


def ensure_measured(preset, batch, windows, out):
    """Measures what is not stored yet for an estimate (a compute calibration, a held-out preflight of
    `windows` windows) with short runs under OUT/calibration/; returns the names of those it ran."""
    ran = []
    if not stored("compute_s", compute_key(preset, batch)):
        store_compute(preset, batch, calibrate(preset, batch, os.path.join(out, "calibration", "compute")))
        ran.append("compute calibration")
    if windows and (not stored("eval_s_per_window", preset) or not stored("startup_s", preset)):
        if preflight(preset, batch, windows, os.path.join(out, "calibration", "preflight")):
            ran.append("held-out preflight")
    return ran


def main(argv=None):
    """Prints the measurements stored on this machine (what the studies' estimates rest on)."""
    import argparse
    ap = argparse.ArgumentParser(description="Print the measurements this machine's study cost estimates rest on "
                                 f"(stored by the studies' short calibration runs in {path()}; "
                                 "$SYNCOPATE_STUDY_COST overrides). Writes nothing.")
    ap.add_argument("--json", action="store_true", help="the stored file as it is")
    a = ap.parse_args(argv)
    d = load()
    if a.json:
        print(json.dumps(d, indent=1))
        return 0
    if not d:
        print(f"nothing measured yet ({path()}): a study (not --dry-run) measures before its first run")
        return 0
    for section in ("compute_s", "startup_s", "eval_s_per_window"):
        for key, v in sorted(d.get(section, {}).items()):
            print(f"{section} {key}: {v['value']:.4g} s ({v['how']}; measured {v['measured']})")
    for key, h in sorted(d.get("launch_s", {}).items()):
        print(f"launch_s {key}: median {statistics.median(h[-20:]):.2f} s over the last {min(len(h), 20)} finished runs")
    for s in d.get("studies", [])[-5:]:
        est = "?" if s.get("estimated_s") is None else f"{s['estimated_s'] / 60:.1f}"
        print(f"study {s['when']}: {s['runs']} runs took {s['took_s'] / 60:.1f} min (estimated {est}): {s['command']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
