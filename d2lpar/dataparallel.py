"""nn.DataParallel by hand: scatter, replicate, parallel_apply, gather over device slots.

torch.nn.parallel's own functions accept GPUs only; these accept any list of
devices, including several CPU slots, and keep autograd intact, so one backward
on the gathered output fills the gradients of the original module's parameters.
Also: checkpoints with or without the `module.` prefix.
"""
import contextlib
import copy
import io
import threading
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call

from .data import _atomic_write
from .parallel import _check_devices, scatter

__all__ = ['Replica', 'scatter_inputs', 'replicate', 'parallel_apply', 'gather', 'data_parallel',
           'HandDataParallel', 'save_checkpoint', 'load_state_dict_flexible']


def _check_module(net, caller):
    if not isinstance(net, nn.Module):
        raise TypeError(f'{caller}: net must be an nn.Module, got {type(net).__name__}')


def scatter_inputs(inputs, devices, dim=0):
    """Split every tensor in `inputs` along `dim` into one part per device.

    Returns one tuple of arguments per device. Arguments that are not tensors
    are passed to every device unchanged, as nn.DataParallel does.
    """
    devices = _check_devices(devices, 'scatter_inputs')
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, (tuple, list)):
        raise TypeError(f'scatter_inputs: inputs must be a tensor or a tuple of arguments, '
                        f'got {type(inputs).__name__}')
    columns = []
    for i, arg in enumerate(inputs):
        if not isinstance(arg, torch.Tensor):
            columns.append([arg] * len(devices))
            continue
        if not -arg.dim() <= dim < max(arg.dim(), 1):
            raise ValueError(f'scatter_inputs: dim={dim} does not exist in inputs[{i}] of shape '
                             f'{tuple(arg.shape)}; use a dim in [0, {arg.dim()})')
        # d2lpar.scatter splits dim 0: move `dim` to the front and back again (views).
        parts = scatter(arg.movedim(dim, 0), devices)
        columns.append([part.movedim(0, dim) for part in parts])
    return [tuple(column[k] for column in columns) for k in range(len(devices))]


class Replica:
    """One copy of a module for one device: the module's code run on its own tensors."""

    def __init__(self, skeleton, tensors, device):
        self.skeleton, self.tensors, self.device = skeleton, tensors, device

    def __call__(self, *args, **kwargs):
        return functional_call(self.skeleton, self.tensors, args, kwargs)

    def __repr__(self):
        name = type(self.skeleton).__name__
        return f'Replica({name} on {self.device}, {len(self.tensors)} tensors)'


def replicate(net, devices):
    """Return one Replica of `net` per device; gradients flow back to `net`'s parameters.

    Like nn.DataParallel, the module must already be on `devices[0]`, and the
    replica there shares its tensors (so in-place buffer updates, such as
    BatchNorm's running statistics, are kept). Every other replica gets copies
    made by the differentiable `.to(device, copy=True)`: backward sends each
    replica's gradient through that copy and autograd adds them all into
    `param.grad`, which is the "reduce" of DataParallel's replicate.
    """
    _check_module(net, 'replicate')
    devices = _check_devices(devices, 'replicate')
    params, buffers = dict(net.named_parameters()), dict(net.named_buffers())
    for name, t in {**params, **buffers}.items():
        if t.device != devices[0]:
            raise ValueError(f'replicate: the module must live on devices[0] = {devices[0]}, '
                             f'but {name!r} is on {t.device}; call net.to({str(devices[0])!r}) '
                             f'(before or after wrapping, but before the forward pass)')
    # Each replica needs its own module object: functional_call swaps tensors
    # into the module it is given, and threads must not swap into the same one.
    # The memo makes deepcopy copy the module tree but keep the tensors shared.
    memo = {id(t): t for t in [*params.values(), *buffers.values()]}
    grad = torch.is_grad_enabled()
    replicas = []
    for k, device in enumerate(devices):
        skeleton = copy.deepcopy(net, memo=dict(memo))
        if k == 0:
            tensors = {**params, **buffers}
        else:
            tensors = {name: (p if grad else p.detach()).to(device, copy=True)
                       for name, p in params.items()}
            tensors.update({name: b.detach().to(device, copy=True) for name, b in buffers.items()})
        replicas.append(Replica(skeleton, tensors, device))
    return replicas


def _device_context(device):
    return torch.cuda.device(device) if device.type == 'cuda' else contextlib.nullcontext()


def _autocast_state(device_type):
    if device_type not in ('cpu', 'cuda'):
        return None
    try:
        return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    except (AttributeError, TypeError):  # torch < 2.4 has no per-device-type queries
        return None


def _autocast(device_type, state):
    if state is None:
        return contextlib.nullcontext()
    enabled, dtype = state
    return torch.autocast(device_type, dtype=dtype, enabled=enabled)


def parallel_apply(replicas, inputs):
    """Run `replicas[k](*inputs[k])` for all k at once, one thread per replica.

    Grad mode and autocast are per thread in PyTorch, so the caller's settings
    are handed to each worker thread, as torch.nn.parallel.parallel_apply does.
    """
    if len(replicas) != len(inputs):
        raise ValueError(f'parallel_apply: {len(replicas)} replicas but {len(inputs)} inputs; '
                         'pass one tuple of arguments per replica (see scatter_inputs)')
    grad_enabled = torch.is_grad_enabled()
    autocast = {r.device.type: _autocast_state(r.device.type) for r in replicas}
    results, errors = [None] * len(replicas), [None] * len(replicas)

    def worker(k):
        replica, args = replicas[k], inputs[k]
        args = args if isinstance(args, tuple) else (args,)
        try:
            with torch.set_grad_enabled(grad_enabled), _device_context(replica.device), \
                    _autocast(replica.device.type, autocast[replica.device.type]):
                results[k] = replica(*args)
        except Exception as e:  # re-raised in the caller's thread below
            errors[k] = e

    threads = [threading.Thread(target=worker, args=(k,), name=f'replica-{k}')
               for k in range(len(replicas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, e in enumerate(errors):
        if e is not None:
            raise RuntimeError(f'parallel_apply: replica {k} on {replicas[k].device} failed: '
                               f'{type(e).__name__}: {e}') from e
    return results


def gather(outputs, output_device, dim=0):
    """Concatenate the replicas' outputs on `output_device` along `dim`.

    Tuples, lists and dicts of tensors are gathered entry by entry. Scalars
    (say, a loss computed inside the module) become a vector with one entry per
    replica, as with nn.DataParallel: average it with `.mean()`.
    """
    output_device = torch.device(output_device)
    if not outputs:
        raise ValueError('gather: outputs is empty; pass one output per replica')
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        if any(not isinstance(o, torch.Tensor) for o in outputs):
            raise TypeError('gather: replicas returned a mix of tensors and other objects')
        if all(o.dim() == 0 for o in outputs):
            return torch.stack([o.to(output_device) for o in outputs])
        return torch.cat([o.to(output_device) for o in outputs], dim)
    if first is None:
        return None
    if isinstance(first, Mapping):
        return type(first)((key, gather([o[key] for o in outputs], output_device, dim))
                           for key in first)
    if isinstance(first, (tuple, list)):
        return type(first)(gather(list(column), output_device, dim) for column in zip(*outputs))
    raise TypeError(f'gather: cannot gather outputs of type {type(first).__name__}; '
                    'return tensors (or tuples, lists, dicts of tensors) from the module')


def data_parallel(net, inputs, devices, output_device=None, dim=0):
    """Evaluate `net(*inputs)` in parallel over `devices`: scatter, replicate, apply, gather."""
    _check_module(net, 'data_parallel')
    devices = _check_devices(devices, 'data_parallel')
    output_device = devices[0] if output_device is None else torch.device(output_device)
    shards = scatter_inputs(inputs, devices, dim)
    replicas = replicate(net, devices)
    outputs = parallel_apply(replicas, shards)
    return gather(outputs, output_device, dim)


class HandDataParallel(nn.Module):
    """nn.DataParallel's forward pass, written out, for any list of devices (CPU slots too)."""

    def __init__(self, module, devices, output_device=None, dim=0):
        super().__init__()
        _check_module(module, 'HandDataParallel')
        self.module = module  # the attribute name gives state_dict keys their `module.` prefix
        self.devices = _check_devices(devices, 'HandDataParallel')
        self.output_device = (self.devices[0] if output_device is None
                              else torch.device(output_device))
        self.dim = dim

    def forward(self, *inputs):
        return data_parallel(self.module, inputs, self.devices, self.output_device, self.dim)


def save_checkpoint(state_dict, path):
    """Save `state_dict` to `path` atomically: readers never see half a file."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f'save_checkpoint: expected a state_dict (a mapping), got '
                        f'{type(state_dict).__name__}; save net.state_dict(), not the net')
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f'save_checkpoint: the folder {path.parent} does not exist; '
                         'create it first')
    buffer = io.BytesIO()
    torch.save(dict(state_dict), buffer)
    _atomic_write(path, buffer.getvalue())
    return path


def _listing(title, items, limit=8):
    more = f' ... and {len(items) - limit} more' if len(items) > limit else ''
    return f'  {title} ({len(items)}): ' + ', '.join(items[:limit]) + more


def load_state_dict_flexible(net, state_dict, prefix='module.'):
    """Load `state_dict` into `net`, adding or stripping a leading `prefix` as needed.

    A checkpoint saved from a wrapped model (nn.DataParallel, DDP) has keys
    `module.xxx`; an unwrapped model expects `xxx`, and the reverse. Only a
    leading prefix is touched, so a layer named `submodule.` keeps its name.
    Anything that still does not match raises a ValueError that lists the
    missing and unexpected keys and the shape mismatches; nothing is loaded then.
    Returns the state dict as it was loaded.
    """
    _check_module(net, 'load_state_dict_flexible')
    if not isinstance(state_dict, Mapping):
        raise TypeError(f'load_state_dict_flexible: expected a state_dict (a mapping), got '
                        f'{type(state_dict).__name__}')
    expected = net.state_dict()

    def prefixed(keys):
        return bool(keys) and all(k.startswith(prefix) for k in keys)

    if prefixed(list(expected)) and not prefixed(list(state_dict)):
        state_dict = {prefix + k: v for k, v in state_dict.items()}
    elif prefixed(list(state_dict)) and not prefixed(list(expected)):
        state_dict = {k[len(prefix):]: v for k, v in state_dict.items()}
    else:
        state_dict = dict(state_dict)
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mismatched = [f'{k} {tuple(state_dict[k].shape)} != {tuple(v.shape)}'
                  for k, v in expected.items() if k in state_dict
                  and isinstance(v, torch.Tensor) and isinstance(state_dict[k], torch.Tensor)
                  and state_dict[k].shape != v.shape]
    if missing or unexpected or mismatched:
        lines = [f'load_state_dict_flexible: the checkpoint does not fit this '
                 f'{type(net).__name__}; nothing was loaded:']
        if missing:
            lines.append(_listing('missing keys', missing))
        if unexpected:
            lines.append(_listing('unexpected keys', unexpected))
        if mismatched:
            lines.append(_listing('shape mismatches (checkpoint != model)', mismatched))
        raise ValueError('\n'.join(lines))
    net.load_state_dict(state_dict)
    return state_dict
