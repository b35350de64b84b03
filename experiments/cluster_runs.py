"""Shared by the experiment scripts: run one configuration of a job on a simulated cluster
(scripts/local_cluster.sh), summarize its metrics, and write a report, a JSON summary and a
loss-vs-time plot. Depends on the core only through its binaries and metrics files."""
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def ema(xs, a=0.1):
    out, m = [], None
    for x in xs:
        m = x if m is None else (1 - a) * m + a * x
        out.append(m)
    return out


def add_job_args(ap, out_default):
    """The job every configuration runs: the same model, data, per-node batch and seed."""
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--slow-node", type=int, default=3, help="-1: no straggler")
    ap.add_argument("--slowdown", type=float, default=2.0)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", out_default))
    ap.add_argument("--extra", default="", help="more worker args, space-separated")


def run(name, cluster_args, a, ring=False):
    """Runs the job once with extra local_cluster.sh arguments; returns its summary."""
    out = os.path.join(a.out, name)
    cmd = [os.path.join(ROOT, "scripts", "local_cluster.sh"), "--nodes", str(a.nodes), "--out", out]
    if not ring:
        cmd += ["--servers", str(a.servers)] + cluster_args
    if a.slow_node >= 0:
        cmd += ["--slow-node", str(a.slow_node), "--slowdown", str(a.slowdown)]
    cmd += ["--", f"--model.preset={a.preset}", f"--train.steps={a.steps}", f"--train.batch_size={a.batch}",
            "--train.threads=1", "--eval.every=0", "--eval.sample_tokens=0", "--eval.batches=4",
            "--checkpoint.every=0", "--dist.check_every=0", f"--data.cache_dir={ROOT}/data/cache"]
    cmd += a.extra.split()
    print(f"[experiment] {name}: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    nodes = [read(os.path.join(out, f"node{i}", "metrics.jsonl")) for i in range(a.nodes)]
    steps = [[m for m in n if "tokens_per_s" in m] for n in nodes]
    wall = max(s[-1]["time_s"] for s in steps)
    tokens = steps[0][-1]["tokens"] if ring else sum(s[-1]["tokens"] for s in steps)
    stale = [m["staleness"] for s in steps for m in s]
    return {
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "staleness_mean": statistics.mean(stale),
        "staleness_max": max(stale),
        "val_loss": statistics.mean([[m for m in n if "val_loss" in m][-1]["val_loss"] for n in nodes]),
        "curve": [(m["time_s"], l) for m, l in zip(steps[0], ema([m["loss"] for m in steps[0]]))],
    }


def write_outputs(results, a, title, command):
    """OUT/report.md (one row per configuration), OUT/summary.json, OUT/loss_vs_time.png."""
    t_eq = min(r["wall_s"] for r in results.values())
    for r in results.values():
        r["loss_at_equal_time"] = [l for t, l in r["curve"] if t <= t_eq][-1]
    lines = [f"# {title}", "", f"Command: `{command}`", "",
             "| configuration | wall s | tokens/s (all nodes) | staleness mean | staleness max | final val loss | "
             f"train loss at t={t_eq:.1f}s (node 0, EMA) |",
             "|---|---|---|---|---|---|---|"]
    for m, r in results.items():
        lines.append(f"| {m} | {r['wall_s']:.1f} | {r['tokens_per_s']:.0f} | {r['staleness_mean']:.2f} | "
                     f"{r['staleness_max']:.0f} | {r['val_loss']:.4f} | {r['loss_at_equal_time']:.4f} |")
    report = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(report)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({m: {k: v for k, v in r.items() if k != "curve"} for m, r in results.items()}, f, indent=2)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        plt.figure()
        for m, r in results.items():
            plt.plot([t for t, _ in r["curve"]], [l for _, l in r["curve"]], label=m)
        plt.xlabel("wall-clock s (node 0)")
        plt.ylabel("train loss (EMA)")
        plt.legend()
        plt.title("loss vs time")
        plt.savefig(os.path.join(a.out, "loss_vs_time.png"), dpi=100)
    except ImportError:
        print("[experiment] matplotlib missing: no plot", file=sys.stderr)
    print(report)
    return report
