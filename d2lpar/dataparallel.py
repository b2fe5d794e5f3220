"""nn.DataParallel by hand: scatter, replicate, parallel_apply, gather over device slots.

torch.nn.parallel's own functions accept GPUs only; these accept any list of
devices, including several CPU slots, and keep autograd intact, so one backward
on the gathered output fills the gradients of the original module's parameters.
Also: checkpoints with or without the `module.` prefix.

Notebook 3 writes every public function here in its `#@save` cells
(tests/test_saved_cells.py checks that the two agree); the argument checks
live in the `_check_...` functions, run first by `@checked`.
"""
import contextlib
import copy
import os
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call

from ._checks import checked, existing_device
from .parallel import _check_devices

__all__ = ['Replica', 'scatter_inputs', 'replicate', 'parallel_apply', 'gather', 'data_parallel',
           'HandDataParallel', 'save_checkpoint', 'load_state_dict_flexible']


# ---------------------------------------------------------------- argument checks

def _check_module(net, caller):
    if not isinstance(net, nn.Module):
        raise TypeError(f'{caller}: net must be an nn.Module, got {type(net).__name__}')


def _indexed(device):
    """Return `device` as a torch.device; an unindexed 'cuda' becomes the current CUDA device.

    torch.device('cuda').index is None, while every CUDA tensor's `.device` has
    an index, so comparing the two fails although `.to('cuda')` puts tensors
    on the current device. nn.DataParallel resolves the index the same way
    (torch/_utils.py `_get_device_index(device, optional=True)`).
    """
    device = existing_device(device, 'd2lpar.dataparallel', 'device')
    if device.type == 'cuda' and device.index is None:
        return torch.device('cuda', torch.cuda.current_device())
    return device


def _normalize_devices(devices, caller):
    """Return `devices` as a list of indexed torch.device objects, or raise a clear error."""
    return [_indexed(d) for d in _check_devices(devices, caller)]


def _as_arguments(inputs, caller):
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if not isinstance(inputs, (tuple, list)):
        raise TypeError(f'{caller}: inputs must be a tensor or a tuple of arguments, '
                        f'got {type(inputs).__name__}')
    return tuple(inputs)


def _check_scatter_inputs(inputs, devices, dim=0):
    inputs = _as_arguments(inputs, 'scatter_inputs')
    devices = _normalize_devices(devices, 'scatter_inputs')
    k = len(devices)
    if not any(isinstance(arg, torch.Tensor) for arg in inputs):
        raise ValueError('scatter_inputs: inputs hold no tensor to split; pass the batch as a '
                         'tensor (other arguments go to every replica unchanged)')
    for i, arg in enumerate(inputs):
        if not isinstance(arg, torch.Tensor):
            continue
        if arg.dim() == 0:
            raise ValueError(f'scatter_inputs: inputs[{i}] is a 0-dim tensor and cannot be '
                             'split; give it a batch dimension first')
        if not -arg.dim() <= dim < arg.dim():
            raise ValueError(f'scatter_inputs: dim={dim} does not exist in inputs[{i}] of shape '
                             f'{tuple(arg.shape)}; use a dim in [0, {arg.dim()})')
        n = arg.shape[dim]
        if n < k:
            raise ValueError(f'scatter_inputs: {n} rows of inputs[{i}] cannot be split across '
                             f'{k} devices; use a batch of at least {k} rows or fewer devices')
        parts = -(-n // k)  # torch.chunk makes parts of ceil(n/k) rows ...
        if -(-n // parts) < k:  # ... which can run out early: 5 rows, 4 devices -> 2+2+1
            # nn.DataParallel would quietly use fewer devices; saying so is better than
            # changing the experiment.
            raise ValueError(f'scatter_inputs: torch.chunk splits {n} rows of inputs[{i}] into '
                             f'only {-(-n // parts)} parts for {k} devices, leaving a device '
                             f'idle; use a batch size that is a multiple of {k}')
    return (inputs, devices, dim), {}


def _check_replicate(net, devices):
    _check_module(net, 'replicate')
    devices = _normalize_devices(devices, 'replicate')
    tensors = {**dict(net.named_parameters()), **dict(net.named_buffers())}
    for name, t in tensors.items():
        if t.device != devices[0]:
            raise ValueError(f'replicate: the module must live on devices[0] = {devices[0]}, '
                             f'but {name!r} is on {t.device}; call net.to({str(devices[0])!r}) '
                             f'(before or after wrapping, but before the forward pass)')
    return (net, devices), {}


def _check_parallel_apply(replicas, inputs):
    replicas, inputs = list(replicas), list(inputs)
    if len(replicas) != len(inputs):
        raise ValueError(f'parallel_apply: {len(replicas)} replicas but {len(inputs)} inputs; '
                         'pass one tuple of arguments per replica (see scatter_inputs)')
    for k, r in enumerate(replicas):
        if not callable(r) or not isinstance(getattr(r, 'device', None), torch.device):
            raise TypeError(f'parallel_apply: replicas[{k}] is a {type(r).__name__}, not a '
                            'replica with a device; make the replicas with replicate(net, devices)')
    return (replicas, [args if isinstance(args, tuple) else (args,) for args in inputs]), {}


def _check_gatherable(outputs, where='outputs'):
    if not outputs:
        raise ValueError('gather: outputs is empty; pass one output per replica')
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        if any(not isinstance(o, torch.Tensor) for o in outputs):
            raise TypeError('gather: replicas returned a mix of tensors and other objects')
        if len({o.dim() == 0 for o in outputs}) > 1:
            raise ValueError(f'gather: some replicas returned scalars in {where} and some '
                             'did not; return the same kind of tensor from every replica')
    elif isinstance(first, (Mapping, tuple, list)):
        if any(type(o) is not type(first) or len(o) != len(first)
               or (isinstance(first, Mapping) and set(o) != set(first)) for o in outputs):
            raise TypeError(f'gather: the replicas returned {where} of different types or '
                            'lengths; every replica must return the same structure')
        for key in (first if isinstance(first, Mapping) else range(len(first))):
            _check_gatherable([o[key] for o in outputs], f'{where}[{key!r}]')
    elif first is None:
        if any(o is not None for o in outputs):
            raise TypeError(f'gather: some replicas returned None in {where} and some did not; '
                            'return the same kind of output from every replica')
    else:
        raise TypeError(f'gather: cannot gather outputs of type {type(first).__name__}; '
                        'return tensors (or tuples, lists, dicts of tensors) from the module')


def _check_gather(outputs, output_device, dim=0):
    if isinstance(outputs, (torch.Tensor, str)) or not isinstance(outputs, (list, tuple)):
        raise TypeError(f'gather: outputs must be a list with one output per replica, got '
                        f'{type(outputs).__name__}')
    outputs = list(outputs)
    output_device = existing_device(output_device, 'gather', 'output_device')
    _check_gatherable(outputs)
    return (outputs, _indexed(output_device), dim), {}


def _check_data_parallel(net, inputs, devices, output_device=None, dim=0):
    _check_module(net, 'data_parallel')
    devices = _normalize_devices(devices, 'data_parallel')
    output_device = None if output_device is None else _indexed(output_device)
    return (net, _as_arguments(inputs, 'data_parallel'), devices, output_device, dim), {}


def _check_hand_data_parallel(self, module, devices, output_device=None, dim=0):
    _check_module(module, 'HandDataParallel')
    devices = _normalize_devices(devices, 'HandDataParallel')
    output_device = None if output_device is None else _indexed(output_device)
    return (self, module, devices, output_device, dim), {}


def _check_save_checkpoint(state_dict, path):
    if not isinstance(state_dict, Mapping):
        raise TypeError(f'save_checkpoint: expected a state_dict (a mapping), got '
                        f'{type(state_dict).__name__}; save net.state_dict(), not the net')
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f'save_checkpoint: the folder {path.parent} does not exist; '
                         'create it first')
    return (state_dict, path), {}


def _listing(title, items, limit=8):
    more = f' ... and {len(items) - limit} more' if len(items) > limit else ''
    return f'  {title} ({len(items)}): ' + ', '.join(items[:limit]) + more


def _check_load_state_dict_flexible(net, state_dict, prefix='module.'):
    # load_state_dict(strict=True) copies what fits before it raises about the rest,
    # so a checkpoint that does not fit is refused here, before anything is copied.
    _check_module(net, 'load_state_dict_flexible')
    if not isinstance(state_dict, Mapping):
        raise TypeError(f'load_state_dict_flexible: expected a state_dict (a mapping), got '
                        f'{type(state_dict).__name__}')
    expected = net.state_dict()

    def prefixed(keys):
        return bool(keys) and all(k.startswith(prefix) for k in keys)

    wants, has = prefixed(list(expected)), prefixed(list(state_dict))
    if wants and not has:
        keys = {prefix + k: k for k in state_dict}
    elif has and not wants:
        keys = {k[len(prefix):]: k for k in state_dict}
    else:
        keys = {k: k for k in state_dict}
    missing = sorted(set(expected) - set(keys))
    unexpected = sorted(set(keys) - set(expected))
    mismatched = [f'{k} {tuple(state_dict[keys[k]].shape)} != {tuple(v.shape)}'
                  for k, v in expected.items() if k in keys
                  and isinstance(v, torch.Tensor) and isinstance(state_dict[keys[k]], torch.Tensor)
                  and state_dict[keys[k]].shape != v.shape]
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


def _device_context(device):
    """Make `device` the current CUDA device (for pipeline.py's stage threads); no-op elsewhere."""
    return torch.cuda.device(device) if device.type == 'cuda' else contextlib.nullcontext()


# ---------------------------------------------------------------- the algorithm (notebook 3)

@checked(_check_scatter_inputs)
def scatter_inputs(inputs, devices, dim=0):
    """Split every tensor in `inputs` along `dim` into one part per device.

    Returns one tuple of arguments per device. Arguments that are not tensors
    are passed to every device unchanged, as nn.DataParallel does.
    """
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    columns = []
    for arg in inputs:
        if isinstance(arg, torch.Tensor):
            parts = arg.chunk(len(devices), dim)  # parts of ceil(n/k) rows, as DataParallel
            columns.append([part.to(device) for part, device in zip(parts, devices)])
        else:
            columns.append([arg] * len(devices))
    return list(zip(*columns))


class Replica:
    """One copy of a module for one device: the module's code run on its own tensors."""

    def __init__(self, skeleton, tensors, device):
        self.skeleton, self.tensors, self.device = skeleton, tensors, device

    def __call__(self, *args, **kwargs):
        return functional_call(self.skeleton, self.tensors, args, kwargs)

    def __repr__(self):
        return f'Replica({type(self.skeleton).__name__} on {self.device}, {len(self.tensors)} tensors)'


@checked(_check_replicate)
def replicate(net, devices):
    """Return one Replica of `net` per device; gradients flow back to `net`'s parameters.

    The replica on devices[0] uses `net`'s own tensors; every other replica
    gets differentiable copies, so backward adds all their gradients into
    `net`'s `.grad`.
    """
    originals = {**dict(net.named_parameters()), **dict(net.named_buffers())}
    # Each replica needs its own module object: functional_call swaps tensors into the
    # module it is given. The memo makes deepcopy copy the module, not its tensors.
    memo = {id(t): t for t in originals.values()}
    replicas = []
    for k, device in enumerate(devices):
        skeleton = copy.deepcopy(net, memo=dict(memo))
        tensors = originals if k == 0 else {
            name: t.to(device, copy=True) for name, t in originals.items()}
        replicas.append(Replica(skeleton, tensors, device))
    return replicas


@checked(_check_parallel_apply)
def parallel_apply(replicas, inputs):
    """Run `replicas[k](*inputs[k])` for all k at once, one thread per replica."""
    # Grad mode and autocast are settings of each thread: hand the caller's to the workers.
    grad_enabled = torch.is_grad_enabled()
    autocasts = [torch.autocast(r.device.type, dtype=torch.get_autocast_dtype(r.device.type),
                                enabled=torch.is_autocast_enabled(r.device.type)) for r in replicas]
    results = [None] * len(replicas)

    def worker(k, device):
        on_device = torch.cuda.device(device) if device.type == 'cuda' else contextlib.nullcontext()
        try:
            with torch.set_grad_enabled(grad_enabled), autocasts[k], on_device:
                results[k] = replicas[k](*inputs[k])
        except Exception as e:  # raised again in the caller's thread, below
            results[k] = e

    threads = [threading.Thread(target=worker, args=(k, r.device)) for k, r in enumerate(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, result in enumerate(results):
        if isinstance(result, Exception):
            raise RuntimeError(f'parallel_apply: replica {k} on {replicas[k].device} failed: '
                               f'{type(result).__name__}: {result}') from result
    return results


@checked(_check_gather)
def gather(outputs, output_device, dim=0):
    """Concatenate the replicas' outputs on `output_device` along `dim`.

    Tuples, lists and dicts are gathered entry by entry. Scalars (say, a loss
    computed inside the module) become a vector with one entry per replica.
    """
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:
            return torch.stack([o.to(output_device) for o in outputs])
        return torch.cat([o.to(output_device) for o in outputs], dim)
    if isinstance(first, dict):
        return type(first)((key, gather([o[key] for o in outputs], output_device, dim))
                           for key in first)
    if isinstance(first, (tuple, list)):
        return type(first)(gather(list(column), output_device, dim) for column in zip(*outputs))
    return None  # the replicas returned None


@checked(_check_data_parallel)
def data_parallel(net, inputs, devices, output_device=None, dim=0):
    """Evaluate `net(*inputs)` in parallel over `devices`: scatter, replicate, apply, gather."""
    shards = scatter_inputs(inputs, devices, dim)
    replicas = replicate(net, devices)
    outputs = parallel_apply(replicas, shards)
    return gather(outputs, devices[0] if output_device is None else output_device, dim)


class HandDataParallel(nn.Module):
    """nn.DataParallel's forward pass, written out, for any list of devices (CPU slots too)."""

    @checked(_check_hand_data_parallel)
    def __init__(self, module, devices, output_device=None, dim=0):
        super().__init__()
        self.module = module  # the attribute's name gives state_dict keys their `module.` prefix
        self.devices, self.dim = devices, dim
        self.output_device = devices[0] if output_device is None else output_device

    def forward(self, *inputs):
        return data_parallel(self.module, inputs, self.devices, self.output_device, self.dim)


@checked(_check_save_checkpoint)
def save_checkpoint(state_dict, path):
    """Save `state_dict` to `path` atomically: readers never see half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix='.tmp')  # next to `path`, same disk
    try:
        with os.fdopen(fd, 'wb') as f:
            torch.save(dict(state_dict), f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it visible
        os.replace(tmp, path)  # atomic: readers see the old file or the new one
    except BaseException:
        os.unlink(tmp)
        raise
    return path


@checked(_check_load_state_dict_flexible)
def load_state_dict_flexible(net, state_dict, prefix='module.'):
    """Load `state_dict` into `net`, adding or stripping a leading `prefix` as needed.

    A checkpoint saved from a wrapped model (nn.DataParallel, DDP) has keys
    `module.xxx`; an unwrapped model expects `xxx`, and the reverse. Returns
    the state dict as it was loaded.
    """
    def prefixed(keys):
        return bool(keys) and all(k.startswith(prefix) for k in keys)

    wants, has = prefixed(list(net.state_dict())), prefixed(list(state_dict))
    if wants and not has:
        state_dict = {prefix + k: v for k, v in state_dict.items()}
    elif has and not wants:  # only a leading prefix: a layer called `submodule` keeps its name
        state_dict = {k[len(prefix):]: v for k, v in state_dict.items()}
    net.load_state_dict(state_dict)  # strict: a key too many or too few is an error
    return dict(state_dict)
