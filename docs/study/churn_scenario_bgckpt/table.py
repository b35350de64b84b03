import json, glob, os, statistics as st
import sys
R = sys.argv[1] if len(sys.argv) > 1 else "runs"
def load(name):
    p = f"{R}/{name}/churn.json"
    return json.load(open(p))["runs"] if os.path.exists(p) else []
rows = {}
for arm in ("bg", "sync"):
    for part in ("a", "b", "b4"):
        for r in load(f"cbg_{arm}_{part}"):
            if part == "b" and arm == "bg" and r["seed"] == 4: continue  # replaced by cbg_bg_b4 (the fixed commit)
            m = r["metrics"]
            waits = []
            for f in glob.glob(os.path.join(r["dir"], "node*", "metrics.jsonl")):
                for line in open(f):
                    if "checkpoint_wait_s" in line:
                        waits.append(json.loads(line)["checkpoint_wait_s"])
            rows[(r["config"], r["seed"], arm)] = dict(g=m["goodput"], lost=m["lost_steps"]["total"], ev=f'{m["events_happened"]}/{m["events_planned"]}',
                 surv=m["events_survived"], hang=m["hangs"], dup=m["duplicate_data"], eo=(m.get("exactly_once") or {}).get("ok"),
                 over=m["overrun_share"], cpu=m["cpu_util"], stall=m["longest_stall_s"], end=m["time_to_end_s"], status=r["status"],
                 waits=len(waits), wmax=max(waits) if waits else 0.0, fl=m["final_val_loss"])
configs = ["ps_asp", "ps_async_local_sgd", "ring_elastic", "ring_diloco_elastic", "ring_restart"]
print("| configuration | seed | background | synchronous | difference | lost steps bg / sync | events bg / sync | longest stall bg / sync, s | background writes waited for (max s) |")
print("|---|---|---|---|---|---|---|---|---|")
summ = {}
for c in configs:
    for s in (1, 2, 3, 4):
        b, y = rows.get((c, s, "bg")), rows.get((c, s, "sync"))
        if not b or not y:
            print(f"| {c} | {s} | {b and round(b['g'],3)} | {y and round(y['g'],3)} | missing | | | | |"); continue
        d = b["g"] - y["g"]
        summ.setdefault(c, []).append((b["g"], y["g"], d))
        print(f"| {c} | {s} | {b['g']:.3f} | {y['g']:.3f} | {d:+.3f} | {b['lost']:g} / {y['lost']:g} | {b['ev']} / {y['ev']} | {b['stall']:.2f} / {y['stall']:.2f} | {b['waits']} ({b['wmax']:.3f}) |")
print()
for c, v in summ.items():
    bs = [x[0] for x in v]; ys = [x[1] for x in v]; ds = [x[2] for x in v]
    print(f"{c}: bg {min(bs):.3f}-{max(bs):.3f} mean {st.mean(bs):.3f}; sync {min(ys):.3f}-{max(ys):.3f} mean {st.mean(ys):.3f}; diff mean {st.mean(ds):+.3f} range {min(ds):+.3f}..{max(ds):+.3f}")
bad = [(k, v["status"], v["hang"], v["dup"], v["eo"]) for k, v in rows.items() if v["status"] != "complete" or v["hang"] or (v["dup"] not in (0, None)) or v["eo"] is False]
print("problems:", bad)
print("max overrun share", max(v["over"] for v in rows.values()), "max cpu", max(v["cpu"] for v in rows.values()))
