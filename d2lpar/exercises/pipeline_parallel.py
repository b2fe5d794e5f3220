"""Checker of notebook 14: which stages each rank holds under interleaved and V-shaped schedules."""

from ._verdict import _call, _checker, _Fail

_RULE = (
    "'loop': rank r holds stages r, r + p, r + 2p, ... (one stage per lap around the ranks); "
    "'v' (v = 2): rank r holds stage r on the way down and 2p - 1 - r on the way back"
)


def _want(rank, p, v, style):
    if style == 'loop':
        return [rank + k * p for k in range(v)]
    return [rank, 2 * p - 1 - rank]


@_checker('interleaved_stages(rank, p, v, style)', 'interleaved_stages')
def check_interleaved_stages(interleaved_stages, rng):
    """Check the stage indices of every rank for the 'loop' and 'v' placements.

    The reference is the placement ScheduleInterleaved1F1B (loop) and
    ScheduleZBVZeroBubble (V, two stages per rank) expect; every stage must be
    held by exactly one rank.
    """
    cases = [(p, v, 'loop') for p in (1, 2, 3, 4) for v in (1, 2, 3)] + [(p, 2, 'v') for p in (1, 2, 3, 4)]
    cases += [(rng.randint(2, 8), rng.randint(2, 4), 'loop'), (rng.randint(2, 8), 2, 'v')]
    for k, (p, v, style) in enumerate(cases):
        got = {}
        for rank in range(p):
            case = f'interleaved_stages(rank={rank}, p={p}, v={v}, style={style!r})'
            result = _call(interleaved_stages, (rank, p, v, style), case, first=k == 0 and rank == 0, hint=_RULE)
            try:
                got[rank] = [int(i) for i in result]
            except (TypeError, ValueError):
                raise _Fail(f'{case}: return a list of {v} stage indices (ints), got {result!r:.60}') from None
            want = _want(rank, p, v, style)
            if got[rank] == want:
                continue
            if sorted(got[rank]) == want:
                raise _Fail(
                    f'{case}: the right stages, in another order: {got[rank]}. Hint: list '
                    'them in the order the data reaches them, first stage first.'
                )
            if style == 'loop' and got[rank] == [rank * v + i for i in range(v)]:
                raise _Fail(
                    f'{case}: {got[rank]} gives each rank {v} neighbouring stages: the data would '
                    'stay on one rank and no other could work meanwhile. Hint: ' + _RULE
                )
            if style == 'v' and got[rank] == [rank, rank + p]:
                raise _Fail(f'{case}: {got[rank]} is the loop placement. Hint: ' + _RULE)
            raise _Fail(f'{case}: expected {want}, got {got[rank]}. Hint: ' + _RULE)
        held = sorted(i for stages in got.values() for i in stages)
        if held != list(range(p * v)):
            raise _Fail(f'p={p}, v={v}, {style!r}: the ranks hold stages {held}, not each of 0..{p * v - 1} once.')
    return f'all {len(cases)} placements match the schedules\' stage layouts.'
