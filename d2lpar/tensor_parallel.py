"""Tensor and sequence parallelism by hand, Megatron-style (notebook 12), and what they cost (notebook 13).

The name notebooks and scripts import. What the notebooks teach is generated into
d2lpar/lessons/nb12_tensor_parallel.py and nb13_tensor_parallel_dtensor.py (edit the notebook's
`#@save` cell, then `make lib`), their argument checks live in d2lpar/checks/.
"""

from .lessons.nb12_tensor_parallel import *  # noqa: F403
from .lessons.nb12_tensor_parallel import __all__ as _nb12
from .lessons.nb13_tensor_parallel_dtensor import *  # noqa: F403
from .lessons.nb13_tensor_parallel_dtensor import __all__ as _nb13

__all__ = [*_nb12, *_nb13]
