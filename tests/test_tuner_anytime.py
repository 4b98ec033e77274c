"""The anytime tuner: whole budget, early stop only on a proof, longer never worse, restarts."""

from __future__ import annotations

import json
import random

import pytest

from octopipe_core.cli import main
from octopipe_core.profile import Profile, example_profile_dict, load_sample
from octopipe_core.tuner import TuneProgress, tune
from octopipe_core.tuner.anytime import StartGenerator
from octopipe_core.tuner.crafted import heavy_head
from octopipe_core.tuner.evaluate import Evaluator
from octopipe_core.tuner.moves_placement import ranked_layouts


def test_anytime_spends_the_budget_and_beats_stopping_at_convergence():
    prof = load_sample("tiny-hybrid")
    quick = tune(prof, 4, 8, time_budget_s=30, stop_at_convergence=True)
    assert quick.converged and quick.stop_reason.startswith("climbs converged")
    budget = 2 * quick.search_time_s + 1.0  # the same path, then more
    full = tune(prof, 4, 8, time_budget_s=budget)
    assert full.stop_reason.startswith("budget spent")
    assert full.search_time_s >= budget - 0.1 and not full.converged
    assert full.evaluations > quick.evaluations
    assert full.step_time_ms <= quick.step_time_ms + 1e-9
    assert "%" in full.stop_reason  # says how far from the bound it stopped


def test_stops_early_only_when_a_bound_proves_the_plan():
    r = tune(heavy_head(), 4, 32, time_budget_s=60, optimal_within=0.005)
    assert r.stop_reason.startswith("converged: within") and r.converged
    assert r.search_time_s < 30
    assert r.step_time_ms <= r.best_bound_ms * 1.005 + 1e-9
    assert r.gap_to_best_bound_pct <= 0.5 + 1e-9


def test_small_problem_stops_when_every_layout_was_tried():
    r = tune(Profile.from_dict(example_profile_dict()), 2, 4, time_budget_s=60)
    assert r.stop_reason.startswith("search space exhausted") and r.converged
    assert r.search_time_s < 30


def test_longer_budget_never_hurts_and_progress_is_monotone():
    prof = load_sample("nemotron-h-8b")
    short = tune(prof, 4, 8, time_budget_s=1.0, seed=2)
    seen: list[TuneProgress] = []
    long = tune(prof, 4, 8, time_budget_s=3.0, seed=2, progress=seen.append)
    assert long.step_time_ms <= short.step_time_ms + 1e-9
    bests = [e.best_step_time_ms for e in seen if e.fits_memory]
    assert bests == sorted(bests, reverse=True)
    assert all(e.best_bound_ms == pytest.approx(long.best_bound_ms) for e in seen)
    # a run to convergence reports its restarts (3 s of wall clock may not reach them on a
    # loaded machine)
    done: list[TuneProgress] = []
    tune(prof, 4, 8, time_budget_s=60, seed=2, stop_at_convergence=True, progress=done.append)
    assert any(e.phase == "restart" for e in done)


def test_seeding_the_uncapped_search_with_the_capped_plan_is_never_slower():
    prof = load_sample("nemotron-h-8b")
    capped = tune(prof, 4, 8, memory_gib=60.0, time_budget_s=60, stop_at_convergence=True)
    assert capped.fits_memory and max(capped.peak_memory_gib) > 55.0  # the cap binds
    free = tune(prof, 4, 8, memory_gib=1e6, time_budget_s=60, seed_plans=[capped.plan],
                stop_at_convergence=True)  # fmt: skip
    assert free.step_time_ms <= capped.step_time_ms + 1e-9
    assert free.step_time_ms < capped.step_time_ms * 0.95  # and the cap cost a lot here


def test_start_generator_is_seeded_and_never_repeats():
    prof = load_sample("nemotron-h-56b")
    ev = Evaluator(prof, 16, 32, 80.0)
    best = ev.fill_partition(list(range(16))).partition
    assert best is not None
    layout = (best, list(range(16)))

    def draws(seed: int) -> list[tuple]:
        gen = StartGenerator(ev, random.Random(seed))
        out = []
        for _ in range(12):
            got = gen.next(layout)
            assert got is not None
            part, place, _desc = got
            assert len(part) == len(place) and part[0][0] == 0 and part[-1][1] == 120
            assert all(a < b for a, b in part) and set(place) == set(range(16))
            out.append((tuple(part), tuple(place)))
        return out

    a, b = draws(1), draws(1)
    assert a == b and len(set(a)) == len(a)
    assert draws(2) != a


def test_cli_reports_why_it_stopped(capsys):
    rc = main(
        ["tune", "--profile", "tiny-hybrid", "--devices", "2", "--microbatches", "4",
         "--time-budget-s", "20", "--stop-at-convergence", "--json"]
    )  # fmt: skip
    cap = capsys.readouterr()
    d = json.loads(cap.out)
    assert rc == 0 and d["stop_reason"].startswith("climbs converged")
    assert d["search_time_s"] < 20
    assert "[tune] climbs converged" in cap.err


@pytest.mark.parametrize(
    ("name", "devices", "microbatches", "cap_gib"),
    # a wide pipeline, where the peers alone outlast the budget; and a memory-bound one,
    # whose first climb ranks the layouts (placement phase first, over the cap)
    [("nemotron-h-56b", 32, 64, 80.0), ("nemotron-h-8b", 8, 32, 20.0)],
)
def test_no_layout_is_ranked_once_the_budget_is_spent(
    monkeypatch: pytest.MonkeyPatch, name: str, devices: int, microbatches: int, cap_gib: float
) -> None:
    # ranking the layouts (a fill-aware partition per family, the spread layouts) took
    # 1.4-2.8 s after a 0.5 s budget was spent: tune(nemotron-h-56b, 32, 64) returned
    # after 3.4 s, its peers' 0.9 s plus a ranking it never used
    late: list[str] = []
    for meth in ("fill_partition", "spread_layouts"):
        real = getattr(Evaluator, meth)

        def spy(self, *a, _real=real, _m=meth, **k):  # type: ignore[no-untyped-def]
            if self.out_of_time():
                late.append(_m)
            return _real(self, *a, **k)

        monkeypatch.setattr(Evaluator, meth, spy)
    r = tune(load_sample(name), devices, microbatches, cap_gib, time_budget_s=0.05, seed=0)
    assert r.stop_reason.startswith("budget spent") and not late
    # the ranking itself stops at the deadline, where it is asked past it
    ev = Evaluator(load_sample(name), devices, microbatches, cap_gib, deadline=0.0)
    assert ranked_layouts(ev) == [] and not late
