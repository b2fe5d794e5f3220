"""DDP training as notebooks 5 and 6 write it: join the group, shard the data, train, resume.

The training scripts in notebooks/scripts/ import these functions: a process
started by torchrun or mp.spawn cannot import code from a notebook. The
notebooks write the same code in `#@save` cells (tests/test_saved_cells.py
compares them); the `_check_...` functions validate the arguments first
(d2lpar/_checks.py).
"""
import datetime
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from ._checks import checked, positive_int
from .distributed import BACKENDS

__all__ = ['init_process', 'make_loader', 'train_epoch', 'train_ddp', 'load_snapshot']

# Checks: run by @checked before each function, so that its code stays the algorithm.

def _check_init_process(backend, rank, world_size, local_rank=0, init_method='env://',
                        timeout=None, store=None):
    if backend not in BACKENDS:
        raise ValueError(f'init_process: unknown backend {backend!r}; choose one of {BACKENDS}')
    for name, value in (('rank', rank), ('local_rank', local_rank)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f'init_process: {name} must be an int >= 0, got {value!r}')
    positive_int(world_size, 'init_process: world_size')
    if rank >= world_size:
        raise ValueError(f'init_process: rank {rank} must be below world_size {world_size}')
    if timeout is not None and not (isinstance(timeout, datetime.timedelta)
                                    and timeout.total_seconds() > 0):
        raise ValueError('init_process: timeout must be a positive datetime.timedelta, or None '
                         f"for torch's default (30 min for gloo, 10 for nccl); got {timeout!r}")
    if backend == 'nccl':
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if local_rank >= gpus:
            raise ValueError(f'init_process: nccl needs GPU {local_rank} for local rank '
                             f'{local_rank}, but {gpus} GPU(s) are visible; use gloo or fewer '
                             'processes per node')


def _check_make_loader(dataset, batch_size, num_replicas, rank, seed):
    positive_int(batch_size, 'make_loader: batch_size')
    positive_int(num_replicas, 'make_loader: num_replicas')
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise ValueError(f'make_loader: rank must be an int in 0..{num_replicas - 1}, '
                         f'got {rank!r}')


def _check_train(net, *args, **kwargs):
    if not isinstance(net, nn.Module):
        raise TypeError(f'net must be an nn.Module, got {type(net).__name__}')


def _check_train_ddp(net, sampler, train_iter, optimizer, device, num_epochs, first_epoch=0,
                     on_epoch_end=None):
    _check_train(net)
    if not hasattr(sampler, 'set_epoch'):
        raise TypeError('train_ddp: sampler must have set_epoch (a DistributedSampler), got '
                        f'{type(sampler).__name__}')
    for name, value in (('num_epochs', num_epochs), ('first_epoch', first_epoch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f'train_ddp: {name} must be an int >= 0, got {value!r}')
    if on_epoch_end is not None and not callable(on_epoch_end):
        raise TypeError(f'train_ddp: on_epoch_end must be callable or None, got {on_epoch_end!r}')


def _check_load_snapshot(path, net, optimizer, map_location):
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f'load_snapshot: path must be a file path, got {type(path).__name__}')
    _check_train(net)


# ---------------------------------------------------------------- notebook 5

@checked(_check_init_process)
def init_process(backend, rank, world_size, local_rank=0, init_method='env://', timeout=None,
                 store=None):
    """Bind this process to its device, then join the process group; return the device."""
    if backend == 'nccl':
        device = torch.device('cuda', local_rank)
        torch.cuda.set_device(device)  # first: NCCL and new CUDA tensors then use this GPU
    else:
        device = torch.device('cpu')
    dist.init_process_group(backend, init_method=None if store is not None else init_method,
                            store=store, rank=rank, world_size=world_size, timeout=timeout,
                            device_id=device if device.type == 'cuda' else None)
    return device


@checked(_check_make_loader)
def make_loader(dataset, batch_size, num_replicas, rank, seed):
    """Return (sampler, loader): this rank's shard, shuffled per epoch, in full batches."""
    # Rank r gets positions r, r+W, r+2W, ... of one permutation (the same on every
    # rank), so the W local batches of a step together are one global batch.
    sampler = DistributedSampler(dataset, num_replicas=num_replicas, rank=rank,
                                 shuffle=True, seed=seed)
    batches = BatchSampler(sampler, batch_size, drop_last=True)
    return sampler, DataLoader(dataset, batch_sampler=batches)


@checked(_check_train)
def train_epoch(net, train_iter, optimizer, device):
    """Train one epoch; return the sum of the batch losses and the number of batches."""
    loss_fn = nn.CrossEntropyLoss()
    total, n = torch.zeros((), device=device), 0
    for X, y in train_iter:
        X, y = X.to(device), y.to(device)
        optimizer.zero_grad()
        loss = loss_fn(net(X), y)
        loss.backward()  # under DDP, the gradients are averaged across ranks here
        optimizer.step()  # the same averaged gradient on every replica: the same update
        total += loss.detach()
        n += 1
    return total, n


@checked(_check_train_ddp)
def train_ddp(net, sampler, train_iter, optimizer, device, num_epochs, first_epoch=0,
              on_epoch_end=None):
    """Train from `first_epoch` to `num_epochs`; return {epoch: mean loss over all ranks}."""
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    losses = {}
    for epoch in range(first_epoch, num_epochs):
        sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
        total, n = train_epoch(net, train_iter, optimizer, device)
        if world_size > 1:
            dist.all_reduce(total)  # SUM of every rank's batch losses, for the report only
        losses[epoch] = total.item() / (n * world_size)
        if on_epoch_end is not None:
            on_epoch_end(epoch, losses[epoch])  # e.g. print; rank 0 writes a checkpoint
    return losses


# ---------------------------------------------------------------- notebook 6

@checked(_check_load_snapshot)
def load_snapshot(path, net, optimizer, map_location):
    """Load the snapshot at `path` if there is one; return the epoch to start from."""
    if not os.path.exists(path):
        return 0  # the first start: nothing to resume
    state = torch.load(path, map_location=map_location, weights_only=True)
    net.load_state_dict(state['net'])
    optimizer.load_state_dict(state['optimizer'])
    return state['epoch'] + 1
