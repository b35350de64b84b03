"""The advisor (experiments/advise.py, issue 29): the calibration of a probe by its rules, bad probes
refused by the field's name, an incomplete probe warned about, and the advice end to end on
synthetic probes whose answer is known, with the real simulator (4 nodes, 2 seeds, 100 steps,
target 3.0): a fast homogeneous cluster gets a synchronous mode, a 3x straggler never the ring, a
100x slower link local SGD / DiLoCo; advice.json and advice.toml are well formed and the
binaries take their flags. Run: .venv/bin/python tests/test_advise.py"""
import contextlib
import copy
import io
import json
import statistics
import os
import subprocess
import sys
import tempfile
import time
import tomllib
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import advise  # noqa: E402
import crossover  # noqa: E402

PY = sys.executable
BIN = os.environ.get("SYNCOPATE_BIN") or os.path.join(ROOT, "build", "bin")
_SCRATCH = tempfile.TemporaryDirectory(prefix="syncopate-advise-test-")
os.environ["SYNCOPATE_STUDY_COST"] = os.path.join(_SCRATCH.name, "study_cost.json")  # nothing read from runs/


def mkdtemp():
    return tempfile.mkdtemp(dir=_SCRATCH.name)


def make_probe(n=4, T=0.3, params=454_144, wire=4, ratio=0.1, slow=None, jitter=0.02, rtt_us=100.0):
    """A syncopate-probe/1 file's content: n nodes with fastest step T (node slow[0] slow[1] x slower),
    mean step min x (1 + jitter), every ring link at the rate that gives `ratio`."""
    link = 2 * params * wire * 8 / (ratio * T) / 1e9
    now = time.time()
    nodes = []
    for i in range(n):
        lo = T * (slow[1] if slow and i == slow[0] else 1.0)
        mean = lo * (1 + jitter)
        nodes.append({"node": i, "host": f"h{i}", "measured_unix_s": now,
                      "step_s": {"samples": [lo, mean], "min": lo, "median": mean, "mean": mean, "p10": lo,
                                 "p90": mean * 1.1, "max": mean * 1.2},
                      "memory": {"host_available_bytes": 1e10, "rss_peak_bytes": 1e8, "device_free_bytes": 0,
                                 "device_total_bytes": 0}})
    links = [{"from": i, "to": (i + 1) % n, "rtt_us": {"min": rtt_us * 0.8, "median": rtt_us, "p90": rtt_us * 1.2},
              "goodput_gbit": link, "bytes": 67108864, "seconds": 67108864 * 8 / link / 1e9, "measured_unix_s": now}
             for i in range(n)] if n > 1 else []
    return {"format": "syncopate-probe/1", "created_unix_s": now, "complete": True, "missing": [],
            "job": {"nodes": n, "params": params, "preset": "tiny", "batch_size": 8, "grad_accum": 1, "block_size": 64,
                    "local_replicas": 1, "tokens_per_node_step": 512, "precision": "fp32", "device": "cpu",
                    "wire_bytes": wire, "emulated_step_s": 0.0},
            "nodes": nodes, "links": links}


def write_probe(p, name="probe.json"):
    path = os.path.join(mkdtemp(), name)
    with open(path, "w") as f:
        json.dump(p, f) if not isinstance(p, str) else f.write(p)
    return path


def main_in_process(args):
    """advise.main(args) -> (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = advise.main(args)
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


class Calibration(unittest.TestCase):
    def test_numbers_exactly_as_the_rules(self):
        p = make_probe(n=5)
        mins = [0.30, 0.31, 0.29, 0.30, 0.90]      # median 0.30; node 4 at 3x, node 1 at 1.033x (not a straggler)
        extra = [0.10, 0.20, 0.05, 0.10, 0.30]     # mean / min - 1: median 0.10
        rates = [0.9, 0.5, 1.2, 0.8, 1.0]          # the slowest link: 0.5 Gbit/s
        rtts = [80.0, 100.0, 120.0, 90.0, 110.0]   # median 100 us: 50 us one way
        for nd, lo, x in zip(p["nodes"], mins, extra):
            nd["step_s"].update(min=lo, mean=lo * (1 + x))
        for ln, b, r in zip(p["links"], rates, rtts):
            ln["goodput_gbit"], ln["rtt_us"]["median"] = b, r
        p["job"]["wire_bytes"] = 2
        cl = advise.calibrate(p)
        self.assertEqual(cl["nodes"], 5)
        self.assertAlmostEqual(cl["step_s"], 0.30)
        self.assertEqual(cl["slow_workers"], [4])
        self.assertAlmostEqual(cl["slowdown"], 3.0)
        self.assertAlmostEqual(cl["node_slowdowns"]["1"], 0.31 / 0.30)
        self.assertAlmostEqual(cl["jitter"], 0.10)
        self.assertAlmostEqual(cl["link_gbit"], 0.5)
        self.assertAlmostEqual(cl["latency_ms"], 0.050)
        r = 2 * 454_144 * 2 * 8 / 0.5e9 / 0.30
        self.assertAlmostEqual(cl["ratio"], r)
        a = advise.parse_args(["x.json", "--seeds", "2", "--steps", "100"])
        px = advise.proxy(cl, a)
        # The proxy keeps r with the micro model's float32 bytes at a modelled 0.1 s step.
        self.assertAlmostEqual(px["link_gbit"], crossover.link_gbit(r))
        self.assertAlmostEqual(2 * crossover.PARAMS * 4 * 8 / (px["link_gbit"] * 1e9) / 0.1, r)
        self.assertAlmostEqual(px["latency_us"], 50.0 * 0.1 / 0.30)
        self.assertEqual((px["servers"], px["slow_workers"]), (5, [4]))
        self.assertAlmostEqual(px["server_link_gbit"] * px["servers"], px["link_gbit"] * 5)
        self.assertAlmostEqual(px["time_scale"], 3.0)
        # The simulator's command carries the calibration.
        cmd = advise.sim_command("bsp_backup", 1, px, cl, "/tmp/x", 7.5)
        for flag in ["--sim.workers=5", "--sim.servers=5", "--sim.slow_workers=4", "--emulate.slowdown=3",
                     "--emulate.jitter=0.1", f"--sim.latency_us={50 / 3:.6g}", "--sim.time_limit_s=7.5",
                     "--train.seed=1", "--ps.backup_workers=1", "--model.preset=micro"]:
            self.assertIn(flag, cmd)
        self.assertEqual(cl["assumptions"], [])  # a complete, regular probe assumes nothing beyond the rules
        self.assertIn(f"--sim.server_link_gbit={px['server_link_gbit']:.6g}", cmd)
        self.assertNotIn("--sim.colocate_servers=true", cmd)
        # Servers on the nodes (--server-placement nodes): they share the nodes' links, none of their own.
        on = advise.proxy(cl, advise.parse_args(["x.json", "--server-placement", "nodes"]))
        cmd = advise.sim_command("bsp_backup", 1, on, cl, "/tmp/x", 7.5)
        self.assertIn("--sim.colocate_servers=true", cmd)
        self.assertFalse([f for f in cmd if f.startswith("--sim.server_link_gbit")])
        self.assertIn("sharing their links", " ".join(advise.describe(cl, on)))

    def test_stragglers_take_the_largest_factor_and_the_highest_proxy_ranks(self):
        p = make_probe(n=8)
        for i, f in [(1, 2.0), (5, 4.0)]:
            p["nodes"][i]["step_s"].update(min=0.3 * f, mean=0.3 * f * 1.02)
        cl = advise.calibrate(p)
        self.assertEqual((cl["slow_workers"], cl["slowdown"]), ([1, 5], 4.0))
        self.assertTrue(any("the largest (4.00x)" in x for x in cl["assumptions"]), cl["assumptions"])
        px = advise.proxy(cl, advise.parse_args(["x.json"]))
        self.assertEqual(px["slow_workers"], [6, 7])  # worker 0 evaluates: the stragglers go last

    def test_per_node_models_every_node_as_measured_and_pools_the_jitter(self):
        # --compute-model per-node: a 1.4x node (below the straggler threshold) keeps its factor, and the
        # jitter is the pooled (mean - min) / min x n / (n - 1) over every node's samples.
        p = make_probe(n=4)
        mins, extra, n = [0.30, 0.31, 0.42, 0.30], [0.20, 0.30, 0.25, 0.10], [20, 20, 20, 10]
        for nd, lo, x, k in zip(p["nodes"], mins, extra, n):
            nd["step_s"].update(min=lo, mean=lo * (1 + x), samples=[lo] * k)
        legacy = advise.calibrate(p)
        self.assertEqual((legacy["slow_workers"], legacy["slowdown"]), ([], 1.0))
        self.assertTrue(any("below the straggler threshold" in x for x in legacy["assumptions"]))
        self.assertAlmostEqual(legacy["jitter"], statistics.median(extra))
        cl = advise.calibrate(p, compute_model="per-node")
        pooled = sum(x * k / (k - 1) * k for x, k in zip(extra, n)) / sum(n)
        self.assertAlmostEqual(cl["jitter"], pooled)
        self.assertAlmostEqual(cl["slowdown"], 0.42 / 0.305)  # T = median(0.30, 0.30, 0.31, 0.42)
        px = advise.proxy(cl, advise.parse_args(["x.json", "--compute-model", "per-node"]))
        self.assertEqual(px["slow_workers"], [])
        want = [m / 0.305 for m in mins]  # node r on worker r: the same-seed jitter draws, worker 0 evaluates
        for got, w in zip(px["worker_slowdowns"], want):
            self.assertAlmostEqual(got, w)
        cmd = advise.sim_command("ring", 0, px, cl, "/tmp/x", 0.0)
        self.assertIn("--sim.worker_slowdowns=" + ",".join(f"{x:.4g}" for x in want), cmd)
        self.assertFalse([f for f in cmd if f.startswith(("--sim.slow_workers", "--emulate.slowdown"))])
        self.assertIn(f"--emulate.jitter={pooled:.6g}", cmd)
        self.assertIn("each as measured", " ".join(advise.describe(cl, px)))
        self.assertTrue(any("node r on the proxy's worker r" in x for x in advise.assumptions(cl, px, ["ring"])))
        # The ablation: the factors per node, the median's jitter.
        fac = advise.calibrate(p, compute_model="per-node-factors")
        self.assertAlmostEqual(fac["jitter"], legacy["jitter"])
        self.assertEqual(advise.proxy(fac, advise.parse_args(["x.json"]))["worker_slowdowns"], px["worker_slowdowns"])
        # A node far noisier than the pooled jitter is said to be modelled short.
        q = copy.deepcopy(p)
        q["nodes"][3]["step_s"].update(mean=0.30 * 2.0)
        self.assertTrue(any("3 standard errors" in x and "3 (1)" in x
                            for x in advise.calibrate(q, compute_model="per-node")["assumptions"]))
        # An incomplete probe: the unmeasured node steps at the base (the simulator wants every worker's factor).
        r = copy.deepcopy(p)
        del r["nodes"][2]
        r["complete"], r["missing"] = False, [{"node": 2, "why": "unreachable"}]
        inc = advise.calibrate(r, compute_model="per-node")
        self.assertEqual(inc["nodes"], 4)
        self.assertEqual(len(advise.proxy(inc, advise.parse_args(["x.json"]))["worker_slowdowns"]), 4)
        self.assertEqual(advise.proxy(inc, advise.parse_args(["x.json"]))["worker_slowdowns"][2], 1.0)
        # The simulator takes the command (syncopate-sim validates the list against the workers).
        d = mkdtemp()
        run = subprocess.run([*advise.sim_command("ring", 0, dict(px, steps=5, target_loss=0.0), cl, d, 0.0)],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(run.returncode, 0, run.stderr[-2000:])
        with open(os.path.join(d, "node3", "metrics.jsonl")) as f:
            m = [json.loads(x) for x in f if '"modelled_s"' in x]
        self.assertTrue(all(r["modelled_s"] >= 0.1 * want[3] for r in m), m[:2])

    def test_bytes_per_step_and_flags(self):
        cl = advise.calibrate(make_probe(n=4, wire=2))
        P = 454_144
        self.assertAlmostEqual(advise.bytes_per_step("ring", cl), 2 * 3 / 4 * P * 2)
        self.assertAlmostEqual(advise.bytes_per_step("bsp_backup", cl), P * 2)
        self.assertAlmostEqual(advise.bytes_per_step("diloco10", cl), 2 * 3 / 4 * P * 2 / 10)
        self.assertAlmostEqual(advise.bytes_per_step("diloco50", cl), 2 * 3 / 4 * P * 2 / 50)
        self.assertAlmostEqual(advise.bytes_per_step("async_local_sgd", cl), P * 2 / 10)
        self.assertEqual(advise.worker_flags("ring", 4), ["--dist.mode=ring"])
        self.assertEqual(advise.server_flags("bsp_backup", 16), ["--ps.consistency=bsp", "--ps.backup_workers=2"])
        self.assertEqual(advise.worker_flags("async_local_sgd", 4),
                         ["--dist.mode=ps", "--dist.sync_every=10", "--dist.outer=delayed_nesterov"])
        for name in advise.CANDIDATES:
            self.assertFalse(any(f.startswith("--optim.") for f in advise.worker_flags(name, 4)))

    def test_validated_range(self):
        inside = advise.validation(advise.calibrate(make_probe(n=4, ratio=1.0, slow=(3, 3.0), jitter=0.2)), ["ring"])
        self.assertTrue(inside["inside"], inside["notes"])
        few = advise.validation(advise.calibrate(make_probe(n=4, ratio=1.0)), ["ring", "bsp_backup"], servers=2)
        self.assertFalse(few["inside"])
        self.assertTrue(any("K = 2 shard(s) for 4 nodes" in x for x in few["notes"]), few["notes"])
        self.assertTrue(advise.validation(advise.calibrate(make_probe(n=4, ratio=1.0)), ["ring"], servers=2)["inside"])
        self.assertTrue(advise.validation(advise.calibrate(make_probe(n=4, ratio=1.0)), ["bsp_backup"], servers=4)["inside"])
        out = advise.validation(advise.calibrate(make_probe(n=64, ratio=10.0)), ["ring"])
        self.assertFalse(out["inside"])
        self.assertTrue(any("N = 64" in x for x in out["notes"]) and any("r = 10" in x for x in out["notes"]),
                        out["notes"])

    def refused(self, path, *words):
        rc, out, err = main_in_process([path, "--dry-run", "--out", os.path.join(mkdtemp(), "o")])
        self.assertEqual(rc, 2, out + err)
        line = err.strip()
        self.assertEqual(len(line.splitlines()), 1, err)
        for w in words:
            self.assertIn(w, line)
        return line

    def test_bad_inputs_refused_by_name(self):
        self.refused(os.path.join(mkdtemp(), "absent.json"), "no such file", "syncopate-probe")
        self.refused(write_probe('{"format": "syncopate-probe/1", "nodes": ['), "not valid JSON")
        self.refused(write_probe(dict(make_probe(), format="syncopate-probe/9")), "format", "syncopate-probe/1")
        self.refused(write_probe(dict(make_probe(), nodes=[])), "nodes", "empty")
        self.refused(write_probe({k: v for k, v in make_probe().items() if k != "nodes"}), "nodes", "missing")
        self.refused(write_probe(dict(make_probe(), links=[])), "links", "4 nodes")
        p = make_probe()
        p["nodes"][2]["step_s"]["min"] = 0.0
        self.refused(write_probe(p), "nodes[2].step_s.min", "> 0")
        p = make_probe()
        p["links"][1]["goodput_gbit"] = -1
        self.refused(write_probe(p), "links[1].goodput_gbit")
        p = make_probe()
        del p["job"]["params"]
        self.refused(write_probe(p), "job.params")
        p = make_probe()
        p["nodes"][1]["node"] = 0
        self.refused(write_probe(p), "nodes[1].node")
        # The script itself: exit code 2 and one line, nothing started.
        r = subprocess.run([PY, os.path.join(ROOT, "experiments", "advise.py"), os.path.join(mkdtemp(), "no.json")],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no such file", r.stderr)

    def test_incomplete_probe_warns_and_advises_from_what_is_there(self):
        p = make_probe(n=4)
        p["complete"], p["missing"] = False, [{"what": "node 3", "why": "no answer within 30 s"}]
        p["nodes"] = p["nodes"][:3]
        p["links"] = p["links"][:2]
        rc, out, err = main_in_process([write_probe(p), "--dry-run", "--out", os.path.join(mkdtemp(), "o")])
        self.assertEqual(rc, 0, err)
        self.assertIn("warning", err)
        self.assertIn("node 3 (no answer within 30 s)", err)
        cl = advise.calibrate(p)
        self.assertEqual((cl["nodes"], cl["measured_nodes"], cl["complete"]), (4, 3, False))
        self.assertTrue(any(x.startswith("incomplete probe") for x in cl["assumptions"]))

    def test_dry_run_starts_nothing_and_writes_nothing(self):
        def refuse(*args, **kw):
            raise AssertionError(f"a process was started: {args[0] if args else kw}")
        saved = subprocess.run, subprocess.Popen
        subprocess.run = subprocess.Popen = refuse
        out = os.path.join(mkdtemp(), "o")
        try:
            rc, text, err = main_in_process([write_probe(make_probe()), "--dry-run", "--out", out, "--seeds", "2"])
        finally:
            subprocess.run, subprocess.Popen = saved
        self.assertEqual(rc, 0, err)
        self.assertFalse(os.path.exists(out))
        self.assertIn("14 simulated runs", text)
        self.assertIn("cluster: N = 4 nodes", text)
        self.assertIn("proxy: micro model", text)

    def test_from_run_takes_the_runs_own_step_times(self):
        """--from-run (issue 29, second stage): a run started from an advice for a homogeneous cluster,
        whose node 2 then ran 3x slower, is calibrated from the run: node 2 is a straggler now, the
        links are the probe's, the target/seeds/steps are the first advice's, nothing is written."""
        probe = write_probe(make_probe(n=4, T=0.3))
        run = mkdtemp()
        for i in range(4):
            d = os.path.join(run, f"node{i}")
            os.makedirs(d)
            with open(os.path.join(d, "config.toml"), "w") as f:
                f.write(f"[dist]\nnode_rank = {i}\n[train]\nsteps = 120\n")
            own = 0.9 if i == 2 else 0.31
            with open(os.path.join(d, "metrics.jsonl"), "w") as f:
                for k in range(60):
                    f.write(json.dumps({"step": k + 1, "loss": 4.0, "step_s": own + 0.05 + 0.001 * (k % 3), "wait_s": 0.05}) + "\n")
                f.write('{"step": 61, "loss"')  # a line cut by a crash
        with open(os.path.join(run, "node0", "advice.applied.json"), "w") as f:
            json.dump({"probe": probe, "recommended": {"name": "ring"},
                       "proxy": {"target_loss": 3.1, "seeds": 2, "steps": 100, "servers": 2,
                                 "server_placement": "nodes"}}, f)
        out = os.path.join(mkdtemp(), "o")
        rc, text, err = main_in_process(["--from-run", run, "--dry-run", "--out", out])
        self.assertEqual(rc, 0, err)
        self.assertFalse(os.path.exists(out))
        self.assertIn("stragglers 2 at 2.90x", text)
        self.assertIn("target loss 3.1, 100 steps at most, 2 seed(s)", text)
        self.assertIn("links, exchange rounds and job as probed in " + probe, text)
        # The job's shards stay its own: their count and where they run (the run's nodes carry no addresses).
        self.assertIn("2 servers (the first advice's) on nodes 0..1 sharing their links (the first advice's)", text)
        # Where the run stands (its newest whole step, 60, of its train.steps, 120), and how to rank its rest.
        self.assertIn("the run stands at step 60 of 120: whole runs are ranked; --from-fraction 0.5 ranks the rest", text)
        # The calibration of the same probe as probed: no straggler.
        rc, text, err = main_in_process([probe, "--dry-run", "--out", out])
        self.assertIn("no straggler", text)
        # A run not started from an advice, and neither or both of probe and --from-run: refused by name.
        os.remove(os.path.join(run, "node0", "advice.applied.json"))
        rc, text, err = main_in_process(["--from-run", run, "--dry-run"])
        self.assertEqual(rc, 2)
        self.assertIn("was not started with --dist.mode=auto", err)
        rc, text, err = main_in_process(["--dry-run"])
        self.assertEqual(rc, 2)
        self.assertIn("give a probe.json, or --from-run RUN", err)

    def test_the_rest_of_a_run_counts_from_each_candidates_own_step(self):
        """--from-fraction: a simulated run's time to target and end, less the time it stood at the
        step (its slowest worker's end of it); a run that reached the target by then is named (there
        is no rest to rank); a miss counts at the time it ran past the step, or at its whole run's time
        where it never stood at the step."""
        out = mkdtemp()

        def write(name, seed, per_node):
            for i, times in enumerate(per_node):
                d = os.path.join(advise.run_dir(out, name, seed), f"node{i}")
                os.makedirs(d)
                with open(os.path.join(d, "metrics.jsonl"), "w") as f:
                    for k, t in enumerate(times):
                        f.write(json.dumps({"step": k + 1, "step_s": 1.0, "time_s": t}) + "\n")
                        f.write(json.dumps({"step": k + 1, "val_loss": 3.0, "time_s": t + 0.01}) + "\n")
        write("ring", 0, [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
        write("asp_lr_scale", 0, [[0.5, 1.0, 1.5, 2.0], [1.5, 3.0]])  # worker 1 three times slower
        write("ssp4", 0, [[0.5, 1.0], [0.5, 1.0]])  # stopped at its time limit after step 2
        results = {"ring": [{"seed": 0, "time_to_target_s": 3.5, "simulated_s": 4.0}],
                   "asp_lr_scale": [{"seed": 0, "time_to_target_s": 3.2, "simulated_s": 3.2}],
                   "ssp4": [{"seed": 0, "time_to_target_s": None, "simulated_s": 1.0}]}
        rest, early = advise.rest_of_run(results, out, 2)
        self.assertEqual(early, [])
        self.assertEqual((rest["ring"][0]["time_to_target_s"], rest["ring"][0]["simulated_s"]), (1.5, 2.0))
        self.assertEqual(rest["asp_lr_scale"][0]["at_step_s"], 3.0)  # the slow worker's step 2, not node 0's
        self.assertAlmostEqual(rest["asp_lr_scale"][0]["time_to_target_s"], 0.2)
        # a miss, counted at the time it ran past the step (a lower bound of its rest)
        self.assertEqual((rest["ssp4"][0]["time_to_target_s"], rest["ssp4"][0]["simulated_s"]), (None, 0.0))
        rest, early = advise.rest_of_run(results, out, 3)
        self.assertEqual(rest["ring"][0]["time_to_target_s"], 0.5)
        self.assertEqual((rest["ssp4"][0]["time_to_target_s"], rest["ssp4"][0]["simulated_s"]), (None, 1.0))
        self.assertEqual(early, [("asp_lr_scale", 0)])  # its worker 1 never stood at step 3; it reached the target
        self.assertEqual(results["ring"][0]["time_to_target_s"], 3.5)  # the whole run's results are untouched
        # The fraction is that of the job's steps, mapped onto the proxy's; a run that has ended is refused.
        rc, text, err = main_in_process([write_probe(make_probe()), "--dry-run", "--from-fraction", "1"])
        self.assertEqual(rc, 2)
        self.assertIn("the run has done all its steps", err)
        a = advise.parse_args([write_probe(make_probe()), "--from-fraction", "0.25", "--steps", "100"])
        self.assertEqual(a.from_step, 25)

    def test_steps_must_be_a_multiple_of_every_interval(self):
        rc, out, err = main_in_process([write_probe(make_probe()), "--dry-run", "--steps", "80"])
        self.assertEqual(rc, 2)
        self.assertIn("diloco50 (H = 50)", err)
        rc, out, err = main_in_process([write_probe(make_probe()), "--dry-run", "--configs", "nope"])
        self.assertEqual(rc, 2)
        self.assertIn("unknown configuration", err)


HAVE_BINARIES = all(os.path.exists(os.path.join(BIN, b)) for b in ("syncopate-sim", "syncopate-worker",
                                                                    "syncopate-server"))
# The known-answer settings: short enough for a test (~30 s of this 2-core machine per probe), long
# enough that the schedule is not cut to the bone (at 50 steps the fast cluster's answer moves).
E2E = ["--seeds", "2", "--steps", "100", "--target-loss", "3.0"]
SYNCHRONOUS = {"ring", "bsp_backup", "diloco10", "diloco50"}
LOCAL_SGD = {"diloco10", "diloco50", "async_local_sgd"}


@unittest.skipUnless(HAVE_BINARIES, f"the binaries are not built under {BIN} (scripts/build.sh)")
def result(name, seed, t, loss=2.9):
    return {"config": name, "seed": seed, "time_to_target_s": t, "simulated_s": t or 30.0, "final_val_loss": loss,
            "worker_steps": 1, "real_s": 0.0, "limit_s": 0.0}


class Stability(unittest.TestCase):
    """The seed-decided pick (session 44's i_slow7: DiLoCo's seeds split between its first and second
    outer round, the mean between the modes): leave-one-seed-out, and --stability-seeds adding seeds."""
    # ring at 10 s in every seed; diloco10 8, 8, 16 (a late round in seed 2), then 7, 7; the rest behind.
    TIMES = {"ring": [10.0] * 5, "diloco10": [8.0, 8.0, 16.0, 7.0, 7.0]}

    def fake(self, started):
        def run(name, seed, px, cl, out, limit_s=0.0):
            started.append((name, seed))
            return result(name, seed, self.TIMES.get(name, [20.0] * 5)[seed])
        return run

    def test_leave_one_out_names_the_seed_that_decides(self):
        names = ["ring", "diloco10", "asp_lr_scale"]
        res = {k: [result(k, sd, self.TIMES.get(k, [20.0] * 5)[sd]) for sd in range(3)] for k in names}
        self.assertEqual(advise.pick(res, names), "ring")   # means 10 against 10.67
        self.assertEqual(advise.leave_one_out(res, names), {0: "ring", 1: "ring", 2: "diloco10"})
        two = {k: v[:2] for k, v in res.items()}
        self.assertEqual(advise.leave_one_out(two, names), {})   # a pick needs two seeds
        # ssp4 is fastest but missed the target in seed 2: with seed 2 left out it must not win, since
        # its miss stays in the data and no added seed can make it the pick (who may win is decided once)
        res["ssp4"] = [result("ssp4", 0, 5.0), result("ssp4", 1, 5.0), result("ssp4", 2, None)]
        self.assertEqual(advise.leave_one_out(res, names + ["ssp4"]), {0: "ring", 1: "ring", 2: "diloco10"})
        # nobody reached the target in every seed: not tested (the fallback pick is not a finding)
        none = {k: [result(k, sd, None if sd == 1 else 9.0) for sd in range(3)] for k in names}
        self.assertEqual(advise.leave_one_out(none, names), {})
        # No candidate reached it in every seed: the fallback (seeds reached, then time) is the pick
        miss = {"ring": [result("ring", 0, None), result("ring", 1, 9.0)],
                "diloco10": [result("diloco10", 0, None, 2.8), result("diloco10", 1, 12.0)]}
        self.assertEqual(advise.pick(miss, ["ring", "diloco10"]), "ring")

    def advise_faked(self, path, seeds, k, started):
        """advice.json and the printed text of an advice on the fake runs, --seeds and --stability-seeds k."""
        saved = advise.run
        advise.run = self.fake(started)
        out = mkdtemp()
        try:
            rc, text, err = main_in_process([path, "--out", out, "--seeds", str(seeds), "--steps", "100",
                                             "--configs", "ring,diloco10,asp_lr_scale", "--no-exchange-calibration",
                                             "--stability-seeds", str(k)])
        finally:
            advise.run = saved
        self.assertEqual(rc, 0, err)
        with open(os.path.join(out, "advice.json")) as f:
            return json.load(f), text

    def test_seed_decided_picks_get_seeds_until_they_hold(self):
        path = write_probe(make_probe(n=4, ratio=10.0))
        for k, want_pick, want_seeds, stable in ((0, "ring", 3, False), (1, "diloco10", 4, False),
                                                  (3, "diloco10", 5, True)):
            started = []
            adv, text = self.advise_faked(path, 3, k, started)
            st = adv["stability"]
            self.assertEqual((adv["recommended"]["name"], st["seeds"], st["stable"]), (want_pick, want_seeds, stable),
                             text)
            self.assertEqual(adv["proxy"]["seeds"], want_seeds)   # what hindsight reads the advice's runs by
            self.assertEqual(sorted({sd for _, sd in started}), list(range(want_seeds)))   # every candidate, every seed
            self.assertEqual(len(started), 3 * want_seeds)
            if stable:   # diloco10 ahead on the means (9.2 against 10) but not resolved: the text says so
                self.assertFalse(adv["recommended"]["resolved"])
                self.assertIn("the order of the means holds with any one of its 5 seeds left out, which is not a "
                              "resolution (2 seed(s) added", adv["recommended"]["why"])
                self.assertIn("a stop that depended on the data, so read them as optimistic", adv["recommended"]["why"])
            else:
                self.assertIn("seed-decided: leaving one of its", adv["recommended"]["why"])
            if k == 0:
                self.assertEqual(st["leave_one_out"], {"0": "ring", "1": "ring", "2": "diloco10"})
                self.assertIn("--stability-seeds K adds seeds", adv["recommended"]["why"])
        # two seeds: not tested where no seed may be added; with one allowed, it is added and tested
        for k, want_seeds, stable in ((0, 2, None), (1, 3, False)):
            adv, text = self.advise_faked(path, 2, k, [])
            self.assertEqual((adv["stability"]["seeds"], adv["stability"]["stable"]), (want_seeds, stable), text)
            self.assertEqual(adv["proxy"]["base_seeds"], 2)   # what a re-advice starts from
            if stable is None:
                self.assertIn("not tested for a seed-decided pick (fewer than 3 seeds", adv["recommended"]["why"])
        rc, _, err = main_in_process([path, "--stability-seeds", "-1"])
        self.assertEqual(rc, 2)
        self.assertIn("--stability-seeds -1 is negative", err)

    def test_outer_rounds_at_target_are_read_from_node_0s_evaluations(self):
        out = mkdtemp()
        curves = {0: [(10, 3.2), (20, 2.95)], 1: [(10, 3.1), (20, 3.05), (30, 3.01), (40, 2.9)], 2: [(10, 3.3)]}
        for sd, pts in curves.items():
            d = os.path.join(advise.run_dir(out, "diloco10", sd), "node0")
            os.makedirs(d)
            with open(os.path.join(d, "metrics.jsonl"), "w") as f:
                f.write(json.dumps({"step": 5, "loss": 3.5}) + "\n")   # a training line: not an evaluation
                for step, v in pts:
                    f.write(json.dumps({"step": step, "time_s": step * 0.1, "val_loss": v}) + "\n")
        got = advise.outer_rounds_at_target(out, "diloco10", [0, 1, 2], 3.0)
        self.assertEqual(got, {"0": 2, "1": 4, "2": None})
        self.assertEqual(advise.seed_split(got), "round 2 in 1 seed, round 4 in 1 seed, never in 1 seed")
        self.assertIsNone(advise.seed_split({"0": 1, "1": 1}))
        self.assertEqual(advise.seed_split({"0": 1, "1": 2, "2": 1}), "round 1 in 2 seeds, round 2 in 1 seed")
        self.assertIsNone(advise.seed_split({"0": 7, "1": 8, "2": 10}))   # 10 / 7 < 1.5: ordinary spread
        self.assertEqual(advise.seed_split({"0": 7, "1": 11}), "round 7 in 1 seed, round 11 in 1 seed")
        self.assertEqual(advise.seed_split({"0": 0, "1": 1}), "round 0 in 1 seed, round 1 in 1 seed")
        self.assertIsNone(advise.outer_rounds_at_target(out, "ring", [0], 3.0))    # H = 1: no rounds
        self.assertIsNone(advise.outer_rounds_at_target(out, "diloco10", [7], 3.0))   # no curve kept


class KnownAnswers(unittest.TestCase):
    """End to end with the real simulator. Each probe is advised once (setUpClass); the tests read it."""
    PROBES = {"fast": dict(ratio=0.1, jitter=0.02), "straggler": dict(ratio=0.1, slow=(3, 3.0), jitter=0.2),
              "slow_link": dict(ratio=10.0, jitter=0.02)}  # slow_link: the fast cluster's link 100x slower
    done = {}

    @classmethod
    def setUpClass(cls):
        for name, kw in cls.PROBES.items():
            path, out = write_probe(make_probe(n=4, **kw), f"{name}.json"), os.path.join(mkdtemp(), name)
            t0 = time.time()
            r = subprocess.run([PY, os.path.join(ROOT, "experiments", "advise.py"), path, "--out", out] + E2E,
                               capture_output=True, text=True, timeout=600)
            took = time.time() - t0
            if r.returncode != 0:
                raise AssertionError(f"advise {name} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
            with open(os.path.join(out, "advice.json")) as f:
                adv = json.load(f)
            cls.done[name] = {"path": path, "out": out, "stdout": r.stdout, "advice": adv, "seconds": took}
            print(f"\n[test_advise] {name}: {took:.0f} s; recommended {adv['recommended']['name']} "
                  f"(resolved: {adv['recommended']['resolved']}); " + "; ".join(
                      f"{c['name']} {advise.fmt_interval(c['proxy_s'])} ({c['reached']}/{c['seeds']})"
                      for c in adv["candidates"]), file=sys.stderr, flush=True)

    def why(self, name):
        return self.done[name]["stdout"]

    def test_a_fast_homogeneous_cluster_gets_a_synchronous_mode(self):
        adv = self.done["fast"]["advice"]
        self.assertAlmostEqual(adv["cluster"]["ratio"], 0.1)
        self.assertEqual(adv["cluster"]["slow_workers"], [])
        self.assertIn(adv["recommended"]["name"], SYNCHRONOUS, self.why("fast"))

    def test_b_a_3x_straggler_never_gets_the_ring(self):
        adv = self.done["straggler"]["advice"]
        self.assertEqual((adv["cluster"]["slow_workers"], adv["cluster"]["slowdown"]), ([3], 3.0))
        self.assertAlmostEqual(adv["cluster"]["jitter"], 0.2)
        self.assertNotEqual(adv["recommended"]["name"], "ring", self.why("straggler"))

    def test_c_a_100x_slower_link_gets_local_sgd(self):
        adv = self.done["slow_link"]["advice"]
        self.assertAlmostEqual(adv["cluster"]["ratio"], 10.0)
        self.assertIn(adv["recommended"]["name"], LOCAL_SGD, self.why("slow_link"))

    def test_advice_json_is_well_formed(self):
        for name, d in self.done.items():
            adv = d["advice"]
            self.assertEqual(adv["format"], "syncopate-advice/1")
            for key in ("probe", "created_unix_s", "command", "cluster", "proxy", "assumptions", "validated",
                        "candidates", "recommended", "run"):
                self.assertIn(key, adv)
            for key in ("nodes", "step_s", "slow_workers", "slowdown", "jitter", "link_gbit", "latency_ms", "ratio",
                        "params"):
                self.assertIn(key, adv["cluster"])
            for key in ("preset", "step_s", "link_gbit", "latency_us", "target_loss", "seeds", "steps", "servers",
                        "servers_from"):
                self.assertIn(key, adv["proxy"])
            self.assertEqual((adv["proxy"]["servers"], adv["proxy"]["servers_from"]), (4, "default"))  # no servers probed
            self.assertEqual((adv["proxy"]["preset"], adv["proxy"]["seeds"], adv["proxy"]["steps"]), ("micro", 2, 100))
            self.assertIsInstance(adv["validated"]["inside"], bool)
            self.assertEqual({c["name"] for c in adv["candidates"]}, set(advise.CANDIDATES))
            for c in adv["candidates"]:
                self.assertEqual(c["seeds"], 2)
                if c["reached"]:
                    # predicted = proxy x T / 0.1 (T = 0.3 s here)
                    self.assertAlmostEqual(c["predicted_s"]["mean"], c["proxy_s"]["mean"] * 3.0)
                self.assertGreater(c["bytes_per_step"], 0)
            rec = adv["recommended"]
            winner = next(c for c in adv["candidates"] if c["name"] == rec["name"])
            self.assertEqual((rec["worker_flags"], rec["server_flags"]), (winner["worker_flags"], winner["server_flags"]))
            self.assertIn("scripts/launch_node.sh", adv["run"])
            self.assertNotIn("≈", d["stdout"])
            if not rec["resolved"]:
                self.assertIn("not resolved", d["stdout"])
            self.assertTrue(any("x T / 0.1" in a for a in adv["assumptions"]))

    def test_advice_toml_and_every_candidates_flags_are_accepted_by_the_binaries(self):
        worker, server = os.path.join(BIN, "syncopate-worker"), os.path.join(BIN, "syncopate-server")
        for name, d in self.done.items():
            toml_path = os.path.join(d["out"], "advice.toml")
            with open(toml_path, "rb") as f:
                t = tomllib.load(f)
            rec = d["advice"]["recommended"]
            self.assertEqual(set(t), {"dist", "ps"})
            self.assertEqual({f"--dist.{k}={v}" for k, v in t["dist"].items()}, set(rec["worker_flags"]))
            self.assertEqual({f"--ps.{k}={v}" for k, v in t["ps"].items()}, set(rec["server_flags"]))
            # ps mode needs the shards' endpoints, which scripts/launch_node.sh adds (SYNCOPATE_SERVERS).
            extra = ["--dist.servers=tcp://127.0.0.1:29501"] if t["dist"].get("mode") == "ps" else []
            r = subprocess.run([worker, "--config", toml_path, "--print-config"] + extra, capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"mode = '{t['dist']['mode']}'", r.stdout)
            r = subprocess.run([server, "--config", toml_path, "--print-config"], capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            for k, v in t["ps"].items():
                self.assertIn(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}", r.stdout)
        for c in self.done["fast"]["advice"]["candidates"]:  # every candidate's flags, not only the winners'
            extra = ["--dist.servers=tcp://127.0.0.1:29501"] if "--dist.mode=ps" in c["worker_flags"] else []
            r = subprocess.run([worker, "--print-config"] + c["worker_flags"] + extra, capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 0, f"{c['name']}: {r.stderr}")
            r = subprocess.run([server, "--print-config"] + c["server_flags"], capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 0, f"{c['name']}: {r.stderr}")

    def test_a_second_call_runs_nothing(self):
        d = self.done["straggler"]

        def refuse(*args, **kw):
            raise AssertionError(f"a cached run was started again: {args[0] if args else kw}")
        saved = subprocess.run
        subprocess.run = refuse
        try:
            rc, out, err = main_in_process([d["path"], "--out", d["out"]] + E2E)
        finally:
            subprocess.run = saved
        self.assertEqual(rc, 0, err)
        self.assertIn("14 cached, 0 to run", out)
        with open(os.path.join(d["out"], "advice.json")) as f:
            again = json.load(f)
        self.assertEqual(again["recommended"], d["advice"]["recommended"])
        self.assertEqual(again["candidates"], d["advice"]["candidates"])


    def test_the_rest_of_a_run_is_ranked_on_the_same_runs(self):
        """A re-advice mid-run (--from-fraction 0.1: step 10 of 100, before any candidate passes 3.0)
        takes the cached whole runs and ranks their rest: every candidate's predicted time is its whole
        time less the time its run stood at step 10, and the advice says so. A target some candidate
        reached by the step is refused by name."""
        d = self.done["fast"]
        out = d["out"]  # its runs' commands name it: they are the cache
        rc, text, err = main_in_process([d["path"], "--out", out, "--from-fraction", "0.1"] + E2E)
        self.assertEqual(rc, 0, err)
        self.assertIn("0 to run", text)
        self.assertIn("the rest of the run: times from the step 10 of 100", text)
        with open(os.path.join(out, "advice.json")) as f:
            adv = json.load(f)
        self.assertEqual(adv["from_step"], 10)
        self.assertTrue(any("the rest of a run: from step 10" in x for x in adv["assumptions"]))
        self.assertIn("from step 10 of 100 to target", adv["recommended"]["why"])
        whole = {c["name"]: c for c in d["advice"]["candidates"]}
        checked = 0
        for c in adv["candidates"]:
            if whole[c["name"]]["reached"] != whole[c["name"]]["seeds"]:
                continue
            rest = []
            for sd in range(2):
                r = advise.cached(out, c["name"], sd)
                rest.append(r["time_to_target_s"] - advise.step_time(advise.run_dir(out, c["name"], sd), 10))
            self.assertAlmostEqual(c["proxy_s"]["mean"], sum(rest) / 2, places=6)
            self.assertLess(c["proxy_s"]["mean"], whole[c["name"]]["proxy_s"]["mean"])
            checked += 1
        self.assertGreaterEqual(checked, 3)
        # Step 90 of 100: the per-step candidates passed 3.0 long before; nothing left to rank.
        rc, text, err = main_in_process([d["path"], "--out", out, "--from-fraction", "0.9"] + E2E)
        self.assertEqual(rc, 2)
        self.assertIn("cannot be ranked at the target loss 3", err)
        self.assertIn("ring seed 0", err)


def with_rounds(p, key, round_s, servers=4, gap_s=None):
    """The probe p with an exchange section ("ring_exchange" or "ps"): every node's median round
    `round_s` (a list, one per node), rounds gap_s apart (default: the probe's fastest step)."""
    gap = p["nodes"][0]["step_s"]["min"] if gap_s is None else gap_s
    p[key] = {"rounds": 10, "gap_s": gap,
              "nodes": [{"node": i, "round_s": {"samples": [r], "min": r, "p10": r, "median": r, "p90": r, "max": r,
                                                "mean": r}, "measured_unix_s": time.time()}
                        for i, r in enumerate(round_s)]}
    if key in ("ps", "ps_spread"):
        p[key].update(servers=servers, endpoints=[f"tcp://h{k}:1" for k in range(servers)])
    return p


class ExchangeCalibration(unittest.TestCase):
    """The probe's exchange rounds at the model's size (syncopate-probe: the ring's all-reduce, and with
    the job's shards the BSP round trip) held against the simulator's model of the same exchange: each
    pattern's messages get the share of the link rate that reproduces the measured round
    (--sim.ring_goodput, --sim.ps_goodput), stated in the advice's assumptions;
    --no-exchange-calibration is the ablation."""

    def test_the_round_is_the_median_over_nodes_and_bad_sections_are_refused(self):
        p = with_rounds(with_rounds(make_probe(n=4), "ps", [0.5, 0.7, 0.6, 9.0]), "ring_exchange", [0.2, 0.1, 0.3, 0.4])
        ex = advise.calibrate(p)["exchanges"]
        self.assertAlmostEqual(ex["ps"].pop("round_s"), 0.65)
        self.assertEqual(ex["ps"], {"servers": 4, "nodes": 4, "gap_s": 0.3})
        self.assertAlmostEqual(ex["ring"]["round_s"], 0.25)
        self.assertEqual(advise.calibrate(make_probe(n=4))["exchanges"],
                         {"ring": None, "ps": None, "ps_spread": None})  # none timed
        p = with_rounds(make_probe(n=4), "ps", [0.5, 0.6])        # two nodes of four: not the job's exchange
        cl = advise.calibrate(p)
        self.assertIsNone(cl["exchanges"]["ps"])
        self.assertTrue(any("ps.nodes lists 2 of 4 nodes" in w and "not used" in w for w in cl["warnings"]))
        for key in ("ps", "ring_exchange"):
            p = with_rounds(make_probe(), key, [0.5] * 4)
            p[key]["nodes"] = {}
            with self.assertRaises(advise.ProbeError) as cm:
                advise.calibrate(p)
            self.assertIn(f"{key}.nodes must be a list", str(cm.exception))
            p = with_rounds(make_probe(), key, [0.5] * 4)
            del p[key]["nodes"][2]["round_s"]["median"]
            with self.assertRaises(advise.ProbeError) as cm:
                advise.calibrate(p)
            self.assertIn(f"{key}.nodes[2].round_s.median is missing", str(cm.exception))
            p = with_rounds(make_probe(), key, [0.5, -1, 0.5, 0.5])
            with self.assertRaises(advise.ProbeError) as cm:
                advise.calibrate(p)
            self.assertIn(f"{key}.nodes[1].round_s.median", str(cm.exception))

    @unittest.skipUnless(os.path.exists(os.path.join(BIN, "syncopate-sim")), f"syncopate-sim is not built under {BIN}")
    def test_the_goodput_reproduces_the_measured_round(self):
        """A simulated round is fixed + transfer / goodput: a measured round of fixed + 4 x transfer solves
        to goodput 1/4, and the exchange simulated at 1/4 takes that round (within 1%); only each
        pattern's candidates carry its goodput; a round below the fixed part is clamped and said so."""
        out = mkdtemp()
        probe = with_rounds(with_rounds(make_probe(n=4), "ps", [1.0] * 4), "ring_exchange", [1.0] * 4)
        cl = advise.calibrate(probe)
        px = advise.proxy(cl, advise.parse_args(["x.json"]))
        t = px["time_scale"]
        for pattern, key in (("ps", "ps"), ("ring", "ring_exchange")):
            g1 = advise.exchange_goodput(cl, px, out, pattern)
            transfer = g1["modelled_round_s"] - g1["fixed_s"]
            self.assertGreater(transfer, 0)
            self.assertGreater(g1["fixed_s"], 0)                  # latency hops at least
            want = g1["fixed_s"] + 4 * transfer
            cl = advise.calibrate(with_rounds(probe, key, [want * t] * 4))
            g = advise.exchange_goodput(cl, px, out, pattern)
            self.assertAlmostEqual(g["goodput"], 0.25, places=6)
            self.assertFalse(g["clamped"])
            again = advise.simulated_round(cl, px, mkdtemp(), pattern, 0.25)
            self.assertAlmostEqual(again / want, 1.0, delta=0.01)
            # Faster than the fixed part alone: no goodput reproduces it.
            low = advise.exchange_goodput(advise.calibrate(with_rounds(probe, key, [0.5 * g1["fixed_s"] * t] * 4)),
                                          px, out, pattern)
            self.assertEqual((low["goodput"], low["clamped"]), (advise.GOODPUT_RANGE[1], True))
            px.setdefault("goodput", {})[pattern] = g
            probe = with_rounds(probe, key, [want * t] * 4)
        cl = advise.calibrate(probe)
        px["calibration"] = "applied"
        for name in ("bsp_backup", "asp_lr_scale", "ssp4", "async_local_sgd"):
            cmd = advise.sim_command(name, 0, px, cl, "/tmp/x", 0)
            self.assertIn("--sim.ps_goodput=0.25", cmd)
            self.assertFalse([f for f in cmd if "ring_goodput" in f])
        for name in ("ring", "diloco10", "diloco50"):
            cmd = advise.sim_command(name, 0, px, cl, "/tmp/x", 0)
            self.assertIn("--sim.ring_goodput=0.25", cmd)
            self.assertFalse([f for f in cmd if "ps_goodput" in f])
        text = " ".join(advise.assumptions(cl, px, advise.CANDIDATES))
        self.assertIn("parameter-server messages get 0.25 x the link rate", text)
        self.assertIn("the ring's all-reduce get 0.25 x the link rate", text)
        self.assertIn("below 1", text)
        self.assertIn("beyond what the measured goodput absorbs", text)
        # --calibration-only: the same calibration written down, no candidate run.
        out2 = mkdtemp()
        rc, text, err = main_in_process([write_probe(probe), "--calibration-only", "--out", out2])
        self.assertEqual(rc, 0, err)
        with open(os.path.join(out2, "calibration.json")) as f:
            doc = json.load(f)
        self.assertEqual(doc["format"], "syncopate-calibration/1")
        for pattern in ("ps", "ring"):
            self.assertAlmostEqual(doc["proxy"]["goodput"][pattern]["goodput"], 0.25, places=6)
        self.assertTrue(any("x the link rate" in x for x in doc["assumptions"]))
        self.assertFalse(os.path.exists(os.path.join(out2, "runs")))
        self.assertFalse(os.path.exists(os.path.join(out2, "advice.json")))

    def test_the_asynchronous_candidates_take_the_spread_rounds(self):
        """Where the probe timed round trips to ASP shards with the pushes spread out (ps_spread),
        --spread-calibration async gives their share of the link rate to SSP, ASP and asynchronous local
        SGD, asp to ASP and asynchronous local SGD only; BSP + backup takes the BSP rounds', the ring and
        DiLoCo the ring's. Where the probe did not time them (none, or skipped with a reason), or with
        --spread-calibration none (the default), every parameter-server candidate takes the BSP rounds'
        share, and the assumptions say so."""
        probe = with_rounds(with_rounds(make_probe(n=4), "ps", [1.0] * 4, servers=2), "ring_exchange", [1.0] * 4)
        cl = advise.calibrate(probe)
        want = {"ring": "ring", "diloco10": "ring", "diloco50": "ring", "bsp_backup": "ps", "asp_lr_scale": "ps",
                "ssp4": "ps", "async_local_sgd": "ps"}
        self.assertEqual({x: advise.exchange_pattern(x, cl) for x in want}, want)
        self.assertEqual(advise.patterns_used(cl, list(want)), ["ring", "ps"])
        probe["ps_spread"] = {"skipped": "nodes share the address 127.0.0.1 (one host)"}
        cl = advise.calibrate(probe)
        self.assertIsNone(cl["exchanges"]["ps_spread"])
        self.assertEqual(advise.exchange_pattern("asp_lr_scale", cl), "ps")
        spread = with_rounds(copy.deepcopy(probe), "ps_spread", [0.4, 0.5, 0.6, 9.0], servers=2)
        cl = advise.calibrate(spread)
        got = dict(cl["exchanges"]["ps_spread"])
        self.assertAlmostEqual(got.pop("round_s"), 0.55)
        self.assertEqual(got, {"servers": 2, "nodes": 4, "gap_s": 0.3})
        self.assertEqual(advise.exchange_pattern("asp_lr_scale", cl), "ps")  # measured, not yet given to anyone
        none = copy.deepcopy(cl)
        advise.use_spread_rounds(none, "none")
        self.assertIsNone(none["exchanges"]["ps_spread"])
        self.assertIn("--spread-calibration none, the default", " ".join(none["assumptions"]))
        asp = copy.deepcopy(cl)
        advise.use_spread_rounds(asp, "asp")
        self.assertEqual({x: advise.exchange_pattern(x, asp) for x in want},
                         dict(want, asp_lr_scale="ps_spread", async_local_sgd="ps_spread"))
        advise.use_spread_rounds(cl, "async")
        want.update(asp_lr_scale="ps_spread", ssp4="ps_spread", async_local_sgd="ps_spread")
        self.assertEqual({x: advise.exchange_pattern(x, cl) for x in want}, want)
        self.assertEqual(advise.patterns_used(cl, list(want)), ["ring", "ps", "ps_spread"])
        self.assertEqual(advise.patterns_used(cl, ["bsp_backup"]), ["ps"])
        px = advise.proxy(cl, advise.parse_args(["x.json"]))
        cmd = advise.exchange_command(px, cl, "o", "ps_spread")
        self.assertIn("--ps.consistency=asp", cmd)
        self.assertIn(f"--sim.spread_start_s={advise.exchange_gap(cl, px, 'ps_spread'):.6g}", cmd)
        bsp = advise.exchange_command(px, cl, "o", "ps")
        self.assertIn("--ps.consistency=bsp", bsp)
        self.assertFalse([f for f in bsp if "spread_start_s" in f])
        # Each candidate gets its own pattern's share, and the assumptions name both rounds.
        px["calibration"] = "applied"
        px["goodput"] = {"ring": None,
                         "ps": {"goodput": 0.5, "modelled_round_s": 1.0, "fixed_s": 0.1, "measured_round_s": 1.8,
                                "clamped": False, "pattern": "ps"},
                         "ps_spread": {"goodput": 0.9, "modelled_round_s": 1.0, "fixed_s": 0.1,
                                       "measured_round_s": 1.1, "clamped": False, "pattern": "ps_spread"}}
        self.assertIn("--sim.ps_goodput=0.5", advise.sim_command("bsp_backup", 0, px, cl, "o", 0))
        for name in ("asp_lr_scale", "ssp4", "async_local_sgd"):
            self.assertIn("--sim.ps_goodput=0.9", advise.sim_command(name, 0, px, cl, "o", 0))
        text = " ".join(advise.assumptions(cl, px, advise.CANDIDATES))
        self.assertIn("the parameter-server messages of SSP, ASP and asynchronous local SGD get 0.9 x the link rate",
                      text)
        self.assertIn("node r starting r/N of a gap after node 0", text)
        self.assertIn("parameter-server messages get 0.5 x the link rate", text)
        self.assertNotIn("were not timed", text)
        text = " ".join(advise.assumptions(asp, px, advise.CANDIDATES))  # asp: SSP on the BSP share, said so
        self.assertIn("the parameter-server messages of ASP and asynchronous local SGD get 0.9 x", text)
        self.assertIn("or not given to them (--spread-calibration)", text)
        cl = advise.calibrate(probe)  # skipped: the BSP share for all, and the caveat
        px["goodput"] = {"ring": None, "ps": px["goodput"]["ps"], "ps_spread": None}
        self.assertIn("--sim.ps_goodput=0.5", advise.sim_command("asp_lr_scale", 0, px, cl, "o", 0))
        self.assertIn("where the spread rounds were not timed", " ".join(advise.assumptions(cl, px, advise.CANDIDATES)))
        # The command line: the default (none) and its old name use the BSP share; asp and async the spread one.
        path = write_probe(spread)
        for args in ([], ["--no-spread-calibration"], ["--spread-calibration", "none"]):
            rc, out, err = main_in_process([path, "--dry-run", *args, "--out", os.path.join(mkdtemp(), "o")])
            self.assertEqual(rc, 0, err)
            self.assertNotIn("pushes spread out (", out)
            self.assertIn("the probe timed BSP round trips to the servers (1 s)", out)
        for choice in ("asp", "async"):
            rc, out, err = main_in_process([path, "--dry-run", "--spread-calibration", choice, "--out",
                                            os.path.join(mkdtemp(), "o")])
            self.assertEqual(rc, 0, err)
            self.assertIn("the probe timed round trips to ASP shards with the pushes spread out (0.55 s)", out)
        bad = with_rounds(make_probe(n=4), "ps_spread", [0.5] * 4)
        bad["ps_spread"]["nodes"] = {}
        with self.assertRaises(advise.ProbeError) as cm:
            advise.calibrate(bad)
        self.assertIn("ps_spread.nodes must be a list", str(cm.exception))

    @unittest.skipUnless(os.path.exists(os.path.join(BIN, "syncopate-sim")), f"syncopate-sim is not built under {BIN}")
    def test_the_spread_goodput_reproduces_the_measured_round(self):
        """The spread rounds solved as the BSP ones: the simulated ASP exchange with its spread start at the
        solved share takes the measured round (within 1%), the last worker's later start not counted."""
        out = mkdtemp()
        probe = with_rounds(make_probe(n=4), "ps_spread", [1.0] * 4, servers=2)
        cl = advise.calibrate(probe)
        advise.use_spread_rounds(cl, "async")
        px = advise.proxy(cl, advise.parse_args(["x.json"]))
        t = px["time_scale"]
        g1 = advise.exchange_goodput(cl, px, out, "ps_spread")
        transfer = g1["modelled_round_s"] - g1["fixed_s"]
        self.assertGreater(transfer, 0)
        want = g1["fixed_s"] + 2 * transfer
        cl = advise.calibrate(with_rounds(probe, "ps_spread", [want * t] * 4, servers=2))
        g = advise.exchange_goodput(cl, px, out, "ps_spread")
        self.assertAlmostEqual(g["goodput"], 0.5, places=6)
        self.assertAlmostEqual(advise.simulated_round(cl, px, mkdtemp(), "ps_spread", 0.5) / want, 1.0, delta=0.01)

    def test_the_shard_count_is_the_jobs(self):
        """K is --servers where given, else the shards the probe's round trips went to (the job's
        layout), else min(N, 16) stated as unknown; every parameter-server run and the exchange the
        goodput is solved on take it, and the dedicated hosts' links keep K x B_server = N x B."""
        def px_of(probe, *args):
            return advise.proxy(advise.calibrate(probe), advise.parse_args(["x.json", *args]))
        probed = with_rounds(make_probe(n=6), "ps", [1.0] * 6, servers=2)
        px = px_of(probed)
        self.assertEqual((px["servers"], px["servers_from"]), (2, "probe"))
        self.assertAlmostEqual(px["server_link_gbit"], px["link_gbit"] * 6 / 2)
        cl = advise.calibrate(probed)
        for name in ("bsp_backup", "asp_lr_scale", "async_local_sgd"):
            self.assertIn("--sim.servers=2", advise.sim_command(name, 0, px, cl, "o", 0.0))
        self.assertIn("--sim.servers=2", advise.exchange_command(px, cl, "o", "ps"))
        text = " ".join(advise.assumptions(cl, px, advise.CANDIDATES))
        self.assertIn("servers: K = 2 shard(s) (the shards the probe's round trips went to), on hosts of their own "
                      "at 3 x the nodes' link each", text)
        self.assertNotIn("the candidates use", text)  # the probe's shards are the candidates'
        px = px_of(probed, "--servers", "3")  # the user's count wins, and the mismatch is said
        self.assertEqual((px["servers"], px["servers_from"]), (3, "--servers"))
        text = " ".join(advise.assumptions(cl, px, advise.CANDIDATES))
        self.assertIn("the probe's round trips went to 2 shard(s), the candidates use 3", text)
        px = px_of(make_probe(n=6), "--server-placement", "nodes")  # no servers timed: the default, said so
        self.assertEqual((px["servers"], px["servers_from"]), (6, "default"))
        text = " ".join(advise.assumptions(advise.calibrate(make_probe(n=6)), px, advise.CANDIDATES))
        self.assertIn("K = 6 shard(s) (min(N, 16): the probe timed no parameter-server round trips", text)
        self.assertIn("give --servers K", text)
        self.assertIn("on nodes 0..5 (shard k on node k mod N), sharing those nodes' links", text)
        path = write_probe(probed)
        for bad in ("0", "5000"):
            rc, _, err = main_in_process([path, "--servers", bad, "--dry-run"])
            self.assertEqual(rc, 2)
            self.assertIn(f"--servers {bad} is not in 1..4096", err)

    def test_the_placement_is_where_the_probe_found_the_shards(self):
        """Where the shards run comes from the addresses the probe recorded (each node's, each shard's):
        all at nodes' addresses -> on the nodes, sharing their links; none -> dedicated hosts; not known
        (no addresses, one shared address as on loopback, a mix, an unresolved host) -> dedicated, said
        so; --server-placement overrides; a malformed address is refused by name."""
        def placed(nodes, shards, *args):
            p = with_rounds(make_probe(n=4), "ps", [1.0] * 4, servers=len(shards))
            for nd, x in zip(p["nodes"], nodes):
                nd["address"] = x
            p["ps"]["endpoint_addresses"] = shards
            cl = advise.calibrate(p)
            px = advise.proxy(cl, advise.parse_args(["x.json", *args]))
            return px, cl, " ".join(advise.assumptions(cl, px, advise.CANDIDATES))
        nodes = [f"10.77.0.{i + 1}" for i in range(4)]
        px, cl, text = placed(nodes, ["10.77.0.1", "10.77.0.2"])
        self.assertEqual((px["server_placement"], px["placement_from"]), ("nodes", "probe"))
        self.assertEqual(cl["placement"]["shard_nodes"], [0, 1])
        self.assertIn("--sim.colocate_servers=true", advise.sim_command("asp_lr_scale", 0, px, cl, "o", 0.0))
        self.assertIn("(placement where the probe found them; the probe: every shard runs at a node's address "
                      "(shard 0 on node 0, shard 1 on node 1))", text)
        self.assertNotIn("k mod N, not on the nodes the probe found", text)
        px, cl, text = placed(nodes, ["10.77.0.3", "10.77.0.4"])  # on nodes, but not the ones the simulator takes
        self.assertEqual(px["server_placement"], "nodes")
        self.assertIn("the simulator puts shard k on node k mod N, not on the nodes the probe found", text)
        px, cl, text = placed(nodes, ["10.9.0.1", "10.9.0.2"])
        self.assertEqual((px["server_placement"], px["placement_from"]), ("dedicated", "probe"))
        self.assertNotIn("--sim.colocate_servers=true", advise.sim_command("asp_lr_scale", 0, px, cl, "o", 0.0))
        for nodes_, shards, why in ((["127.0.0.1"] * 4, ["127.0.0.1"], "nodes share an address"),
                                    (nodes, ["10.77.0.1", "10.9.0.2"], "some shards run at nodes' addresses"),
                                    (nodes, ["10.77.0.1", None], "have hosts the probe could not resolve"),
                                    ([None] * 4, ["10.77.0.1"], "no address for node(s) 0, 1, 2, 3")):
            px, cl, text = placed(nodes_, shards)
            self.assertEqual((px["server_placement"], px["placement_from"]), ("dedicated", "default"), why)
            self.assertIn(why, text)
            self.assertIn("give --server-placement nodes if the shards run on the job's nodes", text)
        px, cl, text = placed(nodes, ["10.77.0.1", "10.77.0.2"], "--server-placement", "dedicated")
        self.assertEqual((px["server_placement"], px["placement_from"]), ("dedicated", "--server-placement"))
        p = make_probe(n=4)  # no shards probed: not known
        px = advise.proxy(advise.calibrate(p), advise.parse_args(["x.json"]))
        self.assertEqual((px["server_placement"], px["placement_from"]), ("dedicated", "default"))
        for bad, field in (([5], "ps.endpoint_addresses[0]"), ("10.0.0.1", "ps.endpoint_addresses must be a list")):
            q = with_rounds(make_probe(n=4), "ps", [1.0] * 4, servers=1)
            q["ps"]["endpoint_addresses"] = bad
            with self.assertRaises(advise.ProbeError) as e:
                advise.calibrate(q)
            self.assertIn(field, str(e.exception))
        q["ps"]["endpoint_addresses"] = ["10.0.0.1"]
        q["nodes"][2]["address"] = 17
        with self.assertRaises(advise.ProbeError) as e:
            advise.calibrate(q)
        self.assertIn("nodes[2].address = 17 must be an address string or null", str(e.exception))

    def test_dry_run_and_the_ablation_say_what_they_do(self):
        path = write_probe(with_rounds(make_probe(n=4), "ps", [1.0] * 4))
        rc, out, err = main_in_process([path, "--dry-run", "--out", os.path.join(mkdtemp(), "o")])
        self.assertEqual(rc, 0, err)
        self.assertIn("the probe timed BSP round trips to the servers (1 s)", out)
        rc, out, err = main_in_process([path, "--dry-run", "--no-exchange-calibration", "--out",
                                        os.path.join(mkdtemp(), "o")])
        self.assertEqual(rc, 0, err)
        self.assertIn("--no-exchange-calibration: every message at the links' measured bulk goodput", out)
        cl = advise.calibrate(with_rounds(make_probe(n=4), "ps", [1.0] * 4))
        px = advise.proxy(cl, advise.parse_args(["x.json"]))
        px.update(calibration="off", goodput={"ring": None, "ps": None})
        text = " ".join(advise.assumptions(cl, px, advise.CANDIDATES))
        self.assertIn("are not used (--no-exchange-calibration)", text)
        self.assertIn("the simulator models no packet loss,", text)
        px["calibration"] = "applied"
        text = " ".join(advise.assumptions(advise.calibrate(make_probe(n=4)), px, advise.CANDIDATES))
        self.assertIn("the probe timed no BSP round trips to the servers", text)
        self.assertIn("the probe timed no ring all-reduces", text)
        # Only the patterns the candidates use are stated.
        text = " ".join(advise.assumptions(cl, px, ["ring"]))
        self.assertNotIn("servers", text.split("the probe timed no ring")[0][-200:])
        self.assertNotIn("BSP round trips", text)


class Terminated(unittest.TestCase):
    """SIGTERM while the main thread waits for a simulated run (advise's plan runs them there): the
    handler stops the run and advise exits 143, without deadlocking on the interrupted wait (it did:
    the run killed, never reaped, advise.py asleep until SIGKILL)."""

    def test_sigterm_during_a_run_ends_the_run_and_exits(self):
        import signal
        import threading
        import cluster_runs
        old = signal.signal(signal.SIGTERM, advise._terminated)
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
        t0 = time.time()
        try:
            with open(os.devnull, "w") as null, self.assertRaises(SystemExit) as cm:
                timer.start()
                cluster_runs.run_group(["sleep", "60"], null)
        finally:
            timer.cancel()
            signal.signal(signal.SIGTERM, old)
        for t in threading.enumerate():
            if t.name == "advise-terminate":
                t.join(30)
        self.assertEqual(cm.exception.code, 143)
        self.assertLess(time.time() - t0, 20)
        self.assertEqual(len(cluster_runs._RUNNING), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
