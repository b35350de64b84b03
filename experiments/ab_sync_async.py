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
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = {
    "ring": [],
    "bsp": ["--consistency", "bsp"],
    "ssp": ["--consistency", "ssp", "--staleness-bound", "2"],
    "asp": ["--consistency", "asp"],
}


def read(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def ema(xs, a=0.1):
    out, m = [], None
    for x in xs:
        m = x if m is None else (1 - a) * m + a * x
        out.append(m)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--slow-node", type=int, default=3)
    ap.add_argument("--slowdown", type=float, default=2.0)
    ap.add_argument("--modes", default="ring,bsp,ssp,asp")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "ab"))
    ap.add_argument("--extra", default="", help="more worker args, space-separated")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    results = {}
    for mode in a.modes.split(","):
        out = os.path.join(a.out, mode)
        cmd = [os.path.join(ROOT, "scripts", "local_cluster.sh"), "--nodes", str(a.nodes), "--out", out]
        if mode != "ring":
            cmd += ["--servers", str(a.servers)] + MODES[mode][:]
        if a.slow_node >= 0:
            cmd += ["--slow-node", str(a.slow_node), "--slowdown", str(a.slowdown)]
        cmd += ["--", f"--model.preset={a.preset}", f"--train.steps={a.steps}", f"--train.batch_size={a.batch}",
                "--train.threads=1", "--eval.every=0", "--eval.sample_tokens=0", "--eval.batches=4",
                "--checkpoint.every=0", "--dist.check_every=0", f"--data.cache_dir={ROOT}/data/cache"]
        cmd += a.extra.split()
        print(f"[ab] {mode}: {' '.join(cmd)}", flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        nodes = [read(os.path.join(out, f"node{i}", "metrics.jsonl")) for i in range(a.nodes)]
        steps = [[m for m in n if "tokens_per_s" in m] for n in nodes]
        wall = max(s[-1]["time_s"] for s in steps)
        tokens = sum(s[-1]["tokens"] for s in steps) if mode != "ring" else steps[0][-1]["tokens"]
        stale = [m["staleness"] for s in steps for m in s]
        results[mode] = {
            "wall_s": wall,
            "tokens": tokens,
            "tokens_per_s": tokens / wall,
            "staleness_mean": statistics.mean(stale),
            "staleness_max": max(stale),
            "val_loss": statistics.mean([[m for m in n if "val_loss" in m][-1]["val_loss"] for n in nodes]),
            "curve": [(m["time_s"], l) for m, l in zip(steps[0], ema([m["loss"] for m in steps[0]]))],
        }
    t_eq = min(r["wall_s"] for r in results.values())
    for r in results.values():
        r["loss_at_equal_time"] = [l for t, l in r["curve"] if t <= t_eq][-1]
    lines = [
        f"# Sync vs async: {a.nodes} nodes, preset {a.preset}, batch {a.batch}/node, {a.steps} steps/node, "
        f"node {a.slow_node} slowed {a.slowdown}x, {a.servers} server shards", "",
        f"Command: `python experiments/ab_sync_async.py {' '.join(sys.argv[1:])}`", "",
        "| mode | wall s | tokens/s (all nodes) | staleness mean | staleness max | final val loss | "
        f"train loss at t={t_eq:.1f}s (node 0, EMA) |",
        "|---|---|---|---|---|---|---|"]
    for m, r in results.items():
        lines.append(f"| {m} | {r['wall_s']:.1f} | {r['tokens_per_s']:.0f} | {r['staleness_mean']:.2f} | "
                     f"{r['staleness_max']:.0f} | {r['val_loss']:.4f} | {r['loss_at_equal_time']:.4f} |")
    report = "\n".join(lines) + "\n"
    open(os.path.join(a.out, "report.md"), "w").write(report)
    json.dump({m: {k: v for k, v in r.items() if k != "curve"} for m, r in results.items()},
              open(os.path.join(a.out, "summary.json"), "w"), indent=2)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        for m, r in results.items():
            plt.plot([t for t, _ in r["curve"]], [l for _, l in r["curve"]], label=m)
        plt.xlabel("wall-clock s (node 0)")
        plt.ylabel("train loss (EMA)")
        plt.legend()
        plt.title("loss vs time")
        plt.savefig(os.path.join(a.out, "loss_vs_time.png"), dpi=100)
    except ImportError:
        print("[ab] matplotlib missing: no plot", file=sys.stderr)
    print(report)


if __name__ == "__main__":
    main()
