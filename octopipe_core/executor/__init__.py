"""Run OctoPipe plans for real: lowering to per-rank comm+compute lists, an offline deadlock
checker, a torch.distributed runtime, stand-in models, export, and a layer profiler.

Only ``runtime``, ``models``, ``reference``, ``profiler`` and ``worker`` import torch; the
lowering, checker, export and trace modules work without it.
"""

from octopipe_core.executor.checker import CommOrderError, check_lowered
from octopipe_core.executor.lowering import LoweredPlan, Message, Op, lower_plan

__all__ = ["CommOrderError", "LoweredPlan", "Message", "Op", "check_lowered", "lower_plan"]
