"""Model parallelism: a network split into stages on devices, and GPipe-style pipelining.

The algorithms are written in notebook 4's cells (marked `#@save`) and are the
same code here; their argument checks are the `_check_...` functions, run by
`@checked` before the algorithm. `gpipe_stage` is the schedule of one stage;
`gpipe_step` runs one per stage in its own thread, linked by queues
(`StageLinks`), so on GPUs (or on CPU cores, with torch.set_num_threads(1))
stage i works on micro-batch j while stage i+1 works on micro-batch j-1.
"""
import contextlib
import copy
import math
import numbers
import queue
import threading
import time

import torch
from torch import nn

from ._checks import checked, positive_int
from .devices import synchronize
from .parallel import _check_devices
from .tensor_parallel import saved_bytes  # notebook 12's counter of what autograd saves

__all__ = ['ModelParallel', 'gpipe_stage', 'StageLinks', 'gpipe_step', 'pipeline_schedule', 'bubble_fraction',
           'idle_fraction', 'schedule_problems', 'plot_schedule', 'memory_footprint']


def _check_model_parallel(self, net, devices, balance=None):
    if not isinstance(net, nn.Sequential):
        raise TypeError(f'ModelParallel: net must be an nn.Sequential to be cut into stages, '
                        f'got {type(net).__name__}')
    devices = _check_devices(devices, 'ModelParallel')
    n, p = len(net), len(devices)
    if balance is None:
        if n < p:
            raise ValueError(f'ModelParallel: {n} layers cannot fill {p} stages; '
                             f'use at most {n} devices')
        return (self, net, devices), {}
    if isinstance(balance, (int, torch.Tensor)) or not hasattr(balance, '__iter__'):
        raise TypeError(f'ModelParallel: balance must be a list of layer counts, one per '
                        f'device (e.g. [2, 3]), got {balance!r}')
    balance = list(balance)
    if (len(balance) != p or any(not isinstance(b, int) or isinstance(b, bool) or b < 1
                                 for b in balance)
            or sum(balance) != n):
        raise ValueError(f'ModelParallel: balance={balance} must give a positive number of '
                         f'layers for each of the {p} devices, adding up to the {n} layers '
                         f'of net')
    return (self, net, devices), {'balance': balance}


class ModelParallel(nn.Module):
    """Split a copy of the nn.Sequential `net` into consecutive stages, stage i on devices[i].

    `balance` gives the number of layers of each stage (default: as even as possible).
    """

    @checked(_check_model_parallel)
    def __init__(self, net, devices, balance=None):
        super().__init__()
        n, p = len(net), len(devices)
        if balance is None:  # as even as possible: the first n % p stages get one layer more
            balance = [n // p + (1 if i < n % p else 0) for i in range(p)]
        layers, start = list(copy.deepcopy(net)), 0  # a copy: the caller's net stays untouched
        self.stages = nn.ModuleList()
        for size, device in zip(balance, devices):
            self.stages.append(nn.Sequential(*layers[start:start + size]).to(device))
            start += size
        self.devices = list(devices)

    def forward(self, X):
        for stage, device in zip(self.stages, self.devices):
            X = stage(X.to(device))  # the activations travel to the next stage's device
        return X


def _check_gpipe_step(model, X, y, loss, chunks):
    if not isinstance(model, ModelParallel):
        raise TypeError(f'gpipe_step: model must be a d2lpar.ModelParallel, got '
                        f'{type(model).__name__}')
    if not callable(loss):
        raise TypeError(f'gpipe_step: loss must be a function of (output, target) that averages '
                        f'over the batch, such as nn.CrossEntropyLoss(); got {loss!r}')
    positive_int(chunks, 'gpipe_step: chunks')
    if not isinstance(X, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError('gpipe_step: X and y must be tensors')
    if X.dim() == 0 or y.dim() == 0 or len(X) != len(y):
        raise ValueError(f'gpipe_step: X and y need the same number of rows, got shapes '
                         f'{tuple(X.shape)} and {tuple(y.shape)}')
    made = len(torch.chunk(X, chunks))
    if made != chunks:
        raise ValueError(f'gpipe_step: {len(X)} rows do not make {chunks} micro-batches '
                         f'(torch.chunk gives {made}); pick chunks that divide the batch size')


def gpipe_stage(i, model, chunks, link, loss_of):
    """Run stage i's part of a GPipe step: every micro-batch forward, then backward in reverse.

    `link` carries activations and gradients between the stages and clocks the
    work; `loss_of(j, out)` turns the last stage's output for micro-batch j into
    its loss.
    """
    stage, device, last = model.stages[i], model.devices[i], i == len(model.stages) - 1
    kept = []  # (input, output) of each micro-batch, until its backward pass
    for j in range(chunks):
        inp = link.receive_input(i)
        with link.clock(i, j, 'F'):
            x = inp.to(device).detach().requires_grad_(i > 0)  # a fresh leaf: backward stops here
            out = stage(x)
            if last:
                out = loss_of(j, out)
        if not last:
            link.send_input(i + 1, out.detach())
        kept.append((x, out))
    for j in reversed(range(chunks)):
        grad = None if last else link.receive_grad(i).to(device)
        with link.clock(i, j, 'B'):
            x, out = kept.pop()
            out.backward(grad)
        if i > 0:
            link.send_grad(i - 1, x.grad)  # the gradient of this stage's input, for stage i-1


class StageLinks:
    """Queues between pipeline stages that run in threads, and a clock for their work."""

    def __init__(self, devices):
        self.devices = list(devices)
        self.inputs = [queue.Queue() for _ in devices]  # inputs of stage i, first micro-batch first
        self.grads = [queue.Queue() for _ in devices]  # gradients of stage i's outputs, last first
        self.events, self.t0 = [], time.perf_counter()

    def send_input(self, i, x):
        self.inputs[i].put(x)

    def send_grad(self, i, grad):
        self.grads[i].put(grad)

    def receive_input(self, i):
        return self._receive(self.inputs[i])

    def receive_grad(self, i):
        return self._receive(self.grads[i])

    def _receive(self, box):
        item = box.get()  # blocks this stage's thread until the neighbour has sent
        if item is None:  # the signal that another stage failed
            raise RuntimeError('another stage failed')
        return item

    def fail(self):
        """Wake every waiting stage with the failure signal, so that all of them stop."""
        for box in self.inputs + self.grads:
            box.put(None)

    @contextlib.contextmanager
    def clock(self, i, j, phase):
        """Record the work inside the block as the event (i, j, phase, start, end), in seconds."""
        start = time.perf_counter() - self.t0
        yield
        synchronize(self.devices[i])  # a GPU works asynchronously: wait before reading the clock
        self.events.append((i, j, phase, start, time.perf_counter() - self.t0))


@checked(_check_gpipe_step)
def gpipe_step(model, X, y, loss, chunks):
    """Run forward and backward of a ModelParallel on (X, y) as `chunks` micro-batches, GPipe-style.

    Each stage runs gpipe_stage in its own thread: all forward passes, then all
    backward passes, the gradients accumulating in the parameters (zero them
    before). `loss` averages over its batch. Returns the loss of the whole
    batch and the events (stage, micro-batch, 'F' or 'B', start, end) in seconds.
    """
    Xs, ys = X.chunk(chunks), y.chunk(chunks)
    link, losses, errors = StageLinks(model.devices), [0.0] * chunks, []
    for Xj in Xs:
        link.send_input(0, Xj)

    def loss_of(j, out):  # weighted by its share of the batch: the gradients add up to the batch's
        l = loss(out, ys[j].to(out.device)) * (len(ys[j]) / len(X))
        losses[j] = l.item()
        return l

    def run(i):
        try:
            gpipe_stage(i, model, chunks, link, loss_of)
        except Exception as e:
            errors.append((i, e))
            link.fail()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(model.stages))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:  # the first error is the cause; the others are stages stopped by it
        i, e = errors[0]
        raise RuntimeError(f'gpipe_step: stage {i} on {model.devices[i]} failed: '
                           f'{type(e).__name__}: {e}') from e
    return sum(losses), sorted(link.events, key=lambda e: e[3])


def _check_pipeline_schedule(num_stages, num_microbatches, t_forward=1, t_backward=1):
    for value, name in [(num_stages, 'num_stages'), (num_microbatches, 'num_microbatches'),
                        (t_forward, 't_forward'), (t_backward, 't_backward')]:
        positive_int(value, f'pipeline_schedule: {name}')


@checked(_check_pipeline_schedule)
def pipeline_schedule(num_stages, num_microbatches, t_forward=1, t_backward=1):
    """Simulate GPipe tick by tick; return its events (stage, micro-batch, phase, start, end).

    Stage i runs forward of micro-batches 0..m-1, then backward of m-1..0. A
    task starts at the first tick its stage is free and its input has arrived:
    forward (i, j) needs forward (i-1, j), backward (i, j) needs backward (i+1, j).
    """
    p, m = num_stages, num_microbatches
    programs = [[(i, j, 'F') for j in range(m)] + [(i, j, 'B') for j in reversed(range(m))]
                for i in range(p)]
    duration = {'F': t_forward, 'B': t_backward}
    done, events, next_task, free_at, tick = {}, [], [0] * p, [0] * p, 0
    while any(k < 2 * m for k in next_task):
        for i in range(p):
            if next_task[i] == 2 * m or free_at[i] > tick:
                continue  # finished, or busy
            task = programs[i][next_task[i]]
            _, j, phase = task
            source = (i - 1, j, 'F') if phase == 'F' else (i + 1, j, 'B')
            if 0 <= source[0] < p and done.get(source, math.inf) > tick:
                continue  # its input has not arrived: the stage idles this tick
            free_at[i] = done[task] = tick + duration[phase]
            events.append((i, j, phase, tick, done[task]))
            next_task[i] += 1
        tick += 1
    return events


def _check_bubble_fraction(num_stages, num_microbatches):
    positive_int(num_stages, 'bubble_fraction: num_stages')
    positive_int(num_microbatches, 'bubble_fraction: num_microbatches')


@checked(_check_bubble_fraction)
def bubble_fraction(num_stages, num_microbatches):
    """Return the idle share of a GPipe schedule with equal stages, (p-1)/(m+p-1)."""
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


_EVENT = ("(stage, micro-batch, phase, start, end) tuples with phase 'F' or 'B', such as "
          "d2lpar.pipeline_schedule(2, 4) or d2lpar.gpipe_step returns")


def _events(events, caller):
    """Return `events` as a list after checking that each is a well-formed event."""
    if isinstance(events, (str, bytes, torch.Tensor)) or not hasattr(events, '__iter__'):
        raise TypeError(f'{caller}: events must be a list of {_EVENT}; '
                        f'got {type(events).__name__} {events!r:.60}')
    events = list(events)
    for k, event in enumerate(events):
        if not isinstance(event, (tuple, list)) or len(event) != 5:
            raise TypeError(f'{caller}: events[{k}] is {event!r:.60}, not one of {_EVENT}')
        i, j, phase, start, end = event
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in (i, j)):
            raise ValueError(f'{caller}: events[{k}] = {event!r} must start with a stage and a '
                             f'micro-batch index, ints >= 0')
        if phase not in ('F', 'B'):
            raise ValueError(f"{caller}: events[{k}] = {event!r} has phase {phase!r}; use 'F' "
                             f"(forward) or 'B' (backward)")
        if any(not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(v)
               for v in (start, end)):
            raise ValueError(f'{caller}: events[{k}] = {event!r} must end with a finite start '
                             f'and end time')
    return events


def _check_idle_fraction(events, num_stages):
    events = _events(events, 'idle_fraction')
    if not events:
        raise ValueError('idle_fraction: no events')
    positive_int(num_stages, 'idle_fraction: num_stages')
    if max(e[4] for e in events) - min(e[3] for e in events) <= 0:
        raise ValueError('idle_fraction: the events span no time (every end equals the first start)')
    return (events, num_stages), {}


@checked(_check_idle_fraction)
def idle_fraction(events, num_stages):
    """Return the share of stage time spent idle between the first start and the last end."""
    span = max(e[4] for e in events) - min(e[3] for e in events)
    busy = sum(e[4] - e[3] for e in events)
    return 1 - busy / (num_stages * span)


def _check_schedule_problems(events, num_stages, num_microbatches):
    events = _events(events, 'schedule_problems')
    positive_int(num_stages, 'schedule_problems: num_stages')
    positive_int(num_microbatches, 'schedule_problems: num_microbatches')
    return (events, num_stages, num_microbatches), {}


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
