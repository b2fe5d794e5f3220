"""Notebook 4's checker, check_unbalanced_bubble: wrong answers get their hint, the reference agrees
with d2lpar's schedule and the hand formula."""

import math
import random

import pytest

import d2lpar
from d2lpar import exercises

from .reference import assert_rejected, solution, wrong_ids


def unbalanced(times, m):
    return solution('04_model_parallel', 'unbalanced_bubble')(times, m)


def equal_stage_bubble(times, m):
    return (len(times) - 1) / (m + len(times) - 1)


def slowest_everywhere(times, m):
    return 1 - m * sum(times) / (len(times) * max(times) * (m + len(times) - 1))


WRONG = [
    (exercises.check_unbalanced_bubble, equal_stage_bubble, 'the slowest one sets the pace'),
    (exercises.check_unbalanced_bubble, slowest_everywhere, 'not p times the slowest'),
    (exercises.check_unbalanced_bubble, lambda t, m: 1 - unbalanced(t, m), 'busy share'),
    (exercises.check_unbalanced_bubble, lambda t, m: 100 * unbalanced(t, m), 'percentage'),
]


@pytest.mark.parametrize('check,answer,hint', WRONG, ids=wrong_ids(WRONG))
def test_wrong_answer_fails_with_its_hint(check, answer, hint):
    assert_rejected(check, answer, hint)


def test_bubble_reference_agrees_with_d2lpar_and_the_hand_formula():
    from d2lpar.exercises.model_parallel import _gpipe_idle

    for p in range(1, 6):
        for m in range(1, 9):
            for t_backward in (1, 2, 3):
                events = d2lpar.pipeline_schedule(p, m, t_forward=1, t_backward=t_backward)
                assert math.isclose(
                    _gpipe_idle([1.0] * p, m, t_backward), d2lpar.idle_fraction(events, p), abs_tol=1e-12
                )
    rng = random.Random(0)
    for _ in range(200):
        times = [rng.uniform(0.5, 3) for _ in range(rng.randint(1, 6))]
        m, backward = rng.randint(1, 30), rng.uniform(0.5, 3)
        span = sum(times) + (m - 1) * max(times)
        assert math.isclose(_gpipe_idle(times, m, backward), 1 - m * sum(times) / (len(times) * span), abs_tol=1e-12)
