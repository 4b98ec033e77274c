"""Run chosen cells of the tuner grid (``bench_tuner.py`` section 1) with its budgets and
print one line per cell, without touching the docs: a quick check of a few cells.

    python benchmarks/tuner_cells.py nemotron-h-56b:8:16 nemotron-h-56b:32:64
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_tuner import cell_parser, run_cell


def main() -> int:
    args = cell_parser(__doc__).parse_args()
    for name, p, m in args.cells:
        r = run_cell(name, p, m, args.scale)
        peer = r["peer"]
        print(
            f"{name} p={p} m={m}: tuned {r['tuned']:,.1f} ms, bound {r['bound']:,.1f} "
            f"({r['bound_name']}), gap {r['gap']:+.2f}%, uncapped {r['uncapped']:,.1f} "
            f"({r['ugap']:+.2f}%), memory binds {'yes' if r['binds'] else 'no'}, peer "
            f"{peer[0] if peer else '-'} {peer[1] if peer else float('nan'):,.1f}, "
            f"not slower {r['not_slower']}, layout {r['layout']}, {r['time']:.0f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
