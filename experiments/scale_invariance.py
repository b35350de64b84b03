"""Does the emulation keep a scenario's communication/compute ratio whatever small model plays it?
(issue 31). The same scenario is emulated with two small models of different size (default micro
and tiny) for the ring, BSP and ASP, once with the trainer's default message sizes and once with the
sizes scaled by the bytes ratio (scenario.scaled_sizes). Each run's per-step communication time
relative to compute, median over node 0's steps 3.. of (step_s - modelled_s) / modelled_s, should
agree between the two models (within --tolerance, relative) if the emulation is scale-invariant.

  python experiments/scale_invariance.py [--scenario experiments/scenarios/comm_bound.toml]
      [--nodes 4] [--steps 12] [--step-time 0.5] [--presets micro,tiny] [--tolerance 0.15]
      [--out runs/scale_invariance]

Runs on scripts/local_cluster.sh with network namespaces (root), no overlap (the step is compute
then communication, so the difference is the communication), the scenario's link rate and latency
for each preset. Writes OUT/summary.json and prints a table. Every process a run starts is ended by
local_cluster.sh, on success, failure and interrupt.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenario as scen  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = {"ring": [], "bsp": ["--consistency", "bsp"], "asp": ["--consistency", "asp"]}


def run(a, sc, preset, mode, scaled, out):
    sc = json.loads(json.dumps(sc))
    sc["emulation"]["preset"] = preset
    em = scen.derive(sc, a.nodes, a.step_time)
    cmd = [os.path.join(ROOT, "scripts", "local_cluster.sh"), "--nodes", str(a.nodes), "--out", out,
           "--netns", "--link-gbit", f"{em['link_gbit']:.6g}", "--step-time", str(a.step_time)]
    if em["latency_ms"] > 0:
        cmd += ["--latency-ms", f"{em['latency_ms']:.6g}"]
    if mode != "ring":
        cmd += ["--servers", str(a.nodes), "--encrypt", "off"] + MODES[mode]
    cmd += ["--", f"--model.preset={preset}", f"--train.steps={a.steps}", f"--train.batch_size={em['batch']}",
            "--train.threads=1", "--eval.every=100000", "--eval.sample_tokens=0", "--checkpoint.every=0",
            "--dist.check_every=0", "--dist.overlap=false", "--dist.clip_scope=node",
            f"--data.cache_dir={ROOT}/data/cache"]
    sizes = scen.scaled_sizes(sc, a.nodes, a.nodes)
    if scaled:
        cmd += scen.size_flags(sizes)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "cluster.log"), "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        return {"failed": f"exit {rc}", "log": os.path.join(out, "cluster.log")}
    steps = [json.loads(l) for l in open(os.path.join(out, "node0", "metrics.jsonl")) if '"step_s"' in l]
    comm = [(s["step_s"] - s["modelled_s"]) / s["modelled_s"] for s in steps[2:]]
    overruns = sum(1 for s in steps if s.get("overrun"))
    return {"comm_over_compute": statistics.median(comm), "steps": len(steps), "overruns": overruns,
            "link_gbit": em["link_gbit"], "latency_ms": em["latency_ms"], "target_ratio": em["ratio"],
            "sizes": sizes["flags"] if scaled else "defaults", "counts": sizes["counts"] if scaled else None,
            "command": " ".join(cmd)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--scenario", default=os.path.join(ROOT, "experiments", "scenarios", "comm_bound.toml"))
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--step-time", type=float, default=0.5, help="modelled compute per step, s")
    ap.add_argument("--presets", default="micro,tiny", help="two small models, comma-separated")
    ap.add_argument("--modes", default="ring,bsp,asp")
    ap.add_argument("--sizes", default="defaults,scaled", help="which size policies to run (defaults, scaled)")
    ap.add_argument("--tolerance", type=float, default=0.15, help="relative difference allowed between the presets")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "scale_invariance"))
    a = ap.parse_args()
    presets = a.presets.split(",")
    modes = a.modes.split(",")
    if len(presets) != 2 or any(p not in scen.PRESET_PARAMS for p in presets):
        raise SystemExit(f"--presets needs two of {', '.join(scen.PRESET_PARAMS)}")
    if any(m not in MODES for m in modes):
        raise SystemExit(f"--modes: allowed {', '.join(MODES)}")
    if os.geteuid() != 0:
        raise SystemExit("scale_invariance: the runs use network namespaces, which need root")
    try:
        sc = scen.load(a.scenario)
    except scen.ScenarioError as e:
        raise SystemExit(f"scale_invariance: {e}")
    results = {}
    policies = a.sizes.split(",")
    if any(p not in ("defaults", "scaled") for p in policies):
        raise SystemExit("--sizes: defaults, scaled or both")
    for scaled in [p == "scaled" for p in policies]:
        for mode in modes:
            for p in presets:
                key = f"{'scaled' if scaled else 'defaults'}/{mode}/{p}"
                print(f"[scale] {key}", flush=True)
                results[key] = run(a, sc, p, mode, scaled, os.path.join(a.out, key.replace("/", "_")))
    rows = []
    for scaled in policies:
        for mode in modes:
            r = [results[f"{scaled}/{mode}/{p}"] for p in presets]
            if any("failed" in x for x in r):
                rows.append({"sizes": scaled, "mode": mode, "failed": [x.get("failed") for x in r]})
                continue
            x, y = (v["comm_over_compute"] for v in r)
            rel = abs(x - y) / max(abs(x), abs(y), 1e-9)
            rows.append({"sizes": scaled, "mode": mode, presets[0]: x, presets[1]: y, "relative_difference": rel,
                         "invariant": rel <= a.tolerance, "overruns": [v["overruns"] for v in r]})
    summary = {"scenario": a.scenario, "nodes": a.nodes, "steps": a.steps, "step_time_s": a.step_time,
               "tolerance": a.tolerance, "rows": rows, "runs": results}
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"| sizes | mode | {presets[0]} comm/compute | {presets[1]} comm/compute | relative difference | within {a.tolerance:.0%} |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "failed" in r:
            print(f"| {r['sizes']} | {r['mode']} | failed: {r['failed']} | | | |")
        else:
            print(f"| {r['sizes']} | {r['mode']} | {r[presets[0]]:.3f} | {r[presets[1]]:.3f} | "
                  f"{r['relative_difference']:.1%} | {'yes' if r['invariant'] else 'no'} |")
    print(f"[scale] summary: {os.path.join(a.out, 'summary.json')}")


if __name__ == "__main__":
    main()
