"""Advice against hindsight (experiments/hindsight.py, issue 29): the analysis on hand-built
scenarios whose answers are known (the advised pick is the best, is 1.3x the best and resolved
behind it, missed the target; a scenario with a run that did not hold is left out of the overall
figures; fixed policies are scored the same way), misses entering Kendall's tau at their run's end,
Kendall's tau-b itself, how a candidate becomes local_cluster.sh flags, the refusals of the command
line, a run stopped by a signal leaving nothing cached, and check_study accepting a quoted sentence of
hindsight.json and refusing it once the file's data no longer gives it. No cluster is started.
Run: .venv/bin/python tests/test_hindsight.py"""
import contextlib
import copy
import io
import json
import os
import sys
import tempfile
import threading
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import check_study  # noqa: E402
import cluster_runs  # noqa: E402
import hindsight  # noqa: E402
import hindsight_compare  # noqa: E402
from stats import kendall_tau_b  # noqa: E402

END = 100.0  # every run's end (where a missed target counts)


def times(v):
    return {str(i): [t, END] for i, t in enumerate(v)}


def scenario(name, advised, measured, predicted, invalid=None, inside=True, target="3"):
    """A scenario record as scenario_record writes it, at one target; times per candidate, one per seed."""
    s = hindsight.SCENARIOS["fast4"]
    return {"name": name, "scenario": s, "describe": hindsight.describe(s), "validated_inside": inside,
            "invalid_runs": invalid or {}, "failed_runs": {}, "stalls": [],
            "targets": {target: {"advised": advised, "advice_resolved": True,
                                 "measured": {k: times(v) for k, v in measured.items()},
                                 "predicted": {k: times(v) for k, v in predicted.items()}}}}


def doc(*scenarios):
    return hindsight.analyse({"format": hindsight.FORMAT, "command": "test", "targets": ["3"], "steps": 150,
                              "scenarios": list(scenarios)})


class Analysis(unittest.TestCase):
    def test_an_advised_best_is_within_and_its_errors_and_order_are_measured(self):
        sc = scenario("a", "asp", measured={"ring": [10.0, 11.0, 12.0], "asp": [5.0, 5.5, 6.0], "bsp": [8.0, 8.5, 9.0]},
                      predicted={"ring": [12.0, 12.0, 12.0], "asp": [5.5, 5.5, 5.5], "bsp": [7.0, 7.0, 7.0]})
        d = doc(sc)
        c = d["scenarios"][0]["targets"]["3"]
        self.assertEqual(c["best"], "asp")
        self.assertAlmostEqual(c["regret"], 1.0)
        self.assertTrue(c["within"])
        self.assertAlmostEqual(c["relative_error"]["ring"], 12.0 / 11.0 - 1.0)
        self.assertAlmostEqual(c["relative_error"]["asp"], 0.0)
        self.assertAlmostEqual(c["tau"], 1.0)  # the same order both ways
        self.assertIn("it was the best in hindsight", c["sentence"])
        o = d["overall"]["3"]
        self.assertEqual(o["within"], 1)
        self.assertAlmostEqual(o["median_abs_error"], 1.0 / 11.0)  # errors 1/11, 0, 7/8.5 - 1
        # Fixed policies, judged the same way: always asp is within, always the ring is not (11/5.5).
        self.assertEqual(o["policy_within"], {"asp": 1, "bsp": 0, "ring": 0})
        self.assertTrue(any("in 1 (100%" in x and ": met; inside the simulator's validated range 1 of 1, outside it 0 of 0); "
                            "always the ring was in 0, the best fixed policy (asp) in 1" in x for x in d["conclusions"]),
                        d["conclusions"])

    def test_the_report_says_whether_each_advice_was_seed_decided(self):
        def sc(name, st):
            x = scenario(name, "asp", measured={"ring": [10.0, 11.0, 12.0], "asp": [5.0, 5.5, 6.0]},
                         predicted={"ring": [12.0, 12.0, 12.0], "asp": [5.5, 5.5, 5.5]})
            x["hindsight_seeds"] = [100, 101, 102]
            x["calibrated"] = {"nodes": 4, "step_s": 0.1, "link_gbit": 1.0, "ratio": 1.0, "slowdown": 1.0, "jitter": 0.0}
            x["targets"]["3"]["advice_stability"] = st
            return x
        d = doc(sc("held", {"stable": True, "seeds": 5, "seeds_added": 2, "leave_one_out": {}}),
                sc("split", {"stable": False, "seeds": 3, "seeds_added": 0,
                             "leave_one_out": {"0": "asp", "1": "ring", "2": "asp"}}),
                sc("untested", {"stable": None, "seeds": 2, "seeds_added": 0, "leave_one_out": {}}))
        out = tempfile.mkdtemp()
        hindsight.report(d, out)
        with open(os.path.join(out, "report.md")) as f:
            text = f.read()
        self.assertIn("advised asp, best in hindsight asp (advised / best 1.000); the advice held with any one of its "
                      "5 seeds left out, 2 seed(s) added", text)
        self.assertIn("the advice was seed-decided at 3 seeds (without seed 1: ring)", text)
        self.assertIn("the advice was not tested for a seed-decided pick", text)

    def test_an_advised_pick_one_third_slower_and_resolved_behind_is_outside(self):
        sc = scenario("b", "ring", measured={"ring": [13.0, 13.4, 12.9, 13.2], "asp": [10.0, 10.1, 9.9, 10.2]},
                      predicted={"ring": [9.0] * 4, "asp": [10.0] * 4})
        d = doc(sc)
        c = d["scenarios"][0]["targets"]["3"]
        self.assertEqual(c["best"], "asp")
        self.assertAlmostEqual(c["regret"], 13.125 / 10.05)
        self.assertFalse(c["within"])
        self.assertIn("outside 1.10x", c["sentence"])
        self.assertIn("resolved behind it", c["sentence"])
        self.assertIsNone(c["tau"])  # two candidates: no order worth a tau
        self.assertTrue(any("in 0 (0%" in x and "not met" in x for x in d["conclusions"]), d["conclusions"])

    def test_a_miss_counts_against_the_pick_and_enters_the_order_at_its_runs_end(self):
        sc = scenario("c", "diloco50", measured={"diloco50": [None, 20.0, None], "ring": [10.0, 11.0, 10.5],
                                                 "asp": [30.0, 31.0, 29.0]},
                      predicted={"diloco50": [8.0] * 3, "ring": [10.0] * 3, "asp": [None, None, None]})
        c = doc(sc)["scenarios"][0]["targets"]["3"]
        self.assertFalse(c["within"])
        self.assertIsNone(c["regret"])
        self.assertIn("missed the target in 2 of 3 seeds", c["sentence"])
        self.assertNotIn("diloco50", c["relative_error"])  # not reached in every seed: no error figure
        self.assertEqual(c["reached"], {"both": 1, "neither": 0, "disagree": ["asp", "diloco50"]})
        # predicted: diloco50 8 < ring 10 < asp 100 (missed: its end); measured: ring 10.5 < asp 30 < diloco50 73.3
        self.assertAlmostEqual(c["tau"], kendall_tau_b([8.0, 10.0, 100.0], [220.0 / 3, 10.5, 30.0]))

    def test_a_scenario_whose_emulation_did_not_hold_is_left_out(self):
        good = scenario("a", "asp", measured={"ring": [10.0, 11.0], "asp": [5.0, 5.5]},
                        predicted={"ring": [10.0, 10.0], "asp": [5.0, 5.0]})
        bad = scenario("bad", "ring", measured={"ring": [1.0, 1.0], "asp": [50.0, 50.0]},
                       predicted={"ring": [10.0, 10.0], "asp": [5.0, 5.0]}, invalid={"asp": ["101"]}, inside=False)
        d = doc(good, bad)
        self.assertFalse(d["scenarios"][1]["targets"]["3"]["valid"])
        self.assertIn("not evaluated: the emulation did not hold in asp seed 101", d["scenarios"][1]["targets"]["3"]["sentence"])
        o = d["overall"]["3"]
        self.assertEqual((o["evaluated"], o["within"]), (1, 1))
        self.assertAlmostEqual(o["median_abs_error"], 1.0 - 10.0 / 10.5)  # the bad scenario's 9x is not in it
        self.assertEqual((o["within_share_inside"], o["within_share_outside"]), (1.0, None))


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

    def test_the_advisor_runs_its_whole_schedule(self):
        cmd = hindsight.advise_command("p.json", "d", 2.75, hindsight.parse_args([]))
        self.assertIn("--limit", cmd)
        self.assertEqual(cmd[cmd.index("--target-loss") + 1], "2.75")
        self.assertNotIn("--compute-model", cmd)   # the advisor's default
        cmd = hindsight.advise_command("p.json", "d", 3.0, hindsight.parse_args(["--advice-compute-model", "per-node"]))
        self.assertEqual(cmd[cmd.index("--compute-model") + 1], "per-node")

    def test_another_advice_is_kept_apart_from_the_measurements(self):
        a = hindsight.parse_args(["--out", "/m"])
        self.assertEqual(a.advice_out, "/m")  # by default the advice lives with the runs
        a = hindsight.parse_args(["--out", "/m", "--advice-out", "/a", "--advice-seeds", "8"])
        self.assertEqual(hindsight.advise_dir(a.advice_out, "fast4", 3.0), "/a/fast4/advise/t3")
        cmd = hindsight.advise_command("p.json", hindsight.advise_dir(a.advice_out, "fast4", 3.0), 3.0, a)
        self.assertEqual(cmd[cmd.index("--seeds") + 1], "8")
        self.assertEqual(cmd[cmd.index("--out") + 1], "/a/fast4/advise/t3")

    def test_out_written_another_way_finds_the_same_cached_runs(self):
        # A run is cached by its command line, which names its directory: a relative OUT once made every
        # run of a study again (session 25).
        here = os.getcwd()
        with tempfile.TemporaryDirectory() as d:
            os.chdir(d)
            try:
                rel = hindsight.parse_args(["--out", "runs/h", "--advice-out", "./a"])
            finally:
                os.chdir(here)
            ab = hindsight.parse_args(["--out", os.path.join(d, "runs", "h"), "--advice-out", os.path.join(d, "a")])
        self.assertEqual(rel.out, ab.out)
        self.assertEqual(rel.advice_out, ab.advice_out)
        s = hindsight.SCENARIOS["fast4"]
        px = {"servers": 4, "preset": "micro", "batch": 2, "steps": 150, "eval_every": 5, "eval_batches": 32}
        self.assertEqual(hindsight.run_spec(rel.out, "fast4", s, px, "ring", 100)[-1],
                         hindsight.run_spec(ab.out, "fast4", s, px, "ring", 100)[-1])

    def test_the_probe_times_the_runs_servers_unless_told_not_to(self):
        s = hindsight.SCENARIOS["mixed6"]
        cmd = hindsight.probe_command(s, "/o/mixed6/probe_ps")
        i = cmd.index("--servers")
        self.assertEqual(cmd[i:i + 6], ["--servers", str(min(s["nodes"], hindsight.advise.MAX_SERVERS)),
                                        "--consistency", "bsp", "--encrypt", "off"])
        self.assertNotIn("--servers", hindsight.probe_command(s, "/o/mixed6/probe", servers=False))
        self.assertEqual(hindsight.probe_dir("/o", "mixed6"), "/o/mixed6/probe_ps")
        self.assertEqual(hindsight.probe_dir("/o", "mixed6", False), "/o/mixed6/probe")
        self.assertFalse(hindsight.parse_args(["--no-probe-servers"]).probe_servers)

    def test_a_held_out_scenario_probes_and_runs_its_own_shard_count(self):
        """shard2_8 has 2 shards for 8 nodes: its probe starts 2 (the advisor takes K from the probe,
        and the runs take the advice's K); without servers in the probe the advisor is told K; the
        default scenario list stays the published seven."""
        s = hindsight.SCENARIOS["shard2_8"]
        cmd = hindsight.probe_command(s, "/o/shard2_8/probe_ps")
        self.assertEqual(cmd[cmd.index("--servers") + 1], "2")
        self.assertIn("2 shard(s)", hindsight.describe(s))
        self.assertNotIn("shard", hindsight.describe(hindsight.SCENARIOS["mixed6"]))
        self.assertEqual(hindsight.parse_args([]).scenarios.split(","), hindsight.PUBLISHED)
        self.assertEqual(len(hindsight.PUBLISHED), 7)
        self.assertFalse(set(hindsight.HELD_OUT) & set(hindsight.PUBLISHED))
        self.assertNotIn("--servers", hindsight.advise_command("p.json", "d", 3.0, hindsight.parse_args([])))
        cmd = hindsight.advise_command("p.json", "d", 3.0, hindsight.parse_args([]), shards=2)
        self.assertEqual(cmd[cmd.index("--servers") + 1], "2")
        _, job = hindsight.measured_setup(s, {"servers": 2, "preset": "micro", "batch": 2, "steps": 150,
                                              "eval_every": 5, "eval_batches": 32})
        self.assertEqual(job["servers"], 2)
        # The ablation: the advisor on one shard per node, judged only against runs already made.
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            hindsight.parse_args(["--advisor-servers", "one-per-node"])
        a = hindsight.parse_args(["--advisor-servers", "one-per-node", "--measured-from", "r.json"])
        self.assertEqual(a.advisor_servers, "one-per-node")
        cmd = hindsight.advise_command("p.json", "d", 3.0, hindsight.parse_args(["--no-exchange-calibration"]))
        self.assertIn("--no-exchange-calibration", cmd)
        self.assertNotIn("--no-exchange-calibration", hindsight.advise_command("p.json", "d", 3.0,
                                                                               hindsight.parse_args([])))
        # Where the shards run: the advisor's own reading of the probe unless forced.
        self.assertNotIn("--server-placement", hindsight.advise_command("p.json", "d", 3.0, hindsight.parse_args([])))
        for forced in ("dedicated", "nodes"):
            cmd = hindsight.advise_command("p.json", "d", 3.0, hindsight.parse_args(["--server-placement", forced]))
            self.assertEqual(cmd[cmd.index("--server-placement") + 1], forced)

    def test_a_scenarios_link_bucket_reaches_its_probe_and_its_runs(self):
        """burst_ms (session 43's clusters): --link-burst-ms on the probe's and every run's command line (so
        a cached run or probe of another bucket is not taken back), named in the description; a scenario
        without it leaves netns.sh's default (the published records' commands unchanged)."""
        px = {"servers": 3, "preset": "micro", "batch": 2, "steps": 150, "eval_every": 5, "eval_batches": 32}
        s = hindsight.SCENARIOS["b1_ring5"]
        cmd = hindsight.probe_command(s, "/o/b1_ring5/probe_ps")
        self.assertEqual(cmd[cmd.index("--link-burst-ms") + 1], "1")
        self.assertLess(cmd.index("--link-burst-ms"), cmd.index("--"))
        for name in ("ring", "asp_lr_scale", "diloco10"):
            line = hindsight.run_spec("/o", "b1_ring5", s, px, name, 400)[-1].split()
            self.assertEqual(line[line.index("--link-burst-ms") + 1], "1", name)
        self.assertIn("a 1 ms link bucket", hindsight.describe(s))
        old = hindsight.SCENARIOS["spread6_2"]
        self.assertNotIn("--link-burst-ms", hindsight.probe_command(old, "/o/spread6_2/probe_ps"))
        self.assertNotIn("--link-burst-ms", hindsight.run_spec("/o", "spread6_2", old, px, "ring", 300)[-1])
        self.assertNotIn("bucket", hindsight.describe(old))
        self.assertTrue(all(v.get("burst_ms") == 1.0 for v in hindsight.HELD_OUT_43.values()))
        # session 44's set: faithful links, the shards placed from the probe, the straggler inside the advisor's range
        self.assertEqual(sorted(hindsight.HELD_OUT_44), ["i_flat8", "i_slow7", "i_strag7"])
        for name, v in hindsight.HELD_OUT_44.items():
            self.assertEqual(v.get("burst_ms"), 1.0, name)
            self.assertIs(hindsight.SCENARIOS[name], v, name)
            self.assertLess(v["servers"], v["nodes"], name)
            self.assertLessEqual(v["slowdown"], 3.0, name)
            self.assertTrue(v["probed_placement"] and v["spread_rounds"], name)

        # session 47's: the same kind, every cluster new
        self.assertEqual(sorted(hindsight.HELD_OUT_47), ["h_slow5s", "h_slow6", "h_slow8l"])
        for name, v in hindsight.HELD_OUT_47.items():
            self.assertEqual(v.get("burst_ms"), 1.0, name)
            self.assertLess(v["servers"], v["nodes"], name)
            self.assertTrue(v["probed_placement"] and v["spread_rounds"], name)
            self.assertFalse([k for k, w in hindsight.SCENARIOS.items() if k != name and w == v], name)

        # session 48's: one mild straggler each, below the default's straggler threshold
        self.assertEqual(sorted(hindsight.HELD_OUT_48), ["m_mild5l", "m_mild7", "m_mild8"])
        for name, v in hindsight.HELD_OUT_48.items():
            self.assertEqual(v.get("burst_ms"), 1.0, name)
            self.assertLess(v["servers"], v["nodes"], name)
            self.assertTrue(1.1 <= v["slowdown"] < hindsight.advise.STRAGGLER_AT, name)
            self.assertFalse([k for k, w in hindsight.SCENARIOS.items() if k != name and w == v], name)

    def test_the_same_seed_runs_give_each_candidate_the_advices_share(self):
        """The same-seed simulations rebuild the advised cluster with the probe's exchanges, so an
        asynchronous candidate takes the spread rounds' share where the advice had one (it crashed on
        the missing key), and BSP's in an advice from before the spread rounds."""
        for given, ssp in (("async", "ps_spread"), ("asp", "ps")):
            spread = {"cluster": {"nodes": 4, "exchanges": {"ring": None, "ps": {"round_s": 1.0},
                                                             "ps_spread": {"round_s": 0.5, "for": given}}}}
            cl = hindsight.advised_cluster(spread)
            self.assertEqual([hindsight.advise.exchange_pattern(x, cl) for x in ("asp_lr_scale", "ssp4", "bsp_backup", "ring")],
                             ["ps_spread", ssp, "ps", "ring"])
        for old in ({"cluster": {"nodes": 4}}, {"cluster": {"nodes": 4, "exchanges": {"ring": None, "ps": None}}}):
            self.assertEqual(hindsight.advise.exchange_pattern("asp_lr_scale", hindsight.advised_cluster(old)), "ps")

    def test_an_advice_of_another_cluster_than_the_runs_stops_the_study(self):
        """The guard between the advice and the runs: the shard count, and (placement left to the probe)
        shards the probe found on no node although the runs start them on nodes."""
        s = hindsight.SCENARIOS["shard2_4"]
        a = hindsight.parse_args([])
        on_nodes = {"placement": "nodes", "shard_nodes": [0, 1], "why": "every shard runs at a node's address"}
        adv = {"proxy": {"servers": 2, "server_placement": "nodes", "placement_from": "probe"},
               "cluster": {"placement": on_nodes}}
        self.assertIsNone(hindsight.advice_mismatch(s, adv, a))
        adv["proxy"]["servers"] = 4  # e.g. a probe whose round trips missed a node
        self.assertIn("models 4 shard(s), the scenario's runs use 2", hindsight.advice_mismatch(s, adv, a))
        adv["proxy"].update(servers=2, server_placement="dedicated")
        adv["cluster"]["placement"] = {"placement": None, "shard_nodes": [None, None],
                                       "why": "the probe recorded no address for node(s) 3"}
        self.assertIn("the scenario's runs start them on nodes 0..1 (the probe: the probe recorded no address for "
                      "node(s) 3)", hindsight.advice_mismatch(s, adv, a))
        # Forced, or a probe from before addresses were recorded (its records took dedicated hosts): no stop.
        self.assertIsNone(hindsight.advice_mismatch(s, adv, hindsight.parse_args(["--server-placement", "dedicated"])))
        adv["cluster"]["placement"] = {"placement": None, "shard_nodes": [], "why": "no shard addresses"}
        self.assertIsNone(hindsight.advice_mismatch(s, adv, a))
        del adv["cluster"]["placement"]
        self.assertIsNone(hindsight.advice_mismatch(s, adv, a))
        # A scenario declared with probed_placement (session 41) must have the probe's nodes 0..K-1.
        s41 = hindsight.SCENARIOS["shard4_7"]
        adv = {"proxy": {"servers": 4, "server_placement": "dedicated", "placement_from": "default"},
               "cluster": {"placement": {"placement": None, "shard_nodes": [], "why": "no shard addresses"}}}
        self.assertIn("start them on nodes 0..3", hindsight.advice_mismatch(s41, adv, a))
        adv["proxy"].update(server_placement="nodes", placement_from="probe")
        adv["cluster"]["placement"] = {"placement": "nodes", "shard_nodes": [3, 4, 5, 6], "why": "every shard ..."}
        self.assertIn("start them on nodes 0..3", hindsight.advice_mismatch(s41, adv, a))
        adv["cluster"]["placement"]["shard_nodes"] = [0, 1, 2, 3]
        self.assertIsNone(hindsight.advice_mismatch(s41, adv, a))
        # --spread-calibration asp (session 42's held-out test): the advice must give the spread rounds to ASP.
        asp = hindsight.parse_args(["--spread-calibration", "asp"])
        self.assertIn("does not give the probe's spread rounds to ASP and asynchronous local SGD",
                      hindsight.advice_mismatch(s41, adv, asp))
        adv["cluster"]["exchanges"] = {"ps_spread": {"round_s": 0.1, "for": "asp"}}
        self.assertIsNone(hindsight.advice_mismatch(s41, adv, asp))
        self.assertIn("spread rounds", hindsight.advice_mismatch(s41, adv, hindsight.parse_args(["--spread-calibration",
                                                                                                  "async"])))
        self.assertIsNone(hindsight.advice_mismatch(s41, adv, a))  # the default asks nothing of them
        # A session-42 held-out cluster (spread_rounds): every arm's probe must have timed them, so that no
        # arm's runs are spent on a probe the other arm cannot use.
        s42 = dict(hindsight.SCENARIOS["spread6_3"], servers=4)
        probe = os.path.join(tempfile.mkdtemp(), "probe.json")
        adv["probe"] = probe
        for section, ok in (({"skipped": "nodes share the address 127.0.0.1 (one host)"}, False),
                            ({"nodes": [{"node": 0}]}, True)):
            with open(probe, "w") as f:
                json.dump({"ps_spread": section}, f)
            got = hindsight.advice_mismatch(s42, adv, a)
            self.assertIsNone(got) if ok else self.assertIn("did not time the spread rounds (nodes share", got)

    def test_configs_reach_the_advisor_and_name_the_candidates(self):
        a = hindsight.parse_args(["--configs", "asp_lr_scale", "--spread-calibration", "asp"])
        cmd = hindsight.advise_command("p.json", "d", 3.0, a)
        self.assertEqual(cmd[cmd.index("--configs") + 1], "asp_lr_scale")
        self.assertEqual(cmd[cmd.index("--spread-calibration") + 1], "asp")
        self.assertEqual(hindsight.candidate_names(a), ["ring", "asp_lr_scale"])
        plain = hindsight.parse_args([])
        self.assertNotIn("--configs", hindsight.advise_command("p.json", "d", 3.0, plain))
        self.assertNotIn("--spread-calibration", hindsight.advise_command("p.json", "d", 3.0, plain))
        self.assertEqual(hindsight.candidate_names(plain), list(hindsight.advise.CANDIDATES))
        self.assertNotIn("--stability-seeds", hindsight.advise_command("p.json", "d", 3.0, plain))
        st = hindsight.advise_command("p.json", "d", 3.0, hindsight.parse_args(["--advice-stability-seeds", "3"]))
        self.assertEqual(st[st.index("--stability-seeds") + 1], "3")
        self.assertEqual(hindsight.parse_args(["--no-spread-calibration"]).spread_calibration, "none")

    def test_measurements_taken_from_an_earlier_record_must_match_its_runs(self):
        names = ["ring", "bsp_backup"]
        meas = {"3": {"ring": {"100": [5.0, 9.0], "101": [6.0, 9.5]}, "bsp_backup": {"100": [4.0, 8.0], "101": [None, 8.5]}},
                "2.75": {"ring": {"100": [7.0, 9.0], "101": [8.0, 9.5]}, "bsp_backup": {"100": [None, 8.0], "101": [None, 8.5]}}}
        rec = {"format": hindsight.FORMAT, "steps": 150, "targets": ["3", "2.75"],
               "scenarios": [{"name": "fast4", "scenario": hindsight.SCENARIOS["fast4"], "hindsight_seeds": [100, 101],
                              "invalid_runs": {"ring": ["101"]}, "failed_runs": {}, "stalls": ["x"],
                              "targets": {t: {"measured": m} for t, m in meas.items()}}]}
        px = {"preset": "micro", "batch": 2, "steps": 150, "servers": 4, "eval_every": 5, "eval_batches": 32}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "hindsight.json")

            def write(r):
                with open(path, "w") as f:
                    json.dump(r, f)
            write(rec)
            a = hindsight.parse_args(["--seeds", "2", "--measured-from", path, "--targets", "3,2.75"])
            with self.assertRaises(SystemExit) as e:   # no published advice beside it: its job is unknown
                hindsight.measured_record(path, "fast4", a, names, px)
            self.assertIn("cannot read the record's advice", str(e.exception))
            os.makedirs(os.path.join(d, "fast4"))
            with open(os.path.join(d, "fast4", "advice_t3.json"), "w") as f:
                json.dump({"proxy": px}, f)
            got = hindsight.measured_record(path, "fast4", a, names, px)
            self.assertEqual(got["targets"]["2.75"]["measured"], meas["2.75"])
            self.assertEqual(got["invalid_runs"], {"ring": ["101"]})   # an invalid run stays invalid
            for argv, names_, job, words in (
                    (["--seeds", "3"], names, px, "seeds [100, 101] (here [100, 101, 102])"),
                    (["--seeds", "2"], names, dict(px, steps=100), "steps 150 (here 100)"),
                    (["--seeds", "2", "--targets", "2.5"], names, px, "targets"),
                    (["--seeds", "2"], ["ring"], px, "candidates ['bsp_backup', 'ring'] (here ['ring'])"),
                    (["--seeds", "2"], names, dict(px, servers=2), "servers 4 (here 2)"),
                    (["--seeds", "2"], names, dict(px, batch=4), "batch 2 (here 4)")):
                with self.assertRaises(SystemExit) as e:
                    hindsight.measured_record(path, "fast4", hindsight.parse_args(argv), names_, job)
                self.assertIn(words, str(e.exception))
            with self.assertRaises(SystemExit) as e:
                hindsight.measured_record(path, "wan8", a, names, px)
            self.assertIn("has no scenario wan8", str(e.exception))
            write(dict(rec, scenarios=[dict(rec["scenarios"][0], scenario=dict(hindsight.SCENARIOS["fast4"], link_gbit=2.0))]))
            with self.assertRaises(SystemExit) as e:   # the scenario itself changed since
                hindsight.measured_record(path, "fast4", a, names, px)
            self.assertIn("a scenario", str(e.exception))

    def test_measurements_from_a_record_take_its_probe_and_never_probe_again(self):
        s = hindsight.SCENARIOS["fast4"]
        with tempfile.TemporaryDirectory() as d:
            rec_dir, out = os.path.join(d, "published"), os.path.join(d, "out")
            os.makedirs(os.path.join(rec_dir, "fast4"))
            record = os.path.join(rec_dir, "hindsight.json")
            a = hindsight.parse_args(["--measured-from", record, "--out", out])
            started = []
            orig = hindsight._logged
            hindsight._logged = lambda cmd, log: started.append(cmd) or 1
            try:
                with self.assertRaises(SystemExit) as e:   # neither the record nor OUT holds a probe of it
                    hindsight.record_probe("fast4", s, a)
                self.assertIn("no probe of fast4 beside the record", str(e.exception))
                beside = os.path.join(rec_dir, "fast4", "probe.json")
                with open(beside, "w") as f:
                    f.write("{}")
                self.assertEqual(hindsight.record_probe("fast4", s, a), beside)
                # OUT's own probe of the scenario's current command is taken before the record's
                pd = hindsight.probe_dir(a.out, "fast4", a.probe_servers)
                os.makedirs(pd)
                with open(os.path.join(pd, "probe.json"), "w") as f:
                    f.write("{}")
                with open(os.path.join(pd, "command.txt"), "w") as f:
                    f.write("an older probe command\n")
                self.assertEqual(hindsight.record_probe("fast4", s, a), beside)   # made by another command: not it
                with open(os.path.join(pd, "command.txt"), "w") as f:
                    f.write(" ".join(hindsight.probe_command(s, pd, a.probe_servers)) + "\n")
                self.assertEqual(hindsight.record_probe("fast4", s, a), os.path.join(pd, "probe.json"))
            finally:
                hindsight._logged = orig
            self.assertEqual(started, [])   # no probe was started on the way

    def test_refusals_name_the_problem(self):
        for argv, words in ((["--scenarios", "nope"], "unknown scenario"), (["--first-seed", "1"], "overlaps"),
                            (["--seeds", "1"], "2 or more"), (["--targets", "3,x"], "comma-separated"),
                            (["--targets", "3,3"], "distinct"),
                            (["--first-seed", "5", "--advice-stability-seeds", "3"], "overlaps the advisor's seeds 0..5"),
                            (["--advice-stability-seeds", "-1"], "0 or more")):
            err = io.StringIO()
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(err):
                hindsight.parse_args(argv)
            self.assertIn(words, err.getvalue())


class Compare(unittest.TestCase):
    @staticmethod
    def record(advised, same, measured=None):
        cell = {"advised": advised, "best": "ring", "within": True, "valid": True,
                "measured": measured or {"ring": {"100": [1.0, 2.0]}},
                "same_seed_error": same, "relative_error": {k: 2 * v for k, v in same.items()}}
        return {"format": "syncopate-hindsight/1", "scenarios": [{"name": "s", "targets": {"3": cell}}]}

    def test_two_advice_records_side_by_side_on_the_same_pairs(self):
        a = self.record("ring", {"ring": 0.10, "bsp_backup": -0.20})
        b = self.record("bsp_backup", {"ring": 0.05, "bsp_backup": -0.30, "ssp4": 0.9})  # ssp4: only in B
        r = hindsight_compare.compare(a, b)["3"]
        self.assertEqual(r["rows"][0]["advised"], ("ring", "bsp_backup"))
        self.assertEqual(set(r["rows"][0]["errors"]), {"ring", "bsp_backup"})
        for got, want in zip(r["same_seed"], (0.15, 0.175, 2)):
            self.assertAlmostEqual(got, want)
        self.assertAlmostEqual(r["predicted"][0], 0.30)
        only = hindsight_compare.compare(a, b, {"bsp_backup"})["3"]
        for got, want in zip(only["same_seed"], (0.20, 0.30, 1)):
            self.assertAlmostEqual(got, want)
        # Paired: |B| - |A| per pair (ring -0.05, bsp_backup +0.10): median +0.025, smaller in B in 1 of 2.
        for got, want in zip(r["same_seed_paired"], (0.025, 1, 2)):
            self.assertAlmostEqual(got, want)
        self.assertEqual(only["same_seed_paired"][1:], (0, 1))

    def test_a_changed_pick_is_marked_robust_or_marginal_on_the_measured_runs(self):
        near = {"ring": {"100": [10.0, 30.0], "101": [11.0, 30.0], "102": [12.0, 30.0]},
                "bsp_backup": {"100": [10.5, 30.0], "101": [11.2, 30.0], "102": [12.1, 30.0]},
                "diloco50": {"100": [14.0, 30.0], "101": [15.0, 30.0], "102": [16.0, 30.0]}}
        a, b, c = (self.record(k, {}, measured=near) for k in ("ring", "bsp_backup", "diloco50"))
        for rec, regret in ((a, 1.0), (b, 1.0133), (c, 1.3636)):
            rec["scenarios"][0]["targets"]["3"]["regret"] = regret
        r = hindsight_compare.compare(a, b)["3"]["rows"][0]
        self.assertFalse(r["change"]["robust"])              # 1.01x apart, not resolved
        self.assertAlmostEqual(r["change"]["ratio"], 33.8 / 33.0)
        r = hindsight_compare.compare(a, c)["3"]
        self.assertTrue(r["rows"][0]["change"]["robust"])    # 1.36x apart
        self.assertEqual(r["regret_sum"][2], 1)
        self.assertAlmostEqual(r["regret_sum"][1], 1.3636)
        self.assertIsNone(hindsight_compare.compare(a, a)["3"]["rows"][0]["change"])
        rc = hindsight_compare.main  # the printed line names the change
        import contextlib
        import io
        d = tempfile.mkdtemp()
        for name, rec in (("a", a), ("c", c)):
            with open(os.path.join(d, name + ".json"), "w") as f:
                json.dump(rec, f)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            self.assertEqual(rc([os.path.join(d, "a.json"), os.path.join(d, "c.json")]), 0)
        self.assertIn("advised ring (1.000x) -> diloco50 (1.364x) (best ring); a robust change (1.364x apart", buf.getvalue())

    def test_records_of_other_measurements_are_refused(self):
        a = self.record("ring", {"ring": 0.1})
        b = self.record("ring", {"ring": 0.1}, measured={"ring": {"100": [1.5, 2.0]}})
        with self.assertRaises(SystemExit) as e:
            hindsight_compare.compare(a, b)
        self.assertIn("measured differently", str(e.exception))


class Stopping(unittest.TestCase):
    def test_a_stopped_lane_ends_its_process_group_and_caches_nothing(self):
        # A lane runs a process group that ignores nothing and cleans up on TERM; Ctrl-C in the main
        # thread (here: terminate_running from it, as run_lanes does) ends it through its own trap.
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "cleaned")
            started = threading.Event()

            def job():
                started.set()
                cluster_runs.run_group(["bash", "-c", f"trap 'touch {marker}; exit 143' TERM; sleep 30 & wait"], None)
            hindsight.STOP.clear()
            t0 = time.time()
            th = threading.Thread(target=hindsight.run_lanes, args=([job, job], 1))
            th.start()
            started.wait(5)
            time.sleep(0.3)
            hindsight.STOP.set()
            cluster_runs.terminate_running()
            th.join(10)
            self.assertFalse(th.is_alive())
            self.assertTrue(os.path.exists(marker), "the group's TERM trap did not run")
            self.assertLess(time.time() - t0, 10)
            hindsight.STOP.clear()


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
            stale["scenarios"][0]["targets"]["3"]["measured"]["asp"]["0"][0] = 9.0  # the data moved, the sentence did not
            with open(os.path.join(root, "docs", "hindsight.json"), "w") as f:
                json.dump(stale, f)
            problems, _, _ = check_study.check(study, root)
            self.assertEqual(len(problems), 1, problems)
            self.assertIn("stale", problems[0])


if __name__ == "__main__":
    unittest.main()
