"""The old name of d2lpar.model_parallel (notebook 4), kept so that code written against it imports.

Not notebook 14's pipeline schedules: those are d2lpar.pipelining, after torch.distributed.pipelining.
"""

from .model_parallel import *  # noqa: F403
from .model_parallel import __all__  # noqa: F401
