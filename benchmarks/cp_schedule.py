"""How good is the tuned schedule for its own layout? An exact solver's answer on one cell.

Tunes one cell, then hands the tuned plan's layout (partition and placement) to Google
OR-Tools' CP-SAT solver, which searches every schedule of that layout (F, B and W of each stage
in micro-batch order, transfers as fixed delays, one action at a time per device; the memory
cap and the shared send stream are left out, so its proven bound holds for the simulator too)
from the tuned schedule as a hint. Prints the tuned step, the layout bound
(``octopipe_core.layout_bound``), the best schedule CP-SAT found (re-simulated) and the lower
bound it proved. ``--layers N`` keeps the first ``N - 1`` layers and the last (a smaller
model of the same pattern, small enough for CP-SAT to finish).

Where the whole problem is too large, ``--window-ms W`` searches it window by window instead
(a large-neighbourhood search): the actions that end before the window stay where they are,
those that start after it keep their order on their device, and only the window's actions
are free; the windows start every ``--step-ms`` and the best schedule carries on to the next.
Its results are schedules, not bounds.

``--free-placement`` lets CP-SAT choose each layer's device as well (one layer a stage, the
tuned plan as the hint; devices numbered by their lowest layer): the optimum over every plan
of the profile (memory cap left out) when it finishes, and a check of the tuner's layout
when it does not.

    pip install ortools   # this script only; not a dependency of OctoPipe
    python benchmarks/cp_schedule.py nemotron-h-56b 4 8 --layers 30 --free-placement
    python benchmarks/cp_schedule.py nemotron-h-56b 8 16 --layers 30 --cp-time-s 120
    python benchmarks/cp_schedule.py nemotron-h-56b 8 16 --window-ms 300 --step-ms 150 \
        --cp-time-s 30
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import time
from typing import Any

from octopipe_core.costs import stage_costs
from octopipe_core.plan import Action, Kind, Plan
from octopipe_core.plan_diff import layer_devices
from octopipe_core.profile import Profile, load_sample
from octopipe_core.simulator import simulate
from octopipe_core.tuner import tune
from octopipe_core.tuner.justify import Graph

UNITS = 100  # CP-SAT works in integers: 0.01 ms
KINDS = (Kind.F, Kind.B, Kind.W)  # the order of ``Graph``'s action index


def _retime(plan: Plan, g: Graph, dur: list[int], lag: list[dict[int, int]]) -> list[int]:
    """Integer start times of the plan's device orders (each action as early as its order and
    inputs allow): a feasible hint for CP-SAT."""
    SM = g.S * g.M
    start, end = [0] * g.N, [-1] * g.N
    pos, free = [0] * plan.num_devices, [0] * plan.num_devices
    left = g.N
    while left:
        moved = False
        for d, order in enumerate(plan.schedule):
            while pos[d] < len(order):
                x = order[pos[d]]
                a = KINDS.index(x.kind) * SM + x.stage * g.M + x.mb
                if any(end[p] < 0 for p in lag[a]):
                    break
                start[a] = max([free[d]] + [end[p] + q for p, q in lag[a].items()])
                end[a] = free[d] = start[a] + dur[a]
                pos[d] += 1
                left -= 1
                moved = True
        if not moved:
            raise SystemExit("the plan's orders deadlock (not a valid plan)")
    return start


def _run(model: Any, time_s: float) -> tuple[Any, bool]:
    """CP-SAT on ``model`` for ``time_s`` on 2 workers: the solver, and whether it found a
    solution in time."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_s
    solver.parameters.num_workers = 2
    return solver, solver.Solve(model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)


def solve(
    prof: Profile, plan: Plan, time_s: float, window: tuple[float, float] | None = None
) -> tuple[Plan, float, float]:
    """CP-SAT on ``plan``'s layout: (best plan found, its objective ms, proven bound ms).
    The actions and their dependencies are the justify passes' graph (``tuner/justify.py``),
    in integer units. With ``window`` (start, width in ms) only the actions of that window of
    the plan's schedule are free (module docstring); the bound then holds for that
    neighbourhood only."""
    from ortools.sat.python import cp_model

    g = Graph(stage_costs(prof, plan.partition), plan.placement, plan.num_microbatches)
    dur = [max(1, round(x * UNITS)) for x in g.dur]
    lag = [{p: round(delay * UNITS) for p, delay in ps} for ps in g.preds]
    hint = _retime(plan, g, dur, lag)
    horizon = int(max(h + x for h, x in zip(hint, dur, strict=True)) * 1.05) + 10
    t0, t1 = (
        (0, horizon) if window is None else (round(window[0] * UNITS), round(sum(window) * UNITS))
    )
    fixed = [hint[a] + dur[a] <= t0 for a in range(g.N)]
    m = cp_model.CpModel()
    st, en = list(hint), [h + x for h, x in zip(hint, dur, strict=True)]
    by_dev: list[list[Any]] = [[] for _ in range(plan.num_devices)]
    for a in range(g.N):
        if not fixed[a]:  # an action under way at t0 may keep its start
            st[a] = m.NewIntVar(min(hint[a], t0), horizon, "")
            en[a] = m.NewIntVar(min(hint[a], t0), horizon, "")
            by_dev[g.device[a]].append(m.NewIntervalVar(st[a], dur[a], en[a], ""))
            m.AddHint(st[a], hint[a])
    for a in range(g.N):  # once every free action has its variables
        if not fixed[a]:
            for p, q in lag[a].items():
                m.Add(st[a] >= en[p] + q)
    for d, ivs in enumerate(by_dev):
        m.AddNoOverlap(ivs)
        later = sorted((hint[a], a) for a in range(g.N) if g.device[a] == d and hint[a] >= t1)
        for (_, x), (_, y) in itertools.pairwise(later):
            m.Add(st[y] >= en[x])
    span = m.NewIntVar(0, horizon, "span")
    m.AddMaxEquality(span, [en[a] for a in range(g.N) if not fixed[a]])
    m.Minimize(span)
    solver, found = _run(m, time_s)
    if not found:  # no schedule in time
        return plan, float("inf"), solver.BestObjectiveBound() / UNITS
    SM = g.S * g.M
    orders: list[list[tuple[int, int, Action]]] = [[] for _ in range(plan.num_devices)]
    for a in range(g.N):
        k, rest = divmod(a, SM)
        s, i = divmod(rest, g.M)
        at = hint[a] if fixed[a] else solver.Value(st[a])
        orders[g.device[a]].append((at, s, Action(s, KINDS[k], i)))
    best = dataclasses.replace(plan, schedule=[[x for *_, x in sorted(o)] for o in orders])
    return best, solver.ObjectiveValue() / UNITS, solver.BestObjectiveBound() / UNITS


def one_layer_a_stage(plan: Plan) -> Plan:
    """``plan`` with each stage split into one stage per layer on the same device, in the
    same order (F up the stage's layers, B down, W up; a BW is its B then its W): no transfer
    is added, so it steps no slower."""
    expand: list[list[Action]] = []
    for acts in plan.schedule:
        out: list[Action] = []
        for a in acts:
            lo, hi = plan.partition[a.stage]
            up = range(lo, hi)
            if a.kind in (Kind.B, Kind.BW):
                out += [Action(layer, Kind.B, a.mb) for layer in reversed(up)]
            if a.kind in (Kind.F, Kind.W, Kind.BW):
                kind = Kind.F if a.kind == Kind.F else Kind.W
                out += [Action(layer, kind, a.mb) for layer in up]
        expand.append(out)
    n = plan.partition[-1][1]
    owner = [d for d in layer_devices(plan, n) if d is not None]  # a plan holds every layer
    return dataclasses.replace(
        plan, partition=[(i, i + 1) for i in range(n)], placement=owner, schedule=expand
    )


def solve_plan(
    prof: Profile, hint: Plan, time_s: float, floor_ms: float = 0.0
) -> tuple[Plan, float, float]:
    """CP-SAT over placement and schedule, one layer a stage: (best plan found, its objective
    ms, proven bound ms). Device ``d`` runs an action of layer ``l`` when ``x[l][d]``; a
    transfer's delay counts only when layers ``l`` and ``l + 1`` sit on different devices; the
    dependencies are ``Graph``'s. ``floor_ms``: a proven lower bound (``best_bound_ms``) the
    step cannot beat, which spares CP-SAT proving it again."""
    from ortools.sat.python import cp_model

    L, P, M = prof.num_layers, hint.num_devices, hint.num_microbatches
    c = stage_costs(prof, [(i, i + 1) for i in range(L)])
    hop = [round((c.wire_ms[s] + c.latency_ms[s]) * UNITS) for s in range(L)]
    dur = [[max(1, round(x * UNITS)) for x in arr] for arr in (c.f_ms, c.b_ms, c.w_ms)]
    hint = one_layer_a_stage(hint)
    lowest = sorted(range(P), key=lambda d: hint.placement.index(d) if d in hint.placement else L)
    new = {d: k for k, d in enumerate(lowest)}  # the numbering the model asks for
    hint = dataclasses.replace(
        hint,
        placement=[new[d] for d in hint.placement],
        schedule=[hint.schedule[d] for d in lowest],
    )
    g = Graph(c, hint.placement, M)  # integer start times in the hint's orders
    gdur = [max(1, round(x * UNITS)) for x in g.dur]
    at = _retime(hint, g, gdur, [{p: round(q * UNITS) for p, q in ps} for ps in g.preds])
    horizon = int(max(t + x for t, x in zip(at, gdur, strict=True)) * 1.1)
    m = cp_model.CpModel()
    x = [[m.NewBoolVar("") for _ in range(P)] for _ in range(L)]
    for layer in range(L):
        m.AddExactlyOne(x[layer])
        for d in range(P):
            m.AddHint(x[layer][d], hint.placement[layer] == d)
    m.Add(x[0][0] == 1)
    for layer in range(1, L):  # device d's lowest layer comes after device d-1's
        for d in range(1, P):
            m.Add(x[layer][d] <= sum(x[k][d - 1] for k in range(layer)))
    far = [m.NewBoolVar("") for _ in range(L - 1)]
    for layer in range(L - 1):
        for d in range(P):
            m.Add(far[layer] >= x[layer][d] - x[layer + 1][d])
    st: dict[tuple[int, int, int], Any] = {}
    en: dict[tuple[int, int, int], Any] = {}
    by_dev: list[list[Any]] = [[] for _ in range(P)]
    for k, layer, i in itertools.product(range(3), range(L), range(M)):
        st[k, layer, i] = m.NewIntVar(0, horizon, "")
        m.AddHint(st[k, layer, i], at[(k * L + layer) * M + i])
        en[k, layer, i] = m.NewIntVar(0, horizon, "")
        for d in range(P):
            by_dev[d].append(
                m.NewOptionalIntervalVar(
                    st[k, layer, i], dur[k][layer], en[k, layer, i], x[layer][d], ""
                )
            )
    for layer, i in itertools.product(range(L), range(M)):
        fw, bw, ww = (st[k, layer, i] for k in range(3))
        if layer > 0:
            m.Add(fw >= en[0, layer - 1, i] + hop[layer - 1] * far[layer - 1])
        if i > 0:
            m.Add(fw >= en[0, layer, i - 1])
            m.Add(bw >= en[1, layer, i - 1])
        if layer < L - 1:
            m.Add(bw >= en[1, layer + 1, i] + hop[layer] * far[layer])
        else:
            m.Add(bw >= en[0, layer, i])
        m.Add(ww >= en[1, layer, i])
    for ivs in by_dev:
        m.AddNoOverlap(ivs)
    span = m.NewIntVar(0, horizon, "span")
    m.AddMaxEquality(span, list(en.values()))
    m.Add(span >= math.floor(floor_ms * UNITS))
    m.Minimize(span)
    solver, found = _run(m, time_s)
    if not found:  # no plan in time
        return hint, float("inf"), solver.BestObjectiveBound() / UNITS
    place = [next(d for d in range(P) if solver.Value(x[layer][d])) for layer in range(L)]
    orders: list[list[tuple[int, int, Action]]] = [[] for _ in range(P)]
    for (k, layer, i), var in st.items():
        orders[place[layer]].append((solver.Value(var), layer, Action(layer, KINDS[k], i)))
    best = dataclasses.replace(
        hint,
        partition=[(i, i + 1) for i in range(L)],
        placement=place,
        schedule=[[a for *_, a in sorted(o)] for o in orders],
    )
    return best, solver.ObjectiveValue() / UNITS, solver.BestObjectiveBound() / UNITS


def search_windows(
    prof: Profile, plan: Plan, width_ms: float, step_ms: float, time_s: float
) -> Plan:
    """The large-neighbourhood search of the module docstring: one CP-SAT solve per window,
    keeping each better schedule (re-simulated); prints a line per window."""
    best_ms = simulate(prof, plan).step_time_ms
    t0 = 0.0
    while t0 < best_ms:
        got, _, _ = solve(prof, plan, time_s, (t0, width_ms))
        ms = simulate(prof, got).step_time_ms
        print(f"  window {t0:,.0f}-{t0 + width_ms:,.0f} ms: {ms:,.2f} ms", flush=True)
        if ms < best_ms - 1e-9:
            plan, best_ms = got, ms
        t0 += step_ms
    return plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", help="a bundled sample, e.g. nemotron-h-56b")
    ap.add_argument("devices", type=int)
    ap.add_argument("microbatches", type=int)
    ap.add_argument("--layers", type=int, default=0, help="keep the first N-1 layers + the last")
    ap.add_argument("--tune-s", type=float, default=8.0, help="tuner budget (s)")
    ap.add_argument("--cp-time-s", type=float, default=120.0, help="CP-SAT time limit (s)")
    ap.add_argument("--window-ms", type=float, default=0.0, help="search window by window")
    ap.add_argument("--step-ms", type=float, default=0.0, help="window start step (ms)")
    ap.add_argument("--free-placement", action="store_true", help="choose each layer's device too")
    args = ap.parse_args()
    try:
        import ortools  # noqa: F401
    except ImportError:
        raise SystemExit("cp_schedule.py: needs OR-Tools; fix: pip install ortools") from None
    prof = load_sample(args.profile)
    if args.layers:
        prof = dataclasses.replace(prof, layers=prof.layers[: args.layers - 1] + prof.layers[-1:])
    t0 = time.perf_counter()
    r = tune(prof, args.devices, args.microbatches, time_budget_s=args.tune_s, seed=0)
    lb = r.layout_bound
    print(
        f"{args.profile} ({prof.num_layers} layers) p={args.devices} m={args.microbatches}: "
        f"tuned {r.step_time_ms:,.2f} ms ({r.plan.num_stages} stages, "
        f"{time.perf_counter() - t0:.0f} s), best bound {r.best_bound_ms:,.2f}, layout bound "
        f"{lb.ms:,.2f}",
        flush=True,
    )
    t0 = time.perf_counter()
    if args.window_ms > 0:
        got = search_windows(
            prof, r.plan, args.window_ms, args.step_ms or args.window_ms / 2, args.cp_time_s
        )
        print(
            f"CP-SAT window by window ({time.perf_counter() - t0:.0f} s): "
            f"{simulate(prof, got).step_time_ms:,.2f} ms (tuned {r.step_time_ms:,.2f})"
        )
        return 0
    if args.free_placement:
        best, found, proven = solve_plan(prof, r.plan, args.cp_time_s, r.best_bound_ms)
    else:
        best, found, proven = solve(prof, r.plan, args.cp_time_s)
    sim = simulate(prof, best).step_time_ms
    print(
        f"CP-SAT ({time.perf_counter() - t0:.0f} s): best schedule {found:,.2f} ms "
        f"(re-simulated {sim:,.2f}), proven >= {proven:,.2f} ms; the tuned schedule is "
        f"{100 * (r.step_time_ms / proven - 1):+.2f}% above the proven bound; best found "
        f"{100 * (sim / r.best_bound_ms - 1):+.2f}% above the best bound"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
