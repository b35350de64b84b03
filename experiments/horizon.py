"""DiLoCo against data-parallel training as runs get longer (issue 27, published claim 3: Douillard
et al. 2023; Charles et al. 2025): at equal tokens, does DiLoCo with a large H match the ring once
the run is long enough, and at which length and H does the gap close here?

  python experiments/horizon.py run [--nodes 8] [--lengths 300,1000,3000] [--configs ring,diloco10,diloco50]
                                    [--seeds 5] [--out docs/study/atlas] [--runs runs/atlas] [--dry-run]

Each length L is one study in the simulator (experiments/study.py): N workers, the atlas's `micro`
model and batch, a modelled 0.1 s step on compute-bound links (ratio 0.1: time is not the question
here, tokens are), an equal token budget of L steps per node for every configuration (each run's
schedule ends there), learning rates and DiLoCo's outer lr tuned per configuration and length on seed
1000, 5 headline seeds, and the held-out loss at the budget compared paired with the ring, Holm across
the study, with two one-sided tests at --margin nats (equivalence: "matches"). Kept per length under
OUT/horizon/L<L>/ (summary, report, plot); every run's files under RUNS/horizon/. published.py reads
them for claim 3.
"""
import argparse
import os
import sys

import atlas
from ab_sync_async import CONFIGS as AB_CONFIGS
from study import run_study
from cluster_runs import exit_on_sigterm

MARGIN = 0.02  # nats: "matches" = the paired difference within +-0.02 by TOST (about 1% of the loss here)


def length_dir(out, n, length):
    return os.path.join(out, "horizon", f"N{n}", f"L{length}")


def cmd_run(a):
    names = a.configs.split(",")
    for length in a.lengths:
        dest = length_dir(a.out, a.nodes, length)
        if atlas.load(os.path.join(dest, "summary.json")) is not None:
            print(f"[horizon] N={a.nodes} L={length}: kept", flush=True)
            continue
        work = os.path.join(a.runs, "horizon", f"N{a.nodes}", f"L{length}")
        args = atlas.study_args(work, a.nodes, 0.1, "none", a.seeds,
                                ["--steps", str(length), "--configs", ",".join(names), "--baseline", "ring",
                                 "--equivalence-margin", str(a.margin)] + (["--dry-run"] if a.dry_run else []))
        run_study(AB_CONFIGS, args, f"Horizon N={a.nodes} L={length}",
                  f"python experiments/horizon.py run --nodes {a.nodes} --lengths {length} --configs {a.configs} "
                  f"--seeds {a.seeds}")
        if not a.dry_run:
            atlas.publish(work, dest)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the lengths not kept yet")
    r.add_argument("--nodes", type=int, default=8)
    r.add_argument("--lengths", default="300,1000,3000", help="steps per node, comma-separated")
    r.add_argument("--configs", default="ring,diloco10,diloco50")
    r.add_argument("--seeds", type=int, default=5)
    r.add_argument("--margin", type=float, default=MARGIN, help="nats: the equivalence margin (TOST)")
    r.add_argument("--dry-run", action="store_true")
    r.add_argument("--out", default=atlas.DEFAULT_OUT)
    r.add_argument("--runs", default=atlas.DEFAULT_RUNS)
    a = ap.parse_args()
    a.lengths = sorted(int(x) for x in a.lengths.split(","))
    bad = [c for c in a.configs.split(",") if c not in AB_CONFIGS]
    if bad or "ring" not in a.configs.split(","):
        raise SystemExit(f"horizon: configurations must include ring and be known ({', '.join(bad) or 'ring missing'})")
    return cmd_run(a)


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
