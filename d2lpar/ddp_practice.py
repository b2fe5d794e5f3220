"""DDP in practice: accumulation, mixed precision, uneven inputs, evaluation.

Notebook 7's lesson under the name notebooks and scripts import: d2lpar/lessons/nb07_ddp_practice.py,
generated from the notebook's `#@save` cells (edit the cell, then `make lib`); its argument checks
are in d2lpar/checks/nb07_ddp_practice.py.
It also re-exports what the notebook uses but does not teach, from d2lpar/helpers/.
"""

from .helpers.probes import bf16_in_hardware, cxx_compiler, inductor_works, loader_pins
from .helpers.profiling import overlap_report, plot_comm_timeline, profile_intervals
from .lessons.nb07_ddp_practice import *  # noqa: F403
from .lessons.nb07_ddp_practice import __all__ as _lesson

__all__ = [
    *_lesson,
    'cxx_compiler',
    'inductor_works',
    'loader_pins',
    'bf16_in_hardware',
    'profile_intervals',
    'overlap_report',
    'plot_comm_timeline',
]
