"""scripts/gpu_check_report.py without a GPU (issue 28): every comparison passes on synthetic input
within its tolerance and fails on the same input perturbed just beyond it; the checkpoint reader
refuses what is not a Syncopate checkpoint; bus bandwidth, MFU and the peak table; the report's
assembly (statuses, a hang, the dry headline) and its round trip through report.json. Fast (< 10 s),
no binaries, no processes."""
import contextlib
import io
import json
import math
import os
import struct
import sys
import tempfile
import unittest

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import gpu_check_report as g  # noqa: E402

_SCRATCH = tempfile.TemporaryDirectory(prefix="syncopate-gpu-check-test-")


def mkdtemp():
    return tempfile.mkdtemp(dir=_SCRATCH.name)


def read(path):
    with open(path) as f:
        return f.read()


def steps(losses, norms=None):
    norms = norms or [1.0 + 0.1 * i for i in range(len(losses))]
    return [{"step": i + 1, "loss": l, "grad_norm": n, "tokens_per_s": 1000.0, "wait_s": 0.01}
            for i, (l, n) in enumerate(zip(losses, norms))]


def weights(seed=0, n=4096):
    rng = np.random.default_rng(seed)
    return {"wte.weight": rng.normal(0, 0.02, (n // 64, 64)).astype(np.float32),
            "h.0.ln_1.weight": (1 + rng.normal(0, 0.01, 64)).astype(np.float32),
            "h.0.attn.c_attn.bias": rng.normal(0, 0.005, 192).astype(np.float32)}


def nudge_ulps(x, k):
    """x moved k float32 ulps away from zero (same sign)."""
    i = x.view(np.int32).copy()
    return (i + np.int32(k)).view(np.float32)


def write_safetensors(path, tensors, metadata=None, dtype="F32", tamper=None):
    header, body, off = {}, b"", 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        raw = np.ascontiguousarray(t, dtype="<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        body += raw
        off += len(raw)
    if tamper:
        tamper(header)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + body)


SYN_META = {"format": "pt", "syncopate.n_head": "2", "syncopate.vocab_size": "257"}


def write_run(d, rows, params, step=None):
    """A run directory as syncopate-worker --out leaves it."""
    step = step or rows[-1]["step"]
    ck = os.path.join(d, "checkpoints", f"step_{step:06d}")
    os.makedirs(ck)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        f.write(json.dumps({"step": step, "val_loss": 4.0, "eval_of": "replica"}) + "\n")  # not a step record
    with open(os.path.join(d, "checkpoints", "latest"), "w") as f:
        f.write(f"step_{step:06d}\n")
    with open(os.path.join(ck, "meta.json"), "w") as f:
        json.dump({"step": step, "tokens": 1}, f)
    write_safetensors(os.path.join(ck, "model.safetensors"), params, SYN_META)
    return d


class Comparisons(unittest.TestCase):
    def test_every_row_is_complete_and_ordered(self):
        for name, t in g.TOLERANCES.items():
            self.assertEqual(set(t), {"loss_rtol", "grad_norm_rtol", "param_rel_l2", "param_ulps_p99"}, name)
            self.assertIn(name, g.TOLERANCE_NOTES)
        # bf16 and the device comparison are looser than fp32's reordering, in every metric
        for k in g.TOLERANCES["fp32"]:
            self.assertLess(g.TOLERANCES["fp32"][k], g.TOLERANCES["bf16"][k])
            self.assertLess(g.TOLERANCES["fp32"][k], g.TOLERANCES["device"][k])

    def test_losses_pass_within_and_fail_just_beyond_the_tolerance(self):
        for row, tol in g.TOLERANCES.items():
            base = [5.0, 4.5, 4.2, 4.0]
            r = tol["loss_rtol"]
            inside = [x * (1 + 0.9 * r) for x in base]
            beyond = list(base)
            beyond[2] = base[2] * (1 + 1.1 * r)
            ok = g.compare_losses(steps(base), steps(inside), tol)
            self.assertTrue(ok["ok"], (row, ok))
            bad = g.compare_losses(steps(base), steps(beyond), tol)
            self.assertFalse(bad["ok"], (row, bad))
            self.assertEqual(bad["worst_step"], 3)
            self.assertAlmostEqual(bad["max_rel"], 1.1 * r / (1 + 1.1 * r), delta=1e-3 * r)

    def test_grad_norms_pass_within_and_fail_just_beyond(self):
        tol = g.TOLERANCES["fp32"]
        r = tol["grad_norm_rtol"]
        a = steps([5.0] * 3, [2.0, 1.5, 1.2])
        self.assertTrue(g.compare_grad_norms(a, steps([5.0] * 3, [2.0 * (1 + 0.9 * r), 1.5, 1.2]), tol)["ok"])
        self.assertFalse(g.compare_grad_norms(a, steps([5.0] * 3, [2.0, 1.5, 1.2 * (1 + 1.1 * r)]), tol)["ok"])

    def test_series_refuse_other_steps_and_non_finite_values(self):
        tol = g.TOLERANCES["fp32"]
        self.assertIn("different steps", g.compare_losses(steps([1.0, 2.0]), steps([1.0, 2.0, 3.0]), tol)["error"])
        self.assertIn("not finite", g.compare_losses(steps([1.0, 2.0]), steps([1.0, math.nan]), tol)["error"])
        self.assertFalse(g.compare_losses([], [], tol)["ok"])

    def test_ulp_distance(self):
        one = np.float32(1.0)
        self.assertEqual(int(g.ulp_distance(np.array([one]), np.array([np.nextafter(one, np.float32(2))]))[0]), 1)
        self.assertEqual(int(g.ulp_distance(np.array([0.0], np.float32), np.array([-0.0], np.float32))[0]), 0)
        # across zero: the smallest subnormals either side are 2 ulps apart
        tiny = np.array([1e-45], np.float32)
        self.assertEqual(int(g.ulp_distance(tiny, -tiny)[0]), 2)
        x = np.array([0.02, -3.5, 1e-6], np.float32)
        self.assertEqual(g.ulp_distance(x, nudge_ulps(x, 7)).tolist(), [7, 7, 7])

    def test_params_ulps_p99_passes_within_and_fails_just_beyond(self):
        for row, tol in g.TOLERANCES.items():
            a = weights()
            u = int(tol["param_ulps_p99"])
            inside = {k: nudge_ulps(v, u) for k, v in a.items()}  # every element exactly at the limit
            r = g.compare_params(a, inside, dict(tol, param_rel_l2=1.0))
            self.assertTrue(r["ok"], (row, r))
            self.assertEqual(r["ulps_p99"], u)
            beyond = {k: nudge_ulps(v, u + 1) for k, v in a.items()}
            r = g.compare_params(a, beyond, dict(tol, param_rel_l2=1.0))
            self.assertFalse(r["ok"], (row, r))

    def test_params_p99_ignores_one_percent_of_wild_elements_but_not_two(self):
        # AdamW's noise-driven elements (the key bias): up to 1% may be anywhere; more fails.
        tol = dict(g.TOLERANCES["fp32"], param_rel_l2=1.0)
        a = {"w": np.random.default_rng(1).normal(0, 0.02, 10000).astype(np.float32)}
        few = {"w": a["w"].copy()}
        few["w"][:90] = -few["w"][:90]  # 0.9%: sign flips, ~1e9 ulps each
        r = g.compare_params(a, few, tol)
        self.assertTrue(r["ok"], r)
        self.assertGreater(r["ulps_max"], 10**8)
        many = {"w": a["w"].copy()}
        many["w"][:200] = -many["w"][:200]
        self.assertFalse(g.compare_params(a, many, tol)["ok"])

    def test_params_rel_l2_passes_within_and_fails_just_beyond(self):
        for row, tol in g.TOLERANCES.items():
            a = {k: v.astype(np.float64) for k, v in weights().items()}
            norm = math.sqrt(sum(float((v ** 2).sum()) for v in a.values()))
            d = np.random.default_rng(2)
            direction = {k: d.normal(0, 1, v.shape) for k, v in a.items()}
            dn = math.sqrt(sum(float((v ** 2).sum()) for v in direction.values()))
            loose = dict(tol, param_ulps_p99=2**31)

            def moved(f):
                return {k: (a[k] + f * tol["param_rel_l2"] * norm * direction[k] / dn).astype(np.float32) for k in a}
            a32 = {k: v.astype(np.float32) for k, v in a.items()}
            self.assertTrue(g.compare_params(a32, moved(0.9), loose)["ok"], row)
            self.assertFalse(g.compare_params(a32, moved(1.1), loose)["ok"], row)

    def test_params_refuse_mismatched_or_non_finite_weights(self):
        tol = g.TOLERANCES["fp32"]
        a = weights()
        b = dict(a)
        del b["wte.weight"]
        self.assertIn("names or shapes", g.compare_params(a, b, tol)["error"])
        c = {k: v.copy() for k, v in a.items()}
        c["h.0.ln_1.weight"][3] = np.inf
        self.assertIn("non-finite", g.compare_params(a, c, tol)["error"])

    def test_a_whole_comparison_and_its_control(self):
        tol = g.TOLERANCES["fp32"]
        a = (steps([5.0, 4.0, 3.5]), weights())
        same = g.compare_run_data(a, a, tol)
        self.assertEqual((same["status"], same["exceeded"]), ("pass", []))
        off = (steps([5.0, 4.0, 3.5 * (1 + 2 * tol["loss_rtol"])]), weights())
        bad = g.compare_run_data(a, off, tol, floor={"name": "f", "metrics": {"loss_max_rel": 0.0}})
        self.assertEqual((bad["status"], bad["exceeded"]), ("fail", ["loss"]))
        self.assertEqual(bad["floor"]["name"], "f")
        # a control must differ: the same perturbation passes it, identical runs fail it
        self.assertEqual(g.compare_run_data(a, off, tol, expect="differ")["status"], "pass")
        self.assertEqual(g.compare_run_data(a, a, tol, expect="differ")["status"], "fail")
        # an unreadable comparison is a failure, also for a control
        short = (steps([5.0, 4.0]), weights())
        self.assertEqual(g.compare_run_data(a, short, tol, expect="differ")["status"], "fail")

    def test_a_noise_floor_beyond_the_row_raises_the_limits_and_is_info(self):
        tol = g.TOLERANCES["fp32"]
        a = (steps([5.0, 4.0, 3.5]), weights())
        off = (steps([5.0, 4.0, 3.5 * (1 + 3 * tol["loss_rtol"])]), weights())  # 3x the row's loss limit
        # the floor (two identical runs) that far apart is information, not a failure
        fl = g.compare_run_data(a, off, tol, expect="floor")
        self.assertEqual((fl["status"], fl["exceeded"], fl["raised_by_floor"]), ("info", ["loss"], []))
        floor = {"name": "f", "metrics": fl["metrics"]}
        # a comparison within 2x that floor passes, with the raised limit named; beyond it, fails
        within = g.compare_run_data(a, off, tol, floor=floor)
        self.assertEqual((within["status"], within["raised_by_floor"]), ("pass", ["loss_rtol"]))
        self.assertAlmostEqual(within["tolerance"]["loss_rtol"], g.FLOOR_FACTOR * fl["metrics"]["loss_max_rel"])
        far = (steps([5.0, 4.0, 3.5 * (1 + 7 * tol["loss_rtol"])]), weights())
        self.assertEqual(g.compare_run_data(a, far, tol, floor=floor)["exceeded"], ["loss"])
        # a control hidden by the floor fails: the floor is too large to tell the change apart
        self.assertEqual(g.compare_run_data(a, off, tol, floor=floor, expect="differ")["status"], "fail")
        # identical runs beyond FLOOR_CAP x the row are a fault
        wild = (steps([5.0, 4.0, 3.5 * (1 + 1.5 * g.FLOOR_CAP * tol["loss_rtol"])]), weights())
        bad = g.compare_run_data(a, wild, tol, expect="floor")
        self.assertEqual(bad["status"], "fail")
        self.assertIn("fault", bad["error"])
        # a floor below the row leaves the row as it is
        small = {"name": "f", "metrics": {"loss_max_rel": tol["loss_rtol"] / 10}}
        self.assertEqual(g.compare_run_data(a, off, tol, floor=small)["status"], "fail")

    def test_rejudge_applies_todays_rule_to_recorded_metrics(self):
        tol = g.TOLERANCES["bf16"]
        with tempfile.TemporaryDirectory() as out:
            sec = os.path.join(out, "sections", "correctness")
            floor_m = {"loss_max_rel": 7e-3, "grad_norm_max_rel": 0.047, "param_rel_l2": 4e-4, "param_ulps_p99": 4.3e5}
            near = {"loss_max_rel": 2e-4, "grad_norm_max_rel": 2e-3, "param_rel_l2": 2e-4, "param_ulps_p99": 1.2e5}
            recorded = [  # as an older report wrote them: floors as plain comparisons, no raised limits
                dict(kind="compare", name="noise floor bf16: two identical runs of 1 x 1", tol_row="bf16", expect="match",
                     status="fail", metrics=floor_m, exceeded=["loss"], tolerance=dict(tol)),
                dict(kind="compare", name="checkpointing on vs off", tol_row="bf16", expect="match", status="fail",
                     metrics=near, exceeded=["param_ulps_p99"], tolerance=dict(tol),
                     floor={"name": "noise floor bf16: two identical runs of 1 x 1", "metrics": floor_m}),
                dict(kind="record", name="run x", status="fail", reason="exited 139")]
            for c in recorded:
                g.append_check(sec, c)
            self.assertEqual(g.rejudge_sections(out), 2)
            got = {c["name"]: c for c in g.read_checks(sec)}
            self.assertEqual(got["noise floor bf16: two identical runs of 1 x 1"]["status"], "info")
            self.assertEqual(got["checkpointing on vs off"]["status"], "pass")
            self.assertIn("param_ulps_p99", got["checkpointing on vs off"]["raised_by_floor"])
            self.assertEqual(got["run x"]["status"], "fail")  # records are left as they are


class Checkpoints(unittest.TestCase):
    def test_reader_round_trip_and_refusals(self):
        d = mkdtemp()
        w = weights()
        p = os.path.join(d, "m.safetensors")
        write_safetensors(p, w, SYN_META)
        got = g.read_safetensors(p)
        self.assertEqual(sorted(got), sorted(w))
        for k in w:
            np.testing.assert_array_equal(got[k], w[k])
        cases = {
            "format": lambda: write_safetensors(p, w, {"format": "np", "syncopate.n_head": "2", "syncopate.vocab_size": "1"}),
            "syncopate.n_head": lambda: write_safetensors(p, w, {"format": "pt"}),
            "expected F32": lambda: write_safetensors(p, w, SYN_META, dtype="BF16"),
            "offsets": lambda: write_safetensors(p, w, SYN_META,
                                                 tamper=lambda h: h["wte.weight"].update(data_offsets=[0, 8])),
        }
        for want, make in cases.items():
            make()
            with self.assertRaises(ValueError) as e:
                g.read_safetensors(p)
            self.assertIn(want, str(e.exception))
        with open(p, "wb") as f:
            f.write(b"\x01")
        with self.assertRaises(ValueError):
            g.read_safetensors(p)

    def test_read_run_and_a_job_of_two_nodes(self):
        rows = steps([5.0, 4.0, 3.0])
        a = write_run(os.path.join(mkdtemp(), "a"), rows, weights())
        got_rows, got_w, step = g.read_run(a)
        self.assertEqual(step, 3)
        self.assertEqual([r["step"] for r in got_rows], [1, 2, 3])  # the evaluation record left out
        # two nodes: each logs its own replicas' mean; the job's loss is the mean over nodes
        b = write_run(os.path.join(mkdtemp(), "b"), steps([7.0, 6.0, 5.0]), weights())
        job_rows, _, _ = g.read_run(f"{a},{b}")
        self.assertEqual([r["loss"] for r in job_rows], [6.0, 5.0, 4.0])
        c = write_run(os.path.join(mkdtemp(), "c"), steps([7.0, 6.0]), weights(), step=2)
        with self.assertRaises(ValueError):
            g.read_run(f"{a},{c}")


class Numbers(unittest.TestCase):
    def test_bus_bandwidth_is_nccl_tests(self):
        alg, bus = g.bus_bandwidth("all_reduce", 1e9, 1.0, 8)
        self.assertAlmostEqual(alg, 1.0)
        self.assertAlmostEqual(bus, 1.75)
        self.assertAlmostEqual(g.bus_bandwidth("reduce_scatter", 1e9, 0.5, 4)[1], 1.5)
        self.assertAlmostEqual(g.bus_bandwidth("all_gather", 1e9, 0.5, 4)[1], 1.5)
        rows = g.parse_bench_table("size_bytes time_us algbw_GBps busbw_GBps\n1048576 1000.0 1.049 1.835\n")
        self.assertEqual(g.check_bandwidth_rows(rows, "all_reduce", 8), [])
        rows[0]["busbw"] *= 1.5  # a wrong factor is caught
        self.assertTrue(g.check_bandwidth_rows(rows, "all_reduce", 8))
        self.assertEqual(g.check_bandwidth_rows([], "all_reduce", 8), ["no rows"])

    def test_nccl_tests_rows(self):
        text = ("#       size         count      type   redop    root     time   algbw   busbw #wrong\n"
                "     1048576        262144     float     sum      -1    37.52   27.95   48.91      0    36.73   28.55   49.96      0\n"
                "# Avg bus bandwidth    : 49.4\n")
        rows = g.parse_nccl_tests(text)
        self.assertEqual(rows, [{"size": 1048576, "time_us": 37.52, "algbw": 27.95, "busbw": 48.91}])
        self.assertEqual(g.check_bandwidth_rows(rows, "all_reduce", 8), [])

    def test_allreduce_from_wait(self):
        one = steps([1.0] * 12)
        many = [dict(r, wait_s=0.01 + 0.002) for r in one]
        row, w = g.allreduce_from_wait(one, many, 8, 4_000_000)
        self.assertAlmostEqual(row["time_us"], 2000.0, places=3)
        self.assertAlmostEqual(row["busbw"], 4e6 / 2e-3 / 1e9 * 1.75)
        self.assertIsNone(g.allreduce_from_wait(one, one, 8, 4_000_000)[0])  # no positive difference

    def test_flops_mirror_the_cpp_formula(self):
        # model/gpt_config.cpp: GPT-2 124M has 124,475,904 parameters with the padded vocabulary 50304
        self.assertEqual(g.gpt_num_params(g.PRESETS["gpt2"]), 124475904)
        # micro: 124672 with the vocabulary padded to 320 rows; a checkpoint stores 257 (120640 values)
        self.assertEqual(g.gpt_num_params(g.PRESETS["micro"]), 120640 + (320 - 257) * 64)
        self.assertAlmostEqual(g.gpt_train_flops_per_token(g.PRESETS["gpt2"]),
                               6 * 124475904 + 12 * 12 * 1024 * 768)
        self.assertAlmostEqual(g.mfu(1e5, 1e9, 2, 100.0), 1e5 * 1e9 / (2 * 100e12))

    def test_peaks(self):
        self.assertEqual(g.peak_tflops("NVIDIA H100 80GB HBM3", "bf16")[0], 989.0)
        self.assertEqual(g.peak_tflops("NVIDIA H100 80GB HBM3", "fp32")[0], 67.0)
        self.assertEqual(g.peak_tflops("NVIDIA H100 80GB HBM3", "tf32")[0], 494.0)
        self.assertEqual(g.peak_tflops("NVIDIA H200", "bf16")[0], 989.0)
        self.assertEqual(g.peak_tflops("NVIDIA A100-SXM4-80GB", "bf16")[0], 312.0)
        self.assertEqual(g.peak_tflops("NVIDIA A100-SXM4-80GB", "tf32")[0], 156.0)
        self.assertEqual(g.peak_tflops("NVIDIA H100 PCIe", "bf16")[0], 756.0)  # not the SXM's
        none, why = g.peak_tflops("NVIDIA GeForce RTX 4090", "bf16")
        self.assertIsNone(none)
        self.assertIn("--peak-tflops", why)
        self.assertIsNone(g.peak_tflops("", "bf16")[0])

    def test_steady_state_median(self):
        self.assertEqual(g.median_steady(list(range(20))), 12)  # after the first 5
        self.assertEqual(g.median_steady([9.0, 1.0, 2.0, 3.0]), 2.5)  # few: the second half
        self.assertIsNone(g.median_steady([]))


class Report(unittest.TestCase):
    def section(self, out, name, checks=(), rc=0, hang=None, skipped=None):
        d = os.path.join(out, "sections", name)
        os.makedirs(d, exist_ok=True)
        for c in checks:
            g.append_check(d, dict(c))
        if rc is not None:
            with open(os.path.join(d, "rc"), "w") as f:
                f.write(f"{rc}\n")
        with open(os.path.join(d, "wall_s"), "w") as f:
            f.write("1.5\n")
        if hang:
            with open(os.path.join(d, "hang.json"), "w") as f:
                json.dump(hang, f)
        if skipped:
            with open(os.path.join(d, "skipped.txt"), "w") as f:
                f.write(skipped)
        return d

    def test_statuses_and_round_trip(self):
        out = mkdtemp()
        os.makedirs(os.path.join(out, "sections", "versions"))
        with open(os.path.join(out, "sections", "versions", "versions.json"), "w") as f:
            json.dump({"gpu_model": "none (dry run)", "gpu_count": 0, "driver": "none (dry run)"}, f)
        self.section(out, "versions", [{"name": "v", "status": "info"}])
        a = (steps([5.0, 4.0, 3.5]), weights())
        cmp = dict(g.compare_run_data(a, a, g.TOLERANCES["fp32"]), name="layouts fp32")
        self.section(out, "correctness", [cmp, {"name": "bucket log", "status": "pass"}])
        self.section(out, "communication", [{"name": "nccl-tests", "status": "skipped", "reason": "GPU only"},
                                            {"kind": "comm", "name": "torch all_reduce", "status": "info", "impl": "torch",
                                             "op": "all_reduce", "ranks": 8,
                                             "rows": [{"size": 1, "time_us": 1.0, "algbw": 1.0, "busbw": 1.75}]}])
        self.section(out, "gpu_tests", [{"name": "t", "status": "skipped", "reason": "no GPU"}])
        r = g.assemble(out, dry=True, wall_s=12.0, command="scripts/gpu_check.sh --dry")
        st = {s["name"]: s["status"] for s in r["sections"]}
        self.assertEqual(st, {"versions": "pass", "correctness": "pass", "communication": "pass", "gpu_tests": "skipped"})
        self.assertEqual(r["verdict"], "pass")
        self.assertFalse(r["gpu_result"])
        self.assertEqual(r["headline"], "dry run (CPU): no GPU result")
        with open(os.path.join(out, "report.json")) as f:
            back = json.load(f)
        self.assertEqual(back["schema"], g.SCHEMA)
        self.assertEqual([s["status"] for s in back["sections"]], [s["status"] for s in r["sections"]])
        corr = [s for s in back["sections"] if s["name"] == "correctness"][0]
        self.assertEqual(corr["checks"][0]["metrics"], json.loads(json.dumps(cmp["metrics"])))
        md = read(os.path.join(out, "report.md"))
        self.assertIn("dry run (CPU): no GPU result", md)
        self.assertIn("| layouts fp32 | **pass** |", md)
        self.assertIn("Verdict: PASS", md)

    def test_a_hang_a_failure_and_a_crashed_section_fail_the_verdict(self):
        out = mkdtemp()
        self.section(out, "correctness", [{"name": "run acc32", "status": "pass"}], rc=143,
                     hang={"timeout_s": 5, "stack_tool": "gdb", "stacks_file": "/x/stacks.txt",
                           "processes": ["12:syncopate-worke"], "excerpt": "#0  0x1 in poll ()"})
        self.section(out, "failure", [{"name": "clean exit", "status": "fail", "reason": "exited 1"}])
        self.section(out, "throughput", [], rc=2)
        self.section(out, "communication", [], rc=None)  # killed before it wrote its exit status
        self.section(out, "gpu_tests", [], rc=0)  # ended well but checked nothing
        r = g.assemble(out, dry=False)
        st = {s["name"]: s for s in r["sections"]}
        self.assertEqual(st["correctness"]["status"], "hang")
        self.assertIn("gdb", st["correctness"]["reason"])
        self.assertEqual(st["failure"]["status"], "fail")
        self.assertIn("exited 1", st["failure"]["reason"])
        self.assertEqual(st["throughput"]["status"], "fail")
        self.assertEqual(st["communication"]["status"], "fail")
        self.assertIn("no check", st["gpu_tests"]["reason"])
        self.assertEqual(r["verdict"], "fail")
        self.assertEqual(sorted(r["failed_sections"]), ["communication", "correctness", "failure", "gpu_tests", "throughput"])
        md = read(os.path.join(out, "report.md"))
        self.assertIn("## correctness: hang", md)
        self.assertIn("#0  0x1 in poll ()", md)
        self.assertNotIn("no GPU result", md)

    def test_write_hang_and_interrupted(self):
        out = mkdtemp()
        d = self.section(out, "throughput", [], rc=143)
        stacks = os.path.join(d, "stacks.txt")
        with open(stacks, "w") as f:
            f.write("===== pid 7 (syncopate-worke): w\n" + "".join(f"#{i} frame\n" for i in range(30)))
        h = g.write_hang(d, 60.0, "gdb", "7:syncopate-worke 6:bash", "", stacks)
        self.assertEqual(h["processes"], ["7:syncopate-worke", "6:bash"])
        self.assertEqual(len(h["excerpt"].splitlines()), 12)  # the header and its first frames
        self.assertEqual(g.section_status(d)["status"], "hang")
        self.section(out, "failure", [], rc=None, skipped="interrupted (Ctrl-C or SIGTERM)")
        r = g.assemble(out, dry=True, interrupted=True)
        self.assertEqual({s["name"]: s["status"] for s in r["sections"]}, {"throughput": "hang", "failure": "skipped"})
        self.assertEqual(r["verdict"], "fail")

    def test_check_statuses_are_validated(self):
        with self.assertRaises(ValueError):
            g.append_check(mkdtemp(), {"name": "x", "status": "ok"})


class CommandLine(unittest.TestCase):
    def setUp(self):  # the commands print a line per check: kept out of the test's output
        self._quiet = contextlib.redirect_stdout(io.StringIO())
        self._quiet.__enter__()

    def tearDown(self):
        self._quiet.__exit__(None, None, None)

    def test_compare_command_on_run_directories(self):
        sec = mkdtemp()
        a = write_run(os.path.join(mkdtemp(), "a"), steps([5.0, 4.0, 3.0]), weights())
        b = write_run(os.path.join(mkdtemp(), "b"), steps([5.0, 4.0, 3.0 * 1.01]), weights())
        self.assertEqual(g.main(["compare", "--sec", sec, "--name", "floor", "--a", a, "--b", a, "--tol", "fp32"]), 0)
        g.main(["compare", "--sec", sec, "--name", "ab", "--a", a, "--b", b, "--tol", "fp32", "--floor", "floor"])
        g.main(["compare", "--sec", sec, "--name", "missing", "--a", a, "--b", os.path.join(sec, "nope"), "--tol", "fp32"])
        got = {c["name"]: c for c in g.read_checks(sec)}
        self.assertEqual(got["floor"]["status"], "pass")
        self.assertEqual((got["ab"]["status"], got["ab"]["exceeded"]), ("fail", ["loss"]))
        self.assertEqual(got["ab"]["floor"]["metrics"]["loss_max_rel"], 0.0)
        self.assertEqual(got["missing"]["status"], "fail")
        self.assertIn("cannot read", got["missing"]["error"])

    def test_expect_exit(self):
        sec = mkdtemp()
        log = os.path.join(sec, "w.log")
        with open(log, "w") as f:
            f.write("syncopate-worker: error: injected failure in backward (SYNCOPATE_FAIL_AT)\n")
        base = ["expect-exit", "--sec", sec, "--log", log, "--bound", "30"]
        g.main(base + ["--name", "ok", "--rc", "1", "--wall", "3", "--cause", "injected failure in backward"])
        g.main(base + ["--name", "slow", "--rc", "1", "--wall", "31", "--cause", "injected failure in backward"])
        g.main(base + ["--name", "unnoticed", "--rc", "0", "--wall", "3", "--cause", "injected failure in backward"])
        g.main(base + ["--name", "killed", "--rc", "124", "--wall", "3", "--cause", "injected failure in backward"])
        g.main(base + ["--name", "other cause", "--rc", "1", "--wall", "3", "--cause", "did not connect"])
        m = os.path.join(sec, "metrics.jsonl")
        with open(m, "w") as f:
            f.write(json.dumps({"step": 1, "tokens_per_s": 1.0, "unix_s": 1000.0}) + "\n")
        g.main(base + ["--name", "clean", "--rc", "0", "--wall", "3", "--clean", "--metrics", m, "--end-unix", "1002", "--exit-bound", "5"])
        g.main(base + ["--name", "lingers", "--rc", "0", "--wall", "9", "--clean", "--metrics", m, "--end-unix", "1008", "--exit-bound", "5"])
        got = {c["name"]: c["status"] for c in g.read_checks(sec)}
        self.assertEqual(got, {"ok": "pass", "slow": "fail", "unnoticed": "fail", "killed": "fail", "other cause": "fail",
                               "clean": "pass", "lingers": "fail"})


if __name__ == "__main__":
    try:
        unittest.main()
    finally:
        _SCRATCH.cleanup()
