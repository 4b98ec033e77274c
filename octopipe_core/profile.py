"""Layer profiles (`octopipe.profile/v1`): what each layer of one model costs on one device.

A profile lists layer types with their forward (F), input-gradient backward (B) and
weight-gradient backward (W) times, their activation, weight and boundary-output memory, and
the model as an ordered list of layers. Memory semantics used by the simulator:

* F allocates ``activation_mib``;
* B frees all of it but ``w_stash_mib`` (what W still needs: the inputs of the linear layers);
* W frees the rest; a fused BW frees everything at its end;
* while B (or BW) runs it also holds ``workspace_mib`` of working memory, freed when it ends
  (the gradient of the loss over the vocabulary, a softmax backward): a transient peak.

The optional ``runtime`` object holds what the runtime adds to the layers' own times
(``RuntimeCosts``: a fixed cost per F, B, W and fused BW op, and the step's tail after the
pipeline); ``octopipe calibrate`` fits it from real runs and records what it fitted from in
``calibration``.

``w_stash_mib`` and ``workspace_mib`` are optional. ``workspace_mib`` defaults to 0 (the
analytic profiles carry none; ``octopipe profile`` measures it). ``w_stash_mib`` defaults to
``activation_mib * 32 / 34``, the zero-bubble paper's ratio for a transformer layer with flash
attention: F keeps ``34·s·b·h`` bytes and W still needs ``32·s·b·h`` of them after B.

Profiles are read from JSON or from a CSV with one row per layer (see ``load_profile``).
Nothing read is ever executed: every field is type-checked and range-checked, and each
problem is reported as one line naming the file, the field and the fix.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from octopipe_core.errors import OctoPipeError, input_error
from octopipe_core.jsonio import MAX_FILE_MIB, loads_checked

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from importlib.resources.abc import Traversable
    else:
        from importlib.abc import Traversable

FORMAT = "octopipe.profile/v1"
FAMILIES = ("embedding", "attention", "mamba", "moe", "mlp", "transformer_block", "lm_head")
W_STASH_DEFAULT_RATIO = 32.0 / 34.0
COST_FIELDS = (
    "forward_ms",
    "backward_input_ms",
    "backward_weight_ms",
    "activation_mib",
    "weight_mib",
    "output_mib",
)
OPTIONAL_FIELDS = ("w_stash_mib", "workspace_mib")  # per layer type; the rest are required
# Name fragments used to infer a layer family when a type does not state it (first match wins).
_FAMILY_HINTS = (
    ("embed", "embedding"),
    ("lm_head", "lm_head"),
    ("head", "lm_head"),
    ("logit", "lm_head"),
    ("moe", "moe"),
    ("expert", "moe"),
    ("mamba", "mamba"),
    ("ssm", "mamba"),
    ("block", "transformer_block"),
    ("decoder", "transformer_block"),
    ("transformer", "transformer_block"),
    ("attn", "attention"),
    ("attention", "attention"),
    ("mlp", "mlp"),
    ("ffn", "mlp"),
)


@dataclass(frozen=True)
class LayerType:
    """Costs of one kind of layer at the profile's micro-batch size (times in ms, memory in MiB)."""

    name: str
    family: str
    forward_ms: float
    backward_input_ms: float
    backward_weight_ms: float
    activation_mib: float
    weight_mib: float
    output_mib: float
    w_stash_mib: float
    workspace_mib: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("family", *COST_FIELDS, "w_stash_mib")}
        if self.workspace_mib:
            d["workspace_mib"] = self.workspace_mib
        return d


@dataclass(frozen=True)
class DeviceSpec:
    """The device type the profile was measured (or modelled) on."""

    name: str = "H800"
    memory_gib: float = 80.0
    p2p_gbps: float = 50.0
    p2p_latency_us: float = 10.0
    gpus: int = 1  # GPUs behind one pipeline device (e.g. a tensor-parallel group of 8)

    def transfer_ms(self, size_mib: float) -> float:
        """Time of one point-to-point transfer: latency + size / bandwidth (GB/s = 1e9 B/s).

        >>> round(DeviceSpec(p2p_gbps=50, p2p_latency_us=10).transfer_ms(64), 4)
        1.3522
        """
        if size_mib <= 0:
            return 0.0
        return self.p2p_latency_us / 1000.0 + size_mib * 2**20 / (self.p2p_gbps * 1e9) * 1000.0


@dataclass(frozen=True)
class RuntimeCosts:
    """What running a plan adds to its layers' own times (ms); all 0 in a profile that times
    each layer alone. ``octopipe calibrate`` fits these from the ops of real runs.

    >>> RuntimeCosts(f_op_ms=0.1, b_op_ms=0.2, w_op_ms=0.05).op_ms("BW")
    0.25
    """

    f_op_ms: float = 0.0
    """Fixed cost of every F op (dispatch, autograd set-up, posting its sends)."""
    b_op_ms: float = 0.0
    """Fixed cost of every B op (input-gradient backward)."""
    w_op_ms: float = 0.0
    """Fixed cost of every W op (weight-gradient pass)."""
    bw_op_ms: float | None = None
    """Fixed cost of every fused BW op; None: ``b_op_ms + w_op_ms``."""
    send_op_ms: float = 0.0
    """What an op pays on its own stream to post its output to another device (copy, isend)."""
    device_speed: tuple[float, ...] = ()
    """Per pipeline device, its ops' time relative to the fastest device's (>= 1; a slower core
    or a straggling GPU); () or fewer devices than the plan's: all 1."""

    step_tail_ms: float = 0.0
    """Once per step after the last pipeline op: the step's small all-reduce and set-up."""
    optimizer_ms_per_mib: float = 0.0
    """Optimizer step time per MiB of a device's weights (the slowest device ends the step)."""

    def op_ms(self, kind: str) -> float:
        """The fixed cost of one op of ``kind`` (F, B, W or BW)."""
        if kind == "BW":
            return self.b_op_ms + self.w_op_ms if self.bw_op_ms is None else self.bw_op_ms
        return {"F": self.f_op_ms, "B": self.b_op_ms, "W": self.w_op_ms}[kind]

    @property
    def has_tail(self) -> bool:
        return self.step_tail_ms > 0 or self.optimizer_ms_per_mib > 0

    def to_dict(self) -> dict[str, Any]:
        ops = {"F": self.f_op_ms, "B": self.b_op_ms, "W": self.w_op_ms}
        if self.bw_op_ms is not None:
            ops["BW"] = self.bw_op_ms
        return {
            "op_overhead_ms": ops,
            "send_op_ms": self.send_op_ms,
            **({"device_speed": list(self.device_speed)} if self.device_speed else {}),
            "step_tail_ms": self.step_tail_ms,
            "optimizer_ms_per_mib": self.optimizer_ms_per_mib,
        }


NO_RUNTIME = RuntimeCosts()


@dataclass(frozen=True)
class Profile:
    """One model at one micro-batch size on one device type.

    >>> p = Profile.from_dict(example_profile_dict())
    >>> p.num_layers, p.layer(1).name
    (4, 'mamba2')
    """

    name: str
    tokens_per_microbatch: int
    device: DeviceSpec
    layer_types: tuple[LayerType, ...]
    layers: tuple[str, ...]
    source: str = ""
    # Where the pipeline runs (cluster links, TP x PP x DP layout); None: one pipeline on the
    # flat network of ``device``. Not part of the profile file; plan files store it.
    deployment: Any = None
    # what running a plan adds to the layers' times (``octopipe calibrate``); all 0: none
    runtime: RuntimeCosts = NO_RUNTIME
    # what a calibrated profile was fitted from (plans, backend, steps, date, residuals), as
    # canonical JSON text (kept hashable); "" when it was not calibrated
    calibration: str = ""

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def type_map(self) -> dict[str, LayerType]:
        return {t.name: t for t in self.layer_types}

    def layer(self, i: int) -> LayerType:
        return self.type_map()[self.layers[i]]

    def layer_costs(self) -> list[LayerType]:
        """The LayerType of each layer, in model order."""
        tm = self.type_map()
        return [tm[n] for n in self.layers]

    def with_device(self, **changes: Any) -> Profile:
        """A copy with some device fields changed (e.g. ``memory_gib=40``)."""
        return replace(self, device=replace(self.device, **changes))

    def with_runtime(self, runtime: RuntimeCosts) -> Profile:
        """A copy whose ops carry ``runtime``'s fixed costs and step tail."""
        return replace(self, runtime=runtime)

    def with_deployment(self, deployment: Any) -> Profile:
        """A copy that simulates on ``deployment`` (a ``layout.Deployment``, or None)."""
        return replace(self, deployment=deployment)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "tokens_per_microbatch": self.tokens_per_microbatch,
            "device": {k: v for k, v in self.device.__dict__.items() if k != "gpus" or v != 1},
            "layer_types": {t.name: t.to_dict() for t in self.layer_types},
            "layers": list(self.layers),
            **({"source": self.source} if self.source else {}),
            **({"runtime": self.runtime.to_dict()} if self.runtime != NO_RUNTIME else {}),
            **({"calibration": json.loads(self.calibration)} if self.calibration else {}),
        }

    @staticmethod
    def from_dict(data: Any, source: str = "<profile>") -> Profile:
        return _parse_profile(data, source)


def example_profile_dict() -> dict[str, Any]:
    """A tiny valid profile, handy for docs and tests."""
    lt = {
        "forward_ms": 1.0,
        "backward_input_ms": 1.0,
        "backward_weight_ms": 1.0,
        "activation_mib": 100,
        "weight_mib": 500,
        "output_mib": 16,
    }
    return {
        "format": FORMAT,
        "name": "example",
        "tokens_per_microbatch": 4096,
        "device": {"name": "H800", "memory_gib": 80, "p2p_gbps": 50, "p2p_latency_us": 10},
        "layer_types": {
            "embedding": {**lt, "forward_ms": 0.1, "backward_input_ms": 0.0},
            "mamba2": lt,
            "lm_head": {**lt, "forward_ms": 2.0, "output_mib": 0},
        },
        "layers": ["embedding", "mamba2", "mamba2", "lm_head"],
    }


def infer_family(type_name: str) -> str | None:
    """Guess a layer family from a type name, or None.

    >>> infer_family("mamba2"), infer_family("attn_mlp"), infer_family("foo")
    ('mamba', 'attention', None)
    """
    low = type_name.lower()
    for frag, fam in _FAMILY_HINTS:
        if frag in low:
            return fam
    return None


# Physical ranges of every number a profile holds, by unit (checked on load, so that no inf,
# NaN or denormal step time can come out of the simulator or the tuner).
MAX_MS = 1e7  # one op longer than 2.8 hours is a typo
MIN_POSITIVE_MS = 1e-6  # 1 ns; smaller positive times underflow the step-time sums
MAX_MIB = 1e8  # 95 TiB for one layer
MAX_LAYERS = 20_000  # larger models are refused up front (the tuner is sized for ~1,000)
_RANGES = {"_ms": (MAX_MS, MIN_POSITIVE_MS), "_mib": (MAX_MIB, 1e-9), "_gib": (1e5, 1e-6)}


def _number(value: Any, src: str, field: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise input_error(src, field, f"expected a number, got {value!r}", "write a plain number")
    hi, tiny = next((r for suffix, r in _RANGES.items() if field.endswith(suffix)), (1e9, 1e-9))
    if isinstance(value, int) and abs(value) > hi:
        raise input_error(src, field, f"got {value}", f"use a number <= {hi:g}")
    if not math.isfinite(value):
        raise input_error(src, field, f"got {value}", "write a finite number")
    if value < 0 or (positive and value == 0):
        need = "a positive number" if positive else "a number >= 0"
        raise input_error(src, field, f"got {value}", f"use {need}")
    if value > hi:
        raise input_error(src, field, f"got {value:g}", f"use a number <= {hi:g}")
    if 0 < value < tiny:
        raise input_error(
            src, field, f"got {value:g}, below the {tiny:g} resolution", f"use 0 or >= {tiny:g}"
        )
    return float(value)


def _parse_layer_type(name: str, raw: Any, src: str) -> LayerType:
    base = f"layer_types.{name}"
    if not isinstance(raw, dict):
        raise input_error(src, base, "expected an object of costs", 'write {"forward_ms": ...}')
    known = {"family", *COST_FIELDS, *OPTIONAL_FIELDS}
    for key in raw:
        if key not in known:
            raise input_error(
                src, f"{base}.{key}", "unknown key", f"use only {', '.join(sorted(known))}"
            )
    vals: dict[str, float] = {}
    for key in COST_FIELDS:
        if key not in raw:
            raise input_error(src, f"{base}.{key}", "missing", f'add "{key}": <number>')
        vals[key] = _number(raw[key], src, f"{base}.{key}")
    if vals["forward_ms"] + vals["backward_input_ms"] + vals["backward_weight_ms"] <= 0:
        raise input_error(src, f"{base}.forward_ms", "all times are 0", "give the layer a cost")
    stash = raw.get("w_stash_mib")
    if stash is None:
        stash_v = vals["activation_mib"] * W_STASH_DEFAULT_RATIO
    else:
        stash_v = _number(stash, src, f"{base}.w_stash_mib")
        if stash_v > vals["activation_mib"]:
            raise input_error(
                src, f"{base}.w_stash_mib", f"{stash_v} exceeds activation_mib "
                f"{vals['activation_mib']}", "W can only keep part of what F allocated",
            )  # fmt: skip
    ws = raw.get("workspace_mib")
    ws_v = 0.0 if ws is None else _number(ws, src, f"{base}.workspace_mib")
    family = raw.get("family")
    if family is None:
        family = infer_family(name)
        if family is None:
            raise input_error(
                src, f"{base}.family", f"cannot infer the family of type '{name}'",
                f"add \"family\": one of {', '.join(FAMILIES)}",
            )  # fmt: skip
    elif family not in FAMILIES:
        raise input_error(
            src, f"{base}.family", f"unknown family {family!r}", f"use one of {', '.join(FAMILIES)}"
        )
    return LayerType(name=name, family=family, w_stash_mib=stash_v, workspace_mib=ws_v, **vals)


def expand_pattern(pattern: str, symbols: dict[str, str], src: str = "<pattern>") -> list[str]:
    """Expand a Nemotron-H style pattern string (one character per layer) into type names.

    >>> expand_pattern("EM-*L", {"E": "embedding", "M": "mamba2", "-": "mlp", "*": "attention",
    ...                          "L": "lm_head"})
    ['embedding', 'mamba2', 'mlp', 'attention', 'lm_head']
    """
    out = []
    for i, ch in enumerate(pattern):
        if ch not in symbols:
            raise input_error(
                src, f"layers[{i}]", f"pattern symbol {ch!r} has no layer type",
                f"add {ch!r} to \"pattern_symbols\" (known: {''.join(sorted(symbols))})",
            )  # fmt: skip
        out.append(symbols[ch])
    return out


def _parse_profile(data: Any, src: str) -> Profile:
    if not isinstance(data, dict):
        raise input_error(src, "<root>", "expected a JSON object", "see sample_profiles/*.json")
    allowed = {
        "format", "name", "tokens_per_microbatch", "device", "layer_types", "layers",
        "pattern_symbols", "source", "runtime", "calibration",
    }  # fmt: skip
    for key in data:
        if key not in allowed:
            raise input_error(src, key, "unknown key", f"use only {', '.join(sorted(allowed))}")
    fmt = data.get("format")
    if fmt != FORMAT:
        raise input_error(src, "format", f"got {fmt!r}", f'set "format": "{FORMAT}"')
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise input_error(src, "name", f"got {name!r}", "give the model a non-empty name")
    tokens = data.get("tokens_per_microbatch")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 < tokens <= 10**9:
        raise input_error(
            src, "tokens_per_microbatch", f"got {tokens!r}", "use an integer in 1..1e9"
        )
    dev_raw = data.get("device", {})
    if not isinstance(dev_raw, dict):
        raise input_error(src, "device", "expected an object", 'write {"name": "H800", ...}')
    for key in dev_raw:
        if key not in ("name", "memory_gib", "p2p_gbps", "p2p_latency_us", "gpus"):
            raise input_error(
                src, f"device.{key}", "unknown key",
                "use name, memory_gib, p2p_gbps, p2p_latency_us, gpus",
            )  # fmt: skip
    gpus = dev_raw.get("gpus", 1)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 65536:
        raise input_error(
            src, "device.gpus", f"got {gpus!r}", "use an integer in 1..65536 (default 1)"
        )
    device = DeviceSpec(
        name=str(dev_raw.get("name", "H800")),
        memory_gib=_number(dev_raw.get("memory_gib", 80), src, "device.memory_gib", positive=True),
        p2p_gbps=_number(dev_raw.get("p2p_gbps", 50), src, "device.p2p_gbps", positive=True),
        p2p_latency_us=_number(dev_raw.get("p2p_latency_us", 10), src, "device.p2p_latency_us"),
        gpus=gpus,
    )
    lts = data.get("layer_types")
    if not isinstance(lts, dict) or not lts:
        raise input_error(src, "layer_types", "missing or empty", "map each type name to its costs")
    types = tuple(_parse_layer_type(str(k), v, src) for k, v in lts.items())
    layers_raw = data.get("layers")
    if isinstance(layers_raw, str):
        symbols = data.get("pattern_symbols")
        if not isinstance(symbols, dict) or not all(
            isinstance(k, str) and len(k) == 1 and isinstance(v, str) for k, v in symbols.items()
        ):
            raise input_error(
                src, "pattern_symbols", "a pattern string needs a symbol map",
                "add \"pattern_symbols\": {\"M\": \"mamba2\", \"*\": \"attention\", ...}",
            )  # fmt: skip
        layers = expand_pattern(layers_raw, symbols, src)
    elif isinstance(layers_raw, list):
        layers = layers_raw
    else:
        raise input_error(
            src, "layers", "missing", "list the layer type of each layer, or give a pattern string"
        )
    if not layers:
        raise input_error(src, "layers", "empty", "a model needs at least one layer")
    if len(layers) > MAX_LAYERS:
        raise input_error(
            src, "layers", f"{len(layers):,} layers is over the {MAX_LAYERS:,} limit",
            "group layers into coarser blocks (a pipeline stage needs a few layers, not one op)",
        )  # fmt: skip
    names = {t.name for t in types}
    for i, n in enumerate(layers):
        if not isinstance(n, str) or n not in names:
            raise input_error(
                src, f"layers[{i}]", f"unknown layer type {n!r}",
                f"use one of {', '.join(sorted(names))} or define it in \"layer_types\"",
            )  # fmt: skip
    source = data.get("source", "")
    runtime = _parse_runtime(data.get("runtime"), src)
    calib = _parse_calibration(data.get("calibration"), src)
    return Profile(
        name.strip(), tokens, device, types, tuple(layers), str(source), None, runtime, calib
    )


def _parse_runtime(raw: Any, src: str) -> RuntimeCosts:
    if raw is None:
        return NO_RUNTIME
    fix = 'write {"op_overhead_ms": {"F": 0.1, "B": 0.1, "W": 0.05}, "step_tail_ms": 1.0}'
    if not isinstance(raw, dict):
        raise input_error(src, "runtime", "expected an object", fix)
    known = ("op_overhead_ms", "send_op_ms", "device_speed", "step_tail_ms", "optimizer_ms_per_mib")
    for key in raw:
        if key not in known:
            raise input_error(src, f"runtime.{key}", "unknown key", f"use {', '.join(known)}")
    ops = raw.get("op_overhead_ms", {})
    if not isinstance(ops, dict):
        raise input_error(src, "runtime.op_overhead_ms", "expected an object", fix)
    for key in ops:
        if key not in ("F", "B", "W", "BW"):
            raise input_error(
                src, f"runtime.op_overhead_ms.{key}", "unknown op kind", "use F, B, W, BW"
            )
    vals = {k: _number(ops[k], src, f"runtime.op_overhead_ms.{k}_ms") for k in ops}
    speed = raw.get("device_speed", [])
    if not isinstance(speed, list) or len(speed) > 65536:
        raise input_error(src, "runtime.device_speed", "expected a list", "write [1.0, 1.05]")
    for i, v in enumerate(speed):
        if _number(v, src, f"runtime.device_speed[{i}]") < 1.0:
            raise input_error(
                src, f"runtime.device_speed[{i}]", f"got {v}", "use >= 1 (the fastest device is 1)"
            )
    return RuntimeCosts(
        f_op_ms=vals.get("F", 0.0),
        b_op_ms=vals.get("B", 0.0),
        w_op_ms=vals.get("W", 0.0),
        bw_op_ms=vals.get("BW"),
        send_op_ms=_number(raw.get("send_op_ms", 0.0), src, "runtime.send_op_ms"),
        device_speed=tuple(float(v) for v in speed),
        step_tail_ms=_number(raw.get("step_tail_ms", 0.0), src, "runtime.step_tail_ms"),
        optimizer_ms_per_mib=_number(
            raw.get("optimizer_ms_per_mib", 0.0), src, "runtime.optimizer_ms_per_mib"
        ),
    )


def _parse_calibration(raw: Any, src: str) -> str:
    """The ``calibration`` record: an object of JSON values (read, never executed), as text."""
    if raw is None:
        return ""
    if not isinstance(raw, dict) or len(raw) > 64:
        raise input_error(
            src, "calibration", "expected an object of at most 64 keys", "re-run octopipe calibrate"
        )
    try:
        text = json.dumps(raw, sort_keys=True, allow_nan=False, separators=(",", ":"))
    except ValueError:
        raise input_error(
            src, "calibration", "holds a non-finite number", "write finite numbers"
        ) from None
    if len(text) > 65_536:
        raise input_error(src, "calibration", "over 64 KiB", "re-run octopipe calibrate")
    return text


# --------------------------------------------------------------------------------------------
# CSV form: optional "# key: value" header lines, then one row per layer.
_CSV_META = {
    "format": str,
    "name": str,
    "tokens_per_microbatch": int,
    "device": str,
    "memory_gib": float,
    "p2p_gbps": float,
    "p2p_latency_us": float,
    "gpus": int,
    "source": str,
    "op_overhead_ms": str,  # "F=0.1 B=0.2 W=0.05 [BW=0.2]"
    "send_op_ms": float,
    "step_tail_ms": float,
    "optimizer_ms_per_mib": float,
}
CSV_COLUMNS = ("layer", "type", "family", *COST_FIELDS, *OPTIONAL_FIELDS)


def parse_profile_csv(text: str, src: str = "<csv>") -> Profile:
    """Read the CSV form of a profile.

    >>> text = "# name: t\\n# tokens_per_microbatch: 8\\nlayer,type,forward_ms,backward_input_ms,"\\
    ...   "backward_weight_ms,activation_mib,weight_mib,output_mib\\n0,mlp,1,1,1,10,10,1\\n"
    >>> parse_profile_csv(text).layers
    ('mlp',)
    """
    meta: dict[str, Any] = {}
    body: list[str] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if s.startswith("#"):
            key, sep, value = s[1:].partition(":")
            key = key.strip()
            if not sep or key not in _CSV_META:
                raise input_error(
                    src, f"line {lineno}", f"bad header line {s!r}",
                    f"write '# key: value' with key in {', '.join(_CSV_META)}",
                )  # fmt: skip
            try:
                meta[key] = _CSV_META[key](value.strip())
            except ValueError:
                raise input_error(
                    src, key, f"bad value {value.strip()!r}", "write a number"
                ) from None
        elif s:
            body.append(line)
    reader = csv.DictReader(io.StringIO("\n".join(body)))
    try:
        return _csv_rows(reader, meta, src)
    except csv.Error as e:  # a cell over the csv module's field limit, a stray quote
        raise input_error(
            src, "<csv>", f"unreadable CSV ({e})", "write one plain row a layer"
        ) from None


def _csv_rows(reader: csv.DictReader[str], meta: dict[str, Any], src: str) -> Profile:
    cols = reader.fieldnames or []
    for c in cols:
        if c not in CSV_COLUMNS:
            raise input_error(src, c, "unknown column", f"use columns {', '.join(CSV_COLUMNS)}")
    for c in ("type", *COST_FIELDS):
        if c not in cols:
            raise input_error(src, c, "missing column", f"add a '{c}' column")
    layer_types: dict[str, dict[str, Any]] = {}
    layers: list[str] = []
    for rowno, row in enumerate(reader, start=2):
        tname = (row.get("type") or "").strip()
        if not tname:
            raise input_error(src, f"row {rowno}.type", "empty", "name the layer type")
        costs: dict[str, Any] = {}
        for c in (*COST_FIELDS, *OPTIONAL_FIELDS):
            cell = (row.get(c) or "").strip()
            if not cell:
                if c in OPTIONAL_FIELDS:
                    continue
                raise input_error(src, f"row {rowno}.{c}", "empty", "write a number")
            try:
                costs[c] = float(cell)
            except ValueError:
                raise input_error(
                    src, f"row {rowno}.{c}", f"not a number: {cell!r}", "write a number"
                ) from None
        fam = (row.get("family") or "").strip()
        if fam:
            costs["family"] = fam
        if tname in layer_types and layer_types[tname] != costs:
            raise input_error(
                src, f"row {rowno}", f"type '{tname}' has other costs than in an earlier row",
                "give every row of one type the same costs, or rename the type",
            )  # fmt: skip
        layer_types[tname] = costs
        layers.append(tname)
    device = {
        k2: meta[k1]
        for k1, k2 in (
            ("device", "name"),
            ("memory_gib", "memory_gib"),
            ("p2p_gbps", "p2p_gbps"),
            ("p2p_latency_us", "p2p_latency_us"),
            ("gpus", "gpus"),
        )
        if k1 in meta
    }
    data = {
        "format": meta.get("format", FORMAT),
        "name": meta.get("name", Path(src).stem),
        "tokens_per_microbatch": meta.get("tokens_per_microbatch", 4096),
        "device": device,
        "layer_types": layer_types,
        "layers": layers,
        **({"source": meta["source"]} if "source" in meta else {}),
    }
    runtime = _csv_runtime(meta, src)
    if runtime:
        data["runtime"] = runtime
    return _parse_profile(data, src)


def _csv_runtime(meta: dict[str, Any], src: str) -> dict[str, Any]:
    """The ``runtime`` object of a CSV profile's header lines (empty: none)."""
    out: dict[str, Any] = {}
    if "op_overhead_ms" in meta:
        ops: dict[str, float] = {}
        for part in str(meta["op_overhead_ms"]).split():
            kind, sep, value = part.partition("=")
            try:
                ops[kind] = float(value) if sep else float("nan")
            except ValueError:
                ops[kind] = float("nan")
            if not math.isfinite(ops[kind]):
                raise input_error(
                    src, "op_overhead_ms", f"bad item {part[:30]!r}", "write F=0.1 B=0.2 W=0.05"
                )
        out["op_overhead_ms"] = ops
    for key in ("send_op_ms", "step_tail_ms", "optimizer_ms_per_mib"):
        if key in meta:
            out[key] = meta[key]
    return out


def profile_to_csv(profile: Profile) -> str:
    """Write a profile in its CSV form (the inverse of ``parse_profile_csv``; the one CSV writer).

    >>> p = Profile.from_dict(example_profile_dict()).with_device(gpus=8)
    >>> parse_profile_csv(profile_to_csv(p)) == p
    True
    """
    out = io.StringIO()
    d = profile.device
    out.write(f"# format: {FORMAT}\n# name: {profile.name}\n")
    out.write(f"# tokens_per_microbatch: {profile.tokens_per_microbatch}\n# device: {d.name}\n")
    out.write(f"# memory_gib: {d.memory_gib}\n# p2p_gbps: {d.p2p_gbps}\n")
    out.write(f"# p2p_latency_us: {d.p2p_latency_us}\n")
    if d.gpus != 1:
        out.write(f"# gpus: {d.gpus}\n")
    if profile.source and "\n" not in profile.source:
        out.write(f"# source: {profile.source}\n")
    if profile.runtime != NO_RUNTIME:  # (the calibration record stays in the JSON form only)
        rt = profile.runtime.to_dict()
        ops = " ".join(f"{k}={v!r}" for k, v in rt["op_overhead_ms"].items())
        out.write(f"# op_overhead_ms: {ops}\n# send_op_ms: {rt['send_op_ms']!r}\n")
        out.write(f"# step_tail_ms: {rt['step_tail_ms']!r}\n")
        out.write(f"# optimizer_ms_per_mib: {rt['optimizer_ms_per_mib']!r}\n")
    w = csv.writer(out, lineterminator="\n")
    layers = profile.layer_costs()
    # the workspace column only where a layer has one (older readers know the others)
    cols = CSV_COLUMNS if any(lt.workspace_mib for lt in layers) else CSV_COLUMNS[:-1]
    w.writerow(cols)
    for i, lt in enumerate(layers):
        w.writerow([i, lt.name, lt.family, *(getattr(lt, c) for c in cols[3:])])
    return out.getvalue()


def parse_profile_bytes(raw: bytes, filename: str) -> Profile:
    """Parse an uploaded or read file; JSON or CSV chosen by extension (then by content)."""
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")  # a BOM (spreadsheets write one)
    except UnicodeDecodeError:
        raise input_error(
            filename, "<file>", "not UTF-8 text", "upload a JSON or CSV profile"
        ) from None
    if filename.lower().endswith(".csv") or (
        not filename.lower().endswith(".json") and not text.lstrip().startswith("{")
    ):
        if len(raw) > MAX_FILE_MIB * 2**20:
            raise input_error(
                filename, "<file>", f"{len(raw) / 2**20:.0f} MiB is over the "
                f"{MAX_FILE_MIB:.0f} MiB limit", "give a smaller file",
            )  # fmt: skip
        return parse_profile_csv(text, filename)
    return _parse_profile(loads_checked(text, filename), filename)


def load_profile(path: str | Path) -> Profile:
    """Load and validate a profile from a ``.json`` or ``.csv`` file.

    Raises ``OctoPipeError`` with a one-line message naming the file, the field and the fix.
    """
    p = Path(path)
    if not p.is_file():
        raise OctoPipeError(f"{p}: file not found; fix: pass a path to a profile .json or .csv")
    return parse_profile_bytes(p.read_bytes(), str(p))


def sample_profiles_dir() -> Traversable:
    """The bundled ``sample_profiles/`` folder (JSON/CSV profiles, README, ``clusters/``).

    An installed wheel ships it as package data, ``octopipe_core/sample_profiles``, read with
    ``importlib.resources``; in a checkout (or an editable install) it is the repository's
    top-level ``sample_profiles/``.

    >>> (sample_profiles_dir() / "README.md").is_file()
    True
    """
    packaged = resources.files("octopipe_core") / "sample_profiles"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "sample_profiles"


def _sample_files() -> dict[str, Traversable]:
    """Bundled profiles by name: the top level's ``*.json`` then ``*.csv`` (JSON wins a tie)."""
    files = [f for f in sample_profiles_dir().iterdir() if f.is_file()]
    out: dict[str, Traversable] = {}
    for ext in (".json", ".csv"):
        for f in sorted(files, key=lambda f: f.name):
            stem = f.name[: -len(ext)]
            if f.name.endswith(ext) and stem not in out:
                out[stem] = f
    return out


def list_samples() -> list[str]:
    """Names of the bundled sample profiles (file stems).

    >>> "nemotron-h-8b" in list_samples()
    True
    """
    return list(_sample_files())


def load_sample(name: str) -> Profile:
    """Load a bundled sample by name (e.g. ``"nemotron-h-8b"``)."""
    f = _sample_files().get(name)
    if f is None:
        raise OctoPipeError(
            f"sample '{name}': not found; fix: use one of {', '.join(list_samples()) or '(none)'}"
        )
    return parse_profile_bytes(f.read_bytes(), f"sample_profiles/{f.name}")
