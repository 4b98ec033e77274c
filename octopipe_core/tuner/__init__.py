"""The OctoPipe tuner: co-optimize partition, placement and schedule with the simulator.

>>> from octopipe_core.profile import Profile, example_profile_dict
>>> r = tune(Profile.from_dict(example_profile_dict()), devices=2, microbatches=4,
...          time_budget_s=0.5)
>>> r.fits_memory
True
"""

from octopipe_core.tuner.list_scheduler import POLICIES, Policy, list_schedule
from octopipe_core.tuner.search import TuneProgress, TuneResult, tune

__all__ = ["POLICIES", "Policy", "TuneProgress", "TuneResult", "list_schedule", "tune"]
