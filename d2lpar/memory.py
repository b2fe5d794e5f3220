"""The name notebooks and scripts import StepMemory by (`from d2lpar.memory import StepMemory`).

The code is a helper the notebooks use but do not teach: d2lpar/helpers/memory.py.
"""

from .helpers.memory import *  # noqa: F403
from .helpers.memory import __all__  # noqa: F401
