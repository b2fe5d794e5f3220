"""Data parallelism from scratch: train LeNet on several device slots with a hand-written allreduce."""
import collections
import math

import torch
from torch.nn import functional as F

from ._checks import positive_int
from .data import load_data_fashion_mnist
from .devices import device_slots
from .models import evaluate_accuracy_gpu, init_lenet_params, lenet
from .parallel import allreduce, get_params, split_batch
from .plotting import Animator
from .timing import Timer

__all__ = ['train_batch', 'train', 'TrainResult']

TrainResult = collections.namedtuple('TrainResult',
                                     ['test_acc', 'sec_per_epoch', 'devices', 'device_params'])
TrainResult.__doc__ = 'What `train` returns: final test accuracy, seconds per epoch, slots, replicas.'


def _check_replicas(device_params, devices):
    if isinstance(device_params, torch.Tensor) or not hasattr(device_params, '__len__') \
            or not all(isinstance(ps, (list, tuple)) for ps in device_params):
        raise TypeError('train_batch: device_params must be a list with one list of parameter '
                        'tensors per device, e.g. [d2lpar.get_params(params, d) for d in devices]')
    if len(device_params) != len(devices):
        raise ValueError(f'train_batch: {len(device_params)} replicas for {len(devices)} devices; '
                         'make one replica per device with d2lpar.get_params')
    sizes = {len(ps) for ps in device_params}
    if len(sizes) != 1:
        raise ValueError(f'train_batch: the replicas hold different numbers of tensors {sorted(sizes)}')


def _check_lr(lr, who):
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f'{who}: lr must be a positive number, got {lr!r}')


def train_batch(X, y, device_params, devices, lr, net=lenet):
    """Train on one minibatch split across `devices`: backward per slot, allreduce, same update.

    Each slot sums its examples' losses; after the allreduce every replica holds
    the gradient of the summed loss over the whole batch, and dividing by the
    global batch size gives exactly the single-device mean-loss SGD step, even
    when the slots get unequal shares.
    """
    _check_replicas(device_params, devices)
    _check_lr(lr, 'train_batch')
    X_shards, y_shards = split_batch(X, y, devices)
    try:
        for X_shard, y_shard, params in zip(X_shards, y_shards, device_params):
            F.cross_entropy(net(X_shard, params), y_shard, reduction='sum').backward()
        if len(devices) > 1:  # with one slot the sum is the gradient itself: skip the copies
            for grads in zip(*[[p.grad for p in params] for params in device_params]):
                allreduce(list(grads))
        with torch.no_grad():
            for params in device_params:
                for p in params:
                    p.sub_(p.grad, alpha=lr / X.shape[0])
    finally:
        # Also after an error: gradients left behind would be added to the next step's.
        for params in device_params:
            for p in params:
                p.grad = None


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


def _load(data, batch_size):
    if data is None:
        return load_data_fashion_mnist(batch_size)
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError('train: data must be a pair (train_iter, test_iter), e.g. '
                        'd2lpar.load_data_fashion_mnist(batch_size)')
    loader_batch_size = getattr(data[0], 'batch_size', batch_size)
    if loader_batch_size != batch_size:
        raise ValueError(f'train: batch_size is {batch_size} but train_iter yields batches of '
                         f'{loader_batch_size}; pass the batch size the loader was made with')
    return data


def train(num_gpus, batch_size, lr, num_epochs=10, max_batches=None, params=None, data=None,
          verbose=True):
    """Train LeNet on Fashion-MNIST with data parallelism over `num_gpus` device slots.

    Slots come from `d2lpar.device_slots` (CPU slots without GPUs). `max_batches`
    caps the minibatches per epoch for quick runs; `params` are the initial
    parameters (a fresh `init_lenet_params()` if None); `data` is a pair
    (train_iter, test_iter) to reuse instead of loading Fashion-MNIST again.
    With `verbose`, plots the test accuracy live and prints a final line.
    Returns a `TrainResult`.
    """
    for name, value in (('num_gpus', num_gpus), ('num_epochs', num_epochs),
                        ('max_batches', 1 if max_batches is None else max_batches)):
        positive_int(value, f'train: {name}',
                     ' (or None for whole epochs)' if name == 'max_batches' else '')
    _check_lr(lr, 'train')
    positive_int(batch_size, 'batch_size')
    train_iter, test_iter = _load(data, batch_size)
    examples = getattr(train_iter, 'X', getattr(train_iter, 'dataset', None))
    if examples is not None:  # other loaders still get scatter's error at the first bad batch
        num_examples = len(examples)
        if getattr(train_iter, 'drop_last', False):
            num_examples -= num_examples % batch_size
        _check_splits(num_examples, batch_size, num_gpus, max_batches)
    devices = device_slots(num_gpus, verbose=verbose)
    params = init_lenet_params() if params is None else params
    device_params = [get_params(params, d) for d in devices]
    animator = Animator('epoch', 'test acc', xlim=[1, num_epochs],
                        title=f'{num_gpus} device slot(s)') if verbose else None
    timer = Timer()
    for epoch in range(num_epochs):
        timer.start()
        for i, (X, y) in enumerate(train_iter):
            if max_batches is not None and i == max_batches:
                break
            train_batch(X, y, device_params, devices, lr)
        timer.stop()
        # Every replica is identical, so evaluating one of them is enough.
        test_acc = evaluate_accuracy_gpu(lambda X: lenet(X, device_params[0]),
                                         test_iter, devices[0])
        if animator:
            animator.add(epoch + 1, (test_acc,))
    if verbose:
        print(f'test acc: {test_acc:.2f}, {timer.avg():.2f} sec/epoch on {[str(d) for d in devices]}')
    return TrainResult(test_acc, timer.avg(), devices, device_params)
