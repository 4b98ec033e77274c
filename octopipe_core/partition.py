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

    Exact: binary search over the candidate maxima (all contiguous sums), then a DP that, among
    splits meeting that max, minimises the sum of squared stage loads (the most even one).
    """
    n = len(weights)
    _check(n, num_stages)
    prefix = [0.0, *accumulate(weights)]
    cands = sorted({prefix[j] - prefix[i] for i in range(n) for j in range(i + 1, n + 1)})
    lo, hi = 0, len(cands) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _min_stages(prefix, cands[mid]) <= num_stages:
            hi = mid
        else:
            lo = mid + 1
    cap = cands[lo]
    return _even_split(prefix, num_stages, cap)


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
