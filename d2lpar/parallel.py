"""Parallel primitives for single-process data parallelism across device slots (notebook 8).

The name notebooks and scripts import. What the notebook teaches is generated into
d2lpar/lessons/nb08_lenet_data_parallel.py (edit the notebook's `#@save` cell, then `make lib`), its
argument checks live in d2lpar/checks/.
d2lpar.models and d2lpar.training are this lesson's other old names.
"""

from .lessons.nb08_lenet_data_parallel import *  # noqa: F403
from .lessons.nb08_lenet_data_parallel import __all__ as _nb08

__all__ = [*_nb08]
