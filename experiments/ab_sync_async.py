"""A/B of synchronous vs asynchronous data parallelism, one command:

  python experiments/ab_sync_async.py [--nodes 4] [--steps 300] [--slow-node 3 --slowdown 2]
                                      [--modes ring,bsp,ssp,asp] [--servers 2] [--out runs/ab]

Runs the same job (same model, data, per-node batch, seed) once per mode on a simulated cluster
(scripts/local_cluster.sh: processes on loopback), optionally with one node slowed down, then
writes OUT/report.md (table: aggregate tokens/s, wall time, staleness, final validation loss, loss
at equal wall-clock time), OUT/loss_vs_time.png and OUT/summary.json. Depends on the core only
through its binaries and metrics files.
"""
import argparse
import os
import sys

from cluster_runs import add_job_args, run, write_outputs

MODES = {
    "ring": [],
    "bsp": ["--consistency", "bsp"],
    "ssp": ["--consistency", "ssp", "--staleness-bound", "2"],
    "asp": ["--consistency", "asp"],
}


def main():
    ap = argparse.ArgumentParser()
    add_job_args(ap, "ab")
    ap.add_argument("--modes", default="ring,bsp,ssp,asp")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    results = {m: run(m, MODES[m], a, ring=(m == "ring")) for m in a.modes.split(",")}
    write_outputs(results, a,
                  f"Sync vs async: {a.nodes} nodes, preset {a.preset}, batch {a.batch}/node, {a.steps} steps/node, "
                  f"node {a.slow_node} slowed {a.slowdown}x, {a.servers} server shards",
                  f"python experiments/ab_sync_async.py {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
