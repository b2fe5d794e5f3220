"""Argument checks: `checked` and the checkers shared by every chapter's checks module.

d2lpar/checks/nbNN_<name>.py holds the checks of what notebook NN teaches, in a table
`CHECKS` keyed by the name of the definition it guards ('f' or 'Class.method'); `make lib`
writes `@checked(CHECKS[name])` above that definition in d2lpar/lessons/nbNN_<name>.py.
"""

import functools
import inspect
import math

import torch
import torch.distributed as dist


def process_group_size(caller):
    """Return the world size of the default process group, or say how to create one."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            f'{caller}: no process group; call torch.distributed.'
            'init_process_group first (each rank of a script run by torchrun)'
        )
    return dist.get_world_size()


def positive_int(value, name, hint=''):
    """Return `value` if it is a positive int (a bool is not), else raise a ValueError naming it."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f'{name} must be a positive int, got {value!r}{hint}')
    return value


def finite_number(value, name, caller, positive=False):
    """Return `value` if it is a finite int or float (>= 0, or > 0 if `positive`), else raise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f'{caller}: {name} must be a number, got {value!r}')
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = '> 0' if positive else '>= 0'
        raise ValueError(f'{caller}: {name} must be a finite number {bound}, got {value!r}')
    return value


def existing_device(device, caller, name='device'):
    """Return `device` as a torch.device, or raise a clear error if it is no device or a missing GPU."""
    if isinstance(device, bool) or isinstance(device, int) and device < 0:
        raise ValueError(f"{caller}: {name} must be a device such as 'cpu' or 'cuda:0', got {device!r}")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError, OverflowError) as e:
        raise TypeError(
            f"{caller}: {name} must be a device such as 'cpu' or 'cuda:0', got {device!r} ({str(e).splitlines()[0]})"
        ) from None
    if device.type == 'cuda':
        # As d2lpar.num_gpus: GPUs that CUDA cannot start (a driver too old) count as none.
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index or 0) >= count:
            have = 'no GPU' if count == 0 else f'{count} GPU(s), cuda:0 to cuda:{count - 1}'
            raise ValueError(
                f'{caller}: {name} {device} does not exist: this machine has {have} '
                '(d2lpar.num_gpus() counts them, nvidia-smi lists them). Use '
                "d2lpar.try_gpu(i), which falls back to the CPU, or 'cpu'"
            )
    return device


def checked(check):
    """Run `check` on a function's arguments before the function itself.

    Keeps argument validation out of the algorithm, so that a lesson module reads exactly as
    the notebook cells it is generated from (the checks live in d2lpar/checks/, and `make lib`
    applies them). `check` takes the same arguments and raises a TypeError or
    ValueError that names what was wrong; if it returns a pair (args, kwargs),
    the function is called with those instead (e.g. devices made torch.device).
    """

    def decorate(fn):
        signature = inspect.signature(fn)
        name, shown = fn.__qualname__, signature
        if next(iter(signature.parameters), None) == 'self':  # a method: show it without self
            shown = signature.replace(parameters=list(signature.parameters.values())[1:])
            name = name.removesuffix('.__init__')  # a constructor is called by its class's name

        @functools.wraps(fn)
        def run_checked(*args, **kwargs):
            # Bind to the public function first: an unknown or missing argument is then reported
            # under its name, not under the name of the internal check.
            try:
                signature.bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError(f'{name}{shown}: {e}') from None
            normalized = check(*args, **kwargs)
            if normalized is not None:
                args, kwargs = normalized
            return fn(*args, **kwargs)

        return run_checked

    return decorate
