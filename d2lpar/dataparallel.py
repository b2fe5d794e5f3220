"""nn.DataParallel by hand: scatter, replicate, parallel_apply, gather over device slots.

The name notebooks and scripts import. What the notebook teaches is generated into
d2lpar/lessons/nb03_data_parallel.py (edit the notebook's `#@save` cell, then `make lib`), its
argument checks live in d2lpar/checks/.
"""

from .lessons.nb03_data_parallel import *  # noqa: F403
from .lessons.nb03_data_parallel import __all__ as _nb03

__all__ = [*_nb03]
