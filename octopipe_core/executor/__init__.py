"""Run OctoPipe plans for real.

* ``lowering``: per-rank compute + send/recv lists; ``checker``: offline FIFO/deadlock check;
* ``runtime`` (DAG-driven torch.distributed executor), ``worker`` (torchrun entry point),
  ``models`` (stand-in layers, split B/W backward), ``reference`` (single-process check);
* ``train`` (the training loop on a pp x dp mesh), ``mesh`` (rank grid, ``DeviceMesh``),
  ``dp`` (per-stage gradient reduction, ZeRO-1, optimizer), ``data`` (synthetic, token file,
  data hook), ``checkpoint`` (torch.distributed.checkpoint), ``settings`` (their dataclasses);
* ``export`` (job folders: launch.sh, slurm.sbatch, PyTorch schedule CSV), ``torch_csv`` (runs
  that CSV with torch's ``_PipelineScheduleRuntime``), ``trace`` (Chrome traces), ``profiler``
  (measured profiles), ``harness`` (local multi-process runs), ``plans`` (random / hand-made
  irregular plans).

Lowering, checker, export, settings, trace and plans work without importing torch.
"""

from octopipe_core.executor.checker import CommOrderError, check_lowered
from octopipe_core.executor.lowering import LoweredPlan, Message, Op, lower_plan

__all__ = ["CommOrderError", "LoweredPlan", "Message", "Op", "check_lowered", "lower_plan"]
