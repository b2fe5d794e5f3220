"""All-to-all from point-to-point messages; a mixture of experts split across ranks (notebook 15).

The name notebooks and scripts import. What the notebook teaches is generated into
d2lpar/lessons/nb15_context_expert.py (edit the notebook's `#@save` cell, then `make lib`), its
argument checks live in d2lpar/checks/.
"""

from .lessons.nb15_context_expert import *  # noqa: F403
from .lessons.nb15_context_expert import __all__ as _nb15

__all__ = [*_nb15]
