"""The helpers a launched script imports: `from d2lpar.distributed import dist_env, emit_result, ...`.

The name scripts and notebooks use; the code is course machinery: where a rank stands
(d2lpar/machinery/ranks.py) and what it hands back (d2lpar/machinery/results.py).
"""

from .machinery.ranks import *  # noqa: F403
from .machinery.ranks import __all__ as _ranks
from .machinery.ranks import BACKENDS, DEFAULT_MASTER_PORT  # noqa: F401
from .machinery.results import *  # noqa: F403
from .machinery.results import __all__ as _results
from .machinery.results import RESULT_PREFIX  # noqa: F401

__all__ = [*_ranks, *_results]
