#!/usr/bin/env python3
"""Checks the include structure of the C++ sources: every project include goes to the same or a
lower layer, and no file includes itself through others (no cycle). Exit status 1 and one line per
violation otherwise.

Layers, lowest first (a file may include only its own layer and the ones above it in this list):
  common          errors, logging, config, files, safetensors, the optimizer, text/, data/
  common/comm     everything that moves bytes between replicas (knows nothing of training)
  model           the GPT model and its flat parameter buffers
  server          the parameter-server protocol: header, client, rules, shard, server loop
  worker/data, worker/metrics, worker/checkpoint   a run's data, metrics and checkpoints
  worker/sync     the step's synchronization (GradientSync and its implementations)
  worker/train    the training loop and its config
  worker          the command-line programs
  experiments, tests

Usage: scripts/check_layers.py [ROOT]
"""
import os
import re
import sys

LAYERS = [
    ("common/comm/", 1), ("common/", 0), ("model/", 2), ("server/", 3),
    ("worker/data/", 4), ("worker/metrics/", 4), ("worker/checkpoint/", 4),
    ("worker/sync/", 5), ("worker/train/", 6), ("worker/", 7),
    ("experiments/", 8), ("tests/", 8),
]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer(path):
    for prefix, n in LAYERS:  # most specific prefixes first within each family
        if path.startswith(prefix):
            return n
    return None


def main(root):
    files = []
    for top in ("common", "model", "server", "worker", "experiments", "tests"):
        for d, _, names in os.walk(os.path.join(root, top)):
            for n in names:
                if n.endswith((".h", ".cpp", ".inl", ".inc")):
                    files.append(os.path.relpath(os.path.join(d, n), root))
    known = set(files)
    graph, bad = {}, []
    for f in sorted(files):
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            incs = INCLUDE.findall(fh.read())
        deps = []
        for inc in incs:
            target = inc if inc in known else os.path.normpath(os.path.join(os.path.dirname(f), inc))
            if target not in known:
                continue  # a system or generated header
            deps.append(target)
            if layer(target) > layer(f):
                bad.append(f"{f} includes {target}: a lower layer may not include a higher one "
                           f"(see scripts/check_layers.py for the order)")
        graph[f] = deps
    # Cycles: depth-first search with colours.
    colour, stack = {}, []

    def visit(n):
        colour[n] = 1
        stack.append(n)
        for m in graph.get(n, []):
            if colour.get(m) == 1:
                bad.append("include cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            elif m not in colour:
                visit(m)
        stack.pop()
        colour[n] = 2

    for f in sorted(graph):
        if f not in colour:
            visit(f)
    for b in bad:
        print(b)
    print(f"check_layers: {len(files)} files, {sum(len(v) for v in graph.values())} project includes, "
          f"{len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")))
