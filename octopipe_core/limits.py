"""Sizes refused up front, with the figure that is too large.

The simulator runs about a million ops per second on one core and the tuner simulates a plan
hundreds of times, so a request is refused before any work when one simulation of it would
take more than a few seconds (``MAX_SIMULATE_OPS``) or leave the tuner no room to search
(``MAX_TUNE_OPS``).

>>> plan_ops(num_stages=8, num_microbatches=64)
2560
>>> check_size(8, 64, "simulate")
>>> try:
...     check_size(512, 65536, "tune")
... except ValueError as e:
...     print(str(e)[:58])
tune: 512 stages x 65,536 micro-batches is 167,772,160 ops
"""

from __future__ import annotations

from octopipe_core.errors import OctoPipeError

MAX_SIMULATE_OPS = 8_000_000
MAX_TUNE_OPS = 1_000_000
# The dashboard serves many sessions from one process: each request stays well under a second
# of simulation per plan, and a page simulates up to about fifteen plans.
MAX_DASHBOARD_OPS = 400_000


def plan_ops(num_stages: int, num_microbatches: int) -> int:
    """Ops of one simulation: F, B, W and two transfers per stage and micro-batch."""
    return 5 * num_stages * num_microbatches


def check_size(
    num_stages: int,
    num_microbatches: int,
    what: str,
    *,
    limit: int | None = None,
    fix: str | None = None,
) -> None:
    """Refuse a plan too large to ``simulate`` or ``tune`` in reasonable time (``limit`` ops,
    by default the one for ``what``; ``fix`` replaces the suggested fix).

    >>> try:
    ...     check_size(128, 1024, "draw", limit=MAX_DASHBOARD_OPS, fix="at most 625 here")
    ... except ValueError as e:
    ...     print(str(e)[-53:])
    over the limit of 400,000 here; fix: at most 625 here
    """
    if limit is None:
        limit = MAX_TUNE_OPS if what == "tune" else MAX_SIMULATE_OPS
    ops = plan_ops(num_stages, num_microbatches)
    if ops > limit:
        fit = max(1, limit // (5 * num_stages))
        if fix is None:
            fix = f"fewer micro-batches or stages (e.g. --microbatches {fit})"
            raise OctoPipeError(
                f"{what}: {num_stages:,} stages x {num_microbatches:,} micro-batches is {ops:,} "
                f"ops per simulation, over the {limit:,} this machine can {what}; fix: {fix}"
            )
        raise OctoPipeError(
            f"{what}: {num_stages:,} stages x {num_microbatches:,} micro-batches is {ops:,} ops "
            f"per simulation, over the limit of {limit:,} here; fix: {fix}"
        )


MAX_TUNE_LAYERS = 2_000  # above, one pass over the layouts alone outlasts a tuning budget


def check_tune_layers(num_layers: int) -> None:
    """Refuse to tune a profile with more layers than the tuner can search in its budget.

    >>> check_tune_layers(120)
    """
    if num_layers > MAX_TUNE_LAYERS:
        raise OctoPipeError(
            f"tune: the profile has {num_layers:,} layers, over the {MAX_TUNE_LAYERS:,} the "
            "tuner can search within its budget; fix: group consecutive layers into blocks "
            "(a stage needs a few layers, not single ops), or use `simulate` with a peer"
        )


MAX_COMMAND_OPS = 12_000_000  # a command without a time budget answers within about 20 s


def check_peers_size(devices: int, microbatches: int, chunks: int, what: str) -> None:
    """Refuse, before any work, a run of every peer (``baselines``, the peer table) whose
    simulations add up to more than ``MAX_COMMAND_OPS`` ops: each alone may be under the
    per-simulation limit while all of them together are not.

    >>> check_peers_size(8, 32, 2, "baselines")
    >>> try:
    ...     check_peers_size(8, 65536, 2, "baselines")
    ... except ValueError as e:
    ...     print(str(e)[:37])
    baselines: 14 peer plans of 8 devices
    """
    from octopipe_core.schedules import PARTITIONS, SCHEDULES, peer

    stages = [peer(s).num_stages(devices, chunks) for s in SCHEDULES] * len(PARTITIONS)
    total = sum(plan_ops(n, microbatches) for n in stages)
    if total > MAX_COMMAND_OPS:
        per_mb = max(1, sum(plan_ops(n, 1) for n in stages))
        fit = max(1, MAX_COMMAND_OPS // per_mb)
        raise OctoPipeError(
            f"{what}: {len(stages)} peer plans of {devices:,} devices x {microbatches:,} "
            f"micro-batches are {total:,} ops to simulate, over the {MAX_COMMAND_OPS:,} this "
            f"command answers in about 20 s; fix: --microbatches {fit:,} or fewer"
        )
