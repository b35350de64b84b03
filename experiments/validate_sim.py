"""Validates syncopate-sim against the emulated cluster: takes a finished emulated study (the
output directory of ab_sync_async.py), runs every configuration again in the simulator with the
same emulation (nodes, servers, modelled step, straggler, jitter, link rate), the same learning
rate and the same seeds, and compares per configuration: validation loss at the common time,
final validation loss, time to the emulated study's target, throughput, wall time, and the
staleness histograms. A figure "agrees" when the two 95% intervals overlap; a disagreement is
named with both intervals, for the report to explain.

  python experiments/validate_sim.py --emulated runs/study/stragglers [--out runs/validate/stragglers]
        [--configs ring,asp] [--latency-us 50]

Writes OUT/validation.json, OUT/report.md, OUT/val_loss_<config>.png and OUT/staleness.png.
"""
import argparse
import json
import os
import shlex
import sys

from ab_sync_async import CONFIGS
from cluster_runs import ROOT, read_jsonl, run_once, summarize
from stats import fmt_ci, mean_ci95
from study import add_args, loss_at, time_to_target
from plotting import pyplot


def study_args(summary):
    """The emulated study's own arguments, parsed from its recorded command."""
    ap = argparse.ArgumentParser()
    add_args(ap, "x")
    argv = shlex.split(summary["command"])
    return ap.parse_args(argv[2:])


def tbf_sharing(em, sa):
    """fifo where a tbf queue of the emulated link (rate x 50 ms latency + burst, as scripts/netns.sh
    sets it) holds a worker's whole push to one shard, so the pushes go out in order; else fair
    (the flows interleave in a queue too short for any one of them)."""
    from scenario import PRESET_PARAMS
    if not em.get("link_gbit"):
        return "fair"
    rate = em["link_gbit"] * 1e9 / 8
    queue = rate * 0.050 + max(16384, rate * 0.008)
    piece = PRESET_PARAMS[em["preset"]] * 4 / (sa.servers or em["nodes"])
    return "fifo" if piece <= queue else "fair"


def overlap(a, b):
    if a["mean"] is None or b["mean"] is None:
        return None
    lo_a, hi_a = a["ci95"] if a.get("ci95") else (a["mean"], a["mean"])
    lo_b, hi_b = b["ci95"] if b.get("ci95") else (b["mean"], b["mean"])
    return lo_a <= hi_b and lo_b <= hi_a


def figures(runs, t_eq, target):
    """Per-configuration figures from per-run summaries (either backend, treated alike)."""
    hist = {}
    for r in runs:
        for k, c in r["staleness_histogram"].items():
            hist[k] = hist.get(k, 0) + c
    return {
        "val_loss_at_equal_time": mean_ci95([loss_at(r["curve"], t_eq) for r in runs]),
        "final_val_loss": mean_ci95([r["final_val_loss"] for r in runs]),
        "time_to_target_s": mean_ci95([time_to_target(r["curve"], target) for r in runs]),
        "reached": sum(time_to_target(r["curve"], target) is not None for r in runs),
        "tokens_per_s": mean_ci95([r["tokens_per_s"] for r in runs]),
        "wall_s": mean_ci95([r["wall_s"] for r in runs]),
        "staleness_mean": mean_ci95([r["staleness_mean"] for r in runs]),
        "staleness_histogram": hist,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--emulated", required=True, help="an emulated study's output directory (with summary.json)")
    ap.add_argument("--out", help="default: runs/validate/<the study's name>")
    ap.add_argument("--configs", help="comma-separated subset of the study's configurations")
    ap.add_argument("--latency-us", type=float, default=50.0, help="the simulator's one-way latency, microseconds")
    ap.add_argument("--sharing", choices=["auto", "fair", "fifo"], default="auto",
                    help="how a sender's simultaneous messages share its link in the simulator; auto: fifo where the "
                    "emulated link's tbf queue (rate x 50 ms + burst, scripts/netns.sh) holds a whole push to one "
                    "shard, else fair")
    ap.add_argument("--link-efficiency", type=float, default=1.0,
                    help="the simulator's links at this share of the emulated nominal rate (TCP's goodput on them)")
    a = ap.parse_args()
    with open(os.path.join(a.emulated, "summary.json")) as f:
        emu = json.load(f)
    sa = study_args(emu)
    em = dict(emu["emulation"])
    if em.get("backend") == "sim":
        raise SystemExit(f"validate_sim: {a.emulated} is a simulated study; give an emulated one")
    em["backend"], em["latency_us"], em["link_efficiency"] = "sim", a.latency_us, a.link_efficiency
    em["sharing"] = a.sharing if a.sharing != "auto" else tbf_sharing(em, sa)
    out = a.out or os.path.join(ROOT, "runs", "validate", os.path.basename(os.path.normpath(a.emulated)))
    os.makedirs(out, exist_ok=True)
    job = {"nodes": em["nodes"], "servers": sa.servers or em["nodes"], "steps": sa.steps, "evals": sa.evals,
           "preset": em["preset"], "batch": em["batch"], "warmup": sa.warmup, "eval_batches": 4}
    names = a.configs.split(",") if a.configs else list(emu["configurations"])
    t_eq, target = emu["equal_time_s"], emu["target_val_loss"]
    result = {"emulated": os.path.abspath(a.emulated), "command": " ".join(["python"] + sys.argv),
              "emulation": em, "equal_time_s": t_eq, "target_val_loss": target, "configurations": {}}
    for name in names:
        c = emu["configurations"][name]
        cfg = CONFIGS[name]
        mult = c["lr_multiplier"]
        seeds = sorted(int(s) for s in c["curves"])
        emu_runs, sim_runs = [], []
        for s in seeds:
            d = os.path.join(a.emulated, "runs", name, f"lr{mult:g}", f"seed{s}")
            emu_runs.append(summarize(d, job["nodes"], cfg.get("ring", False)))
            rd = os.path.join(out, "runs", name, f"seed{s}")
            if os.path.exists(os.path.join(rd, "sim.json")):  # done before (the simulator is deterministic)
                r = summarize(rd, job["nodes"], cfg.get("ring", False))
                with open(os.path.join(rd, "sim.json")) as f:
                    r["elapsed_s"] = json.load(f)["real_s"]
            else:
                r = run_once(name, cfg, em, job, s, c["lr"], rd, backend="sim")
            if "failed" in r:
                raise SystemExit(f"validate_sim: {name} seed {s} failed in the simulator ({r['failed']}); log {r['log']}")
            sim_runs.append(r)
            print(f"[validate] {name} seed {s}: emulated final {emu_runs[-1]['final_val_loss']:.4f} / "
                  f"{emu_runs[-1]['wall_s']:.1f} s; simulated {r['final_val_loss']:.4f} / {r['wall_s']:.1f} s "
                  f"({r['elapsed_s']:.0f} s real)", flush=True)
        fe, fs_ = figures(emu_runs, t_eq, target), figures(sim_runs, t_eq, target)
        agree = {k: overlap(fe[k], fs_[k]) for k in
                 ("val_loss_at_equal_time", "final_val_loss", "time_to_target_s", "tokens_per_s", "wall_s", "staleness_mean")}
        result["configurations"][name] = {
            "lr": c["lr"], "seeds": seeds, "emulated": fe, "simulated": fs_, "agree": agree,
            "curves": {"emulated": [r["curve"] for r in emu_runs], "simulated": [r["curve"] for r in sim_runs]},
            "sim_real_s": sum(r["elapsed_s"] for r in sim_runs)}
    with open(os.path.join(out, "validation.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(report(result, out))
    plots(result, out)


def report(res, out):
    L = [f"# Simulator vs emulated cluster: {os.path.basename(res['emulated'])}", "",
         f"Command: `{res['command']}`", "",
         f"Emulated study: `{res['emulated']}` ({res['emulation']['nodes']} nodes). The simulator ran every configuration "
         "with the same emulation, learning rate and seeds (links: sharing "
         f"{res['emulation'].get('sharing', 'fair')}, {res['emulation'].get('link_efficiency', 1.0):g} x the emulated "
         f"rate, {res['emulation'].get('latency_us', 50):g} us latency). A figure agrees when the two 95% intervals overlap "
         f"(Student's t over the seeds). Common time {res['equal_time_s']:.1f} s; target {res['target_val_loss']:.4f} "
         "(the emulated study's).", "",
         "| configuration | figure | emulated | simulated | agree |", "|---|---|---|---|---|"]
    labels = {"val_loss_at_equal_time": "val loss at common time", "final_val_loss": "final val loss",
              "time_to_target_s": "time to target, s", "tokens_per_s": "tokens/s", "wall_s": "wall time, s",
              "staleness_mean": "staleness mean"}
    n_agree = n_all = 0
    for name, c in res["configurations"].items():
        for k, label in labels.items():
            e, s = c["emulated"][k], c["simulated"][k]
            ok = c["agree"][k]
            extra = f" ({c['emulated']['reached']}/{len(c['seeds'])} vs {c['simulated']['reached']}/{len(c['seeds'])} reached)" \
                if k == "time_to_target_s" else ""
            L.append(f"| {name} | {label} | {fmt_ci(e, 4)} | {fmt_ci(s, 4)}{extra} | "
                     f"{'-' if ok is None else 'yes' if ok else '**no**'} |")
            if ok is not None:
                n_agree += ok
                n_all += 1
    L += ["", f"{n_agree} of {n_all} comparable figures agree.", ""]
    text = "\n".join(L) + "\n"
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


def plots(res, out):
    plt = pyplot()
    if plt is None:
        return
    names = list(res["configurations"])
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.4), sharey=True, squeeze=False)
    for ax, name in zip(axes[0], names):
        c = res["configurations"][name]
        for backend, style in (("emulated", "-"), ("simulated", "--")):
            curves = c["curves"][backend]
            n = min(len(cv) for cv in curves)
            xs = [sum(cv[i]["t"] for cv in curves) / len(curves) for i in range(n)]
            st = [mean_ci95([cv[i]["val_loss"] for cv in curves]) for i in range(n)]
            line, = ax.plot(xs, [s["mean"] for s in st], style, label=backend)
            ax.fill_between(xs, [s["ci95"][0] for s in st], [s["ci95"][1] for s in st], color=line.get_color(), alpha=0.2)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("seconds")
    axes[0][0].set_ylabel("validation loss (mean, 95% band)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "val_loss.png"), dpi=100)
    plt.close(fig)
    ps_names = [n for n in names if any(k != "0" for k in res["configurations"][n]["emulated"]["staleness_histogram"])]
    if ps_names:
        fig, axes = plt.subplots(1, len(ps_names), figsize=(3.2 * len(ps_names), 3.0), squeeze=False)
        for ax, name in zip(axes[0], ps_names):
            for backend, marker in (("emulated", "o"), ("simulated", "x")):
                h = res["configurations"][name][backend]["staleness_histogram"]
                tot = sum(h.values()) or 1
                ks = sorted(h, key=int)
                ax.plot([int(k) for k in ks], [h[k] / tot for k in ks], marker=marker, label=backend)
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("staleness")
        axes[0][0].set_ylabel("share of steps")
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "staleness.png"), dpi=100)
        plt.close(fig)


if __name__ == "__main__":
    main()
