"""Pipeline plans as plain data: partition, placement and schedule.

* **partition**: stage ``s`` holds the contiguous layers ``partition[s] = (start, end)``
  (``end`` exclusive);
* **placement**: stage ``s`` runs on device ``placement[s]`` (a device may hold several stages);
* **schedule**: ``schedule[d]`` is the ordered list of compute actions of device ``d``.

An action prints as ``{stage}{kind}{microbatch}``, in the spirit of PyTorch's pipelining IR:
``2F0`` (forward), ``2B0`` (input-gradient backward), ``2W0`` (weight-gradient backward) and
``2BW0`` (fused full backward).

>>> plan = Plan(2, [(0, 1), (1, 2)], [0, 1],
...             [parse_actions("0F0 0F1 0BW0 0BW1"), parse_actions("1F0 1BW0 1F1 1BW1")])
>>> validate_plan(plan, num_layers=2)
>>> print(format_schedule(plan))
d0: 0F0 0F1 0BW0 0BW1
d1: 1F0 1BW0 1F1 1BW1
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

from octopipe_core.errors import OctoPipeError, input_error
from octopipe_core.jsonio import loads_checked

PLAN_FORMAT = "octopipe.plan/v1"


class TextEnum(str, Enum):
    """An enum whose members are their own text: equal to it, printed and formatted as it."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


class Kind(TextEnum):
    """What a compute action does: ``F`` forward, ``B`` input-gradient backward, ``W``
    weight-gradient backward, ``BW`` both backwards fused.

    Members are strings (``Kind.F == "F"``) and print as their letters.

    >>> Kind("BW"), f"{Kind.F}", Kind.B == "B"
    (Kind.BW, 'F', True)
    """

    F = "F"
    B = "B"
    W = "W"
    BW = "BW"


KINDS = tuple(Kind)
_ACTION_RE = re.compile(r"^(\d{1,6})(BW|F|B|W)(\d{1,6})$")  # up to 999,999 stages/micro-batches
MAX_MICROBATCHES = 65_536
MAX_STAGES = 4_096


class Action(NamedTuple):
    """One compute action: ``kind`` of ``stage`` on micro-batch ``mb``."""

    stage: int
    kind: Kind
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"

    @staticmethod
    def parse(text: str) -> Action:
        """Parse ``"2F0"``-style text.

        >>> Action.parse("3BW12")
        Action(stage=3, kind=Kind.BW, mb=12)
        """
        m = _ACTION_RE.match(text.strip())
        if not m:
            shown = text if len(text) <= 24 else f"{text[:20]}...({len(text)} characters)"
            raise OctoPipeError(
                f"bad action {shown!r}; fix: write <stage><F|B|W|BW><microbatch>, e.g. 2F0"
            )
        return Action(int(m.group(1)), Kind(m.group(2)), int(m.group(3)))


def parse_actions(text: str | Iterable[str]) -> list[Action]:
    """Parse a space-separated string (or a list of strings) of actions."""
    items = text.split() if isinstance(text, str) else list(text)
    for t in items:
        if not isinstance(t, str):
            raise OctoPipeError(f"bad action {t!r}; fix: write actions as text, e.g. 2F0")
    return [Action.parse(t) for t in items]


@dataclass
class Plan:
    """A complete pipeline plan; see the module docstring."""

    num_microbatches: int
    partition: list[tuple[int, int]]
    placement: list[int]
    schedule: list[list[Action]]
    name: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    # The cluster and TP x PP x DP layout read from a plan file (a ``layout.Deployment``);
    # simulations use the profile's ``deployment``, which ``load_plan`` sets from this.
    deployment: Any = None
    # Stages whose backward recomputes their forward first (selective activation
    # recomputation): F keeps only the stage input, B runs F again and B (``costs.py``).
    recompute: list[int] = field(default_factory=list)

    @property
    def num_stages(self) -> int:
        return len(self.partition)

    @property
    def num_devices(self) -> int:
        return len(self.schedule)

    def stages_on(self, device: int) -> list[int]:
        return [s for s, d in enumerate(self.placement) if d == device]

    def copy(self) -> Plan:
        return Plan(
            self.num_microbatches,
            list(self.partition),
            list(self.placement),
            [list(a) for a in self.schedule],
            self.name,
            dict(self.meta),
            self.deployment,
            list(self.recompute),
        )

    def to_dict(self, profile: Any | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": PLAN_FORMAT,
            "name": self.name,
            "num_devices": self.num_devices,
            "num_microbatches": self.num_microbatches,
            "partition": [list(r) for r in self.partition],
            "placement": list(self.placement),
            "schedule": [" ".join(map(str, acts)) for acts in self.schedule],
        }
        if self.recompute:
            d["recompute"] = sorted(self.recompute)
        if self.meta:
            d["meta"] = self.meta
        dep = getattr(profile, "deployment", None) or self.deployment
        if dep is not None:
            d |= dep.to_dict()  # "cluster" and "layout"
        if profile is not None:
            d["profile"] = profile.to_dict()
        return d

    def __str__(self) -> str:
        return format_plan(self)


def format_schedule(plan: Plan) -> str:
    """One line per device: ``d0: 0F0 0F1 0B0 ...``."""
    return "\n".join(f"d{d}: " + " ".join(map(str, a)) for d, a in enumerate(plan.schedule))


def format_plan(plan: Plan) -> str:
    """A compact, diff-friendly text form of the whole plan."""
    head = f"plan {plan.name or '(unnamed)'}: {plan.num_devices} devices, "
    head += f"{plan.num_stages} stages, {plan.num_microbatches} micro-batches"
    parts = " ".join(
        f"s{s}[{a}:{b})@d{plan.placement[s]}" for s, (a, b) in enumerate(plan.partition)
    )
    return f"{head}\nstages: {parts}\n{format_schedule(plan)}"


def plan_from_dict(data: Any, src: str = "<plan>") -> Plan:
    """Parse and shape-check a plan dict (use ``validate_plan`` for the full check)."""
    if not isinstance(data, dict):
        raise input_error(src, "<root>", "expected a JSON object", "save plans with octopipe")
    if data.get("format") != PLAN_FORMAT:
        raise input_error(
            src, "format", f"got {data.get('format')!r}", f'set "format": "{PLAN_FORMAT}"'
        )
    m = data.get("num_microbatches")
    if isinstance(m, bool) or not isinstance(m, int) or not 0 < m <= MAX_MICROBATCHES:
        raise input_error(
            src, "num_microbatches", f"got {m!r}", f"use an integer in 1..{MAX_MICROBATCHES:,}"
        )
    part = data.get("partition")
    if not isinstance(part, list) or not part:
        raise input_error(src, "partition", "missing", "list [start, end) layer ranges per stage")
    if len(part) > MAX_STAGES:
        raise input_error(src, "partition", f"{len(part):,} stages", f"use at most {MAX_STAGES:,}")
    partition: list[tuple[int, int]] = []
    for i, r in enumerate(part):
        if (
            not isinstance(r, list)
            or len(r) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in r)
        ):
            raise input_error(src, f"partition[{i}]", f"got {r!r}", "write [start, end]")
        partition.append((r[0], r[1]))
    place = data.get("placement")
    if not isinstance(place, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in place
    ):
        raise input_error(src, "placement", f"got {place!r}", "list one device index per stage")
    sched_raw = data.get("schedule")
    if not isinstance(sched_raw, list) or not sched_raw:
        raise input_error(src, "schedule", "missing", "list one action string per device")
    schedule: list[list[Action]] = []
    for d, row in enumerate(sched_raw):
        if not isinstance(row, (str, list)):
            raise input_error(src, f"schedule[{d}]", "expected a string", 'write "0F0 0B0 ..."')
        try:
            schedule.append(parse_actions(row))
        except OctoPipeError as e:
            raise input_error(
                src, f"schedule[{d}]", str(e).split(";")[0], "write e.g. 2F0"
            ) from None
    nd = data.get("num_devices", len(schedule))
    if nd != len(schedule):
        raise input_error(
            src, "num_devices", f"{nd} but schedule has {len(schedule)} rows", "make them equal"
        )
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise input_error(src, "meta", f"got {type(meta).__name__}", "write an object or drop it")
    cap = meta.get("memory_cap_gib")
    if cap is not None and (
        isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap <= 1e5
    ):
        raise input_error(
            src, "meta.memory_cap_gib", f"got {cap!r}", "use a number in (0, 1e5] or drop it"
        )
    dep = None
    if "cluster" in data or "layout" in data:
        from octopipe_core.layout import deployment_from_dict

        dep = deployment_from_dict(data, src)
    rec = data.get("recompute", [])
    if not isinstance(rec, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and 0 <= x < len(partition) for x in rec
    ):
        raise input_error(
            src, "recompute", f"got {rec!r}", f"list stage indices in 0..{len(partition) - 1}"
        )
    name = str(data.get("name", ""))
    return Plan(m, partition, list(place), schedule, name, dict(meta), dep, sorted(set(rec)))


def save_plan(plan: Plan, path: str | Path, profile: Any | None = None) -> None:
    """Write a plan (with its profile embedded when given) as JSON."""
    Path(path).write_text(json.dumps(plan.to_dict(profile), indent=1) + "\n")


def load_plan(path: str | Path) -> tuple[Plan, Any | None]:
    """Read a plan JSON; returns the plan and its embedded profile (or None)."""
    from octopipe_core.profile import Profile

    p = Path(path)
    if not p.is_file():
        raise OctoPipeError(f"{p}: file not found; fix: pass a plan .json written by octopipe")
    data = loads_checked(p.read_bytes(), str(p))
    plan = plan_from_dict(data, str(p))
    prof = Profile.from_dict(data["profile"], f"{p}#profile") if "profile" in data else None
    if prof is not None:
        validate_plan(plan, prof.num_layers, src=str(p))
        if plan.deployment is not None:
            plan.deployment.check(plan.num_devices, prof.device.gpus, f"{p}#layout")
            prof = prof.with_device(memory_gib=plan.deployment.cluster.gpu_memory_gib)
            prof = prof.with_deployment(plan.deployment)
    return plan, prof


# --------------------------------------------------------------------------------------------
# Dependencies and validation
def backward_kinds(plan: Plan) -> dict[tuple[int, int], Kind]:
    """Per (stage, micro-batch): ``"B"`` if the backward is split into B and W, ``"BW"`` if not."""
    kinds: dict[tuple[int, int], Kind] = {}
    for acts in plan.schedule:
        for a in acts:
            if a.kind in ("B", "BW"):
                kinds.setdefault((a.stage, a.mb), a.kind)
    return kinds


def producers(a: Action, num_stages: int, bkind: dict[tuple[int, int], Kind]) -> list[Action]:
    """Data producers of ``a``: F(s) needs F(s-1); B(s) needs B(s+1) (or F(s) on the last
    stage); W(s) needs B(s). ``bkind`` tells whether each backward is split or fused.

    >>> producers(Action(1, Kind.B, 0), 3, {(2, 0): Kind.BW})
    [Action(stage=2, kind=Kind.BW, mb=0)]
    """
    s, k, m = a
    if k == "F":
        return [Action(s - 1, Kind.F, m)] if s > 0 else []
    if k in ("B", "BW"):
        if s == num_stages - 1:
            return [Action(s, Kind.F, m)]
        return [Action(s + 1, bkind.get((s + 1, m), Kind.B), m)]
    return [Action(s, Kind.B, m)]


def validate_plan(plan: Plan, num_layers: int | None = None, src: str = "plan") -> None:
    """Check shapes, completeness and that the per-device orders respect data dependencies.

    Raises ``OctoPipeError`` naming the problem; a dependency cycle is named action by action.
    """
    S, D, M = plan.num_stages, plan.num_devices, plan.num_microbatches
    if len(plan.placement) != S:
        raise input_error(
            src, "placement", f"{len(plan.placement)} entries for {S} stages", "one per stage"
        )
    for s, d in enumerate(plan.placement):
        if not 0 <= d < D:
            raise input_error(src, f"placement[{s}]", f"device {d} out of range", f"use 0..{D - 1}")
    prev_end = 0
    for s, (lo, hi) in enumerate(plan.partition):
        if lo != prev_end or hi <= lo:
            raise input_error(
                src, f"partition[{s}]", f"[{lo}, {hi}) is not contiguous after {prev_end}",
                f"start stage {s} at layer {prev_end} and give it at least one layer",
            )  # fmt: skip
        prev_end = hi
    for rs in plan.recompute:
        if not 0 <= rs < S:
            raise input_error(src, "recompute", f"stage {rs} out of range", f"use 0..{S - 1}")
    if num_layers is not None and prev_end != num_layers:
        raise input_error(
            src, "partition", f"covers {prev_end} layers, model has {num_layers}",
            f"end the last stage at {num_layers}",
        )  # fmt: skip
    seen: dict[Action, int] = {}
    for d, acts in enumerate(plan.schedule):
        for a in acts:
            if not 0 <= a.stage < S or not 0 <= a.mb < M:
                raise input_error(
                    src, f"schedule[{d}]", f"action {a} out of range",
                    f"use stages 0..{S - 1} and micro-batches 0..{M - 1}",
                )  # fmt: skip
            if plan.placement[a.stage] != d:
                raise input_error(
                    src, f"schedule[{d}]", f"{a} runs on device {d} but stage {a.stage} is "
                    f"placed on device {plan.placement[a.stage]}", "move it to that device",
                )  # fmt: skip
            if a in seen:
                raise input_error(src, f"schedule[{d}]", f"{a} appears twice", "keep one")
            seen[a] = d
    bkind = backward_kinds(plan)
    for s in range(S):
        for m in range(M):
            bk = bkind.get((s, m), "BW")
            need = ["F", *(("B", "W") if bk == "B" else ("BW",))]
            for k in need:
                if Action(s, k, m) not in seen:
                    raise input_error(
                        src, "schedule", f"action {Action(s, k, m)} is missing",
                        "every stage runs F and either B+W or a fused BW on each micro-batch",
                    )  # fmt: skip
            extra = (Kind.BW,) if bk == "B" else (Kind.B, Kind.W)
            for k in extra:
                if Action(s, k, m) in seen:
                    raise input_error(
                        src, "schedule", f"micro-batch {m} of stage {s} has both a fused BW and "
                        f"a split {k}", "keep either BW or the pair B, W",
                    )  # fmt: skip
    cycle = find_order_cycle(plan, bkind)
    if cycle:
        path = " -> ".join(map(str, cycle))
        raise OctoPipeError(
            f"{src}: field 'schedule': the device orders contradict the data dependencies "
            f"(cycle {path}); fix: move one of these actions later on its device"
        )


def asap_times(
    plan: Plan,
    op_ms: Callable[[Action], float] = lambda a: 0.0,
    hop_ms: float = 0.0,
    bkind: dict[tuple[int, int], Kind] | None = None,
) -> tuple[dict[Action, tuple[float, float]], list[int]]:
    """Run every device's order as soon as possible: (start, end) of each action that could run,
    and how far each device got (all the way unless the orders contain a cycle).

    Each action lasts ``op_ms(action)``; a producer on another device adds ``hop_ms``. This is
    the simple, readable replay (lowering, cycle detection, diagnostics); ``simulator.simulate``
    is the fast one, with per-stage costs, comm streams and memory.

    >>> plan = Plan(1, [(0, 1), (1, 2)], [0, 1], [parse_actions("0F0 0BW0"),
    ...                                         parse_actions("1F0 1BW0")])
    >>> asap_times(plan, lambda a: 1.0, hop_ms=0.5)[0][Action(0, Kind.BW, 0)]
    (4.0, 5.0)
    """
    bkind = backward_kinds(plan) if bkind is None else bkind
    S = plan.num_stages
    times: dict[Action, tuple[float, float]] = {}
    pos = [0] * plan.num_devices
    free = [0.0] * plan.num_devices
    progress = True
    while progress:
        progress = False
        for d, acts in enumerate(plan.schedule):
            while pos[d] < len(acts):
                a = acts[pos[d]]
                ps = producers(a, S, bkind)
                if any(p not in times for p in ps):
                    break
                t = max(
                    [free[d], *(times[p][1] + hop_ms * (plan.placement[p.stage] != d) for p in ps)]
                )
                free[d] = t + op_ms(a)
                times[a] = (t, free[d])
                pos[d] += 1
                progress = True
    return times, pos


def find_order_cycle(
    plan: Plan, bkind: dict[tuple[int, int], Kind] | None = None
) -> list[Action] | None:
    """Return a dependency cycle among actions (data edges + device order), or None."""
    bkind = backward_kinds(plan) if bkind is None else bkind
    S = plan.num_stages
    done, pos = asap_times(plan, bkind=bkind)
    if len(done) == sum(len(a) for a in plan.schedule):
        return None
    # Stuck: every blocked head waits for something; follow "waits for" edges to a cycle.
    where = {a: (d, i) for d, acts in enumerate(plan.schedule) for i, a in enumerate(acts)}

    def blocker(a: Action) -> Action:
        d, i = where[a]
        if pos[d] < i:  # a is behind the device head: it waits for the head
            return plan.schedule[d][pos[d]]
        return next(p for p in producers(a, S, bkind) if p not in done)

    start = next(acts[pos[d]] for d, acts in enumerate(plan.schedule) if pos[d] < len(acts))
    path: list[Action] = []
    index: dict[Action, int] = {}
    cur = start
    while cur not in index:
        index[cur] = len(path)
        path.append(cur)
        cur = blocker(cur)
    cyc = path[index[cur] :]
    return [*cyc, cyc[0]]
