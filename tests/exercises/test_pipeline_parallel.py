"""Notebook 14's checker, check_interleaved_stages: wrong answers get their hint."""

import pytest

from d2lpar import exercises

from .reference import SEEDS, solution


def stages_contiguous(rank, p, v, style):
    return [rank * v + i for i in range(v)]


def stages_reversed(rank, p, v, style):
    return list(reversed([rank + k * p for k in range(v)])) if style == 'loop' else [2 * p - 1 - rank, rank]


def stages_loop_for_v(rank, p, v, style):
    return [rank + k * p for k in range(v)]


def stages_off_by_one(rank, p, v, style):
    return [rank + k * p for k in range(v)] if style == 'loop' else [rank, 2 * p - rank]


@pytest.mark.parametrize(
    'wrong, hint',
    [
        (stages_contiguous, 'neighbouring stages'),
        (stages_reversed, 'in another order'),
        (stages_loop_for_v, 'is the loop placement'),
        (stages_off_by_one, "'v' (v = 2): rank r holds stage r"),
    ],
    ids=lambda x: getattr(x, '__name__', None),
)
def test_interleaved_stages_wrong_answers_get_their_hint(wrong, hint):
    for seed in SEEDS:
        verdict = exercises.check_interleaved_stages(wrong, seed=seed)
        assert verdict.attempted and not verdict.passed and hint in verdict.message, verdict


def test_interleaved_stages_reference_matches_what_the_schedules_accept():
    """The reference's placements are the ones torch's schedules ran in notebook 14's script."""
    fn = solution('14_pipeline_parallel', 'interleaved_stages')
    assert [fn(r, 2, 2, 'loop') for r in range(2)] == [[0, 2], [1, 3]]  # the script's r, r + p
