"""Irregular plans for tests and benchmarks: random valid plans and a hand-made irregular one."""

from __future__ import annotations

import random

from octopipe_core.plan import Action, Kind, Plan, producers


def random_plan(num_layers: int, devices: int, microbatches: int, seed: int = 0) -> Plan:
    """A random valid plan: random partition (``devices``..``2·devices+1`` stages), placement
    (every device used), per-micro-batch split or fused backward, and per-device orders taken
    from a random topological order of the data dependencies."""
    rng = random.Random(seed)
    S = rng.randint(devices, max(devices, min(num_layers, 2 * devices + 1)))
    cuts = sorted(rng.sample(range(1, num_layers), S - 1))
    bounds = [0, *cuts, num_layers]
    partition = [(bounds[i], bounds[i + 1]) for i in range(S)]
    placement = list(range(devices)) + [rng.randrange(devices) for _ in range(S - devices)]
    rng.shuffle(placement)
    bkind = {(s, m): rng.choice((Kind.B, Kind.BW)) for s in range(S) for m in range(microbatches)}
    acts = [Action(s, Kind.F, m) for s in range(S) for m in range(microbatches)]
    for (s, m), k in bkind.items():
        acts += (
            [Action(s, Kind.B, m), Action(s, Kind.W, m)] if k == "B" else [Action(s, Kind.BW, m)]
        )
    done: set[Action] = set()
    pending = set(acts)
    schedule: list[list[Action]] = [[] for _ in range(devices)]
    while pending:
        ready = sorted(a for a in pending if all(p in done for p in producers(a, S, bkind)))
        a = rng.choice(ready)
        pending.remove(a)
        done.add(a)
        schedule[placement[a.stage]].append(a)
    return Plan(microbatches, partition, placement, schedule, f"random/{seed}", {"seed": seed})


def irregular_plan(num_layers: int, microbatches: int = 4) -> Plan:
    """A hand-made irregular 2-device plan (stand-in for a tuned plan): uneven partition into
    3 stages, stages 0 and 2 on device 0 (a V-like fold), split B/W with W deferred to fill
    the bubbles, device 1 fused."""
    assert num_layers >= 3
    a = max(1, num_layers // 4)
    b = max(a + 1, (3 * num_layers) // 5)
    partition = [(0, a), (a, b), (b, num_layers)]
    placement = [0, 1, 0]
    M = microbatches
    d0: list[Action] = [Action(0, Kind.F, 0)]
    for m in range(M):
        if m + 1 < M:
            d0.append(Action(0, Kind.F, m + 1))
        d0 += [Action(2, Kind.F, m), Action(2, Kind.B, m)]
        if m > 0:
            d0.append(Action(0, Kind.B, m - 1))
    d0.append(Action(0, Kind.B, M - 1))
    d0 += [Action(2, Kind.W, m) for m in range(M)] + [Action(0, Kind.W, m) for m in range(M)]
    d1: list[Action] = [Action(1, Kind.F, m) for m in range(min(2, M))]
    for m in range(M):
        d1.append(Action(1, Kind.BW, m))
        if m + 2 < M:
            d1.append(Action(1, Kind.F, m + 2))
    return Plan(M, partition, placement, [d0, d1], "irregular/hand", {"schedule": "hand"})
