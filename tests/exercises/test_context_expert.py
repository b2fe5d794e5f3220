"""Notebook 15's checker, check_online_softmax_merge: wrong answers get their hint; the reference agrees
with d2lpar's ring-attention merge."""

import pytest
import torch

from d2lpar import exercises

from .reference import SEEDS, solution


def merge_no_rescale(m1, l1, acc1, m2, l2, acc2):
    return torch.maximum(m1, m2), l1 + l2, acc1 + acc2


def merge_adds_outputs(m1, l1, acc1, m2, l2, acc2):
    return torch.maximum(m1, m2), torch.ones_like(l1), acc1 / l1 + acc2 / l2


def merge_averages_outputs(m1, l1, acc1, m2, l2, acc2):
    return torch.maximum(m1, m2), torch.ones_like(l1), (acc1 / l1 + acc2 / l2) / 2


def merge_without_running_max(m1, l1, acc1, m2, l2, acc2):
    e1, e2 = torch.exp(m1), torch.exp(m2)
    return torch.zeros_like(m1), e1 * l1 + e2 * l2, e1 * acc1 + e2 * acc2


def merge_relative_to_first(m1, l1, acc1, m2, l2, acc2):
    a2 = torch.exp(m2 - m1)  # fine until block 1 is masked out (m1 = -inf)
    return m1, l1 + a2 * l2, acc1 + a2 * acc2


def merge_inverse_factor(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    a1, a2 = torch.exp(m - m1), torch.exp(m - m2)
    return m, a1 * l1 + a2 * l2, a1 * acc1 + a2 * acc2


@pytest.mark.parametrize(
    'wrong, hint',
    [
        (merge_no_rescale, 'relative to its own maximum'),
        (merge_adds_outputs, 'normalised outputs'),
        (merge_averages_outputs, 'equal weights'),
        (merge_without_running_max, 'overflows'),
        (merge_relative_to_first, 'm_i = -inf'),
        (merge_inverse_factor, 'not exp(m - m_i)'),
    ],
    ids=lambda x: getattr(x, '__name__', None),
)
def test_merge_wrong_answers_get_their_hint(wrong, hint):
    for seed in SEEDS:
        verdict = exercises.check_online_softmax_merge(wrong, seed=seed)
        assert verdict.attempted and not verdict.passed and hint in verdict.message, verdict


def test_merge_reference_agrees_with_torch_on_the_ring_attention_merge():
    """The (m, l, acc) state and d2lpar's (O, lse) merge describe the same result."""
    from d2lpar.context_parallel import attend_block, merge_attention
    from d2lpar.exercises.context_expert import partial

    fn = solution('15_context_expert', 'merge_partial')
    torch.manual_seed(0)
    Q, K, V = (
        torch.randn(4, 3, dtype=torch.float64),
        torch.randn(7, 3, dtype=torch.float64),
        torch.randn(7, 3, dtype=torch.float64),
    )
    s = Q @ K.T / 3**0.5
    m, l, acc = fn(*partial(s[:, :3], V[:3]), *partial(s[:, 3:], V[3:]))
    O, lse = merge_attention(*attend_block(Q, K[:3], V[:3]), *attend_block(Q, K[3:], V[3:]))
    torch.testing.assert_close(acc / l, O)
    torch.testing.assert_close(m + torch.log(l), lse)
