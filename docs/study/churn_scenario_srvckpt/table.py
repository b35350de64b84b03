"""The table of docs/study/churn_scenario_srvckpt: goodput per run in the three arms (A: workers' and
shards' checkpoints in the background; C: the workers' in the background, the shards' none; B: both on
their request or training path), paired by seed, and the shards' own counts of their writes.

    .venv/bin/python docs/study/churn_scenario_srvckpt/table.py [RUNS_DIR]
"""
import json, os, statistics as st, sys

R = sys.argv[1] if len(sys.argv) > 1 else "runs"
ARMS = {"bg": "A: background, shards checkpoint", "ctl": "C: background, shards write none",
        "sync": "B: synchronous, shards checkpoint"}

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "experiments"))
from churn import load_runs, node_phases as phases, run_fields  # noqa: E402


def load(name):
    return load_runs(R, name)


rows = {}
for arm in ARMS:
    for part in ("a", "b"):
        for r in load(f"csv_{arm}_{part}"):
            rows[(r["config"], r["seed"], arm)] = run_fields(r)
configs = ["ps_asp", "ps_async_local_sgd"]
print("| configuration | seed | A | C | B | A - C | A - B | end, s A / C / B | shard writes A: background (on the request path) | shard writes B: on the request path (s there) |")
print("|---|---|---|---|---|---|---|---|---|---|")
summ = {}
for c in configs:
    for s in (1, 2, 3, 4):
        a, k, b = (rows.get((c, s, arm)) for arm in ("bg", "ctl", "sync"))
        if not (a and k and b):
            print(f"| {c} | {s} | {a and round(a['g'], 3)} | {k and round(k['g'], 3)} | {b and round(b['g'], 3)} | missing | | | | |")
            continue
        summ.setdefault(c, []).append((a["g"], k["g"], b["g"]))
        print(f"| {c} | {s} | {a['g']:.3f} | {k['g']:.3f} | {b['g']:.3f} | {a['g'] - k['g']:+.3f} | {a['g'] - b['g']:+.3f} | "
              f"{a['end']:.1f} / {k['end']:.1f} / {b['end']:.1f} | {'+'.join(map(str, a['snaps']))} "
              f"({'+'.join(map(str, a['syncw']))}) | {'+'.join(map(str, b['syncw']))} ({'+'.join(map(str, b['syncs']))}) |")
print()
for c, v in summ.items():
    A, C, B = ([x[i] for x in v] for i in range(3))
    print(f"{c}: A {min(A):.3f}-{max(A):.3f} (mean {st.mean(A):.3f}); C {min(C):.3f}-{max(C):.3f} (mean {st.mean(C):.3f}); "
          f"B {min(B):.3f}-{max(B):.3f} (mean {st.mean(B):.3f}); A-C {min(a - k for a, k, _ in v):+.3f}..{max(a - k for a, k, _ in v):+.3f}; "
          f"every A >= 0.90: {all(a >= 0.90 for a in A)}")
bad = [(k, v["status"], v["hang"], v["dup"], v["eo"]) for k, v in rows.items()
       if v["status"] != "complete" or v["hang"] or (v["dup"] not in (0, None)) or v["eo"] is False]
print("problems:", bad)
print("runs:", len(rows), "max overrun share", max((v["over"] for v in rows.values()), default=None),
      "max cpu", max((v["cpu"] for v in rows.values()), default=None))

# Where the present time went: each node's start-up and tail, per arm, mean over runs (churn.node_phases).


print()
print("| configuration | arm | start-up per node, s (mean over runs) | tail per node, s |")
print("|---|---|---|---|")
for c in configs:
    for arm, name in ARMS.items():
        S, T = [], []
        for part in ("a", "b"):
            for r in load(f"csv_{arm}_{part}"):
                if r["config"] != c:
                    continue
                s_, t_ = phases(r)
                S += s_
                T += t_
        if S or T:
            print(f"| {c} | {name} | {st.mean(S):.2f} ({len(S)} nodes) | {st.mean(T):.2f} ({len(T)} nodes) |")
