"""memory_footprint: the bytes a network needs to train on a batch, by kind (notebook 4)."""

import torch
from torch import nn

from ..tensor_parallel import saved_bytes  # notebook 12's counter of what autograd saves

__all__ = ['memory_footprint']


def memory_footprint(net, X, optimizer_states=2):
    """Return the bytes `net` needs to train on batch `X`, by kind.

    Parameters and gradients are counted from the parameters; `optimizer_states`
    tensors per parameter (Adam keeps 2, SGD with momentum 1, plain SGD 0);
    activations are the tensors autograd saves for backward during a real
    forward pass on `X` (each storage once, parameters excluded).
    """
    if not isinstance(net, nn.Module):
        raise TypeError(f'memory_footprint: net must be an nn.Module, got {type(net).__name__}')
    if not isinstance(X, torch.Tensor):
        raise TypeError(f'memory_footprint: X must be a batch of inputs for net (a tensor), got {type(X).__name__}')
    if not isinstance(optimizer_states, int) or isinstance(optimizer_states, bool) or optimizer_states < 0:
        raise ValueError(f'memory_footprint: optimizer_states must be an int >= 0, got {optimizer_states!r}')
    params = list(net.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    with torch.enable_grad():
        try:  # each storage autograd saves, counted once; the parameters left out
            _, activations = saved_bytes(net, X, exclude=params)
        except RuntimeError as e:
            raise ValueError(
                f'memory_footprint: net cannot run on X of shape {tuple(X.shape)} '
                f'({str(e).splitlines()[0]}); pass a batch that net accepts'
            ) from e
    return {
        'parameters': param_bytes,
        'gradients': param_bytes,
        'optimizer': optimizer_states * param_bytes,
        'activations': activations,
    }
