"""Fill-aware partitioning: exact against brute force, fast at 120 layers and 64 devices."""

from __future__ import annotations

import random
import time
from itertools import combinations

import pytest

from octopipe_core.bounds import LayerTimes
from octopipe_core.fill_partition import (
    FillModel,
    fill_objective,
    fold_placement,
    nested_blocks,
    solve_fill,
)
from octopipe_core.profile import load_sample
from octopipe_core.tuner.layouts import family_placement


def _partitions(n: int, s: int):
    for cuts in combinations(range(1, n), s - 1):
        b = [0, *cuts, n]
        yield [(b[k], b[k + 1]) for k in range(s)]


def _brute(model: FillModel, placement: list[int]) -> float:
    return min(
        fill_objective(model, part, placement)
        for part in _partitions(model.num_layers, len(placement))
    )


def _random_model(rng: random.Random, n: int, m: int, memory: bool) -> FillModel:
    lt = LayerTimes(
        [rng.uniform(0.2, 3.0) for _ in range(n)],
        [rng.uniform(0.0, 4.0) for _ in range(n)],
        [rng.uniform(0.0, 3.0) for _ in range(n)],
    )
    model = FillModel.from_times(lt, m, hop_ms=rng.choice([0.0, 0.05, 0.5]))
    if memory:
        wt = [rng.uniform(100, 2000) for _ in range(n)]
        act = [rng.uniform(10, 300) for _ in range(n)]
        cap = sum(wt) / rng.uniform(1.2, 3.0)
        model = model.with_memory(wt, act, cap)
    return model


PLACEMENTS = [
    [0, 1],
    [0, 1, 2],
    [0, 1, 2, 3],
    [0, 1, 1, 0],
    [0, 1, 2, 2, 1, 0],
    fold_placement(3, 1),
    fold_placement(4, 2),
    [0, 1, 2, 1, 3, 0],  # a two-stage device around one-stage devices, then a pair
]


@pytest.mark.parametrize("placement", PLACEMENTS, ids=lambda p: "".join(map(str, p)))
@pytest.mark.parametrize("memory", [False, True])
def test_exact_against_brute_force(placement: list[int], memory: bool):
    rng = random.Random(hash((tuple(placement), memory)) & 0xFFFF)
    assert nested_blocks(placement) is not None
    for trial in range(6):
        n = rng.randint(len(placement), min(9, len(placement) + 4))
        model = _random_model(rng, n, rng.choice([1, 2, 4, 16]), memory)
        brute = _brute(model, placement)
        res = solve_fill(model, placement)
        assert res.exact
        if brute == float("inf"):
            assert res.partition is None, trial
            continue
        assert res.partition is not None and res.objective_ms is not None
        assert len(res.partition) == len(placement)
        assert res.objective_ms == pytest.approx(fill_objective(model, res.partition, placement))
        assert res.objective_ms == pytest.approx(brute, rel=1e-6), (trial, n)


def test_non_nested_placements_fall_back_to_a_descent():
    assert nested_blocks(family_placement("loop2", 3)) is None
    assert nested_blocks(family_placement("zigzag3", 2)) is None
    lt = LayerTimes([1.0] * 12, [1.0] * 12, [1.0] * 12)
    res = solve_fill(FillModel.from_times(lt, 8), family_placement("loop2", 3))
    assert not res.exact and res.partition is not None
    assert res.objective_ms is not None and res.objective_ms >= 8 * 36 / 3


def test_fill_aware_split_beats_the_balanced_split():
    # 8 equal layers on 4 devices in a row: the later devices start later, so an exact
    # fill-aware split gives them fewer layers than the balanced 2-2-2-2
    lt = LayerTimes([1.0] * 8, [2.0] * 8, [1.0] * 8)
    model = FillModel.from_times(lt, 2)
    balanced = [(0, 2), (2, 4), (4, 6), (6, 8)]
    res = solve_fill(model, [0, 1, 2, 3])
    assert res.objective_ms is not None
    assert res.objective_ms < fill_objective(model, balanced, [0, 1, 2, 3])
    assert res.partition is not None and res.partition[-1][1] - res.partition[-1][0] == 1


@pytest.mark.parametrize("folded", [0, 24, 56])
def test_fast_at_120_layers_and_64_devices(folded: int):
    prof = load_sample("nemotron-h-56b")
    model = FillModel.from_times(LayerTimes.of(prof), 256, hop_ms=0.05)
    place = fold_placement(64, folded)
    t0 = time.perf_counter()
    res = solve_fill(model, place)
    took = time.perf_counter() - t0
    assert res.exact and res.partition is not None
    assert took < 5.0  # well under 1 s on a quiet core (docs/benchmarks.md); shared CI: 5 s
