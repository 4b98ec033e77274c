"""Where a tuned cell's gap to the best bound comes from: the same cell tuned on variants of
its profile, each with one source of idle taken away.

Variants (each keeps the layer pattern; the totals change only where said):

* ``as is``: the sample itself;
* ``blocks equal``: every block type (any family but ``embedding`` and ``lm_head``) gets
  the count-weighted mean F, B and W time of all blocks (the same total work);
* ``<type> at the mean``: that one block type at the blocks' mean, the others as they are
  (which type's difference from the rest costs the most);
* ``free transfers``: no link latency, unlimited bandwidth.

A gap that vanishes in a variant is the gap that variant's change removes. Each variant is
tuned with the grid's budget (``bench_tuner.budget_for``) and seed 0; the gap is to that
variant's own ``best_bound_ms`` (``octopipe_core/bounds.py``).

    python benchmarks/gap_sources.py nemotron-h-56b:8:16 nemotron-h-56b:32:64
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_tuner import budget_for, cell_parser

from octopipe_core.profile import Profile, load_sample
from octopipe_core.tuner import tune

TIMES = ("forward_ms", "backward_input_ms", "backward_weight_ms")
ENDS = ("embedding", "lm_head")


def variants(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The profile variants of the module docstring, as profile dictionaries."""
    types = data["layer_types"]
    count = {t: data["layers"].count(t) for t in types}
    blocks = [t for t in types if types[t]["family"] not in ENDS and count[t]]
    n = sum(count[t] for t in blocks)
    mean = {k: sum(types[t][k] * count[t] for t in blocks) / n for k in TIMES}

    def with_times(names: list[str]) -> dict[str, Any]:
        d = copy.deepcopy(data)
        for t in names:
            d["layer_types"][t].update(mean)
        return d

    out = [("as is", data), ("blocks equal", with_times(blocks))]
    out += [(f"{t} at the mean", with_times([t])) for t in blocks]
    free = copy.deepcopy(data)
    free["device"].update(p2p_latency_us=0.0, p2p_gbps=1e9)
    out.append(("free transfers", free))
    return out


def main() -> int:
    args = cell_parser(__doc__).parse_args()
    print("| cell | variant | tuned ms | best bound ms | gap | layout bound ms |")
    print("|---|---|---|---|---|---|")
    for name, p, m in args.cells:
        data = load_sample(name).to_dict()
        for label, d in variants(data):
            prof = Profile.from_dict(d)
            r = tune(prof, p, m, time_budget_s=budget_for(p, m, args.scale), seed=0)
            print(
                f"| {name} p={p} m={m} | {label} | {r.step_time_ms:,.1f} | "
                f"{r.best_bound_ms:,.1f} | {r.gap_to_best_bound_pct:+.2f} % | "
                f"{r.layout_bound.ms:,.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
