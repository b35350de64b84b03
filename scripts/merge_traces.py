#!/usr/bin/env python3
"""Merges the Chrome trace files of a job's workers and servers (--trace.file) into one timeline.

usage: scripts/merge_traces.py OUT.json TRACE.json [TRACE.json ...] [--summary]

Every file holds one process's events on its own system clock. A process records how far its
clock is from another's as "clock_sync" events (a ring node against node 0 at the rendezvous; a
parameter-server worker against every shard with a STATS round trip, error at most half the
round trip). The merge puts every file on one reference clock (shard 0's in ps mode, else node
0's), following those offsets from file to file (the smallest round trip first); a file that no
offset reaches keeps its own clock and is named on stderr. Processes get distinct pids (hosts may
reuse them). --summary prints, per process, the time spent in each kind of event.
Open OUT.json in https://ui.perfetto.dev or chrome://tracing.
"""
import json
import sys
from collections import defaultdict


def load(path):
    """A trace file, also one a killed process left without its closing bracket."""
    text = open(path, encoding="utf-8").read().strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = json.loads(text.rstrip(",\n ") + "]")
    events = data["traceEvents"] if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise SystemExit(f"merge_traces: {path} is not a Chrome trace (a JSON array of events)")
    return events


def process_name(events, path):
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            return e["args"]["name"]
    return path


def offsets(files):
    """name -> this clock minus the reference clock (us), for every file an offset reaches."""
    names = [f["name"] for f in files]
    root = next((n for n in ("server shard 0", "worker node 0") if n in names), names[0])
    known = {root: 0.0}
    edges = []  # (rtt, a, reference, clock_a - clock_reference)
    for f in files:
        for e in f["events"]:
            if e.get("ph") == "M" and e.get("name") == "clock_sync":
                a = e["args"]
                rtt = a.get("rtt_us", -1)
                edges.append((rtt if rtt is not None and rtt >= 0 else 1e12, f["name"], a["reference"], float(a["offset_us"])))
    edges.sort(key=lambda x: x[0])
    changed = True
    while changed:
        changed = False
        for _, a, ref, off in edges:
            if ref in known and a not in known:
                known[a] = known[ref] + off
                changed = True
            elif a in known and ref not in known:
                known[ref] = known[a] - off
                changed = True
    return root, known


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    args = [a for a in argv if a != "--summary"]
    if len(args) < 2:
        raise SystemExit(__doc__)
    out, paths = args[0], args[1:]
    files = []
    for p in paths:
        ev = load(p)
        files.append({"path": p, "events": ev, "name": process_name(ev, p)})
    root, known = offsets(files)
    merged = []
    for pid, f in enumerate(files, start=1):
        shift = known.get(f["name"])
        if shift is None:
            print(f"merge_traces: no clock offset reaches {f['name']} ({f['path']}): left on its own clock", file=sys.stderr)
            shift = 0.0
        for e in f["events"]:
            e = dict(e)
            e["pid"] = pid
            if "ts" in e:
                e["ts"] = e["ts"] - shift
            merged.append(e)
        print(f"{f['name']:<24} {len([e for e in f['events'] if e.get('ph') == 'X']):>7} events, clock "
              f"{shift:+.0f} us from {root}")
    t0 = min((e["ts"] for e in merged if "ts" in e), default=0)
    for e in merged:
        if "ts" in e:
            e["ts"] -= t0  # the job's first event at 0
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"traceEvents": merged, "displayTimeUnit": "ms",
                   "otherData": {"reference_clock": root, "offsets_us": known, "t0_unix_us": t0}}, fh)
    if "--summary" in argv:
        for pid, f in enumerate(files, start=1):
            total = defaultdict(float)
            count = defaultdict(int)
            for e in f["events"]:
                if e.get("ph") == "X":
                    total[e["name"]] += e["dur"] / 1e3
                    count[e["name"]] += 1
            print(f"\n{f['name']}")
            for name, ms in sorted(total.items(), key=lambda x: -x[1]):
                print(f"  {name:<48} {ms:>10.1f} ms  {count[name]:>6}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
