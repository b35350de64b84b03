"""The study tooling: statistics against hand-computed intervals, scenario validation and
derivation, time to target, refusals of impossible emulations, and smoke runs of both experiment
scripts (real processes on loopback, tiny settings) that check every file they must write and that
a configuration failing inside a study is reported while the others complete."""
import json
import math
import os
import subprocess
import sys
import tempfile
import types
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import scenario  # noqa: E402
import study  # noqa: E402
import stats  # noqa: E402
from stats import mean_ci95, separated, t975  # noqa: E402

PY = sys.executable
# Every directory a test writes lies under one temporary directory, removed when the tests end
# (pass or fail): nothing is left in /tmp.
_SCRATCH = tempfile.TemporaryDirectory(prefix="syncopate-experiments-test-")


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


class TimeToTarget(unittest.TestCase):
    def test_linear_between_points_and_none_when_not_reached(self):
        curve = [{"t": 0.0, "val_loss": 3.0}, {"t": 10.0, "val_loss": 2.0}, {"t": 20.0, "val_loss": 1.0}]
        self.assertAlmostEqual(study.time_to_target(curve, 1.5), 15.0)
        self.assertAlmostEqual(study.time_to_target(curve, 3.5), 0.0)
        self.assertIsNone(study.time_to_target(curve, 0.5))


    def test_loss_at_a_common_time_and_the_target_from_it(self):
        curve = [{"t": 0.0, "val_loss": 3.0}, {"t": 10.0, "val_loss": 2.0}]
        self.assertAlmostEqual(study.loss_at(curve, 2.5), 2.75)
        self.assertIsNone(study.loss_at(curve, 11.0))
        long = [{"t": 0.0, "val_loss": 3.0}, {"t": 10.0, "val_loss": 2.0}, {"t": 20.0, "val_loss": 1.0}]
        summary = {"target_rule": "best", "emulation": {"dilation": 2.0},
                   "configurations": {"a": {"curves": {"0": curve, "1": curve}},
                                      "b": {"curves": {"0": long, "1": long}}}}
        study.targets(summary)
        self.assertEqual(summary["equal_time_s"], 10.0)  # the earliest end, not b's later one
        self.assertAlmostEqual(summary["target_val_loss"], 1.02 * 2.0)
        self.assertEqual(summary["configurations"]["b"]["time_to_target_s"]["reached"], 2)
        self.assertAlmostEqual(summary["configurations"]["a"]["time_to_target_target_s"]["mean"],
                               study.time_to_target(curve, 2.04) / 2.0)


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
             jitter=None, netns=False, link_gbit=None, calibrate=False, target_loss="best", out=mkdtemp())
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

    def test_a_bad_target_is_refused_before_any_run(self):
        a = knobs(configs=None, lr_grid="1", target_loss="lowest", out=mkdtemp())
        with self.assertRaises(SystemExit) as e:
            study.run_study({"asp": {"cluster": []}}, a, "t", "c")
        self.assertIn("--target-loss", str(e.exception))
        self.assertFalse(os.path.exists(os.path.join(a.out, "runs")))

    def test_too_many_backup_workers_are_refused(self):
        a = knobs(configs=None, lr_grid="1", out=mkdtemp())
        with self.assertRaises(SystemExit) as e:
            study.run_study({"b": {"cluster": [], "backup": 2}}, a, "t", "c")
        self.assertIn("backup workers", str(e.exception))


def smoke_args(out):
    return ["--nodes", "2", "--steps", "6", "--evals", "3", "--seeds", "2", "--lr-grid", "1", "--step-time", "0.12",
            "--warmup", "1", "--no-calibrate", "--out", out,
            # ctest runs other tests beside this one: the smoke runs check the files, not the
            # emulation's fidelity, so overruns and a busy CPU do not void them here.
            "--max-overrun", "1", "--max-cpu", "1"]


class Smoke(unittest.TestCase):
    def check_outputs(self, out, names):
        for f in ("report.md", "summary.json", "val_loss_vs_time.png", "val_loss_vs_tokens.png", "staleness.png"):
            self.assertTrue(os.path.exists(os.path.join(out, f)), f)
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
        self.assertIsNotNone(s["target_val_loss"])
        for n in names:
            c = s["configurations"][n]
            for key in ("time_to_target_s", "final_val_loss", "tokens_per_s"):
                self.assertIn("mean", c[key])
                self.assertEqual(len(c[key]["ci95"]), 2)
            self.assertEqual(set(c["staleness"]), {"mean", "max", "histogram"})
            self.assertIn("overrun_share", c)
            self.assertIn("cpu_util", c)
            self.assertEqual(c["runs_total"], 2)
            curve = c["curves"]["0"]
            self.assertGreaterEqual(len(curve), 3)  # evaluations at the same steps in every configuration
        return s

    def test_ab_writes_its_outputs_and_the_straggler_is_paced(self):
        out = mkdtemp()
        cmd = [PY, os.path.join(ROOT, "experiments", "ab_sync_async.py"), "--configs", "ring,asp,bsp_backup",
               "--slow-node", "1", "--slowdown", "2", "--tensorboard"] + smoke_args(out)
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
        for c in v["configurations"].values():
            self.assertEqual(len(c["curves"]["simulated"]), 2)
            self.assertIn(c["agree"]["final_val_loss"], (True, False))
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
        with open(os.path.join(run, "node15", "metrics.jsonl")) as f:
            m = [json.loads(l) for l in f if '"modelled_s"' in l]
        self.assertEqual(len(m), 6)  # the straggler's elastic budget: the synchronous job's steps
        self.assertTrue(all(abs(x["modelled_s"] - 0.24) < 1e-9 for x in m))
        with open(os.path.join(run, "node0", "metrics.jsonl")) as f:
            self.assertEqual(sum('"modelled_s"' in l for l in f), 12)  # the others do slowdown x as many
        with open(os.path.join(run, "sim.json")) as f:
            self.assertEqual(json.load(f)["servers"], 4)
        self.assertGreater(s["configurations"]["asp"]["staleness"]["max"], 0)
        self.assertEqual(s["configurations"]["ring"]["staleness"]["max"], 0)
        with open(os.path.join(out, "report.md")) as f:
            self.assertIn("simulated seconds", f.read())

    def test_sweep_writes_its_outputs_and_a_failing_configuration_is_reported(self):
        out = mkdtemp()
        cmd = [PY, os.path.join(ROOT, "experiments", "staleness_sweep.py"), "--bounds", "1", "--no-asp"] + smoke_args(out)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        self.check_outputs(out, ["ssp1"])
        self.assertTrue(os.path.exists(os.path.join(out, "val_loss_vs_bound.png")))
        # A configuration whose workers refuse their arguments fails; the other still completes.
        out2 = mkdtemp()
        a = knobs(configs=None, lr_grid="1", seeds=1, steps=4, evals=2, warmup=1, servers=None, target_loss=None,
                  tensorboard=False, base_lr=2e-3, max_overrun=1.0, max_cpu=1.0, out=out2)
        a.target_loss = "best"
        configs = {"asp": {"cluster": ["--consistency", "asp"]},
                   "broken": {"cluster": ["--consistency", "asp"], "worker": ["--train.no_such_field=1"]}}
        s = study.run_study(configs, a, "t", "c")
        self.assertEqual(s["configurations"]["asp"]["valid_runs"], 1)
        self.assertEqual(s["configurations"]["broken"]["valid_runs"], 0)
        self.assertEqual(len(s["configurations"]["broken"]["failed"]), 1)
        with open(os.path.join(out2, "report.md")) as f:
            self.assertIn("broken seed 0: exit", f.read())
        # An emulation that cannot hold (1 ms modelled against ~tens of ms of real compute) is
        # reported invalid and kept out of every figure.
        out3 = mkdtemp()
        a3 = knobs(configs=None, lr_grid="1", seeds=1, steps=4, evals=2, warmup=1, servers=None, target_loss=None,
                   tensorboard=False, base_lr=2e-3, max_overrun=0.05, max_cpu=1.0, step_time=0.001, out=out3)
        a3.target_loss = "best"
        s3 = study.run_study({"asp": {"cluster": ["--consistency", "asp"]}}, a3, "t", "c")
        c = s3["configurations"]["asp"]
        self.assertEqual(c["valid_runs"], 0)
        self.assertIn("overran their modelled time", c["invalid"][0]["why"])
        self.assertIsNone(c["final_val_loss"]["mean"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
