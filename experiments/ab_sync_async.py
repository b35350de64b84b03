"""A/B of synchronous vs asynchronous data parallelism on an emulated cluster, one command:

  python experiments/ab_sync_async.py [--scenario experiments/scenarios/stragglers.toml] [--seeds 3]
        [--nodes 8] [--steps 60] [--configs ring,bsp,bsp_backup,ssp1,ssp4,asp,asp_lr_scale,asp_dc_asgd]
        (also: diloco10, diloco50, async_diloco10, async_diloco50: local SGD / DiLoCo; asp_int8,
         diloco10_int8, diloco50_int8, async_diloco10_int8, async_diloco50_int8: int8 wire; diloco10_ps:
         synchronous DiLoCo through BSP shards in float32, the int8 runs' transport)
        [--step-time S] [--slow-node I --slowdown F] [--jitter X] [--netns --link-gbit G] [--out runs/ab]
        [--dry-run]

Every configuration trains the same model on the same data with the same per-node batch under one
budget (--token-budget, or --time-budget-s with schedules fitted to it); each gets its learning rate
(and a local-SGD configuration its outer lr) from a grid tuned on --tuning-seeds, then runs with
--seeds headline seeds; the report compares them paired over seeds with Holm's correction.
Before its first run it prints the runs by kind and their estimated minutes, from measurements of this
machine (experiments/cost.py); --dry-run prints every run and exits, starting and writing nothing.
Writes OUT/report.md, OUT/summary.json and plots (validation loss vs time and vs tokens with 95%
bands, time to target with error bars, staleness histograms, learning-rate sensitivity). See
experiments/study.py and docs/STUDY.md.
"""
import argparse
import sys

from study import add_args, run_study
from cluster_runs import exit_on_sigterm

# elastic: the configuration waits for no straggler, so with one its budget is the synchronous
# job's wall time rather than a step count (the fast nodes do slowdown x the straggler's steps).
# The others step together (ring, BSP) or within a bound of the slowest (SSP): equal steps.
# outer_lr: the configuration's own outer learning rate, which the study tunes (--outer-lr-grid multiplies it).
ASYNC_OUTER = ["--dist.outer=delayed_nesterov"]
DILOCO_OUTER_LR, ASYNC_OUTER_LR = 0.7, 0.35
INT8 = ["--dist.wire=int8"]
CONFIGS = {
    "ring": {"ring": True, "cluster": []},
    "bsp": {"cluster": ["--consistency", "bsp"]},
    "bsp_backup": {"cluster": ["--consistency", "bsp", "--backup-workers", "1"], "backup": 1, "elastic": True},
    "ssp1": {"cluster": ["--consistency", "ssp", "--staleness-bound", "1"]},
    "ssp4": {"cluster": ["--consistency", "ssp", "--staleness-bound", "4"]},
    "asp": {"cluster": ["--consistency", "asp"], "elastic": True},
    "asp_lr_scale": {"cluster": ["--consistency", "asp", "--mitigation", "lr_scale"], "elastic": True},
    "asp_dc_asgd": {"cluster": ["--consistency", "asp", "--mitigation", "dc_asgd"], "elastic": True},
    # Local SGD / DiLoCo (issue 12): H inner steps per synchronization, DiLoCo's outer Nesterov step;
    # synchronous over the ring, asynchronous through ASP shards (each node's Delta on arrival).
    # Named in --configs to run (not in the default set).
    # Asynchronous: delayed Nesterov (momentum once per N = nodes arrivals) at half DiLoCo's outer lr, the
    # form that trains (docs/STUDY.md: per-arrival Nesterov at 0.7 diverged in every seed).
    "diloco10": {"outer_lr": DILOCO_OUTER_LR, "ring": True, "cluster": [], "worker": ["--dist.sync_every=10"], "optional": True},
    "diloco50": {"outer_lr": DILOCO_OUTER_LR, "ring": True, "cluster": [], "worker": ["--dist.sync_every=50"], "optional": True},
    "async_diloco10": {"outer_lr": ASYNC_OUTER_LR, "cluster": ["--consistency", "asp"], "worker": ["--dist.sync_every=10"] + ASYNC_OUTER,
                       "elastic": True, "optional": True},
    "async_diloco50": {"outer_lr": ASYNC_OUTER_LR, "cluster": ["--consistency", "asp"], "worker": ["--dist.sync_every=50"] + ASYNC_OUTER,
                       "elastic": True, "optional": True},
    # int8 wire (a float32 scale per 4096 values, error feedback on the sender) for what travels to
    # the shards; the ring takes 16-bit wires only, so synchronous DiLoCo in int8 runs through BSP
    # shards (which equal the ring's DiLoCo in float32: LocalSgdTraining.PsBspDiLoCoEqualsRingDiLoCo...).
    "diloco10_ps": {"outer_lr": DILOCO_OUTER_LR, "cluster": ["--consistency", "bsp"], "worker": ["--dist.sync_every=10"], "optional": True},
    "asp_int8": {"cluster": ["--consistency", "asp"], "worker": INT8, "elastic": True, "optional": True},
    "diloco10_int8": {"outer_lr": DILOCO_OUTER_LR, "cluster": ["--consistency", "bsp"], "worker": ["--dist.sync_every=10"] + INT8, "optional": True},
    "diloco50_int8": {"outer_lr": DILOCO_OUTER_LR, "cluster": ["--consistency", "bsp"], "worker": ["--dist.sync_every=50"] + INT8, "optional": True},
    "async_diloco10_int8": {"outer_lr": ASYNC_OUTER_LR, "cluster": ["--consistency", "asp"], "worker": ["--dist.sync_every=10"] + ASYNC_OUTER + INT8,
                            "elastic": True, "optional": True},
    "async_diloco50_int8": {"outer_lr": ASYNC_OUTER_LR, "cluster": ["--consistency", "asp"], "worker": ["--dist.sync_every=50"] + ASYNC_OUTER + INT8,
                            "elastic": True, "optional": True},
}

# Pairs the report discusses beyond every configuration against the baseline (--baseline, default
# the first): a mitigation against plain ASP at ASP's own tuned lr, asynchronous against synchronous
# local SGD at the same H, the int8 wire against float32.
PAIRS = [("asp_lr_scale", "asp"), ("asp_dc_asgd", "asp"), ("async_diloco10", "diloco10"),
         ("async_diloco50", "diloco50"), ("asp_int8", "asp"), ("diloco10_int8", "diloco10_ps"),
         ("async_diloco10_int8", "async_diloco10"), ("async_diloco50_int8", "async_diloco50")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(ap, "ab")
    a = ap.parse_args()
    run_study(CONFIGS, a, "Sync vs async", f"python experiments/ab_sync_async.py {' '.join(sys.argv[1:])}", PAIRS)


if __name__ == "__main__":
    exit_on_sigterm()
    main()
