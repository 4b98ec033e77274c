"""How good is the tuned schedule for its own layout? An exact solver's answer on one cell.

Tunes one cell, then hands the tuned plan's layout (partition and placement) to Google
OR-Tools' CP-SAT solver, which searches every schedule of that layout (F, B and W of each stage
in micro-batch order, transfers as fixed delays, one action at a time per device; the memory
cap and the shared send stream are left out, so its proven bound holds for the simulator too)
from the tuned schedule as a hint. Prints the tuned step, the layout bound
(``octopipe_core.layout_bound``), the best schedule CP-SAT found (re-simulated) and the lower
bound it proved. ``--layers N`` keeps the first ``N - 1`` layers and the last (a smaller
model of the same pattern, small enough for CP-SAT to finish).

    pip install ortools   # this script only; not a dependency of OctoPipe
    python benchmarks/cp_schedule.py nemotron-h-56b 8 16 --layers 30 --cp-time-s 120
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from octopipe_core.costs import stage_costs
from octopipe_core.layout_bound import plan_layout_bound
from octopipe_core.plan import Action, Kind, Plan
from octopipe_core.profile import Profile, load_sample
from octopipe_core.simulator import simulate
from octopipe_core.tuner import tune

UNITS = 100  # CP-SAT works in integers: 0.01 ms


def _preds(plan: Plan, hop: list[int], k: Kind, s: int, i: int) -> list[tuple[tuple, int]]:
    """The actions ``(kind, stage, mb)`` that must end before this one starts, with delays."""
    S, place = plan.num_stages, plan.placement
    far = lambda a, b: hop[min(a, b)] if place[a] != place[b] else 0  # noqa: E731
    out: list[tuple[tuple, int]] = []
    if k == Kind.F:
        out += [((Kind.F, s - 1, i), far(s - 1, s))] if s > 0 else []
    elif k == Kind.B:
        out.append(((Kind.B, s + 1, i), far(s, s + 1)) if s < S - 1 else ((Kind.F, s, i), 0))
    else:
        out.append(((Kind.B, s, i), 0))
    if i > 0 and k != Kind.W:
        out.append(((k, s, i - 1), 0))
    return out


def _retime(plan: Plan, dur: dict, hop: list[int]) -> dict[tuple, int]:
    """Integer start times of the plan's device orders (each action as early as its order and
    inputs allow): a feasible hint for CP-SAT."""
    start: dict[tuple, int] = {}
    end: dict[tuple, int] = {}
    pos = [0] * plan.num_devices
    free = [0] * plan.num_devices
    left = sum(len(o) for o in plan.schedule)
    while left:
        moved = False
        for d, order in enumerate(plan.schedule):
            while pos[d] < len(order):
                a = order[pos[d]]
                key = (a.kind, a.stage, a.mb)
                ps = _preds(plan, hop, *key)
                if any(q not in end for q, _ in ps):
                    break
                t = max([free[d]] + [end[q] + lag for q, lag in ps])
                start[key], end[key] = t, t + dur[a.kind][a.stage]
                free[d] = end[key]
                pos[d] += 1
                left -= 1
                moved = True
        if not moved:
            raise SystemExit("the plan's orders deadlock (not a valid plan)")
    return start


def solve(prof: Profile, plan: Plan, time_s: float) -> tuple[Plan, float, float]:
    """CP-SAT on ``plan``'s layout: (best plan found, its objective ms, proven bound ms)."""
    from ortools.sat.python import cp_model

    c = stage_costs(prof, plan.partition)
    S, M, place = plan.num_stages, plan.num_microbatches, plan.placement
    dur = {
        k: [max(1, round(x * UNITS)) for x in arr]
        for k, arr in ((Kind.F, c.f_ms), (Kind.B, c.b_ms), (Kind.W, c.w_ms))
    }
    hop = [round((c.wire_ms[s] + c.latency_ms[s]) * UNITS) for s in range(S)]
    hint = _retime(plan, dur, hop)
    horizon = int(max(hint[k] + dur[k[0]][k[1]] for k in hint) * 1.05) + 10
    m = cp_model.CpModel()
    st, en, by_dev = {}, {}, [[] for _ in range(plan.num_devices)]
    for key in hint:
        k, s, _i = key
        st[key] = m.NewIntVar(0, horizon, "")
        en[key] = m.NewIntVar(0, horizon, "")
        by_dev[place[s]].append(m.NewIntervalVar(st[key], dur[k][s], en[key], ""))
        m.AddHint(st[key], hint[key])
    for key in hint:
        for q, lag in _preds(plan, hop, *key):
            m.Add(st[key] >= en[q] + lag)
    for ivs in by_dev:
        m.AddNoOverlap(ivs)
    span = m.NewIntVar(0, horizon, "span")
    m.AddMaxEquality(span, [en[(Kind.W, s, i)] for s in range(S) for i in range(M)])
    m.Minimize(span)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_s
    solver.parameters.num_workers = 2
    solver.Solve(m)
    orders: list[list[tuple[int, int, Action]]] = [[] for _ in range(plan.num_devices)]
    for (k, s, i), var in st.items():
        orders[place[s]].append((solver.Value(var), s, Action(s, k, i)))
    sched = [[a for *_, a in sorted(o)] for o in orders]
    best = dataclasses.replace(plan, schedule=sched)
    return best, solver.ObjectiveValue() / UNITS, solver.BestObjectiveBound() / UNITS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", help="a bundled sample, e.g. nemotron-h-56b")
    ap.add_argument("devices", type=int)
    ap.add_argument("microbatches", type=int)
    ap.add_argument("--layers", type=int, default=0, help="keep the first N-1 layers + the last")
    ap.add_argument("--tune-s", type=float, default=8.0, help="tuner budget (s)")
    ap.add_argument("--cp-time-s", type=float, default=120.0, help="CP-SAT time limit (s)")
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
    lb = plan_layout_bound(prof, r.plan)
    print(
        f"{args.profile} ({prof.num_layers} layers) p={args.devices} m={args.microbatches}: "
        f"tuned {r.step_time_ms:,.2f} ms ({r.plan.num_stages} stages, "
        f"{time.perf_counter() - t0:.0f} s), best bound {r.best_bound_ms:,.2f}, layout bound "
        f"{lb.ms:,.2f}",
        flush=True,
    )
    t0 = time.perf_counter()
    best, found, proven = solve(prof, r.plan, args.cp_time_s)
    sim = simulate(prof, best).step_time_ms
    print(
        f"CP-SAT ({time.perf_counter() - t0:.0f} s): best schedule {found:,.2f} ms "
        f"(re-simulated {sim:,.2f}), proven >= {proven:,.2f} ms; the tuned schedule is "
        f"{100 * (r.step_time_ms / proven - 1):+.2f}% above the proven bound"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
