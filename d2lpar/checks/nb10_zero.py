"""Argument checks for the code notebook 10 teaches (d2lpar/lessons/nb10_zero.py).

Each check takes the same arguments as the function it guards and raises a TypeError or
ValueError naming the function and what to do; CHECKS maps the definition's name to it, and
`make lib` writes `@checked(CHECKS[name])` above that definition in the lesson module.
"""

import torch
from torch import nn

from d2lpar.checks import finite_number, process_group_size

STAGES = ('ddp', 'zero1', 'zero2', 'zero3')


def _check_model_state_bytes(stage, num_params, n, bytes_param=4, bytes_grad=4, bytes_state=8):
    if stage not in STAGES:
        raise ValueError(f"model_state_bytes: stage must be one of {STAGES}, got {stage!r}")
    for name, value in (('num_params', num_params), ('n', n)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f'model_state_bytes: {name} must be a positive int, got {value!r}')
    for name, value in (('bytes_param', bytes_param), ('bytes_grad', bytes_grad), ('bytes_state', bytes_state)):
        finite_number(value, name, 'model_state_bytes')


def _check_zero_bytes_sent(stage, num_params, n, bytes_per_value=4):
    _check_model_state_bytes(stage, num_params, n)
    finite_number(bytes_per_value, 'bytes_per_value', 'zero_bytes_sent', positive=True)


def _check_pad_to_shards(tensor, n):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f'pad_to_shards: tensor must be a tensor, got {type(tensor).__name__}')
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f'pad_to_shards: n must be a positive int (the world size), got {n!r}')


def _check_zero(self, params, optimizer_class, *args, **defaults):
    name = type(self).__name__
    process_group_size(name)
    if isinstance(params, nn.Module):
        raise TypeError(f'{name}: pass the parameters (net.parameters()), not the module')
    params = list(params)
    if not params or not all(isinstance(p, torch.Tensor) for p in params):
        raise TypeError(f'{name}: params must be a non-empty iterable of tensors, such as net.parameters()')
    if not any(p.requires_grad for p in params):
        raise ValueError(f'{name}: no parameter requires grad; there is nothing to train')
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
        raise TypeError(
            f'{name}: optimizer_class must be a torch optimizer class such as '
            f'torch.optim.AdamW (the class, not an instance), got {optimizer_class!r}'
        )
    return (self, params, optimizer_class, *args), defaults


def _check_zero3(self, net, optimizer_class, *args, **defaults):
    if not isinstance(net, nn.Module):
        raise TypeError(
            f'Zero3: net must be an nn.Module (each layer gathers its parameters '
            f'just in time), got {type(net).__name__}'
        )
    _check_zero(self, list(net.parameters()), optimizer_class)


def _check_step(self):
    missing = [p for p in self.params if p.grad is None and id(p) not in self.reduced]
    if missing:
        raise RuntimeError(
            f'{type(self).__name__}.step: {len(missing)} parameter(s) have no '
            'gradient; run backward first (every trained parameter must take '
            'part in the loss, or set requires_grad=False before wrapping)'
        )


CHECKS = {
    'model_state_bytes': _check_model_state_bytes,
    'zero_bytes_sent': _check_zero_bytes_sent,
    'pad_to_shards': _check_pad_to_shards,
    'Zero1.__init__': _check_zero,
    'Zero1.step': _check_step,
    'Zero3.__init__': _check_zero3,
}
