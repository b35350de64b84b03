"""Validation loss against the bytes the nodes sent, for local SGD / DiLoCo against the per-step
modes: runs of scripts/smoke_local_sgd.sh with several seeds (OUT/s<seed>/<config>/node<i>/).

    usage: python experiments/loss_vs_bytes.py OUT [--configs a,b,c]

For every configuration: the final validation loss (mean over nodes, then over seeds, with the 95%
interval over seeds), the bytes all nodes sent, and a plot OUT/loss_vs_bytes.png of each
evaluation's mean validation loss against the bytes sent up to that step (log scale). Writes
OUT/loss_vs_bytes.json and prints a markdown table. Every pair of configurations is compared seed
by seed (paired t over the seeds both have, Holm-corrected across the pairs: experiments/method.py);
a pair is resolved only where its Holm p < 0.05, otherwise "not resolved"."""
import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import method  # noqa: E402
from stats import fmt_ci, mean_ci95  # noqa: E402


def curve(run_dir):
    """[(bytes sent by all nodes up to the step, mean val loss over nodes)] at each evaluation."""
    per_node = []
    for p in sorted(glob.glob(os.path.join(run_dir, "node*", "metrics.jsonl"))):
        sent, points = 0, {}
        for line in open(p):
            m = json.loads(line)
            sent += m.get("wire_bytes", 0) if "loss" in m else 0
            # per step (every node evaluates at the same steps); node 0's while_waiting points of a
            # parameter-server job share its last step and are not per-step points: left out
            if "val_loss" in m and not m.get("while_waiting", False):
                points[m["step"]] = (sent, m["val_loss"])
        per_node.append(points)
    if not per_node:
        return []
    steps = sorted(set.intersection(*(set(p) for p in per_node)))
    return [(sum(p[s][0] for p in per_node), sum(p[s][1] for p in per_node) / len(per_node), s) for s in steps]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", metavar="OUT", help="the runs' directory (OUT/s<seed>/<config>/node<i>/)")
    ap.add_argument("--configs", help="comma-separated configurations (default: every one found under OUT/s*/)")
    a = ap.parse_args(argv)
    out = a.out
    if not os.path.isdir(out):
        raise SystemExit(f"loss_vs_bytes: {out} is not a directory (run scripts/smoke_local_sgd.sh OUT first)")
    seeds = sorted(d for d in os.listdir(out) if d.startswith("s") and os.path.isdir(os.path.join(out, d)))
    configs = a.configs.split(",") if a.configs else sorted(
        {c for s in seeds for c in os.listdir(os.path.join(out, s)) if os.path.isdir(os.path.join(out, s, c))})
    result = {}
    for c in configs:
        by_seed = {s: curve(os.path.join(out, s, c)) for s in seeds}
        by_seed = {s: k for s, k in by_seed.items() if k}
        curves = list(by_seed.values())
        if not curves:
            continue
        result[c] = {"seeds": len(curves), "final_val_loss": mean_ci95([k[-1][1] for k in curves]),
                     "bytes_mb": mean_ci95([k[-1][0] / 1e6 for k in curves]), "curves": curves,
                     "per_seed": [{"seed": s, "final_val_loss": k[-1][1]} for s, k in by_seed.items()]}
    names = list(result)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    comparisons = method.comparisons(result, pairs, ["final_val_loss"])
    with open(os.path.join(out, "loss_vs_bytes.json"), "w") as f:
        json.dump({"configurations": result, "comparisons": comparisons}, f, indent=1)
    print("| configuration | seeds | final val loss (95% CI) | bytes sent, all nodes (MB) |")
    print("|---|---|---|---|")
    for c, r in result.items():
        print(f"| {c} | {r['seeds']} | {fmt_ci(r['final_val_loss'], 4)} | {r['bytes_mb']['mean']:.1f} |")
    for c in comparisons:
        print(f"- {method.sentence(c)}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib missing: no plot)")
        return 0
    plt.figure(figsize=(7, 4.5))
    for c, r in result.items():
        n = min(len(k) for k in r["curves"])
        xs = [sum(k[i][0] for k in r["curves"]) / len(r["curves"]) / 1e6 for i in range(n)]
        ys = [sum(k[i][1] for k in r["curves"]) / len(r["curves"]) for i in range(n)]
        plt.plot(xs, ys, marker="o", label=c)
    plt.xscale("log")
    plt.xlabel("bytes sent by all nodes (MB, log)")
    plt.ylabel(f"validation loss (mean of {len(seeds)} seeds)")
    plt.legend()
    plt.grid(alpha=0.3)
    plt.tight_layout()
    plt.savefig(os.path.join(out, "loss_vs_bytes.png"), dpi=120)
    print(f"plot: {os.path.join(out, 'loss_vs_bytes.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
