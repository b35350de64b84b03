"""experiments/churn_sim.py: churn.py's simulator backend, run for real through syncopate-sim (no
processes of the job, virtual time): the records a churn study reads, determinism (a study validated
against itself passes every check with zero differences), the schedule's translation, and the refusals."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import churn_sim  # noqa: E402

BIN = os.environ.get("SYNCOPATE_BIN") or os.path.join(ROOT, "build", "bin")
PY = sys.executable
# Dense churn on a short job: every seed here draws events in its first seconds.
RUN = ["--backend", "sim", "--sim-start-s", "0.3", "--configs", "ps_asp,ps_async_local_sgd", "--seeds", "2",
       "--first-seed", "40", "--steps", "40", "--events-per-min", "120", "--val-windows", "16"]


def load(path):
    with open(path) as f:
        return json.load(f) if path.endswith(".json") else f.read()


def churn_py(*args):
    env = dict(os.environ, SYNCOPATE_BIN=BIN, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([PY, os.path.join(ROOT, "experiments", "churn.py"), *args], capture_output=True, text=True,
                          env=env, timeout=600)


class ChurnSimTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(os.path.join(BIN, "syncopate-sim")):
            raise RuntimeError(f"{BIN}/syncopate-sim is not built (scripts/build.sh)")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.a, cls.b = os.path.join(cls.tmp.name, "a"), os.path.join(cls.tmp.name, "b")
        for out in (cls.a, cls.b):
            p = churn_py("run", "--out", out, *RUN)
            if p.returncode != 0:
                raise RuntimeError(f"churn.py --backend sim failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        cls.s = load(os.path.join(cls.a, "churn.json"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_run_is_a_complete_simulated_record_with_its_events(self):
        s = self.s
        self.assertEqual(s["settings"]["backend"], "sim")
        churned = [r for r in s["runs"] if r["churn"]]
        self.assertEqual(len(churned), 4)  # 2 configurations x 2 seeds, each seed with events
        for r in s["runs"]:
            self.assertEqual(r["status"], "complete", r.get("failure"))
            self.assertEqual(r["backend"], "sim")
            m = r["metrics"]
            self.assertEqual(m["duplicate_data"], 0)
            self.assertTrue(m["exactly_once"]["ok"], m["exactly_once"])
            self.assertGreater(m["goodput"], 0.5)
            self.assertLessEqual(m["goodput"], 1.0 + 1e-9)
            self.assertIsNotNone(m["final_val_loss"])
        for r in churned:
            self.assertGreater(r["metrics"]["events_applied"], 0)
            # the run's own schedule reached the simulator, event for event, on churn.py's clock: from the
            # moment every first node logged its first step, half a poll late
            sim = load(os.path.join(r["dir"], "sim.json"))["membership"]["events"]
            self.assertEqual([(e["kind"], e["worker"]) for e in sim], [(e["kind"], e["node"]) for e in r["events"]])
            t0 = max(next(json.loads(ln) for ln in load(os.path.join(r["dir"], f"node{n}", "metrics.jsonl")).splitlines()
                          if '"loss"' in ln)["time_s"] for n in range(3))
            for e, planned in zip(sim, r["events"]):
                self.assertAlmostEqual(e["at_s"] - t0, planned["t_s"] + 0.05, places=6)
        refs = {(r["config"], r["seed"]): r for r in s["runs"] if not r["churn"]}
        for r in churned:  # the events cost goodput against the same seed without them
            self.assertLess(r["metrics"]["goodput"], refs[(r["config"], r["seed"])]["metrics"]["goodput"])
        md = load(os.path.join(self.a, "churn.md"))
        self.assertIn("Backend: syncopate-sim", md)

    def test_a_study_validated_against_its_own_replay_passes_with_zero_differences(self):
        out = os.path.join(self.tmp.name, "v")
        p = subprocess.run([PY, os.path.join(ROOT, "experiments", "churn_sim.py"), "validate", self.a, self.b, "--out", out],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        v = load(os.path.join(out, "validation.json"))
        self.assertIsNone(v["start_up"])  # a simulated study has no processes to calibrate from
        for name, checks in v["checks"].items():
            for fig, c in checks.items():
                self.assertEqual(c["verdict"], "pass", (name, fig, c))
                self.assertTrue(all(abs(x) < 1e-12 for x in c["diffs"].values()), (name, fig, c["diffs"]))
        p = subprocess.run([PY, os.path.join(ROOT, "experiments", "churn_sim.py"), "calibrate", self.a],
                           capture_output=True, text=True, timeout=120)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("an emulated one is needed", p.stderr)

    def test_the_schedule_becomes_sim_churn_text(self):
        evs = [{"i": 0, "t_s": 1.5, "kind": "kill9", "node": 1, "delay_s": 2.25},
               {"i": 1, "t_s": 3.0, "kind": "join", "node": 3, "delay_s": 1.0},
               {"i": 2, "t_s": 4.125, "kind": "sigterm", "node": 0, "delay_s": 1.5}]
        self.assertEqual(churn_sim.sim_schedule(evs), "kill9@1.5:1:2.25,join@3.0:3,sigterm@4.125:0:1.5")
        self.assertEqual(churn_sim.sim_schedule([]), "")

    def test_ring_configurations_are_refused_by_name(self):
        p = churn_py("run", "--out", os.path.join(self.tmp.name, "r"), "--backend", "sim", "--configs", "ps_asp,ring_elastic")
        self.assertEqual(p.returncode, 2)
        self.assertIn("drop ring_elastic", p.stderr)


if __name__ == "__main__":
    unittest.main()
