#!/usr/bin/env python3
"""An atlas cell's verdicts re-read at a sparser evaluation spacing (issue 27): how much of what a cell
resolves comes from how often its runs were evaluated.

Evaluations are deferred (scored on snapshots after training), so a cell evaluated every E global tokens
holds the curve of the same runs evaluated every K x E: per run keep every K-th evaluation (node 0 evaluates
at the first step past each multiple of E, one per multiple) and the final one, recompute every seed's time
to each target and its evaluation bracket from those points, and state the cell's winners (atlas.winners) both ways. The cells of sessions 29-36 ran 10 evaluations, the
later ones 40: `--every 4` on a later cell says what it would have said at the older spacing.

  python experiments/eval_spacing.py docs/study/atlas/cells/N64/r0.1_heavy --every 4 [--json OUT.json]
"""
import argparse
import copy
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import atlas  # noqa: E402
import method  # noqa: E402


def sparser(curve, every):
    """The points of `curve` a run evaluated `every` times less often would have. The j-th evaluation of a run
    (j = 1, 2, ...) is the one at (or, node 0 counting, about) the j-th multiple of the spacing; the runs here
    advance by less than a spacing per step, so no multiple is skipped. Kept: j = every, 2 x every, ..., and the
    job's final evaluation."""
    final = [p for p in curve if p.get("job_final")] or curve[-1:]
    body = [p for p in curve if p not in final]
    return [p for j, p in enumerate(body, 1) if j % every == 0] + final


def thinned(summary, every):
    """A copy of a cell's summary whose curves are evaluated `every` times as far apart, with every seed's
    values read off a curve (method.per_seed: times to target and brackets, the loss at the budget)
    recomputed from them."""
    s = copy.deepcopy(summary)
    spacing = s["job"]["every_tokens"] * every
    for c in s["configurations"].values():
        for p in c["per_seed"]:
            cv = sparser(c["curves"].get(str(p["seed"]), []), every)
            c["curves"][str(p["seed"])] = cv
            method.reread(p, cv, s.get("targets") or [], s.get("budget"))
    s["job"] = dict(s["job"], every_tokens=spacing, evals=max(1, s["job"]["evals"] // every))
    return s


def verdicts(summary, cell):
    """atlas.winners' rows for one cell's summary (cell: 'N64/r0.1_heavy')."""
    with tempfile.TemporaryDirectory() as out:
        d = os.path.join(out, "cells", cell)
        os.makedirs(d)
        with open(os.path.join(d, "summary.json"), "w") as f:
            json.dump(summary, f)
        return atlas.winners(out)[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cell", help="a published cell's directory (its summary.json)")
    ap.add_argument("--every", type=int, default=4, help="keep one evaluation spacing in this many (>= 1)")
    ap.add_argument("--json", help="also write both readings here")
    a = ap.parse_args()
    if a.every < 1:
        raise SystemExit(f"eval_spacing: --every {a.every}: must be 1 or more")
    path = os.path.join(a.cell, "summary.json")
    try:
        with open(path) as f:
            s = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"eval_spacing: cannot read {path} ({e}): give a published cell's directory")
    cell = os.path.join(*os.path.normpath(a.cell).split(os.sep)[-2:])
    readings = {"as_run": s, f"every_{a.every}": thinned(s, a.every)}
    rows = {k: verdicts(v, cell) for k, v in readings.items()}
    points = {k: sorted({len(cv) for c in v["configurations"].values() for cv in c["curves"].values()})
              for k, v in readings.items()}
    for k, rs in rows.items():
        print(f"== {k} (evaluation points per run: {points[k][0]}-{points[k][-1]})")
        for w in rs:
            print(f"- {w['sentence']}")
    changed = [(x["stage"], x.get("winner"), x.get("resolved"), y.get("winner"), y.get("resolved"))
               for x, y in zip(*rows.values()) if (x.get("winner"), x.get("resolved")) != (y.get("winner"),
                                                                                          y.get("resolved"))]
    print(f"== {len(changed)} of {len(rows['as_run'])} target(s) change first or resolution at 1/{a.every} the "
          "evaluations" + "".join(f"\n- {st}: {w1} (resolved {r1}) -> {w2} (resolved {r2})"
                                  for st, w1, r1, w2, r2 in changed))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cell": cell, "every": a.every, "points": points,
                       "rows": {k: [{x: w.get(x) for x in ("stage", "target", "winner", "resolved", "not_resolved_from",
                                                          "indicative_against", "sentence")} for w in v]
                                for k, v in rows.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
