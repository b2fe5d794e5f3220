"""The name notebooks import files written whole by (`from d2lpar.saving import write_whole`).

The code is course machinery: d2lpar/machinery/saving.py.
"""

from .machinery.saving import *  # noqa: F403
from .machinery.saving import __all__  # noqa: F401
from .machinery.saving import replace_whole, write_whole  # noqa: F401
