"""Repeat draws of emulated DiLoCo-on-servers runs (PLAN.md): per seed and arm the final losses of each
draw, the repeat spread, and the gap churn / reference - 1 of each pairing.

    python docs/study/churn_dilocos_repeat/table.py runs/csv_emu runs/drep_a runs/drep_b > table.md"""
import itertools
import json
import math
import os
import statistics as st
import sys

NAME = "ps_diloco_elastic"


def finals(d):
    with open(os.path.join(d, "churn.json")) as f:
        s = json.load(f)
    out = {}
    for r in s["runs"]:
        if r["config"] == NAME and r["status"] == "complete" and r["metrics"].get("final_val_loss") is not None:
            out[(r["seed"], bool(r["churn"]))] = r["metrics"]["final_val_loss"]
    return out


def main(dirs):
    draws = [finals(d) for d in dirs]
    seeds = sorted({k[0] for d in draws for k in d if all((k[0], c) in dd for dd in draws for c in (True, False))})
    L = [f"Draws: {', '.join(dirs)}; configuration {NAME}; seeds {', '.join(map(str, seeds))}.", "",
         "| seed | reference, each draw | churn run, each draw | gap of each draw's pair | gaps of every pairing: min to max |",
         "|---|---|---|---|---|"]
    rel_ref, rel_ch, gap_sd, gap_means = [], [], [], []
    for sd in seeds:
        ref = [d[(sd, False)] for d in draws]
        ch = [d[(sd, True)] for d in draws]
        same = [c / r - 1 for c, r in zip(ch, ref)]
        every = [c / r - 1 for c, r in itertools.product(ch, ref)]
        rel_ref.append(st.stdev(ref) / st.mean(ref))
        rel_ch.append(st.stdev(ch) / st.mean(ch))
        gap_sd.append(st.stdev(same))
        gap_means.append(st.mean(same))
        L.append(f"| {sd} | {' / '.join(f'{x:.4f}' for x in ref)} | {' / '.join(f'{x:.4f}' for x in ch)} | "
                 f"{' / '.join(f'{x:+.2%}' for x in same)} | {min(every):+.2%} to {max(every):+.2%} |")
    pooled = lambda xs: math.sqrt(sum(x * x for x in xs) / len(xs))  # noqa: E731 (root mean square of per-seed SDs)
    sd_repeat = pooled(gap_sd)
    sd_seeds = st.stdev(gap_means)
    mean_gap = st.mean(gap_means)
    L += ["", f"- Repeat standard deviation of one run's final loss, relative (root mean square over seeds): "
          f"references {pooled(rel_ref):.2%}, churn runs {pooled(rel_ch):.2%}.",
          f"- Repeat standard deviation of one draw's gap (churn / reference - 1, same seed): {sd_repeat:.2%}.",
          f"- Across seeds, the mean gap of each seed: mean {mean_gap:+.2%}, standard deviation {sd_seeds:.2%} "
          f"(it contains the repeat noise, divided by the {len(draws)} draws)."]
    # TOST at +-1% with n seeds and one draw each: the 90% interval half-width 1.645 x sd / sqrt(n) must fit
    # between the mean and the nearer margin (normal approximation).
    sd_one = math.sqrt(max(sd_seeds ** 2 - sd_repeat ** 2 / len(draws), 0) + sd_repeat ** 2)
    room = 0.01 - abs(mean_gap)
    need = math.ceil((1.645 * sd_one / room) ** 2) if room > 0 else None
    L.append(f"- One draw per seed has a gap standard deviation of about {sd_one:.2%} (seeds and repeats); at the "
             f"mean gap {mean_gap:+.2%}, a TOST at +-1% would need about "
             f"{need if need else 'no number of'} seeds (normal approximation; an estimate from {len(seeds)} seeds).")
    print("\n".join(L))


if __name__ == "__main__":
    main(sys.argv[1:])
