"""Restart layouts for the anytime phase of the tuner: perturbed and irregular starts.

Once the deterministic climbs (from the peers and the layout families) have converged, the
tuner keeps drawing new starting layouts from a seeded generator until its time budget is
spent, climbs from each and keeps the best plan. Kinds of start, drawn at random:

* **fold**: a fold depth ``r`` from 0 (``seq``) to ``p`` (the V) that fits the layers, with
  the exact fill-aware partition of a *perturbed* model (start-up fill weighted by a random
  factor, so that layouts with more or less fill than the model predicts get tried; when
  the memory cap binds, half the time also under a memory budget with a random number of
  micro-batches in flight);
* **family**: a regular family (``v``, ``loop{v}``, ``zigzag{v}``) with a fill-aware partition
  of the same perturbed model (a descent from a random split for non-nested ones);
* **shift**: the best layout with one to three boundaries moved by a layer or two;
* **swap**: the best placement with two stages' devices exchanged, re-partitioned;
* **split** / **merge**: a stage of the best layout cut in two (the new half on another
  device) or two adjacent stages on one device joined, re-partitioned (irregular layouts).

A layout already tried is skipped; ``next`` returns None when ``MAX_REPEATS`` draws in a row
gave nothing new (the space is exhausted: small models).

>>> import random
>>> from octopipe_core.profile import Profile, example_profile_dict
>>> from octopipe_core.tuner.evaluate import Evaluator
>>> ev = Evaluator(Profile.from_dict(example_profile_dict()), 2, 4, 80.0)
>>> gen = StartGenerator(ev, random.Random(0))
>>> part, place, desc = gen.next(([(0, 2), (2, 4)], [0, 1]))
>>> len(part) == len(place) and part[-1][1] == 4
True
"""

from __future__ import annotations

import random
from dataclasses import replace

from octopipe_core.fill_partition import FillModel, nested_blocks, solve_fill
from octopipe_core.tuner.evaluate import Evaluator, Partition
from octopipe_core.tuner.layouts import FAMILIES, chain_moves, family_placement

Layout = tuple[Partition, list[int]]
MAX_REPEATS = 200
KINDS = ("fold", "family", "shift", "swap", "split", "merge")
WEIGHTS = (3, 1, 3, 2, 2, 1)
FILL_WEIGHTS = (0.5, 0.75, 1.25, 1.5, 2.0, 3.0)
MEMORY_INFLIGHT = (0.5, 0.75, 1.0, 1.25)


class StartGenerator:
    """Seeded source of new starting layouts (module docstring)."""

    def __init__(self, ev: Evaluator, rng: random.Random) -> None:
        self.ev, self.rng = ev, rng
        self.seen: set[tuple[tuple[tuple[int, int], ...], tuple[int, ...]]] = set()
        self._models: dict[float, FillModel] = {}

    def mark(self, part: Partition, place: list[int]) -> None:
        """Record a layout as tried."""
        self.seen.add((tuple(part), tuple(place)))

    def next(self, best: Layout) -> tuple[Partition, list[int], str] | None:
        """A layout not tried yet, or None when ``MAX_REPEATS`` draws found none."""
        for _ in range(MAX_REPEATS):
            kind = self.rng.choices(KINDS, WEIGHTS)[0]
            got = getattr(self, f"_{kind}")(best)
            if got is None:
                continue
            part, place, desc = got
            key = (tuple(part), tuple(place))
            if key in self.seen or len(part) != len(place):
                continue
            self.seen.add(key)
            return part, place, desc
        return None

    # ---- helpers --------------------------------------------------------------------------
    def _model(self, alpha: float) -> FillModel:
        """The evaluator's fill model with start-up fill and drain weighted by ``alpha``."""
        m = self._models.get(alpha)
        if m is None:
            base = self.ev.fill
            m = replace(
                base,
                fill_ms=[alpha * x for x in base.fill_ms],
                drain_ms=[alpha * x for x in base.drain_ms],
                hop_ms=alpha * base.hop_ms,
            )
            self._models[alpha] = m
        return m

    def _partition(self, place: list[int], start: Partition | None = None) -> Partition | None:
        alpha = self.rng.choice(FILL_WEIGHTS)
        if start is None and nested_blocks(place) is None:
            start = self._random_split(len(place))
        model = self._model(alpha)
        if self.ev.memory_tight and self.rng.random() < 0.5:  # under the cap's memory budget
            mem = self.ev.fill_model(True, self.rng.choice(MEMORY_INFLIGHT))
            model = replace(model, weight_mib=mem.weight_mib, activation_mib=mem.activation_mib,
                            cap_mib=mem.cap_mib)  # fmt: skip
        res = solve_fill(model, place, start)
        return res.partition

    def _random_split(self, stages: int) -> Partition | None:
        n = self.ev.profile.num_layers
        if stages > n:
            return None
        cuts = sorted(self.rng.sample(range(1, n), stages - 1))
        b = [0, *cuts, n]
        return [(b[k], b[k + 1]) for k in range(stages)]

    # ---- kinds ----------------------------------------------------------------------------
    def _fold(self, best: Layout) -> tuple[Partition, list[int], str] | None:
        p, n = self.ev.devices, self.ev.profile.num_layers
        top = min(p, n - p)
        if top < 0:
            return None
        r = self.rng.randint(0, top)
        place = family_placement(f"fold{r}", p)
        part = self._partition(place)
        return None if part is None else (part, place, f"fold{r} (perturbed fill)")

    def _family(self, best: Layout) -> tuple[Partition, list[int], str] | None:
        p, n = self.ev.devices, self.ev.profile.num_layers
        fams = [f for f in FAMILIES if f != "seq" and len(family_placement(f, p)) <= n]
        if not fams:
            return None
        fam = self.rng.choice(fams)
        place = family_placement(fam, p)
        part = self._partition(place)
        return None if part is None else (part, place, f"{fam} (perturbed fill)")

    def _shift(self, best: Layout) -> tuple[Partition, list[int], str] | None:
        part, place = list(best[0]), best[1]
        S = len(part)
        if S < 2:
            return None
        for _ in range(self.rng.randint(1, 3)):
            s = self.rng.randrange(S)
            t = s + self.rng.choice((-2, -1, 1, 2))
            if 0 <= t < S:
                new = chain_moves(part, s, t)
                if new is not None:
                    part = new
        return part, list(place), "shifted boundaries of the best"

    def _swap(self, best: Layout) -> tuple[Partition, list[int], str] | None:
        part, place = best
        S = len(place)
        pairs = [(a, b) for a in range(S) for b in range(a + 1, S) if place[a] != place[b]]
        if not pairs:
            return None
        a, b = self.rng.choice(pairs)
        new = list(place)
        new[a], new[b] = place[b], place[a]
        fresh = self._partition(new, part)
        if fresh is None:
            return None
        return fresh, new, f"swap s{a} <-> s{b} of the best"

    def _split(self, best: Layout) -> tuple[Partition, list[int], str] | None:
        part, place = best
        S, n, p = len(part), self.ev.profile.num_layers, self.ev.devices
        cands = [s for s in range(S) if part[s][1] - part[s][0] >= 2]
        if not cands or n < S + 1:
            return None
        s = self.rng.choice(cands)
        a, b = part[s]
        cut = self.rng.randint(a + 1, b - 1)
        d = self.rng.choice([x for x in range(p) if x != place[s]] or [place[s]])
        new_part = [*part[:s], (a, cut), (cut, b), *part[s + 1 :]]
        new_place = [*place[: s + 1], d, *place[s + 1 :]]
        fresh = self._partition(new_place, new_part) or new_part
        return fresh, new_place, f"split s{s} onto d{d}"

    def _merge(self, best: Layout) -> tuple[Partition, list[int], str] | None:
        part, place = best
        S = len(part)
        cands = [s for s in range(S - 1) if place[s] == place[s + 1]]
        if not cands:
            # a stage whose device holds another stage moves to its neighbour's device
            cands2 = [s for s in range(S - 1) if place.count(place[s + 1]) > 1]
            if not cands2:
                return None
            s = self.rng.choice(cands2)
            new_place = list(place)
            new_place[s + 1] = place[s]
            if len(set(new_place)) < self.ev.devices:
                return None
            fresh = self._partition(new_place, part) or list(part)
            return fresh, new_place, f"move s{s + 1} next to s{s}"
        s = self.rng.choice(cands)
        new_part = [*part[:s], (part[s][0], part[s + 1][1]), *part[s + 2 :]]
        new_place = place[:s] + place[s + 1 :]
        fresh = self._partition(new_place, new_part) or new_part
        return fresh, new_place, f"merge s{s}+s{s + 1}"
