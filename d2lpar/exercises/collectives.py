"""Checker of notebook 9: a tree broadcast schedule."""

import math

from ._verdict import _call, _checker, _Fail


def _rounds(schedule, case):
    """Return the schedule as a list of rounds of (sender, receiver) int pairs, or _Fail."""
    problem = (
        f'{case} returned {schedule!r:.120}; return a list of rounds, each a list of '
        '(sender, receiver) pairs, e.g. [[(0, 1)], [(0, 2), (1, 3)]].'
    )
    if isinstance(schedule, (str, bytes)) or not hasattr(schedule, '__iter__'):
        raise _Fail(problem)
    rounds = []
    for r in schedule:
        if isinstance(r, (str, bytes)) or not hasattr(r, '__iter__'):
            raise _Fail(problem)
        pairs = []
        for pair in r:
            if (
                not isinstance(pair, (tuple, list))
                or len(pair) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair)
            ):
                raise _Fail(problem)
            pairs.append(tuple(pair))
        if pairs:  # an empty round sends nothing and costs nothing
            rounds.append(pairs)
    return rounds


@_checker('broadcast_schedule(n, src)', 'broadcast_schedule')
def check_broadcast_schedule(broadcast_schedule, rng):
    """Check `broadcast_schedule(n, src)`: rounds of (sender, receiver) pairs of a tree broadcast.

    Rank `src` starts with the data. In a round every rank sends at most one
    message and receives at most one, and only a rank that has the data may
    send it. After the last round every rank has it, in ceil(log2 n) rounds,
    the fewest possible (the number of ranks holding it can at most double per
    round). The reference is that hand calculation and a simulation of the rounds.
    """
    cases = [(1, 0), (2, 0), (2, 1), (4, 0), (5, 0), (6, 3), (7, 6), (8, 5), (16, 0)]
    cases += [(n, rng.randrange(n)) for n in (rng.randint(3, 40) for _ in range(5))]
    for k, (n, src) in enumerate(cases):
        case = f'broadcast_schedule({n}, src={src})'
        rounds = _rounds(_call(broadcast_schedule, (n, src), case, first=k == 0), case)
        have = {src}
        for r, pairs in enumerate(rounds, 1):
            senders = [s for s, _ in pairs]
            receivers = [d for _, d in pairs]
            for s, d in pairs:
                if not (0 <= s < n and 0 <= d < n) or s == d:
                    raise _Fail(
                        f'{case}, round {r}: ({s}, {d}) is not a message between two different ranks of 0..{n - 1}.'
                    )
                if s not in have:
                    hint = (
                        'work with ranks relative to the source, (rank - src) % n, and '
                        'map back with (relative + src) % n.'
                        if src
                        else 'data received in a round can be sent on from the next round on.'
                    )
                    raise _Fail(
                        f'{case}, round {r}: rank {s} sends before it has the data '
                        f'(holders before this round: {sorted(have)}). Hint: {hint}'
                    )
            busy = next((x for x in senders if senders.count(x) > 1), None)
            if busy is not None:
                raise _Fail(
                    f'{case}, round {r}: rank {busy} sends {senders.count(busy)} '
                    'messages. Hint: a rank has one link, so a round is one message '
                    'time and each rank sends at most one message per round; '
                    'sending to everyone from src takes n - 1 rounds.'
                )
            twice = next((x for x in receivers if receivers.count(x) > 1), None)
            if twice is not None:
                raise _Fail(f'{case}, round {r}: rank {twice} receives more than one message.')
            already = [d for d in receivers if d in have]
            if already:
                raise _Fail(f'{case}, round {r}: rank {already[0]} already has the data; that message is wasted.')
            have |= set(receivers)
        missing = sorted(set(range(n)) - have)
        if missing:
            raise _Fail(
                f'{case}: ranks {missing[:8]} never get the data. Hint: when n is not a '
                'power of two, the last round only reaches the ranks that remain; '
                'skip partners >= n rather than stopping early.'
            )
        best = math.ceil(math.log2(n)) if n > 1 else 0
        if len(rounds) != best:
            raise _Fail(
                f'{case}: every rank gets the data, but in {len(rounds)} rounds; a tree '
                f'needs {best}. Hint: in each round every rank that has the data sends '
                'it to one that does not, so the holders double.'
            )
    return (
        f'{len(cases)} broadcasts (1 to 40 ranks, any source) reach every rank in '
        'ceil(log2 n) rounds, with one message per rank and round.'
    )
