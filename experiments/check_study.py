"""Checks that docs/STUDY.md says only what the tool said (issue 27).

  python experiments/check_study.py [--study docs/STUDY.md]

A conclusion in STUDY.md is quoted from the tool, never retyped: a line

  - «SENTENCE» — [label](path/to/summary.json)        a study's conclusion (its summary.json "conclusions")
  - «SENTENCE» — [label](path/to/atlas.json)          an atlas cell's verdict (its atlas.json winners' "sentence")

where SENTENCE must be one of that file's sentences, character for character (numbers, intervals, Holm
p and verdict included). The check re-reads every file STUDY.md cites this way and fails where a
quoted sentence is not in it, where a cited file is missing or unreadable, and where STUDY.md writes
"≈" (a difference the test did not resolve is "not resolved", never "about equal"). Paths are
relative to the repository root. Exit 0: every quote holds; 1: the problems, one per line.
"""
import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUOTE = re.compile(r"«(?P<sentence>[^»]+)»\s+—\s+\[[^\]]*\]\((?P<path>[^)]+\.json)\)")
APPROX_ALLOWED = re.compile(r"[\"“'`]≈[\"”'`]")  # the sign named in quotes (the rule itself), not used


def sentences(doc):
    """The sentences a tool's file states: a study's conclusions, an atlas's cell verdicts."""
    out = set(doc.get("conclusions") or [])
    out.update(w["sentence"] for w in doc.get("winners") or [] if w.get("sentence"))
    return out


def check(path):
    problems, quotes, cache = [], 0, {}
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for no, line in enumerate(lines, 1):
        if "≈" in APPROX_ALLOWED.sub("", line):
            problems.append(f"{path}:{no}: writes '≈': say 'not resolved' (or quote the tool's verdict)")
        for m in QUOTE.finditer(line):
            quotes += 1
            src = os.path.join(ROOT, m["path"])
            if src not in cache:
                try:
                    with open(src) as f:
                        cache[src] = sentences(json.load(f))
                except (OSError, ValueError) as e:
                    cache[src] = None
                    problems.append(f"{path}:{no}: cites {m['path']}, which cannot be read ({e})")
            if cache[src] is not None and m["sentence"] not in cache[src]:
                problems.append(f"{path}:{no}: quotes a sentence that {m['path']} does not state: «{m['sentence'][:120]}»"
                                " (re-run the tool and quote its sentence as written)")
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
