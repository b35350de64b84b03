"""Session 47, post hoc (docs/STUDY.md): the ring and diloco10 on the advice's i_slow7 cluster over seeds 0-19
and 440-459, from the commands recorded in runs/hs44_c (made by the devcheck_stability3 command).
Run as python3 run.py; writes /tmp/seedchk/out.json (copied here as times.json)."""
import json, subprocess, re, statistics, sys
base = "/work/main/runs/hs44_c/i_slow7/advise/t3/runs/%s/seed0/result.json"
out = {}
for cfg in ("ring", "diloco10"):
    cmd = json.load(open(base % cfg))["command"]
    for seeds in (range(0, 20), range(440, 460)):
        ts = []
        for sd in seeds:
            c = re.sub(r"--train.seed=\d+", f"--train.seed={sd}", cmd)
            c = re.sub(r"--out \S+", f"--out /tmp/seedchk/{cfg}_{sd}", c)
            subprocess.run(c, shell=True, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            r = json.load(open(f"/tmp/seedchk/{cfg}_{sd}/result.json")) if False else None
            # the sim writes sim.json; read time to target from it
            sj = json.load(open(f"/tmp/seedchk/{cfg}_{sd}/sim.json"))
            ts.append(sj.get("target_reached_s"))
        out[f"{cfg} {seeds.start}-{seeds.stop-1}"] = ts
json.dump(out, open("/tmp/seedchk/out.json", "w"), indent=1)
for k, v in out.items():
    r = [x for x in v if x is not None]
    print(k, "reached", len(r), "of", len(v), "mean %.2f sd %.2f" % (statistics.mean(r), statistics.stdev(r)), "min %.2f max %.2f" % (min(r), max(r)))
