"""Argument checks for the code notebook 03 teaches (d2lpar/lessons/nb03_data_parallel.py).

Each check takes the same arguments as the function it guards and raises a TypeError or
ValueError naming the function and what to do; CHECKS maps the definition's name to it, and
`make lib` writes `@checked(CHECKS[name])` above that definition in the lesson module.
"""

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from d2lpar.checks import existing_device
from d2lpar.checks.nb08_lenet_data_parallel import _check_devices


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
        raise TypeError(f'{caller}: inputs must be a tensor or a tuple of arguments, got {type(inputs).__name__}')
    return tuple(inputs)


def _check_scatter_inputs(inputs, devices, dim=0):
    inputs = _as_arguments(inputs, 'scatter_inputs')
    devices = _normalize_devices(devices, 'scatter_inputs')
    k = len(devices)
    if not any(isinstance(arg, torch.Tensor) for arg in inputs):
        raise ValueError(
            'scatter_inputs: inputs hold no tensor to split; pass the batch as a '
            'tensor (other arguments go to every replica unchanged)'
        )
    for i, arg in enumerate(inputs):
        if not isinstance(arg, torch.Tensor):
            continue
        if arg.dim() == 0:
            raise ValueError(
                f'scatter_inputs: inputs[{i}] is a 0-dim tensor and cannot be split; give it a batch dimension first'
            )
        if not -arg.dim() <= dim < arg.dim():
            raise ValueError(
                f'scatter_inputs: dim={dim} does not exist in inputs[{i}] of shape '
                f'{tuple(arg.shape)}; use a dim in [0, {arg.dim()})'
            )
        n = arg.shape[dim]
        if n < k:
            raise ValueError(
                f'scatter_inputs: {n} rows of inputs[{i}] cannot be split across '
                f'{k} devices; use a batch of at least {k} rows or fewer devices'
            )
        parts = -(-n // k)  # torch.chunk makes parts of ceil(n/k) rows ...
        if -(-n // parts) < k:  # ... which can run out early: 5 rows, 4 devices -> 2+2+1
            # nn.DataParallel would quietly use fewer devices; saying so is better than
            # changing the experiment.
            raise ValueError(
                f'scatter_inputs: torch.chunk splits {n} rows of inputs[{i}] into '
                f'only {-(-n // parts)} parts for {k} devices, leaving a device '
                f'idle; use a batch size that is a multiple of {k}'
            )
    return (inputs, devices, dim), {}


def _check_replicate(net, devices):
    _check_module(net, 'replicate')
    devices = _normalize_devices(devices, 'replicate')
    tensors = {**dict(net.named_parameters()), **dict(net.named_buffers())}
    for name, t in tensors.items():
        if t.device != devices[0]:
            raise ValueError(
                f'replicate: the module must live on devices[0] = {devices[0]}, '
                f'but {name!r} is on {t.device}; call net.to({str(devices[0])!r}) '
                f'(before or after wrapping, but before the forward pass)'
            )
    return (net, devices), {}


def _check_parallel_apply(replicas, inputs):
    replicas, inputs = list(replicas), list(inputs)
    if len(replicas) != len(inputs):
        raise ValueError(
            f'parallel_apply: {len(replicas)} replicas but {len(inputs)} inputs; '
            'pass one tuple of arguments per replica (see scatter_inputs)'
        )
    for k, r in enumerate(replicas):
        if not callable(r) or not isinstance(getattr(r, 'device', None), torch.device):
            raise TypeError(
                f'parallel_apply: replicas[{k}] is a {type(r).__name__}, not a '
                'replica with a device; make the replicas with replicate(net, devices)'
            )
    return (replicas, [args if isinstance(args, tuple) else (args,) for args in inputs]), {}


def _check_gatherable(outputs, where='outputs'):
    if not outputs:
        raise ValueError('gather: outputs is empty; pass one output per replica')
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        if any(not isinstance(o, torch.Tensor) for o in outputs):
            raise TypeError('gather: replicas returned a mix of tensors and other objects')
        if len({o.dim() == 0 for o in outputs}) > 1:
            raise ValueError(
                f'gather: some replicas returned scalars in {where} and some '
                'did not; return the same kind of tensor from every replica'
            )
    elif isinstance(first, (Mapping, tuple, list)):
        if any(
            type(o) is not type(first) or len(o) != len(first) or (isinstance(first, Mapping) and set(o) != set(first))
            for o in outputs
        ):
            raise TypeError(
                f'gather: the replicas returned {where} of different types or '
                'lengths; every replica must return the same structure'
            )
        for key in first if isinstance(first, Mapping) else range(len(first)):
            _check_gatherable([o[key] for o in outputs], f'{where}[{key!r}]')
    elif first is None:
        if any(o is not None for o in outputs):
            raise TypeError(
                f'gather: some replicas returned None in {where} and some did not; '
                'return the same kind of output from every replica'
            )
    else:
        raise TypeError(
            f'gather: cannot gather outputs of type {type(first).__name__}; '
            'return tensors (or tuples, lists, dicts of tensors) from the module'
        )


def _check_gather(outputs, output_device, dim=0):
    if isinstance(outputs, (torch.Tensor, str)) or not isinstance(outputs, (list, tuple)):
        raise TypeError(f'gather: outputs must be a list with one output per replica, got {type(outputs).__name__}')
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
        raise TypeError(
            f'save_checkpoint: expected a state_dict (a mapping), got '
            f'{type(state_dict).__name__}; save net.state_dict(), not the net'
        )
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f'save_checkpoint: the folder {path.parent} does not exist; create it first')
    return (state_dict, path), {}


def _listing(title, items, limit=8):
    more = f' ... and {len(items) - limit} more' if len(items) > limit else ''
    return f'  {title} ({len(items)}): ' + ', '.join(items[:limit]) + more


def _check_load_state_dict_flexible(net, state_dict, prefix='module.'):
    # load_state_dict(strict=True) copies what fits before it raises about the rest,
    # so a checkpoint that does not fit is refused here, before anything is copied.
    _check_module(net, 'load_state_dict_flexible')
    if not isinstance(state_dict, Mapping):
        raise TypeError(f'load_state_dict_flexible: expected a state_dict (a mapping), got {type(state_dict).__name__}')
    expected = net.state_dict()

    def prefixed(keys):
        return bool(keys) and all(k.startswith(prefix) for k in keys)

    wants, has = prefixed(list(expected)), prefixed(list(state_dict))
    if wants and not has:
        keys = {prefix + k: k for k in state_dict}
    elif has and not wants:
        keys = {k[len(prefix) :]: k for k in state_dict}
    else:
        keys = {k: k for k in state_dict}
    missing = sorted(set(expected) - set(keys))
    unexpected = sorted(set(keys) - set(expected))
    mismatched = [
        f'{k} {tuple(state_dict[keys[k]].shape)} != {tuple(v.shape)}'
        for k, v in expected.items()
        if k in keys
        and isinstance(v, torch.Tensor)
        and isinstance(state_dict[keys[k]], torch.Tensor)
        and state_dict[keys[k]].shape != v.shape
    ]
    if missing or unexpected or mismatched:
        lines = [
            f'load_state_dict_flexible: the checkpoint does not fit this {type(net).__name__}; nothing was loaded:'
        ]
        if missing:
            lines.append(_listing('missing keys', missing))
        if unexpected:
            lines.append(_listing('unexpected keys', unexpected))
        if mismatched:
            lines.append(_listing('shape mismatches (checkpoint != model)', mismatched))
        raise ValueError('\n'.join(lines))


CHECKS = {
    'scatter_inputs': _check_scatter_inputs,
    'replicate': _check_replicate,
    'parallel_apply': _check_parallel_apply,
    'gather': _check_gather,
    'data_parallel': _check_data_parallel,
    'HandDataParallel.__init__': _check_hand_data_parallel,
    'save_checkpoint': _check_save_checkpoint,
    'load_state_dict_flexible': _check_load_state_dict_flexible,
}
