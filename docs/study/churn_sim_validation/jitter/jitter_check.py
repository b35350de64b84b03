import json, os, subprocess, sys, argparse
sys.path.insert(0, "experiments")
import churn, churn_sim
a = churn.parse_args(["run", "--backend", "sim", "--sim-start-s", "0.461", "--out", "runs/csv_jitter", "--configs", "ps_asp"])
res = {}
for name in ("ps_asp", "ps_diloco_elastic", "ps_async_local_sgd"):
    for seed in range(60, 70):
        for jit in (0.0, 0.01, 0.02):
            out = f"runs/csv_jitter/{name}/s{seed}/j{jit}"
            cmd = churn_sim.command(a, name, seed, [], out) + [f"--emulate.jitter={jit}"]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            fin = [json.loads(l) for l in open(out + "/node0/metrics.jsonl") if "job_final" in l][-1]["val_loss"]
            res.setdefault(name, {}).setdefault(seed, {})[jit] = fin
json.dump(res, open("runs/csv_jitter/res.json", "w"), indent=1)
for name, d in res.items():
    rel = [abs(v[j] / v[0.0] - 1) for v in d.values() for j in (0.01, 0.02)]
    print(name, "median |change| %.2f%%, max %.2f%%" % (100 * sorted(rel)[len(rel)//2], 100 * max(rel)))
    for s, v in d.items(): print("  ", s, " ".join(f"{v[j]:.4f}" for j in (0.0, 0.01, 0.02)))
