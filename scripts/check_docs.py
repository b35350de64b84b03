#!/usr/bin/env python3
"""Checks that the docs name only what exists (issue 32), so that they cannot drift from the code:

  1. every `--section.field` flag, and every `section.field` config field in backquotes, named
     in README.md or docs/*.md exists in the --help output of syncopate-worker, syncopate-server,
     syncopate-sim or syncopate-probe (a `[section]` in backquotes must be one of their sections);
  2. a paragraph that says "not yet" about a feature names none the binaries have (FEATURES below:
     a phrase, and the --help text that shows the feature exists);
  3. the metrics keys README's metrics paragraph lists are the ones the trainer writes to
     metrics.jsonl (worker/train/trainer.cpp): none listed that is not written, none written that
     is not listed.

Each problem is printed as FILE:LINE: what is wrong; exit status 1 if there is any. Known
exceptions (KNOWN below) are printed as such with their reason and do not fail the check.

usage: scripts/check_docs.py [--bin DIR] [--root DIR]
  --bin DIR   where the binaries are (default: ROOT/build/bin)
  --root DIR  the repository (default: this script's)
"""
import argparse
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BINARIES = ["syncopate-worker", "syncopate-server", "syncopate-sim", "syncopate-probe"]
# (file, the name it uses): a name the check flags there, and why it is not fixed here.
KNOWN = {
    ("docs/PERFORMANCE.md", "train.slowdown"):
        "the record of a removed field, in sections marked superseded by STUDY.md",
}
# "Not yet ... <phrase>" is wrong once --help shows <evidence>.
FEATURES = {
    "partitions": "ps_partition_mb",
    "delayed nesterov": "delayed_nesterov",
    "backup workers": "backup_workers",
    "bf16 wire": "wire",
    "int8": "int8",
    "tracing": "trace.file",
    "timeline": "trace.file",
}
# `section.field` in backquotes that are file names, not fields (model.safetensors, ps.sbatch).
FILE_SUFFIXES = {"safetensors", "sbatch", "cpp", "h", "py", "sh", "md", "json", "jsonl", "toml", "txt", "png",
                 "bin", "idx", "out", "log", "inc"}


def help_fields(bin_dir):
    """{"section.field"} and {"section"} from every binary's --help."""
    fields, sections = set(), set()
    for b in BINARIES:
        path = os.path.join(bin_dir, b)
        if not os.path.exists(path):
            raise SystemExit(f"check_docs: {path} is not built (scripts/build.sh, or give --bin DIR)")
        out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60).stdout
        for s, f in re.findall(r"--([a-z][a-z0-9_]*)\.([a-z][a-z0-9_]*)=", out):
            fields.add(f"{s}.{f}")
            sections.add(s)
    if not fields:
        raise SystemExit("check_docs: the binaries' --help listed no --section.field flags")
    return fields, sections


def help_text(bin_dir):
    return "\n".join(subprocess.run([os.path.join(bin_dir, b), "--help"], capture_output=True, text=True,
                                    timeout=60).stdout for b in BINARIES)


def check_not_yet(root, text, problems):
    """A paragraph saying "not yet" must not name a feature that --help shows exists."""
    for path in doc_files(root):
        rel = os.path.relpath(path, root)
        lines = open(path, encoding="utf-8").read().split("\n")
        for no, line in enumerate(lines, start=1):
            at = line.lower().find("not yet")
            if at < 0:
                continue
            para, j = line[at:], no  # the rest of the paragraph
            while j < len(lines) and lines[j].strip() and not lines[j].lstrip().startswith(("-", "#", "|")):
                para += " " + lines[j]
                j += 1
            para = re.sub(r"\s+", " ", para.lower())
            for phrase, evidence in FEATURES.items():
                if phrase in para and evidence in text:
                    problems.append((rel, no, phrase, f"says \"not yet\" about {phrase}, but --help lists {evidence}"))


def doc_files(root):
    return [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))


def check_names(root, fields, sections, problems):
    for path in doc_files(root):
        rel = os.path.relpath(path, root)
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().split("\n")
        for no, line in enumerate(lines, start=1):
            seen = set()
            for s, f in re.findall(r"(?<![\w-])--([a-z][a-z0-9_]*)\.([a-z][a-z0-9_]*)", line):
                name = f"{s}.{f}"
                if f in FILE_SUFFIXES or name in fields:
                    continue
                seen.add(name)
                problems.append((rel, no, name, f"--{name} is not a flag of {', '.join(BINARIES)} (--help)"))
            for span in re.findall(r"`([^`]+)`", line):
                for s, f in re.findall(r"(?<![\w./-])([a-z][a-z0-9_]*)\.([a-z][a-z0-9_]*)(?![\w/.(-])", span):
                    name = f"{s}.{f}"
                    if s not in sections or f in FILE_SUFFIXES or name in fields or name in seen:
                        continue
                    seen.add(name)
                    problems.append((rel, no, name, f"config field {name} does not exist ({s} has no field {f})"))
                if not re.fullmatch(r"(\[[a-z][a-z0-9_]*\]\s*)+", span.strip()):
                    continue  # `[a] [b]`: a list of sections
                for s in re.findall(r"\[([a-z][a-z0-9_]*)\]", span):
                    if s not in sections:
                        problems.append((rel, no, f"[{s}]", f"[{s}] is not a config section of {', '.join(BINARIES)}"))


def written_metrics(root):
    """Keys of the trainer's metrics.jsonl records: every record built as `nlohmann::json m = {...};`
    (the step record, the evaluation record) and every key set later as m["key"] = ... or
    record["key"] = ... (the evaluation's optional fields, a deferred snapshot's)."""
    path = os.path.join(root, "worker", "train", "trainer.cpp")
    src = open(path, encoding="utf-8").read()
    blocks = [src[m.end():src.find("};", m.end())] for m in re.finditer(r"nlohmann::json m = \{", src)]
    if not any('{"step"' in b for b in blocks) or "metrics->write(" not in src:
        raise SystemExit(f"check_docs: cannot find the metrics records in {path} (nlohmann::json m = {{{{\"step\"... "
                         "and metrics->write(...)): update written_metrics() in scripts/check_docs.py")
    keys = set()
    for b in blocks:
        keys |= set(re.findall(r'\{"([a-z_]+)",', b))
    return keys | set(re.findall(r'(?:\bm|record)\["([a-z_]+)"\]\s*=', src))


def check_metrics(root, problems):
    path = os.path.join(root, "README.md")
    lines = open(path, encoding="utf-8").read().split("\n")
    first = next((i for i, l in enumerate(lines) if l.startswith("- **Metrics**")), None)
    if first is None:
        problems.append(("README.md", 1, "metrics", "no '- **Metrics**' paragraph listing the metrics.jsonl keys"))
        return
    last = first + 1
    while last < len(lines) and lines[last].startswith("  ") and not lines[last].startswith("- "):
        last += 1
    text = "\n".join(lines[first:last])  # a backquoted list may run over several lines
    listed = {}
    for m in re.finditer(r"`([^`]+)`", text):
        no = first + 1 + text.count("\n", 0, m.start())
        for k in re.split(r"[,\s]+", m.group(1)):
            if re.fullmatch(r"[a-z_]+", k):
                listed.setdefault(k, no)
    written = written_metrics(root)
    for k, no in sorted(listed.items(), key=lambda x: x[1]):
        if k not in written:
            problems.append(("README.md", no, k, f"metrics key '{k}' is listed but the trainer does not write it"))
    for k in sorted(written - set(listed)):
        problems.append(("README.md", first + 1, k,
                         f"metrics key '{k}' is written by worker/train/trainer.cpp but not listed in the metrics paragraph"))


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=ROOT, help="the repository (default: %(default)s)")
    ap.add_argument("--bin", help="where the binaries are (default: ROOT/build/bin)")
    a = ap.parse_args(argv)
    bin_dir = a.bin or os.path.join(a.root, "build", "bin")
    fields, sections = help_fields(bin_dir)
    problems = []
    check_names(a.root, fields, sections, problems)
    check_not_yet(a.root, help_text(bin_dir), problems)
    check_metrics(a.root, problems)
    failed = 0
    for rel, no, name, what in problems:
        reason = KNOWN.get((rel, name))
        if reason:
            print(f"{rel}:{no}: known: {what} ({reason})")
        else:
            print(f"{rel}:{no}: {what}")
            failed += 1
    for (rel, name), reason in sorted(KNOWN.items()):
        if not any(p[0] == rel and p[2] == name for p in problems):
            print(f"{rel}: note: the known exception for {name} no longer occurs: remove it from KNOWN")
    print(f"check_docs: {len(doc_files(a.root))} files, {len(fields)} fields in --help, "
          f"{failed} problem(s), {len(problems) - failed} known exception(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
