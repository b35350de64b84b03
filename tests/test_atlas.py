"""The crossover atlas and the STUDY.md check (experiments/atlas.py, experiments/check_study.py,
issue 27): a cell's winner per target on hand-built summaries (censored runs entered as the budget,
Holm over the winner's comparisons, resolved only where every comparison is), build and query on a
directory of cells (a cell not measured is said to be so), and check_study failing on a changed
number, an unreadable source and '≈', passing on the real docs/STUDY.md.
Run: .venv/bin/python tests/test_atlas.py"""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import atlas  # noqa: E402
import eval_spacing  # noqa: E402
import check_study  # noqa: E402
import published  # noqa: E402


def seeds(times, key="t"):
    """per_seed records with time_to_target_s[key] (None: censored)."""
    return [{"seed": i, "time_to_target_s": {key: t}, "val_loss_at_budget": 3.0} for i, t in enumerate(times)]


def summary(cfgs, budget=10.0, targets=(3.0,)):
    return {"configurations": {k: {"per_seed": seeds(v, "3"), "lr": 0.002} for k, v in cfgs.items()},
            "budget": {"kind": "time", "value": budget}, "targets": list(targets)}


class WinnerAt(unittest.TestCase):
    def test_a_clear_winner_is_resolved_against_every_other(self):
        s = summary({"ring": [5.0, 5.2, 4.9, 5.1, 5.3], "asp": [2.0, 2.3, 2.1, 1.9, 2.2], "bsp": [4.0, 4.1, 4.2, 3.9, 4.4]})
        w = atlas.winner_at(s, "3", 10.0)
        self.assertEqual(w["winner"], "asp")
        self.assertTrue(w["resolved"], w)
        self.assertEqual(w["runner_up"], "bsp")
        self.assertAlmostEqual(w["runner_up_ratio"], 4.1 / 2.1, places=6)
        self.assertAlmostEqual(w["vs_ring_ratio"], 5.1 / 2.1, places=6)

    def test_an_overlapping_runner_up_leaves_it_not_resolved_and_named(self):
        s = summary({"ring": [5.0, 5.2, 4.9, 5.1, 5.3], "asp": [2.0, 2.6, 2.1, 1.9, 2.2], "bsp": [2.5, 1.8, 2.3, 2.0, 2.1]})
        w = atlas.winner_at(s, "3", 10.0)
        self.assertFalse(w["resolved"])
        self.assertEqual(w["not_resolved_from"], [x for x in ("asp", "bsp") if x != w["winner"]])
        self.assertIn("not resolved from", atlas.cell_sentence({**w, "nodes": 8, "ratio": 1.0, "pattern": "slow",
                                                                "stage": "late", "target": 3.0, "budget_s": 10.0}))

    def test_censored_runs_enter_as_the_budget_a_lower_bound(self):
        # The ring never reaches it: its time is at least the budget; asp's lead over it is then
        # at least 10 - 2.1 and resolved (a paired t on the bounds understates the difference).
        s = summary({"ring": [None] * 5, "asp": [2.0, 2.3, 2.1, 1.9, 2.2]})
        w = atlas.winner_at(s, "3", 10.0)
        self.assertEqual(w["winner"], "asp")
        self.assertTrue(w["resolved"], w)
        self.assertIsNone(w["medians_s"]["ring"])
        self.assertIsNone(w["vs_ring_ratio"])
        sent = atlas.cell_sentence({**w, "nodes": 8, "ratio": 1.0, "pattern": "slow", "stage": "late", "target": 3.0,
                                    "budget_s": 10.0})
        self.assertIn("the ring did not reach it in half its seeds", sent)

    def test_a_time_past_the_budget_is_not_reached(self):
        # asp's schedule ran long: its 10.5 s crossings are after the 10 s budget, so they are censored.
        s = summary({"ring": [5.0, 5.2, 4.9, 5.1, 5.3], "asp": [2.0, 2.3, 10.5, 10.5, 10.5]})
        w = atlas.winner_at(s, "3", 10.0)
        self.assertEqual(w["winner"], "ring")
        self.assertEqual(w["reached"]["asp"], 2)

    def test_a_winner_censored_in_a_seed_is_not_resolved(self):
        # The budget would overstate the lead in the seed asp did not reach: never resolved then.
        s = summary({"ring": [9.0, 9.2, 8.9, 9.1, 9.3], "asp": [2.0, 2.3, 2.1, 1.9, None]})
        w = atlas.winner_at(s, "3", 10.0)
        self.assertEqual(w["winner"], "asp")
        self.assertFalse(w["resolved"])
        self.assertIn("did not reach it in every seed", atlas.cell_sentence(
            {**w, "nodes": 8, "ratio": 1.0, "pattern": "slow", "stage": "late", "target": 3.0, "budget_s": 10.0}))

    def test_a_failed_seed_is_censored_and_a_failed_configuration_named(self):
        s = summary({"ring": [5.0, 5.2, 4.9, 5.1, 5.3], "asp": [2.0, 2.3, 2.1, 1.9, 2.2]})
        s["seeds"] = [0, 1, 2, 3, 4]
        s["configurations"]["asp"]["per_seed"] = s["configurations"]["asp"]["per_seed"][:2]  # 3 runs failed
        s["configurations"]["ssp4"] = {"per_seed": []}                                      # every run failed
        w = atlas.winner_at(s, "3", 10.0)
        self.assertEqual(w["reached"]["asp"], 2)
        self.assertEqual(w["winner"], "ring")  # asp's median is censored: 3 of 5 seeds failed
        self.assertEqual(w["failed"], ["ssp4"])
        self.assertIn("Failed in every seed: ssp4", atlas.cell_sentence(
            {**w, "nodes": 8, "ratio": 1.0, "pattern": "slow", "stage": "late", "target": 3.0, "budget_s": 10.0}))

    def test_censored_in_more_than_half_the_seeds_is_no_median(self):
        s = summary({"ring": [None, None, None, 4.0, 4.1], "asp": [None, None, None, None, None]})
        w = atlas.winner_at(s, "3", 10.0)
        self.assertIsNone(w["winner"])
        self.assertIn("no configuration", w["why"])


class BuildAndQuery(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        d = atlas.cell_dir(self.tmp.name, 8, 1.0, "slow")
        os.makedirs(d)
        s = summary({"ring": [5.0, 5.2, 4.9, 5.1, 5.3], "asp_lr_scale": [2.0, 2.3, 2.1, 1.9, 2.2]})
        with open(os.path.join(d, "summary.json"), "w") as f:
            json.dump(s, f)

    def tearDown(self):
        self.tmp.cleanup()

    def run_cli(self, *argv):
        old = sys.argv
        sys.argv = ["atlas.py"] + list(argv)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                rc = atlas.main()
        finally:
            sys.argv = old
        return rc, out.getvalue()

    def test_build_writes_records_and_winners_and_query_answers(self):
        rc, _ = self.run_cli("build", "--out", self.tmp.name)
        self.assertIn(rc, (0, None))
        with open(os.path.join(self.tmp.name, "atlas.json")) as f:
            doc = json.load(f)
        self.assertEqual(len(doc["records"]), 10)  # 2 configurations x 5 seeds
        self.assertEqual(len(doc["winners"]), 1)
        self.assertEqual(doc["winners"][0]["winner"], "asp_lr_scale")
        rc, out = self.run_cli("query", "--out", self.tmp.name, "--nodes", "8", "--ratio", "1", "--pattern", "slow")
        self.assertEqual(rc, 0)
        self.assertIn("asp_lr_scale (resolved)", out)
        self.assertEqual(doc["winners"][0]["sentence"],
                         "N=8, ratio 1, stragglers slow, 3 target 3: first asp_lr_scale (reached it in 5 of 5 seeds), "
                         "median 2.1 s of the 10 s budget; runner-up ring at 2.43x its time; 2.43x sooner than the "
                         "ring (no overlap); resolved against every other configuration (paired over 5 seeds, Holm).")
        self.assertIn("2.43x sooner than the ring", out)
        rc, out = self.run_cli("query", "--out", self.tmp.name, "--nodes", "64", "--ratio", "1", "--pattern", "slow")
        self.assertEqual(rc, 1)
        self.assertIn("not measured", out)
        self.assertIn("N=8 r=1 slow", out)


class Published(unittest.TestCase):
    def test_each_claim_gets_its_verdict_from_the_cells(self):
        with tempfile.TemporaryDirectory() as out:
            d = atlas.cell_dir(out, 8, 1.0, "slow")
            os.makedirs(d)
            s = summary({"bsp_backup": [2.0, 2.2, 2.1, 1.9, 2.0], "asp": [3.0, 3.3, 3.1, 2.9, 3.2],
                         "asp_lr_scale": [3.0, 3.4, 3.0, 2.8, 3.3], "asp_dc_asgd": [2.9, 3.2, 3.2, 3.0, 3.1],
                         "ring": [8.0, 8.1, None, 8.3, 8.2]})
            with open(os.path.join(d, "summary.json"), "w") as f:
                json.dump(s, f)
            doc = published.evaluate(out)
            v = [c["verdict"] for c in doc["claims"]]
            self.assertEqual(v[0], "reproduced", doc["claims"][0])     # backup workers 1 s sooner in every seed
            self.assertEqual(v[1], "not contradicted", doc["claims"][1])  # first in the cell: no equivalence test
            self.assertEqual(v[2], "not measured")                     # DiLoCo's long runs are not atlas cells
            self.assertEqual(v[3], "not resolved", doc["claims"][3])   # the mitigations within ASP's noise
            self.assertEqual(len(doc["claims"][3]["comparisons"]), 2)

    def test_claim_3_reads_the_horizon_studies_at_their_longest_length(self):
        def comp(length, diff, resolved, equivalent):
            c = {"a": "diloco10", "b": "ring", "metric": "val_loss_at_budget", "mean_diff": diff,
                 "ci95": [diff - 0.01, diff + 0.01], "p": 0.001 if resolved else 0.5, "p_holm": 0.002 if resolved else 0.6,
                 "n": 5, "left_out": 0, "diffs": [diff] * 5, "deterministic": False, "resolved": resolved}
            if equivalent is not None:
                c["tost"] = {"margin": 0.02, "p": 0.01 if equivalent else 0.4, "ci90": [diff - 0.008, diff + 0.008],
                             "equivalent": equivalent}
            return c
        with tempfile.TemporaryDirectory() as out:
            for length, c in ((300, comp(300, 0.08, True, False)), (1000, comp(1000, 0.005, False, True))):
                d = os.path.join(out, "horizon", "N8", f"L{length}")
                os.makedirs(d)
                with open(os.path.join(d, "summary.json"), "w") as f:
                    json.dump({"comparisons": [c]}, f)
            doc = published.evaluate(out)
            c3 = doc["claims"][2]
            self.assertEqual(c3["verdict"], "reproduced", c3)  # equivalent within 0.02 nats at 1000 steps
            self.assertIn("1000 steps per node", c3["sentence"])
            self.assertEqual([x["length"] for x in c3["comparisons"]], [300, 1000])
            # Resolved worse at both lengths but the gap closing (0.08 -> 0.06): not resolved; not closing: contradicted.
            with open(os.path.join(out, "horizon", "N8", "L1000", "summary.json"), "w") as f:
                json.dump({"comparisons": [comp(1000, 0.06, True, False)]}, f)
            self.assertEqual(published.evaluate(out)["claims"][2]["verdict"], "not resolved")
            with open(os.path.join(out, "horizon", "N8", "L1000", "summary.json"), "w") as f:
                json.dump({"comparisons": [comp(1000, 0.09, True, False)]}, f)
            self.assertEqual(published.evaluate(out)["claims"][2]["verdict"], "contradicted")
            # One length alone never contradicts "once runs are long enough".
            import shutil
            shutil.rmtree(os.path.join(out, "horizon", "N8", "L1000"))
            self.assertEqual(published.evaluate(out)["claims"][2]["verdict"], "not resolved")


class CheckStudy(unittest.TestCase):
    def setUp(self):
        # Cited paths are resolved from a root of the test's own (nothing is written in the repository,
        # where Scripts.EveryScriptAnswersHelp checks that nothing appears while it runs).
        self.tmp = tempfile.TemporaryDirectory()
        self.rel = "cited"
        os.makedirs(os.path.join(self.tmp.name, self.rel))
        with open(os.path.join(self.tmp.name, self.rel, "summary.json"), "w") as f:
            json.dump({"conclusions": ["a - b, val_loss_at_budget: -0.1 nats [-0.2, -0.05], p = 0.01, Holm p = 0.02; "
                                       "5 paired seeds. Resolved: a is better."]}, f)

    def tearDown(self):
        self.tmp.cleanup()

    def check(self, text):
        p = os.path.join(self.tmp.name, "STUDY.md")
        with open(p, "w") as f:
            f.write(text)
        return check_study.check(p, root=self.tmp.name)

    def test_a_verbatim_quote_passes_and_a_changed_number_fails(self):
        good = ("- «a - b, val_loss_at_budget: -0.1 nats [-0.2, -0.05], p = 0.01, Holm p = 0.02; 5 paired seeds. "
                f"Resolved: a is better.» — [summary]({self.rel}/summary.json)\n")
        problems, quotes, files = self.check(good)
        self.assertEqual((problems, quotes, files), ([], 1, 1))
        problems, _, _ = self.check(good.replace("-0.05]", "-0.06]"))
        self.assertEqual(len(problems), 1)
        self.assertIn("does not state", problems[0])

    def test_a_missing_source_and_the_approx_sign_fail(self):
        problems, _, _ = self.check(f"- «x» — [s]({self.rel}/absent.json)\nring ≈ asp\nnever written as \"≈\"\n")
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("cannot be read", problems[0])
        self.assertIn("'≈'", problems[1])

    def test_a_stale_summary_fails_where_its_data_no_longer_gives_the_sentence(self):
        with open(os.path.join(ROOT, "docs", "study", "demo", "summary.json")) as f:
            demo = json.load(f)
        quote = demo["conclusions"][0]  # asp - ring, val_loss_at_budget: ...
        with open(os.path.join(self.tmp.name, self.rel, "demo.json"), "w") as f:
            json.dump(demo, f)
        line = f"- «{quote}» — [s]({self.rel}/demo.json)\n"
        self.assertEqual(self.check(line)[0], [])
        demo["configurations"]["asp"]["per_seed"][0]["val_loss_at_budget"] += 0.05  # the data moved on
        with open(os.path.join(self.tmp.name, self.rel, "demo.json"), "w") as f:
            json.dump(demo, f)
        problems, _, _ = self.check(line)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("stale", problems[0])

    def test_a_malformed_quote_and_no_quote_at_all_fail(self):
        problems, quotes, _ = self.check("- «half a quote, no source\n")
        self.assertEqual(quotes, 0)
        self.assertEqual(len(problems), 2, problems)

    def test_the_real_study_passes(self):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "check_study.py")], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


class EvalSpacing(unittest.TestCase):
    """experiments/eval_spacing.py: a cell re-read at a sparser evaluation spacing."""

    CELL = os.path.join(ROOT, "docs", "study", "atlas", "cells", "N64", "r1_none")

    def load(self):
        with open(os.path.join(self.CELL, "summary.json")) as f:
            return json.load(f)

    def test_every_evaluation_kept_gives_the_published_sentences(self):
        with open(os.path.join(ROOT, "docs", "study", "atlas", "atlas.json")) as f:
            published = [w["sentence"] for w in json.load(f)["winners"] if (w["nodes"], w["ratio"], w["pattern"]) ==
                         (64, 1.0, "none")]
        rows = eval_spacing.verdicts(eval_spacing.thinned(self.load(), 1), "N64/r1_none")
        self.assertEqual([w["sentence"] for w in rows], published)

    def test_a_sparser_reading_keeps_every_kth_point_and_the_final_one(self):
        s = self.load()
        t = eval_spacing.thinned(s, 2)
        for name, c in s["configurations"].items():
            for seed, cv in c["curves"].items():
                kept = t["configurations"][name]["curves"][seed]
                final = [p for p in cv if p.get("job_final")] or cv[-1:]  # (a ring's last multiple is its end)
                body = [p for p in cv if p not in final]
                self.assertEqual(kept[:-1], body[1::2])
                self.assertEqual(kept[-1], cv[-1])
        self.assertEqual(t["job"]["evals"], s["job"]["evals"] // 2)
        # The brackets are recomputed from the kept points: a sparser grid's bracket around a crossing holds the
        # dense grid's (its points are a subset, the final one kept), and a target reached stays reached.
        widened = 0
        for name, c in s["configurations"].items():
            for a, b in zip(c["per_seed"], t["configurations"][name]["per_seed"]):
                for k, v in a["time_to_target_bracket_s"].items():
                    w = b["time_to_target_bracket_s"][k]
                    self.assertEqual(v is None, w is None, (name, a["seed"], k))
                    if v is not None:
                        self.assertLessEqual(w[0], v[0])
                        self.assertGreaterEqual(w[1], v[1])
                        widened += (w[1] - w[0]) > (v[1] - v[0])
        self.assertGreater(widened, 0, "no bracket was recomputed from the sparser points")



class KeptCells(unittest.TestCase):
    def test_a_kept_cell_of_the_other_schedule_is_refused_by_name(self):
        d = tempfile.mkdtemp()
        shutil.copytree(os.path.join(ROOT, "docs", "study", "atlas", "references"), os.path.join(d, "references"))
        cell = os.path.join(d, "cells", "N8", "r0.1_none")
        shutil.copytree(os.path.join(ROOT, "docs", "study", "atlas", "cells", "N8", "r0.1_none"), cell)
        cmd = [sys.executable, os.path.join(ROOT, "experiments", "atlas.py"), "run", "--nodes", "8", "--ratios", "0.1",
               "--patterns", "none", "--out", d, "--runs", os.path.join(d, "runs"), "--dry-run"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)  # made by steps, asked by steps: kept
        self.assertIn("(kept)", r.stdout)
        r = subprocess.run(cmd + ["--schedule-by", "time"], capture_output=True, text=True, timeout=120)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("was scheduled by steps, this run asks for --schedule-by time", r.stderr)

if __name__ == "__main__":
    unittest.main(verbosity=2)
