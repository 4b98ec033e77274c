"""OctoPipe: co-optimize partition, placement and schedule of pipeline-parallel training."""

from octopipe_core.errors import OctoPipeError
from octopipe_core.plan import Action, Plan, load_plan, save_plan, validate_plan
from octopipe_core.profile import Profile, load_profile, load_sample
from octopipe_core.schedules import SCHEDULES, build_plan
from octopipe_core.simulator import SimResult, simulate

__all__ = [
    "SCHEDULES",
    "Action",
    "OctoPipeError",
    "Plan",
    "Profile",
    "SimResult",
    "build_plan",
    "load_plan",
    "load_profile",
    "load_sample",
    "save_plan",
    "simulate",
    "validate_plan",
]
__version__ = "0.1.0"
