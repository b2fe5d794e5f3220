"""Notebook 17's checker, check_choose_layout: wrong answers get their hint on every seed."""
import pytest

from d2lpar import exercises

from .reference import SEEDS


def _search(key):
    from d2lpar.capstone import layout_cost
    from d2lpar.exercises.capstone import _layouts

    def choose(world_size, num_params, tokens, dim, num_layers, memory_limit):
        return min(_layouts(world_size, num_layers),
                   key=lambda l: layout_cost(l, num_params, tokens, dim, num_layers)[key])
    return choose


def choose_ignoring_memory(*args):
    return _search(0)(*args)  # fewest bytes, fits or not


def choose_least_memory(*args):
    return _search(1)(*args)  # fits, but not the fewest bytes


def choose_all_data_parallel(world_size, *args):
    return dict(dp=world_size)


def choose_wrong_product(world_size, *args):
    return dict(dp=world_size, tp=2)


def choose_list(world_size, *args):
    return [1, 1, 1, world_size]


@pytest.mark.parametrize('wrong, hints', [
    (choose_ignoring_memory, ('more than the limit',)),
    (choose_least_memory, ('fits but sends',)),
    (choose_all_data_parallel, ('more than the limit', 'fits but sends')),
    (choose_wrong_product, ('multiply to',)),
    (choose_list, ('return a dict',)),
], ids=lambda x: getattr(x, '__name__', None))
def test_choose_layout_wrong_answers_get_their_hint(wrong, hints):
    failed = 0
    for seed in SEEDS:
        verdict = exercises.check_choose_layout(wrong, seed=seed)
        if not verdict.passed:
            assert verdict.attempted and any(h in verdict.message for h in hints), verdict
            failed += 1
    assert failed == len(SEEDS)  # six cases per seed: a wrong rule is caught on every seed
