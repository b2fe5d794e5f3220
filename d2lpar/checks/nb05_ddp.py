"""Argument checks for the code notebook 05 teaches (d2lpar/lessons/nb05_ddp.py).

Each check takes the same arguments as the function it guards and raises a TypeError or
ValueError naming the function and what to do; CHECKS maps the definition's name to it, and
`make lib` writes `@checked(CHECKS[name])` above that definition in the lesson module.
"""

import datetime

import torch
from torch import nn

from d2lpar.checks import positive_int
from d2lpar.machinery.ranks import BACKENDS


def _check_init_process(backend, rank, world_size, local_rank=0, init_method='env://', timeout=None, store=None):
    if backend not in BACKENDS:
        raise ValueError(f'init_process: unknown backend {backend!r}; choose one of {BACKENDS}')
    for name, value in (('rank', rank), ('local_rank', local_rank)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f'init_process: {name} must be an int >= 0, got {value!r}')
    positive_int(world_size, 'init_process: world_size')
    if rank >= world_size:
        raise ValueError(f'init_process: rank {rank} must be below world_size {world_size}')
    if timeout is not None and not (isinstance(timeout, datetime.timedelta) and timeout.total_seconds() > 0):
        raise ValueError(
            'init_process: timeout must be a positive datetime.timedelta, or None '
            f"for torch's default (30 min for gloo, 10 for nccl); got {timeout!r}"
        )
    if backend == 'nccl':
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if local_rank >= gpus:
            raise ValueError(
                f'init_process: nccl needs GPU {local_rank} for local rank '
                f'{local_rank}, but {gpus} GPU(s) are visible; use gloo or fewer '
                'processes per node'
            )


def _check_make_loader(dataset, batch_size, num_replicas, rank, seed):
    positive_int(batch_size, 'make_loader: batch_size')
    positive_int(num_replicas, 'make_loader: num_replicas')
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise ValueError(f'make_loader: rank must be an int in 0..{num_replicas - 1}, got {rank!r}')


def _check_train(net, *args, **kwargs):
    if not isinstance(net, nn.Module):
        raise TypeError(f'net must be an nn.Module, got {type(net).__name__}')


def _check_train_ddp(net, sampler, train_iter, optimizer, device, num_epochs, first_epoch=0, on_epoch_end=None):
    _check_train(net)
    if not hasattr(sampler, 'set_epoch'):
        raise TypeError(f'train_ddp: sampler must have set_epoch (a DistributedSampler), got {type(sampler).__name__}')
    for name, value in (('num_epochs', num_epochs), ('first_epoch', first_epoch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f'train_ddp: {name} must be an int >= 0, got {value!r}')
    if on_epoch_end is not None and not callable(on_epoch_end):
        raise TypeError(f'train_ddp: on_epoch_end must be callable or None, got {on_epoch_end!r}')


CHECKS = {
    'init_process': _check_init_process,
    'make_loader': _check_make_loader,
    'train_epoch': _check_train,
    'train_ddp': _check_train_ddp,
}
