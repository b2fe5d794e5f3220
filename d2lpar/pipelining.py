"""Pipeline schedules with torch.distributed.pipelining, timed and replayed (notebook 13).

The name notebooks and scripts import. What the notebook teaches is generated into
d2lpar/lessons/nb13_pipeline_parallel.py (edit the notebook's `#@save` cell, then `make lib`), its
argument checks live in d2lpar/checks/.
"""

from .lessons.nb13_pipeline_parallel import *  # noqa: F403
from .lessons.nb13_pipeline_parallel import __all__ as _nb13

__all__ = [*_nb13]
