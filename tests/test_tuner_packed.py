"""Packed layouts (``tuner/packed.py``): a valid layout, where they apply, the tuner
proposing one where the contiguous layouts cannot balance the devices, and the climb's
placement-first rule on large problems (``climb.layout_gains``)."""

from __future__ import annotations

import pytest

from octopipe_core.fill_partition import solve_fill
from octopipe_core.profile import load_sample
from octopipe_core.tuner import packed as packed_mod
from octopipe_core.tuner.climb import LAYOUT_FIRST_SIZE, layout_gains, peer_candidates, rank_phases
from octopipe_core.tuner.evaluate import Evaluator, Phase
from octopipe_core.tuner.layouts import family_placement
from octopipe_core.tuner.list_scheduler import POLICIES
from octopipe_core.tuner.moves_placement import family_proposals, ranked_layouts
from octopipe_core.tuner.packed import SPREAD_BUILDERS, packed_layout
from octopipe_core.tuner.search import tune
from tests.helpers import assert_spread_layout, random_fill_model


@pytest.mark.parametrize("seed", range(6))
def test_packed_layout_is_a_valid_layout_and_the_descent_only_helps(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    n, p = 26, 5
    model = random_fill_model(n, seed)
    _part, _place, need = assert_spread_layout(model, p, packed_layout(model, p))
    monkeypatch.setattr(packed_mod, "MAX_ROUNDS", 0)  # the greedy packing alone
    greedy = packed_layout(model, p)
    assert greedy is not None and need <= greedy[2]


def test_packed_layout_keeps_to_the_memory_budget() -> None:
    # 26 layers of 100 MiB weights on 5 devices, one micro-batch of 10 MiB in flight each
    base = random_fill_model(26, 3)
    n = base.num_layers
    roomy = base.with_memory([100.0] * n, [10.0] * n, 2000.0, inflight=(1.0,) * n)
    tight = base.with_memory([100.0] * n, [10.0] * n, 400.0, inflight=(1.0,) * n)
    assert packed_layout(roomy, 5) == packed_layout(base, 5)  # the budget never binds
    assert packed_layout(tight, 5) is None  # 26 layers need 2,860 MiB, 5 x 400 = 2,000


def test_packed_layout_applies_from_three_to_eight_layers_per_device() -> None:
    model = random_fill_model(40, 0)
    assert packed_layout(model, 20) is None  # two per device: the matched layout's range
    assert packed_layout(model, 14) is None  # under three per device: V and folds suffice
    assert packed_layout(model, 4) is None  # ten per device: too many stages
    assert packed_layout(model, 5) is not None and packed_layout(model, 13) is not None


def test_packed_layout_beats_every_contiguous_layout_on_nemotron_h_56b_at_32_devices() -> None:
    # 120 layers on 32 devices: stage boundaries of a contiguous layout must fall where the
    # mamba (8.0 ms), MLP (6.1) and attention (2.9) layers allow; packing them one by one
    # evens the devices out
    ev = Evaluator(load_sample("nemotron-h-56b"), 32, 128, 80.0)
    kind, part, place, need = ev.spread_layouts()[0]
    assert kind == "packed" and (part, place, need) == packed_layout(ev.fill, 32)
    conts = [solve_fill(ev.fill, family_placement(f, 32)) for f in ("seq", "v", "fold8")]
    best_cont = min(c.objective_ms for c in conts if c.objective_ms is not None)
    assert need < 0.96 * best_cont
    ranked = ranked_layouts(ev)
    assert ranked[0].spread and ranked[0].objective_ms <= need  # counted ones pack tighter
    assert any(r.name == "packed" and r.objective_ms == need for r in ranked)
    assert any(p.description == "switch to packed" for p in family_proposals(ev))
    # list-scheduled with one policy, it already beats the best peer (dualpipev: 3,762 ms;
    # the tuner, 30 s: 3,508 ms on this layout, against 3,685 for the best contiguous one)
    c = ev.from_policies(part, place, "packed", POLICIES[:1])
    assert c is not None and c.fits and c.step_ms < 3700.0


def test_placement_goes_first_on_large_problems_when_a_layout_gains_clearly_more() -> None:
    # the best peer (dualpipev, balanced) has a large imbalance, but repartitioning its V
    # gains little; the packed layout's need is about 8 % lower: the climb switches first
    ev = Evaluator(load_sample("nemotron-h-56b"), 32, 128, 80.0)
    _table, peers = peer_candidates(ev)
    peer = min(peers, key=lambda c: c.key())
    part_gain, layout_gain = layout_gains(ev, peer)
    assert layout_gain > part_gain + 0.05 * peer.step_ms
    assert rank_phases(peer)[0] is Phase.PARTITION  # by the bubbles alone
    assert rank_phases(peer, (part_gain, layout_gain))[0] is Phase.PLACEMENT
    assert rank_phases(peer, (layout_gain, part_gain))[0] is Phase.PARTITION
    assert LAYOUT_FIRST_SIZE <= 32 * 128
    r = tune(ev.profile, 32, 128, time_budget_s=30, max_iterations=1)
    first = r.history[0]
    spread = {f"switch to {name}" for name, *_ in SPREAD_BUILDERS}
    assert first["phase"] == Phase.PLACEMENT and first["move"] in spread
    # the switch comes list-scheduled and justified
    peer_ms = r.best_peer()
    assert peer_ms is not None and r.step_time_ms < 0.935 * peer_ms[1]
