#!/usr/bin/env python3
"""Two advice records judged against the same measurements (experiments/hindsight.py --advice-out),
side by side: per target and scenario, what each advised and how far behind the best it was when
run (advised / best), whether the advice was seed-decided (advise.py --stability-seeds), and per
configuration the simulator's error on the runs' own seeds (same_seed_error) and the prediction's
(relative_error), A -> B. A cell whose pick differs is marked robust (the two picks' measured mean
times 1.15x or more apart, a miss against a reach, or resolved apart, paired and Holm-corrected) or
marginal; per target, each record's cells within 1.10x and its summed advised / best.

  python experiments/hindsight_compare.py A/hindsight.json B/hindsight.json [--configs bsp_backup,ssp4]

Both records must hold the same measured times (the same emulated runs); otherwise the comparison
is refused by name. The medians are over the (scenario, configuration) pairs both records have an
error for, so A and B are compared on the same pairs; the paired line is the median of |B's same-seed
error| - |A's| over those pairs (in points) and how many are smaller in B.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hindsight  # noqa: E402

ROBUST = 1.15   # a changed pick whose measured times are this far apart is a robust change


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"hindsight_compare: cannot read {path}: {e}")
    if doc.get("format") != "syncopate-hindsight/1":
        raise SystemExit(f"hindsight_compare: {path} is not a hindsight record (format {doc.get('format')!r})")
    return doc


def cells(doc):
    """{(scenario, target): cell} of the valid scenarios."""
    return {(s["name"], t): c for s in doc["scenarios"] for t, c in s["targets"].items() if c.get("valid", True)}


def change(c, x, y):
    """How the picks x and y (different) compare on cell c's measured runs: {ratio, resolved, robust}."""
    if x not in c["measured"] or y not in c["measured"]:
        return {"ratio": None, "resolved": False, "robust": None}   # a pick that was not run: not judged
    mx, my = (hindsight._full_mean(c["measured"][k]) for k in (x, y))
    ratio = None if mx is None or my is None else max(mx, my) / min(mx, my)
    resolved = bool(hindsight._judge({k: c["measured"][k] for k in (x, y)}).get("resolved"))
    return {"ratio": ratio, "resolved": resolved, "robust": ratio is None or ratio >= ROBUST or resolved}


def change_text(ch):
    """'; a robust change (1.262x apart, not resolved)' for a changed pick that was judged, else ""."""
    if not ch or ch["robust"] is None:
        return ""
    apart = f"{ch['ratio']:.3f}x apart" if ch["ratio"] is not None else "a miss against a reach"
    return (f"; a {'robust' if ch['robust'] else 'marginal'} change ({apart}, "
            + ("resolved)" if ch["resolved"] else "not resolved)"))


def compare(a, b, configs=None):
    """Rows and medians of B against A; SystemExit when their measurements differ."""
    ca, cb = cells(a), cells(b)
    for key in sorted(set(ca) & set(cb)):
        if ca[key].get("measured") != cb[key].get("measured"):
            raise SystemExit(f"hindsight_compare: {key[0]} at target {key[1]} was measured differently in the two "
                             "records: compare advice judged against the same runs (hindsight.py --advice-out)")
    out = {}
    for t in sorted({t for _, t in set(ca) & set(cb)}, key=float, reverse=True):
        rows, same, pred = [], ([], []), ([], [])
        for name, tt in sorted(set(ca) & set(cb)):
            if tt != t:
                continue
            x, y = ca[(name, t)], cb[(name, t)]
            errs = {}
            for k in sorted(set(x.get("same_seed_error", {})) & set(y.get("same_seed_error", {}))):
                if configs and k not in configs:
                    continue
                errs[k] = (x["same_seed_error"][k], y["same_seed_error"][k],
                           x.get("relative_error", {}).get(k), y.get("relative_error", {}).get(k))
                same[0].append(abs(errs[k][0])), same[1].append(abs(errs[k][1]))
                if errs[k][2] is not None and errs[k][3] is not None:
                    pred[0].append(abs(errs[k][2])), pred[1].append(abs(errs[k][3]))
            stab = tuple((c.get("advice_stability") or {}).get("stable") for c in (x, y))
            rows.append({"scenario": name, "advised": (x["advised"], y["advised"]), "best": x.get("best"),
                         "within": (x.get("within"), y.get("within")), "regret": (x.get("regret"), y.get("regret")),
                         "stable": stab, "errors": errs,
                         "change": change(x, x["advised"], y["advised"]) if x["advised"] != y["advised"] else None})
        med = lambda v: statistics.median(v) if v else None
        both = [r["regret"] for r in rows if None not in r["regret"]]
        paired = [y - x for x, y in zip(*same)]   # |B's error| - |A's|, per (scenario, configuration)
        out[t] = {"rows": rows, "same_seed": (med(same[0]), med(same[1]), len(same[0])),
                  "same_seed_paired": (med(paired), sum(1 for d in paired if d < 0), len(paired)),
                  "predicted": (med(pred[0]), med(pred[1]), len(pred[0])),
                  "within": tuple(sum(1 for r in rows if r["within"][i]) for i in (0, 1)),
                  "regret_sum": (sum(r[0] for r in both), sum(r[1] for r in both), len(both))}
    return out


def pct(x):
    return "-" if x is None else f"{100 * x:+.0f}%"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="the first record's hindsight.json")
    ap.add_argument("b", help="the second record's hindsight.json (same measurements)")
    ap.add_argument("--configs", help="comma-separated configurations to compare (default: every one with an error)")
    args = ap.parse_args(argv)
    configs = set(args.configs.split(",")) if args.configs else None
    res = compare(load(args.a), load(args.b), configs)
    for t, r in res.items():
        print(f"target {t}")
        for row in r["rows"]:
            errs = ", ".join(f"{k} {pct(e[0])} -> {pct(e[1])}" for k, e in row["errors"].items())
            picks = " -> ".join(f"{p}" + (f" ({g:.3f}x)" if g is not None else " (missed)")
                                for p, g in zip(row["advised"], row["regret"]))
            stab = "; seed-decided: " + " -> ".join({True: "held", False: "yes", None: "-"}[v] for v in row["stable"]) \
                if any(v is not None for v in row["stable"]) else ""
            print(f"  {row['scenario']}: advised {picks} (best {row['best']}){stab}{change_text(row['change'])}; "
                  f"same-seed error {errs}")
        print(f"  within 1.10x: {r['within'][0]} -> {r['within'][1]} of {len(r['rows'])}; advised / best summed over "
              f"{r['regret_sum'][2]} cells: {r['regret_sum'][0]:.3f} -> {r['regret_sum'][1]:.3f}")
        for what, (x, y, n) in (("same-seed", r["same_seed"]), ("predicted", r["predicted"])):
            if n:
                print(f"  median |{what} error| over {n} pairs: {100 * x:.1f}% -> {100 * y:.1f}%")
        d, better, n = r["same_seed_paired"]
        if n:
            print(f"  paired |same-seed error| B - A: median {100 * d:+.1f} points over {n} pairs, smaller in B "
                  f"in {better}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
