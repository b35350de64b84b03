"""Staleness sweep, one command: the same job under SSP with each staleness bound, and ASP (no
bound), each with every chosen staleness mitigation, on a simulated cluster with a straggler.

  python experiments/staleness_sweep.py [--bounds 0,1,2,4,8] [--asp] [--mitigations none,lr_scale,dc_asgd]
                                        [--nodes 4] [--steps 300] [--slow-node 3 --slowdown 2] [--out runs/sweep]

Writes OUT/report.md (a row per configuration: tokens/s, staleness mean and max, final validation
loss, train loss at equal wall-clock time), OUT/summary.json, OUT/loss_vs_time.png and
OUT/val_loss_vs_bound.png (final validation loss against the bound, one line per mitigation).
"""
import argparse
import os
import sys

from cluster_runs import add_job_args, run, write_outputs


def main():
    ap = argparse.ArgumentParser()
    add_job_args(ap, "sweep")
    ap.add_argument("--bounds", default="0,1,2,4,8")
    ap.add_argument("--asp", action=argparse.BooleanOptionalAction, default=True, help="also run ASP (no bound)")
    ap.add_argument("--mitigations", default="none")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    results, by_mitigation = {}, {}
    for mit in a.mitigations.split(","):
        configs = [(f"ssp s={b}", ["--consistency", "ssp", "--staleness-bound", b], int(b)) for b in a.bounds.split(",")]
        if a.asp:
            configs.append(("asp", ["--consistency", "asp"], None))
        for label, args, bound in configs:
            name = label if mit == "none" else f"{label} {mit}"
            results[name] = run(name.replace(" ", "_").replace("=", ""), args + ["--mitigation", mit], a)
            by_mitigation.setdefault(mit, []).append((bound, results[name]["val_loss"]))
    write_outputs(results, a,
                  f"Staleness sweep: {a.nodes} nodes, preset {a.preset}, batch {a.batch}/node, {a.steps} steps/node, "
                  f"node {a.slow_node} slowed {a.slowdown}x, {a.servers} server shards",
                  f"python experiments/staleness_sweep.py {' '.join(sys.argv[1:])}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        plt.figure()
        for mit, pts in by_mitigation.items():
            bounded = [(b, v) for b, v in pts if b is not None]
            line, = plt.plot([b for b, _ in bounded], [v for _, v in bounded], marker="o", label=f"ssp, {mit}")
            for b, v in pts:
                if b is None:
                    plt.axhline(v, linestyle="--", color=line.get_color(), label=f"asp, {mit}")
        plt.xlabel("staleness bound s")
        plt.ylabel("final validation loss (mean over nodes)")
        plt.legend()
        plt.savefig(os.path.join(a.out, "val_loss_vs_bound.png"), dpi=100)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
