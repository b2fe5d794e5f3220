"""Notebook 8's checkers, check_ring_allreduce and check_split_batch: wrong answers get their hint."""

import pytest
import torch

import d2lpar
from d2lpar import exercises

from .reference import assert_rejected, wrong_ids


def reference_ring(add):
    """Return a ring allreduce whose reduce-scatter step does `add(dst_chunk, src_chunk)`."""

    def ring(data):
        n = len(data)
        chunks = [t.view(-1).tensor_split(n) for t in data]
        for step in range(n - 1):
            for i in range(n):
                c, dst = (i - step) % n, (i + 1) % n
                add(chunks[dst][c], chunks[i][c])
        for step in range(n - 1):
            for i in range(n):
                c, dst = (i + 1 - step) % n, (i + 1) % n
                chunks[dst][c].copy_(chunks[i][c])

    return ring


def aliases_replicas(data):
    total = sum(t.clone() for t in data)
    for i in range(len(data)):
        data[i] = total


def rebinds_entries(data):
    total = sum(t.clone() for t in data)
    for i in range(len(data)):
        data[i] = total.clone()


def assigns_to_local_name(data):
    total = sum(t.clone() for t in data)
    for t in data:
        t = total  # noqa: F841 (the mistake under test)


def sums_then_copies(data):
    total = sum(t.clone() for t in data)
    for t in data:
        t.copy_(total)


def averages(data):
    total = sum(t.clone() for t in data)
    for t in data:
        t.copy_(total / len(data))


def drops_remainder(X, y, devices):
    size = X.shape[0] // len(devices)
    return (
        [X[i * size : (i + 1) * size].to(d) for i, d in enumerate(devices)],
        [y[i * size : (i + 1) * size].to(d) for i, d in enumerate(devices)],
    )


def uses_chunk(X, y, devices):
    return (
        [x.to(d) for x, d in zip(torch.chunk(X, len(devices)), devices)],
        [t.to(d) for t, d in zip(torch.chunk(y, len(devices)), devices)],
    )


def forgets_to_move(X, y, devices):
    if X.shape[0] < len(devices):
        raise ValueError('too few rows')
    return list(torch.tensor_split(X, len(devices))), list(torch.tensor_split(y, len(devices)))


def allows_idle_devices(X, y, devices):
    return (
        [x.to(d) for x, d in zip(torch.tensor_split(X, len(devices)), devices)],
        [t.to(d) for t, d in zip(torch.tensor_split(y, len(devices)), devices)],
    )


WRONG = [
    (exercises.check_ring_allreduce, aliases_replicas, 'share memory'),
    (exercises.check_ring_allreduce, rebinds_entries, 'is a new tensor'),
    (exercises.check_ring_allreduce, assigns_to_local_name, 'unchanged'),
    (
        exercises.check_ring_allreduce,
        reference_ring(lambda dst, src: dst.copy_(src)),
        'assigned where it should be added',
    ),
    (exercises.check_ring_allreduce, averages, 'mean'),
    (exercises.check_ring_allreduce, sums_then_copies, 'not computed by a ring'),
    (exercises.check_ring_allreduce, d2lpar.allreduce, 'the naive allreduce'),
    (exercises.check_split_batch, drops_remainder, 'instead of dropping them'),
    (exercises.check_split_batch, uses_chunk, 'torch.tensor_split'),
    (exercises.check_split_batch, forgets_to_move, 'move each part'),
    (exercises.check_split_batch, allows_idle_devices, 'fewer rows than devices'),
]


@pytest.mark.parametrize('check,answer,hint', WRONG, ids=wrong_ids(WRONG))
def test_wrong_answer_fails_with_its_hint(check, answer, hint):
    assert_rejected(check, answer, hint)


def test_chunk_that_runs_out_of_rows_is_explained():
    verdict = exercises.check_split_batch(
        lambda X, y, devices: (list(torch.chunk(X, len(devices))), list(torch.chunk(y, 4)))
    )
    # 10 rows on 4 devices: chunk balances badly; 5 rows on 4: it makes only 3 parts.
    assert not verdict.passed and 'torch.tensor_split' in verdict.message


def test_a_failure_says_how_to_repeat_it():
    verdict = exercises.check_split_batch(drops_remainder, seed=123)
    assert 'seed=123' in verdict.message
    assert exercises.check_split_batch(drops_remainder, seed=123).message == verdict.message
