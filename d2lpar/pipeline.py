"""Model parallelism: a network split into stages on devices, and GPipe-style pipelining.

The name notebooks and scripts import. What the notebook teaches is generated into
d2lpar/lessons/nb04_model_parallel.py (edit the notebook's `#@save` cell, then `make lib`), its
argument checks live in d2lpar/checks/; what follows are helpers the notebook uses but does not
teach.
"""
import torch
from torch import nn

from .checks import checked, positive_int
from .checks.nb04_model_parallel import _check_schedule_problems, _events
from .lessons.nb04_model_parallel import *  # noqa: F403
from .lessons.nb04_model_parallel import __all__ as _nb04
from .tensor_parallel import saved_bytes  # notebook 12's counter of what autograd saves


@checked(_check_schedule_problems)
def schedule_problems(events, num_stages, num_microbatches):
    """Return what is wrong with a pipeline schedule (an empty list if nothing).

    Checks that every task runs once on a stage that exists, that no task ends
    before it starts, that no stage runs two tasks at a time, and that no task
    starts before its input was ready.
    """
    tasks = {}
    problems = []
    for i, j, phase, start, end in events:
        if i >= num_stages or j >= num_microbatches:
            problems.append(f'{phase}{j} runs on stage {i}, outside the {num_stages} stages '
                            f'and {num_microbatches} micro-batches of this schedule')
        if end < start:
            problems.append(f'{phase}{j} on stage {i} ends at {end:.6g}, before it starts '
                            f'at {start:.6g}')
        if (i, j, phase) in tasks:
            problems.append(f'{phase}{j} runs twice on stage {i}')
        tasks[(i, j, phase)] = (start, end)
    expected = {(i, j, ph) for i in range(num_stages) for j in range(num_microbatches)
                for ph in 'FB'}
    problems += [f'{ph}{j} never runs on stage {i}' for i, j, ph in sorted(expected - set(tasks))]
    for i in range(num_stages):
        spans = sorted(v for (s, _, _), v in tasks.items() if s == i)
        problems += [f'stage {i} runs two tasks at once at {b[0]:.6g}'
                     for a, b in zip(spans, spans[1:]) if b[0] < a[1]]
    for (i, j, ph), (start, _) in tasks.items():
        sources = [(i - 1, j, 'F')] if ph == 'F' else [(i + 1, j, 'B'), (i, j, 'F')]
        for source in sources:
            if source in tasks and start < tasks[source][1]:
                problems.append(f'{ph}{j} starts on stage {i} before {source[2]}{j} '
                                f'of stage {source[0]} ended')
    return problems


def plot_schedule(events, num_stages, ax=None, title=None, unit='time step'):
    """Draw a pipeline schedule as a Gantt chart: one row per stage, one box per task."""
    events = _events(events, 'plot_schedule')
    positive_int(num_stages, 'plot_schedule: num_stages')
    if not events:
        raise ValueError('plot_schedule: no events to draw; pass the events of '
                         'd2lpar.pipeline_schedule or of a gpipe_step')
    if ax is None:
        from matplotlib.figure import Figure
        ax = Figure(figsize=(7, 0.45 * num_stages + 1)).add_subplot()
    import matplotlib
    colors = matplotlib.colormaps['tab10']
    span = max(e[4] for e in events) - min(e[3] for e in events)
    for i, j, phase, start, end in events:
        ax.barh(i, end - start, left=start, height=0.8, color=colors(j % 10),
                alpha=1.0 if phase == 'F' else 0.55, hatch=None if phase == 'F' else '//',
                edgecolor='black', linewidth=0.5)
        if end - start > span / 40:
            ax.text((start + end) / 2, i, f'{phase}{j}', ha='center', va='center', fontsize=7)
    ax.set_yticks(range(num_stages), [f'stage {i}' for i in range(num_stages)])
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    if title:
        ax.set_title(title, fontsize=10)
    ax.figure.tight_layout()
    return ax.figure


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
        raise TypeError(f'memory_footprint: X must be a batch of inputs for net (a tensor), got '
                        f'{type(X).__name__}')
    if (not isinstance(optimizer_states, int) or isinstance(optimizer_states, bool)
            or optimizer_states < 0):
        raise ValueError(f'memory_footprint: optimizer_states must be an int >= 0, got '
                         f'{optimizer_states!r}')
    params = list(net.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    with torch.enable_grad():
        try:  # each storage autograd saves, counted once; the parameters left out
            _, activations = saved_bytes(net, X, exclude=params)
        except RuntimeError as e:
            raise ValueError(f'memory_footprint: net cannot run on X of shape {tuple(X.shape)} '
                             f'({str(e).splitlines()[0]}); pass a batch that net accepts') from e
    return {'parameters': param_bytes, 'gradients': param_bytes,
            'optimizer': optimizer_states * param_bytes, 'activations': activations}

__all__ = [*_nb04, 'schedule_problems', 'plot_schedule', 'memory_footprint']
