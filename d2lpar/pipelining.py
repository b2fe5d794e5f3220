"""Pipeline schedules with torch.distributed.pipelining, timed and replayed (notebook 14).

The name notebooks and scripts import. What the notebook teaches is generated into
d2lpar/lessons/nb14_pipeline_parallel.py (edit the notebook's `#@save` cell, then `make lib`), its
argument checks live in d2lpar/checks/.
"""

from .lessons.nb14_pipeline_parallel import *  # noqa: F403
from .lessons.nb14_pipeline_parallel import __all__ as _nb14

__all__ = [*_nb14]
