#!/usr/bin/env python3
"""Two advice records judged against the same measurements (experiments/hindsight.py --advice-out),
side by side: per target and scenario, what each advised, and per configuration the simulator's
error on the runs' own seeds (same_seed_error) and the prediction's (relative_error), A -> B.

  python experiments/hindsight_compare.py A/hindsight.json B/hindsight.json [--configs bsp_backup,ssp4]

Both records must hold the same measured times (the same emulated runs); otherwise the comparison
is refused by name. The medians are over the (scenario, configuration) pairs both records have an
error for, so A and B are compared on the same pairs.
"""
import argparse
import json
import statistics
import sys


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
            rows.append({"scenario": name, "advised": (x["advised"], y["advised"]), "best": x.get("best"),
                         "within": (x.get("within"), y.get("within")), "errors": errs})
        med = lambda v: statistics.median(v) if v else None
        out[t] = {"rows": rows, "same_seed": (med(same[0]), med(same[1]), len(same[0])),
                  "predicted": (med(pred[0]), med(pred[1]), len(pred[0]))}
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
            print(f"  {row['scenario']}: advised {row['advised'][0]} -> {row['advised'][1]} (best {row['best']}); "
                  f"same-seed error {errs}")
        for what, (x, y, n) in (("same-seed", r["same_seed"]), ("predicted", r["predicted"])):
            if n:
                print(f"  median |{what} error| over {n} pairs: {100 * x:.1f}% -> {100 * y:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
