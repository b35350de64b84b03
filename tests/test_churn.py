"""experiments/churn.py: the seeded schedule (the same for every configuration of a seed, one of
each kind in a seeded order), the hang detector on a process that never steps, Ctrl-C ending every
process, and one short run end to end (1 seed, a crash, a preemption and a join, 60 steps of
0.1 s, every configuration with its reference): every event happened as the logs show it (the
fixed ring's join refused by name; the elastic ring and elastic DiLoCo re-formed without a restart, a crashed node back
with the running job's state), no hang, no sample granted twice in the elastic ps configurations
nor a data position used for two steps on the elastic ring,
goodput in (0, 1], report files whose Markdown shows the JSON's numbers, and no process left.
Everything is written under a temporary directory. About 1.5 minutes on 2 cores.
Run: .venv/bin/python tests/test_churn.py"""
import argparse
import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
import unittest

sys.dont_write_bytecode = True
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import churn  # noqa: E402

PY = sys.executable
BIN = os.environ.get("SYNCOPATE_BIN") or os.path.join(ROOT, "build", "bin")
HAVE_BINARIES = all(os.path.exists(os.path.join(BIN, b)) for b in ("syncopate-worker", "syncopate-server"))
# The end-to-end run: short, three events inside the first 60% of it.
STEPS, NODES, RATE, MAX_EVENTS, START_S, HORIZON, DELAY, RECOVER_S = 60, 3, 90.0, 3, 1.0, 0.6, (1.0, 2.0), 3.0
TARGET = 4.0  # a validation loss the tiny model passes within the test's 60 steps (the time to target)
PS_CONFIGS = ("ps_bsp_backup", "ps_asp", "ps_bsp", "ps_ssp", "ps_diloco_elastic", "ps_async_local_sgd")
PS_LOCAL_SGD = ("ps_diloco_elastic", "ps_async_local_sgd")


def schedule(seed):
    return churn.draw_schedule(seed, RATE, STEPS, 0.1, NODES, MAX_EVENTS, START_S, HORIZON, DELAY, RECOVER_S)


def pick_seed():
    """The first seed whose schedule has one event of each kind, the crash first: the preemption then
    reaches a BSP worker while it waits for the crashed node (a worker built before the SIGTERM
    handling of common/stop_signal.cpp took its waits' EINTR for an error and exited 1, "Interrupted
    system call") and a ring that is restarting (its launcher ends on SIGTERM with 143)."""
    for seed in range(1000):
        kinds = [e["kind"] for e in schedule(seed)]
        if sorted(kinds) == sorted(churn.KINDS) and kinds.index("kill9") < kinds.index("sigterm"):
            return seed
    raise AssertionError("no seed in 0..999 gives one event of each kind")


def processes_mentioning(text):
    """PIDs of live processes whose command line contains `text`."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            found.append((int(d), cmd[:200]))
    return found


def write_corpus(path, size=300_000):
    lines = ["the quick brown fox jumps over the lazy dog.\n", "def add(a, b):\n    return a + b\n",
             "a stitch in time saves nine.\n", "for i in range(10):\n    print(i)\n"]
    with open(path, "w") as f:
        n = i = 0
        while n < size:
            line = lines[(i * 7 + i // 3) % 4]
            f.write(line)
            n += len(line)
            i += 1
    return path


def child_env():
    return dict(os.environ, PYTHONDONTWRITEBYTECODE="1", SYNCOPATE_BIN=BIN)


class Schedule(unittest.TestCase):
    def test_a_seed_alone_fixes_it(self):
        a = churn.draw_schedule(7, 30, 120, 0.1, 3)
        self.assertEqual(a, churn.draw_schedule(7, 30, 120, 0.1, 3))
        self.assertNotEqual([e["t_s"] for e in a], [e["t_s"] for e in churn.draw_schedule(8, 30, 120, 0.1, 3)])

    def test_rate_horizon_limit_kinds_and_targets(self):
        n_events = 0
        for seed in range(200):
            evs = churn.draw_schedule(seed, 30, 120, 0.1, 3, max_events=3, start_s=1.0, horizon_frac=0.55,
                                      delay=(1.0, 3.0), recover_s=4.0)
            n_events += len(evs)
            self.assertLessEqual(len(evs), 3)
            ts = [e["t_s"] for e in evs]
            self.assertEqual(ts, sorted(ts))
            self.assertTrue(all(1.0 < t <= 0.55 * 120 * 0.1 for t in ts), evs)
            self.assertTrue(all(1.0 <= e["delay_s"] <= 3.0 for e in evs), evs)
            if len(evs) == 3:
                self.assertEqual(sorted(e["kind"] for e in evs), sorted(churn.KINDS), evs)
            joins = [e["node"] for e in evs if e["kind"] == "join"]
            self.assertEqual(joins, list(range(3, 3 + len(joins))), "a join takes the next new rank")
            down = {}
            for e in evs:
                if e["kind"] != "join":
                    self.assertLess(e["node"], 3)
                    self.assertLessEqual(down.get(e["node"], -1), e["t_s"], f"node {e['node']} targeted while down: {evs}")
                    down[e["node"]] = e["t_s"] + e["delay_s"] + 4.0
        # 200 seeds x 30/min over 5.6 s: 2.8 expected per seed before the cap of 3
        self.assertGreater(n_events / 200, 2.0)
        self.assertEqual(churn.draw_schedule(3, 0, 120, 0.1, 3), [])


class LossGap(unittest.TestCase):
    """Issue 30's final-loss gap within 1%: relative, paired by seed, TOST; a gap that is small but
    noisy is not shown within, a tight one is, a consistent 2% gap is not."""

    @staticmethod
    def runs(gaps, samples=(100.0, 100.0)):
        out = []
        for seed, g in enumerate(gaps):
            out.append({"config": "x", "seed": seed, "churn": False, "status": "complete",
                        "metrics": {"final_val_loss": 3.0, "useful_samples": samples[0]}})
            out.append({"config": "x", "seed": seed, "churn": True, "status": "complete",
                        "metrics": {"final_val_loss": 3.0 * (1 + g), "useful_samples": samples[1]}})
        return out

    def test_tight_small_gaps_are_within_noisy_or_large_ones_are_not(self):
        ok = churn.loss_gap_within(self.runs([0.001, -0.002, 0.0015, 0.0, -0.001]), "x")
        self.assertTrue(ok["equivalent"], ok)
        self.assertTrue(ok["verdict"].startswith("within 1%"), ok)
        noisy = churn.loss_gap_within(self.runs([0.009, -0.009, 0.012, -0.011, 0.0]), "x")
        self.assertFalse(noisy["equivalent"], noisy)
        self.assertTrue(noisy["verdict"].startswith("not shown within 1%"), noisy)
        far = churn.loss_gap_within(self.runs([0.02, 0.021, 0.019, 0.022, 0.02], samples=(100.0, 95.0)), "x")
        self.assertFalse(far["equivalent"])
        self.assertIn("shown above +1%", far["verdict"])  # the whole interval lies above the margin
        self.assertIn("not resolved", noisy["verdict"])     # neither within nor beyond it
        self.assertEqual(far["samples_ratio"], [0.95, 0.95])
        self.assertIn("n = 1", churn.loss_gap_within(self.runs([0.001]), "x")["verdict"])


class EqualSamples(unittest.TestCase):
    """--equal-samples: the reference's budget scaled to the churn run's applied samples (whole rounds
    for local SGD), and the gap tested against those references, not the equal-steps ones."""

    def test_the_budget_scales_with_the_samples_and_rounds_to_whole_rounds(self):
        a = argparse.Namespace(steps=120, sync_every=10)
        self.assertEqual(churn.equal_budget(a, {}, {"useful_samples": 864.0}, {"useful_samples": 720.0}), 144)
        self.assertEqual(churn.equal_budget(a, {"local_sgd": True}, {"useful_samples": 864.0}, {"useful_samples": 720.0}), 140)
        self.assertEqual(churn.equal_budget(a, {"local_sgd": True}, {"useful_samples": 10.0}, {"useful_samples": 720.0}), 10)
        self.assertIsNone(churn.equal_budget(a, {}, {"useful_samples": None}, {"useful_samples": 720.0}))
        self.assertIsNone(churn.equal_budget(a, {}, {"useful_samples": 864.0}, {"useful_samples": 0}))

    def test_the_gap_is_against_the_equal_sample_references(self):
        runs = LossGap.runs([0.02, 0.021, 0.019, 0.022, 0.02], samples=(100.0, 120.0))  # 2% off at equal steps
        equal = [{"config": "x", "seed": sd, "churn": False, "status": "complete", "equal_samples": {"steps": 144},
                  "metrics": {"final_val_loss": 3.0 * (1.02 + d), "useful_samples": 119.0}}
                 for sd, d in enumerate([0.001, -0.002, 0.0015, 0.0, -0.001])]
        at_steps = churn.loss_gap_within(runs, "x")
        self.assertFalse(at_steps["equivalent"], at_steps)
        at_samples = churn.loss_gap_within(runs, "x", equal)
        self.assertTrue(at_samples["equivalent"], at_samples)
        self.assertEqual(at_samples["reference_steps"], [144, 144])
        self.assertEqual(at_samples["missing_seeds"], [])
        equal[2]["status"] = "failed"  # its seed has no paired reference, and its steps are not counted
        partial = churn.loss_gap_within(runs, "x", equal)
        self.assertEqual(partial["missing_seeds"], ["2"])
        self.assertEqual(partial["n"], 4)
        equal[2]["status"] = "complete"
        self.assertAlmostEqual(at_samples["samples_ratio"][0], 120.0 / 119.0)
        for r in runs + equal:
            r["metrics"]["goodput"] = 0.9
        comps = churn.compare(runs, ["x"], equal)
        loss = next(c for c in comps if c["metric"] == "final_val_loss")
        self.assertIn("within_1pct_equal_samples", loss)
        # At equal steps the 2% gap lies beyond 1%; the compared family says so with Holm's p.
        self.assertIn("shown above +1%", loss["within_1pct"]["verdict"])
        self.assertIn("Holm p", loss["within_1pct"]["verdict"])
        self.assertTrue(loss["within_1pct_equal_samples"]["verdict"].startswith("within 1%"))
        self.assertNotIn("within_1pct_equal_samples", churn.compare(runs, ["x"])[0])

    def test_the_interpolated_reference_reads_the_line_between_the_two_at_the_churn_runs_samples(self):
        ref = lambda sd, loss, samples, **k: {"config": "x", "seed": sd, "churn": False, "status": "complete",
                                              "metrics": {"final_val_loss": loss, "useful_samples": samples}, **k}
        runs = [{"config": "x", "seed": 0, "churn": True, "status": "complete",
                 "metrics": {"final_val_loss": 3.0, "useful_samples": 110.0}}, ref(0, 3.2, 100.0)]
        # the rounded budget overshot: 120 samples at 3.0; at 110 the line reads 3.1
        got = churn.interpolated_references(runs, [ref(0, 3.0, 120.0, equal_samples={"steps": 12})], "x")
        self.assertEqual(len(got), 1)
        self.assertAlmostEqual(got[0]["metrics"]["final_val_loss"], 3.1)
        self.assertEqual(got[0]["outside"], 0.0)
        # past both (130 samples, the references at 100 and 120): extrapolated, and said so (half the span)
        runs[0]["metrics"]["useful_samples"] = 130.0
        got = churn.interpolated_references(runs, [ref(0, 3.0, 120.0)], "x")
        self.assertAlmostEqual(got[0]["metrics"]["final_val_loss"], 2.9)
        self.assertAlmostEqual(got[0]["outside"], 0.5)
        # both references at the same samples: the equal-samples one; a failed one: no reference for the seed
        self.assertEqual(churn.interpolated_references(runs, [ref(0, 3.05, 100.0)], "x")[0]["metrics"]["final_val_loss"], 3.05)
        self.assertEqual(churn.interpolated_references(runs, [ref(0, 3.0, 120.0, status="failed")], "x"), [])


    def test_batch_references_must_be_the_same_setup_wider_by_batch_or_nodes_without_events(self):
        st = {"nodes": 3, "steps": 120, "step_time": 0.1, "sync_every": 10, "checkpoint_every": 10, "val_windows": 64,
              "corpus": "system", "worker_timeout_s": 4.0, "batch": 2}
        study = {"settings": st, "command": "study"}
        run = {"config": "x", "seed": 0, "churn": True, "status": "complete", "events": [],
               "metrics": {"final_val_loss": 3.0, "useful_samples": 1080.0}}
        d = tempfile.mkdtemp(prefix="syncopate-churn-test-")
        try:
            def control(**changes):
                with open(os.path.join(d, "churn.json"), "w") as f:
                    json.dump({"settings": {**st, "batch": 3, **changes}, "command": "control", "runs": [run]}, f)
                return churn.batch_references(study, d)
            got = control()
            self.assertEqual((got[0]["churn"], got[0]["batch"], got[0]["width"], got[0]["source"]),
                             (False, 3, "batch 3", "control"))
            # wider by nodes at the same batch (a local SGD joiner's samples come as one more node's delta)
            self.assertEqual(control(batch=2, nodes=4)[0]["width"], "4 nodes")
            with self.assertRaisesRegex(SystemExit, "differs .* in steps"):
                control(steps=100)
            with self.assertRaisesRegex(SystemExit, "3 nodes at batch 2, this study 3 at batch 2"):
                control(batch=2)
            with self.assertRaisesRegex(SystemExit, "one of the two"):
                control(nodes=4)  # both wider: not one reading
            with self.assertRaisesRegex(SystemExit, "one of the two"):
                control(nodes=2)  # a larger batch on fewer nodes
            run["events"] = [{"kind": "kill9"}]
            with self.assertRaisesRegex(SystemExit, "has runs with events"):
                control()
            with self.assertRaisesRegex(SystemExit, "no readable churn.json"):
                churn.batch_references(study, os.path.join(d, "missing"))
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_the_batch_family_reads_the_churn_runs_samples_on_the_line_to_the_larger_batch(self):
        # Churn applied 1.25x the reference's samples (100) at its steps; the run at a larger batch applied 150 and
        # ended 0.4% lower: the line reads 2.994 at 125, and churn's 3.0 is within 1% of it.
        runs = LossGap.runs([0.0, 0.001, -0.001, 0.0005, 0.0], samples=(100.0, 125.0))
        big = [{"config": "x", "seed": sd, "churn": False, "status": "complete",
                "metrics": {"final_val_loss": 3.0 * (1 - 0.004), "useful_samples": 150.0}} for sd in range(5)]
        for r in runs + big:
            r["metrics"].setdefault("goodput", 0.9)
        loss = next(c for c in churn.compare(runs, ["x"], (), big) if c["metric"] == "final_val_loss")
        g = loss["within_1pct_batch"]
        self.assertTrue(g["equivalent"], g)
        self.assertAlmostEqual(g["outside_max"], 0.0)
        self.assertNotIn("within_1pct_batch", churn.compare(runs, ["x"])[0])


class HangDetector(unittest.TestCase):
    def test_a_process_that_never_steps_is_a_hang_and_is_ended(self):
        d = tempfile.mkdtemp(prefix="syncopate-churn-test-")
        try:
            a = types.SimpleNamespace(nodes=1, steps=10, step_time=0.1, hang_s=1.0, run_timeout_s=30.0)
            run = churn.Run(a, "ps_asp", 0, [], d)
            p = run.procs.start(["sleep", "60"], dict(os.environ), os.path.join(d, "sleep.log"))
            run.incs.append({"node": 0, "inc": 0, "nnodes": 1, "popen": p, "start_unix": time.time(), "end_unix": None,
                             "rc": None, "ended_by": None, "log": os.path.join(d, "sleep.log")})
            run.tails[0] = churn.Tail(os.path.join(d, "node0", "metrics.jsonl"))
            t0 = time.time()
            run.loop()
            took = time.time() - t0
            self.assertGreaterEqual(took, 1.0)
            self.assertLess(took, 5.0)
            self.assertTrue(run.failure.startswith("hang: node 0"), run.failure)
            self.assertEqual(len(run.hangs), 1)
            self.assertEqual(run.procs.end_all(), [])
            self.assertIsNotNone(p.poll(), "the silent process was ended")
        finally:
            shutil.rmtree(d, ignore_errors=True)


class RoundBoundaries(unittest.TestCase):
    def test_losses_wait_for_the_step_that_drops_no_partial_round(self):
        now = 100.0
        lines = {0: [{"loss": 1, "step": 19, "_seen_unix": now - 0.05}], 1: [{"loss": 1, "step": 20, "_seen_unix": now - 0.05}],
                 2: [{"loss": 1, "step": 20, "_seen_unix": now - 0.5}]}
        fake = types.SimpleNamespace(a=types.SimpleNamespace(losses_at_round_boundaries=True, sync_every=10),
                                     alive=lambda r: {"node": r}, steps_of=lambda r: lines[r])
        go = lambda kind, node: churn.Run.at_boundary(fake, {"kind": kind, "node": node}, now)
        self.assertTrue(go("sigterm", 0), "computing the round's last step: it finishes, pushes and leaves")
        self.assertFalse(go("kill9", 0), "a kill now would drop the 9 steps of the round")
        self.assertTrue(go("kill9", 1), "just after the round's last step")
        self.assertFalse(go("sigterm", 1))
        self.assertFalse(go("kill9", 2), "a step line 0.5 s old says nothing of where the node is now")
        self.assertTrue(go("join", 2))
        fake.a.losses_at_round_boundaries = False
        self.assertTrue(go("kill9", 0))
        with contextlib.redirect_stderr(io.StringIO()) as err, self.assertRaises(SystemExit):
            churn.parse_args(["run", "--losses-at-round-boundaries", "--configs", "ps_asp,ps_diloco_elastic"])
        self.assertIn("local SGD configurations only", err.getvalue())


class Arguments(unittest.TestCase):
    def test_local_sgd_evaluates_only_at_round_boundaries(self):
        with contextlib.redirect_stderr(io.StringIO()) as err, self.assertRaises(SystemExit):
            churn.parse_args(["run", "--eval-every", "15", "--sync-every", "10", "--configs", "ps_asp,ps_diloco_elastic"])
        self.assertIn("not a multiple of --sync-every 10: ps_diloco_elastic", err.getvalue())
        a = churn.parse_args(["run", "--eval-every", "15", "--configs", "ps_asp,ring_elastic"])
        self.assertEqual(churn.worker_flags(a, 0).count("--eval.every=15"), 1)
        a = churn.parse_args(["run"])
        self.assertIn("--eval.every=0", churn.worker_flags(a, 0))


@unittest.skipUnless(HAVE_BINARIES, f"the binaries are not built under {BIN} (scripts/build.sh)")
class EndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="syncopate-churn-test-")
        cls.corpus = write_corpus(os.path.join(cls.tmp, "corpus.txt"))
        cls.seed = pick_seed()
        cls.out = os.path.join(cls.tmp, "out")
        cls.args = ["--seeds", "1", "--first-seed", str(cls.seed), "--steps", str(STEPS), "--nodes", str(NODES),
                    "--events-per-min", str(RATE), "--max-events", str(MAX_EVENTS), "--events-start-s", str(START_S),
                    "--horizon-frac", str(HORIZON), "--delay", f"{DELAY[0]},{DELAY[1]}", "--recover-s", str(RECOVER_S),
                    "--corpus", cls.corpus, "--cache-dir", os.path.join(cls.tmp, "cache"),
                    "--eval-every", "10", "--target-loss", str(TARGET)]
        t0 = time.time()
        cls.proc = subprocess.run([PY, os.path.join(ROOT, "experiments", "churn.py"), "run", "--out", cls.out] + cls.args,
                                  capture_output=True, text=True, timeout=300, cwd=cls.tmp, env=child_env())
        cls.took = time.time() - t0
        print(f"\n[test_churn] seed {cls.seed}: {cls.took:.0f} s\n{cls.proc.stdout}", file=sys.stderr, flush=True)
        cls.left = processes_mentioning(cls.tmp)
        with open(os.path.join(cls.out, "churn.json")) as f:
            cls.s = json.load(f)
        with open(os.path.join(cls.out, "churn.md")) as f:
            cls.md = f.read()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def churn_runs(self):
        return [r for r in self.s["runs"] if r["churn"]]

    def test_it_ran_every_configuration_and_left_no_process(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stdout + self.proc.stderr)
        self.assertEqual(self.left, [], "processes of the run still alive")
        self.assertEqual(sorted((r["config"], r["churn"]) for r in self.s["runs"]),
                         sorted((c, ch) for c in churn.CONFIGS for ch in (True, False)))

    def test_the_schedule_is_the_seeds_and_identical_across_configurations(self):
        want = schedule(self.seed)
        self.assertEqual(self.s["schedules"][str(self.seed)], want)
        keys = ("i", "t_s", "kind", "node", "delay_s")
        for r in self.churn_runs():
            self.assertEqual([{k: e[k] for k in keys} for e in r["events"]], want, r["config"])
        for r in self.s["runs"]:
            if not r["churn"]:
                self.assertEqual(r["events"], [])

    def read(self, path):
        with open(path, errors="replace") as f:
            return f.read()

    def test_every_event_happened_as_the_logs_show(self):
        for r in self.churn_runs():
            ring = r["config"] == "ring_restart"
            elastic_ring = r["config"] in ("ring_elastic", "ring_diloco_elastic")
            incs = {(i["node"], i["inc"]): i for i in r["incarnations"]}
            for e in r["events"]:
                what = f"{r['config']} event {e['i']} {e['kind']} node {e['node']}: {e}"
                if ring and e["kind"] == "join":
                    self.assertFalse(e["applied"], what)
                    self.assertEqual(e["why_not"], churn.RING_JOIN)
                    continue
                self.assertTrue(e["applied"], what)
                self.assertTrue(e["happened"], what)
                self.assertTrue(e["survived"], what)
                if e["kind"] == "join":
                    log = self.read(incs[(e["node"], 0)]["log"])
                    self.assertRegex(log, rf"node {e['node']} joined the running job at step \d+", what)
                    continue
                before, back = incs[(e["node"], e["inc"])], incs[(e["node"], e["back_inc"])]
                self.assertGreaterEqual(back["start_unix"] - before["end_unix"], e["delay_s"] - 0.05, what)
                self.assertLess(back["start_unix"] - before["end_unix"], e["delay_s"] + 1.0, what)
                back_log = self.read(back["log"])
                if e["kind"] == "kill9":
                    self.assertEqual(before["rc"], -signal.SIGKILL, what)
                    if ring:  # a new launcher (it resumes from the node's checkpoint when it has one)
                        self.assertIn(f"[launch] node {e['node']} attempt 0", back_log, what)
                elif ring:  # the launcher ends on TERM (143); its worker stops at a step boundary if it was stepping
                    self.assertEqual(before["rc"], 143, what)
                    if e["stopped_at_step_boundary"]:
                        self.assertIn(f"SIGTERM: node {e['node']} stopped after step", self.read(before["log"]), what)
                else:  # the worker stops at its step boundary, checkpoints, leaves (exit 0), and joins again
                    self.assertIn(f"SIGTERM: node {e['node']} stopped after step", self.read(before["log"]), what)
                    self.assertEqual(before["rc"], 0, what)
                    self.assertTrue(e["stopped_at_step_boundary"], what)
                # The node stepped again after it came back; a ps node without replaying a step: at its own next
                # clock (a live member) or the job's (it had left). (Only a rank-0 node logs "resumed from".)
                steps = [json.loads(x) for x in self.read(os.path.join(r["dir"], f"node{e['node']}", "metrics.jsonl"))
                         .splitlines() if x.strip()]
                after = [m for m in steps if "loss" in m and m["unix_s"] > back["start_unix"]]
                # (or it came back at the job's last boundary, which elastic DiLoCo's joiners wait for: it took the end)
                took_the_end = re.search(rf"node {e['node']} joined the running job at step {STEPS}\b", back_log)
                self.assertTrue(after or took_the_end, what)
                if not ring and after:
                    # (ps local SGD: a node back may start the round it left or was lost in, which it never
                    # pushed, on the same grant (ASP: its own next clock); never an earlier one)
                    last = e["target_last_step"]
                    if r["config"] in PS_LOCAL_SGD:
                        last = last // self.s["settings"]["sync_every"] * self.s["settings"]["sync_every"]
                    self.assertGreater(after[0]["step"], last, what)
                if elastic_ring and e["kind"] == "kill9":  # back with the running job's state, not its own checkpoint's
                    self.assertRegex(back_log, rf"node {e['node']} joined the running job at step \d+", what)
            if elastic_ring:  # a lost node broke the others' step; nobody restarted, no step logged twice
                others = "".join(self.read(i["log"]) for i in r["incarnations"])
                self.assertIn("the ring broke at step", others)
                self.assertNotIn("[launch]", others)
                self.assertEqual(r["metrics"]["lost_steps"]["recomputed"], 0)
                self.assertGreater(r["metrics"]["lost_steps"]["in_flight_at_crash"], 0)
            if ring:  # a lost ring node fails the others: their launchers restarted them
                others = "".join(self.read(i["log"]) for i in r["incarnations"])
                self.assertIn("[launch] worker failed", others)
                self.assertGreater(r["metrics"]["lost_steps"]["recomputed"] + r["metrics"]["lost_steps"]["in_flight_at_crash"], 0)

    def test_no_hang_every_run_complete(self):
        for r in self.s["runs"]:
            self.assertEqual(r["status"], "complete", f"{r['config']} {r['churn']}: {r['failure']}")
            self.assertEqual(r["hangs"], [])
            self.assertEqual(r["metrics"]["hangs"], 0)
            self.assertTrue(all(v == STEPS for v in r["metrics"]["node_last_step"].values()), r["metrics"]["node_last_step"])
            self.assertIsNotNone(r["metrics"]["final_val_loss"])

    def test_no_sample_granted_twice_in_the_elastic_ps_configurations(self):
        for r in self.s["runs"]:
            m = r["metrics"]
            if r["config"] in PS_CONFIGS:
                self.assertEqual(m["duplicate_data"], 0, r["config"])
                self.assertTrue(m["exactly_once"]["ok"], (r["config"], r["churn"], m["exactly_once"]))
                self.assertGreaterEqual(m["data_positions"], NODES * STEPS * 0.5, "data_position was logged")
            elif r["config"] == "ring_elastic":  # one shared position per step, none for two steps
                self.assertEqual(m["duplicate_data"], 0, r["config"])
                self.assertEqual(m["data_positions"], STEPS, "every step's position was logged")
            elif r["config"] == "ring_diloco_elastic":  # the same, but a round's last step that the survivors of a
                # lost node applied themselves is logged by nobody (regroup() took them past it)
                self.assertEqual(m["duplicate_data"], 0, r["config"])
                self.assertEqual(m["data_positions"] + m["rounds_redone"], STEPS, m)
                if r["churn"]:
                    self.assertGreater(m["rounds_redone"], 0, "a kill9 mid-round broke a round")
            else:
                self.assertIsNone(m["duplicate_data"])
        ref = next(r for r in self.s["runs"] if r["config"] == "ps_bsp_backup" and not r["churn"])
        self.assertGreater(ref["metrics"]["lost_steps"]["dropped"], 0, "a backup worker's pushes are dropped")

    def test_the_time_to_target_is_the_first_evaluation_at_or_below_it(self):
        for r in self.s["runs"]:
            m = r["metrics"]
            self.assertEqual(m["target_loss"], TARGET)
            evals = []
            for node in os.listdir(r["dir"]):
                path = os.path.join(r["dir"], node, "metrics.jsonl")
                if os.path.exists(path):
                    with open(path) as f:
                        evals += [json.loads(ln) for ln in f if '"val_loss"' in ln]
            self.assertGreater(len([e for e in evals if not e.get("job_final")]), 1, r["dir"])
            hits = [e["unix_s"] for e in evals if e["val_loss"] <= TARGET]
            if not hits:
                self.assertIsNone(m["time_to_target_s"])
                continue
            t = m["time_to_target_s"]
            self.assertIsNotNone(t, r["dir"])
            self.assertLessEqual(t, m["time_to_end_s"] + 1e-6)
            launch = min(i["start_unix"] for i in r["incarnations"])
            self.assertAlmostEqual(t, min(hits) - launch, delta=1e-6)
        self.assertTrue(any(c["metric"] == "time_to_target_s" for c in self.s["comparisons"]))

    def test_goodput_in_0_1(self):
        for r in self.s["runs"]:
            g = r["metrics"]["goodput"]
            self.assertTrue(0 < g <= 1, f"{r['config']} churn={r['churn']}: goodput {g}")
            self.assertAlmostEqual(g, r["metrics"]["useful_samples"] / r["metrics"]["present_samples"])

    def test_the_markdown_shows_the_jsons_numbers(self):
        rows = {}
        for line in self.md.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == len(churn.RUN_HEAD) and cells[0] in churn.CONFIGS:
                rows[(cells[0], int(cells[1]), cells[2] == "churn")] = cells
        self.assertEqual(len(rows), len(self.s["runs"]))
        col = {h: i for i, h in enumerate(churn.RUN_HEAD)}
        for r in self.s["runs"]:
            m, cells = r["metrics"], rows[(r["config"], r["seed"], r["churn"])]
            self.assertEqual(cells, churn.run_cells(r))
            self.assertAlmostEqual(float(cells[col["goodput"]]), m["goodput"], delta=5e-4)
            self.assertAlmostEqual(float(cells[col["final val loss"]]), m["final_val_loss"], delta=5e-5)
            self.assertAlmostEqual(float(cells[col["time to end, s"]]), m["time_to_end_s"], delta=0.05)
            self.assertEqual(cells[col["events applied/planned"]], f"{m['events_applied']}/{m['events_planned']}")
            self.assertEqual(int(cells[col["hangs"]]), m["hangs"])
            dup = cells[col["duplicate data"]]
            self.assertEqual(None if dup == "n/a" else int(dup), m["duplicate_data"])
            lost = re.match(r"([\d.]+) \(([\d.]+) / (\d+) / (\d+)\)", cells[col["lost steps (dropped / recomputed / in flight)"]])
            self.assertIsNotNone(lost, cells)
            self.assertAlmostEqual(float(lost.group(1)), m["lost_steps"]["total"], delta=0.05)
            self.assertEqual(int(lost.group(3)), m["lost_steps"]["recomputed"])
        for c in self.s["comparisons"]:
            self.assertIn(f"| {c['config']} | {c['metric']} |", self.md)
            self.assertIn(c["verdict"], self.md)
            if c["metric"] == "time_to_target_s":  # paired only where both runs reached the target
                both = [r for r in self.s["runs"] if r["config"] == c["config"]
                        and r["metrics"]["time_to_target_s"] is not None]
                self.assertEqual(c["n"], 1 if len(both) == 2 else 0, c)
            else:
                self.assertEqual(c["n"], 1)
            self.assertTrue(c["verdict"].startswith(("not resolved", "identical")), c)
        self.assertNotIn("≈", self.md)
        churned = [r for r in self.s["runs"] if r["churn"]]
        applied = [e for r in churned for e in r["events"] if e["applied"]]
        self.assertIn(f"- {sum(len(r['events']) for r in churned)} events planned in {len(churned)} runs of "
                      f"{len(churn.CONFIGS)} configuration(s); {len(applied)} applied, {len(applied)} happened as the logs "
                      f"show, {len(applied)} survived", self.md)
        self.assertIn("hangs: 0; runs with duplicate data: 0; ps runs whose updates were not exactly once: 0 of "
                      f"{len(PS_CONFIGS) * len(churned) // len(churn.CONFIGS)}.", self.md)
        self.assertIn(f"Machine time: {self.s['machine_time_s']:.0f} s", self.md)
        for name in churn.NOT_BUILT:
            self.assertTrue(self.s["not_built"][name]["refused"], self.s["not_built"][name])
            self.assertIn(f"- {name} (", self.md)
        self.assertIn("not built", self.md)
        # rebuilt from the JSON alone, the report is the same
        before = self.md
        r = subprocess.run([PY, os.path.join(ROOT, "experiments", "churn.py"), "report", self.out], capture_output=True,
                           text=True, timeout=120, env=child_env())
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(self.out, "churn.md")) as f:
            self.assertEqual(f.read(), before)


@unittest.skipUnless(HAVE_BINARIES, f"the binaries are not built under {BIN} (scripts/build.sh)")
class Interrupt(unittest.TestCase):
    def test_ctrl_c_ends_every_process(self):
        tmp = tempfile.mkdtemp(prefix="syncopate-churn-test-")
        try:
            out = os.path.join(tmp, "out")
            p = subprocess.Popen([PY, os.path.join(ROOT, "experiments", "churn.py"), "run", "--out", out, "--seeds", "1",
                                  "--steps", "300", "--configs", "ps_bsp", "--corpus",
                                  write_corpus(os.path.join(tmp, "corpus.txt")), "--cache-dir", os.path.join(tmp, "cache")],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp, env=child_env())
            metrics = os.path.join(out, "runs", "ps_bsp", "churn", "seed0", "node2", "metrics.jsonl")
            deadline = time.time() + 60
            while time.time() < deadline and not (os.path.exists(metrics) and os.path.getsize(metrics) > 0):
                time.sleep(0.1)
            self.assertTrue(os.path.exists(metrics), "the nodes started")
            self.assertGreaterEqual(len(processes_mentioning(tmp)), 5, "2 servers and 3 nodes running")
            p.send_signal(signal.SIGINT)
            text, _ = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 130, text)
            self.assertIn("interrupted", text)
            self.assertEqual(processes_mentioning(tmp), [])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
