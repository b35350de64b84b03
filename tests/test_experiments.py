"""The study tooling: statistics against hand-computed intervals, scenario validation and
derivation, time to target, refusals of impossible emulations, and smoke runs of both experiment
scripts (real processes on loopback, tiny settings) that check every file they must write and that
a configuration failing inside a study is reported while the others complete."""
import contextlib
import glob
import io
import json
import math
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import cluster_runs  # noqa: E402
import cost  # noqa: E402
import method  # noqa: E402
import scenario  # noqa: E402
import study  # noqa: E402
import validate_sim  # noqa: E402
import stats  # noqa: E402
from stats import mean_ci95, separated, t975  # noqa: E402

PY = sys.executable
# Every directory a test writes lies under one temporary directory, removed when the tests end
# (pass or fail): nothing is left in /tmp.
_SCRATCH = tempfile.TemporaryDirectory(prefix="syncopate-experiments-test-")
# The studies' stored cost measurements (experiments/cost.py) go there too, not to runs/.
os.environ["SYNCOPATE_STUDY_COST"] = os.path.join(_SCRATCH.name, "study_cost.json")


def mkdtemp():
    return tempfile.mkdtemp(dir=_SCRATCH.name)


class Stats(unittest.TestCase):
    def test_interval_of_three_values_by_hand(self):
        # mean 2, sd 1, t(0.975, 2) = 4.303: half width 4.303 / sqrt(3) = 2.48434
        s = mean_ci95([1.0, 2.0, 3.0])
        self.assertAlmostEqual(s["mean"], 2.0)
        self.assertAlmostEqual(s["sd"], 1.0)
        self.assertAlmostEqual(s["ci95"][0], 2.0 - 2.48434, places=4)
        self.assertAlmostEqual(s["ci95"][1], 2.0 + 2.48434, places=4)

    def test_interval_of_five_values_by_hand(self):
        # 10, 11, 12, 13, 14: mean 12, sd sqrt(2.5) = 1.58114, t(0.975, 4) = 2.776: half 1.96293
        s = mean_ci95([14, 10, 12, 11, 13])
        self.assertAlmostEqual(s["ci95"][0], 12 - 1.96293, places=4)
        self.assertAlmostEqual(s["ci95"][1], 12 + 1.96293, places=4)

    def test_t_quantiles(self):
        self.assertAlmostEqual(t975(1), 12.706)
        self.assertAlmostEqual(t975(10), 2.228)
        self.assertAlmostEqual(t975(120), 1.980, places=2)
        with self.assertRaises(ValueError):
            t975(0)

    def test_one_value_and_none_resolve_nothing(self):
        self.assertEqual(mean_ci95([]), {"mean": None, "ci95": [None, None], "n": 0, "sd": None})
        one = mean_ci95([3.0, None])
        self.assertEqual((one["n"], one["ci95"]), (1, [3.0, 3.0]))
        self.assertFalse(separated(one, mean_ci95([9.0])))

    def test_separation(self):
        a, b, c = mean_ci95([1.0, 1.1, 0.9]), mean_ci95([2.0, 2.1, 1.9]), mean_ci95([1.0, 2.0, 3.0])
        self.assertTrue(separated(a, b))
        self.assertFalse(separated(a, c))


class PairedStats(unittest.TestCase):
    """The t distribution, the paired test, Holm and TOST against numbers computed by hand or by
    closed forms independent of the incomplete-beta code (df 1, 2 and 3 have elementary CDFs)."""

    def test_t_cdf_against_closed_forms(self):
        for t in (-3.0, -0.5, 0.0, 0.7, 2.0, 12.706):
            self.assertAlmostEqual(stats.t_cdf(t, 1), 0.5 + math.atan(t) / math.pi, places=10)  # Cauchy
            self.assertAlmostEqual(stats.t_cdf(t, 2), 0.5 + t / (2 * math.sqrt(2 + t * t)), places=10)
            u = t / math.sqrt(3)
            self.assertAlmostEqual(stats.t_cdf(t, 3), 0.5 + (u / (1 + u * u) + math.atan(u)) / math.pi, places=10)

    def test_table_points(self):
        # The printed tables' two-sided 5% points: p = 0.05 to the tables' 3 decimals.
        self.assertAlmostEqual(stats.t_two_sided_p(2.776, 4), 0.05, places=4)
        self.assertAlmostEqual(stats.t_two_sided_p(12.706, 1), 0.05, places=5)
        self.assertAlmostEqual(stats.t_two_sided_p(2.228, 10), 0.05, places=4)
        for df in (1, 2, 3, 4, 10, 30):  # the quantile by bisection matches the tabled t975
            self.assertAlmostEqual(stats.t_quantile(0.975, df), t975(df), delta=1e-3)
        self.assertAlmostEqual(stats.t_quantile(0.025, 4), -stats.t_quantile(0.975, 4))
        self.assertAlmostEqual(stats.betainc(2.0, 3.0, 0.4), 0.5248, places=10)  # 1 - sum_{k<2} C(4,k) .4^k .6^(4-k)

    def test_paired_by_hand(self):
        # a - b by seed: 0.5, 1.0, 1.0 (seed 3 only in b: left out). mean 5/6, sd sqrt(1/12),
        # se 1/6, t = 5, df 2: p = 1 - 5/sqrt(27) = 0.0377496; half width 4.3027 / 6 = 0.717108.
        r = stats.paired({0: 1.0, 1: 2.0, 2: 3.0}, {0: 0.5, 1: 1.0, 2: 2.0, 3: 9.0})
        self.assertEqual((r["n"], r["left_out"], r["seeds"]), (3, 1, ["0", "1", "2"]))
        self.assertAlmostEqual(r["mean_diff"], 5 / 6)
        self.assertAlmostEqual(r["t"], 5.0)
        self.assertAlmostEqual(r["p"], 1 - 5 / math.sqrt(27), places=8)
        self.assertAlmostEqual(r["ci95"][0], 5 / 6 - 0.717108, places=5)
        self.assertAlmostEqual(r["ci95"][1], 5 / 6 + 0.717108, places=5)
        # A None value is a missing seed; the sign follows a - b.
        r2 = stats.paired([(0, 0.5), (1, 1.0), (2, 2.0), (4, None)], [(0, 1.0), (1, 2.0), (2, 3.0), (4, 1.0)])
        self.assertAlmostEqual(r2["mean_diff"], -5 / 6)
        self.assertEqual(r2["left_out"], 1)
        one = stats.paired({0: 1.0}, {0: 2.0})
        self.assertEqual((one["n"], one["p"], one["ci95"]), (1, None, [None, None]))

    def test_paired_beats_unpaired_when_the_seed_effect_is_shared(self):
        # Seeds move both sides together: the unpaired intervals overlap, the pairs all say a < b.
        a = {0: 3.0, 1: 3.5, 2: 4.0, 3: 3.2}
        b = {k: v + 0.1 + 0.01 * k for k, v in a.items()}
        self.assertFalse(separated(mean_ci95(list(a.values())), mean_ci95(list(b.values()))))
        r = stats.paired(a, b)
        self.assertLess(r["ci95"][1], 0)
        self.assertLess(r["p"], 0.001)

    def test_holm_by_hand(self):
        # sorted 0.01, 0.03, 0.04 -> 3 x 0.01, 2 x 0.03, max(0.06, 1 x 0.04): in input order.
        for got, want in zip(stats.holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06]):
            self.assertAlmostEqual(got, want)
        for got, want in zip(stats.holm([0.5, None, 0.4, 0.001]), [0.8, None, 0.8, 0.003]):
            self.assertTrue(got == want if want is None else abs(got - want) < 1e-12)
        self.assertEqual(stats.holm([0.9, 0.8]), [1.0, 1.0])  # capped at 1
        self.assertEqual(stats.holm([]), [])

    def test_tost_by_hand(self):
        # diffs 0.01, -0.01, 0.02, 0: mean 0.005, sd sqrt(0.0005/3), se = sd / 2 = 0.00645497, df 3.
        # Upper test: t = (0.005 - 0.05) / se = -6.97137; its p is the df-3 closed form at that t.
        se = math.sqrt(0.0005 / 3) / 2
        t = (0.005 - 0.05) / se
        u = t / math.sqrt(3)
        p_upper = 0.5 + (u / (1 + u * u) + math.atan(u)) / math.pi
        r = stats.tost([0.01, -0.01, 0.02, 0.0], 0.05)
        self.assertAlmostEqual(r["p_upper"], p_upper, places=10)
        self.assertAlmostEqual(r["p"], p_upper, places=10)  # the larger one-sided p
        self.assertTrue(r["equivalent"])
        # The same differences against a margin they straddle: not equivalent.
        self.assertFalse(stats.tost([0.01, -0.01, 0.02, 0.0], 0.012)["equivalent"])
        self.assertFalse(stats.tost([0.3], 1.0)["equivalent"])  # one pair shows nothing
        with self.assertRaises(ValueError):
            stats.tost([0.1, 0.2], 0.0)

    def test_median_with_censored_seeds(self):
        self.assertEqual(stats.median_censored([3.0, None, 1.0]), {"median": 3.0, "reached": 2, "n": 3})
        # half never reached it: no median (never a mean over the two that made it)
        self.assertEqual(stats.median_censored([3.0, None, None, 1.0])["median"], None)
        self.assertEqual(stats.median_censored([4.0, 2.0, 1.0, 3.0])["median"], 2.5)


class Method(unittest.TestCase):
    """The study method's helpers (experiments/method.py) on hand-computed numbers."""

    def test_token_budget_fits_every_run(self):
        # tiny: block 128; 4 nodes x batch 8 x 128 = 4096 tokens per job step; 409,600 tokens = 100 steps.
        p = method.token_budget_plan(409600, 4, 8, "tiny", 10)
        self.assertEqual((p["steps"], p["tokens"], p["slow_steps"]), (100, 409600, None))
        self.assertEqual(method.token_budget_plan(409600 + 4095, 4, 8, "tiny", 10)["steps"], 100)  # whole steps
        with self.assertRaises(SystemExit) as e:  # 9 steps cannot hold 10 evaluations
            method.token_budget_plan(40000, 4, 8, "tiny", 10)
        self.assertIn("--token-budget", str(e.exception))

    def test_a_schedule_fitted_to_a_wall_budget_ends_at_it(self):
        # fast nodes 0.30, 0.30, 0.31 s per step (mean 0.303333), the straggler 0.9 s; budget 60 s.
        times, budget = [0.30, 0.30, 0.31, 0.9], 60.0
        p = method.time_budget_plan("asp", budget, times, [3], synchronous=False, evals=10)
        self.assertEqual((p["steps"], p["slow_steps"]), (197, 66))  # floor(60 / 0.303333), floor(60 / 0.9)
        for g, t in p["step_s"].items():  # each group's schedule ends within one step of the budget
            end = p["expected_end_s"][g]
            self.assertLessEqual(end, budget)
            self.assertGreater(end, budget - t)
        sync = method.time_budget_plan("ring", budget, times, [3], synchronous=True, evals=10)
        self.assertEqual((sync["steps"], sync["slow_steps"]), (66, None))  # the nodes step together
        with self.assertRaises(SystemExit) as e:
            method.time_budget_plan("asp", 5.0, times, [3], synchronous=False, evals=10)
        self.assertIn("asp's straggler", str(e.exception))
        with self.assertRaises(SystemExit):
            method.time_budget_plan("asp", 60.0, [0.3, None], [], synchronous=False, evals=1)

    def test_local_sgd_budgets_end_on_a_synchronization(self):
        p = method.whole_rounds("diloco10", {"steps": 197, "slow_steps": 66}, 10, 3)
        self.assertEqual((p["steps"], p["slow_steps"]), (190, 60))
        self.assertEqual(method.whole_rounds("ring", {"steps": 197, "slow_steps": None}, 1, 3)["steps"], 197)
        with self.assertRaises(SystemExit) as e:
            method.whole_rounds("diloco50", {"steps": 120, "slow_steps": 40}, 50, 3)  # the straggler: 0 rounds
        self.assertIn("diloco50", str(e.exception))
        import cluster_runs
        self.assertEqual(cluster_runs.sync_every({"worker": ["--dist.sync_every=50", "--x=1"]}), 50)
        self.assertEqual(cluster_runs.sync_every({"cluster": []}), 1)

    def test_the_loss_at_a_wall_budget_is_the_model_held_when_it_runs_out(self):
        # Evaluations at 10, 20, 30 s and the end; budget 30 s.
        curve = [{"t": 10.0, "val_loss": 3.0}, {"t": 20.0, "val_loss": 2.8}, {"t": 30.0, "val_loss": 2.6}]
        budget = {"kind": "time", "value": 30.0}
        held = method.per_seed(0, {"curve": curve + [{"t": 30.0 + 1e-12, "val_loss": 2.5}], "final_val_loss": 2.5},
                               [2.55], budget)  # ended at the budget (up to rounding): read at its end
        self.assertEqual((held["val_loss_at_budget"], held["end_s"]), (2.5, 30.0 + 1e-12))
        self.assertIsNotNone(held["time_to_target_s"]["2.55"])
        past = method.per_seed(0, {"curve": curve + [{"t": 30.2, "val_loss": 2.5}], "final_val_loss": 2.5},
                               [2.55], budget)  # 0.2 s past: one cutoff for both, the budget itself
        self.assertEqual((past["val_loss_at_budget"], past["at_budget_s"], past["end_s"]), (2.6, 30.0, 30.2))
        self.assertIsNone(past["time_to_target_s"]["2.55"])  # crossed at 30.1 s
        over = method.per_seed(0, {"curve": curve + [{"t": 45.0, "val_loss": 2.2}], "final_val_loss": 2.2},
                               [2.7, 2.4], budget)  # overran by half: read at 30 s, the 2.4 crossing censored
        self.assertEqual((over["val_loss_at_budget"], over["at_budget_s"], over["end_s"]), (2.6, 30.0, 45.0))
        self.assertAlmostEqual(over["time_to_target_s"]["2.7"], 25.0)
        self.assertIsNone(over["time_to_target_s"]["2.4"])  # crossed at 37.5 s, past the budget
        self.assertIsNone(over["time_to_target_bracket_s"]["2.4"])
        late = method.per_seed(0, {"curve": [{"t": 31.0, "val_loss": 2.0}], "final_val_loss": 2.0}, [], budget)
        self.assertIsNone(late["val_loss_at_budget"])  # no evaluation within the budget: no value, not the end's
        tokens = method.per_seed(0, {"curve": curve + [{"t": 45.0, "val_loss": 2.2}], "final_val_loss": 2.2},
                                 [2.4], {"kind": "tokens", "value": 1e6})  # a token budget ends every schedule
        self.assertEqual((tokens["val_loss_at_budget"], tokens["end_s"]), (2.2, 45.0))
        self.assertAlmostEqual(tokens["time_to_target_s"]["2.4"], 37.5)

    def test_overlap_flags_follow_the_mode(self):
        import cluster_runs
        job = {"preset": "tiny", "batch": 8, "steps": 10, "evals": 2, "warmup": 1, "eval_batches": 4,
               "val_windows": 512, "defer": True, "overlap": True, "warmup_frac": 0.05, "every_tokens": 100}
        ring = cluster_runs.worker_flags(job, 0, 1e-3, 10, ring=True)
        ps = cluster_runs.worker_flags(job, 0, 1e-3, 10)
        local = cluster_runs.worker_flags(job, 0, 1e-3, 10, ring=True, local_sgd=True)
        for f in ("--emulate.overlap=true", "--dist.overlap=true", "--dist.clip_scope=job", "--optim.grad_clip=0"):
            self.assertIn(f, ring)
        for f in ("--emulate.overlap=true", "--dist.ps_push_in_backward=true", "--optim.grad_clip=0"):
            self.assertIn(f, ps)
        self.assertIn("--emulate.overlap=false", local)  # local SGD sends nothing during backward
        for f in ("--eval.val_windows=512", "--eval.defer=true", "--eval.every_tokens=100",
                  "--schedule.warmup_frac=0.05", "--schedule.warmup_steps=0"):
            self.assertIn(f, ring)
        off = cluster_runs.worker_flags(dict(job, overlap=False), 0, 1e-3, 10, ring=True)
        self.assertIn("--dist.overlap=false", off)
        self.assertIn("--dist.clip_scope=node", off)

    def test_step_times_and_evaluation_spacing(self):
        recs = [[{"step": k, "time_s": 0.5 * k, "tokens_per_s": 1.0} for k in range(1, 11)],
                [{"step": k, "time_s": 0.25 * k, "tokens_per_s": 1.0} for k in range(1, 11)] + [{"val_loss": 3.0}],
                [{"step": 1, "time_s": 1.0, "tokens_per_s": 1.0}]]
        t = method.node_step_times(recs, skip=3)
        self.assertAlmostEqual(t[0], 0.5)
        self.assertAlmostEqual(t[1], 0.25)
        self.assertIsNone(t[2])
        self.assertEqual(method.every_tokens([409600, 300000], 10), 30000)  # the smallest job's total / evals
        plan = {"steps": 197, "slow_steps": 66}
        self.assertEqual(method.job_tokens(plan, 4, [3], 1024), 1024 * (3 * 197 + 66))

    def test_targets_declared_and_checked(self):
        self.assertEqual(method.parse_targets("2.7,3.2,2.9"), [3.2, 2.9, 2.7])
        self.assertEqual(method.parse_targets(None), [])
        for bad in ("3.2,x", "3.2,3.2", "-1"):
            with self.assertRaises(SystemExit):
                method.parse_targets(bad)
        self.assertAlmostEqual(method.initial_loss("tiny"), math.log(257))  # 5.549
        method.check_targets([5.5, 3.0], "tiny")
        with self.assertRaises(SystemExit) as e:
            method.check_targets([5.6, 3.0], "tiny")
        self.assertIn("initial loss 5.549", str(e.exception))
        with self.assertRaises(SystemExit):
            method.check_targets([3.0], "tiny", measured_initial=2.9)
        # From a reference study: the median seed's loss at 1/4, 1/2 and all of the tokens.
        cv = lambda o: [{"tokens": 0, "val_loss": 5.0 + o}, {"tokens": 100, "val_loss": 3.0 + o},  # noqa: E731
                        {"tokens": 200, "val_loss": 2.0 + o}]
        ref = {"configurations": {"ring": {"curves": {"0": cv(0.0), "1": cv(0.2), "2": cv(0.1)}}}}
        self.assertEqual(method.targets_from_reference(ref), [4.1, 3.1, 2.1])  # 50 tokens: 4.0 + 0.1
        with self.assertRaises(SystemExit):
            method.targets_from_reference(ref, "asp")

    def test_the_grid_extends_past_an_edge_pick(self):
        calls = []

        def score(m):  # best at 8x: (log2 m - 3)^2
            calls.append(m)
            return (math.log2(m) - 3) ** 2
        # 2 on the high edge -> 4 -> 8, and with two extensions allowed 8 is still on the edge: reported.
        t = method.tune(score, [0.5, 1, 2], factor=2.0, max_extend=2)
        self.assertEqual((t["pick"], t["edge"], t["extended"]), (8, "high", 2))
        self.assertEqual(t["tried"], [0.5, 1, 2, 4, 8])
        calls.clear()
        t = method.tune(score, [0.5, 1, 2], factor=2.0, max_extend=3)  # 16 scores worse: 8 is inside
        self.assertEqual((t["pick"], t["edge"], t["tried"][-1]), (8, None, 16))
        self.assertEqual(len(calls), len(set(calls)))  # no point scored twice
        t = method.tune(lambda m: abs(m - 0.3), [1], factor=2.0, max_extend=3)  # one value: both sides first
        self.assertEqual(t["tried"][:3], [0.125, 0.25, 0.5])
        self.assertEqual(t["pick"], 0.25)
        self.assertIsNone(method.tune(lambda m: None, [1, 2], 2.0, 3)["pick"])
        with self.assertRaises(SystemExit) as e:
            method.check_grid([1.0], 0)
        self.assertIn("grid of one value", str(e.exception))
        self.assertEqual(method.check_grid([2.0, 0.5, 1.0], 3), [0.5, 1.0, 2.0])

    def test_tuning_seeds_are_disjoint_from_headline_seeds(self):
        self.assertEqual(method.tuning_seeds("1000,1001", [0, 1, 2]), [1000, 1001])
        with self.assertRaises(SystemExit) as e:
            method.tuning_seeds("2,1000", [0, 1, 2])
        self.assertIn("[2]", str(e.exception))

    def test_held_out_digests_must_agree(self):
        self.assertEqual(method.check_val_sets({"ring seed 0": ["ab"], "asp seed 0": ["ab"], "old seed 1": None}),
                         ["old seed 1"])
        with self.assertRaises(SystemExit) as e:
            method.check_val_sets({"ring seed 0": ["ab"], "asp seed 1": ["cd"]})
        self.assertIn("asp seed 1", str(e.exception))
        self.assertIn("ring seed 0", str(e.exception))

    def test_comparisons_are_paired_and_holm_corrected(self):
        def seeds(vals, ttt):
            return [{"seed": s, "val_loss_at_budget": v, "tokens_per_s": 100.0 + s,
                     "time_to_target_s": {"3": t}} for s, (v, t) in enumerate(zip(vals, ttt))]
        cfgs = {"ring": {"per_seed": seeds([3.0, 3.5, 4.0, 3.2], [10.0, 12.0, None, 11.0])},
                "asp": {"per_seed": seeds([3.1, 3.61, 4.12, 3.33], [11.0, 14.0, 9.0, None])},
                "ssp": {"per_seed": seeds([3.01, 3.49, 4.02, 3.2], [10.0, 12.0, 8.0, 11.0])}}
        cs = method.comparisons(cfgs, [("asp", "ring"), ("ssp", "ring")],
                                ["val_loss_at_budget", "time_to_target_s@3"], margin=0.05)
        by = {(c["a"], c["metric"]): c for c in cs}
        # Holm runs over the comparisons that have a p (the deterministic one has none).
        loss = by[("asp", "val_loss_at_budget")]
        # diffs 0.10, 0.11, 0.12, 0.13: mean 0.115, sd 0.0129099, se 0.00645497, t = 17.8157 (df 3)
        self.assertAlmostEqual(loss["mean_diff"], 0.115)
        self.assertAlmostEqual(loss["p"], stats.t_two_sided_p(0.115 / 0.00645497, 3), places=6)
        self.assertEqual(len(cs), 4)
        ps = [c["p"] for c in cs]
        self.assertEqual([c["p_holm"] for c in cs], stats.holm(ps))
        self.assertEqual(sum(p is not None for p in ps), 3)
        self.assertTrue(loss["resolved"])
        self.assertFalse(loss["tost"]["equivalent"])
        ttt = by[("asp", "time_to_target_s@3")]  # only seeds 0 and 1 reached it in both
        self.assertEqual((ttt["n"], ttt["left_out"]), (2, 2))
        same = by[("ssp", "val_loss_at_budget")]  # diffs 0.01, -0.01, 0.02, 0: equivalent within the margin
        self.assertFalse(same["resolved"])
        self.assertTrue(same["tost"]["equivalent"])
        # ssp's time to target equals ring's in every seed both reached it: no seed variation, no test.
        det = by[("ssp", "time_to_target_s@3")]
        self.assertTrue(det["deterministic"])
        self.assertEqual((det["p"], det["p_holm"], det["resolved"]), (None, None, False))
        texts = [method.sentence(c) for c in cs]
        self.assertIn("Resolved: ring is better", method.sentence(loss))
        self.assertIn("Equivalent within +-0.05", method.sentence(same))
        self.assertIn("deterministic (no seed variation), not a statistical result", method.sentence(det))
        self.assertNotIn("Resolved", method.sentence(det))
        self.assertIn("2 left out (not reached by both)", method.sentence(ttt))
        self.assertTrue(all("\u2248" not in t for t in texts))
        # Without a margin, an unresolved comparison is "not resolved", never equivalent.
        cs2 = method.comparisons(cfgs, [("ssp", "ring")], ["val_loss_at_budget"])
        self.assertIn("Not resolved", method.sentence(cs2[0]))


class SimValidation(unittest.TestCase):
    """validate_sim's checks on hand-computed paired differences: they can fail."""

    def test_a_figure_passes_only_inside_its_tolerance(self):
        emu = {"0": 10.0, "1": 20.0, "2": 30.0}
        r = validate_sim.check_figure(emu, {"0": 10.2, "1": 20.4, "2": 30.6}, "time", 0.05)  # +2% every seed
        self.assertEqual(r["verdict"], "pass")
        self.assertAlmostEqual(r["mean"], 0.02)
        # +2%, +5%, +1%: mean 2.667%, sd 2.0817%, half width 4.3027 x 2.0817% / sqrt(3) = 5.1714%
        r = validate_sim.check_figure(emu, {"0": 10.2, "1": 21.0, "2": 30.3}, "time", 0.05)
        self.assertAlmostEqual(r["mean"], 0.08 / 3)
        self.assertAlmostEqual(r["ci95"][1], 0.08 / 3 + 0.051714, places=5)
        self.assertEqual((r["verdict"], r["why"]), ("fail", "the interval is wider than the tolerance"))
        # A 25% error in time to target fails (the old interval-overlap check could pass it).
        r = validate_sim.check_figure(emu, {"0": 12.5, "1": 25.0, "2": 37.5}, "time", 0.05)
        self.assertEqual((r["verdict"], r["why"]), ("fail", "the mean difference is outside the tolerance"))
        # -4.6%, -4.9%, -5.2%: the mean inside, the interval (half width 0.75%) past -5%: near the edge.
        r = validate_sim.check_figure(emu, {"0": 9.54, "1": 19.02, "2": 28.44}, "time", 0.05)
        self.assertEqual((r["verdict"], r["why"]), ("fail", "the interval reaches past the tolerance"))
        r = validate_sim.check_figure({"0": 3.0, "1": 3.1}, {"0": 3.01, "1": 3.11}, "loss", 0.03)  # +0.01 nats
        self.assertEqual(r["verdict"], "pass")
        self.assertEqual(validate_sim.check_figure({"0": 3.0}, {"0": 3.0}, "loss", 0.03)["verdict"], "n/a")
        r = validate_sim.check_figure({"0": 5.0, "1": None, "2": 6.0}, {"0": 5.0, "1": 4.0, "2": None}, "time", 0.05)
        self.assertEqual(r["n"], 1)  # only seeds both backends have (reached)

    def test_contrasts_between_configurations(self):
        emu_a, emu_b = {"0": 10.0, "1": 12.0, "2": 11.0}, {"0": 20.0, "1": 24.0, "2": 22.0}
        # Both configurations 10% slower in the simulator: each figure fails, their ratio (0.5) holds.
        sim_a = {k: 1.1 * v for k, v in emu_a.items()}
        sim_b = {k: 1.1 * v for k, v in emu_b.items()}
        self.assertEqual(validate_sim.check_figure(emu_a, sim_a, "time", 0.05)["verdict"], "fail")
        self.assertEqual(validate_sim.check_contrast(emu_a, emu_b, sim_a, sim_b, "time", 0.05)["verdict"], "pass")
        # The simulator reverses the effect (a is twice b instead of half): fails.
        r = validate_sim.check_contrast(emu_a, emu_b, emu_b, emu_a, "time", 0.05)
        self.assertAlmostEqual(r["mean"], 3.0)  # (2 / 0.5) - 1
        self.assertEqual(r["verdict"], "fail")
        # Losses: the difference of differences, in nats.
        la, lb = {"0": 3.0, "1": 3.2}, {"0": 3.1, "1": 3.3}
        r = validate_sim.check_contrast(la, lb, {"0": 3.05, "1": 3.25}, {"0": 3.1, "1": 3.3}, "loss", 0.03)
        self.assertAlmostEqual(r["mean"], 0.05)
        self.assertEqual(r["verdict"], "fail")

    def test_a_target_reached_on_one_side_only_fails(self):
        # Seeds 1 and 2 reached the target in the simulator only: they cannot be paired, and the figure fails.
        r = validate_sim.check_figure({"0": 5.0, "1": None, "2": None}, {"0": 5.0, "1": 4.0, "2": 3.0}, "time", 0.05,
                                      reach=True)
        self.assertEqual(r["verdict"], "fail")
        self.assertEqual(r["why"], "reached in 1 of 3 seeds emulated, 3 simulated (2 on one side only)")
        self.assertEqual(r["reached"]["one_side_only"], ["1", "2"])
        # One seed on one side only is counted, not failed by itself.
        r = validate_sim.check_figure({"0": 5.0, "1": 6.0, "2": None}, {"0": 5.0, "1": 6.0, "2": 3.0}, "time", 0.05,
                                      reach=True)
        self.assertEqual((r["verdict"], r["reached"]["emulated"], r["reached"]["simulated"]), ("pass", 2, 3))

    def test_the_replay_puts_the_shards_where_the_emulation_did(self):
        emu = {"emulation": {"nodes": 4, "link_gbit": 0.06, "preset": "micro", "batch": 2, "step_time_s": 0.1,
                             "jitter": 0.0, "slow_node": -1, "slowdown": 1.0}}
        sa = types.SimpleNamespace(servers=None)
        job = {"nodes": 4, "servers": 4, "steps": 10, "evals": 1, "preset": "micro", "batch": 2, "warmup": 1,
               "eval_batches": 4}
        for on, want in (("auto", True), ("own", False), ("nodes", True)):
            a = types.SimpleNamespace(latency_us=50.0, sharing="auto", servers_on=on)
            em = validate_sim.sim_emulation(emu, a, sa, 1.0)
            self.assertEqual(em["colocate_servers"], want)
            ps = cluster_runs.sim_command(dict(validate_sim.CONFIGS["asp"], steps=10), em, job, 0, 1e-3, "x")
            ring = cluster_runs.sim_command(dict(validate_sim.CONFIGS["ring"], steps=10), em, job, 0, 1e-3, "x")
            self.assertEqual("--sim.colocate_servers=true" in ps, want)
            self.assertNotIn("--sim.colocate_servers=true", ring)  # no shards
        loopback = {"emulation": dict(emu["emulation"], link_gbit=None)}
        a = types.SimpleNamespace(latency_us=50.0, sharing="auto", servers_on="auto")
        self.assertFalse(validate_sim.sim_emulation(loopback, a, sa, 1.0)["colocate_servers"])

    def test_the_link_efficiency_fit(self):
        eff, scored = validate_sim.fit_efficiency({0.8: [0.1, -0.1], 0.9: [0.02, -0.01], 1.0: [0.2, 0.3]})
        self.assertEqual(eff, 0.9)
        self.assertAlmostEqual(scored[0.9], 0.015)

    def test_main_on_a_recorded_study(self):
        """validate_sim end to end on the run-free study of Orchestration, the simulator replaced by the
        emulated runs 1% faster: every time figure passes at 5%, and fitting on the study itself is refused."""
        s, a = Orchestration().study([])

        def fake_summarize(d, nodes, ring, deferred=False):
            name, seed = d.split(os.sep)[-3], d.rstrip(os.sep).split("seed")[-1]
            cv = s["configurations"][name]["curves"][seed]
            return {"curve": cv, "final_val_loss": cv[-1]["val_loss"], "tokens_per_s": 1000.0 + int(seed),
                    "wall_s": 6.0, "tokens": 2000, "staleness_histogram": {"0": 1}}

        def fake_run_once(name, cfg, em, job, seed, lr, out, *x, **kw):
            r = fake_summarize(os.path.join("x", name, "lr1", f"seed{seed}"), 2, False)
            return dict(r, tokens_per_s=r["tokens_per_s"] * 1.01, elapsed_s=0.0)

        real = validate_sim.summarize, validate_sim.run_once, sys.argv
        validate_sim.summarize, validate_sim.run_once = fake_summarize, fake_run_once
        try:
            val = mkdtemp()
            sys.argv = ["validate_sim.py", "--emulated", a.out, "--out", val]
            with contextlib.redirect_stdout(io.StringIO()):
                validate_sim.main()
            with open(os.path.join(val, "validation.json")) as f:
                v = json.load(f)
            self.assertEqual(v["verdict"], "pass")
            tps = v["configurations"]["asp"]["checks"]["tokens_per_s"]
            self.assertAlmostEqual(tps["mean"], 0.01)
            self.assertEqual(tps["verdict"], "pass")
            self.assertEqual({(c["a"], c["b"]) for c in v["contrasts"]}, {("asp", "ring")})
            # The tool's sentences, judged again from the stored differences by check_study.
            import check_study
            self.assertIn("asp, tokens_per_s: simulator - emulation +1.0% [+1.0%, +1.0%] over 3 paired seed(s), "
                          "tolerance +-5%: pass.", v["conclusions"])
            stored, again = check_study.sentences(v, os.path.join(val, "validation.json"))
            self.assertEqual(stored, again)
            v["configurations"]["asp"]["checks"]["tokens_per_s"]["diffs"]["0"] = 0.5  # the data changed, not the file
            _, again = check_study.sentences(v, os.path.join(val, "validation.json"))
            self.assertNotIn("asp, tokens_per_s: simulator - emulation +1.0% [+1.0%, +1.0%] over 3 paired seed(s), "
                             "tolerance +-5%: pass.", again)
            sys.argv = ["validate_sim.py", "--emulated", a.out, "--out", val, "--fit-from", a.out]
            with self.assertRaises(SystemExit) as e:
                validate_sim.main()
            self.assertIn("fit on another study", str(e.exception))
            # --against-emulated: the same study made twice, checked by the same rule (no simulator run).
            _, a2 = Orchestration().study([])
            runs = {}
            for study_out in (a.out, a2.out):  # each run's command line names its own directory
                for d, _, files in os.walk(os.path.join(study_out, "runs")):
                    if os.path.basename(d).startswith("seed"):
                        with open(os.path.join(d, "command.txt"), "w") as f:
                            f.write(f"syncopate-worker --out {d} --train.seed={d[-1]}\n")
                        runs[(study_out, os.path.relpath(d, study_out))] = d
            again = mkdtemp()
            sys.argv = ["validate_sim.py", "--emulated", a.out, "--against-emulated", a2.out, "--out", again]
            with contextlib.redirect_stdout(io.StringIO()):
                validate_sim.main()
            with open(os.path.join(again, "validation.json")) as f:
                v2 = json.load(f)
            self.assertEqual(v2["against"], os.path.abspath(a2.out))
            self.assertEqual(v2["configurations"]["asp"]["checks"]["tokens_per_s"]["mean"], 0.0)
            with open(os.path.join(again, "report.md")) as f:
                self.assertIn("made twice", f.read())
            d = runs[(a2.out, os.path.join("runs", "asp", "lr0.5", "seed1"))]
            with open(os.path.join(d, "command.txt"), "w") as f:
                f.write(f"syncopate-worker --out {d} --train.seed=1 --optim.lr=1\n")
            with self.assertRaises(SystemExit) as e:
                validate_sim.main()
            self.assertIn("asp seed 1 was not made by the same command in both studies", str(e.exception))
        finally:
            validate_sim.summarize, validate_sim.run_once, sys.argv = real


class Crossover(unittest.TestCase):
    def test_behind_the_winner_only_with_a_holm_corrected_paired_test(self):
        import crossover
        cell = {"ring": [{"seed": k, "time_to_target_s": 10.0 + k, "simulated_s": 30.0} for k in range(3)],
                # ring + 2.0, 2.1, 2.2 seed by seed: resolved behind (t = 36.4, df 2: p = 0.00075, Holm x 2)
                "asp": [{"seed": k, "time_to_target_s": 12.0 + 1.1 * k, "simulated_s": 30.0} for k in range(3)],
                # ring + 0.5, -1, 1: not resolved
                "bsp": [{"seed": k, "time_to_target_s": [10.5, 10.0, 13.0][k], "simulated_s": 30.0} for k in range(3)]}
        j = crossover.judge(cell)
        self.assertEqual((j["winner"], j["behind"], j["tied"]), ("ring", ["asp"], ["bsp"]))
        d = j["paired_vs_winner"]["asp"]
        t = 2.1 / (0.1 / math.sqrt(3))
        self.assertAlmostEqual(d["p"], 1 - t / math.sqrt(2 + t * t), places=8)  # df 2 closed form
        self.assertAlmostEqual(d["p_holm"], 2 * d["p"])


class TimeToTarget(unittest.TestCase):
    def test_linear_between_points_and_none_when_not_reached(self):
        curve = [{"t": 0.0, "val_loss": 3.0}, {"t": 10.0, "val_loss": 2.0}, {"t": 20.0, "val_loss": 1.0}]
        self.assertAlmostEqual(study.time_to_target(curve, 1.5), 15.0)
        self.assertAlmostEqual(study.time_to_target(curve, 3.5), 0.0)
        self.assertIsNone(study.time_to_target(curve, 0.5))


    def test_loss_at_a_time(self):
        curve = [{"t": 0.0, "val_loss": 3.0}, {"t": 10.0, "val_loss": 2.0}]
        self.assertAlmostEqual(study.loss_at(curve, 2.5), 2.75)
        self.assertIsNone(study.loss_at(curve, 11.0))


class Orchestration(unittest.TestCase):
    """run_study end to end with run_once replaced by a model of a run (no processes): budgets fitted
    per configuration, tuning on the tuning seeds only with the grid extending past an edge pick,
    the headline seeds in summary.json's per_seed, comparisons with Holm, and the report's words."""

    def fake_run_once(self, calls, digest=lambda name, seed: "d1"):
        def run_once(name, cfg, em, job, seed, lr, out, *args, **kw):
            calls.append((name, seed, lr, cfg.get("steps"), cfg.get("slow_steps"), job.get("every_tokens")))
            os.makedirs(out, exist_ok=True)
            step_s = {"ring": 0.2, "asp": 0.1}[name]
            # Calibration: each node's step records on the training clock (node 1 slower for asp).
            for i in range(em["nodes"]):
                os.makedirs(os.path.join(out, f"node{i}"), exist_ok=True)
                with open(os.path.join(out, f"node{i}", "metrics.jsonl"), "w") as f:
                    for k in range(1, cfg["steps"] + 1):
                        f.write(json.dumps({"step": k, "time_s": k * step_s * (2 if i == 1 and name == "asp" else 1),
                                            "tokens_per_s": 1.0}) + "\n")
            # The loss: best at lr 4e-3 for ring and 1e-3 for asp; asp 0.1 nats worse; a shared seed effect.
            best = {"ring": 4e-3, "asp": 1e-3}[name]
            # asp's seed effect differs from ring's by 0, 0.04, 0.02 (seeds 0, 1, 2): a paired difference that
            # varies over seeds (an identical one would be deterministic, never resolved).
            final = (3.0 + 0.1 * (name == "asp") + 0.05 * seed % 7 + abs(math.log2(lr / best)) * 0.2
                     + (0.02 * (seed * 5 % 3) if name == "asp" else 0.0))
            curve = [{"t": 0.0 + j * step_s * cfg["steps"] / 2, "val_loss": final + (2 - j) * 0.5,
                      "tokens": j * 1000, "step": j, "val_set": digest(name, seed), "eval_of": "servers"}
                     for j in range(3)]
            return {"curve": curve, "final_val_loss": final, "tokens_per_s": 1000.0 / step_s + seed,
                    "wall_s": step_s * cfg["steps"], "tokens": 2000, "bytes": 1, "bytes_received": 1,
                    "staleness_mean": 0.0, "staleness_max": 0.0, "staleness_histogram": {"0": 1},
                    "overrun_share": 0.0, "wait_share": 0.0, "cpu_util": 0.1, "dropped": 0, "valid": True,
                    "invalid_because": "", "log": os.path.join(out, "cluster.log"), "val_set": [digest(name, seed)],
                    "val_tokens": [65536], "eval_of": ["servers"], "node_steps": [cfg["steps"]] * em["nodes"]}
        return run_once

    def study(self, calls, **kw):
        configs = {"ring": {"ring": True, "cluster": []}, "asp": {"cluster": ["--consistency", "asp"], "elastic": True}}
        a = knobs(seeds=3, evals=2, tune=True, lr_grid="0.5,1,2", lr_extend=3, tuning_seeds="1000,1001",
                  targets="4.5,2.9", equivalence_margin=0.02, time_budget_s=6.0, calibration_steps=10, **kw)
        real = study.run_once
        study.run_once = self.fake_run_once(calls, **({"digest": kw["digest"]} if "digest" in kw else {}))
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                return study.run_study(configs, a, "t", "c"), a
        finally:
            study.run_once = real

    def test_a_time_budget_study_from_calibration_to_conclusions(self):
        calls = []
        s, a = self.study(calls)
        # Calibration: ring 0.2 s per step on both nodes -> 30 steps each; asp: node 0 0.1 s, node 1
        # (measured slower, but not a modelled straggler) 0.2 s: their mean 0.15 s -> 40 steps.
        self.assertEqual(s["configurations"]["ring"]["plan"]["steps"], 30)
        self.assertEqual(s["configurations"]["asp"]["plan"]["steps"], 40)
        # Every configuration evaluates at the same global token spacing: the smaller job's total / evals.
        per_step = 8 * 128
        self.assertEqual(s["job"]["every_tokens"], 2 * 30 * per_step // 2)
        tuned = [c for c in calls if c[1] >= 1000 and c[3] != 10]  # calibration runs: 10 steps, seed 1000
        headline = [c for c in calls if c[1] < 1000]
        self.assertEqual(len([c for c in calls if c[3] == 10]), 2)  # one calibration per configuration
        self.assertTrue(all(c[5] == s["job"]["every_tokens"] for c in tuned + headline))
        # ring is best at 4e-3 = 2x base: on the grid's high edge, so the grid extended to 4x, then 2x is inside.
        ring = s["configurations"]["ring"]
        self.assertEqual(ring["lr_multiplier"], 2.0)
        self.assertEqual(sorted(float(m) for m in ring["tuning"]["lr"]["scores"]), [0.5, 1.0, 2.0, 4.0])
        self.assertEqual(s["configurations"]["asp"]["lr_multiplier"], 0.5)  # 1e-3: 0.25x tried, 0.5x inside
        self.assertEqual({c[1] for c in headline}, {0, 1, 2})  # the headline seeds run only at the pick
        self.assertEqual({c[2] for c in headline if c[0] == "ring"}, {4e-3})
        self.assertEqual(len(ring["per_seed"]), 3)
        ps = ring["per_seed"][0]
        for key in ("seed", "final_val_loss", "val_loss_at_budget", "time_to_target_s", "tokens_per_s"):
            self.assertIn(key, ps)
        self.assertEqual(set(ps["time_to_target_s"]), {"4.5", "2.9"})
        self.assertIsNone(ps["time_to_target_s"]["2.9"])  # never reached: censored, not dropped
        self.assertEqual(ring["time_to_target"]["2.9"], {"median": None, "reached": 0, "n": 3})
        cmp = {c["metric"]: c for c in s["comparisons"]}
        loss = cmp["val_loss_at_budget"]
        self.assertEqual((loss["a"], loss["b"]), ("asp", "ring"))
        self.assertAlmostEqual(loss["mean_diff"], 0.12)  # the shared seed effect cancels: 0.1 + (0, 0.04, 0.02)
        self.assertTrue(loss["resolved"])
        self.assertEqual([c["p_holm"] for c in s["comparisons"]], stats.holm([c["p"] for c in s["comparisons"]]))
        with open(os.path.join(a.out, "report.md")) as f:
            text = f.read()
        self.assertIn("Resolved: ring is better", text)
        self.assertIn("reached the target 2.9 in 0 of 3 seeds", text)
        self.assertIn("fewer than 2 paired seeds", text)  # time to 2.9: no seed reached it on both sides
        # The model's asp curve ends at 4 s of a 6 s budget: named (ring's ends at 6 s: not).
        self.assertIn("asp seed 0: its last evaluation is at 4.0 s", text)
        self.assertNotIn("ring seed 0: its last evaluation", text)
        self.assertNotIn("\u2248", text)
        # The report can be rebuilt from summary.json with other targets declared afterwards.
        text2 = study.rebuild(a.out, targets=[4.0])
        self.assertIn("reached 4 (median s)", text2)

    def test_a_simulated_study_reports_no_host_columns_and_no_zero_width_verdicts(self):
        """--backend sim (issue 32): no CPU or overrun column (the simulator's time is modelled), times in
        simulated seconds, and a difference identical in every seed (the model's throughputs differ by
        exactly 5000 tokens/s per seed) reported as deterministic, never resolved."""
        cost.store_compute("tiny", 8, 0.01)  # the estimate's measurement, stored: no calibration run here
        s, a = self.study([], backend="sim")
        with open(os.path.join(a.out, "report.md")) as f:
            text = f.read()
        self.assertNotIn("overrun (max)", text)
        self.assertNotIn("CPU (max)", text)
        self.assertNotIn("host CPU", text)
        self.assertIn("| end, simulated s | tokens/simulated s |", text)
        tps = next(c for c in s["comparisons"] if c["metric"] == "tokens_per_s")
        self.assertTrue(tps["deterministic"])
        self.assertEqual((tps["p"], tps["p_holm"], tps["resolved"]), (None, None, False))
        self.assertIn("| 5000 | none (no seed variation) | n/a | n/a | 3 | deterministic: no seed variation, not a "
                      "statistical result |", text)
        self.assertIn("asp - ring, tokens_per_s: 5000 tokens/s in every one of the 3 paired seeds: deterministic",
                      text)
        loss = next(c for c in s["comparisons"] if c["metric"] == "val_loss_at_budget")
        self.assertTrue(loss["resolved"])  # a difference that varies over seeds is still tested
        self.assertIn("Cost: ", text)
        self.assertLessEqual(s["cost"]["planned_runs"], s["cost"]["runs"])  # the grids extended past edge picks
        self.assertLessEqual(s["cost"]["runs"], s["cost"]["planned_runs_worst"])
        # No time in the report is negative (nor any interval of one).
        self.assertIsNone(re.search(r"\[-\d", text.split("## Comparisons")[0]), text)

    def test_learning_rates_from_another_studys_tuning(self):
        """--lrs-from: no tuning run here; every headline run at the other study's tuned rate; refused by
        name when that study did not tune, tuned on a headline seed here, or lacks a configuration."""
        other = mkdtemp()

        def write(**kw):
            s = {"tuned": True, "tuning_seeds": [1000],
                 "configurations": {"ring": {"lr": 4e-3}, "asp": {"lr": 1e-3}}}
            s.update(kw)
            with open(os.path.join(other, "summary.json"), "w") as f:
                json.dump(s, f)
        write()
        calls = []
        s, a = self.study(calls, lrs_from=other)
        self.assertFalse([c for c in calls if c[1] >= 1000 and c[3] != 10])  # no tuning run (calibration only)
        self.assertEqual({(c[0], c[2]) for c in calls if c[1] < 1000}, {("ring", 4e-3), ("asp", 1e-3)})
        self.assertEqual(s["configurations"]["ring"]["lr"], 4e-3)
        self.assertEqual(s["lrs_from"], {"dir": other, "tuning_seeds": [1000]})
        with open(os.path.join(a.out, "report.md")) as f:
            self.assertIn(f"learning rates from another study's tuning ({other}, tuned on seeds 1000", f.read())
        for kw, words in (({"tuned": False}, "did not tune"), ({"tuning_seeds": [1]}, "headline seeds here"),
                          ({"configurations": {"ring": {"lr": 4e-3}}}, "no tuned learning rate for asp")):
            write(**kw)
            with self.assertRaises(SystemExit) as e:
                self.study([], lrs_from=other)
            self.assertIn(words, str(e.exception))

    def test_different_held_out_sets_are_refused(self):
        with self.assertRaises(SystemExit) as e:
            self.study([], digest=lambda name, seed: "d2" if (name, seed) == ("asp", 2) else "d1")
        self.assertIn("asp seed 2", str(e.exception))


class Summarize(unittest.TestCase):
    """cluster_runs.summarize on hand-written metrics of two nodes: tokens are the job's in a
    per-step ring's records (node 0's count) and each node's own otherwise (summed), local SGD's
    (records with a "round") included; bytes are summed over the nodes up to each evaluation."""

    def write(self, out, rounds):
        for node in range(2):
            os.makedirs(os.path.join(out, f"node{node}"), exist_ok=True)
            recs = []
            for step in (1, 2):
                r = {"step": step, "tokens": 100 * step, "tokens_per_s": 1.0, "unix_s": 10.0 + step, "step_s": 1.0,
                     "wire_bytes": 7, "wire_bytes_received": 28}
                if rounds:
                    r["round"] = step // 2
                recs.append(r)
            if node == 0:
                recs.append({"step": 2, "val_loss": 3.0, "unix_s": 12.5, "time_s": 2.5, "tokens": 200})
            with open(os.path.join(out, f"node{node}", "metrics.jsonl"), "w") as f:
                f.write("\n".join(json.dumps(r) for r in recs) + "\n")

    def test_deferred_evaluation_records_of_the_shipped_weights(self):
        import cluster_runs
        out = mkdtemp()
        self.write(out, False)
        with open(os.path.join(out, "node0", "metrics.jsonl"), "a") as f:  # a deferred record, scored after training
            f.write(json.dumps({"step": 2, "val_loss": 2.5, "unix_s": 12.2, "time_s": 2.0, "tokens": 200,
                                "global_tokens": 400, "eval_of": "servers", "val_tokens": 65536, "val_set": "ab12",
                                "eval_s": 0.3, "deferred": True}) + "\n")
        r = cluster_runs.summarize(out, 2, ring=False)
        last = r["curve"][-1]
        # time_s is on the training clock already: its eval_s (0.3, the snapshot) is not taken off again
        self.assertAlmostEqual(last["t"], 2.0)
        self.assertEqual((last["tokens"], last["eval_of"], last["val_set"]), (400, "servers", "ab12"))
        self.assertEqual((r["val_set"], r["val_tokens"], r["eval_of"]), (["ab12"], [65536], ["servers"]))
        self.assertEqual(r["node_steps"], [2, 2])
        with open(os.path.join(out, "node0", "metrics.jsonl")) as f:  # the same record evaluated on the clock
            text = f.read().replace(', "deferred": true', "")
        with open(os.path.join(out, "node0", "metrics.jsonl"), "w") as f:
            f.write(text)
        # Its time_s was stamped when its weights were taken, before it evaluated: nothing comes off it.
        self.assertAlmostEqual(cluster_runs.summarize(out, 2, ring=False)["curve"][-1]["t"], 2.0)
        self.assertAlmostEqual(cluster_runs.summarize(out, 2, ring=False, deferred=True)["curve"][-1]["t"], 2.0)

    def test_tokens_and_bytes(self):
        import cluster_runs
        for rounds, tokens in ((False, 200), (True, 400)):
            out = mkdtemp()
            self.write(out, rounds)
            r = cluster_runs.summarize(out, 2, ring=True)
            self.assertEqual(r["tokens"], tokens)
            self.assertEqual(r["curve"][-1]["tokens"], tokens)
            self.assertEqual(r["bytes"], 28)  # 2 nodes x 2 steps x 7
            self.assertEqual(r["bytes_received"], 112)
            self.assertEqual(r["curve"][-1]["bytes"], 28)
        out = mkdtemp()  # parameter servers: each node's own, summed
        self.write(out, False)
        self.assertEqual(cluster_runs.summarize(out, 2, ring=False)["tokens"], 400)


class LinkStats(unittest.TestCase):
    """cluster_runs.link_stats on netstats.txt as scripts/netns.sh netns_stats writes it (the lines of a
    real run): drops summed over both ends of every link, TCP's counters over the nodes."""

    def test_sums_the_links_and_nodes(self):
        out = mkdtemp()
        os.makedirs(os.path.join(out, "logs"))
        with open(os.path.join(out, "logs", "netstats.txt"), "w") as f:
            for i, (up, down, retrans, rto) in enumerate([(0, 3, 7, 1), (2, 0, 5, 0)]):
                for end, d in (("uplink", up), ("downlink", down)):
                    f.write(f"node {i} {end}: qdisc tbf 8005: root refcnt 3 rate 1Gbit burst 125000b lat 50ms Sent 90 "
                            f"bytes 1 pkt (dropped {d}, overlimits 4 requeues 0) backlog 0b 0p requeues 0 \n")
                f.write(f"node {i} tcp: TcpOutSegs=100 TcpRetransSegs={retrans} TcpExtTCPTimeouts={rto} "
                        f"TcpExtTCPLossProbes=9 \n")
        self.assertEqual(cluster_runs.link_stats(out), {"tbf_dropped": 5, "tcp_out_segs": 200, "tcp_retrans_segs": 12,
                                                        "tcp_timeouts": 1})
        self.assertIsNone(cluster_runs.link_stats(mkdtemp()))  # loopback: no namespaces, no counters


class WaitingAndFinalPoints(unittest.TestCase):
    """Records with while_waiting (node 0 scoring the servers while it waits for a straggler) and
    job_final (the job's final weights) are ordinary points of the curve, in time order: none is
    dropped, none counted twice, two with the same step are two points, and a while_waiting
    evaluation on the clock takes no time off the job (the others train on meanwhile)."""

    def write(self, out, deferred):
        node0 = [{"step": k, "tokens": 100 * k, "tokens_per_s": 1.0, "unix_s": 10.0 + k, "step_s": 1.0,
                  "time_s": float(k)} for k in (1, 2)]
        evals = [{"step": 1, "val_loss": 4.0, "time_s": 1.0, "unix_s": 11.0, "tokens": 100, "global_tokens": 200,
                  "eval_of": "servers", "eval_s": 0.5},
                 # node 0 is done at 2 s and waits for node 1 (done at 6 s): two points while it waits, at the
                 # shards' counts 400 and 600, then the final (the same step, three records).
                 {"step": 2, "val_loss": 3.6, "time_s": 3.0, "unix_s": 13.0, "tokens": 200, "global_tokens": 400,
                  "eval_of": "servers", "eval_s": 0.5, "while_waiting": True},
                 {"step": 2, "val_loss": 3.4, "time_s": 5.0, "unix_s": 15.0, "tokens": 200, "global_tokens": 600,
                  "eval_of": "servers", "eval_s": 0.5, "while_waiting": True},
                 {"step": 2, "val_loss": 3.2, "time_s": 6.0, "unix_s": 16.0, "tokens": 200, "global_tokens": 800,
                  "eval_of": "servers", "eval_s": 0.5, "job_final": True}]
        if deferred:  # scored after training, in the order taken
            for e in evals:
                e["deferred"] = True
            recs = node0 + evals
        else:
            recs = [node0[0], evals[0], node0[1]] + evals[1:]
        node1 = [{"step": k, "tokens": 100 * k, "tokens_per_s": 1.0, "unix_s": 10.0 + k, "step_s": 1.0,
                  "time_s": float(k)} for k in range(1, 7)]
        for i, rs in enumerate((recs, node1)):
            os.makedirs(os.path.join(out, f"node{i}"), exist_ok=True)
            with open(os.path.join(out, f"node{i}", "metrics.jsonl"), "w") as f:
                f.write("\n".join(json.dumps(r) for r in rs) + "\n")

    def test_every_record_is_a_point_in_time_order(self):
        import cluster_runs
        for deferred in (True, False):
            out = mkdtemp()
            self.write(out, deferred)
            r = cluster_runs.summarize(out, 2, ring=False, deferred=deferred)
            cv = r["curve"]
            self.assertEqual([p["step"] for p in cv], [1, 2, 2, 2])
            self.assertEqual([p["tokens"] for p in cv], [200, 400, 600, 800])
            self.assertEqual([bool(p.get("while_waiting")) for p in cv], [False, True, True, False])
            self.assertEqual([bool(p.get("job_final")) for p in cv], [False, False, False, True])
            # Deferred: time_s is the training clock. On the clock: the first evaluation's 0.5 s comes off the
            # later points; the waiting ones' do not (node 1 trained meanwhile): the final stays at 6 - 0.5.
            self.assertEqual([p["t"] for p in cv], [1.0, 3.0, 5.0, 6.0] if deferred else [1.0, 2.5, 4.5, 5.5])
            self.assertEqual(r["final_val_loss"], 3.2)
            self.assertAlmostEqual(r["wall_s"], 6.0 if deferred else 5.5)
            ep = method.eval_points([cv], every_tokens=200)
            self.assertEqual((ep["points"]["max"], ep["while_waiting"], ep["job_final_runs"]), (4, 2, 1))

    def test_bands_over_runs_with_different_points_drop_none(self):
        a = [{"t": 1.0, "val_loss": 4.0}, {"t": 3.0, "val_loss": 3.0}, {"t": 5.0, "val_loss": 2.0}]
        b = [{"t": 1.0, "val_loss": 4.0}, {"t": 2.0, "val_loss": 3.6}, {"t": 4.0, "val_loss": 3.0},
             {"t": 5.0, "val_loss": 2.4}]
        xs, ys = study.band_points([a, b], "t")
        self.assertEqual(xs, [1.0, 2.0, 3.0, 4.0, 5.0])  # every run's points, the last ones included
        self.assertEqual(ys[1], [3.5, 3.6])  # a interpolated at 2 s
        self.assertEqual(ys[-1], [2.0, 2.4])
        xs, ys = study.band_points([a, a], "t")  # the same points: taken point by point
        self.assertEqual((xs, ys[2]), ([1.0, 3.0, 5.0], [2.0, 2.0]))


class EvaluationPoints(unittest.TestCase):
    """method.eval_points: what the records show about the asked spacing, per configuration."""

    def curve(self, tokens, dt=2.0):
        return [{"t": dt * (i + 1), "val_loss": 4.0 - 0.1 * i, "tokens": x} for i, x in enumerate(tokens)]

    def test_exact_step_and_off_grid(self):
        ep = method.eval_points([self.curve([100, 200, 300, 350])] * 2, every_tokens=100, job_step_tokens=40)
        self.assertEqual((ep["grid"], ep["points"]), ("exact", {"min": 4, "median": 4, "max": 4}))
        self.assertEqual((ep["spacing_tokens"]["median"], ep["spacing_s"]), (100, 2.0))
        # the first job step (40 tokens) past each multiple of 100
        ep = method.eval_points([self.curve([120, 200, 320, 350])], every_tokens=100, job_step_tokens=40)
        self.assertEqual(ep["grid"], "step")
        # an asynchronous mode: the shards' counts, before and after the multiples, and a point while waiting
        cvs = [self.curve([90, 230, 270, 400]), self.curve([110, 180, 330, 380, 400])]
        ep = method.eval_points(cvs, every_tokens=100, job_step_tokens=40)
        self.assertIsNone(ep["grid"])
        self.assertEqual(ep["points"], {"min": 4, "median": 4.5, "max": 5})
        self.assertEqual((ep["spacing_tokens"]["min"], ep["spacing_tokens"]["max"]), (20, 150))
        self.assertIsNone(method.eval_points([], 100))


class TimeBrackets(unittest.TestCase):
    """Time to target is interpolated between evaluation points; a resolved time-to-target verdict
    says how wide each configuration's bracket around the crossing was (median over the paired
    seeds), and calls a difference smaller than the wider bracket indicative."""

    def test_bracket_around_the_crossing(self):
        cv = [{"t": 4.0, "val_loss": 4.0}, {"t": 8.0, "val_loss": 3.5}, {"t": 12.0, "val_loss": 3.3}]
        self.assertEqual(method.target_bracket(cv, 3.6), [4.0, 8.0])
        self.assertEqual(method.target_bracket(cv, 4.5), [0.0, 4.0])  # before the first point: from the start
        self.assertIsNone(method.target_bracket(cv, 3.0))

    def cfgs(self, ring_dt, asp_dt, asp_t0=1.5):
        out = {}
        for name, dt, t0, shift in (("ring", ring_dt, ring_dt, 0.1), ("asp", asp_dt, asp_t0, 0.05)):
            per, curves = [], {}
            for seed in range(3):
                cv = [{"t": t0 + i * dt + shift * seed, "val_loss": v} for i, v in enumerate((4.0, 3.5, 3.3, 3.1))]
                curves[str(seed)] = cv
                per.append(method.per_seed(seed, {"curve": cv, "final_val_loss": 3.1}, [3.6]))
            out[name] = {"per_seed": per, "curves": curves}
        return out

    def test_resolved_time_states_its_brackets(self):
        cfgs = self.cfgs(4.0, 1.4)
        c = method.comparisons(cfgs, [("asp", "ring")], ["time_to_target_s@3.6"])[0]
        # ring: 4 + 0.8 x 4 = 7.2 (+0.1 seed); asp: 1.5 + 0.8 x 1.4 = 2.62 (+0.05 seed): -4.58, -4.63, -4.68
        self.assertAlmostEqual(c["mean_diff"], -4.63)
        self.assertTrue(c["resolved"])
        self.assertEqual(c["bracket_s"], {"asp": 1.4, "ring": 4.0})
        text = method.sentence(c)
        self.assertIn("Resolved by the paired test: asp reaches 3.6 sooner (paired, Holm p = ", text)
        self.assertIn("evaluation brackets: asp ~1.4 s, ring ~4 s wide)", text)
        self.assertNotIn("indicative", text)
        self.assertFalse(method.indicative(c))
        # The same times kept in an old summary without brackets: taken from the kept curves.
        for x in cfgs.values():
            for ps in x["per_seed"]:
                del ps["time_to_target_bracket_s"]
        self.assertEqual(method.comparisons(cfgs, [("asp", "ring")], ["time_to_target_s@3.6"])[0]["bracket_s"],
                         {"asp": 1.4, "ring": 4.0})

    def test_a_difference_inside_the_evaluation_spacing_is_indicative(self):
        # ring evaluates every 10 s: ring 10 + 8 = 18 s, asp 12 + 0.8 x 1.4 = 13.12 s: 4.9 s apart, inside 10 s.
        c = method.comparisons(self.cfgs(10.0, 1.4, asp_t0=12.0), [("asp", "ring")], ["time_to_target_s@3.6"])[0]
        self.assertTrue(c["resolved"])
        self.assertTrue(method.indicative(c))
        self.assertIn("(smaller than the evaluation spacing: treat as indicative).", method.sentence(c))


class ReportWording(unittest.TestCase):
    """write_report on a hand-made summary: the evaluation points observed per configuration (every N
    global tokens only where the records show it), the staleness column's meaning, a token budget's
    caveat with a straggler and an asynchronous configuration, and resolved times with their brackets."""

    def summary(self, kind="tokens"):
        N = 16384
        ring = [[{"t": 4.0 * k + 0.1 * s, "val_loss": v, "tokens": N * k, "step": 4 * k, "eval_of": "replica"}
                 for k, v in zip(range(1, 6), (4.0, 3.5, 3.3, 3.2, 3.1))] for s in range(3)]
        asp = []
        for s in range(3):
            tok = [15000, 30000 + 1000 * s, 47000, 60000, 70000, 81920][:5 + (s > 0)]
            cv = [{"t": 1.5 + 1.4 * i + 0.05 * s, "val_loss": 4.0 - 0.45 * min(i, 1) - 0.1 * max(i - 1, 0),
                   "tokens": x, "step": min(4 * (i + 1), 20), "eval_of": "servers"} for i, x in enumerate(tok)]
            cv[-2]["while_waiting"] = True
            cv[-1]["job_final"] = True
            asp.append(cv)
        em = {"nodes": 4, "preset": "tiny", "batch": 8, "step_time_s": 0.3, "slow_node": 3, "slowdown": 3.0,
              "jitter": 0.1, "link_gbit": None}
        cfgs = {}
        for name, curves, elastic, stale in (("ring", ring, False, (0.0, 0.0)), ("asp", asp, True, (2.44, 10.75))):
            cfgs[name] = {
                "lr": 2e-3, "plan": {"steps": 20}, "elastic": elastic, "valid_runs": 3, "runs_total": 3,
                "per_seed": [dict(method.per_seed(s, {"curve": cv, "final_val_loss": cv[-1]["val_loss"],
                                                      "tokens_per_s": 4000.0 + s + 3 * elastic * s}, [3.6]))
                             for s, cv in enumerate(curves)],
                "curves": {str(s): cv for s, cv in enumerate(curves)},
                "staleness": {"mean": stale[0], "max": stale[1], "histogram": {}}, "bytes": None,
                "overrun_share": 0.0, "cpu_util": 0.5, "tuning": {}, "failed": [], "invalid": []}
        return {"title": "t", "command": "c", "emulation": em, "baseline": "ring",
                "job": {"every_tokens": N, "val_windows": 512, "defer": True, "overlap": True, "warmup_frac": 0.05},
                "budget": {"kind": kind, "value": 81920 if kind == "tokens" else 20.0}, "targets": [3.6],
                "seeds": [0, 1, 2], "tuning_seeds": [1000], "lr_grid": [1.0], "tuned": False,
                "limits": {"overrun": 0.05, "cpu": 0.9}, "configurations": cfgs}

    def report(self, kind="tokens"):
        s = self.summary(kind)
        study.analyse(s)
        out = mkdtemp()
        return s, study.write_report(s, out)

    def test_evaluation_points_staleness_caveat_and_brackets(self):
        s, text = self.report()
        ev = next(l for l in text.splitlines() if l.startswith("Evaluation:"))
        self.assertIn("asked every 16384 global tokens as node 0 counts them", ev)
        self.assertIn("ring: 5 points per run, every 16384 global tokens and at the end (median spacing 16384 global "
                      "tokens and 4 s)", ev)
        self.assertIn("asp: 5-6 points per run (3 of them, over the 3 run(s), taken while node 0 waited for the "
                      "straggler at the end), median spacing", ev)
        self.assertIn("not every 16384 global tokens", ev)
        self.assertEqual(s["configurations"]["asp"]["eval_points"]["spacing_s"], 1.4)
        self.assertIn("staleness mean / max (per step: shards' mean)", text)
        self.assertIn("max: the largest such step value in any seed", text)
        self.assertIn("| 2.44 / 10.8 |", text)
        self.assertIn("Caveat: with equal steps per node, the asynchronous mode's fast nodes (asp) idle after their "
                      "steps", text)
        self.assertIn("a wall-time budget (--time-budget-s) does", text)
        concl = text.split("## Conclusions")[1]
        self.assertIn("asp - ring, time_to_target_s@3.6: ", concl)
        self.assertIn("Resolved by the paired test: asp reaches 3.6 sooner (paired, Holm p = ", concl)
        self.assertIn("evaluation brackets: asp ~1.4 s, ring ~4 s wide)", concl)
        # A wall budget explains itself: no caveat. Nor without a straggler.
        self.assertNotIn("Caveat", self.report("time")[1])
        s = self.summary()
        s["emulation"]["slowdown"] = 1.0
        study.analyse(s)
        self.assertNotIn("Caveat", study.write_report(s, mkdtemp()))

    def test_a_rebuild_keeps_the_brackets(self):
        s = self.summary()
        study.analyse(s)
        out = mkdtemp()
        for c in s["configurations"].values():
            for ps in c["per_seed"]:
                ps.pop("time_to_target_bracket_s")
                ps["run_dir"] = out
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump(s, f)
        real = study.plots
        study.plots = lambda summary, out: None
        try:
            text = study.rebuild(out)
        finally:
            study.plots = real
        self.assertIn("evaluation brackets: asp ~1.4 s, ring ~4 s wide)", text)
        with open(os.path.join(out, "summary.json")) as f:
            self.assertEqual(json.load(f)["configurations"]["ring"]["per_seed"][0]["time_to_target_bracket_s"],
                             {"3.6": [4.0, 8.0]})

    def test_a_run_scheduled_by_the_clock_that_reached_its_step_cap_is_named(self):
        # --schedule-by time: the ring's runs were scored at the 20 s budget (at_limit), ASP's ended at their step cap
        # before it (no at_limit point): named in the report and in the atlas's budget_not_held, the ring's not.
        import atlas
        s = self.summary("time")
        s["job"]["time_schedule_s"] = 20.0
        for c in s["configurations"].values():
            for cv in c["curves"].values():
                if c["elastic"] is False:
                    cv[-1]["t"], cv[-1]["at_limit"] = 20.0, True
            c["per_seed"] = [dict(method.per_seed(int(k), {"curve": cv, "final_val_loss": cv[-1]["val_loss"]}, [3.6],
                                                  s["budget"])) for k, cv in c["curves"].items()]
        self.assertEqual([p["at_limit"] for p in s["configurations"]["ring"]["per_seed"]], [True] * 3)
        self.assertEqual([p["at_limit"] for p in s["configurations"]["asp"]["per_seed"]], [False] * 3)
        study.analyse(s)
        text = study.write_report(s, mkdtemp())
        self.assertIn("ran by the simulated clock", text)
        self.assertIn("asp seed 0: ended at 7.1 s, before the 20 s budget, at its step cap (3x the planned steps)", text)
        self.assertNotIn("ring seed 0: ended", text)
        self.assertNotIn("the calibrated step time did not hold", text)
        late = atlas.budget_not_held(s, 20.0)
        self.assertEqual(sorted(x.split(" seed")[0] for x in late), ["asp"] * 3)

    def test_a_run_past_its_wall_budget_is_read_at_the_budget_and_named(self):
        # The ring's evaluations are at 4, 8, ... 20 s (+0.1 s per seed); with a 15 s budget each run overran
        # it and is read at its 12 s point (3.3), not its end (3.1); ASP ends by 8.6 s and is read at its end.
        s = self.summary("time")
        s["budget"]["value"] = 15.0
        out = mkdtemp()
        for c in s["configurations"].values():
            for ps in c["per_seed"]:
                ps["run_dir"] = out
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump(s, f)
        real = study.plots
        study.plots = lambda summary, out: None
        try:
            text = study.rebuild(out)
        finally:
            study.plots = real
        with open(os.path.join(out, "summary.json")) as f:
            cfgs = json.load(f)["configurations"]
        ring = cfgs["ring"]["per_seed"]
        self.assertEqual([p["val_loss_at_budget"] for p in ring], [3.3, 3.3, 3.3])
        self.assertEqual([p["end_s"] for p in ring], [20.0, 20.1, 20.2])
        self.assertEqual([p["final_val_loss"] for p in ring], [3.1, 3.1, 3.1])
        self.assertEqual([p["val_loss_at_budget"] for p in cfgs["asp"]["per_seed"]],
                         [p["final_val_loss"] for p in cfgs["asp"]["per_seed"]])
        self.assertIn("**Note:** 3 run(s) ended past the 15 s budget", text)
        self.assertIn("ring seed 0 (ended 20.0 s, read at 12.0 s), ring seed 1 (ended 20.1 s, read at 12.1 s)", text)
        self.assertNotIn("asp seed", text.split("**Note:** 3 run(s)")[1].split("\n")[0])
        self.assertNotIn("no evaluation at or before the budget", text)
        # A run with no evaluation inside the budget has no loss at it: named, and out of the loss comparison.
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
        s["budget"]["value"] = 3.0
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump(s, f)
        study.plots = lambda summary, out: None
        try:
            text = study.rebuild(out)
        finally:
            study.plots = real
        self.assertIn("**Note:** 3 run(s) have no evaluation at or before the budget, so no loss at it; they are left "
                      "out of every loss comparison: ring seed 0 (ended 20.0 s), ring seed 1", text)
        self.assertIn("| asp | ring | val_loss_at_budget | n/a |", text)


class Scenarios(unittest.TestCase):
    def test_shipped_scenarios_load_and_derive_the_ratio(self):
        for name in ("compute_bound", "balanced", "comm_bound", "stragglers"):
            sc = scenario.load(os.path.join(ROOT, "experiments", "scenarios", f"{name}.toml"))
            d = scenario.derive(sc)
            t = sc["target"]
            compute = 6 * t["params"] * t["tokens_per_node_step"] / (t["peak_tflops"] * 1e12 * t["mfu"])
            comm = 2 * 7 / 8 * t["params"] * t["wire_bytes"] / (t["link_gbit"] * 1e9 / 8)
            self.assertAlmostEqual(d["ratio"], comm / compute)
            # The emulated link makes the small model's ring bytes take ratio x the modelled step.
            small = 2 * 7 / 8 * scenario.PRESET_PARAMS["tiny"] * 4
            self.assertAlmostEqual(small * 8 / (d["link_gbit"] * 1e9), d["ratio"] * d["step_time_s"])
        ratios = {n: scenario.derive(scenario.load(os.path.join(ROOT, "experiments", "scenarios", f"{n}.toml")))["ratio"]
                  for n in ("compute_bound", "balanced", "comm_bound")}
        self.assertLess(ratios["compute_bound"], 0.5)
        self.assertGreater(ratios["comm_bound"], 2.0)

    def test_latency_scales_with_the_dilation_above_the_links_own(self):
        sc = scenario.load(os.path.join(ROOT, "experiments", "scenarios", "comm_bound.toml"))
        d = scenario.derive(sc)
        self.assertAlmostEqual(d["scaled_latency_ms"], 10.0 * d["dilation"])  # 10 ms between sites
        self.assertAlmostEqual(d["latency_ms"], 10.0 * d["dilation"] - scenario.LINK_OWN_LATENCY_MS)
        # The simulator takes the links' own latency plus what the delay line adds.
        self.assertAlmostEqual(cluster_runs.sim_latency_us(d), 1e3 * 10.0 * d["dilation"])
        self.assertIn("--latency-ms", cluster_runs.cluster_command({"ring": True}, dict(d, jitter=0.0), {
            "nodes": 8, "servers": 8, "steps": 4, "evals": 1, "preset": "tiny", "batch": 8, "warmup": 1,
            "eval_batches": 1}, 0, 1e-3, "/tmp/x"))
        # A data centre's 10 us, dilated, is below the links' own: nothing is added, and it is said.
        fast = scenario.derive(scenario.load(os.path.join(ROOT, "experiments", "scenarios", "compute_bound.toml")))
        self.assertEqual(fast["latency_ms"], 0.0)
        self.assertIn("below the emulated links' own", fast["latency_note"])
        self.assertAlmostEqual(cluster_runs.sim_latency_us(fast), 1e3 * scenario.LINK_OWN_LATENCY_MS)

    def test_sizes_scale_by_the_bytes_ratio_and_keep_the_targets_message_counts(self):
        sc = scenario.load(os.path.join(ROOT, "experiments", "scenarios", "comm_bound.toml"))
        z = scenario.scaled_sizes(sc)  # tiny: 454,144 values against 124 M (the sizes count f32 values)
        ratio = 454_144 / 124_000_000
        self.assertAlmostEqual(z["bytes_ratio"], ratio)
        self.assertAlmostEqual(z["flags"]["ps_partition_mb"], 4 * ratio)
        self.assertEqual(z["flags"]["segment_kb"], 1)                       # 0.94 -> raised to 1
        self.assertEqual(z["flags"]["bucket_kb"], round(25600 * ratio))     # 93.8 -> 94
        self.assertEqual(z["flags"]["first_bucket_kb"], round(1024 * ratio))  # 3.75 -> 4
        self.assertEqual(len(z["warnings"]), 1)
        self.assertIn("dist.segment_kb", z["warnings"][0])
        # 8 shards: 124 M / 8 = 15.5 M values per shard in partitions of 1 Mi values = 15; the same emulated.
        self.assertEqual(z["counts"]["partitions_per_shard"], {"target": 15, "emulated": 15})
        self.assertEqual(z["counts"]["buckets_per_backward"]["target"], z["counts"]["buckets_per_backward"]["emulated"])
        self.assertIn("--dist.ps_partition_mb=0.0146498", scenario.size_flags(z))
        self.assertLess(z["counts"]["segments_per_ring_chunk"]["emulated"],
                        z["counts"]["segments_per_ring_chunk"]["target"])  # the floor: coarser, and said
        # A study passes them to every worker (and so to the simulator, which takes the same flags).
        job = {"preset": "tiny", "batch": 8, "warmup": 1, "steps": 4, "evals": 1, "eval_batches": 1, "sizes": z}
        self.assertIn("--dist.bucket_kb=94", cluster_runs.worker_flags(job, 0, 1e-3, 4, ring=True))

    def test_bad_fields_are_refused_by_name(self):
        base = {"target": {"name": "x", "params": 10, "tokens_per_node_step": 10, "nodes": 4, "link_gbit": 1.0}}
        scenario.validate(base)
        for bad, word in (({"target": dict(base["target"], nodes=0)}, "target.nodes"),
                          ({"target": dict(base["target"], speed=3)}, "target.speed"),
                          ({**base, "stragglers": {"slowdown": 0.5}}, "stragglers.slowdown"),
                          ({**base, "emulation": {"step_time_s": -1.0}}, "emulation.step_time_s"),
                          ({**base, "stragglers": {"slow_node": 4}}, "slow_node"),
                          ({**base, "network": {}}, "[network]")):
            with self.assertRaises(scenario.ScenarioError) as e:
                scenario.validate(bad)
            self.assertIn(word, str(e.exception))


def knobs(**kw):
    a = dict(scenario=None, nodes=2, preset=None, batch=None, step_time=0.1, slow_node=None, slowdown=None,
             jitter=None, netns=False, link_gbit=None, calibrate=False, out=mkdtemp(), configs=None, seeds=1,
             steps=4, evals=2, warmup=1, servers=None, tensorboard=False, base_lr=2e-3, max_overrun=1.0,
             max_cpu=1.0, lr_grid="1", tune=False, targets=None, val_windows=0, no_trace=True)
    a.update(kw)
    return types.SimpleNamespace(**a)


class Emulation(unittest.TestCase):
    def test_out_of_range_knobs_are_refused_by_name(self):
        for kw, word in ((dict(step_time=-1.0), "--step-time"), (dict(slowdown=0.5), "--slowdown"),
                         (dict(slow_node=5), "--slow-node"), (dict(jitter=-0.1), "--jitter"),
                         (dict(step_time=0.0, slowdown=2.0), "--step-time > 0")):
            with self.assertRaises(SystemExit) as e:
                study.emulation(knobs(**kw))
            self.assertIn(word, str(e.exception))

    def test_bad_input_is_refused_before_any_run(self):
        for kw, word in ((dict(targets="6.0,3.0"), "initial loss"), (dict(targets="x"), "--targets"),
                         (dict(tune=True, lr_grid="1", lr_extend=0), "grid of one value"),
                         (dict(token_budget=1000.0, evals=10), "--token-budget"),
                         (dict(tuning_seeds="0"), "disjoint"),
                         (dict(equivalence_margin=-0.1), "--equivalence-margin"),
                         (dict(compare="asp:nope"), "--compare")):
            a = knobs(**kw)
            with self.assertRaises(SystemExit) as e:
                study.run_study({"asp": {"cluster": []}}, a, "t", "c")
            self.assertIn(word, str(e.exception))
            self.assertFalse(os.path.exists(os.path.join(a.out, "runs")))

    def test_too_many_backup_workers_are_refused(self):
        a = knobs()
        with self.assertRaises(SystemExit) as e:
            study.run_study({"b": {"cluster": [], "backup": 2}}, a, "t", "c")
        self.assertIn("backup workers", str(e.exception))


class CpuDuringTraining(unittest.TestCase):
    """The emulation's CPU gate reads the host while the nodes trained, not while they started, scored
    deferred evaluations (four processes on two cores) or exited: a demo review found a run's 80%
    was its deferred scoring, not its training."""

    def test_mean_over_the_training_window(self):
        import cluster_runs
        s = cluster_runs.CpuSampler(every=0.5)
        s.samples = [(100.0, 0.9), (101.0, 0.4), (102.0, 0.5), (103.0, 1.0), (104.0, 1.0)]
        self.assertAlmostEqual(s.mean(), 0.76)
        self.assertAlmostEqual(s.mean((100.5, 102.2)), 0.45)  # the samples that ended inside it
        self.assertIsNone(s.mean((200.0, 201.0)))


class ValidateSimNamesAMissingStudy(unittest.TestCase):
    """README's validate_sim.py --emulated runs/ab before that study exists (found walking the README):
    a named error with what to run, not a traceback."""

    def test_missing_summary(self):
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "validate_sim.py"), "--emulated",
                                os.path.join(d, "ab"), "--dry-run"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("summary.json does not exist", r.stderr)
            self.assertIn("ab_sync_async.py --out", r.stderr)
            self.assertNotIn("Traceback", r.stderr)


class NoNegativeTimes(unittest.TestCase):
    """Issue 32: a report never prints a negative time, fixed where it came from."""

    def test_an_evaluation_stamped_before_it_ran_keeps_its_time(self):
        import cluster_runs
        out = mkdtemp()
        # The trainer stamps an evaluation record (issue 25: with eval_of) when its weights are taken,
        # then evaluates (1.5 s here), so the next step's record is 1.5 s later.
        node0 = [{"step": 1, "tokens": 100, "tokens_per_s": 1.0, "unix_s": 11.0, "step_s": 1.0, "time_s": 1.0},
                 {"step": 1, "val_loss": 4.0, "unix_s": 11.0, "time_s": 1.0, "tokens": 100, "eval_of": "replica",
                  "eval_s": 1.5},
                 {"step": 2, "tokens": 200, "tokens_per_s": 1.0, "unix_s": 13.5, "step_s": 1.0, "time_s": 3.5},
                 {"step": 2, "val_loss": 3.5, "unix_s": 13.5, "time_s": 3.5, "tokens": 200, "eval_of": "replica",
                  "eval_s": 1.5}]
        node1 = [{"step": k, "tokens": 100 * k, "tokens_per_s": 1.0, "unix_s": 10.0 + k, "step_s": 1.0}
                 for k in (1, 2)]
        for i, recs in enumerate((node0, node1)):
            os.makedirs(os.path.join(out, f"node{i}"))
            with open(os.path.join(out, f"node{i}", "metrics.jsonl"), "w") as f:
                f.write("\n".join(json.dumps(r) for r in recs) + "\n")
        r = cluster_runs.summarize(out, 2, ring=True)
        # 1.0 (taking its own 1.5 s off gave -0.5), then 3.5 less the first evaluation.
        self.assertEqual([p["t"] for p in r["curve"]], [1.0, 2.0])
        self.assertAlmostEqual(r["wall_s"], 2.0)  # 10 to 13.5 less the one evaluation inside it
        # A record from before issue 25 was stamped after evaluating: its own time comes off.
        node0[1] = {"step": 1, "val_loss": 4.0, "unix_s": 12.5, "time_s": 2.5, "tokens": 100, "eval_s": 1.5}
        with open(os.path.join(out, "node0", "metrics.jsonl"), "w") as f:
            f.write("\n".join(json.dumps(r) for r in node0) + "\n")
        self.assertEqual(cluster_runs.summarize(out, 2, ring=True)["curve"][0]["t"], 1.0)

    def test_intervals_of_times_are_cut_at_zero(self):
        self.assertLess(mean_ci95([0.1, 3.0])["ci95"][0], 0)  # two seeds: t(1) = 12.7 reaches far below 0
        s = mean_ci95([0.1, 3.0], lower=0.0)
        self.assertEqual((s["ci95"][0], s.get("clipped")), (0.0, True))
        self.assertEqual(stats.fmt_ci(s), "1.55 [0, 20]")
        self.assertEqual(stats.fmt_ci(mean_ci95([1.44, 1.44, 1.44])), "1.44 (no seed variation)")


class StudyCost(unittest.TestCase):
    """Issue 32: a study prints the runs it will start, by kind, and their estimated cost from this
    machine's stored measurements before it starts; --dry-run prints every run, starts nothing and
    writes nothing."""

    AB = os.path.join(ROOT, "experiments", "ab_sync_async.py")

    def dry(self, script, args):
        cost_file = os.path.join(mkdtemp(), "cost.json")
        out = os.path.join(mkdtemp(), "out")
        env = dict(os.environ, SYNCOPATE_STUDY_COST=cost_file)
        r = subprocess.run([PY, script] + args + ["--out", out, "--dry-run"], capture_output=True, text=True, env=env,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertFalse(os.path.exists(out))  # nothing written: not even the output directory
        self.assertFalse(os.path.exists(cost_file))
        return r.stdout

    def test_dry_run_counts_the_runs_and_writes_nothing(self):
        # 3 configurations (diloco10 also tunes its outer lr), 2 tuning seeds, 3 headline seeds, a grid of
        # 3 extending at most twice. Per configuration, tuning: 3 multipliers x 2 seeds = 6, up to
        # (3 + 2) x 2 = 10; diloco10's outer lr: 3 multipliers, its 1x run made by the inner tuning at
        # the pick: 2 x 2 = 4, up to (2 + 2) x 2 = 8; headline: 3 seeds x 3 configurations = 9.
        args = ["--configs", "ring,asp,diloco10", "--nodes", "4", "--steps", "20", "--seeds", "3", "--tuning-seeds",
                "1000,1001", "--lr-grid", "0.5,1,2", "--outer-lr-grid", "0.5,1,2", "--lr-extend", "2", "--evals", "5",
                "--val-windows", "128", "--step-time", "0.3"]
        text = self.dry(self.AB, args)
        sure, worst = 3 * 6 + 4 + 9, 3 * 10 + 8 + 9
        self.assertIn(f"total: {sure} runs, up to {worst} (worst case)", text)
        self.assertIn("tuning runs (tuning seeds): 18, up to 30 if every grid extends", text)
        self.assertIn("outer-lr tuning runs (tuning seeds): 4, up to 8", text)
        self.assertIn("headline runs (3 seed(s) x 3 configuration(s)): 9", text)
        listed = [l for l in text.splitlines() if re.match(r"\[study\]   (tuning|outer tuning|headline|calibration)"
                                                         r"( \(only if the pick is on an edge\))?: \w+, lr ", l)]
        self.assertEqual(len(listed), worst)
        self.assertEqual(sum("only if the pick is on an edge" in l for l in listed), worst - sure)
        self.assertIn("headline: ring, lr the tuned pick, seed 2, 20 steps/node", text)
        self.assertIn("tuning: diloco10, lr 2x, outer lr 1x, seed 1001, 20 steps/node", text)
        self.assertIn("estimated cost:", text)
        self.assertIn("based on: training: the modelled clock", text)
        self.assertIn("NOT estimated", text)  # nothing measured in this empty cost file: said so
        # A wall budget adds one calibration run per configuration.
        text = self.dry(self.AB, args + ["--time-budget-s", "30"])
        self.assertIn("calibration runs (--time-budget-s, one per configuration): 3", text)
        self.assertIn(f"total: {sure + 3} runs, up to {worst + 3}", text)
        # --no-tune: the headline runs only.
        self.assertIn("total: 9 runs, up to 9", self.dry(self.AB, args + ["--no-tune"]))
        # The sweep: 2 bounds x 2 mitigations; grid 3 + 1 extension on 1 tuning seed, 2 headline seeds.
        text = self.dry(os.path.join(ROOT, "experiments", "staleness_sweep.py"),
                        ["--bounds", "1,4", "--no-asp", "--mitigations", "none,lr_scale", "--seeds", "2", "--lr-grid",
                         "0.5,1,2", "--lr-extend", "1", "--nodes", "2", "--steps", "10", "--step-time", "0.2"])
        self.assertIn(f"total: {4 * 3 + 4 * 2} runs, up to {4 * 4 + 4 * 2}", text)
        # The crossover map: 2 N x 1 ratio x 2 slowdowns x 2 seeds x (ring, asp_lr_scale).
        text = self.dry(os.path.join(ROOT, "experiments", "crossover.py"),
                        ["--nodes", "8,64", "--ratios", "1", "--slowdowns", "1,4", "--seeds", "2", "--configs",
                         "asp_lr_scale"])
        self.assertIn("plan: 16 runs", text)
        self.assertEqual(len(re.findall(r"^\[crossover\]   N=", text, re.M)), 16)

    def test_dry_run_starts_no_process(self):
        def refuse(*args, **kw):
            raise AssertionError(f"a process was started: {args[0] if args else kw}")
        saved = subprocess.run, subprocess.Popen
        a = knobs(dry_run=True, calibrate=True, val_windows=64, out=os.path.join(mkdtemp(), "out"), tune=True,
                  lr_grid="0.5,1,2", lr_extend=1, seeds=2)
        subprocess.run = subprocess.Popen = refuse
        try:
            with contextlib.redirect_stdout(io.StringIO()) as o:
                self.assertIsNone(study.run_study({"asp": {"cluster": ["--consistency", "asp"], "elastic": True}}, a,
                                                  "t", "c"))
        finally:
            subprocess.run, subprocess.Popen = saved
        self.assertFalse(os.path.exists(a.out))
        self.assertIn("total: 5 runs, up to 6", o.getvalue())  # tuning 3 (4 with the extension) + 2 headline

    def test_the_estimate_comes_from_the_stored_measurements(self):
        saved = os.environ["SYNCOPATE_STUDY_COST"]
        os.environ["SYNCOPATE_STUDY_COST"] = os.path.join(mkdtemp(), "cost.json")
        try:
            m0 = cost.Measurements("tiny", 8, "sim")  # nothing measured yet: no estimate, and said so
            em = {"step_time_s": 0.3, "slow_node": 3, "slowdown": 3.0, "jitter": 0.1}
            self.assertEqual(cost.run_s("sim", em, 20, None, True, 4, 5, 128, m0)[0], None)
            self.assertTrue(all("NOT estimated" in b for b in m0.basis()))
            cost.store_compute("tiny", 8, 0.05)
            cost.store_preflight("tiny", 100, wall_s=1.5, step_s=0.2, eval_s=0.3)  # start-up 1 s, 3 ms per window
            m = cost.Measurements("tiny", 8, "emulated")
            share = max(1.0, 4 / (os.cpu_count() or 1))  # every node evaluates, the nodes share the cores
            want = 20 * 0.3 * 3 * 1.1 + 5 * 128 * 0.003 * share + 1.0
            self.assertAlmostEqual(cost.run_s("emulated", em, 20, None, True, 4, 5, 128, m)[0], want)
            # Elastic under the same token budget: the straggler's 20 steps at 3x end the run too.
            self.assertAlmostEqual(cost.run_s("emulated", em, 20, None, False, 4, 5, 128, m)[0], want)
            # Elastic under a wall budget: 60 steps on the fast nodes, 20 on the straggler.
            self.assertAlmostEqual(cost.run_s("emulated", em, 60, 20, False, 4, 5, 128, m)[0], want)
            # The simulator: every worker-step's real gradient (3 x 20 + 10), one worker evaluates.
            ms = cost.Measurements("tiny", 8, "sim")
            self.assertAlmostEqual(cost.run_s("sim", em, 20, 10, False, 4, 5, 128, ms)[0],
                                   70 * 0.05 + 5 * 128 * 0.003 + 1.0)
            # Finished runs' overhead replaces the preflight's start-up once three of a kind are stored.
            cost.record_runs({"emulated/ring": [2.0, 2.5, 3.0]})
            m2 = cost.Measurements("tiny", 8, "emulated")
            self.assertAlmostEqual(cost.run_s("emulated", em, 20, None, True, 4, 5, 128, m2, ring=True)[0],
                                   want - 1.0 + 2.5)
            self.assertAlmostEqual(cost.run_s("emulated", em, 20, None, True, 4, 5, 128, m2, ring=False)[0], want)
            self.assertTrue(any("last 3 finished emulated/ring runs" in b for b in m2.basis()))
        finally:
            os.environ["SYNCOPATE_STUDY_COST"] = saved


def smoke_args(out):
    # --no-tune: smoke runs check the files and the flags, not tuned learning rates. --val-windows 64:
    # the fixed held-out set, small enough for the test's speed.
    return ["--nodes", "2", "--steps", "6", "--evals", "3", "--seeds", "2", "--no-tune", "--step-time", "0.12",
            "--val-windows", "64", "--targets", "5.4,3.0", "--no-calibrate", "--out", out,
            # ctest runs other tests beside this one: the smoke runs check the files, not the
            # emulation's fidelity, so overruns and a busy CPU do not void them here.
            "--max-overrun", "1", "--max-cpu", "1"]


class Smoke(unittest.TestCase):
    def check_outputs(self, out, names, seeds=2):
        for f in ("report.md", "summary.json", "val_loss_vs_time.png", "val_loss_vs_tokens.png", "staleness.png"):
            self.assertTrue(os.path.exists(os.path.join(out, f)), f)
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(s["targets"], [5.4, 3.0])
        tokens = None
        for n in names:
            c = s["configurations"][n]
            self.assertEqual(c["runs_total"], seeds)
            self.assertEqual(len(c["per_seed"]), c["valid_runs"])
            for ps in c["per_seed"]:
                for key in ("seed", "final_val_loss", "val_loss_at_budget", "time_to_target_s", "tokens_per_s"):
                    self.assertIn(key, ps)
                self.assertEqual(set(ps["time_to_target_s"]), {"5.4", "3"})
            for key in ("final_val_loss", "val_loss_at_budget", "tokens_per_s"):
                self.assertEqual(len(c[key]["ci95"]), 2)
            self.assertEqual(set(c["staleness"]), {"mean", "max", "histogram"})
            self.assertIn("overrun_share", c)
            self.assertIn("cpu_util", c)
            curve = c["curves"]["0"]
            self.assertGreaterEqual(len(curve), 3)
            # Under a token budget every configuration is evaluated as often (at the same global token
            # counts, crossed by each job's own steps, and at its end), besides the points an asynchronous
            # mode's node 0 takes while it waits for a straggler at the end (while_waiting).
            if s["budget"]["kind"] == "tokens":
                own = len([p for p in curve if not p.get("while_waiting")])
                tokens = tokens or own
                self.assertEqual(own, tokens, n)
            self.assertEqual(c["eval_points"]["points"]["max"], max(len(cv) for cv in c["curves"].values()))
        for cmp in s["comparisons"]:
            self.assertEqual(set(cmp) >= {"a", "b", "metric", "mean_diff", "ci95", "p", "p_holm", "resolved"}, True)
        self.assertEqual(len(s["comparisons"]), (len(names) - 1) * 4)  # vs the baseline: loss, tokens/s, 2 targets
        return s

    def test_ab_writes_its_outputs_and_the_straggler_is_paced(self):
        out = mkdtemp()
        # --no-overlap: the simulator, which validates this study below, does not model overlap.
        cmd = [PY, os.path.join(ROOT, "experiments", "ab_sync_async.py"), "--configs", "ring,asp,bsp_backup",
               "--slow-node", "1", "--slowdown", "2", "--tensorboard", "--no-overlap"] + smoke_args(out)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        s = self.check_outputs(out, ["ring", "asp", "bsp_backup"])
        # The straggler's steps were modelled 2x longer: its metrics say so.
        with open(os.path.join(out, "runs", "asp", "lr1", "seed0", "node1", "metrics.jsonl")) as f:
            m = [json.loads(l) for l in f if '"modelled_s"' in l]
        self.assertTrue(all(abs(x["modelled_s"] - 0.24) < 1e-9 for x in m))
        self.assertEqual(s["configurations"]["ring"]["staleness"]["max"], 0)
        # TensorBoard export: an event file per run
        events = os.listdir(os.path.join(out, "tensorboard", "asp", "seed1"))
        self.assertTrue(any(e.startswith("events.out.tfevents") for e in events), events)
        self.assertGreater(s["configurations"]["asp"]["staleness"]["max"], 0)
        # The same study re-run in the simulator, figure by figure against the emulated runs.
        val = mkdtemp()
        subprocess.run([PY, os.path.join(ROOT, "experiments", "validate_sim.py"), "--emulated", out, "--out", val],
                       check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(val, "validation.json")) as f:
            v = json.load(f)
        self.assertEqual(set(v["configurations"]), {"ring", "asp", "bsp_backup"})
        self.assertIn(v["verdict"], ("pass", "fail", "n/a"))
        for c in v["configurations"].values():
            self.assertEqual(len(c["curves"]["simulated"]), 2)
            for m in ("end_s", "tokens_per_s", "val_loss_at_budget", "time_to_target_s@5.4"):
                self.assertIn(c["checks"][m]["verdict"], ("pass", "fail", "n/a"))
        self.assertEqual({(x["a"], x["b"]) for x in v["contrasts"]}, {("asp", "ring"), ("bsp_backup", "ring")})
        # The ring's evaluations fall on the same steps in both backends (the simulator plays the
        # same run), and its simulated losses are close to the emulated ones: the same model, data
        # and updates, summed in another order.
        ring = v["configurations"]["ring"]["curves"]
        for emu, sim in zip(ring["emulated"], ring["simulated"]):
            self.assertEqual([p["step"] for p in emu], [p["step"] for p in sim])
            self.assertAlmostEqual(emu[-1]["val_loss"], sim[-1]["val_loss"], delta=0.05)
        self.assertTrue(os.path.exists(os.path.join(val, "report.md")))

    def test_the_simulator_backend_runs_a_study_past_this_machine(self):
        out = mkdtemp()
        args = smoke_args(out)
        args[args.index("--nodes") + 1] = "16"
        cmd = [PY, os.path.join(ROOT, "experiments", "ab_sync_async.py"), "--backend", "sim", "--configs",
               "ring,asp,bsp_backup", "--slow-node", "15", "--slowdown", "2", "--servers", "4", "--preset", "micro",
               "--batch", "2"] + args
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        s = self.check_outputs(out, ["ring", "asp", "bsp_backup"])
        self.assertEqual(s["emulation"]["backend"], "sim")
        run = os.path.join(out, "runs", "asp", "lr1", "seed0")
        with open(os.path.join(run, "sim.json")) as f:
            self.assertEqual(json.load(f)["servers"], 4)
        self.assertGreater(s["configurations"]["asp"]["staleness"]["max"], 0)
        self.assertEqual(s["configurations"]["ring"]["staleness"]["max"], 0)
        with open(os.path.join(out, "report.md")) as f:
            self.assertIn("simulated seconds", f.read())

    def test_a_schedule_fitted_to_a_wall_budget_ends_at_it_in_the_simulator(self):
        """--time-budget-s: a calibration per configuration, then every node's steps = budget / its
        step time, so every node's last step ends within a step of the budget; the straggler of ASP
        does fewer steps than the others, the ring's nodes the same number."""
        out = mkdtemp()
        budget = 1.5
        args = smoke_args(out) + ["--time-budget-s", str(budget), "--calibration-steps", "8"]
        args[args.index("--nodes") + 1] = "4"
        cmd = [PY, os.path.join(ROOT, "experiments", "ab_sync_async.py"), "--backend", "sim", "--configs", "ring,asp",
               "--slow-node", "3", "--slowdown", "2", "--preset", "micro", "--batch", "2"] + args
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        s = self.check_outputs(out, ["ring", "asp"])
        self.assertEqual(s["budget"], {"kind": "time", "value": budget})
        for name in ("ring", "asp"):
            run = os.path.join(out, "runs", name, "lr1", "seed0")
            ends, counts = [], []
            for i in range(4):
                with open(os.path.join(run, f"node{i}", "metrics.jsonl")) as f:
                    steps = [json.loads(l) for l in f if '"tokens_per_s"' in l]
                counts.append(steps[-1]["step"])
                ends.append((steps[-1]["time_s"], steps[-1]["time_s"] / len(steps)))
            for end, per_step in ends:  # within a step (and 10% slack for jitter) of the budget
                self.assertLess(abs(end - budget), per_step + 0.1 * budget, (name, ends))
            if name == "ring":
                self.assertEqual(len(set(counts)), 1)
            else:
                self.assertLess(counts[3], counts[0])
                self.assertEqual(s["configurations"]["asp"]["plan"]["slow_steps"], counts[3])

    def test_sweep_writes_its_outputs_and_a_failing_configuration_is_reported(self):
        out = mkdtemp()
        cmd = [PY, os.path.join(ROOT, "experiments", "staleness_sweep.py"), "--bounds", "1", "--no-asp"] + smoke_args(out)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        s = self.check_outputs(out, ["ssp1"])
        self.assertTrue(os.path.exists(os.path.join(out, "val_loss_vs_bound.png")))
        self.assertEqual(s["held_out"]["eval_of"]["ssp1"], ["servers"])  # the servers' weights were evaluated
        self.assertEqual(s["held_out"]["val_tokens"], 64 * 128)
        # This study ran with overlap (the default): validate_sim replays it with the simulator's overlap
        # (the parameter servers' pushes during the modelled backward).
        vout = mkdtemp()
        r = subprocess.run([PY, os.path.join(ROOT, "experiments", "validate_sim.py"), "--emulated", out, "--out",
                            vout], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        with open(os.path.join(vout, "runs", "ssp1", "seed0", "config.toml")) as f:
            cfg = f.read()
        self.assertIn("ps_push_in_backward = true", cfg)
        self.assertRegex(cfg, r"\[emulate\][^\[]*overlap = true")
        # A configuration whose workers refuse their arguments fails; the other still completes.
        out2 = mkdtemp()
        a = knobs(out=out2, val_windows=64)
        configs = {"asp": {"cluster": ["--consistency", "asp"]},
                   "broken": {"cluster": ["--consistency", "asp"], "worker": ["--train.no_such_field=1"]}}
        s = study.run_study(configs, a, "t", "c")
        self.assertEqual(s["configurations"]["asp"]["valid_runs"], 1)
        self.assertEqual(s["configurations"]["broken"]["valid_runs"], 0)
        self.assertEqual(len(s["configurations"]["broken"]["failed"]), 1)
        with open(os.path.join(out2, "report.md")) as f:
            self.assertIn("broken seed 0: exit 2: syncopate-worker: config error: unknown config field", f.read())
        # A held-out set larger than the validation split: the trainer's refusal, surfaced before any run.
        out4 = mkdtemp()
        with self.assertRaises(SystemExit) as e:
            study.run_study({"asp": {"cluster": ["--consistency", "asp"]}}, knobs(out=out4, val_windows=1 << 23), "t", "c")
        self.assertIn("--val-windows", str(e.exception))
        self.assertFalse(os.path.exists(os.path.join(out4, "runs")))
        # An emulation that cannot hold (1 ms modelled against ~tens of ms of real compute) is
        # reported invalid and kept out of every figure.
        out3 = mkdtemp()
        a3 = knobs(max_overrun=0.05, step_time=0.001, out=out3, val_windows=64)
        s3 = study.run_study({"asp": {"cluster": ["--consistency", "asp"]}}, a3, "t", "c")
        c = s3["configurations"]["asp"]
        self.assertEqual(c["valid_runs"], 0)
        self.assertIn("overran their modelled time", c["invalid"][0]["why"])
        self.assertIsNone(c["final_val_loss"]["mean"])


class RunCache(unittest.TestCase):
    """--resume (on by default for --backend sim): a run is taken back only when its run.json names the
    same command line and the same inputs (binaries, libtorch, data; for emulated runs the launch
    scripts too); its figures are then read again from its files. Real syncopate-sim runs."""

    def study(self, out, *extra):
        cmd = [PY, os.path.join(ROOT, "experiments", "ab_sync_async.py"), "--backend", "sim", "--nodes", "2",
               "--steps", "6", "--configs", "ring,asp", "--no-tune", "--seeds", "2", "--evals", "2",
               "--val-windows", "8", "--preset", "micro", "--step-time", "0.05", "--no-calibrate", "--no-trace",
               "--out", out, *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        with open(os.path.join(out, "summary.json")) as f:
            return r.stdout, json.load(f)

    def test_a_run_is_reused_only_from_the_same_command_and_inputs(self):
        if not os.path.exists(os.path.join(ROOT, "build", "bin", "syncopate-sim")):
            self.fail("build/bin/syncopate-sim is not built (scripts/build.sh)")
        out = mkdtemp()
        _, first = self.study(out)
        self.assertEqual(first["cost"]["reused_runs"], 0)
        seed0 = os.path.join(out, "runs", "asp", "lr1", "seed0", "run.json")
        with open(seed0) as f:
            made = json.load(f)
        # The record holds what made the run, not its figures (those are read from its files again).
        self.assertEqual(set(made), {"command", "inputs", "cpu_util", "elapsed_s"})
        self.assertEqual(made["inputs"], cluster_runs.run_inputs(True))
        text, again = self.study(out)
        self.assertEqual(again["cost"]["reused_runs"], 4)
        self.assertEqual(text.count(": reused ("), 4)
        # The same conclusions from the reused runs: the simulator is deterministic.
        self.assertEqual([(c["metric"], c["mean_diff"]) for c in first["comparisons"]],
                         [(c["metric"], c["mean_diff"]) for c in again["comparisons"]])
        with open(os.path.join(out, "report.md")) as f:
            self.assertIn("4 of the runs were reused from an earlier invocation", f.read())
        # Other inputs (as a rebuild would leave), another command, a record gone, metrics no longer
        # readable: each is made again.
        seed1 = os.path.join(out, "runs", "asp", "lr1", "seed1", "run.json")
        ring0 = os.path.join(out, "runs", "ring", "lr1", "seed0", "run.json")
        ring1 = os.path.join(out, "runs", "ring", "lr1", "seed1")
        with open(seed0, "w") as f:
            json.dump(dict(made, inputs="0" * 64), f)
        with open(ring0) as f:
            r0 = json.load(f)
        with open(ring0, "w") as f:
            json.dump(dict(r0, command="syncopate-sim --other"), f)
        os.remove(seed1)
        with open(os.path.join(ring1, "node0", "metrics.jsonl"), "w") as f:
            f.write("{not json\n")
        with open(os.path.join(os.path.dirname(seed1), "left_over.txt"), "w") as f:
            f.write("an earlier making's file\n")
        text, third = self.study(out)
        self.assertEqual(third["cost"]["reused_runs"], 0, text)
        self.assertEqual(third["configurations"]["ring"]["valid_runs"], 2)
        with open(seed0) as f:
            self.assertEqual(json.load(f)["inputs"], made["inputs"])  # made again, recorded anew
        # A run made again starts from an empty directory (a trainer would resume from what it finds).
        self.assertFalse(os.path.exists(os.path.join(os.path.dirname(seed1), "left_over.txt")))
        # --no-resume runs every one again.
        _, fourth = self.study(out, "--no-resume")
        self.assertEqual(fourth["cost"]["reused_runs"], 0)

    def test_a_study_stops_when_its_inputs_change_under_it(self):
        # Its inputs (libtorch, the data: the simulator is pinned) changed between two runs of one program: the
        # second run is refused by name instead of mixing them.
        out = mkdtemp()
        _, s = self.study(os.path.join(out, "study"))  # a study's own emulation and job, for run_once below
        real = cluster_runs.run_inputs
        calls = []

        def inputs(sim):
            calls.append(sim)
            return real(sim) if len(calls) == 1 else "0" * 64  # the binary rebuilt after the first run
        cluster_runs.run_inputs = inputs
        cluster_runs._FIRST_INPUTS.clear()
        try:
            em, job, ring = s["emulation"], s["job"], {"ring": True, "cluster": [], "steps": 6, "slow_steps": None}
            r = cluster_runs.run_once("ring", ring, em, job, 0, 2e-3, os.path.join(out, "a"), backend="sim")
            self.assertNotIn("failed", r)
            with self.assertRaises(SystemExit) as e:
                cluster_runs.run_once("ring", ring, em, job, 1, 2e-3, os.path.join(out, "b"), backend="sim")
            self.assertIn("the inputs of the simulator's runs changed while this program ran (build/sim-pins/",
                          str(e.exception))
            self.assertIn("Do not rebuild, reinstall or re-tokenize while a study runs", str(e.exception))
            self.assertFalse(os.path.exists(os.path.join(out, "b")), "nothing made from the new build")
        finally:
            cluster_runs.run_inputs = real
            cluster_runs._FIRST_INPUTS.clear()

    def test_a_rebuild_during_a_study_does_not_reach_its_runs(self):
        # The program pins the simulator it found at its first run; a rebuild afterwards (here: the built file's
        # bytes changed) neither stops it nor mixes builds: both runs execute the same pinned copy, and a later
        # program pins the new build under another name.
        out = mkdtemp()
        _, s = self.study(os.path.join(out, "study"))
        built, pins = cluster_runs.SIM_BUILT, cluster_runs.SIM_PINS
        cluster_runs.SIM_BUILT = os.path.join(out, "syncopate-sim")
        cluster_runs.SIM_PINS = os.path.join(out, "pins")
        shutil.copy2(built, cluster_runs.SIM_BUILT)
        cluster_runs._PINNED.clear()
        cluster_runs._FIRST_INPUTS.clear()
        try:
            em, job, ring = s["emulation"], s["job"], {"ring": True, "cluster": [], "steps": 6, "slow_steps": None}
            r = cluster_runs.run_once("ring", ring, em, job, 0, 2e-3, os.path.join(out, "a"), backend="sim")
            self.assertNotIn("failed", r)
            with open(cluster_runs.SIM_BUILT, "ab") as f:
                f.write(b"rebuilt")  # an ELF with trailing bytes still runs: a different build of the same program
            r = cluster_runs.run_once("ring", ring, em, job, 1, 2e-3, os.path.join(out, "b"), backend="sim")
            self.assertNotIn("failed", r)
            cmds = [open(os.path.join(out, x, "command.txt")).read().split()[0] for x in ("a", "b")]
            self.assertEqual(cmds[0], cmds[1])
            self.assertTrue(cmds[0].startswith(cluster_runs.SIM_PINS + os.sep), cmds[0])
            self.assertNotEqual(cluster_runs.file_digest(cmds[0]), cluster_runs.file_digest(cluster_runs.SIM_BUILT))
            cluster_runs._PINNED.clear()  # a new program
            self.assertNotEqual(cluster_runs.sim_binary(), cmds[0])
            self.assertEqual(cluster_runs.file_digest(cluster_runs.sim_binary()),
                             cluster_runs.file_digest(cluster_runs.SIM_BUILT))
        finally:
            cluster_runs.SIM_BUILT, cluster_runs.SIM_PINS = built, pins
            cluster_runs._PINNED.clear()
            cluster_runs._FIRST_INPUTS.clear()

    def test_emulated_inputs_include_the_launch_scripts_and_the_worker_that_runs(self):
        base = cluster_runs.run_inputs(False)
        self.assertNotEqual(base, cluster_runs.run_inputs(True))
        for var in ("SYNCOPATE_TBF_QUEUE_MS", "SYNCOPATE_TBF_BURST_MS"):  # each changes the links
            old = os.environ.get(var)
            os.environ[var] = "7"
            try:
                self.assertNotEqual(base, cluster_runs.run_inputs(False), var)
            finally:
                if old is None:
                    del os.environ[var]
                else:
                    os.environ[var] = old
        d = mkdtemp()
        for name in ("syncopate-worker", "syncopate-server"):
            with open(os.path.join(d, name), "w") as f:
                f.write("#!/bin/sh\n")
        os.environ["SYNCOPATE_WORKER"] = os.path.join(d, "syncopate-worker")
        try:
            self.assertNotEqual(base, cluster_runs.run_inputs(False))
        finally:
            del os.environ["SYNCOPATE_WORKER"]
        self.assertEqual(base, cluster_runs.run_inputs(False))


class StudyLanes(unittest.TestCase):
    """study.py --make-only: one study made by lanes in separate processes (sharing OUT, each run locked while
    it is made), then written by an invocation that takes every run back; and SIGTERM ends a study with the
    run it was waiting on. Real syncopate-sim runs."""

    ARGS = ["--backend", "sim", "--nodes", "2", "--configs", "ring,asp", "--no-tune", "--seeds", "2", "--evals", "2",
            "--val-windows", "8", "--preset", "micro", "--step-time", "0.05", "--no-calibrate", "--no-trace"]

    def command(self, out, *extra):
        return [PY, os.path.join(ROOT, "experiments", "ab_sync_async.py"), *self.ARGS, "--out", out, *extra]

    def setUp(self):
        if not os.path.exists(os.path.join(ROOT, "build", "bin", "syncopate-sim")):
            self.fail("build/bin/syncopate-sim is not built (scripts/build.sh)")

    def test_lanes_make_each_run_once_and_the_study_equals_one_made_in_one_go(self):
        budget = ["--time-budget-s", "1.5", "--calibration-steps", "6"]  # calibrations too: every lane needs them
        whole = mkdtemp()
        r = subprocess.run(self.command(whole, *budget), capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        out = mkdtemp()
        # Two lanes at once, both asking for the ring's runs: the lock lets one make each, the other takes it back.
        lanes = [subprocess.Popen(self.command(out, *budget, "--make-only", m), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for m in ("ring,asp", "ring")]
        logs = [p.communicate(timeout=300)[0] for p in lanes]
        for p, log in zip(lanes, logs):
            self.assertEqual(p.returncode, 0, log[-2000:])
            self.assertIn("lane done", log)
        self.assertFalse(os.path.exists(os.path.join(out, "summary.json")), "a lane writes no summary")
        made = sum(len(re.findall(r"seed \d+: final val", log)) for log in logs)
        self.assertEqual(made, 4, "every run (2 configurations x 2 seeds) made exactly once across the lanes")
        self.assertEqual(sum(log.count(": reused (") for log in logs), 2, "the ring's 2 runs taken back by the lane "
                         "that came second to them")
        r = subprocess.run(self.command(out, *budget), capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        with open(os.path.join(out, "summary.json")) as f:
            lanes_s = json.load(f)
        with open(os.path.join(whole, "summary.json")) as f:
            whole_s = json.load(f)
        self.assertEqual(lanes_s["cost"]["reused_runs"], 4)
        self.assertEqual([(c["metric"], c["mean_diff"]) for c in whole_s["comparisons"]],
                         [(c["metric"], c["mean_diff"]) for c in lanes_s["comparisons"]])
        self.assertEqual({n: c["plan"] for n, c in whole_s["configurations"].items()},
                         {n: c["plan"] for n, c in lanes_s["configurations"].items()})
        self.assertEqual({n: c["curves"] for n, c in whole_s["configurations"].items()},
                         {n: c["curves"] for n, c in lanes_s["configurations"].items()})

    def test_the_plan_does_not_count_the_runs_it_will_take_back(self):
        out = mkdtemp()
        fresh = subprocess.run(self.command(out, "--steps", "4", "--dry-run"), capture_output=True, text=True,
                               timeout=120)
        self.assertEqual(fresh.returncode, 0, fresh.stderr[-2000:])
        self.assertNotIn("found finished", fresh.stdout)
        r = subprocess.run(self.command(out, "--steps", "4"), capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        again = subprocess.run(self.command(out, "--steps", "4", "--dry-run"), capture_output=True, text=True,
                               timeout=120)
        self.assertEqual(again.returncode, 0, again.stderr[-2000:])
        self.assertIn(f"total: 4 runs, up to 4 (worst case), one at a time; 4 of them found finished in {out}",
                      again.stdout)
        self.assertEqual(again.stdout.count("(found finished): "), 4)
        # Another seed is not in the cache: counted.
        more = subprocess.run(self.command(out, "--steps", "4", "--dry-run", "--seeds", "3"), capture_output=True,
                              text=True, timeout=120)
        self.assertIn("total: 6 runs, up to 6 (worst case), one at a time; 4 of them found finished", more.stdout)
        self.assertIn("headline: asp, lr 1x, seed 2, 4 steps/node", more.stdout)

    def test_a_lane_of_another_studys_configurations_is_refused(self):
        r = subprocess.run(self.command(mkdtemp(), "--steps", "4", "--make-only", "ssp4"), capture_output=True,
                           text=True, timeout=120)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--make-only ssp4: ssp4 not among this study's configurations", r.stdout + r.stderr)
        # Lanes share runs through the cache: without it (--no-resume, or emulated runs) they are refused.
        r = subprocess.run(self.command(mkdtemp(), "--steps", "4", "--make-only", "ring", "--no-resume"),
                           capture_output=True, text=True, timeout=120)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--make-only: lanes share their runs through the run cache", r.stdout + r.stderr)

    def stop_a_running_study(self, stop):
        """Starts a long study, waits for its first run, calls stop(study process), then asserts that no
        run outlives it (everything the study started is ended in the end, whatever the assertions say)."""
        out = mkdtemp()
        p = subprocess.Popen(self.command(out, "--steps", "20000"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.time() + 120
            while time.time() < deadline and not running(out):
                time.sleep(0.2)
            self.assertTrue(running(out), "the study's first run did not start")
            stop(p)
            deadline = time.time() + 20
            while time.time() < deadline and running(out):
                time.sleep(0.2)
            self.assertEqual(running(out), [], "a run outlived its study")
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            for pid in running(out):
                os.kill(pid, signal.SIGKILL)

    def test_sigterm_ends_the_study_and_the_run_it_waits_on(self):
        def term(p):
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(timeout=60), 143)
        self.stop_a_running_study(term)

    def test_a_killed_study_takes_its_run_with_it(self):
        # SIGKILL leaves the study no handler: the run's parent-death signal (cluster_runs.run_group) ends it.
        def kill(p):
            p.kill()
            p.wait(timeout=30)
        self.stop_a_running_study(kill)


class TuningAtTheBudget(unittest.TestCase):
    """Under a wall budget each learning rate is scored on its tuning runs' loss at the budget (what the
    headline runs are compared on), not on their end-of-run loss: heavy-tailed jitter makes the runs
    overrun their fitted schedules, so the two differ. Real syncopate-sim runs."""

    def test_each_lr_is_scored_on_the_loss_at_the_budget(self):
        if not os.path.exists(os.path.join(ROOT, "build", "bin", "syncopate-sim")):
            self.fail("build/bin/syncopate-sim is not built (scripts/build.sh)")
        import cluster_runs
        out = mkdtemp()
        cmd = [PY, os.path.join(ROOT, "experiments", "ab_sync_async.py"), "--backend", "sim", "--nodes", "2",
               "--configs", "ring", "--preset", "micro", "--batch", "2", "--step-time", "0.05", "--jitter", "1.5",
               "--jitter-tail", "1.3", "--time-budget-s", "10", "--calibration-steps", "6", "--lr-grid", "1,2",
               "--lr-extend", "0", "--tuning-seeds", "20,21", "--seeds", "2", "--evals", "4", "--val-windows", "8",
               "--no-calibrate", "--no-trace", "--out", out]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(s["tuning_score"], "val_loss_at_budget")
        scores = s["configurations"]["ring"]["tuning"]["lr"]["scores"]
        self.assertEqual(sorted(scores), ["1", "2"])
        past = 0
        for m, score in scores.items():
            ends, at = [], []
            for seed in (20, 21):
                cv = cluster_runs.summarize(os.path.join(out, "runs", "ring", f"lr{m}", f"seed{seed}"), 2, ring=True,
                                            deferred=True)["curve"]
                ends.append(cv[-1]["val_loss"])
                at.append(method.at_budget(cv, s["budget"])["val_loss"])
                past += cv[-1]["t"] > s["budget"]["value"]
            self.assertAlmostEqual(score, sum(at) / 2, places=12)
            if ends != at:
                self.assertNotAlmostEqual(score, sum(ends) / 2, places=6)
        self.assertGreater(past, 0, "no tuning run overran the budget: this test would not tell the two scores apart")


class ScheduleByTime(unittest.TestCase):
    """--schedule-by time (syncopate-sim's sim.time_schedule): under heavy-tailed jitter, where a schedule of
    calibrated steps overruns the budget, every run's schedule ends at the budget and its loss at the budget is
    scored there. Real syncopate-sim runs: the same study by steps and by time."""

    def study(self, by):
        out = mkdtemp()
        cmd = [PY, os.path.join(ROOT, "experiments", "ab_sync_async.py"), "--backend", "sim", "--nodes", "2",
               "--configs", "ring,asp", "--preset", "micro", "--batch", "2", "--step-time", "0.05", "--jitter", "1.5",
               "--jitter-tail", "1.3", "--time-budget-s", "10", "--calibration-steps", "6", "--lr-grid", "1,2",
               "--lr-extend", "0", "--tuning-seeds", "20", "--seeds", "2", "--evals", "4", "--val-windows", "8",
               "--no-calibrate", "--no-trace", "--schedule-by", by, "--out", out]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        with open(os.path.join(out, "summary.json")) as f:
            return out, json.load(f)

    def test_every_run_ends_at_the_budget_by_the_clock_not_by_steps(self):
        if not os.path.exists(os.path.join(ROOT, "build", "bin", "syncopate-sim")):
            self.fail("build/bin/syncopate-sim is not built (scripts/build.sh)")
        _, steps = self.study("steps")
        ends = [p["end_s"] for c in steps["configurations"].values() for p in c["per_seed"]]
        self.assertTrue(any(abs(e - 10) > 0.5 for e in ends), f"no run by steps missed the budget: {ends}")
        out, timed = self.study("time")
        for name, c in timed["configurations"].items():
            for p in c["per_seed"]:
                self.assertEqual(p["end_s"], 10, (name, p["seed"]))
                self.assertEqual(p["at_budget_s"], 10, (name, p["seed"]))  # the shipped weights scored at the budget
                self.assertTrue(p["at_limit"], (name, p["seed"]))
                [path] = glob.glob(os.path.join(out, "runs", name, "lr*", f"seed{p['seed']}", "command.txt"))
                with open(path) as f:
                    line = f.read()
                self.assertIn("--sim.time_schedule=true", line)
                self.assertIn("--sim.time_limit_s=10", line)
                planned = timed["configurations"][name]["plan"]["steps"]
                self.assertIn(f"--train.steps={planned * 3} ", line)
        with open(os.path.join(out, "report.md")) as f:
            report = f.read()
        self.assertIn("ran by the simulated clock", report)
        self.assertNotIn("ended past the", report)
        self.assertEqual(timed["job"]["time_schedule_s"], 10)
        # Refused by name where no clock schedules: the emulated cluster's trainer.
        r = subprocess.run([PY, os.path.join(ROOT, "experiments", "ab_sync_async.py"), "--nodes", "2", "--configs", "ring",
                            "--time-budget-s", "10", "--schedule-by", "time", "--dry-run", "--out", mkdtemp()],
                           capture_output=True, text=True, timeout=120)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--schedule-by time needs --time-budget-s, --backend sim", r.stdout + r.stderr)


def running(out):
    """Pids of syncopate-sim processes writing under OUT."""
    pids = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"syncopate-sim") and any(out.encode() in x for x in argv):
            pids.append(int(d))
    return pids


if __name__ == "__main__":
    unittest.main(verbosity=2)
