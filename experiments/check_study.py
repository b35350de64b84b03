"""Checks that docs/STUDY.md says only what the tool said (issue 27).

  python experiments/check_study.py [--study docs/STUDY.md]

A conclusion in STUDY.md is quoted from the tool, never retyped: a line

  - «SENTENCE» — [label](path/to/summary.json)        a study's conclusion (its summary.json "conclusions")
  - «SENTENCE» — [label](path/to/atlas.json)          an atlas cell's verdict (its atlas.json winners' "sentence")
  - «SENTENCE» — [label](path/to/published.json)      a published claim's verdict or comparison
  - «SENTENCE» — [label](path/to/hindsight.json)      advice against hindsight (experiments/hindsight.py)
  - «SENTENCE» — [label](path/to/switch.json)         a switch mid-run (experiments/switch_midrun.py)
  - «SENTENCE» — [label](path/to/validation.json)     a simulator check (experiments/validate_sim.py)

where SENTENCE must be one of that file's sentences, character for character (numbers, intervals, Holm
p and verdict included), and the file must still say it when its sentences are computed again from
its data: a summary's conclusions by study.analyse from its per-seed values, an atlas's verdicts by
atlas.winners, the published claims by published.evaluate from the cells' summaries and advice
against hindsight by hindsight.analyse from its per-seed times, a switch mid-run by switch_midrun.analyse
from its runs, a simulator check by validate_sim.analyse from its per-seed differences (a stale file,
not rebuilt after its data changed, fails).
The check fails where a quoted sentence is not stated, where a cited file is missing or unreadable,
where a « opens no well-formed quote (one line, then — [label](path.json)), where STUDY.md quotes
nothing, and where it writes "≈" (a difference the test did not resolve is "not resolved", never
"about equal"). Paths are relative to the repository root. Exit 0: every quote holds; 1: the
problems, one per line.
"""
import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUOTE = re.compile(r"«(?P<sentence>[^»]+)»\s+—\s+\[[^\]]*\]\((?P<path>[^)]+\.json)\)")
APPROX_ALLOWED = re.compile(r"[\"“'`]≈[\"”'`]")  # the sign named in quotes (the rule itself), not used


def sentences(doc, path):
    """The sentences a tool's file states: a study's conclusions, an atlas's cell verdicts; and the
    same computed again from the file's data (None where that recomputation is not possible)."""
    import copy
    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    stored = set(doc.get("conclusions") or [])
    stored.update(w["sentence"] for w in doc.get("winners") or [] if w.get("sentence"))
    for c in doc.get("claims") or []:
        stored.add(c["sentence"])
        stored.update(x["sentence"] for x in c.get("comparisons", []))
    if "claims" in doc:
        import published
        again = published.evaluate(os.path.dirname(path))
        return stored, {c["sentence"] for c in again["claims"]} | {x["sentence"] for c in again["claims"]
                                                                 for x in c.get("comparisons", [])}
    if doc.get("format") == "syncopate-switch/1":
        import switch_midrun
        again = switch_midrun.analyse(copy.deepcopy(doc["runs"]), copy.deepcopy(doc.get("control_runs")))
        return stored, set(again["conclusions"])
    if doc.get("format") == "syncopate-validation/1":
        import validate_sim
        return stored, set(validate_sim.analyse(copy.deepcopy(doc))["conclusions"])
    if doc.get("format") == "syncopate-hindsight/1":
        import hindsight
        again = hindsight.analyse(copy.deepcopy(doc))
        return stored, set(again["conclusions"])
    if "winners" in doc:
        import atlas
        _, table = atlas.winners(os.path.dirname(path))
        return stored, {w["sentence"] for w in table}
    if "configurations" in doc and all("per_seed" in c for c in doc["configurations"].values()):
        import study
        again = copy.deepcopy(doc)
        study.analyse(again)
        return stored, set(again["conclusions"])
    return stored, None


def check(path, root=ROOT):
    """Problems, quotes and files read of STUDY.md at `path`; cited paths are relative to `root`."""
    problems, quotes, cache = [], 0, {}
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for no, line in enumerate(lines, 1):
        if "≈" in APPROX_ALLOWED.sub("", line):
            problems.append(f"{path}:{no}: writes '≈': say 'not resolved' (or quote the tool's verdict)")
        found = list(QUOTE.finditer(line))
        if line.count("«") != len(found):
            problems.append(f"{path}:{no}: a « that opens no well-formed quote (one line: «SENTENCE» — [label](path.json))")
        for m in found:
            quotes += 1
            src = os.path.join(root, m["path"])
            if src not in cache:
                try:
                    with open(src) as f:
                        cache[src] = sentences(json.load(f), src)
                except (OSError, ValueError, KeyError, TypeError) as e:
                    cache[src] = None
                    problems.append(f"{path}:{no}: cites {m['path']}, which cannot be read ({type(e).__name__}: {e})")
            if cache[src] is None:
                continue
            stored, again = cache[src]
            if m["sentence"] not in stored:
                problems.append(f"{path}:{no}: quotes a sentence that {m['path']} does not state: «{m['sentence'][:120]}»"
                                " (re-run the tool and quote its sentence as written)")
            elif again is not None and m["sentence"] not in again:
                problems.append(f"{path}:{no}: {m['path']} states «{m['sentence'][:120]}» but its own data no longer "
                                "gives it (a stale file: rebuild it, then quote it again)")
    if quotes == 0:
        problems.append(f"{path}: quotes no sentence of the tool (every conclusion is quoted: «SENTENCE» — [label](path.json))")
    return problems, quotes, len([c for c in cache.values() if c is not None])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default=os.path.join(ROOT, "docs", "STUDY.md"))
    a = ap.parse_args()
    problems, quotes, files = check(a.study)
    for p in problems:
        print(p)
    print(f"check_study: {quotes} quoted sentence(s) from {files} file(s); {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
