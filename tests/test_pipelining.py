"""d2lpar.pipelining (notebook 14): replaying a schedule's order gives its formula's bubble."""

import pytest

from d2lpar.pipelining import interleaved_bubble, replay


def idle(events, p):
    span = max(e[5] for e in events) - min(e[4] for e in events)
    return 1 - sum(e[5] - e[4] for e in events) / (p * span)


def recorded(orders):
    """Events from each rank's task order, with made-up times that respect the order across ranks."""
    events, t = [], 0
    for rank, i, j, phase in orders:
        events.append((rank, i, j, phase, t, t + 1))
        t += 1
    return events


def gpipe_order(p, m):
    order = [(i, i, j, 'F') for i in range(p) for j in range(m)]  # stage i on rank i, forward ripples
    return order + [(i, i, j, 'B') for i in reversed(range(p)) for j in range(m)]


@pytest.mark.parametrize('p, m', [(2, 1), (2, 4), (3, 5), (4, 8)])
def test_replayed_gpipe_has_the_formula_bubble(p, m):
    events = replay(recorded(gpipe_order(p, m)))
    assert abs(idle(events, p) - interleaved_bubble(p, m)) < 1e-12
    assert abs(interleaved_bubble(p, m) - (p - 1) / (m + p - 1)) < 1e-12


def test_replay_waits_for_inputs_and_for_its_rank():
    events = replay(recorded(gpipe_order(2, 2)))
    times = {(i, j, phase): (start, end) for _, i, j, phase, start, end in events}
    assert times[(1, 0, 'F')][0] == times[(0, 0, 'F')][1]  # stage 1 waits for stage 0's output
    assert times[(1, 0, 'B')][0] == times[(1, 1, 'F')][1]  # the last stage: after its forwards
    assert times[(0, 0, 'B')][0] == times[(1, 0, 'B')][1]  # stage 0 waits for stage 1's gradient
    assert times[(1, 0, 'B')][1] - times[(1, 0, 'B')][0] == 2  # a whole backward: twice forward


def test_a_split_backward_lets_weight_passes_wait():
    # Two stages, one micro-batch: I of stage 1 unblocks stage 0 at once; W runs afterwards.
    order = [(0, 0, 0, 'F'), (1, 1, 0, 'F'), (1, 1, 0, 'I'), (0, 0, 0, 'I'), (1, 1, 0, 'W'), (0, 0, 0, 'W')]
    times = {(i, phase): (s, e) for _, i, _, phase, s, e in replay(recorded(order))}
    assert times[(0, 'I')][0] == times[(1, 'I')][1] == 3  # not after stage 1's W
    assert times[(1, 'W')] == (3, 4)


def test_interleaved_bubble_shrinks_with_v():
    assert interleaved_bubble(4, 8, 2) < interleaved_bubble(4, 8, 1)
    assert abs(interleaved_bubble(4, 8, 2) - 3 / 19) < 1e-12


@pytest.mark.parametrize(
    'call, match',
    [
        (lambda: replay([]), 'replay: no events'),
        (lambda: replay([(0, 0, 0, 'X', 0, 1)]), "replay: each event"),
        (lambda: replay([(0, 0, 'F', 0, 1)]), "replay: each event"),
        (lambda: replay([(0, 0, 0, 'F', 0, 1)], v=0), 'replay: v'),
        (lambda: interleaved_bubble(0, 4), 'interleaved_bubble: p'),
        (lambda: interleaved_bubble(2, 4, v=1.5), 'interleaved_bubble: v'),
    ],
)
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()
