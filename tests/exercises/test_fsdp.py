"""Notebook 11's checker, check_shard_rows: wrong answers get their hint; the reference agrees with
torch.chunk."""

import pytest
import torch

from d2lpar import exercises

from .reference import solution


@pytest.mark.parametrize(
    'wrong, hint',
    [
        (lambda rows, n, rank: rows // n, 'even split'),
        (lambda rows, n, rank: rows // n + (rank < rows % n), 'tensor_split'),
        (lambda rows, n, rank: -(-rows // n), 'maybe none'),
        (lambda rows, n, rank: -(-rows // n) if rank < n - 1 else rows % n, 'expected'),
    ],
)
def test_shard_rows_wrong_answers_get_their_hint(wrong, hint):
    verdict = exercises.check_shard_rows(wrong, seed=0)
    assert not verdict.passed and hint in verdict.message, verdict


def test_shard_rows_reference_agrees_with_torch_chunk():
    fn = solution('11_fsdp2', 'shard_rows')
    for rows in range(1, 20):
        for n in range(1, 6):
            pieces = [len(c) for c in torch.arange(rows).chunk(n)]
            assert [fn(rows, n, r) for r in range(n)] == pieces + [0] * (n - len(pieces))
