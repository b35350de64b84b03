"""Advice against hindsight (experiments/hindsight.py, issue 29): the analysis on hand-built
scenarios whose answers are known (the advised pick is the best, is 1.3x the best and resolved
behind it, missed the target; a scenario with a run that did not hold is left out of the overall
figures), Kendall's tau-b, how a candidate becomes local_cluster.sh flags, the refusals of the
command line, and check_study accepting a quoted sentence of hindsight.json and refusing it once the
file's data no longer gives it. No cluster is started.
Run: .venv/bin/python tests/test_hindsight.py"""
import contextlib
import copy
import io
import json
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import check_study  # noqa: E402
import hindsight  # noqa: E402
from stats import kendall_tau_b  # noqa: E402


def scenario(name, advised, measured, predicted, invalid=None, failed=None):
    """A scenario record as scenario_record writes it; times per candidate, one per seed."""
    s = hindsight.SCENARIOS["fast4"]
    end = {k: {str(i): 100.0 for i in range(len(v))} for k, v in measured.items()}
    return {"name": name, "scenario": s, "describe": hindsight.describe(s), "advised": advised,
            "measured": {k: {str(i): t for i, t in enumerate(v)} for k, v in measured.items()},
            "predicted": {k: {str(i): t for i, t in enumerate(v)} for k, v in predicted.items()},
            "end_s": end, "invalid_runs": invalid or {}, "failed_runs": failed or {}}


def doc(*scenarios):
    return hindsight.analyse({"format": hindsight.FORMAT, "command": "test", "target_loss": 3.0, "steps": 150,
                              "scenarios": list(scenarios)})


class Analysis(unittest.TestCase):
    def test_an_advised_best_is_within_and_its_errors_and_order_are_measured(self):
        sc = scenario("a", "asp", measured={"ring": [10.0, 11.0, 12.0], "asp": [5.0, 5.5, 6.0], "bsp": [8.0, 8.5, 9.0]},
                      predicted={"ring": [12.0, 12.0, 12.0], "asp": [5.5, 5.5, 5.5], "bsp": [7.0, 7.0, 7.0]})
        d = doc(sc)
        s = d["scenarios"][0]
        self.assertEqual(s["best"], "asp")
        self.assertAlmostEqual(s["regret"], 1.0)
        self.assertTrue(s["within"])
        self.assertAlmostEqual(s["relative_error"]["ring"], 12.0 / 11.0 - 1.0)
        self.assertAlmostEqual(s["relative_error"]["asp"], 0.0)
        self.assertAlmostEqual(s["tau"], 1.0)  # the same order both ways
        self.assertIn("it was the best in hindsight", s["sentence"])
        self.assertEqual(d["overall"]["within"], 1)
        # errors 1/11, 0, 7/8.5 - 1: median 1/11
        self.assertAlmostEqual(d["overall"]["median_abs_error"], 1.0 / 11.0)
        self.assertTrue(any("in 1 (100%" in c and ": met)" in c for c in d["conclusions"]), d["conclusions"])

    def test_an_advised_pick_one_third_slower_and_resolved_behind_is_outside(self):
        sc = scenario("b", "ring", measured={"ring": [13.0, 13.4, 12.9, 13.2], "asp": [10.0, 10.1, 9.9, 10.2]},
                      predicted={"ring": [9.0] * 4, "asp": [10.0] * 4})
        d = doc(sc)
        s = d["scenarios"][0]
        self.assertEqual(s["best"], "asp")
        self.assertAlmostEqual(s["regret"], 13.125 / 10.05)
        self.assertFalse(s["within"])
        self.assertIn("outside 1.10x", s["sentence"])
        self.assertIn("resolved behind it", s["sentence"])
        self.assertIsNone(s["tau"])  # two candidates: no order worth a tau
        self.assertTrue(any("in 0 (0%" in c and "not met" in c for c in d["conclusions"]), d["conclusions"])

    def test_an_advised_pick_that_missed_the_target_is_outside(self):
        sc = scenario("c", "diloco50", measured={"diloco50": [None, 20.0, None], "ring": [10.0, 11.0, 10.5]},
                      predicted={"diloco50": [8.0] * 3, "ring": [10.0] * 3})
        s = doc(sc)["scenarios"][0]
        self.assertFalse(s["within"])
        self.assertIn("missed the target in 2 of 3 seeds", s["sentence"])
        self.assertNotIn("diloco50", s["relative_error"])  # not reached in every seed: no error figure

    def test_a_scenario_whose_emulation_did_not_hold_is_left_out(self):
        good = scenario("a", "asp", measured={"ring": [10.0, 11.0], "asp": [5.0, 5.5]},
                        predicted={"ring": [10.0, 10.0], "asp": [5.0, 5.0]})
        bad = scenario("bad", "ring", measured={"ring": [1.0, 1.0], "asp": [50.0, 50.0]},
                       predicted={"ring": [10.0, 10.0], "asp": [5.0, 5.0]}, invalid={"asp": ["101"]})
        d = doc(good, bad)
        self.assertFalse(d["scenarios"][1]["valid"])
        self.assertIn("not evaluated: the emulation did not hold in asp seed 101", d["scenarios"][1]["sentence"])
        self.assertEqual(d["overall"]["evaluated"], 1)
        self.assertEqual(d["overall"]["within"], 1)
        self.assertAlmostEqual(d["overall"]["median_abs_error"], 1.0 - 10.0 / 10.5)  # the bad scenario's 9x is not in it


class Tau(unittest.TestCase):
    def test_tau_b(self):
        self.assertAlmostEqual(kendall_tau_b([1, 2, 3, 4], [10, 20, 30, 40]), 1.0)
        self.assertAlmostEqual(kendall_tau_b([1, 2, 3, 4], [4, 3, 2, 1]), -1.0)
        self.assertAlmostEqual(kendall_tau_b([1, 2, 3], [1, 3, 2]), 1.0 / 3.0)
        # ties: tau-b's normalisation (scipy.stats.kendalltau([1,1,2],[1,2,3]) = 0.8165)
        self.assertAlmostEqual(kendall_tau_b([1, 1, 2], [1, 2, 3]), 2.0 / (3 * 2) ** 0.5, places=6)
        self.assertIsNone(kendall_tau_b([1, 1], [2, 3]))


class Flags(unittest.TestCase):
    def test_a_ps_candidate_becomes_server_and_worker_flags(self):
        c = hindsight.candidate_cfg("bsp_backup", 8)
        self.assertFalse(c["ring"])
        self.assertEqual(c["cluster"], ["--consistency", "bsp", "--backup-workers", "1"])
        self.assertEqual(c["worker"], ["--dist.mode=ps"])
        r = hindsight.candidate_cfg("diloco50", 4)
        self.assertTrue(r["ring"])
        self.assertEqual(r["cluster"], [])
        self.assertIn("--dist.sync_every=50", r["worker"])

    def test_refusals_name_the_problem(self):
        for argv, words in ((["--scenarios", "nope"], "unknown scenario"), (["--first-seed", "1"], "overlaps"),
                            (["--seeds", "1"], "2 or more")):
            err = io.StringIO()
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(err):
                hindsight.parse_args(argv)
            self.assertIn(words, err.getvalue())


class StudyCheck(unittest.TestCase):
    def test_a_quoted_sentence_holds_until_the_data_changes(self):
        d = doc(scenario("a", "asp", measured={"ring": [10.0, 11.0, 12.0], "asp": [5.0, 5.5, 6.0]},
                         predicted={"ring": [12.0] * 3, "asp": [5.5] * 3}))
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "docs"))
            with open(os.path.join(root, "docs", "hindsight.json"), "w") as f:
                json.dump(d, f)
            study = os.path.join(root, "STUDY.md")
            with open(study, "w") as f:
                f.write(f"- «{d['conclusions'][0]}» — [hindsight](docs/hindsight.json)\n")
            problems, quotes, _ = check_study.check(study, root)
            self.assertEqual((problems, quotes), ([], 1))
            stale = copy.deepcopy(d)
            stale["scenarios"][0]["measured"]["asp"]["0"] = 9.0  # the data moved, the sentence did not
            with open(os.path.join(root, "docs", "hindsight.json"), "w") as f:
                json.dump(stale, f)
            problems, _, _ = check_study.check(study, root)
            self.assertEqual(len(problems), 1, problems)
            self.assertIn("stale", problems[0])


if __name__ == "__main__":
    unittest.main()
