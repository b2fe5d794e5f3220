"""Data parallelism from scratch: train LeNet on several device slots with a hand-written allreduce.

`train_batch` and `train` are the code notebook 8 writes in its `#@save`
cells; their `@checked(...)` decorators validate the arguments first.
"""
import collections
import itertools
import math

import torch
from torch.nn import functional as F

from ._checks import checked, positive_int
from .data import load_data_fashion_mnist
from .devices import device_slots
from .models import LENET_SHAPES, evaluate_accuracy_gpu, init_lenet_params, lenet
from .parallel import allreduce, get_params, split_batch
from .plotting import Animator
from .timing import Timer

__all__ = ['sgd', 'train_batch', 'train', 'TrainResult']

# Fashion-MNIST's training set (d2lpar.data checks that its files hold exactly this many).
NUM_TRAIN_EXAMPLES = 60000

TrainResult = collections.namedtuple('TrainResult',
                                     ['test_acc', 'sec_per_epoch', 'devices', 'device_params'])
TrainResult.__doc__ = 'What `train` returns: final test accuracy, seconds per epoch, slots, replicas.'


def _check_lr(lr, who):
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f'{who}: lr must be a positive number, got {lr!r}')


def _check_sgd(params, lr, batch_size):
    _check_lr(lr, 'sgd')
    positive_int(batch_size, 'sgd: batch_size')
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor) or p.grad is None:
            raise ValueError(f'sgd: params[{i}] has no gradient; run backward on a loss that '
                             'uses every parameter first')


@checked(_check_sgd)
def sgd(params, lr, batch_size):
    """Minibatch stochastic gradient descent."""
    with torch.no_grad():
        for param in params:
            param -= lr * param.grad / batch_size
            param.grad.zero_()


def _check_train_batch(X, y, device_params, devices, lr):
    if isinstance(device_params, torch.Tensor) or not hasattr(device_params, '__len__') \
            or not all(isinstance(ps, (list, tuple)) for ps in device_params):
        raise TypeError('train_batch: device_params must be a list with one list of parameter '
                        'tensors per device, e.g. [d2lpar.get_params(params, d) for d in devices]')
    if not hasattr(devices, '__len__') or len(device_params) != len(devices):
        raise ValueError(f'train_batch: {len(device_params)} replicas for '
                         f'{len(devices) if hasattr(devices, "__len__") else devices!r} devices; '
                         'make one replica per device with d2lpar.get_params')
    sizes = {len(ps) for ps in device_params}
    if len(sizes) != 1:
        raise ValueError(f'train_batch: the replicas hold different numbers of tensors {sorted(sizes)}')
    _check_lr(lr, 'train_batch')
    if isinstance(y, torch.Tensor) and y.numel():
        if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
            raise TypeError(f'train_batch: y must hold integer class labels, got {y.dtype}')
        low, high = int(y.min()), int(y.max())
        if low < 0 or high > 9:
            raise ValueError(f'train_batch: y holds the label {high if high > 9 else low}, but '
                             'LeNet has 10 outputs, for the classes 0..9; check the labels '
                             '(Fashion-MNIST\'s are 0..9)')


@checked(_check_train_batch)
def train_batch(X, y, device_params, devices, lr):
    """Train on one minibatch split across `devices`: backward per device, allreduce, SGD."""
    X_shards, y_shards = split_batch(X, y, devices)
    # Each device sums the losses of its share of the batch
    ls = [F.cross_entropy(lenet(X_shard, params), y_shard, reduction='sum')
          for X_shard, y_shard, params in zip(X_shards, y_shards, device_params)]
    for l in ls:  # backward on each device
        l.backward()
    for i in range(len(device_params[0])):  # sum each gradient over the devices
        allreduce([params[i].grad for params in device_params])
    for params in device_params:  # the same update everywhere: divide by the global batch size
        sgd(params, lr, X.shape[0])


def _check_splits(num_examples, batch_size, k, max_batches):
    """Raise a clear error before training if a minibatch it will use cannot feed every slot."""
    num_batches = math.ceil(num_examples / batch_size)
    if max_batches is not None:
        num_batches = min(num_batches, max_batches)
    if num_batches == 0:
        return
    sizes = {min(batch_size, num_examples - i * batch_size) for i in (0, num_batches - 1)}
    for n in sorted(sizes):
        if n < k or len(torch.chunk(torch.empty(n), k)) < k:
            raise ValueError(f'train: a minibatch of {n} examples cannot be split across {k} '
                             f'device slots without leaving one idle ({num_examples} examples '
                             f'in batches of {batch_size}); choose a batch_size that is a '
                             f'multiple of {k} and leaves a last batch of a multiple of {k}')


def _check_train(num_gpus, batch_size, lr, num_epochs=10, max_batches=None, params=None):
    for name, value in (('num_gpus', num_gpus), ('num_epochs', num_epochs),
                        ('max_batches', 1 if max_batches is None else max_batches)):
        positive_int(value, f'train: {name}',
                     ' (or None for whole epochs)' if name == 'max_batches' else '')
    _check_lr(lr, 'train')
    positive_int(batch_size, 'batch_size')
    if params is not None:
        shapes = ([tuple(p.shape) if isinstance(p, torch.Tensor) else None for p in params]
                  if hasattr(params, '__iter__') and not isinstance(params, torch.Tensor)
                  else type(params).__name__)
        if shapes != list(LENET_SHAPES):
            raise ValueError(f'train: params must be LeNet\'s 8 tensors of shapes '
                             f'{list(LENET_SHAPES)}, got {shapes}; make them with '
                             'init_lenet_params')
    _check_splits(NUM_TRAIN_EXAMPLES, batch_size, num_gpus, max_batches)


@checked(_check_train)
def train(num_gpus, batch_size, lr, num_epochs=10, max_batches=None, params=None):
    """Train LeNet on Fashion-MNIST with data parallelism over `num_gpus` devices."""
    train_iter, test_iter = load_data_fashion_mnist(batch_size)
    devices = device_slots(num_gpus)
    if params is None:
        params = init_lenet_params()
    # Copy the model parameters to every device
    device_params = [get_params(params, d) for d in devices]
    animator = Animator('epoch', 'test acc', xlim=[1, num_epochs],
                        title=f'{num_gpus} device slot(s)')
    timer = Timer()
    for epoch in range(num_epochs):
        timer.start()
        for X, y in itertools.islice(train_iter, max_batches):  # None: the whole epoch
            train_batch(X, y, device_params, devices, lr)
        timer.stop()  # waits for the GPUs, so the time is the work's, not its launch's
        # The replicas are identical: evaluating the one on devices[0] is enough
        test_acc = evaluate_accuracy_gpu(lambda X: lenet(X, device_params[0]),
                                         test_iter, devices[0])
        animator.add(epoch + 1, (test_acc,))
    print(f'{num_epochs} epochs on {[str(d) for d in devices]}: {test_acc:.1%} of the test '
          f'images right; training took {timer.avg():.2f} s per epoch')
    return TrainResult(test_acc, timer.avg(), devices, device_params)
