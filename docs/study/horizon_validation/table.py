"""The table of docs/study/horizon_validation: per configuration and figure, the simulator against the
emulated cluster (validation.json), beside the emulated cluster against itself (repeat.json: the same
runs made twice, the noise floor), the replay with the shards on links of their own as the atlas's
cells place them (atlas_placement.json: how far the figure moves with the placement) and, post hoc,
the replay with the nodes' messages sharing their links fairly (fair_posthoc.json).

    .venv/bin/python docs/study/horizon_validation/table.py [DIR]
"""
import json
import os
import sys

D = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))


def load(name):
    p = os.path.join(D, name)
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def cell(c):
    if c is None or c.get("mean") is None:
        return "-"
    f = (lambda x: f"{100 * x:+.1f}%") if c["kind"] == "time" else (lambda x: f"{x:+.3f}")
    ci = "" if c["ci95"][0] is None else f" [{f(c['ci95'][0])}, {f(c['ci95'][1])}]"
    verdict = {"pass": "pass", "fail": "FAIL", "n/a": "n/a"}[c["verdict"]]
    why = {"the mean difference is outside the tolerance": "mean outside",
           "the interval is wider than the tolerance": "interval wider",
           "the interval reaches past the tolerance": "interval past the edge"}.get(c["why"], c["why"])
    reach = ""
    if c.get("reached"):
        r = c["reached"]
        reach = f"; reached {r['emulated']}/{r['simulated']} of {r['seeds']}"
    return f"{f(c['mean'])}{ci} {verdict}{' (' + why + ')' if why else ''}{reach} (n {c['n']})"


val, rep, plc = load("validation.json"), load("repeat.json"), load("atlas_placement.json")
fair, fair_label = load("fair_posthoc.json"), "simulator (fair sharing, post hoc) - emulation"
if fair is None:
    fair, fair_label = load("fair.json"), "simulator (fair sharing) - emulation"
if val is None:
    raise SystemExit(f"table.py: {D}/validation.json is missing (validate_sim.py --publish it first)")
print("| configuration | figure | emulated mean | simulated mean | simulator - emulation | emulation again - emulation "
      f"| shards on own links - on the nodes' (simulator) | {fair_label} |")
print("|---|---|---|---|---|---|---|---|")
for name, c in val["configurations"].items():
    for m, ch in c["checks"].items():
        e, s = c["emulated"][m]["mean"], c["simulated"][m]["mean"]
        fmt = (lambda x: "-" if x is None else f"{x:.4g}")
        again = rep["configurations"].get(name, {}).get("checks", {}).get(m) if rep else None
        moved = "-"
        if plc and name in plc["configurations"]:
            a = plc["configurations"][name]["simulated"][m]["mean"]
            if a is not None and s is not None:
                moved = f"{100 * (a / s - 1):+.1f}%" if ch["kind"] == "time" and s else f"{a - s:+.3f}"
        posthoc = fair["configurations"].get(name, {}).get("checks", {}).get(m) if fair else None
        print(f"| {name} | {m} | {fmt(e)} | {fmt(s)} | {cell(ch)} | {cell(again)} | {moved} | {cell(posthoc)} |")
print()
print("| a | b | figure | simulator - emulation (contrast) |")
print("|---|---|---|---|")
for ch in val["contrasts"]:
    print(f"| {ch['a']} | {ch['b']} | {ch['metric']} | {cell(ch)} |")
