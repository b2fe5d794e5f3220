"""Argument checks for the code notebook 08 teaches (d2lpar/lessons/nb08_lenet_data_parallel.py).

Each check takes the same arguments as the function it guards and raises a TypeError or
ValueError naming the function and what to do; CHECKS maps the definition's name to it, and
`make lib` writes `@checked(CHECKS[name])` above that definition in the lesson module.
"""

import math

import torch

from d2lpar.checks import existing_device, positive_int

# What init_lenet_params returns, for the checks (tests/test_models.py compares the two).
LENET_SHAPES = ((20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,), (800, 128), (128,), (128, 10), (10,))


def _check_init_lenet_params(scale=0.1, seed=None):
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f'init_lenet_params: scale must be a positive number, got {scale!r}')
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise TypeError(f'init_lenet_params: seed must be an int or None, got {seed!r}')
    if seed is not None and not -(2**63) <= seed < 2**64:  # what torch.manual_seed takes
        raise ValueError(f'init_lenet_params: seed must be in [-2**63, 2**64), got {seed!r}')


def _check_lenet(X, params):
    if isinstance(params, torch.Tensor) or not hasattr(params, '__len__') or len(params) != len(LENET_SHAPES):
        got = (
            len(params)
            if hasattr(params, '__len__') and not isinstance(params, torch.Tensor)
            else type(params).__name__
        )
        raise ValueError(f'lenet expects {len(LENET_SHAPES)} parameter tensors (see init_lenet_params), got {got}')
    for i, (p, shape) in enumerate(zip(params, LENET_SHAPES)):
        if not isinstance(p, torch.Tensor) or tuple(p.shape) != shape:
            got = tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
            raise ValueError(
                f'lenet: params[{i}] must be a tensor of shape {shape}, got {got}; '
                'make the parameters with init_lenet_params'
            )
    if not isinstance(X, torch.Tensor):
        raise TypeError(f'lenet: X must be a tensor, got {type(X).__name__}')
    if X.dim() != 4 or tuple(X.shape[1:]) != (1, 28, 28):
        if X.dim() == 3 and tuple(X.shape[1:]) == (28, 28):
            hint = 'add the channel dimension with X.unsqueeze(1)'
        elif X.dim() == 4 and X.shape[1] == 1:
            hint = 'load Fashion-MNIST at its own size, without resize (d2lpar.load_data_fashion_mnist(batch_size))'
        else:
            hint = 'reshape the batch to one-channel 28x28 images'
        raise ValueError(
            f'lenet expects X of shape N x 1 x 28 x 28 (a batch of one-channel '
            f'28x28 images), got {tuple(X.shape)}; {hint}'
        )
    if X.device != params[0].device or X.dtype != params[0].dtype:
        raise ValueError(
            f'lenet: X is {X.dtype} on {X.device} but the parameters are '
            f'{params[0].dtype} on {params[0].device}; move the batch with '
            'X.to(params[0].device, params[0].dtype)'
        )


def _check_evaluate_accuracy_gpu(net, data_iter, device=None):
    if not callable(net):
        raise TypeError(f'evaluate_accuracy_gpu: net must be a model or a function of X, got {type(net).__name__}')
    if device is not None:
        return (net, data_iter, existing_device(device, 'evaluate_accuracy_gpu')), {}


def _check_residual(num_channels, use_1x1conv=False, strides=1):
    if isinstance(num_channels, bool) or not isinstance(num_channels, int) or num_channels < 1:
        raise ValueError(f'Residual: num_channels must be a positive int, got {num_channels!r}')
    if not isinstance(use_1x1conv, bool):
        raise TypeError(
            f'Residual: use_1x1conv must be True or False, got {use_1x1conv!r}. '
            'This is the signature of d2l 1.0, Residual(num_channels, '
            'use_1x1conv=False, strides=1): older d2l took the input channels '
            'first, which lazy layers now infer'
        )
    if isinstance(strides, bool) or not isinstance(strides, int) or strides < 1:
        raise ValueError(f'Residual: strides must be a positive int, got {strides!r}')


def _check_devices(devices, caller):
    if isinstance(devices, (str, torch.device, torch.Tensor)) or not hasattr(devices, '__len__'):
        raise TypeError(
            f'{caller}: devices must be a list of devices such as '
            f"[torch.device('cpu'), torch.device('cpu')], got {devices!r}"
        )
    if len(devices) == 0:
        raise ValueError(f'{caller}: devices is an empty list; pass at least one device, e.g. d2lpar.device_slots(2)')
    return [existing_device(d, caller, f'devices[{i}]') for i, d in enumerate(devices)]


def _check_get_params(params, device):
    if isinstance(params, torch.Tensor) or not hasattr(params, '__iter__'):
        raise TypeError(f'get_params: params must be a list of tensors, got {type(params).__name__}')
    params = list(params)
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f'get_params: params[{i}] is a {type(p).__name__}, not a tensor')
    return (params, existing_device(device, 'get_params')), {}


def _check_scatter(data, devices):
    devices = _check_devices(devices, 'scatter')
    if not isinstance(data, torch.Tensor):
        raise TypeError(f'scatter: data must be a tensor, got {type(data).__name__}')
    if data.dim() == 0:
        raise ValueError('scatter: cannot split a 0-dim tensor; give it a batch dimension first')
    n, k = data.shape[0], len(devices)
    if n < k:
        raise ValueError(
            f'scatter: {n} rows cannot be split across {k} devices; use a batch of at least {k} rows or fewer devices'
        )
    parts = len(torch.chunk(torch.empty(n, 0), k))
    if parts < k:
        # torch.chunk makes parts of ceil(n/k) rows, which can run out early
        # (5 rows, 4 devices -> 2+2+1). nn.DataParallel would then quietly use
        # fewer devices; saying so is better than changing the experiment.
        raise ValueError(
            f'scatter: torch.chunk splits {n} rows into only {parts} '
            f'parts for {k} devices, leaving a device idle; use a batch '
            f'size that is a multiple of {k}'
        )
    return (data, devices), {}


def _check_split_batch(X, y, devices):
    if not isinstance(X, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError(f'split_batch: X and y must be tensors, got {type(X).__name__} and {type(y).__name__}')
    if X.dim() == 0 or y.dim() == 0 or X.shape[0] != y.shape[0]:
        raise ValueError(
            f'split_batch: X and y need the same number of rows, got shapes {tuple(X.shape)} and {tuple(y.shape)}'
        )


def _memory(t):
    """Return what identifies the memory a tensor lives in: its device and storage."""
    return (t.device, t.untyped_storage().data_ptr())


def _check_allreduce(data):
    if isinstance(data, torch.Tensor) or not hasattr(data, '__len__'):
        raise TypeError(f'allreduce: data must be a list of tensors, got {type(data).__name__}')
    if len(data) == 0:
        raise ValueError('allreduce: data is empty; pass one tensor per device')
    for i, t in enumerate(data):
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f'allreduce: data[{i}] is a {type(t).__name__}, not a tensor '
                '(a gradient that is None means backward has not run)'
            )
        if t.shape != data[0].shape or t.dtype != data[0].dtype:
            raise ValueError(
                f'allreduce: data[{i}] has shape {tuple(t.shape)} and dtype '
                f'{t.dtype}, data[0] has {tuple(data[0].shape)} and '
                f'{data[0].dtype}; every entry must match'
            )
    seen = {}
    for i, t in enumerate(data):
        key = _memory(t)
        if t.numel() and key in seen:
            raise ValueError(
                f'allreduce: data[{seen[key]}] and data[{i}] share memory, so '
                'the sum would count it twice; replicas must be independent '
                'copies (see d2lpar.get_params)'
            )
        seen[key] = i


# Fashion-MNIST's training set (d2lpar.data checks that its files hold exactly this many).
NUM_TRAIN_EXAMPLES = 60000


def _check_lr(lr, who):
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f'{who}: lr must be a positive number, got {lr!r}')


def _check_sgd(params, lr, batch_size):
    _check_lr(lr, 'sgd')
    positive_int(batch_size, 'sgd: batch_size')
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor) or p.grad is None:
            raise ValueError(
                f'sgd: params[{i}] has no gradient; run backward on a loss that uses every parameter first'
            )


def _check_train_batch(X, y, device_params, devices, lr):
    if (
        isinstance(device_params, torch.Tensor)
        or not hasattr(device_params, '__len__')
        or not all(isinstance(ps, (list, tuple)) for ps in device_params)
    ):
        raise TypeError(
            'train_batch: device_params must be a list with one list of parameter '
            'tensors per device, e.g. [d2lpar.get_params(params, d) for d in devices]'
        )
    if not hasattr(devices, '__len__') or len(device_params) != len(devices):
        raise ValueError(
            f'train_batch: {len(device_params)} replicas for '
            f'{len(devices) if hasattr(devices, "__len__") else devices!r} devices; '
            'make one replica per device with d2lpar.get_params'
        )
    sizes = {len(ps) for ps in device_params}
    if len(sizes) != 1:
        raise ValueError(f'train_batch: the replicas hold different numbers of tensors {sorted(sizes)}')
    _check_lr(lr, 'train_batch')
    if isinstance(y, torch.Tensor) and y.numel():
        if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
            raise TypeError(f'train_batch: y must hold integer class labels, got {y.dtype}')
        low, high = int(y.min()), int(y.max())
        if low < 0 or high > 9:
            raise ValueError(
                f'train_batch: y holds the label {high if high > 9 else low}, but '
                'LeNet has 10 outputs, for the classes 0..9; check the labels '
                '(Fashion-MNIST\'s are 0..9)'
            )


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
            raise ValueError(
                f'train: a minibatch of {n} examples cannot be split across {k} '
                f'device slots without leaving one idle ({num_examples} examples '
                f'in batches of {batch_size}); choose a batch_size that is a '
                f'multiple of {k} and leaves a last batch of a multiple of {k}'
            )


def _check_train(num_gpus, batch_size, lr, num_epochs=10, max_batches=None, params=None):
    for name, value in (
        ('num_gpus', num_gpus),
        ('num_epochs', num_epochs),
        ('max_batches', 1 if max_batches is None else max_batches),
    ):
        positive_int(value, f'train: {name}', ' (or None for whole epochs)' if name == 'max_batches' else '')
    _check_lr(lr, 'train')
    positive_int(batch_size, 'batch_size')
    if params is not None:
        shapes = (
            [tuple(p.shape) if isinstance(p, torch.Tensor) else None for p in params]
            if hasattr(params, '__iter__') and not isinstance(params, torch.Tensor)
            else type(params).__name__
        )
        if shapes != list(LENET_SHAPES):
            raise ValueError(
                f'train: params must be LeNet\'s 8 tensors of shapes '
                f'{list(LENET_SHAPES)}, got {shapes}; make them with '
                'init_lenet_params'
            )
    _check_splits(NUM_TRAIN_EXAMPLES, batch_size, num_gpus, max_batches)


CHECKS = {
    'init_lenet_params': _check_init_lenet_params,
    'lenet': _check_lenet,
    'get_params': _check_get_params,
    'scatter': _check_scatter,
    'split_batch': _check_split_batch,
    'allreduce': _check_allreduce,
    'train_batch': _check_train_batch,
    'train': _check_train,
}
