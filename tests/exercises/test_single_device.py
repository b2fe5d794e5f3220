"""Notebook 1's checker, check_pick_device: wrong answers get their hint."""

import pytest
import torch

from d2lpar import exercises

from .reference import assert_rejected, wrong_ids


def off_by_one(i, num_gpus):
    if 0 <= i <= num_gpus:
        return torch.device('cuda', i)
    raise ValueError(f'GPU {i} does not exist; there are {num_gpus}')


def falls_back_to_cpu(i, num_gpus):
    return torch.device('cuda', i) if 0 <= i < num_gpus else torch.device('cpu')


def accepts_negative(i, num_gpus):
    if i < num_gpus:
        return torch.device('cuda', i)
    raise ValueError(f'GPU {i} does not exist; there are {num_gpus}')


def unexplained(i, num_gpus):
    if isinstance(i, int) and 0 <= i < num_gpus:
        return torch.device('cuda', i)
    raise ValueError('bad index')


def names_only_the_index(i, num_gpus):
    if isinstance(i, int) and 0 <= i < num_gpus:
        return torch.device('cuda', i)
    raise ValueError(f'GPU {i!r} does not exist')


WRONG = [
    (exercises.check_pick_device, off_by_one, 'off-by-one'),
    (exercises.check_pick_device, falls_back_to_cpu, 'fell back to the CPU'),
    (exercises.check_pick_device, accepts_negative, 'negative indices'),
    (exercises.check_pick_device, unexplained, 'how many GPUs'),
    (exercises.check_pick_device, names_only_the_index, 'how many GPUs'),
]


@pytest.mark.parametrize('check,answer,hint', WRONG, ids=wrong_ids(WRONG))
def test_wrong_answer_fails_with_its_hint(check, answer, hint):
    assert_rejected(check, answer, hint)
