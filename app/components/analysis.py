"""Pure helpers behind the dashboard: plan building, editing, diffing and tables.

Nothing here imports Streamlit, so tests call these functions directly. Plans travel between
functions as plain dicts (``Plan.to_dict()``) or JSON strings, which is what the page caches key
on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pandas as pd

from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import Action, Plan, format_schedule, parse_actions, plan_from_dict
from octopipe_core.plan import validate_plan as _validate_plan
from octopipe_core.profile import COST_FIELDS, FAMILIES, OPTIONAL_FIELDS, Profile
from octopipe_core.schedules import PARTITIONS, SCHEDULES, build_plan
from octopipe_core.simulator import SimResult, simulate

BUBBLE_DEFINITION = "bubble ratio = idle device time / (devices × step time)"
COMM_OVERLAP_DEFINITION = "comm overlap = share of transfer time hidden under compute"


@dataclass(frozen=True)
class Settings:
    """The plain data a plan is built from (also what the shareable URL carries)."""

    devices: int = 8
    microbatches: int = 32
    schedule: str = "1f1b"
    chunks: int = 2
    partition: str = "uniform"
    memory_gib: float | None = None


def plan_json(plan: Plan) -> str:
    """A canonical JSON string of a plan (cache key and download body)."""
    return json.dumps(plan.to_dict(), sort_keys=True)


def plan_from_json(text: str) -> Plan:
    return plan_from_dict(json.loads(text))


def peer_plan(profile: Profile, s: Settings) -> Plan:
    """The peer schedule's plan for settings ``s`` (raises OctoPipeError if impossible)."""
    return build_plan(profile, s.schedule, s.devices, s.microbatches, s.chunks, s.partition)


def peer_keys() -> list[str]:
    """Every peer as ``schedule/partition`` (the names ``baselines`` uses)."""
    return [f"{s}/{p}" for s in SCHEDULES for p in PARTITIONS]


def split_peer_key(key: str) -> tuple[str, str]:
    sched, _, part = key.partition("/")
    return sched, part or "uniform"


# --------------------------------------------------------------------------------------------
# Metrics
METRIC_COLUMNS = {
    "step_time_ms": "step time (ms)",
    "tokens_per_gpu_per_s": "tokens/GPU/s",
    "bubble_ratio": "bubble ratio",
    "comm_overlap_ratio": "comm overlap",
    "max_peak_memory_gib": "peak memory (GiB)",
    "fits_memory": "fits cap",
}


# Present only when the plan runs on a cluster (``SimResult.metrics`` adds them)
CLUSTER_METRICS = (
    "cluster",
    "layout",
    "gpus",
    "inter_node_boundaries",
    "compute_end_ms",
    "exposed_tail_ms",
    "grad_sync_ms",
)


def summary_metrics(result: SimResult) -> dict[str, Any]:
    """The few numbers the dashboard shows for a simulated plan."""
    m = result.metrics()
    return {
        "step_time_ms": m["step_time_ms"],
        "tokens_per_gpu_per_s": m["tokens_per_gpu_per_s"],
        "bubble_ratio": m["bubble_ratio"],
        "comm_overlap_ratio": m["comm_overlap_ratio"],
        "max_peak_memory_gib": max(m["peak_memory_gib"], default=0.0),
        "peak_memory_gib": m["peak_memory_gib"],
        "fits_memory": m["fits_memory"],
        "memory_cap_gib": m["memory_cap_gib"],
        "lower_bound_ms": m["lower_bound_ms"],
        "stages": m["stages"],
        "devices": m["devices"],
        "microbatches": m["microbatches"],
        **{k: m[k] for k in CLUSTER_METRICS if k in m},
    }


def metrics_table(named: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """One row per plan, with deltas against the first plan (the reference).

    >>> t = metrics_table({"a": {"step_time_ms": 10.0, "tokens_per_gpu_per_s": 100.0,
    ...     "bubble_ratio": 0.2, "comm_overlap_ratio": 1.0, "max_peak_memory_gib": 5.0,
    ...     "fits_memory": True}, "b": {"step_time_ms": 8.0, "tokens_per_gpu_per_s": 125.0,
    ...     "bubble_ratio": 0.1, "comm_overlap_ratio": 1.0, "max_peak_memory_gib": 6.0,
    ...     "fits_memory": True}})
    >>> float(t.loc["b", "Δ step time (%)"]), float(t.loc["b", "speedup (×)"])
    (-20.0, 1.25)
    """
    rows = []
    ref: dict[str, Any] | None = None
    for name, m in named.items():
        ref = ref or m
        row: dict[str, Any] = {"plan": name}
        for key, label in METRIC_COLUMNS.items():
            row[label] = m[key]
        row["Δ step time (%)"] = round(100.0 * (m["step_time_ms"] / ref["step_time_ms"] - 1), 2)
        row["speedup (×)"] = round(ref["step_time_ms"] / m["step_time_ms"], 3)
        row["Δ tokens/GPU/s (%)"] = round(
            100.0 * (m["tokens_per_gpu_per_s"] / ref["tokens_per_gpu_per_s"] - 1), 2
        )
        row["Δ peak memory (GiB)"] = round(m["max_peak_memory_gib"] - ref["max_peak_memory_gib"], 3)
        rows.append(row)
    return pd.DataFrame(rows).set_index("plan")


TABLE_FORMATS = {
    "step time (ms)": "{:,.1f}",
    "tokens/GPU/s": "{:,.0f}",
    "bubble ratio": "{:.3f}",
    "comm overlap": "{:.2f}",
    "peak memory (GiB)": "{:.1f}",
    "Δ step time (%)": "{:+.1f}",
    "speedup (×)": "{:.3f}",
    "Δ tokens/GPU/s (%)": "{:+.1f}",
    "Δ peak memory (GiB)": "{:+.1f}",
}


def format_metrics_table(table: pd.DataFrame) -> pd.DataFrame:
    """``metrics_table`` as display strings; a delta that rounds to zero is "±0", never a
    signed zero.

    >>> t = pd.DataFrame({"Δ step time (%)": [0.0, -0.04, 12.5], "fits cap": [True, False, True]})
    >>> format_metrics_table(t).to_dict("list")
    {'Δ step time (%)': ['±0', '±0', '+12.5'], 'fits cap': ['yes', 'NO', 'yes']}
    """
    out = pd.DataFrame(index=table.index)
    for col in table.columns:
        fmt = TABLE_FORMATS.get(col)
        vals = table[col]
        if col == "fits cap":
            out[col] = ["yes" if v else "NO" for v in vals]
        elif fmt is None:
            out[col] = vals
        else:
            texts = [fmt.format(v) for v in vals]
            zero = [float(t.replace(",", "")) == 0 for t in texts]
            out[col] = ["±0" if z and "+" in fmt else t for t, z in zip(texts, zero, strict=True)]
    return out


def headline(name: str, m: dict[str, Any], ref_name: str, ref: dict[str, Any]) -> str:
    """The Overview's one-line verdict: ``name`` against the reference, faster or slower, and
    plainly which of them does not fit the memory cap.

    >>> ok = {"step_time_ms": 100.0, "fits_memory": True, "max_peak_memory_gib": 70.0,
    ...       "memory_cap_gib": 80.0}
    >>> headline("tuned", ok, "1F1B", {**ok, "step_time_ms": 150.0})
    'tuned is 1.50× faster than 1F1B'
    >>> headline("tuned", {**ok, "step_time_ms": 200.0}, "1F1B", ok)
    'tuned is 2.00× slower than 1F1B'
    >>> headline("tuned", ok, "1F1B", {**ok, "fits_memory": False, "max_peak_memory_gib": 92.4})
    'tuned is 1.00× as fast as 1F1B, which does not fit the 80 GiB cap (peak 92.4 GiB)'
    """
    x = ref["step_time_ms"] / m["step_time_ms"]
    if round(x, 2) == 1.0:
        verdict = f"{name} is {x:.2f}× as fast as {ref_name}"
    elif x > 1:
        verdict = f"{name} is {x:.2f}× faster than {ref_name}"
    else:
        verdict = f"{name} is {1 / x:.2f}× slower than {ref_name}"
    cap = m["memory_cap_gib"]
    if not m["fits_memory"] and not ref["fits_memory"]:
        return f"{verdict}; neither fits the {cap:g} GiB cap"
    if not m["fits_memory"]:
        return f"{verdict}, but it does not fit the {cap:g} GiB cap (peak " + (
            f"{m['max_peak_memory_gib']:.1f} GiB)"
        )
    if not ref["fits_memory"]:
        return (
            f"{verdict}, which does not fit the {cap:g} GiB cap (peak "
            f"{ref['max_peak_memory_gib']:.1f} GiB)"
        )
    return verdict


# --------------------------------------------------------------------------------------------
# Profile tables and edits
def layers_frame(profile: Profile) -> pd.DataFrame:
    """One row per layer: index, type, family and its costs (ms, MiB)."""
    rows = []
    for i, lt in enumerate(profile.layer_costs()):
        rows.append(
            {
                "layer": i,
                "type": lt.name,
                "family": lt.family,
                "F (ms)": lt.forward_ms,
                "B (ms)": lt.backward_input_ms,
                "W (ms)": lt.backward_weight_ms,
                "activation (MiB)": lt.activation_mib,
                "weights (MiB)": lt.weight_mib,
            }
        )
    return pd.DataFrame(rows)


TYPE_COLUMNS = ("family", *COST_FIELDS, *OPTIONAL_FIELDS)


def layer_types_frame(profile: Profile) -> pd.DataFrame:
    """The editable layer-type table: one row per type, the profile's own field names."""
    counts = pd.Series(profile.layers).value_counts()
    rows = []
    for t in profile.layer_types:
        d = {c: getattr(t, c) for c in TYPE_COLUMNS}  # every column, workspace 0 included
        rows.append({"type": t.name, "count": int(counts.get(t.name, 0)), **d})
    return pd.DataFrame(rows, columns=["type", "count", *TYPE_COLUMNS])


def profile_with_types(profile: Profile, edited: pd.DataFrame) -> Profile:
    """A copy of ``profile`` with the layer types of ``edited``; validated like a file.

    Raises OctoPipeError (one line) when a value is missing, negative or inconsistent.
    """
    d = profile.to_dict()
    types: dict[str, Any] = {}
    for row in edited.to_dict("records"):
        name = str(row["type"])
        entry: dict[str, Any] = {}
        for col in TYPE_COLUMNS:
            v = row.get(col)
            if col == "family":
                entry[col] = v
                continue
            if v is None or (isinstance(v, float) and v != v):
                raise OctoPipeError(f"layer type '{name}': {col} is empty; fix: enter a number")
            entry[col] = float(v)
        types[name] = entry
    d["layer_types"] = types
    d.pop("source", None)
    return Profile.from_dict(d, source="edited table")


def provenance(profile: Profile) -> str:
    """Where a profile's numbers come from and the device they are for, in one sentence.

    >>> from octopipe_core.profile import load_sample
    >>> provenance(load_sample("nemotron-h-56b"))[:66]
    'Analytic, not measured: derived by the cost model for H800 (80 GiB'
    """
    dev = profile.device
    gpus = (
        "1 GPU per pipeline device"
        if dev.gpus == 1
        else f"{dev.gpus} GPUs per pipeline device (a tensor-parallel group)"
    )
    where = (
        f"{dev.name} ({dev.memory_gib:g} GiB, {dev.p2p_gbps:g} GB/s, "
        f"{dev.p2p_latency_us:g} µs latency), {gpus}: device.gpus = {dev.gpus}, which "
        "tokens/GPU/s counts"
    )
    src = profile.source or ""
    if src.startswith("derived by octopipe_core.costmodel"):
        return (
            f"Analytic, not measured: derived by the cost model for {where}. FLOP and byte "
            "counts turned into time; replace them with profiled numbers for real plans."
        )
    note = f" Source: {src[:160]}." if src else ""
    return f"For {where}.{note}"


def families() -> tuple[str, ...]:
    return FAMILIES


# --------------------------------------------------------------------------------------------
# Plan edits
def stages_frame(plan: Plan, profile: Profile) -> pd.DataFrame:
    """One row per stage: first layer (editable), last layer, device (editable), time."""
    layers = profile.layer_costs()
    rows = []
    for s, (a, b) in enumerate(plan.partition):
        t = sum(lt.forward_ms + lt.backward_input_ms + lt.backward_weight_ms for lt in layers[a:b])
        rows.append(
            {
                "stage": s,
                "first layer": a,
                "last layer": b - 1,
                "device": plan.placement[s],
                "F+B+W (ms)": round(t, 3),
                "layers": ",".join(sorted(set(profile.layers[a:b]))),
            }
        )
    return pd.DataFrame(rows)


def edit_stages(plan: Plan, profile: Profile, firsts: list[int], devices: list[int]) -> Plan:
    """Move stage boundaries (``firsts[s]`` = first layer of stage ``s``) and reassign devices.

    Actions of a stage that changes device are merged into its new device's order by their
    simulated start time in the old plan (which respects every data dependency); the result
    is validated and an OctoPipeError names any problem.
    """
    num_layers = profile.num_layers
    S = plan.num_stages
    if len(firsts) != S or len(devices) != S:
        raise OctoPipeError(f"stages: expected {S} rows; fix: keep one row per stage")
    if firsts[0] != 0:
        raise OctoPipeError("stage 0: first layer must be 0; fix: start stage 0 at layer 0")
    bounds = [*firsts, num_layers]
    part = []
    for s in range(S):
        a, b = int(bounds[s]), int(bounds[s + 1])
        if b <= a:
            raise OctoPipeError(
                f"stage {s}: first layer {a} is not before stage {s + 1}'s first layer {b}; "
                f"fix: keep first layers increasing, each stage at least one layer"
            )
        part.append((a, b))
    D = plan.num_devices
    for s, d in enumerate(devices):
        if not 0 <= int(d) < D:
            raise OctoPipeError(f"stage {s}: device {d} out of range; fix: use 0..{D - 1}")
    new_place = [int(d) for d in devices]
    out = plan.copy()
    out.partition = part
    if new_place != plan.placement:
        out.placement = new_place
        out.schedule = _regroup(plan, profile, new_place)
    out.name = _edited_name(plan.name)
    _validate_plan(out, num_layers)
    return out


def _regroup(plan: Plan, profile: Profile, placement: list[int]) -> list[list[Action]]:
    """Per-device orders for a new placement: each device runs its actions in the order they
    started in the old plan's simulation (ties: F before B before W, data order of stages)."""
    res = simulate(profile, plan)
    kind_rank = {"F": 0, "B": 1, "BW": 1, "W": 2}
    keyed = []
    for (_, a), st, en in zip(res.ops, res.start_ms, res.end_ms, strict=True):
        stage_key = a.stage if a.kind == "F" else -a.stage
        keyed.append((st, en, kind_rank[a.kind], stage_key, a))
    keyed.sort(key=lambda x: x[:4])
    out: list[list[Action]] = [[] for _ in range(plan.num_devices)]
    for *_, a in keyed:
        out[placement[a.stage]].append(a)
    return out


def schedule_text(plan: Plan) -> str:
    """The editable per-device orders, one line per device (``d0: 0F0 0F1 ...``)."""
    return format_schedule(plan)


def apply_schedule_text(plan: Plan, text: str, num_layers: int) -> Plan:
    """Replace the per-device orders with ``text`` (one line per device), validated."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) != plan.num_devices:
        raise OctoPipeError(
            f"schedule: {len(lines)} lines for {plan.num_devices} devices; "
            "fix: write one line per device, 'd0: 0F0 0F1 ...'"
        )
    sched: list[list[Action]] = []
    for d, ln in enumerate(lines):
        head, sep, rest = ln.partition(":")
        body = rest if sep else ln
        if sep and head.strip() != f"d{d}":
            raise OctoPipeError(
                f"schedule line {d + 1}: starts with '{head.strip()}:'; fix: write 'd{d}:' "
                "(one line per device, in device order)"
            )
        try:
            sched.append(parse_actions(body))
        except OctoPipeError as e:
            raise OctoPipeError(f"schedule line {d + 1} (device {d}): {e}") from None
    out = plan.copy()
    out.schedule = sched
    out.name = _edited_name(plan.name)
    _validate_plan(out, num_layers)
    return out


def _edited_name(name: str) -> str:
    return name if name.endswith("+edits") else f"{name}+edits"


def validate(plan: Plan, num_layers: int) -> None:
    _validate_plan(plan, num_layers)


# --------------------------------------------------------------------------------------------
# Plan diff
def plan_diff(a: Plan, b: Plan) -> dict[str, Any]:
    """What moved from plan ``a`` to plan ``b``: boundaries, placement, per-device orders.

    Returns ``{"summary": [str], "stages": DataFrame, "devices": DataFrame}``.
    """
    summary: list[str] = []
    if a.num_microbatches != b.num_microbatches:
        summary.append(f"micro-batches: {a.num_microbatches} → {b.num_microbatches}")
    if a.num_devices != b.num_devices:
        summary.append(f"devices: {a.num_devices} → {b.num_devices}")
    srows = []
    for s in range(max(a.num_stages, b.num_stages)):
        pa = a.partition[s] if s < a.num_stages else None
        pb = b.partition[s] if s < b.num_stages else None
        da = a.placement[s] if s < a.num_stages else None
        db = b.placement[s] if s < b.num_stages else None
        srows.append(
            {
                "stage": s,
                "layers A": _rng(pa),
                "layers B": _rng(pb),
                "boundary moved": pa != pb,
                "device A": "-" if da is None else f"d{da}",
                "device B": "-" if db is None else f"d{db}",
                "placement moved": da != db,
            }
        )
    stages = pd.DataFrame(srows)
    n_bound = int(stages["boundary moved"].sum())
    n_place = int(stages["placement moved"].sum())
    if a.num_stages != b.num_stages:
        summary.append(f"stages: {a.num_stages} → {b.num_stages} (different stage structure)")
    summary.append(f"{n_bound} of {len(stages)} stages changed layers")
    summary.append(f"{n_place} of {len(stages)} stages changed device")
    drows = []
    for d in range(max(a.num_devices, b.num_devices)):
        oa = a.schedule[d] if d < a.num_devices else []
        ob = b.schedule[d] if d < b.num_devices else []
        first = next(
            (i for i, (x, y) in enumerate(zip(oa, ob, strict=False)) if x != y),
            None if len(oa) == len(ob) else min(len(oa), len(ob)),
        )
        sa, sb = set(oa), set(ob)
        moved = sum(1 for x, y in zip(oa, ob, strict=False) if x != y) + abs(len(oa) - len(ob))
        drows.append(
            {
                "device": f"d{d}",
                "actions A": len(oa),
                "actions B": len(ob),
                "positions changed": moved,
                "only in A": len(sa - sb),
                "only in B": len(sb - sa),
                "first change": "-"
                if first is None
                else f"#{first}: {_at(oa, first)} → {_at(ob, first)}",
            }
        )
    devices = pd.DataFrame(drows)
    n_dev = int((devices["positions changed"] > 0).sum())
    summary.append(f"{n_dev} of {len(devices)} devices run a different order")
    return {"summary": summary, "stages": stages, "devices": devices}


def _rng(p: tuple[int, int] | None) -> str:
    return "-" if p is None else f"{p[0]}–{p[1] - 1}"


def _at(acts: list[Action], i: int) -> str:
    return str(acts[i]) if i < len(acts) else "(end)"
