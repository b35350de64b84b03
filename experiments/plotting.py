"""Matplotlib for the experiment scripts: pyplot() returns matplotlib.pyplot on the file-only Agg
backend, or None (with a line on stderr) where matplotlib is not installed, so every script still
writes its tables and JSON."""
import sys


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"[{sys.argv[0]}] matplotlib missing: no plots (pip install matplotlib)", file=sys.stderr)
        return None
    return plt
