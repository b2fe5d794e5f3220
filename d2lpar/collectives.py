"""Collective operations written by hand from point-to-point messages.

Notebook 9's lesson under the name notebooks and scripts import: d2lpar/lessons/nb09_collectives.py,
generated from the notebook's `#@save` cells (edit the cell, then `make lib`); its argument checks
are in d2lpar/checks/nb09_collectives.py.
It also re-exports what the notebook uses but does not teach, from d2lpar/helpers/.
"""

from .helpers.timings import allreduce_timings
from .lessons.nb09_collectives import *  # noqa: F403
from .lessons.nb09_collectives import __all__ as _lesson

__all__ = [*_lesson, 'allreduce_timings']
