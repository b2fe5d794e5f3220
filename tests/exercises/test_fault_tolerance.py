"""Notebook 16's checker, check_checkpoint_interval: wrong intervals fail with a hint."""

import math

import pytest

from d2lpar import exercises

from .reference import SEEDS


@pytest.mark.parametrize(
    'wrong',
    [
        lambda C, M: math.sqrt(C * M),
        lambda C, M: 2 * C * M,
        lambda C, M: math.sqrt(2 * M / C),
        lambda C, M: M / 2,
        lambda C, M: 1.3 * math.sqrt(2 * C * M),
    ],
)
def test_wrong_checkpoint_intervals_fail(wrong):
    for seed in SEEDS:
        verdict = exercises.check_checkpoint_interval(wrong, seed=seed)
        assert verdict.attempted and not verdict.passed, verdict
        assert 'Hint' in verdict.message
