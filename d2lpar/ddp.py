"""DDP training as notebooks 5 and 6 write it: join the group, shard the data, train, resume.

The name notebooks and scripts import. What the notebook teaches is generated into
d2lpar/lessons/nb05_ddp.py and d2lpar/lessons/nb06_ddp_launching.py (edit the notebook's `#@save`
cell, then `make lib`), its argument checks live in d2lpar/checks/.
"""

from .lessons.nb05_ddp import *  # noqa: F403
from .lessons.nb05_ddp import __all__ as _nb05
from .lessons.nb06_ddp_launching import *  # noqa: F403
from .lessons.nb06_ddp_launching import __all__ as _nb06

__all__ = [*_nb05, *_nb06]
