"""A/B of synchronous vs asynchronous data parallelism on an emulated cluster, one command:

  python experiments/ab_sync_async.py [--scenario experiments/scenarios/stragglers.toml] [--seeds 3]
        [--nodes 8] [--steps 60] [--configs ring,bsp,bsp_backup,ssp1,ssp4,asp,asp_lr_scale,asp_dc_asgd]
        (also: diloco10, diloco50, async_diloco10: local SGD / DiLoCo)
        [--step-time S] [--slow-node I --slowdown F] [--jitter X] [--netns --link-gbit G] [--out runs/ab]

Every configuration trains the same model on the same data with the same per-node batch and step
budget; each gets its learning rate from a small grid (--lr-grid), then runs with --seeds seeds.
Writes OUT/report.md, OUT/summary.json and plots (validation loss vs time and vs tokens with 95%
bands, time to target with error bars, staleness histograms, learning-rate sensitivity). See
experiments/study.py and docs/STUDY.md.
"""
import argparse
import sys

from study import add_args, run_study

# elastic: the configuration waits for no straggler, so with one its budget is the synchronous
# job's wall time rather than a step count (the fast nodes do slowdown x the straggler's steps).
# The others step together (ring, BSP) or within a bound of the slowest (SSP): equal steps.
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
    "diloco10": {"ring": True, "cluster": [], "worker": ["--dist.sync_every=10"], "optional": True},
    "diloco50": {"ring": True, "cluster": [], "worker": ["--dist.sync_every=50"], "optional": True},
    "async_diloco10": {"cluster": ["--consistency", "asp"], "worker": ["--dist.sync_every=10"], "elastic": True,
                       "optional": True},
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(ap, "ab")
    a = ap.parse_args()
    run_study(CONFIGS, a, "Sync vs async", f"python experiments/ab_sync_async.py {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
