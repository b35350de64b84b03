#!/usr/bin/env bash
# scripts/gpu_check.sh --dry end to end (issue 28): CPU replicas stand in for the GPUs and every
# comparison, measurement, injected failure and the watchdog's self-test run. It must exit 0 with
# report.json saying dry / no GPU result, every section pass, or skipped only where it is GPU-only
# (gpu_tests: the GoogleTests that skip without a CUDA device); every comparison pass, its controls
# caught; and leave nothing behind: no process of its own, no scratch directory.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${SYNCOPATE_PYTHON:-$ROOT/.venv/bin/python}
TMP=$(mktemp -d)
export TMPDIR=$TMP  # gpu_check.sh's scratch directory goes here: it must be gone at the end
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/out"
start=$SECONDS
scripts=$ROOT/scripts
"$scripts/gpu_check.sh" --dry --out "$TMP/out" > "$TMP/run.log" 2>&1
rc=$?
wall=$((SECONDS - start))
fail=0
[ $rc = 0 ] || { echo "FAIL: gpu_check.sh --dry exited $rc"; tail -n 40 "$TMP/run.log"; fail=1; }
[ -f "$TMP/out/report.json" ] && [ -f "$TMP/out/report.md" ] || { echo "FAIL: no report"; exit 1; }
"$PY" - "$TMP/out/report.json" <<'PYEOF' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
bad = []
if not (r["dry"] and not r["gpu_result"] and r["headline"] == "dry run (CPU): no GPU result"):
    bad.append(f"headline {r['headline']!r}, dry {r['dry']}, gpu_result {r['gpu_result']}")
if r["verdict"] != "pass":
    bad.append(f"verdict {r['verdict']}: {r['failed_sections']}")
want = ["versions", "watchdog", "gpu_tests", "correctness", "communication", "throughput", "failure"]
got = {s["name"]: s for s in r["sections"]}
if sorted(got) != sorted(want):
    bad.append(f"sections {sorted(got)}")
for name, s in got.items():
    ok = s["status"] == "pass" or (name == "gpu_tests" and s["status"] == "skipped" and "GPU only" in s["reason"])
    if not ok:
        bad.append(f"{name}: {s['status']} ({s['reason']})")
comps = [c for s in r["sections"] for c in s["checks"] if c.get("kind") == "compare"]
controls = [c for c in comps if c["expect"] == "differ"]
if len(comps) < 10 or len(controls) < 2 or any(c["status"] != "pass" for c in comps):
    bad.append(f"{len(comps)} comparisons, {len(controls)} controls, failing: "
               f"{[c['name'] for c in comps if c['status'] != 'pass']}")
if any(not c["exceeded"] for c in controls):
    bad.append("a control exceeded no tolerance")
w = [c for c in got.get("watchdog", {}).get("checks", []) if c["status"] == "pass"]
if not w:
    bad.append("the watchdog's self-test did not pass")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PYEOF
grep -q "dry run (CPU): no GPU result" "$TMP/out/report.md" || { echo "FAIL: report.md lacks the dry headline"; fail=1; }
leftover=$(find "$TMP" -maxdepth 1 -name 'gpu_check.*' | head -n 3)
[ -z "$leftover" ] || { echo "FAIL: scratch directory left: $leftover"; fail=1; }
if pgrep -f "$TMP/" > /dev/null; then echo "FAIL: processes left:"; pgrep -af "$TMP/"; fail=1; fi
[ $fail = 0 ] && echo "gpu_check --dry: PASS in ${wall} s"
exit $fail
