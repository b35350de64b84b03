"""The table of docs/study/churn_scenario_journal: goodput per run in two arms on one commit (J: workers'
and shards' checkpoints in the background, joins and FINISHes in the shards' membership journal; C: the
workers' checkpoints in the background, the shards' none), paired by seed, with the previous study's arm A
(docs/study/churn_scenario_srvckpt: joins and FINISHes waited for a write of the state; another commit and
session, indicative), the shards' own counts of their writes, and each node's start-up and tail.

    .venv/bin/python docs/study/churn_scenario_journal/table.py [RUNS_DIR]
"""
import json, os, statistics as st, sys

R = sys.argv[1] if len(sys.argv) > 1 else "runs"
ARMS = {"jnl_j": "J: background, shards checkpoint, journal", "jnl_c": "C: background, shards write none",
        "csv_bg": "previous A: background, shards checkpoint, joins and FINISH wait for a write"}

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "experiments"))
from churn import load_runs, node_phases as phases, run_fields  # noqa: E402


def load(name):
    return load_runs(R, name)


rows = {}
for arm in ARMS:
    for part in ("a", "b"):
        for r in load(f"{arm}_{part}"):
            rows[(r["config"], r["seed"], arm)] = run_fields(r)
configs = ["ps_asp", "ps_async_local_sgd"]
print("| configuration | seed | J | C | J - C | previous A | J - previous A | events J / C | end, s J / C | final loss J / C | shard writes J: background (final write at the job's end) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
summ = {}
for c in configs:
    for s in (1, 2, 3, 4):
        j, k, a = (rows.get((c, s, arm)) for arm in ARMS)
        if not (j and k):
            print(f"| {c} | {s} | {j and round(j['g'], 3)} | {k and round(k['g'], 3)} | missing | | | | | | |")
            continue
        summ.setdefault(c, []).append((j["g"], k["g"], a["g"] if a else None))
        print(f"| {c} | {s} | {j['g']:.3f} | {k['g']:.3f} | {j['g'] - k['g']:+.3f} | {a['g'] if a else float('nan'):.3f} | "
              f"{j['g'] - a['g'] if a else float('nan'):+.3f} | {j['ev']} / {k['ev']} | {j['end']:.1f} / {k['end']:.1f} | "
              f"{j['fl']:.3f} / {k['fl']:.3f} | {'+'.join(map(str, j['snaps']))} ({'+'.join(map(str, j['syncw']))}) |")
print()
for c, v in summ.items():
    J, C = [x[0] for x in v], [x[1] for x in v]
    d = [x[0] - x[1] for x in v]
    print(f"{c}: J {min(J):.3f}-{max(J):.3f} (mean {st.mean(J):.3f}); C {min(C):.3f}-{max(C):.3f} (mean {st.mean(C):.3f}); "
          f"J-C {min(d):+.3f}..{max(d):+.3f} (mean {st.mean(d):+.3f}); every J >= 0.90: {all(x >= 0.90 for x in J)}")
bad = [(k, v["status"], v["hang"], v["dup"], v["eo"]) for k, v in rows.items() if k[2] != "csv_bg" and
       (v["status"] != "complete" or v["hang"] or (v["dup"] not in (0, None)) or v["eo"] is False)]
print("problems:", bad)
mine = [v for k, v in rows.items() if k[2] != "csv_bg"]
print("runs:", len(mine), "max overrun share", max((v["over"] for v in mine), default=None),
      "max cpu", max((v["cpu"] for v in mine), default=None))


# Where the present time went: each node's start-up and tail, per arm, mean over runs (churn.node_phases).


print()
print("| configuration | arm | start-up per node, s (mean over runs) | tail per node, s |")
print("|---|---|---|---|")
for c in configs:
    for arm, name in ARMS.items():
        S, T = [], []
        for part in ("a", "b"):
            for r in load(f"{arm}_{part}"):
                if r["config"] != c:
                    continue
                s_, t_ = phases(r)
                S += s_
                T += t_
        if S or T:
            print(f"| {c} | {name} | {st.mean(S):.2f} ({len(S)} nodes) | {st.mean(T):.2f} ({len(T)} nodes) |")
