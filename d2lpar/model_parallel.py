"""Model parallelism: a network split into stages on devices, and GPipe-style pipelining.

Notebook 4's lesson under the name notebooks and scripts import: d2lpar/lessons/nb04_model_parallel.py,
generated from the notebook's `#@save` cells (edit the cell, then `make lib`); its argument checks
are in d2lpar/checks/nb04_model_parallel.py.
It also re-exports what the notebook uses but does not teach, from d2lpar/helpers/.
(Notebook 14's torch.distributed.pipelining is d2lpar.pipelining.)
"""

from .helpers.footprint import memory_footprint
from .helpers.schedules import plot_schedule, schedule_problems
from .lessons.nb04_model_parallel import *  # noqa: F403
from .lessons.nb04_model_parallel import __all__ as _lesson

__all__ = [*_lesson, 'memory_footprint', 'plot_schedule', 'schedule_problems']
