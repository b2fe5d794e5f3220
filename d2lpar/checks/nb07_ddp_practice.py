"""Argument checks for the code notebook 07 teaches (d2lpar/lessons/nb07_ddp_practice.py).

Each check takes the same arguments as the function it guards and raises a TypeError or
ValueError naming the function and what to do; CHECKS maps the definition's name to it, and
`make lib` writes `@checked(CHECKS[name])` above that definition in the lesson module.
"""

import torch

from d2lpar.checks import positive_int, process_group_size


def _check_accumulate_step(net, optimizer, micro_batches, loss_fn):
    if not hasattr(net, 'no_sync'):
        raise TypeError(
            f'accumulate_step: net must be a DistributedDataParallel model (it has '
            f'no_sync()), got {type(net).__name__}; wrap it first: net = DDP(net)'
        )
    if not callable(loss_fn):
        raise TypeError(f'accumulate_step: loss_fn must be callable, got {loss_fn!r}')
    try:
        micro_batches = list(micro_batches)
    except TypeError:
        raise TypeError(
            f'accumulate_step: micro_batches must be a list of (X, y) pairs, got {type(micro_batches).__name__}'
        ) from None
    if not micro_batches:
        raise ValueError('accumulate_step: micro_batches is empty; pass at least one (X, y) pair')
    for batch in micro_batches:
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise TypeError(f'accumulate_step: each micro-batch must be an (X, y) pair, got {type(batch).__name__}')
    sizes = [len(y) for _, y in micro_batches]
    if len(set(sizes)) > 1:
        # Dividing each mean loss by k gives the mean over all samples only for equal sizes.
        raise ValueError(
            f'accumulate_step: micro-batches must have equal sizes, got {sizes}; '
            'dividing each loss by k would weight their samples unequally. Split '
            'the batch evenly, or weight each loss by its share of the samples '
            '(exercise 5 of notebook 7)'
        )
    return (net, optimizer, micro_batches, loss_fn), {}


def _check_amp_step(net, optimizer, X, y, loss_fn, scaler=None):
    if not isinstance(X, torch.Tensor):
        raise TypeError(f'amp_step: X must be a tensor, got {type(X).__name__}')
    if X.device.type == 'cuda' and scaler is None:
        raise ValueError(
            'amp_step: float16 on a GPU needs a GradScaler (small gradients '
            "underflow to 0 otherwise): pass scaler=torch.amp.GradScaler('cuda')"
        )
    if not callable(loss_fn):
        raise TypeError(f'amp_step: loss_fn must be callable, got {loss_fn!r}')


def _check_train_uneven(net, optimizer, batches, loss_fn):
    if not hasattr(net, 'join'):
        raise TypeError(
            f'train_uneven: net must be a DistributedDataParallel model (it has join()), got {type(net).__name__}'
        )
    if not callable(loss_fn):
        raise TypeError(f'train_uneven: loss_fn must be callable, got {loss_fn!r}')


def _check_evaluate_distributed(net, dataset, batch_size):
    process_group_size('evaluate_distributed')
    if not isinstance(net, torch.nn.Module):
        raise TypeError(
            f'evaluate_distributed: net must be an nn.Module (pass net.module for a '
            f'DDP model), got {type(net).__name__}'
        )
    positive_int(batch_size, 'evaluate_distributed: batch_size')
    if not hasattr(dataset, '__len__'):
        raise TypeError(
            f'evaluate_distributed: the dataset must have a length (a map-style '
            f'Dataset such as TensorDataset), got {type(dataset).__name__}; '
            'DistributedSampler shards by index, which an iterable dataset has not'
        )
    if len(dataset) == 0:
        raise ValueError('evaluate_distributed: the dataset is empty; there is nothing to count')


def _check_loader_workers(nproc_per_node, cores=None):
    positive_int(nproc_per_node, 'loader_workers: nproc_per_node')
    if cores is not None:
        positive_int(cores, 'loader_workers: cores')


CHECKS = {
    'accumulate_step': _check_accumulate_step,
    'amp_step': _check_amp_step,
    'train_uneven': _check_train_uneven,
    'evaluate_distributed': _check_evaluate_distributed,
    'loader_workers': _check_loader_workers,
}
