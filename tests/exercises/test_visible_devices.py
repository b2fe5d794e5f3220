"""Notebook 2's checker, check_visible_count: wrong answers get their hint."""

import pytest

import d2lpar
from d2lpar import exercises

from .reference import assert_rejected, wrong_ids


def counts_entries(mask, num_gpus):
    return num_gpus if mask is None else (0 if mask == '' else len(mask.split(',')))


def reads_digits_only(mask, num_gpus):
    """Count entries up to the first one that is not all digits (misses ' 1' and '1gpu')."""
    if mask is None:
        return num_gpus
    seen = []
    for entry in mask.split(','):
        if not entry.isdigit() or int(entry) >= num_gpus:
            break
        if int(entry) in seen:
            return 0
        seen.append(int(entry))
    return len(seen)


def no_range_check(mask, num_gpus):
    return num_gpus if mask is None else len(d2lpar.parse_visible_devices(mask))


def ignores_repeats(mask, num_gpus):
    if mask is None:
        return num_gpus
    seen = []
    for entry in mask.split(','):
        if not entry.isdigit() or int(entry) >= num_gpus:
            break
        seen.append(int(entry))
    return len(seen)


WRONG = [
    (exercises.check_visible_count, counts_entries, "'-1' is not a GPU"),
    (exercises.check_visible_count, no_range_check, 'the machine does not have'),
    (exercises.check_visible_count, ignores_repeats, 'listed twice'),
    (exercises.check_visible_count, reads_digits_only, 'strtoul'),
]


@pytest.mark.parametrize('check,answer,hint', WRONG, ids=wrong_ids(WRONG))
def test_wrong_answer_fails_with_its_hint(check, answer, hint):
    assert_rejected(check, answer, hint)
