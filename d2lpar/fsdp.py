"""FSDP2 in practice (notebook 11): fully_shard applied per block and on the root.

The name notebooks and scripts import. What the notebook teaches is generated into
d2lpar/lessons/nb11_fsdp2.py (edit the notebook's `#@save` cell, then `make lib`), its argument
checks live in d2lpar/checks/.
"""

from .lessons.nb11_fsdp2 import *  # noqa: F403
from .lessons.nb11_fsdp2 import __all__ as _nb11

__all__ = [*_nb11]
