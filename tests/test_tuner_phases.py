"""Each tuner phase on a crafted profile where the right move is known."""

from __future__ import annotations

import pytest

from octopipe_core.costs import layer_times_ms
from octopipe_core.plan import validate_plan
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import simulate
from octopipe_core.tuner import tune
from octopipe_core.tuner.climb import phase_proposals
from octopipe_core.tuner.crafted import heavy_head, moe_memory, stash_heavy, w_heavy
from octopipe_core.tuner.evaluate import Evaluator, Move, Phase
from octopipe_core.tuner.layouts import device_loads
from octopipe_core.tuner.moves_partition import partition_proposals
from octopipe_core.tuner.moves_schedule import (
    Timeline,
    delay_w_proposals,
    memory_repair_proposals,
    split_backward,
)


def _peer(ev: Evaluator, sched: str, part: str = "uniform"):
    plan = build_plan(ev.profile, sched, ev.devices, ev.microbatches, 2, part)
    return ev.from_order(plan.partition, plan.placement, plan.schedule, f"{sched}/{part}")


def _w_after_f(plan) -> bool:
    """Whether some device runs an F between a B and that B's W (a deferred W)."""
    for acts in plan.schedule:
        pos = {a: k for k, a in enumerate(acts)}
        for a in acts:
            if a.kind == "W":
                kb = pos[a._replace(kind="B")]
                if any(x.kind == "F" for x in acts[kb + 1 : pos[a]]):
                    return True
    return False


# ---- moves as data ---------------------------------------------------------------------------
def test_every_proposal_names_its_phase_and_move_kind():
    """The search selects moves by ``Move`` kind (an enum), never by matching descriptions:
    the memory phase's placement moves are exactly the swaps."""
    prof = moe_memory()
    for cap in (80.0, 1.0):  # a cap that nothing fits opens the memory phase
        ev = Evaluator(prof, devices=4, microbatches=8, cap_gib=cap)
        inc = _peer(ev, "1f1b")
        for phase in Phase:
            props = phase_proposals(ev, phase, inc)
            assert props, phase
            assert all(isinstance(p.phase, Phase) and isinstance(p.move, Move) for p in props)
        mem = phase_proposals(ev, Phase.MEMORY, inc)
        placement = [p for p in mem if p.phase is Phase.PLACEMENT]
        assert placement and all(p.move is Move.SWAP for p in placement)


# ---- partition ------------------------------------------------------------------------------
def test_partition_phase_gives_heavy_lm_head_its_own_stage():
    prof = heavy_head()
    ev = Evaluator(prof, devices=4, microbatches=8, cap_gib=80.0)
    inc = _peer(ev, "1f1b")
    assert inc.plan.partition[-1] == (7, 9)  # uniform: the head shares a stage with a block
    props = partition_proposals(ev, inc)
    assert props[0].description == "rebalance device loads"
    cands = [c for c in (p.build() for p in props) if c is not None]
    best = min(cands, key=lambda c: c.step_ms)
    assert best.step_ms < inc.step_ms
    assert best.plan.partition[-1] == (8, 9)
    w = layer_times_ms(prof)
    assert max(device_loads(w, best.plan.partition, best.plan.placement, 4)) < max(
        device_loads(w, inc.plan.partition, inc.plan.placement, 4)
    )


def test_tune_on_heavy_head_matches_best_peer_and_isolates_head():
    r = tune(heavy_head(), 4, 8, time_budget_s=3, stop_at_convergence=True, restarts=1)
    fitting = [v.step_time_ms for v in r.baselines.values() if v.fits_memory and v.step_time_ms]
    assert fitting and r.step_time_ms <= min(fitting) + 1e-6
    head_stage = next(s for s, (a, b) in enumerate(r.plan.partition) if a <= 8 < b)
    assert r.plan.partition[head_stage] == (8, 9)


# ---- placement ------------------------------------------------------------------------------
def test_moe_block_is_placed_only_where_it_fits():
    prof = moe_memory()
    r = tune(prof, 4, 4, time_budget_s=4, stop_at_convergence=True, restarts=1)
    peers = [v for v in r.baselines.values() if v.ok]
    assert peers and not any(v.fits_memory for v in peers)  # no peer plan fits 16 GiB
    assert r.fits_memory and max(r.peak_memory_gib) <= 16.0 + 1e-9
    dev_of_layer = {}
    for s, (a, b) in enumerate(r.plan.partition):
        for layer in range(a, b):
            dev_of_layer[layer] = r.plan.placement[s]
    big = {dev_of_layer[0], dev_of_layer[7]}  # embedding and LM head devices
    assert dev_of_layer[1] not in big and dev_of_layer[4] not in big  # the two MoE layers


# ---- schedule -------------------------------------------------------------------------------
def test_only_w_delay_fills_the_bubble():
    prof = w_heavy()
    ev = Evaluator(prof, devices=2, microbatches=4, cap_gib=80.0)
    fused = _peer(ev, "1f1b")
    split = ev.from_order(
        fused.plan.partition, fused.plan.placement, split_backward(fused.plan.schedule), "split"
    )
    assert split is not None and not _w_after_f(split.plan)
    props = delay_w_proposals(ev, split, Timeline(split))
    assert props
    cands = [c for c in (p.build() for p in props) if c is not None]
    best = min(cands, key=lambda c: c.step_ms)
    assert best.step_ms < split.step_ms - 1e-6
    assert _w_after_f(best.plan)  # the improvement is a W moved past a later F
    assert best.plan.partition == split.plan.partition
    assert best.plan.placement == split.plan.placement


def test_tune_defers_w_when_memory_allows():
    r = tune(w_heavy(), 2, 4, time_budget_s=3, stop_at_convergence=True, restarts=1)
    assert r.fits_memory
    assert _w_after_f(r.plan)
    one_ms = r.baselines.step_ms("1f1b/uniform")
    assert one_ms is not None and r.step_time_ms < one_ms


# ---- memory ---------------------------------------------------------------------------------
def test_memory_cap_forces_early_w():
    free = tune(stash_heavy(80.0), 2, 4, time_budget_s=2, stop_at_convergence=True, restarts=1)
    assert _w_after_f(free.plan)  # without a cap W is deferred
    tight = tune(stash_heavy(2.6), 2, 4, time_budget_s=2, stop_at_convergence=True, restarts=1)
    assert tight.fits_memory and max(tight.peak_memory_gib) <= 2.6 + 1e-9
    assert not _w_after_f(tight.plan)  # every W runs before the device's next F


def test_memory_repair_advances_w_before_the_peak():
    prof = stash_heavy(80.0)
    ev = Evaluator(prof, devices=2, microbatches=4, cap_gib=3.3)
    inc = _peer(ev, "zb-h2")
    assert not inc.fits
    cands = [c for c in (p.build() for p in memory_repair_proposals(ev, inc)) if c is not None]
    assert cands and min(c.total_overflow_gib for c in cands) < inc.total_overflow_gib
    assert any("advance" in c.origin and "W" in c.origin for c in cands)


def test_no_plan_fits_names_device_and_shortfall():
    r = tune(stash_heavy(2.2), 2, 4, time_budget_s=2, stop_at_convergence=True, restarts=1)
    assert not r.fits_memory
    assert r.shortfall is not None
    assert r.shortfall["device"] in (0, 1)
    # 2 GiB of weights, one block's 256 MiB of activations recomputed during its B and the
    # other block's 16 MiB input kept (without recomputation: 2 x 256 MiB, 0.3 GiB short)
    assert r.shortfall["gib"] == pytest.approx((2048 + 256 + 16) / 1024 - 2.2, abs=1e-4)
    assert r.plan.recompute
    assert "device" in r.why and "GiB short" in r.why


@pytest.mark.parametrize("cap", [2.6, 3.0, 4.0])
def test_returned_plan_never_exceeds_the_cap(cap: float):
    prof = stash_heavy(cap)
    r = tune(prof, 2, 6, time_budget_s=1.5, stop_at_convergence=True, restarts=1)
    validate_plan(r.plan, prof.num_layers)
    sim = simulate(prof, r.plan, cap)
    assert sim.fits_memory and max(sim.peak_memory_gib) <= cap + 1e-9


def test_granularity_floor_is_a_lower_bound_and_explains_the_gap():
    from octopipe_core.profile import load_sample
    from octopipe_core.tuner.diagnose import granularity_bound

    prof = load_sample("llama-3-8b")
    r = tune(prof, 8, 16, time_budget_s=3, stop_at_convergence=True, restarts=1)
    floor = granularity_bound(layer_times_ms(prof), 8, 16)
    assert r.granularity_ms == pytest.approx(floor)
    assert floor > r.lower_bound_ms * 1.1  # an LM head and 32 blocks cannot split 8 ways
    assert max(r.result.busy_ms()) >= floor - 1e-6
    assert r.step_time_ms >= floor and "granularity" in r.why
    # and the schedule's share of the gap, against the layout bound
    lb = r.layout_bound.ms
    assert lb <= r.step_time_ms + 1e-6
    assert "schedule: " in r.why and f"any schedule of this layout reaches ({lb:.0f} ms)" in r.why
