"""Partitions: which contiguous layers form each stage.

* ``uniform_partition``: Megatron's default, equal counts of profile layers per stage; when the
  count does not divide, the first stages get one more layer.
* ``balanced_partition``: the contiguous split that minimises the slowest stage's F+B+W time
  (what partition-only planners such as Mist and AdaPipe optimise); ties are broken towards
  the most even split.

>>> uniform_partition(10, 4)
[(0, 3), (3, 6), (6, 8), (8, 10)]
>>> balanced_partition([1, 1, 1, 5, 1, 1], 3)
[(0, 3), (3, 4), (4, 6)]
"""

from __future__ import annotations

from functools import lru_cache
from itertools import accumulate

from octopipe_core.errors import OctoPipeError


def uniform_partition(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    """Equal layer counts per stage, the first ``num_layers % num_stages`` stages one more."""
    _check(num_layers, num_stages)
    q, r = divmod(num_layers, num_stages)
    out, lo = [], 0
    for s in range(num_stages):
        hi = lo + q + (1 if s < r else 0)
        out.append((lo, hi))
        lo = hi
    return out


def _check(num_layers: int, num_stages: int) -> None:
    if num_stages <= 0:
        raise OctoPipeError("partition: need at least one stage; fix: use --devices >= 1")
    if num_layers < num_stages:
        raise OctoPipeError(
            f"partition: {num_stages} stages but the model has only {num_layers} layers; "
            "fix: use fewer devices or chunks, or a profile with finer layers"
        )


def _min_stages(prefix: list[float], cap: float) -> int:
    """Fewest contiguous stages whose sums are all <= cap (greedy), or a big number."""
    n = len(prefix) - 1
    count, lo = 0, 0
    while lo < n:
        hi = lo
        while hi < n and prefix[hi + 1] - prefix[lo] <= cap + 1e-12:
            hi += 1
        if hi == lo:
            return n + 1  # a single layer exceeds the cap
        count += 1
        lo = hi
    return count


def balanced_partition(weights: list[float], num_stages: int) -> list[tuple[int, int]]:
    """Contiguous split of ``weights`` into ``num_stages`` non-empty stages minimising the max.

    Exact: the smallest feasible maximum (a contiguous sum) is found by binary search, then a
    DP that, among splits meeting that max, minimises the sum of squared stage loads (the most
    even one). Results are cached: the tuner asks for the same split many times.
    """
    _check(len(weights), num_stages)
    return list(_balanced(tuple(float(w) for w in weights), num_stages))


@lru_cache(maxsize=256)
def _balanced(weights: tuple[float, ...], num_stages: int) -> tuple[tuple[int, int], ...]:
    n = len(weights)
    prefix = [0.0, *accumulate(weights)]
    if n <= 200:  # every contiguous sum is a candidate maximum: exact by construction
        cands = sorted({prefix[j] - prefix[i] for i in range(n) for j in range(i + 1, n + 1)})
        lo, hi = 0, len(cands) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if _min_stages(prefix, cands[mid]) <= num_stages:
                hi = mid
            else:
                lo = mid + 1
        cap = cands[lo]
    else:  # bisection on the value, then snap to the greedy split's own (achieved) maximum
        lo_v, hi_v = max(weights), prefix[-1]
        for _ in range(100):
            if hi_v - lo_v <= 1e-12 * max(1.0, hi_v):
                break
            mid_v = 0.5 * (lo_v + hi_v)
            if _min_stages(prefix, mid_v) <= num_stages:
                hi_v = mid_v
            else:
                lo_v = mid_v
        cap = _greedy_max(prefix, hi_v)
    return tuple(_even_split(prefix, num_stages, cap))


def _greedy_max(prefix: list[float], cap: float) -> float:
    """The largest stage sum of the greedy split under ``cap`` (a contiguous sum <= cap)."""
    n, lo, best = len(prefix) - 1, 0, 0.0
    while lo < n:
        hi = lo
        while hi < n and prefix[hi + 1] - prefix[lo] <= cap + 1e-12:
            hi += 1
        best = max(best, prefix[hi] - prefix[lo])
        lo = hi
    return best


def _even_split(prefix: list[float], k: int, cap: float) -> list[tuple[int, int]]:
    """Among splits into k stages with every stage <= cap, the one minimising sum of squares."""
    n = len(prefix) - 1
    inf = float("inf")
    # best[j][i]: min cost to split the first i layers into j stages
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    arg = [[-1] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        row, prev = best[j], best[j - 1]
        for i in range(j, n - (k - j) + 1):
            b, a_best = inf, -1
            t = i - 1
            while t >= j - 1:
                load = prefix[i] - prefix[t]
                if load > cap + 1e-12:
                    break
                if prev[t] < inf:
                    c = prev[t] + load * load
                    if c < b:
                        b, a_best = c, t
                t -= 1
            row[i] = b
            arg[j][i] = a_best
    out: list[tuple[int, int]] = []
    i = n
    for j in range(k, 0, -1):
        t = arg[j][i]
        out.append((t, i))
        i = t
    return out[::-1]
