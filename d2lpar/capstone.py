"""The capstone (notebook 17): one small GPT trained under every layout of a device mesh.

The name notebooks and scripts import. What the notebook teaches is generated into
d2lpar/lessons/nb17_capstone.py (edit the notebook's `#@save` cell, then `make lib`), its argument
checks live in d2lpar/checks/.
"""

from .lessons.nb17_capstone import *  # noqa: F403
from .lessons.nb17_capstone import __all__ as _nb17

__all__ = [*_nb17]
