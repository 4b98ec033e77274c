"""Lower bounds: closed forms on uniform layers, and validity against simulated plans."""

from __future__ import annotations

import pytest

from octopipe_core.bounds import (
    LayerTimes,
    any_assignment_bound,
    contiguous_bound,
    granularity_bound,
    layer_bound,
    plan_bounds,
    total_bound,
)
from octopipe_core.errors import OctoPipeError
from octopipe_core.profile import load_sample
from octopipe_core.schedules import PARTITIONS, SCHEDULES, build_plan
from octopipe_core.simulator import simulate
from octopipe_core.tuner.crafted import hybrid
from octopipe_core.tuner.exact import exact_optimum


def _uniform(n: int, f: float = 1.0, b: float = 1.0, w: float = 1.0) -> LayerTimes:
    return LayerTimes([f] * n, [b] * n, [w] * n)


@pytest.mark.parametrize("n,p,m", [(8, 4, 2), (16, 4, 16), (12, 3, 1), (64, 8, 32)])
def test_closed_forms_on_uniform_layers(n: int, p: int, m: int):
    lt = _uniform(n)
    assert total_bound(lt.work_ms, p, m) == pytest.approx(3 * m * n / p)
    # device d starts at P_d = d: T = (3 m n + sum d) / p; the F+B work with the drain
    # Q_d = d + 1 (d > 0): T = (2 m n + sum (2 d + 1)) / p
    full = (3 * m * n + p * (p - 1) / 2) / p
    fb = (2 * m * n + (p - 1) * (p + 1)) / p
    assert any_assignment_bound(lt, p, m) == pytest.approx(max(full, fb, 3.0 * m))
    # the last layer: F chain n - 1, then m (F+B), then the B chain and W_0: n - 1 + 1
    assert layer_bound(lt, m) == pytest.approx(max(n - 1 + 2 * m + n, n - 1 + 3 * m))
    assert granularity_bound(lt.work_ms, p, m) == pytest.approx(
        3 * m * -(-n // p) if n % p else 3 * m * n / p
    )


def test_contiguous_bound_two_stages_closed_form():
    # 2 layers of F = B = W = 1 on 2 devices, m micro-batches: stage 1 starts at 1 ms and
    # its F+B work ends Q_1 = 2 ms before the end: T = max(1 + 3m, 1 + 2m + 2)
    for m in (1, 2, 5):
        assert contiguous_bound(_uniform(2), 2, m) == pytest.approx(max(1 + 3 * m, 3 + 2 * m))
    assert contiguous_bound(_uniform(2), 3, 1) is None


def _peers(prof, p, m):
    for sched in SCHEDULES:
        for part in PARTITIONS:
            try:
                plan = build_plan(prof, sched, p, m, 2, part)
            except OctoPipeError:
                continue
            yield sched, plan, simulate(prof, plan, 1e9)


@pytest.mark.parametrize(
    "name,p,m", [("nemotron-h-8b", 4, 8), ("llama-3-8b", 8, 16), ("jamba-v0.1", 16, 32)]
)
def test_bounds_hold_for_every_peer_plan(name: str, p: int, m: int):
    prof = load_sample(name)
    b = plan_bounds(prof, p, m)
    assert b.best_ms >= b.total_ms and b.best_name in b.universal
    seen = 0
    for _sched, plan, r in _peers(prof, p, m):
        seen += 1
        assert r.step_time_ms >= b.best_ms * (1 - 1e-9)
        if plan.num_stages == p:  # one contiguous stage per device
            assert b.contiguous_ms is not None
            assert r.step_time_ms >= b.contiguous_ms * (1 - 1e-9)
    assert seen >= 10


def test_bounds_hold_for_the_exact_optimum():
    prof = hybrid(6)
    e = exact_optimum(prof, 2, 3, max_stages_per_device=2, time_limit_s=20)
    assert e.complete
    b = plan_bounds(prof, 2, 3)
    assert e.step_time_ms >= b.best_ms * (1 - 1e-9)
    assert b.best_ms > b.total_ms  # fill and drain matter on 6 layers and 3 micro-batches


def test_best_bound_is_stronger_than_total_at_large_p():
    b = plan_bounds(load_sample("nemotron-h-56b"), 64, 128)
    assert b.best_ms > b.total_ms * 1.02
    assert b.contiguous_ms is not None and b.contiguous_ms > b.best_ms
    d = b.to_dict()
    assert d["best_ms"] == pytest.approx(b.best_ms, abs=1e-5) and d["best"] == b.best_name


def test_packing_bound_matches_brute_force_on_small_cases():
    import random
    from itertools import product

    from octopipe_core.bounds import packing_bound

    rng = random.Random(7)
    for _ in range(25):
        n, p = rng.randint(3, 7), rng.randint(2, 3)
        layers = [rng.choice([1.0, 2.5, 3.0, 4.5]) for _ in range(n)]
        best = float("inf")
        for assign in product(range(p), repeat=n):
            loads = [0.0] * p
            for x, d in zip(layers, assign, strict=True):
                loads[d] += x
            best = min(best, max(loads))
        got = packing_bound(layers, p, microbatches=3)
        assert got <= 3 * best + 1e-9  # a bound
        assert got >= 3 * best * (1 - 2e-6)  # and exact up to the bisection tolerance
        assert got >= granularity_bound(layers, p, 3) - 1e-9


def test_l2_bin_count_rules_out_capacities_and_holds_at_p64():
    from octopipe_core.bounds import l2_bins, packing_bound

    # 8 ms layers (and the head) never share a 13.75 ms device with a 6 ms one, so the 6 ms
    # ones need ceil(54 x 6 / 13.75) more
    assert l2_bins([8.0] * 54 + [6.0] * 54 + [13.2], 13.75) == 55 + 24
    assert l2_bins([8.0] * 54 + [6.0] * 54 + [13.2], 14.1) <= 64
    prof = load_sample("nemotron-h-56b")
    b = plan_bounds(prof, 64, 128)
    assert b.packing_ms > b.granularity_ms * 1.05  # the exact search is too large here
    assert b.packing_ms == pytest.approx(packing_bound(LayerTimes.of(prof).work_ms, 64, 128))
    for _sched, _plan, r in _peers(prof, 64, 128):
        assert r.step_time_ms >= b.packing_ms * (1 - 1e-9)


def _fill_packing_brute(lt: LayerTimes, p: int, m: int, hop: float) -> float:
    """The relaxation of ``fill_packing_bound`` by enumeration: every layer on any device
    slot ``k``, slot ``k`` starting at ``P_k + k hop`` and draining ``Q_k + k hop``."""
    from itertools import product

    P, Q = lt.fill_ms(), lt.drain_ms()
    best = float("inf")
    for assign in product(range(p), repeat=len(lt.f_ms)):
        work, fb = [0.0] * p, [0.0] * p
        for i, k in enumerate(assign):
            work[k] += lt.work_ms[i]
            fb[k] += lt.fb_ms[i]
        need = max(
            max(P[k] + k * hop + m * work[k], P[k] + Q[k] + 2 * k * hop + m * fb[k])
            if work[k] > 0
            else 0.0
            for k in range(p)
        )
        best = min(best, need)
    return best


def test_fill_packing_bound_matches_brute_force_on_small_cases():
    import random

    from octopipe_core.bounds import fill_packing_bound

    rng = random.Random(3)
    for _ in range(30):
        n, p, m = rng.randint(2, 7), rng.randint(2, 3), rng.randint(1, 5)
        kinds = [(1.0, 1.0, 1.0), (2.0, 2.5, 1.0), (0.5, 3.0, 0.5), (4.0, 1.0, 2.0)]
        layers = [rng.choice(kinds) for _ in range(n)]
        lt = LayerTimes(*(list(x) for x in zip(*layers, strict=True)))
        hop = rng.choice([0.0, 0.25])
        want = _fill_packing_brute(lt, min(p, n), m, hop)
        got = fill_packing_bound(lt, p, m, hop)
        assert got <= want + 1e-9  # a bound
        assert got >= want * (1 - 2e-5)  # and exact up to the bisection tolerance
        # a floor that holds is returned when the relaxation does not beat it
        assert fill_packing_bound(lt, p, m, hop, floor_ms=want * 0.99) == pytest.approx(
            got, rel=2e-5
        )
        assert fill_packing_bound(lt, p, m, hop, floor_ms=want * 1.01) == want * 1.01


def test_fill_packing_bound_holds_for_the_exact_optimum_where_it_is_the_best():
    prof = hybrid(7)
    b = plan_bounds(prof, 2, 2)
    assert b.best_name == "fill_packing" and b.fill_packing_ms > b.packing_ms
    e = exact_optimum(prof, 2, 2, max_stages_per_device=2, time_limit_s=20)
    assert e.complete
    assert e.step_time_ms >= b.fill_packing_ms * (1 - 1e-9)


def test_fill_packing_bound_lifts_nemotron_56b_at_p32_and_holds_for_every_peer():
    # 54 mamba (8.04 ms), 54 MLP (6.06 ms), 10 attention layers and the head on 32 devices:
    # whole layers cannot fill every device to the mean, and late devices start late
    prof = load_sample("nemotron-h-56b")
    b = plan_bounds(prof, 32, 64)
    assert b.best_name == "fill_packing"
    assert b.fill_packing_ms > 1.03 * max(b.any_assignment_ms, b.packing_ms, b.layer_ms)
    seen = 0
    for _sched, _plan, r in _peers(prof, 32, 64):
        seen += 1
        assert r.step_time_ms >= b.fill_packing_ms * (1 - 1e-9)
    assert seen >= 10
