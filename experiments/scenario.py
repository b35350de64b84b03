"""Scenarios: a TOML file describes a target cluster (model, batch, nodes, device, link, stragglers);
derive() turns it into an emulation on this machine that keeps the target's dimensionless ratio
(communication time / compute time per step) while the small model learns for real.

  [target]                      the cluster the emulation stands for
  name, params, tokens_per_node_step, nodes, peak_tflops, mfu, link_gbit, wire_bytes
  [emulation]                   how this machine plays it
  preset, batch, step_time_s, max_cpu
  [stragglers]
  slow_node (-1: none), slowdown (>= 1), jitter (>= 0, mean fraction of an exponential extra time)

Derivation (docs/STUDY.md):
  target compute  T_t = 6 * params * tokens_per_node_step / (peak_tflops * 1e12 * mfu)
  target comm     C_t = 2 (n-1)/n * params * wire_bytes / (link_gbit * 1e9 / 8)   (ring, per step)
  ratio           r   = C_t / T_t
  dilation        d   = step_time_s / T_t       (emulated seconds per target second)
  emulated link   B_e = 2 (n-1)/n * small_params * 4 bytes / (r * step_time_s)  -> Gbit/s
so that (bytes the small model sends / B_e) / step_time_s = r, the target's ratio.
"""
import tomllib

FIELDS = {
    "target": {"name": str, "params": int, "tokens_per_node_step": int, "nodes": int, "peak_tflops": float,
               "mfu": float, "link_gbit": float, "wire_bytes": int},
    "emulation": {"preset": str, "batch": int, "step_time_s": float, "max_cpu": float},
    "stragglers": {"slow_node": int, "slowdown": float, "jitter": float},
}
DEFAULTS = {
    "target": {"peak_tflops": 989.0, "mfu": 0.4, "wire_bytes": 2},
    "emulation": {"preset": "tiny", "batch": 8, "step_time_s": 0.3, "max_cpu": 0.7},
    "stragglers": {"slow_node": -1, "slowdown": 1.0, "jitter": 0.0},
}
RANGES = {
    ("target", "params"): (1, 10 ** 13), ("target", "tokens_per_node_step"): (1, 10 ** 12),
    ("target", "nodes"): (1, 4096), ("target", "peak_tflops"): (1e-3, 1e6), ("target", "mfu"): (1e-4, 1.0),
    ("target", "link_gbit"): (1e-6, 1e5), ("target", "wire_bytes"): (1, 8),
    ("emulation", "batch"): (1, 4096), ("emulation", "step_time_s"): (0.01, 600.0),
    ("emulation", "max_cpu"): (0.05, 1.0),
    ("stragglers", "slow_node"): (-1, 4095), ("stragglers", "slowdown"): (1.0, 1000.0),
    ("stragglers", "jitter"): (0.0, 100.0),
}
# Elements of the flat parameter buffer the presets send (vocabulary rows padded to 320).
PRESET_PARAMS = {"micro": 124_672, "tiny": 454_144, "small": 3_307_008}


class ScenarioError(ValueError):
    pass


def load(path):
    """The scenario as {section: {field: value}}, defaults filled in; ScenarioError names a bad field."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ScenarioError(f"{path}: cannot read the scenario: {e}") from e
    return validate(raw, path)


def validate(raw, source="scenario"):
    out = {}
    for section in raw:
        if section not in FIELDS:
            raise ScenarioError(f"{source}: unknown section [{section}]; allowed: {', '.join(FIELDS)}")
    for section, fields in FIELDS.items():
        got = dict(DEFAULTS.get(section, {}))
        for key, value in raw.get(section, {}).items():
            if key not in fields:
                raise ScenarioError(f"{source}: unknown field {section}.{key}; allowed: {', '.join(fields)}")
            typ = fields[key]
            if typ is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, typ) or isinstance(value, bool):
                raise ScenarioError(f"{source}: {section}.{key} = {value!r} must be a {typ.__name__}")
            lo_hi = RANGES.get((section, key))
            if lo_hi and not lo_hi[0] <= value <= lo_hi[1]:
                raise ScenarioError(f"{source}: {section}.{key} = {value} is outside [{lo_hi[0]}, {lo_hi[1]}]")
            got[key] = value
        missing = [k for k in fields if k not in got]
        if missing:
            raise ScenarioError(f"{source}: [{section}] lacks {', '.join(missing)}")
        out[section] = got
    s = out["stragglers"]
    if s["slow_node"] >= out["target"]["nodes"]:
        raise ScenarioError(f"{source}: stragglers.slow_node = {s['slow_node']} but the target has "
                            f"{out['target']['nodes']} nodes (0..{out['target']['nodes'] - 1}, or -1 for none)")
    if out["emulation"]["preset"] not in PRESET_PARAMS:
        raise ScenarioError(f"{source}: emulation.preset = {out['emulation']['preset']!r}; "
                            f"allowed: {', '.join(PRESET_PARAMS)}")
    return out


def ring_factor(n):
    return 2.0 * (n - 1) / n if n > 1 else 0.0


def derive(sc, nodes=None, step_time_s=None):
    """The emulation of a scenario on `nodes` emulated nodes (default: the target's count), with
    the modelled step time step_time_s (default: the scenario's): step_time_s, dilation, link_gbit,
    ratio and the target's compute and communication seconds per step."""
    t, e = sc["target"], sc["emulation"]
    n = nodes or t["nodes"]
    compute_t = 6.0 * t["params"] * t["tokens_per_node_step"] / (t["peak_tflops"] * 1e12 * t["mfu"])
    comm_t = ring_factor(n) * t["params"] * t["wire_bytes"] / (t["link_gbit"] * 1e9 / 8)
    ratio = comm_t / compute_t
    small_bytes = ring_factor(n) * PRESET_PARAMS[e["preset"]] * 4
    step = step_time_s or e["step_time_s"]
    link = small_bytes * 8 / (ratio * step) / 1e9 if ratio > 0 else None
    return {"nodes": n, "target_compute_s": compute_t, "target_comm_s": comm_t, "ratio": ratio,
            "step_time_s": step, "dilation": step / compute_t, "link_gbit": link,
            "slow_node": sc["stragglers"]["slow_node"], "slowdown": sc["stragglers"]["slowdown"],
            "jitter": sc["stragglers"]["jitter"], "preset": e["preset"], "batch": e["batch"],
            "max_cpu": e["max_cpu"], "name": t["name"]}
