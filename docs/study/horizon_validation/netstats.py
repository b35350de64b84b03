"""Per configuration: the emulated runs' tbf drops (uplinks + downlinks) and TCP retransmissions per run,
summed over the nodes (each run's logs/netstats.txt), for the studies named (default runs/horizon_n8).

    .venv/bin/python docs/study/horizon_validation/netstats.py [STUDY_DIR ...]
"""
import glob
import os
import re
import sys

for study in sys.argv[1:] or ["runs/horizon_n8"]:
    print(f"{study}:")
    for cfg in sorted(os.listdir(os.path.join(study, "runs"))):
        drops, retrans, segs = [], [], []
        for f in sorted(glob.glob(os.path.join(study, "runs", cfg, "*", "seed*", "logs", "netstats.txt"))):
            text = open(f).read()
            drops.append(sum(int(x) for x in re.findall(r"dropped (\d+)", text)))
            retrans.append(sum(int(x) for x in re.findall(r"TcpRetransSegs=(\d+)", text)))
            segs.append(sum(int(x) for x in re.findall(r"TcpOutSegs=(\d+)", text)))
        if drops:
            print(f"  {cfg}: {len(drops)} runs; tbf drops per run {min(drops)}-{max(drops)} (mean {sum(drops) / len(drops):.0f});"
                  f" TCP retransmitted segments per run {min(retrans)}-{max(retrans)} "
                  f"({100 * sum(retrans) / max(1, sum(segs)):.2f}% of segments sent)")
