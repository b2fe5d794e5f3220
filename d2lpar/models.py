"""The functional LeNet of notebook 8, and d2l's evaluation helpers and residual block.

Notebook 8's lesson under the name notebooks and scripts import: d2lpar/lessons/nb08_lenet_data_parallel.py,
generated from the notebook's `#@save` cells (edit the cell, then `make lib`); its argument checks
are in d2lpar/checks/nb08_lenet_data_parallel.py.
It also re-exports what the notebook uses but does not teach, from d2lpar/helpers/.
d2lpar.parallel and d2lpar.training are this lesson's other old names.
"""

from .checks.nb08_lenet_data_parallel import LENET_SHAPES
from .helpers.d2l import Residual, accuracy, evaluate_accuracy_gpu
from .lessons.nb08_lenet_data_parallel import *  # noqa: F403
from .lessons.nb08_lenet_data_parallel import __all__ as _lesson

__all__ = [*_lesson, 'LENET_SHAPES', 'accuracy', 'evaluate_accuracy_gpu', 'Residual']
