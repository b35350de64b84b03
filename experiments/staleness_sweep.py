"""Staleness sweep on an emulated cluster, one command: SSP with each bound and ASP (no bound),
each with every chosen mitigation, under the same study method as the A/B (experiments/study.py:
one budget with fitted schedules, learning rates tuned on their own seeds, paired comparisons with
Holm's correction; each mitigation is compared with the same bound without it, at that one's own
tuned learning rate; invalid emulations left out):

  python experiments/staleness_sweep.py [--bounds 0,1,2,4,8] [--asp] [--mitigations none,lr_scale,dc_asgd]
        [--scenario FILE] [--seeds 3] [--nodes 8] [--steps 60] [--out runs/sweep] [--dry-run]

Writes what the A/B writes (experiments/study.py) and OUT/val_loss_vs_bound.png: final validation
loss against the bound, one line per mitigation, ASP as a dashed line.
"""
import argparse
import os
import sys

from study import add_args, run_study
from plotting import pyplot
from cluster_runs import exit_on_sigterm


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(ap, "sweep")
    ap.add_argument("--bounds", default="0,1,2,4,8")
    ap.add_argument("--asp", action=argparse.BooleanOptionalAction, default=True, help="also run ASP (no bound)")
    ap.add_argument("--mitigations", default="none")
    a = ap.parse_args()
    configs, where = {}, {}
    for mit in a.mitigations.split(","):
        for b in a.bounds.split(","):
            name = f"ssp{b}" + ("" if mit == "none" else f"_{mit}")
            configs[name] = {"cluster": ["--consistency", "ssp", "--staleness-bound", b, "--mitigation", mit]}
            where[name] = (mit, int(b))
        if a.asp:
            name = "asp" + ("" if mit == "none" else f"_{mit}")
            configs[name] = {"cluster": ["--consistency", "asp", "--mitigation", mit], "elastic": True}
            where[name] = (mit, None)
    pairs = [(n, n[:-len(where[n][0]) - 1] if where[n][0] != "none" else n) for n in configs]
    pairs = [(x, y) for x, y in pairs if x != y and y in configs]  # mitigation vs none, same bound
    summary = run_study(configs, a, "Staleness sweep", f"python experiments/staleness_sweep.py {' '.join(sys.argv[1:])}",
                        pairs)
    if summary is None:  # --dry-run: the plan was printed, nothing ran
        return
    plt = pyplot()
    if plt is None:
        return
    plt.figure(figsize=(7, 4.5))
    for mit in a.mitigations.split(","):
        pts = [(where[k][1], c["final_val_loss"]) for k, c in summary["configurations"].items()
               if where[k][0] == mit and c["final_val_loss"]["mean"] is not None]
        bounded = sorted((b, s) for b, s in pts if b is not None)
        color = None
        if bounded:
            line = plt.errorbar([b for b, _ in bounded], [s["mean"] for _, s in bounded],
                                yerr=[[s["mean"] - s["ci95"][0] for _, s in bounded],
                                      [s["ci95"][1] - s["mean"] for _, s in bounded]],
                                marker="o", capsize=3, label=f"ssp, {mit}")
            color = line[0].get_color()
        for b, s in pts:
            if b is None:
                plt.axhline(s["mean"], linestyle="--", color=color, label=f"asp, {mit}")
    plt.xlabel("staleness bound s")
    plt.ylabel("final validation loss (mean, 95% CI)")
    plt.legend(fontsize=8)
    plt.tight_layout()
    plt.savefig(os.path.join(a.out, "val_loss_vs_bound.png"), dpi=100)


if __name__ == "__main__":
    exit_on_sigterm()
    main()
