"""Pipeline schedules with torch.distributed.pipelining, timed and replayed (notebook 13).

A stand-in device at the end of every stage keeps it busy a fixed time per
micro-batch, so the schedules' timelines do not depend on the machine's speed;
`split_backward` records a stage's backward as one task ('B') or, when a
zero-bubble schedule splits it, as its input part ('I') and its weight part
('W'). `replay` runs the order the ranks recorded again with ideal task times
and no communication, so that a schedule's own bubble can be compared with its
formula. The algorithms are written in notebook 13's cells (marked `#@save`)
and are the same code here; argument checks run first, in `@checked`.
"""
import math
import time

import torch
from torch import nn

from ._checks import checked, positive_int

__all__ = ['Busy', 'StandInDevice', 'split_backward', 'interleaved_bubble', 'replay']


def _check_bubble(p, m, v=1):
    for name, value in (('p', p), ('m', m), ('v', v)):
        positive_int(value, f'interleaved_bubble: {name}')


def _check_replay(events, v=1):
    positive_int(v, 'replay: v')
    if isinstance(events, (str, bytes, torch.Tensor)) or not hasattr(events, '__iter__'):
        raise TypeError(f'replay: events must be a list of (rank, stage, micro-batch, phase, start, '
                        f'end), got {type(events).__name__}')
    events = list(events)
    for event in events:
        if not (isinstance(event, (tuple, list)) and len(event) == 6 and event[3] in ('F', 'B', 'I', 'W')
                and all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in event[:3])
                and all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
                        for t in event[4:])):
            raise ValueError('replay: each event must be (rank, stage, micro-batch, phase, start, '
                             f"end) with phase 'F', 'B', 'I' or 'W', got {event!r:.80}")
    if not events:
        raise ValueError('replay: no events')
    return (events, v), {}


class Busy(torch.autograd.Function):
    """Return a copy of X after the stand-in's forward time; its backward takes `units` more."""

    @staticmethod
    def forward(ctx, X, device):
        ctx.device, ctx.j = device, device.forwards
        device.forwards += 1
        device.busy('F', ctx.j, 1)
        return X.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.device.busy(ctx.device.backward_phase, ctx.j, ctx.device.backward_units)
        return grad, None


class StandInDevice(nn.Module):
    """Keep a stage busy a fixed time per micro-batch; record (stage, j, phase, start, end)."""

    def __init__(self, stage, seconds):
        super().__init__()
        self.stage, self.seconds = stage, seconds
        self.reset()

    def reset(self):
        self.events, self.forwards = [], 0
        self.backward_phase, self.backward_units = 'B', 2  # a whole backward: twice forward

    def busy(self, phase, j, units):
        start = time.time()  # one clock for all processes of this machine
        time.sleep(units * self.seconds)
        self.events.append((self.stage, j, phase, start, time.time()))

    def forward(self, X):
        return Busy.apply(X, self)


def split_backward(stage, device):
    """Make `stage`'s backward record 'B' (whole), or 'I' and 'W' when a schedule splits it.

    torch skips the first stage's I (nobody waits for its input's gradient) and runs its whole
    backward in the W slot, recorded there as 'B'.
    """
    whole, weights = stage.backward_one_chunk, stage.backward_weight_one_chunk

    def backward_one_chunk(j, *args, full_backward=True, **kwargs):
        device.backward_phase, device.backward_units = ('B', 2) if full_backward else ('I', 1)
        return whole(j, *args, full_backward=full_backward, **kwargs)

    def backward_weight_one_chunk(j, *args, **kwargs):
        if stage.is_first:  # its I was skipped: the whole backward runs now
            device.backward_phase, device.backward_units = 'B', 2
            return weights(j, *args, **kwargs)
        result = weights(j, *args, **kwargs)
        start = time.time()
        time.sleep(device.seconds)  # the weight gradient: the other half of backward
        device.events.append((device.stage, j, 'W', start, time.time()))
        return result

    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


@checked(_check_bubble)
def interleaved_bubble(p, m, v=1):
    """Idle share of p ranks running m micro-batches through v stages each (1F1B, interleaved)."""
    return (p - 1) / (v * m + p - 1)


@checked(_check_replay)
def replay(events, v=1):
    """Rerun the recorded order with ideal times (F 1, B 2, I 1, W 1, over v); return events.

    `events`: (rank, stage, micro-batch, phase, start, end). Each rank keeps its order;
    a task starts when its rank is free and its input is ready: F after F of the stage
    before, B or I after B or I of the stage after (the last stage: after its F), W
    after I. Communication takes no time.
    """
    units = {'F': 1, 'B': 2, 'I': 1, 'W': 1}
    last = max(e[1] for e in events)
    done, free, out = {}, {}, []
    for rank, i, j, phase, _, _ in sorted(events, key=lambda e: e[4]):
        if phase == 'F':
            ready = done.get((i - 1, j, 'F'), 0)
        elif phase == 'W':
            ready = done[(i, j, 'I')]
        else:
            ready = done[(i, j, 'F')] if i == last else max(
                done.get((i + 1, j, 'B'), 0), done.get((i + 1, j, 'I'), 0))
        start = max(free.get(rank, 0), ready)
        end = done[(i, j, phase)] = free[rank] = start + units[phase] / v
        out.append((rank, i, j, phase, start, end))
    return out
