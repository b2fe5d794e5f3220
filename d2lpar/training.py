"""Data parallelism from scratch: train LeNet on several device slots with a hand-written allreduce.

Notebook 8's lesson under the name notebooks and scripts import: d2lpar/lessons/nb08_lenet_data_parallel.py,
generated from the notebook's `#@save` cells (edit the cell, then `make lib`); its argument checks
are in d2lpar/checks/nb08_lenet_data_parallel.py.
It also re-exports what the notebook uses but does not teach, from d2lpar/helpers/.
d2lpar.models and d2lpar.parallel are this lesson's other old names.
"""

from .checks.nb08_lenet_data_parallel import NUM_TRAIN_EXAMPLES
from .helpers.d2l import sgd
from .helpers.train_result import TrainResult
from .lessons.nb08_lenet_data_parallel import *  # noqa: F403
from .lessons.nb08_lenet_data_parallel import __all__ as _lesson

__all__ = [*_lesson, 'NUM_TRAIN_EXAMPLES', 'TrainResult', 'sgd']
