"""Argument checks for the code notebook 14 teaches (d2lpar/lessons/nb14_pipeline_parallel.py).

Each check takes the same arguments as the function it guards and raises a TypeError or
ValueError naming the function and what to do; CHECKS maps the definition's name to it, and
`make lib` writes `@checked(CHECKS[name])` above that definition in the lesson module.
"""

import math

import torch

from d2lpar.checks import positive_int


def _check_bubble(p, m, v=1):
    for name, value in (('p', p), ('m', m), ('v', v)):
        positive_int(value, f'interleaved_bubble: {name}')


def _check_replay(events, v=1):
    positive_int(v, 'replay: v')
    if isinstance(events, (str, bytes, torch.Tensor)) or not hasattr(events, '__iter__'):
        raise TypeError(
            f'replay: events must be a list of (rank, stage, micro-batch, phase, start, '
            f'end), got {type(events).__name__}'
        )
    events = list(events)
    for event in events:
        if not (
            isinstance(event, (tuple, list))
            and len(event) == 6
            and event[3] in ('F', 'B', 'I', 'W')
            and all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in event[:3])
            and all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) for t in event[4:])
        ):
            raise ValueError(
                'replay: each event must be (rank, stage, micro-batch, phase, start, '
                f"end) with phase 'F', 'B', 'I' or 'W', got {event!r:.80}"
            )
    if not events:
        raise ValueError('replay: no events')
    return (events, v), {}


CHECKS = {
    'interleaved_bubble': _check_bubble,
    'replay': _check_replay,
}
