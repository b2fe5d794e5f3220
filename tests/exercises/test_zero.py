"""Notebook 10's checker, check_zero2_hook: wrong answers get their hint, ranks that never meet fail
without hanging."""

import pytest
import torch

import d2lpar.exercises.zero
from d2lpar import exercises

from .reference import solution


def zero2_variant(divide=1, row=0, free=True, per_parameter=False, forget=True):
    """ZeRO-2's hook with one classic mistake: the sum (divide=0), a doubled division
    (divide=2), another rank's row (row=1), full gradients kept, a reduce-scatter per
    parameter, or a count of ready gradients never cleared."""
    from d2lpar.zero import pad_to_shards

    def zero2_hook(bucket, shards, n, rank, reduce_scatter):
        ready = set()

        def reduce(params):
            sizes = [shards[q].numel() for q in params]
            rows = torch.empty(n, sum(sizes))
            for q, columns in zip(params, rows.split(sizes, dim=1)):
                columns.copy_(pad_to_shards(q.grad, n))
                if free:
                    q.grad = None
            reduce_scatter(list(rows))
            for q, grad in zip(params, (rows[(rank + row) % n] / n**divide).split(sizes)):
                shards[q].grad = grad

        def hook(p):
            if per_parameter:
                return reduce([p])
            ready.add(p)
            if len(ready) == len(bucket):
                if forget:
                    ready.clear()
                reduce(bucket)

        return hook

    return zero2_hook


@pytest.mark.parametrize('seed', range(3))
@pytest.mark.parametrize(
    'wrong, hint',
    [
        (zero2_variant(divide=0), 'N = 2 times too large'),
        (zero2_variant(divide=2), 'divided twice'),
        (zero2_variant(row=1), "another rank's shard"),
        (zero2_variant(free=False), 'the peak is not lowered'),
        (zero2_variant(per_parameter=True), 'one per bucket'),
        (zero2_variant(forget=False), 'failed in the second'),
    ],
    ids=['no-division', 'doubled-division', 'wrong-row', 'not-freed', 'per-parameter', 'count-not-cleared'],
)
def test_zero2_hook_wrong_answers_get_their_hint(wrong, hint, seed):
    verdict = exercises.check_zero2_hook(wrong, seed=seed)
    assert not verdict.passed and verdict.attempted and hint in verdict.message, verdict


def test_zero2_hook_variant_without_mistakes_passes():
    # the wrong answers above differ from a right one by their mistake only
    assert exercises.check_zero2_hook(zero2_variant(), seed=0).passed


def test_zero2_hook_ranks_that_never_meet_fail_without_hanging(monkeypatch):
    monkeypatch.setattr(d2lpar.exercises.zero, '_TIMEOUT', 0.5)
    solution_hook = solution('10_zero', 'zero2_hook')

    def rank0_skips(bucket, shards, n, rank, reduce_scatter):
        return solution_hook(bucket, shards, n, rank, reduce_scatter if rank else lambda rows: rows)

    verdict = exercises.check_zero2_hook(rank0_skips, seed=0)
    assert not verdict.passed and 'did not meet' in verdict.message, verdict
