"""Statistics for studies over seeds: a mean with its 95% confidence interval (Student's t over
seeds), and whether two intervals separate. Plain Python (no scipy): the t quantiles are tabled."""
import math

# Two-sided 95% quantiles of Student's t, t_{0.975, df}, df = 1..30 (standard tables).
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t975(df):
    """t_{0.975} with df degrees of freedom (df >= 1); past 30, 1.96 + 2.4/df (within 0.003)."""
    if df < 1:
        raise ValueError(f"t quantile needs df >= 1, got {df}")
    return _T975[df - 1] if df <= 30 else 1.96 + 2.4 / df


def mean_ci95(xs):
    """{"mean", "ci95": [lo, hi], "n", "sd"} of the values xs (None values are left out). With one
    value the interval is [x, x] and flagged by n=1: it resolves nothing."""
    xs = [x for x in xs if x is not None]
    n = len(xs)
    if n == 0:
        return {"mean": None, "ci95": [None, None], "n": 0, "sd": None}
    m = sum(xs) / n
    if n == 1:
        return {"mean": m, "ci95": [m, m], "n": 1, "sd": None}
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return {"mean": m, "ci95": [m - half, m + half], "n": n, "sd": sd}


def separated(a, b):
    """True when both intervals rest on at least 2 values and do not overlap."""
    if a["n"] < 2 or b["n"] < 2 or a["mean"] is None or b["mean"] is None:
        return False
    return a["ci95"][1] < b["ci95"][0] or b["ci95"][1] < a["ci95"][0]


def fmt_ci(s, digits=3):
    """'m [lo, hi]' of a mean_ci95 result, or 'n/a'."""
    if s["mean"] is None:
        return "n/a"
    if s["n"] < 2:
        return f"{s['mean']:.{digits}g} (1 seed)"
    return f"{s['mean']:.{digits}g} [{s['ci95'][0]:.{digits}g}, {s['ci95'][1]:.{digits}g}]"
