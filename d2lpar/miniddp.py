"""A hand-written DistributedDataParallel, built in three steps (notebook 9).

The name notebooks and scripts import. What the notebook teaches is generated into
d2lpar/lessons/nb09_collectives.py (edit the notebook's `#@save` cell, then `make lib`), its
argument checks live in d2lpar/checks/.
"""

from .lessons.nb09_collectives import *  # noqa: F403
from .lessons.nb09_collectives import __all__ as _nb09

__all__ = [*_nb09]
