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


def mean_ci95(xs, lower=None):
    """{"mean", "ci95": [lo, hi], "n", "sd"} of the values xs (None values are left out). With one
    value the interval is [x, x] and flagged by n=1: it resolves nothing. lower: the quantity's own
    bound (0 for a time, a rate, a count): an interval reaching below it is cut there and flagged
    "clipped" (the mean lies above the bound, so the cut interval covers it as often)."""
    xs = [x for x in xs if x is not None]
    n = len(xs)
    if n == 0:
        return {"mean": None, "ci95": [None, None], "n": 0, "sd": None}
    m = sum(xs) / n
    if n == 1:
        return {"mean": m, "ci95": [m, m], "n": 1, "sd": None}
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    if no_variation(sd, xs):
        sd = 0.0
    half = t975(n - 1) * sd / math.sqrt(n)
    res = {"mean": m, "ci95": [m - half, m + half], "n": n, "sd": sd}
    if lower is not None and res["ci95"][0] < lower:
        res["ci95"][0] = lower
        res["clipped"] = True
    return res


def no_variation(sd, values):
    """True when a standard deviation is zero up to rounding (1e-9 of the values' scale): the seeds
    did not vary the quantity (deterministic runs), so a t interval would have zero width and
    prove nothing."""
    scale = max((abs(v) for v in values if v is not None), default=0.0)
    return sd is not None and sd <= 1e-9 * scale


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
    if s.get("sd") == 0:
        return f"{s['mean']:.{digits}g} (no seed variation)"
    return f"{s['mean']:.{digits}g} [{s['ci95'][0]:.{digits}g}, {s['ci95'][1]:.{digits}g}]"


# --- Student's t distribution (no scipy): the regularized incomplete beta function by its continued
# fraction (Numerical Recipes, 2nd ed., section 6.4, betacf), and the tests built on it. ---

def _betacf(a, b, x, itmax=300, eps=3e-16):
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, itmax + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta: no convergence for a={a}, b={b}, x={x}")


def betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc: x={x} outside [0, 1]")
    if x in (0.0, 1.0):
        return x
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t, df):
    """P(T <= t) for Student's t with df degrees of freedom (df > 0, not necessarily whole)."""
    if df <= 0:
        raise ValueError(f"t distribution needs df > 0, got {df}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1.0 - tail if t > 0 else tail


def t_two_sided_p(t, df):
    """P(|T| >= |t|)."""
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(q, df):
    """The q-quantile of Student's t (0 < q < 1), by bisection on t_cdf."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"t quantile needs 0 < q < 1, got {q}")
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def _as_seed_map(values):
    """{seed: value} from a dict or a list of (seed, value) pairs / {"seed", "value"} dicts."""
    if isinstance(values, dict):
        return {str(k): v for k, v in values.items()}
    out = {}
    for x in values:
        if isinstance(x, dict):
            out[str(x["seed"])] = x["value"]
        else:
            out[str(x[0])] = x[1]
    return out


def paired(a_values, b_values, level=0.95):
    """Paired comparison of a and b over seeds: a_values, b_values map seed -> value (a dict, or
    (seed, value) pairs). The differences a - b are taken seed by seed; a seed missing (or None)
    on either side is left out and counted in "left_out". Returns {"mean_diff", "ci95": [lo, hi],
    "t", "p" (two-sided, H0: mean difference 0), "n", "df", "sd", "seeds", "left_out", "diffs"}.
    With fewer than 2 pairs ci95, t and p are None (nothing is resolved). Where every pair gives the
    same difference (no_variation: deterministic runs, e.g. the simulator without jitter) the t
    interval has zero width: "deterministic" is True, ci95 is [d, d] and t and p are None, since no
    test can be made from no variation (never "resolved" by a zero-width interval)."""
    a, b = _as_seed_map(a_values), _as_seed_map(b_values)
    seeds = sorted((s for s in a if s in b and a[s] is not None and b[s] is not None),
                   key=lambda s: (len(s), s))
    left_out = len(set(a) | set(b)) - len(seeds)
    diffs = [a[s] - b[s] for s in seeds]
    n = len(diffs)
    res = {"mean_diff": None, "ci95": [None, None], "t": None, "p": None, "n": n, "df": max(n - 1, 0),
           "sd": None, "seeds": seeds, "left_out": left_out, "diffs": diffs}
    if n == 0:
        return res
    m = sum(diffs) / n
    res["mean_diff"] = m
    if n < 2:
        return res
    sd = math.sqrt(sum((d - m) ** 2 for d in diffs) / (n - 1))
    se = sd / math.sqrt(n)
    res["sd"] = sd
    if no_variation(sd, [a[s] for s in seeds] + [b[s] for s in seeds]):
        res.update(sd=0.0, ci95=[m, m], deterministic=True)
        return res
    half = t_quantile(0.5 + level / 2.0, n - 1) * se
    t = m / se
    res.update(t=t, p=t_two_sided_p(t, n - 1), ci95=[m - half, m + half])
    return res


def holm(ps):
    """Holm's step-down adjustment of the p-values ps (a family of tests): p_(i) sorted ascending
    becomes max_{j<=i} min(1, (m - j + 1) p_(j)), in the input order. None entries (tests that could
    not be run) stay None and do not count in m."""
    idx = sorted((i for i, p in enumerate(ps) if p is not None), key=lambda i: ps[i])
    m = len(idx)
    out = [None] * len(ps)
    running = 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def tost(diffs, margin, alpha=0.05):
    """Two one-sided tests for equivalence of paired differences within +-margin: H0a mean <= -margin
    and H0b mean >= +margin, each rejected at alpha. Returns {"equivalent", "p" (the larger of the
    two one-sided p-values), "p_lower", "p_upper", "margin", "mean", "ci90" ([lo, hi], the
    1 - 2 alpha interval that lies within +-margin exactly when equivalent), "n"}."""
    if margin is None or margin <= 0:
        raise ValueError(f"tost: the equivalence margin must be positive, got {margin}")
    xs = [d for d in diffs if d is not None]
    n = len(xs)
    res = {"equivalent": False, "p": None, "p_lower": None, "p_upper": None, "margin": margin,
           "mean": None, "ci90": [None, None], "n": n}
    if n < 2:
        if n:
            res["mean"] = xs[0]
        return res
    m = sum(xs) / n
    sd = math.sqrt(sum((d - m) ** 2 for d in xs) / (n - 1))
    se = sd / math.sqrt(n)
    res["mean"] = m
    if se == 0.0 or no_variation(sd, xs + [margin]):  # no variation: no test (see paired)
        res.update(ci90=[m, m], deterministic=True)
        return res
    df = n - 1
    p_lower = 1.0 - t_cdf((m + margin) / se, df)  # H0a: mean <= -margin
    p_upper = t_cdf((m - margin) / se, df)         # H0b: mean >= +margin
    half = t_quantile(1.0 - alpha, df) * se
    res.update(p_lower=p_lower, p_upper=p_upper, p=max(p_lower, p_upper), ci90=[m - half, m + half],
               equivalent=max(p_lower, p_upper) < alpha)
    return res


def median_censored(times):
    """The median time of a sample with censoring: times holds a value per seed, None where the seed
    never reached the target (censored at the run's end, i.e. later than any observed value). The
    censored seeds count as reaching it at +infinity (with a common censoring time this is the
    Kaplan-Meier median). Returns {"median" (None when half or more never reached it), "reached", "n"}."""
    n = len(times)
    reached = sorted(t for t in times if t is not None)
    res = {"median": None, "reached": len(reached), "n": n}
    if n == 0:
        return res
    xs = reached + [math.inf] * (n - len(reached))
    med = xs[(n - 1) // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
    res["median"] = None if math.isinf(med) else med
    return res


def kendall_tau_b(xs, ys):
    """Kendall's tau-b between two paired sequences (ties in either counted as neither concordant nor
    discordant, and normalised as tau-b does); None with fewer than two pairs or when one side is all
    ties."""
    if len(xs) != len(ys):
        raise ValueError("kendall_tau_b: sequences of different lengths")
    conc = disc = tx = ty = 0
    n = len(xs)
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tx += 1
            elif dy == 0:
                ty += 1
            elif (dx > 0) == (dy > 0):
                conc += 1
            else:
                disc += 1
    denom = math.sqrt((conc + disc + tx) * (conc + disc + ty))
    return (conc - disc) / denom if denom > 0 else None
