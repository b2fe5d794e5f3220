"""Checker of notebook 16: the checkpoint interval that wastes the least time."""

import math

from ..fault_tolerance import expected_waste
from ._verdict import _Fail, _call, _checker

# Near its minimum the expected waste is flat: Young's rule, a first-order answer, wastes
# at most ~0.3% more than the exact optimum on these cases (C/M below 0.03), and an interval
# 10% off the optimum about 0.5% more. The usual mistakes (sqrt(C*M), 2*C*M, sqrt(M/C)...)
# waste 6% more or far worse. An answer passes within 1% of the best expected waste.
SLACK = 1.01


def _hint(answer, checkpoint_cost, mtbf):
    best = math.sqrt(2 * checkpoint_cost * mtbf)
    for name, value in [
        ('sqrt(C * M)', math.sqrt(checkpoint_cost * mtbf)),
        ('2 * C * M', 2 * checkpoint_cost * mtbf),
        ('sqrt(2 * M / C)', math.sqrt(2 * mtbf / checkpoint_cost)),
        ('M / 2', mtbf / 2),
        ('C', checkpoint_cost),
    ]:
        if math.isclose(answer, value, rel_tol=1e-6):
            return (
                f'your interval equals {name}. Write the waste per second as C / T (writing '
                'checkpoints) plus T / (2 M) (on average half an interval is lost per '
                'failure, one failure every M seconds), and set its derivative to zero.'
            )
    if answer < best:
        return 'your interval is too short: you spend more time writing checkpoints than you save in lost work.'
    return 'your interval is too long: each failure throws away too much work.'


@_checker('checkpoint_interval(checkpoint_cost, mtbf)', 'checkpoint_interval')
def check_checkpoint_interval(checkpoint_interval, rng):
    """Check `checkpoint_interval`: the interval that minimises the time lost to failures.

    For several checkpoint costs C and mean times between failures M (seconds), the
    expected fraction of time the answer wastes (failures at random, `expected_waste`, which
    notebook 16 checks against a simulation) is compared with the least waste of any
    interval, found on a fine grid.
    """
    cases = [(rng.uniform(10, 120), rng.uniform(2, 24) * 3600) for _ in range(3)]
    cases.append((rng.uniform(1, 5), rng.uniform(0.2, 1) * 3600))  # cheap checkpoints, often
    for k, (C, M) in enumerate(cases):
        case = f'checkpoint cost C={C:.1f} s, mean time between failures M={M:.0f} s'
        answer = _call(checkpoint_interval, (C, M), case, first=k == 0)
        if isinstance(answer, bool) or not isinstance(answer, (int, float)):
            raise _Fail(f'{case}: return the interval in seconds as a number, got {type(answer).__name__}.')
        if not (math.isfinite(answer) and answer > 0):
            raise _Fail(f'{case}: the interval must be a positive number of seconds, got {answer}.')
        restart = rng.uniform(0, 2) * C
        grid = [math.sqrt(2 * C * M) * 2 ** (i / 64) for i in range(-96, 97)]
        best = min(expected_waste(T, C, M, restart) for T in grid)
        ours = expected_waste(answer, C, M, restart)
        if ours > SLACK * best:
            raise _Fail(
                f'{case}: your interval of {answer:.0f} s wastes {ours:.2%} of the time; '
                f'the best interval wastes {best:.2%}. Hint: {_hint(answer, C, M)}'
            )
    return (
        'your interval wastes as little time as the best one when failures come at random: Young\'s rule, sqrt(2 C M).'
    )
