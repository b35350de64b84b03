"""A switch mid-run (experiments/switch_midrun.py, issue 29): the analysis on hand-built runs whose
answers are known. A switch 1.5x sooner in every seed is a speed-up shown and resolved; one that
misses the target in a seed shows none and says so; a failed switching run is named as the feature
failing; an invalid run is left out; the target is the ring's worst final loss; check_study accepts
a quoted conclusion of switch.json and refuses it once the file's runs no longer give it. No cluster
is started. Run: .venv/bin/python tests/test_switch_midrun.py"""
import copy
import json
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import check_study  # noqa: E402
import switch_midrun  # noqa: E402


def run(t_cross, final, end, node0=None, valid=True):
    """A run whose loss falls linearly from 3.0 at t = 0 to `final` at t_cross, then stays."""
    curve = [[0.0, 3.0], [t_cross, final], [end, final]]
    return {"curve": curve, "final_val_loss": final, "end_s": end, "valid": valid, "invalid_because": "" if valid else "x",
            "node_ends_s": {"node0": node0 if node0 is not None else end}}


def runs(switch_times, switch_final=2.0, seeds=("100", "101", "102")):
    out = {"ring": {}, "bsp_backup": {}, "switch": {}}
    for i, sd in enumerate(seeds):
        out["ring"][sd] = run(60.0 + i, 2.0 + 0.01 * i, 62.0 + i)  # target: 2.02 (the worst ring's final)
        out["bsp_backup"][sd] = run(30.0, 2.1, 64.0)                # never reaches it
        out["switch"][sd] = run(switch_times[i], switch_final, 66.0, node0=45.0)
    return out


class Analyse(unittest.TestCase):
    def test_a_switch_sooner_in_every_seed_is_shown_and_resolved(self):
        doc = switch_midrun.analyse(runs([40.0, 41.0, 42.0]))
        self.assertAlmostEqual(doc["target"], 2.02)
        self.assertTrue(doc["speedup_met"])
        self.assertEqual(doc["best_static"], "ring")
        self.assertTrue(any("is shown" in c and "resolved: the switch is sooner" in c for c in doc["conclusions"]),
                        doc["conclusions"])
        self.assertTrue(any(c.startswith("Missed the target in some seed") and "bsp_backup" in c
                            for c in doc["conclusions"]))
        # Its end (66 s) is later than the ring's (62-64 s) in every seed: said, resolved, no 1.3x.
        self.assertTrue(any("The job's end" in c and "resolved: later" in c and "not clearing the issue's 1.3x" in c
                            for c in doc["conclusions"]), doc["conclusions"])
        self.assertFalse(doc["end_ratio_clears_target"])

    def test_a_job_end_1_4x_sooner_in_every_seed_clears_the_bar_on_that_reading(self):
        r = runs([40.0, 41.0, 42.0])
        for i, sd in enumerate(("100", "101", "102")):
            r["switch"][sd]["end_s"] = (62.0 + i) / (1.4 + 0.01 * i)
        doc = switch_midrun.analyse(r)
        self.assertTrue(doc["end_ratio_clears_target"])
        self.assertAlmostEqual(doc["end_ratio_ring_over_switch"]["mean"], 1.41)
        self.assertTrue(any("resolved: sooner" in c and "clearing the issue's 1.3x" in c for c in doc["conclusions"]),
                        doc["conclusions"])

    def test_a_miss_shows_no_speed_up_and_a_failure_is_named(self):
        r = runs([40.0, 41.0, 42.0])
        r["switch"]["101"] = run(41.0, 2.05, 66.0)  # ends above the target
        doc = switch_midrun.analyse(r)
        self.assertFalse(doc["speedup_met"])
        self.assertTrue(any("in 2 of 3 seeds only: no speed-up is shown" in c for c in doc["conclusions"]))
        r = runs([40.0, 41.0, 42.0])
        r["switch"]["102"] = {"failed": "exit 1", "log": "x"}
        doc = switch_midrun.analyse(r)
        self.assertEqual(doc["switch_failed_seeds"], ["102"])
        self.assertTrue(any("FAILED in seed(s) 102" in c for c in doc["conclusions"]))
        self.assertFalse(doc["speedup_met"])
        self.assertEqual(doc["paired_seeds"], ["100", "101"])

    def test_an_invalid_run_is_left_out_and_listed(self):
        r = runs([40.0, 41.0, 42.0])
        r["ring"]["102"] = run(60.0, 2.5, 62.0, valid=False)  # would have set the target to 2.5
        doc = switch_midrun.analyse(r)
        self.assertAlmostEqual(doc["target"], 2.01)
        self.assertEqual(doc["invalid"], {"ring": {"102": "x"}})


class CheckStudy(unittest.TestCase):
    def test_a_quote_holds_while_the_runs_give_it(self):
        r = runs([40.0, 41.0, 42.0])
        doc = switch_midrun.analyse(copy.deepcopy(r))
        doc["runs"] = r
        with tempfile.TemporaryDirectory(dir=ROOT) as d:
            path = os.path.join(d, "switch.json")
            rel = os.path.relpath(path, ROOT)
            study = os.path.join(d, "STUDY.md")
            with open(path, "w") as f:
                json.dump(doc, f)
            with open(study, "w") as f:
                f.write(f"- «{doc['conclusions'][0]}» — [switch]({rel})\n")
            self.assertEqual(check_study.check(study)[0], [])
            doc["runs"]["switch"]["100"] = run(70.0, 2.0, 72.0)  # the data no longer gives the sentence
            with open(path, "w") as f:
                json.dump(doc, f)
            self.assertNotEqual(check_study.check(study)[0], [])


if __name__ == "__main__":
    unittest.main()
