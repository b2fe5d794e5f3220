"""Notebook 18's checker, check_choose_layout: wrong answers get their hint on every seed."""

import pytest

from d2lpar import exercises

from .reference import SEEDS


def _search(key):
    from d2lpar.exercises.capstone import _layouts, predict_layout

    def choose(cfg, gpus, num_seqs, seq_len, memory_limit):
        return min(_layouts(cfg, gpus, num_seqs), key=lambda l: predict_layout(cfg, gpus, num_seqs, seq_len, l)[key])

    return choose


def choose_ignoring_memory(*args):
    return _search('step_s')(*args)  # the fastest, fits or not


def choose_least_memory(*args):
    return _search('peak')(*args)  # fits, but not the fastest


def choose_all_fsdp(cfg, gpus, *args):
    return dict(fsdp=gpus)


def choose_wrong_product(cfg, gpus, *args):
    return dict(fsdp=gpus, tp=2)


def choose_list(cfg, gpus, *args):
    return [1, gpus, 1]


@pytest.mark.parametrize(
    'wrong, hints',
    [
        (choose_ignoring_memory, ('more than the limit',)),
        (choose_least_memory, ('fits but its step takes',)),
        (choose_all_fsdp, ('more than the limit', 'fits but its step takes')),
        (choose_wrong_product, ('is no layout',)),
        (choose_list, ('return a dict',)),
    ],
    ids=lambda x: getattr(x, '__name__', None),
)
def test_choose_layout_wrong_answers_get_their_hint(wrong, hints):
    failed = 0
    for seed in SEEDS:
        verdict = exercises.check_choose_layout(wrong, seed=seed)
        if not verdict.passed:
            assert verdict.attempted and any(h in verdict.message for h in hints), verdict
            failed += 1
    assert failed == len(SEEDS)  # six cases per seed: a wrong rule is caught on every seed
