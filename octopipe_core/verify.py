"""Verification by measurement (issue 34): candidate plans run on the executor, interleaved in
rounds, their measured step times set against the simulator's predictions.

This is the torch-free core: the candidates (plan files and peers), the interleaving order, the
statistics and the result's JSON shape. Exporting and running the jobs is
``executor/verify.py``; the command line is ``commands/verify.py``.

>>> res = summarize(["a", "b"], [10.0, 20.0], [[[10.0, 11.0]], [[20.0, 22.0]]], peers=["b"])
>>> res.best, res.rows[0].speedup_over["b"].median, res.rows[0].to_dict()["error_pct"]
('a', 2.0, -4.762)
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from octopipe_core.errors import OctoPipeError, input_error
from octopipe_core.peers import run_peers
from octopipe_core.plan import Plan, load_plan
from octopipe_core.profile import Profile
from octopipe_core.schedules import PARTITIONS, SCHEDULES, build_plan
from octopipe_core.simulator import simulate

MAX_CANDIDATES = 16
MAX_RUN_STEPS = 20_000  # rounds x (warmup + steps) x candidates, all runs together
MAX_LOCAL_RANKS = 64  # ranks of one job run on this machine
BOOTSTRAP_DRAWS = 2_000
CI_METHOD = (
    "95 % bootstrap CI of the ratio of medians over measured steps (resampled within each "
    f"round, {BOOTSTRAP_DRAWS:,} draws, seeded)"
)

# Runs candidate ``i`` in round ``r`` (both from 0); returns its measured step times (ms).
Runner = Callable[[int, int], list[float]]


@dataclass(frozen=True)
class Candidate:
    """A plan to measure: ``source`` is ``"plan"`` (a file, named by its file name) or
    ``"peer"`` (named ``schedule/partition``); ``predicted_ms`` is the simulated step."""

    name: str
    plan: Plan
    profile: Profile
    source: str
    predicted_ms: float

    @classmethod
    def of(cls, name: str, plan: Plan, profile: Profile, source: str = "plan") -> Candidate:
        """A candidate whose prediction is ``simulate(profile, plan).step_time_ms``."""
        return cls(name, plan, profile, source, simulate(profile, plan).step_time_ms)


def parse_peers(spec: str) -> tuple[list[str], int]:
    """``--peers``: named peers (``zb-h1`` means ``zb-h1/balanced``) and the K of ``best:K``.

    >>> parse_peers("zb-h1,1f1b/uniform,best:2")
    (['zb-h1/balanced', '1f1b/uniform'], 2)
    """
    names: list[str] = []
    best = 0
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if item.startswith("best:"):
            k = item[5:]
            if not k.isdigit() or not 1 <= int(k) <= MAX_CANDIDATES - 1:
                raise OctoPipeError(
                    f"--peers {item!r}: K must be 1..{MAX_CANDIDATES - 1}; fix: e.g. best:3"
                )
            best = int(k)
            continue
        sched, _, part = item.partition("/")
        part = part or "balanced"
        if sched not in SCHEDULES or part not in PARTITIONS:
            raise OctoPipeError(
                f"--peers {item!r}: unknown peer; fix: use SCHEDULE[/PARTITION] with a schedule "
                f"of {', '.join(SCHEDULES)} and a partition of {', '.join(PARTITIONS)}, or best:K"
            )
        if f"{sched}/{part}" not in names:
            names.append(f"{sched}/{part}")
    return names, best


def peer_candidates(
    profile: Profile,
    devices: int,
    microbatches: int,
    names: Sequence[str],
    best: int = 0,
    memory_gib: float | None = None,
    chunks: int = 2,
) -> list[Candidate]:
    """The named peers, then the ``best`` fastest other peers (simulated step) that fit
    ``memory_gib`` (default: the device memory).

    >>> from octopipe_core.profile import example_profile_dict
    >>> prof = Profile.from_dict(example_profile_dict())
    >>> [c.name for c in peer_candidates(prof, 2, 4, ["1f1b/balanced"], best=1)]
    ['1f1b/balanced', 'dualpipev/uniform']
    """
    out = []
    for name in names:
        sched, part = name.split("/")
        try:
            plan = build_plan(profile, sched, devices, microbatches, chunks, part)
        except OctoPipeError as e:
            raise OctoPipeError(f"--peers {name}: {e}") from None
        out.append(Candidate.of(name, plan, profile, "peer"))
    if best:
        runs = run_peers(profile, devices, microbatches, chunks, memory_gib)
        fit = [r for r in runs if r.result is not None and r.result.fits_memory]
        fit = [r for r in fit if r.key not in names and r.plan is not None]
        if not fit:
            raise OctoPipeError(
                f"--peers best:{best}: no peer fits the memory cap; fix: name the peers"
            )
        fit.sort(key=lambda r: r.result.step_time_ms if r.result else 0.0)
        for r in fit[:best]:
            assert r.plan is not None and r.result is not None
            out.append(Candidate(r.key, r.plan, profile, "peer", r.result.step_time_ms))
    return out


def plan_candidates(paths: Sequence[str]) -> list[Candidate]:
    """The plan files (each with its embedded profile), named by file name (by the path as
    given when two share a name); all must train the same model: one profile, one number of
    micro-batches."""
    base = [Path(p).name for p in paths]
    out: list[Candidate] = []
    for path, name in zip(paths, base, strict=True):
        plan, prof = load_plan(path)
        if prof is None:
            raise OctoPipeError(
                f"{path}: field 'profile': the plan has no embedded profile; fix: re-save it "
                f"with `octopipe simulate --plan {path} --profile FILE --out NEW.json`"
            )
        if out and prof.to_dict() != out[0].profile.to_dict():
            raise OctoPipeError(
                f"{path}: embeds profile '{prof.name}', {paths[0]} another "
                f"('{out[0].profile.name}'); the runs would train different models; "
                "fix: verify plans of one profile"
            )
        if out and plan.num_microbatches != out[0].plan.num_microbatches:
            raise OctoPipeError(
                f"{path}: {plan.num_microbatches} micro-batches, {paths[0]} "
                f"{out[0].plan.num_microbatches}; fix: verify plans of one batch"
            )
        name = name if base.count(name) == 1 else path
        if any(c.name == name for c in out):
            raise OctoPipeError(f"{path}: given twice; fix: pass each plan once")
        out.append(Candidate.of(name, plan, prof, "plan"))
    return out


def check_budget(candidates: int, rounds: int, steps: int, warmup: int) -> None:
    """Refuse, before any work, more than ``MAX_CANDIDATES`` candidates or more than
    ``MAX_RUN_STEPS`` steps over all runs.

    >>> check_budget(3, 100, 100, 0)
    Traceback (most recent call last):
    ...
    octopipe_core.errors.OctoPipeError: verify: 100 rounds x 100 steps (warm-up included) x 3 \
candidates is 30,000 steps, over 20,000; fix: fewer --rounds or --steps
    """
    if candidates > MAX_CANDIDATES:
        raise OctoPipeError(
            f"verify: {candidates} candidates, over {MAX_CANDIDATES}; fix: fewer plans or peers"
        )
    total = rounds * (steps + warmup) * candidates
    if total > MAX_RUN_STEPS:
        raise OctoPipeError(
            f"verify: {rounds} rounds x {steps + warmup} steps (warm-up included) x {candidates} "
            f"candidates is {total:,} steps, over {MAX_RUN_STEPS:,}; fix: fewer --rounds or --steps"
        )


def round_order(candidates: int, r: int) -> list[int]:
    """The order of the candidates in round ``r`` (from 0): rotated by one each round, so
    that drift on the machine hits every candidate alike.

    >>> [round_order(3, r) for r in range(4)]
    [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    """
    return [(i + r) % candidates for i in range(candidates)]


def quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``xs``, interpolated linearly (numpy's default).

    >>> quantile([1.0, 2.0, 3.0, 4.0], 0.5), quantile([1.0, 2.0, 3.0, 4.0], 0.25)
    (2.5, 1.75)
    """
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _median(xs: Sequence[float]) -> float:
    return quantile(xs, 0.5)


def bootstrap_medians(
    rounds: Sequence[Sequence[float]], rng: random.Random, draws: int = BOOTSTRAP_DRAWS
) -> list[float]:
    """``draws`` medians of the steps, each resampled with replacement within each round."""
    return [_median([x for rd in rounds for x in rng.choices(rd, k=len(rd))]) for _ in range(draws)]


@dataclass(frozen=True)
class Speedup:
    """The measured speedup over a peer (``peer median / own median``, x) with its 95 % CI,
    and the simulator's ``predicted`` one."""

    median: float
    ci95_lo: float
    ci95_hi: float
    predicted: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "median": round(self.median, 4),
            "ci95": [round(self.ci95_lo, 4), round(self.ci95_hi, 4)],
            "predicted": round(self.predicted, 4),
        }


def speedup_ci(
    peer: Sequence[Sequence[float]],
    own: Sequence[Sequence[float]],
    seed: int = 0,
    draws: int = BOOTSTRAP_DRAWS,
) -> Speedup:
    """The speedup of ``own`` over ``peer`` (step times per round) with its bootstrap CI.

    >>> s = speedup_ci([[10.0, 11.0, 12.0]], [[20.0, 22.0, 24.0]])
    >>> s.median, s.ci95_lo <= 0.5 <= s.ci95_hi
    (0.5, True)
    """
    rng = random.Random(seed)
    return _speedup(
        peer, own, bootstrap_medians(peer, rng, draws), bootstrap_medians(own, rng, draws)
    )


def _speedup(
    peer: Sequence[Sequence[float]],
    own: Sequence[Sequence[float]],
    peer_draws: list[float],
    own_draws: list[float],
    predicted: float = float("nan"),
) -> Speedup:
    ratios = [p / o for p, o in zip(peer_draws, own_draws, strict=True)]
    point = _median([x for rd in peer for x in rd]) / _median([x for rd in own for x in rd])
    return Speedup(point, quantile(ratios, 0.025), quantile(ratios, 0.975), predicted)


@dataclass
class VerifyRow:
    """One candidate's figures (times in ms; ``error_pct`` = predicted / measured - 1, in %)."""

    name: str
    source: str
    predicted_ms: float
    measured_median_ms: float
    p25_ms: float
    p75_ms: float
    error_pct: float
    steps: int
    round_medians_ms: list[float]
    speedup_over: dict[str, Speedup] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "predicted_ms": round(self.predicted_ms, 4),
            "measured_median_ms": round(self.measured_median_ms, 4),
            "p25_ms": round(self.p25_ms, 4),
            "p75_ms": round(self.p75_ms, 4),
            "error_pct": round(self.error_pct, 3),
            "steps": self.steps,
            "round_medians_ms": [round(x, 4) for x in self.round_medians_ms],
            "speedup_over": {k: v.to_dict() for k, v in self.speedup_over.items()},
        }


@dataclass
class VerifyResult:
    """Every candidate's row, the name of the measured best, the peers compared with, and the
    settings of the runs (filled by the caller: rounds, steps, model, ...)."""

    rows: list[VerifyRow]
    best: str
    peers: list[str]
    ci_method: str = CI_METHOD
    settings: dict[str, Any] = field(default_factory=dict)

    def row(self, name: str) -> VerifyRow:
        return next(r for r in self.rows if r.name == name)

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``verify --json``: ``rows``, ``best``, ``peers``, ``ci_method``,
        ``settings``."""
        return {
            "rows": [r.to_dict() for r in self.rows],
            "best": self.best,
            "peers": list(self.peers),
            "ci_method": self.ci_method,
            "settings": dict(self.settings),
        }

    @classmethod
    def from_dict(cls, data: Any, src: str) -> VerifyResult:
        """The result that ``to_dict`` wrote (``verify --json``'s ``plan`` key is ignored),
        validated field by field: one-line ``OctoPipeError`` naming ``src``, the field and
        the fix.

        >>> res = summarize(["a", "b"], [10.0, 20.0], [[[10.0]], [[20.0]]], peers=["b"])
        >>> VerifyResult.from_dict(res.to_dict(), "v.json").to_dict() == res.to_dict()
        True
        >>> VerifyResult.from_dict({"best": "a"}, "v.json")
        Traceback (most recent call last):
        ...
        octopipe_core.errors.OctoPipeError: v.json: field 'rows': missing; fix: upload the JSON \
that `octopipe verify ... --json` prints
        """
        fix = "upload the JSON that `octopipe verify ... --json` prints"
        if not isinstance(data, dict):
            raise input_error(src, "<file>", f"expected an object, got {_kind(data)}", fix)
        for key in ("rows", "best", "peers"):
            if key not in data:
                raise input_error(src, key, "missing", fix)
        raw_rows = data["rows"]
        if not isinstance(raw_rows, list) or not 1 <= len(raw_rows) <= MAX_CANDIDATES:
            raise input_error(
                src, "rows", f"expected a list of 1..{MAX_CANDIDATES} rows, got {_kind(raw_rows)}",
                fix,
            )  # fmt: skip
        rows = [_row_from_dict(r, src, f"rows[{i}]") for i, r in enumerate(raw_rows)]
        names = [r.name for r in rows]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise input_error(
                    src, f"rows[{i}].name", f"{name!r:.60} twice", "name each row once"
                )
        peers = data["peers"]
        if not isinstance(peers, list) or any(p not in names for p in peers):
            raise input_error(src, "peers", "expected a list of row names", fix)
        for i, r in enumerate(rows):
            for p in r.speedup_over:
                if p not in peers:
                    raise input_error(
                        src, f"rows[{i}].speedup_over[{p!r:.60}]", "not in peers", fix
                    )
        if data["best"] not in names:
            raise input_error(src, "best", f"{data['best']!r:.60} names no row", fix)
        ci = data.get("ci_method", CI_METHOD)
        settings = data.get("settings", {})
        if not isinstance(ci, str):
            raise input_error(src, "ci_method", f"expected text, got {_kind(ci)}", fix)
        if not isinstance(settings, dict):
            raise input_error(src, "settings", f"expected an object, got {_kind(settings)}", fix)
        return cls(rows, str(data["best"]), [str(p) for p in peers], ci, dict(settings))


def _kind(v: Any) -> str:
    """How a wrong value reads in an error (its type, or a short repr)."""
    kinds: dict[type, str] = {dict: "an object", list: "a list", str: "text"}
    return kinds.get(type(v), repr(v)[:40])


def _num(v: Any, src: str, field: str, *, positive: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise input_error(src, field, f"expected a number, got {_kind(v)}", "write a number")
    if positive and not v > 0:
        raise input_error(src, field, f"got {v!r}", "use a positive number (ms, x)")
    return float(v)


def _row_from_dict(d: Any, src: str, at: str) -> VerifyRow:
    """One row of ``VerifyResult.from_dict``."""
    if not isinstance(d, dict):
        raise input_error(src, at, f"expected an object, got {_kind(d)}", "write one per row")
    for key in ("name", "source", "predicted_ms", "measured_median_ms", "p25_ms", "p75_ms",
                "error_pct", "steps", "round_medians_ms", "speedup_over"):  # fmt: skip
        if key not in d:
            raise input_error(src, f"{at}.{key}", "missing", f'add "{key}" to the row')
    name = d["name"]
    if not isinstance(name, str) or not 0 < len(name) <= 200:
        raise input_error(src, f"{at}.name", f"got {_kind(name)}", "use 1..200 characters")
    if d["source"] not in ("plan", "peer"):
        raise input_error(src, f"{at}.source", f"got {_kind(d['source'])}", "use plan or peer")
    ms = {k: _num(d[k], src, f"{at}.{k}")
          for k in ("predicted_ms", "measured_median_ms", "p25_ms", "p75_ms")}  # fmt: skip
    if not ms["p25_ms"] <= ms["measured_median_ms"] <= ms["p75_ms"]:
        raise input_error(
            src, f"{at}.measured_median_ms", "outside p25_ms..p75_ms", "write p25 <= median <= p75"
        )
    steps = d["steps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_RUN_STEPS:
        raise input_error(src, f"{at}.steps", f"got {_kind(steps)}", f"use 1..{MAX_RUN_STEPS}")
    rm = d["round_medians_ms"]
    if not isinstance(rm, list) or len(rm) > MAX_RUN_STEPS:
        raise input_error(src, f"{at}.round_medians_ms", f"got {_kind(rm)}", "write a list (ms)")
    over = d["speedup_over"]
    if not isinstance(over, dict):
        raise input_error(src, f"{at}.speedup_over", f"got {_kind(over)}", "write an object")
    speedups = {}
    for peer, sp in over.items():
        f = f"{at}.speedup_over[{peer!r:.60}]"
        if not isinstance(sp, dict) or any(k not in sp for k in ("median", "ci95", "predicted")):
            raise input_error(src, f, "expected median, ci95, predicted", "write all three")
        ci = sp["ci95"]
        if not isinstance(ci, list) or len(ci) != 2:
            raise input_error(src, f"{f}.ci95", f"got {_kind(ci)}", "write [low, high]")
        lo, hi = _num(ci[0], src, f"{f}.ci95[0]"), _num(ci[1], src, f"{f}.ci95[1]")
        if lo > hi:
            raise input_error(src, f"{f}.ci95", f"low {lo} over high {hi}", "write [low, high]")
        med = _num(sp["median"], src, f"{f}.median")
        speedups[str(peer)] = Speedup(med, lo, hi, _num(sp["predicted"], src, f"{f}.predicted"))
    return VerifyRow(
        name, d["source"], ms["predicted_ms"], ms["measured_median_ms"], ms["p25_ms"],
        ms["p75_ms"], _num(d["error_pct"], src, f"{at}.error_pct", positive=False), steps,
        [_num(x, src, f"{at}.round_medians_ms[{j}]") for j, x in enumerate(rm)], speedups,
    )  # fmt: skip


def summarize(
    names: Sequence[str],
    predicted_ms: Sequence[float],
    samples: Sequence[Sequence[Sequence[float]]],
    peers: Sequence[str],
    *,
    sources: Sequence[str] | None = None,
    seed: int = 0,
    draws: int = BOOTSTRAP_DRAWS,
) -> VerifyResult:
    """The result of measured ``samples[candidate][round]`` (step times, ms): pooled median
    and p25-p75, prediction error, and each candidate's speedup over every peer but itself.

    >>> r = summarize(["x", "p"], [1.0, 1.0], [[[5.0, 5.0]], [[5.0, 5.0]]], peers=["p"])
    >>> r.rows[0].speedup_over["p"].to_dict()
    {'median': 1.0, 'ci95': [1.0, 1.0], 'predicted': 1.0}
    """
    rng = random.Random(seed)
    boots = [bootstrap_medians(s, rng, draws) for s in samples]
    idx = {n: i for i, n in enumerate(names)}
    rows = []
    for i, name in enumerate(names):
        pooled = [x for rd in samples[i] for x in rd]
        med = _median(pooled)
        over = {
            p: _speedup(
                samples[idx[p]], samples[i], boots[idx[p]], boots[i],
                predicted_ms[idx[p]] / predicted_ms[i],
            )
            for p in peers
            if p != name
        }  # fmt: skip
        rows.append(
            VerifyRow(
                name,
                sources[i] if sources else ("peer" if name in peers else "plan"),
                predicted_ms[i],
                med,
                quantile(pooled, 0.25),
                quantile(pooled, 0.75),
                100 * (predicted_ms[i] / med - 1),
                len(pooled),
                [_median(rd) for rd in samples[i]],
                over,
            )
        )
    best = min(rows, key=lambda r: r.measured_median_ms).name
    return VerifyResult(rows, best, list(peers))


def verify(
    candidates: Sequence[Candidate],
    runner: Runner,
    *,
    rounds: int,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> VerifyResult:
    """Run every candidate once per round (``runner(i, r)`` gives its measured step times),
    in the rotated ``round_order``, reporting each run to ``progress``; then ``summarize``.

    >>> from octopipe_core.profile import example_profile_dict
    >>> prof = Profile.from_dict(example_profile_dict())
    >>> cands = peer_candidates(prof, 2, 4, ["1f1b/balanced", "zb-h1/balanced"])
    >>> res = verify(cands, lambda i, r: [10.0 * (i + 1)] * 2, rounds=2, progress=print)
    round 1/2: 1f1b/balanced 10.0 ms median
    round 1/2: zb-h1/balanced 20.0 ms median
    round 2/2: zb-h1/balanced 20.0 ms median
    round 2/2: 1f1b/balanced 10.0 ms median
    >>> res.best, res.row("zb-h1/balanced").speedup_over["1f1b/balanced"].median
    ('1f1b/balanced', 0.5)
    """
    n = len(candidates)
    samples: list[list[list[float]]] = [[] for _ in range(n)]
    for r in range(rounds):
        for i in round_order(n, r):
            ms = runner(i, r)
            if not ms:
                raise OctoPipeError(
                    f"verify: {candidates[i].name}: round {r + 1} measured no step; fix: --steps 1+"
                )
            samples[i].append(ms)
            if progress is not None:
                progress(
                    f"round {r + 1}/{rounds}: {candidates[i].name} {_median(ms):.1f} ms median"
                )
    return summarize(
        [c.name for c in candidates],
        [c.predicted_ms for c in candidates],
        samples,
        [c.name for c in candidates if c.source == "peer"],
        sources=[c.source for c in candidates],
        seed=seed,
    )
