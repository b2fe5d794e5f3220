"""Parallel primitives for single-process data parallelism across device slots (notebook 8).

The functions are the code notebook 8 writes in its `#@save` cells; their
`@checked(...)` decorators validate the arguments first.
"""
import torch

from ._checks import checked, existing_device

__all__ = ['get_params', 'scatter', 'split_batch', 'allreduce']


def _check_devices(devices, caller):
    if isinstance(devices, (str, torch.device, torch.Tensor)) or not hasattr(devices, '__len__'):
        raise TypeError(f'{caller}: devices must be a list of devices such as '
                        f"[torch.device('cpu'), torch.device('cpu')], got {devices!r}")
    if len(devices) == 0:
        raise ValueError(f'{caller}: devices is an empty list; pass at least one '
                         f'device, e.g. d2lpar.device_slots(2)')
    return [existing_device(d, caller, f'devices[{i}]') for i, d in enumerate(devices)]


def _check_get_params(params, device):
    if isinstance(params, torch.Tensor) or not hasattr(params, '__iter__'):
        raise TypeError(f'get_params: params must be a list of tensors, got {type(params).__name__}')
    params = list(params)
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f'get_params: params[{i}] is a {type(p).__name__}, not a tensor')
    return (params, existing_device(device, 'get_params')), {}


@checked(_check_get_params)
def get_params(params, device):
    """Copy the parameters to `device` as new leaf tensors that require gradients."""
    # copy=True: p.to(device) returns p itself when it is already on device,
    # and two replicas sharing one tensor would add up each other's gradients.
    new_params = [p.detach().to(device, copy=True) for p in params]
    for p in new_params:
        p.requires_grad_()
    return new_params


def _check_scatter(data, devices):
    devices = _check_devices(devices, 'scatter')
    if not isinstance(data, torch.Tensor):
        raise TypeError(f'scatter: data must be a tensor, got {type(data).__name__}')
    if data.dim() == 0:
        raise ValueError('scatter: cannot split a 0-dim tensor; give it a batch dimension first')
    n, k = data.shape[0], len(devices)
    if n < k:
        raise ValueError(f'scatter: {n} rows cannot be split across {k} devices; '
                         f'use a batch of at least {k} rows or fewer devices')
    parts = len(torch.chunk(torch.empty(n, 0), k))
    if parts < k:
        # torch.chunk makes parts of ceil(n/k) rows, which can run out early
        # (5 rows, 4 devices -> 2+2+1). nn.DataParallel would then quietly use
        # fewer devices; saying so is better than changing the experiment.
        raise ValueError(f'scatter: torch.chunk splits {n} rows into only {parts} '
                         f'parts for {k} devices, leaving a device idle; use a batch '
                         f'size that is a multiple of {k}')
    return (data, devices), {}


@checked(_check_scatter)
def scatter(data, devices):
    """Split `data` along dim 0 into one part per device, as torch.chunk does."""
    parts = torch.chunk(data, len(devices))
    return [part.to(device) for part, device in zip(parts, devices)]


def _check_split_batch(X, y, devices):
    if not isinstance(X, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError('split_batch: X and y must be tensors, got '
                        f'{type(X).__name__} and {type(y).__name__}')
    if X.dim() == 0 or y.dim() == 0 or X.shape[0] != y.shape[0]:
        raise ValueError(f'split_batch: X and y need the same number of rows, got shapes '
                         f'{tuple(X.shape)} and {tuple(y.shape)}')


@checked(_check_split_batch)
def split_batch(X, y, devices):
    """Cut examples `X` and labels `y` at the same rows: one (X, y) part per device."""
    return scatter(X, devices), scatter(y, devices)


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
            raise TypeError(f'allreduce: data[{i}] is a {type(t).__name__}, not a tensor '
                            '(a gradient that is None means backward has not run)')
        if t.shape != data[0].shape or t.dtype != data[0].dtype:
            raise ValueError(f'allreduce: data[{i}] has shape {tuple(t.shape)} and dtype '
                             f'{t.dtype}, data[0] has {tuple(data[0].shape)} and '
                             f'{data[0].dtype}; every entry must match')
    seen = {}
    for i, t in enumerate(data):
        key = _memory(t)
        if t.numel() and key in seen:
            raise ValueError(f'allreduce: data[{seen[key]}] and data[{i}] share memory, so '
                             'the sum would count it twice; replicas must be independent '
                             'copies (see d2lpar.get_params)')
        seen[key] = i


@checked(_check_allreduce)
def allreduce(data):
    """Sum the tensors in `data` in place, so that every one holds the total."""
    with torch.no_grad():
        for i in range(1, len(data)):  # add everything up in data[0] ...
            data[0].add_(data[i].to(data[0].device))
        for i in range(1, len(data)):  # ... and copy the total back to every device
            data[i].copy_(data[0])
