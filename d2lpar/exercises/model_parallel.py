"""Checker of notebook 4: the bubble of an unbalanced pipeline."""

import math

from ._verdict import _call, _checker, _Fail


def _gpipe_idle(stage_times, m, backward=1.0):
    """Return the idle share of GPipe with stage i taking stage_times[i] per forward, simulated.

    Forward: micro-batch j enters stage i when stage i-1 has finished it and
    stage i has finished j-1. Backward runs the other way, in the order
    m-1 .. 0, each task taking `backward` times the stage's forward time.
    """
    p = len(stage_times)
    done = [0.0] * p  # when stage i finished its latest task
    for j in range(m):
        for i, t in enumerate(stage_times):
            done[i] = max(done[i], done[i - 1] if i else 0.0) + t
    for j in range(m):
        for i in reversed(range(p)):
            done[i] = max(done[i], done[i + 1] if i + 1 < p else 0.0) + backward * stage_times[i]
    busy = (1 + backward) * m * sum(stage_times)
    return 1 - busy / (p * max(done))


_WRONG_BUBBLES = (
    (
        lambda t, m: (len(t) - 1) / (m + len(t) - 1),
        'that is the bubble of equal stages, (p-1)/(m+p-1): with unequal stages the slowest one '
        'sets the pace and the others wait for it.',
    ),
    (
        lambda t, m: 1 - m * sum(t) / (len(t) * max(t) * (m + len(t) - 1)),
        'filling and draining the pipeline takes sum(stage_times) (each stage its own time), not '
        'p times the slowest; only the m - 1 micro-batches after the first go at the slowest '
        "stage's pace.",
    ),
    (
        lambda t, m: (len(t) - 1) / len(t),
        'that is model parallelism without micro-batches overlapping: one stage works at a time.',
    ),
    (lambda t, m: 1 - _gpipe_idle(t, m), 'that is the busy share; the bubble is the idle share.'),
    (lambda t, m: 100 * _gpipe_idle(t, m), 'return a fraction between 0 and 1, not a percentage.'),
)


@_checker('unbalanced_bubble(stage_times, num_microbatches)', 'unbalanced_bubble')
def check_unbalanced_bubble(unbalanced_bubble, rng):
    """Check `unbalanced_bubble(stage_times, m)`, the idle share of GPipe with unequal stages.

    Stage i needs stage_times[i] per micro-batch forward (and the same, or any
    fixed multiple, backward). The reference is a simulation of the schedule;
    with equal stages it gives (p-1)/(m+p-1), as d2lpar.pipeline_schedule does.
    """
    cases = [
        ([1.0], 4),
        ([1.0] * 4, 4),
        ([1.0] * 4, 1),
        ([1.0, 3.0], 3),
        ([3.0, 1.0, 1.0, 1.0], 8),
        ([2.0, 2.0, 2.0], 16),
    ]
    cases += [
        ([round(rng.uniform(0.5, 3.0), 2) for _ in range(rng.randint(2, 6))], rng.randint(1, 32)) for _ in range(6)
    ]
    for k, (times, m) in enumerate(cases):
        case = f'unbalanced_bubble({times}, {m})'
        got = _call(unbalanced_bubble, (list(times), m), case, first=k == 0)
        expected = _gpipe_idle(times, m)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise _Fail(f'{case} returned {got!r}; return a number between 0 and 1.')
        if not math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9):
            hints = [h for f, h in _WRONG_BUBBLES if math.isclose(got, f(times, m), rel_tol=1e-6, abs_tol=1e-9)]
            hint = ' Or: '.join(hints) or (
                'draw the forward pass: when does the last micro-batch leave the last stage? '
                'The bubble is 1 - busy / (p * span), with each stage busy m * its time per '
                'phase.'
            )
            raise _Fail(
                f'{case} returned {got:.6g}, expected {expected:.6g} '
                f'({len(times)} stage(s), {m} micro-batch(es)). Hint: {hint}'
            )
    return (
        f'{len(cases)} pipelines (1 to 6 stages, equal and unequal stage times, 1 to 32 '
        'micro-batches) match the simulated GPipe schedule.'
    )
