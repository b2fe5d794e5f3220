"""ZeRO stages 1, 2 and 3 written by hand (notebook 10).

The name notebooks and scripts import. What the notebook teaches is generated into
d2lpar/lessons/nb10_zero.py (edit the notebook's `#@save` cell, then `make lib`), its argument
checks live in d2lpar/checks/.
"""

from .checks.nb10_zero import STAGES
from .lessons.nb10_zero import *  # noqa: F403
from .lessons.nb10_zero import __all__ as _nb10

__all__ = [*_nb10, 'STAGES']
