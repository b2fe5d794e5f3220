"""Notebook 9's checker, check_broadcast_schedule: wrong answers get their hint; the reference is the
fastest possible tree."""

import math

import pytest

from d2lpar import exercises

from .reference import assert_rejected, solution, wrong_ids


def linear_one_round(n, src):
    return [[(src, d) for d in range(n) if d != src]] if n > 1 else []


def linear_rounds(n, src):
    return [[(src, d)] for d in range(n) if d != src]


def ignores_src(n, src):
    rounds, step = [], 1
    while step < n:
        rounds.append([(r, r + step) for r in range(step) if r + step < n])
        step *= 2
    return rounds


def powers_of_two_only(n, src):
    return [[((r + src) % n, (r + 2**k + src) % n) for r in range(2**k)] for k in range(int(math.log2(n)))]


WRONG = [
    (exercises.check_broadcast_schedule, linear_one_round, 'one link'),
    (exercises.check_broadcast_schedule, linear_rounds, 'holders double'),
    (exercises.check_broadcast_schedule, ignores_src, 'relative to the source'),
    (exercises.check_broadcast_schedule, powers_of_two_only, 'never get the data'),
]


@pytest.mark.parametrize('check,answer,hint', WRONG, ids=wrong_ids(WRONG))
def test_wrong_answer_fails_with_its_hint(check, answer, hint):
    assert_rejected(check, answer, hint)


def test_the_tree_broadcast_is_the_fastest_possible():
    # The reference bound: holders can at most double per round.
    for n in range(1, 70):
        rounds = solution('09_collectives', 'broadcast_schedule')(n, 0)
        assert len(rounds) == (math.ceil(math.log2(n)) if n > 1 else 0)
