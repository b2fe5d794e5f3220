"""The capstone (notebook 18): one small GPT trained under every layout of a device mesh.

The name notebooks and scripts import. What the notebook teaches is generated into
d2lpar/lessons/nb18_capstone.py (edit the notebook's `#@save` cell, then `make lib`), its argument
checks live in d2lpar/checks/.
"""

from .lessons.nb18_capstone import *  # noqa: F403
from .lessons.nb18_capstone import __all__ as _nb18

__all__ = [*_nb18]
