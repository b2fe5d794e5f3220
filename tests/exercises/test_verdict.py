"""What every checker promises (d2lpar/exercises/_verdict.py): the reference solution passes, a stub is
"not attempted yet", an answer that raises or returns nonsense becomes a verdict, the global random state
is left alone."""

import random

import pytest
import torch

from d2lpar import exercises

from .reference import CHECKS, SEEDS, solution


def ids(check):
    return check.__name__


@pytest.mark.parametrize('check', CHECKS, ids=ids)
def test_reference_solution_passes(check):
    fn = solution(*CHECKS[check])
    for seed in SEEDS:
        verdict = check(fn, seed=seed)
        assert verdict.passed and verdict.attempted, verdict
        assert verdict.status == 'passed' and 'passed' in str(verdict)


def stub(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.parametrize('check', CHECKS, ids=ids)
def test_stub_is_not_attempted(check):
    verdict = check(stub)
    assert not verdict.passed and not verdict.attempted, verdict
    assert 'not attempted yet' in str(verdict)


@pytest.mark.parametrize('check', CHECKS, ids=ids)
def test_a_function_that_raises_becomes_the_verdict(check):
    def broken(*args, **kwargs):
        raise ZeroDivisionError('oops in the learner code')

    verdict = check(broken)
    assert not verdict.passed and verdict.attempted
    assert 'ZeroDivisionError: oops in the learner code' in verdict.message


@pytest.mark.parametrize('check', CHECKS, ids=ids)
@pytest.mark.parametrize('answer', [None, 42, object, lambda *a, **k: object(), lambda *a, **k: [[('x', 'y')]]])
def test_odd_answers_fail_without_raising(check, answer):
    verdict = check(answer)
    assert not verdict.passed and verdict.attempted and verdict.message, verdict


def test_checking_leaves_the_global_random_state_alone():
    def draw():
        return torch.rand(3).tolist(), random.random()

    torch.manual_seed(0), random.seed(0)
    expected = draw()
    torch.manual_seed(0), random.seed(0)
    for check in CHECKS:
        check(solution(*CHECKS[check]))
    assert draw() == expected


def test_verdict_rejects_an_unknown_status():
    with pytest.raises(ValueError, match='status'):
        exercises.Verdict('x', 'maybe', '')
