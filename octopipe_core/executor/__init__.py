"""Run OctoPipe plans for real.

* ``lowering``: per-rank compute + send/recv lists; ``checker``: offline FIFO/deadlock check;
* ``runtime`` (DAG-driven torch.distributed executor), ``worker`` (torchrun entry point),
  ``models`` (stand-in layers, split B/W backward), ``reference`` (single-process check);
* ``export`` (job folders, PyTorch schedule CSV), ``torch_csv`` (runs that CSV with torch's
  ``_PipelineScheduleRuntime``), ``trace`` (Chrome traces), ``profiler`` (measured profiles),
  ``harness`` (local multi-process runs), ``plans`` (random / hand-made irregular plans).

Only ``runtime``, ``worker``, ``models``, ``reference``, ``profiler``, ``harness`` and
``torch_csv`` import torch; lowering, checker, export, trace and plans work without it.
"""

from octopipe_core.executor.checker import CommOrderError, check_lowered
from octopipe_core.executor.lowering import LoweredPlan, Message, Op, lower_plan

__all__ = ["CommOrderError", "LoweredPlan", "Message", "Op", "check_lowered", "lower_plan"]
