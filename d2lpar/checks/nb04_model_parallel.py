"""Argument checks for the code notebook 04 teaches (d2lpar/lessons/nb04_model_parallel.py).

Each check takes the same arguments as the function it guards and raises a TypeError or
ValueError naming the function and what to do; CHECKS maps the definition's name to it, and
`make lib` writes `@checked(CHECKS[name])` above that definition in the lesson module.
"""

import math
import numbers

import torch
from torch import nn

from d2lpar.checks import positive_int
from d2lpar.checks.nb08_lenet_data_parallel import _check_devices


def _check_model_parallel(self, net, devices, balance=None):
    if not isinstance(net, nn.Sequential):
        raise TypeError(f'ModelParallel: net must be an nn.Sequential to be cut into stages, got {type(net).__name__}')
    devices = _check_devices(devices, 'ModelParallel')
    n, p = len(net), len(devices)
    if balance is None:
        if n < p:
            raise ValueError(f'ModelParallel: {n} layers cannot fill {p} stages; use at most {n} devices')
        return (self, net, devices), {}
    if isinstance(balance, (int, torch.Tensor)) or not hasattr(balance, '__iter__'):
        raise TypeError(
            f'ModelParallel: balance must be a list of layer counts, one per device (e.g. [2, 3]), got {balance!r}'
        )
    balance = list(balance)
    if (
        len(balance) != p
        or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in balance)
        or sum(balance) != n
    ):
        raise ValueError(
            f'ModelParallel: balance={balance} must give a positive number of '
            f'layers for each of the {p} devices, adding up to the {n} layers '
            f'of net'
        )
    return (self, net, devices), {'balance': balance}


def _check_gpipe_step(model, X, y, loss, chunks):
    from d2lpar.lessons.nb04_model_parallel import ModelParallel  # the lesson imports this module

    if not isinstance(model, ModelParallel):
        raise TypeError(f'gpipe_step: model must be a d2lpar.ModelParallel, got {type(model).__name__}')
    if not callable(loss):
        raise TypeError(
            f'gpipe_step: loss must be a function of (output, target) that averages '
            f'over the batch, such as nn.CrossEntropyLoss(); got {loss!r}'
        )
    positive_int(chunks, 'gpipe_step: chunks')
    if not isinstance(X, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError('gpipe_step: X and y must be tensors')
    if X.dim() == 0 or y.dim() == 0 or len(X) != len(y):
        raise ValueError(
            f'gpipe_step: X and y need the same number of rows, got shapes {tuple(X.shape)} and {tuple(y.shape)}'
        )
    made = len(torch.chunk(X, chunks))
    if made != chunks:
        raise ValueError(
            f'gpipe_step: {len(X)} rows do not make {chunks} micro-batches '
            f'(torch.chunk gives {made}); pick chunks that divide the batch size'
        )


def _check_pipeline_schedule(num_stages, num_microbatches, t_forward=1, t_backward=1):
    for value, name in [
        (num_stages, 'num_stages'),
        (num_microbatches, 'num_microbatches'),
        (t_forward, 't_forward'),
        (t_backward, 't_backward'),
    ]:
        positive_int(value, f'pipeline_schedule: {name}')


def _check_bubble_fraction(num_stages, num_microbatches):
    positive_int(num_stages, 'bubble_fraction: num_stages')
    positive_int(num_microbatches, 'bubble_fraction: num_microbatches')


_EVENT = (
    "(stage, micro-batch, phase, start, end) tuples with phase 'F' or 'B', such as "
    "d2lpar.pipeline_schedule(2, 4) or d2lpar.gpipe_step returns"
)


def _events(events, caller):
    """Return `events` as a list after checking that each is a well-formed event."""
    if isinstance(events, (str, bytes, torch.Tensor)) or not hasattr(events, '__iter__'):
        raise TypeError(f'{caller}: events must be a list of {_EVENT}; got {type(events).__name__} {events!r:.60}')
    events = list(events)
    for k, event in enumerate(events):
        if not isinstance(event, (tuple, list)) or len(event) != 5:
            raise TypeError(f'{caller}: events[{k}] is {event!r:.60}, not one of {_EVENT}')
        i, j, phase, start, end = event
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in (i, j)):
            raise ValueError(
                f'{caller}: events[{k}] = {event!r} must start with a stage and a micro-batch index, ints >= 0'
            )
        if phase not in ('F', 'B'):
            raise ValueError(
                f"{caller}: events[{k}] = {event!r} has phase {phase!r}; use 'F' (forward) or 'B' (backward)"
            )
        if any(not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(v) for v in (start, end)):
            raise ValueError(f'{caller}: events[{k}] = {event!r} must end with a finite start and end time')
    return events


def _check_idle_fraction(events, num_stages):
    events = _events(events, 'idle_fraction')
    if not events:
        raise ValueError('idle_fraction: no events')
    positive_int(num_stages, 'idle_fraction: num_stages')
    if max(e[4] for e in events) - min(e[3] for e in events) <= 0:
        raise ValueError('idle_fraction: the events span no time (every end equals the first start)')
    return (events, num_stages), {}


def _check_schedule_problems(events, num_stages, num_microbatches):
    events = _events(events, 'schedule_problems')
    positive_int(num_stages, 'schedule_problems: num_stages')
    positive_int(num_microbatches, 'schedule_problems: num_microbatches')
    return (events, num_stages, num_microbatches), {}


CHECKS = {
    'ModelParallel.__init__': _check_model_parallel,
    'gpipe_step': _check_gpipe_step,
    'pipeline_schedule': _check_pipeline_schedule,
    'bubble_fraction': _check_bubble_fraction,
    'idle_fraction': _check_idle_fraction,
}
