"""Data parallelism from scratch: train LeNet on several device slots with a hand-written allreduce.

The name notebooks and scripts import. What the notebook teaches is generated into
d2lpar/lessons/nb08_lenet_data_parallel.py (edit the notebook's `#@save` cell, then `make lib`), its
argument checks live in d2lpar/checks/; what follows are helpers the notebook uses but does not
teach.
"""
import collections

import torch

from .checks import checked
from .checks.nb08_lenet_data_parallel import NUM_TRAIN_EXAMPLES, _check_sgd
from .lessons.nb08_lenet_data_parallel import *  # noqa: F403
from .lessons.nb08_lenet_data_parallel import __all__ as _nb08

TrainResult = collections.namedtuple('TrainResult',
                                     ['test_acc', 'sec_per_epoch', 'devices', 'device_params'])


TrainResult.__doc__ = 'What `train` returns: final test accuracy, seconds per epoch, slots, replicas.'


@checked(_check_sgd)
def sgd(params, lr, batch_size):
    """Move each parameter against its gradient over the batch, then clear the gradient.

    The gradients hold sums over `batch_size` examples: dividing by it makes each
    step follow the mean loss, whatever the batch size.
    """
    with torch.no_grad():
        for p in params:
            step = lr * p.grad / batch_size
            p.sub_(step)
            p.grad.zero_()  # the next backward adds into a clean gradient

__all__ = [*_nb08, 'NUM_TRAIN_EXAMPLES', 'TrainResult', 'sgd']
