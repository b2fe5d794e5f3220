"""Model parallelism: a network split into stages on devices, and GPipe-style pipelining.

Stages run in their own threads and pass micro-batches through queues, so on
GPUs (or on CPU cores, with torch.set_num_threads(1)) stage i works on
micro-batch j while stage i+1 works on micro-batch j-1.
"""
import copy
import queue
import threading
import time

import torch
from torch import nn

from ._checks import positive_int
from .dataparallel import _device_context
from .devices import synchronize
from .parallel import _check_devices

__all__ = ['ModelParallel', 'gpipe_step', 'pipeline_schedule', 'bubble_fraction',
           'idle_fraction', 'schedule_problems', 'plot_schedule', 'memory_footprint']


class ModelParallel(nn.Module):
    """Split a copy of nn.Sequential `net` into consecutive stages, stage i on devices[i].

    `balance` gives the number of layers per stage (default: as even as
    possible). The forward pass runs the stages one after another, moving the
    activations from device to device: naive model parallelism.
    """

    def __init__(self, net, devices, balance=None):
        super().__init__()
        if not isinstance(net, nn.Sequential):
            raise TypeError(f'ModelParallel: net must be an nn.Sequential to be cut into stages, '
                            f'got {type(net).__name__}')
        devices = _check_devices(devices, 'ModelParallel')
        n, p = len(net), len(devices)
        if balance is None:
            if n < p:
                raise ValueError(f'ModelParallel: {n} layers cannot fill {p} stages; '
                                 f'use at most {n} devices')
            balance = [n // p + (1 if i < n % p else 0) for i in range(p)]
        if isinstance(balance, int) or not hasattr(balance, '__iter__'):
            raise TypeError(f'ModelParallel: balance must be a list of layer counts, one per '
                            f'device (e.g. [2, 3]), got {balance!r}')
        balance = list(balance)
        if (len(balance) != p or any(not isinstance(b, int) or isinstance(b, bool) or b < 1
                                     for b in balance)
                or sum(balance) != n):
            raise ValueError(f'ModelParallel: balance={balance} must give a positive number of '
                             f'layers for each of the {p} devices, adding up to the {n} layers '
                             f'of net')
        layers = list(copy.deepcopy(net))  # the caller's net stays untouched as a reference
        bounds = [sum(balance[:i]) for i in range(p + 1)]
        self.stages = nn.ModuleList(nn.Sequential(*layers[bounds[i]:bounds[i + 1]]).to(devices[i])
                                    for i in range(p))
        self.devices = devices

    def forward(self, X):
        for stage, device in zip(self.stages, self.devices):
            X = stage(X.to(device))
        return X


class _Abort(Exception):
    """Raised in a stage thread when another stage has failed."""


def _micro_batches(X, y, chunks):
    positive_int(chunks, 'gpipe_step: chunks')
    if not isinstance(X, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError('gpipe_step: X and y must be tensors')
    if X.dim() == 0 or y.dim() == 0 or len(X) != len(y):
        raise ValueError(f'gpipe_step: X and y need the same number of rows, got shapes '
                         f'{tuple(X.shape)} and {tuple(y.shape)}')
    Xs, ys = torch.chunk(X, chunks), torch.chunk(y, chunks)
    if len(Xs) != chunks:
        raise ValueError(f'gpipe_step: {len(X)} rows do not make {chunks} micro-batches '
                         f'(torch.chunk gives {len(Xs)}); pick chunks that divide the batch size')
    return Xs, ys


def gpipe_step(model, X, y, loss, chunks):
    """Run forward and backward of `model` on (X, y) as `chunks` micro-batches, GPipe-style.

    One thread per stage: stage i starts micro-batch j as soon as stage i-1
    has finished it. All forward passes come first, then the backward passes
    (in reverse order), each stage's gradients accumulating in its own
    parameters (zero them before the step). `loss` must average over its
    batch (like nn.CrossEntropyLoss()); each micro-batch's loss is weighted by
    its share of the batch, so the gradients are those of the whole batch.

    Returns the loss of the whole batch and the events
    (stage, micro-batch, 'F' or 'B', start, end) in seconds since the step began.
    """
    if not isinstance(model, ModelParallel):
        raise TypeError(f'gpipe_step: model must be a d2lpar.ModelParallel, got '
                        f'{type(model).__name__}')
    Xs, ys = _micro_batches(X, y, chunks)
    p, n = len(model.stages), len(X)
    acts = [queue.Queue() for _ in range(p)]    # (j, input of stage i)
    grads = [queue.Queue() for _ in range(p)]   # (j, gradient w.r.t. the output of stage i)
    for j, Xj in enumerate(Xs):
        acts[0].put((j, Xj))
    events, losses, errors = [], [None] * chunks, []
    failed = threading.Event()
    t0 = time.perf_counter()

    def get(q):
        while True:
            try:
                return q.get(timeout=0.05)
            except queue.Empty:
                if failed.is_set():
                    raise _Abort from None

    def run_stage(i):
        stage, device, last = model.stages[i], model.devices[i], i == p - 1
        kept = {}
        try:
            with _device_context(device), torch.enable_grad():
                for _ in range(chunks):
                    j, inp = get(acts[i])
                    start = time.perf_counter() - t0
                    # A stage boundary: the input is a fresh leaf, so backward
                    # stops here and hands its gradient to the previous stage.
                    x = inp.to(device) if i == 0 else inp.to(device).detach().requires_grad_()
                    out = stage(x)
                    if last:
                        out = loss(out, ys[j].to(device)) * (len(ys[j]) / n)
                        losses[j] = out.detach()
                    synchronize(device)
                    # The end is taken before the hand-over, so the next stage cannot
                    # record a start that precedes it.
                    events.append((i, j, 'F', start, time.perf_counter() - t0))
                    if not last:
                        acts[i + 1].put((j, out.detach()))
                    kept[j] = (x, out)
                for k in range(chunks):
                    j, grad = (chunks - 1 - k, None) if last else get(grads[i])
                    start = time.perf_counter() - t0
                    x, out = kept.pop(j)
                    out.backward(None if last else grad.to(device))
                    synchronize(device)
                    events.append((i, j, 'B', start, time.perf_counter() - t0))
                    if i > 0:
                        grads[i - 1].put((j, x.grad))
        except _Abort:
            pass
        except Exception as e:  # re-raised in the caller's thread below
            errors.append((i, e))
            failed.set()

    threads = [threading.Thread(target=run_stage, args=(i,), name=f'stage-{i}') for i in range(p)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except BaseException:  # an interrupt: make every stage stop at its next wait
        failed.set()
        raise
    if errors:
        i, e = errors[0]
        raise RuntimeError(f'gpipe_step: stage {i} on {model.devices[i]} failed: '
                           f'{type(e).__name__}: {e}') from e
    return float(sum(l.item() for l in losses)), sorted(events, key=lambda e: (e[3], e[0]))


def pipeline_schedule(num_stages, num_microbatches, t_forward=1, t_backward=1):
    """Simulate GPipe clock tick by clock tick; return its events like gpipe_step's.

    Each stage works through its program in order: forward of micro-batches
    0..m-1, then backward of m-1..0. A task starts at the first tick at which
    its stage is free and its input has arrived: forward (i, j) needs forward
    (i-1, j), backward (i, j) needs backward (i+1, j).
    """
    for value, name in [(num_stages, 'num_stages'), (num_microbatches, 'num_microbatches'),
                        (t_forward, 't_forward'), (t_backward, 't_backward')]:
        positive_int(value, f'pipeline_schedule: {name}')
    p, m = num_stages, num_microbatches
    programs = [[(i, j, 'F') for j in range(m)] + [(i, j, 'B') for j in reversed(range(m))]
                for i in range(p)]
    duration = {'F': t_forward, 'B': t_backward}
    done, events = {}, []
    pointer, free_at = [0] * p, [0] * p
    tick = 0
    while any(pointer[i] < len(programs[i]) for i in range(p)):
        for i in range(p):
            if pointer[i] == len(programs[i]) or free_at[i] > tick:
                continue
            _, j, phase = task = programs[i][pointer[i]]
            source = (i - 1, j, 'F') if phase == 'F' else (i + 1, j, 'B')
            if 0 <= source[0] < p and done.get(source, tick + 1) > tick:
                continue  # the input has not arrived yet: this stage idles this tick
            end = tick + duration[phase]
            done[task], free_at[i] = end, end
            events.append((i, j, phase, tick, end))
            pointer[i] += 1
        tick += 1
    return events


def bubble_fraction(num_stages, num_microbatches):
    """Return the idle share of a GPipe schedule, (p-1)/(m+p-1)."""
    positive_int(num_stages, 'bubble_fraction: num_stages')
    positive_int(num_microbatches, 'bubble_fraction: num_microbatches')
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


def idle_fraction(events, num_stages):
    """Return the share of stage time spent idle between the first start and the last end."""
    if not events:
        raise ValueError('idle_fraction: no events')
    positive_int(num_stages, 'idle_fraction: num_stages')
    span = max(e[4] for e in events) - min(e[3] for e in events)
    if span <= 0:
        raise ValueError('idle_fraction: the events span no time (every end equals the first start)')
    busy = sum(e[4] - e[3] for e in events)
    return 1 - busy / (num_stages * span)


def schedule_problems(events, num_stages, num_microbatches):
    """Return what is wrong with a pipeline schedule (an empty list if nothing).

    Checks that every task runs once, that no stage runs two tasks at a time,
    and that no task starts before its input was ready.
    """
    tasks = {}
    problems = []
    for i, j, phase, start, end in events:
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
    if not isinstance(optimizer_states, int) or optimizer_states < 0:
        raise ValueError(f'memory_footprint: optimizer_states must be an int >= 0, got '
                         f'{optimizer_states!r}')
    params = list(net.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    param_storages = {p.untyped_storage().data_ptr() for p in params}
    saved = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in param_storages:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(X)  # the graph keeps saved tensors alive until forward ends: no pointer is reused
    return {'parameters': param_bytes, 'gradients': param_bytes,
            'optimizer': optimizer_states * param_bytes, 'activations': sum(saved.values())}
