"""Tensor and sequence parallelism by hand, Megatron-style, and what they cost (notebook 12).

The name notebooks and scripts import. What the notebook teaches is generated into
d2lpar/lessons/nb12_tensor_parallel.py (edit the notebook's `#@save` cell, then `make lib`), its
argument checks live in d2lpar/checks/.
"""

from .lessons.nb12_tensor_parallel import *  # noqa: F403
from .lessons.nb12_tensor_parallel import __all__ as _nb12

__all__ = [*_nb12]
