"""Scenarios: a TOML file describes a target cluster (model, batch, nodes, device, link, stragglers);
derive() turns it into an emulation on this machine that keeps the target's dimensionless ratio
(communication time / compute time per step) while the small model learns for real.

  [target]                      the cluster the emulation stands for
  name, params, tokens_per_node_step, nodes, peak_tflops, mfu, link_gbit, wire_bytes, latency_ms
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
  emulated latency  L_e = latency_ms * d   (one way, per message: every ring hop, every push and reply)
so that latency / compute holds as well. The emulated links have a latency of their own (veth, the
kernel, ZeroMQ: LINK_OWN_LATENCY_MS); the emulation adds the rest, max(0, L_e - own), with a userspace
delay line (scripts/local_cluster.sh --latency-ms: the ring nodes' DelayedConnection, the servers'
ZmqDelayLine), and the simulator takes own + added. Where L_e is below the links' own latency (a
fast data-centre network, dilated), nothing is added and the emulation's latency is too long: derive
says so in "latency_note".
"""
import tomllib

FIELDS = {
    "target": {"name": str, "params": int, "tokens_per_node_step": int, "nodes": int, "peak_tflops": float,
               "mfu": float, "link_gbit": float, "wire_bytes": int, "latency_ms": float},
    "emulation": {"preset": str, "batch": int, "step_time_s": float, "max_cpu": float},
    "stragglers": {"slow_node": int, "slowdown": float, "jitter": float},
}
DEFAULTS = {
    # latency_ms: one-way propagation latency of the target's links (0.01 ms: one switch in a rack)
    "target": {"peak_tflops": 989.0, "mfu": 0.4, "wire_bytes": 2, "latency_ms": 0.01},
    "emulation": {"preset": "tiny", "batch": 8, "step_time_s": 0.3, "max_cpu": 0.7},
    "stragglers": {"slow_node": -1, "slowdown": 1.0, "jitter": 0.0},
}
RANGES = {
    ("target", "params"): (1, 10 ** 13), ("target", "tokens_per_node_step"): (1, 10 ** 12),
    ("target", "nodes"): (1, 4096), ("target", "peak_tflops"): (1e-3, 1e6), ("target", "mfu"): (1e-4, 1.0),
    ("target", "link_gbit"): (1e-6, 1e5), ("target", "wire_bytes"): (1, 8), ("target", "latency_ms"): (0.0, 10000.0),
    ("emulation", "batch"): (1, 4096), ("emulation", "step_time_s"): (0.01, 600.0),
    ("emulation", "max_cpu"): (0.05, 1.0),
    ("stragglers", "slow_node"): (-1, 4095), ("stragglers", "slowdown"): (1.0, 1000.0),
    ("stragglers", "jitter"): (0.0, 100.0),
}
# The emulated links' own one-way latency (veth pair, kernel, ZeroMQ or the ring's transport), ms.
LINK_OWN_LATENCY_MS = 0.05
# The message sizes a target job runs with (the trainer's defaults: BytePS's 4 MiB partitions, the
# ring's 256 KiB segments, DDP's 25 MiB buckets with a 1 MiB first bucket).
TARGET_SIZES = {"ps_partition_mb": 4.0, "segment_kb": 256, "bucket_kb": 25600, "first_bucket_kb": 1024}
# The smallest values a derived size takes: 1 KiB each (below it per-message costs, not bytes, would set
# the time: the message structure would no longer be the target's). (With dist.wire=int8 a partition
# under 4096 values holds less than one scale group, so its rounding is finer than the target's.)
SIZE_FLOORS = {"ps_partition_mb": 1 / 1024, "segment_kb": 1, "bucket_kb": 1, "first_bucket_kb": 1}
SIZE_NOUNS = {"ps_partition_mb": "partitions", "segment_kb": "segments", "bucket_kb": "buckets",
              "first_bucket_kb": "first buckets"}
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


def latency_note(scaled_ms):
    """What the emulation does with a scaled one-way latency: adds the part above its links' own, or
    says that its own latency is already longer than the target's (dilated)."""
    if scaled_ms >= LINK_OWN_LATENCY_MS:
        return (f"{scaled_ms:.3g} ms one way: the links' own ~{LINK_OWN_LATENCY_MS:g} ms plus "
                f"{scaled_ms - LINK_OWN_LATENCY_MS:.3g} ms held by the delay line")
    return (f"the target's latency scales to {scaled_ms * 1e3:.3g} us, below the emulated links' own "
            f"~{LINK_OWN_LATENCY_MS * 1e3:g} us: nothing added, the emulation's latency is the longer")


def scaled_sizes(sc, nodes=None, servers=None):
    """The message sizes that keep the target's message structure: each scaled by the ratio of
    parameters (small model / target; the sizes count float32 values), so that partitions per shard,
    segments per ring chunk and buckets per backward are the target's. Returns {"bytes_ratio" (the
    ratio, kept under its old name: the ratio of float32 bytes),
    "flags" ({dist field: emulated value}), "target" ({field: target value}), "counts" (per field:
    {"target", "emulated"} message counts), "warnings" (a size raised to its floor, and what that
    does to fidelity)}."""
    t, e = sc["target"], sc["emulation"]
    n = nodes or t["nodes"]
    k = servers or n
    # The trainer's sizes count float32 values (a partition of 4 MiB holds 1 Mi values, whatever the
    # wire then sends of them), so the ratio that keeps the counts is the ratio of parameters.
    small, target = float(PRESET_PARAMS[e["preset"]]), float(t["params"])
    ratio = small / target
    flags, warnings = {}, []
    for field, size in TARGET_SIZES.items():
        raw = size * ratio
        floor = SIZE_FLOORS[field]
        if raw < floor:
            warnings.append(f"dist.{field}: the target's {size:g} scales to {raw:.3g}, below the smallest valid "
                            f"{floor:.3g}; raised to it, so the emulation sends fewer, larger {SIZE_NOUNS[field]} "
                            "than the target would (its message count is lower, its pipelining coarser)")
            raw = floor
        flags[field] = raw if field == "ps_partition_mb" else max(1, int(round(raw)))

    def count(values, piece_bytes):  # pieces of piece_bytes of float32 in `values` values
        return max(1, -(-int(values) // max(1, int(piece_bytes // 4))))
    mib, kib = 2 ** 20, 2 ** 10
    counts = {
        "partitions_per_shard": {"target": count(target / k, TARGET_SIZES["ps_partition_mb"] * mib),
                                 "emulated": count(small / k, flags["ps_partition_mb"] * mib)},
        "segments_per_ring_chunk": {"target": count(target / n, TARGET_SIZES["segment_kb"] * kib),
                                    "emulated": count(small / n, flags["segment_kb"] * kib)},
        "buckets_per_backward": {"target": 1 + count(max(0.0, target - TARGET_SIZES["first_bucket_kb"] * kib / 4),
                                                     TARGET_SIZES["bucket_kb"] * kib),
                                 "emulated": 1 + count(max(0.0, small - flags["first_bucket_kb"] * kib / 4),
                                                       flags["bucket_kb"] * kib)},
    }
    return {"bytes_ratio": ratio, "flags": flags, "target": dict(TARGET_SIZES), "counts": counts,
            "warnings": warnings}


def size_flags(sizes):
    """The worker flags of scaled_sizes()' emulated values."""
    return [f"--dist.{f}={v:.6g}" if isinstance(v, float) else f"--dist.{f}={v}" for f, v in sizes["flags"].items()]


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
    scaled_latency = t["latency_ms"] * step / compute_t  # one way, emulated ms: the target's, dilated
    return {"nodes": n, "target_compute_s": compute_t, "target_comm_s": comm_t, "ratio": ratio,
            "step_time_s": step, "dilation": step / compute_t, "link_gbit": link,
            "target_latency_ms": t["latency_ms"], "scaled_latency_ms": scaled_latency,
            "latency_ms": max(0.0, scaled_latency - LINK_OWN_LATENCY_MS), "latency_note": latency_note(scaled_latency),
            "slow_node": sc["stragglers"]["slow_node"], "slowdown": sc["stragglers"]["slowdown"],
            "jitter": sc["stragglers"]["jitter"], "preset": e["preset"], "batch": e["batch"],
            "max_cpu": e["max_cpu"], "name": t["name"]}
