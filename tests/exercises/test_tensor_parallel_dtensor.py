"""Notebook 13's checker, check_mfu: wrong answers get their hint; the reference agrees with a hand count."""

import pytest

from d2lpar import exercises

from .reference import SEEDS, solution


def mfu_one_device(tokens, seconds, num_params, layers, seq_len, dim, n, peak):
    return tokens / seconds * (6 * num_params + 12 * layers * seq_len * dim) / peak


def mfu_tokens_per_device(tokens, seconds, num_params, layers, seq_len, dim, n, peak):
    return tokens / n / seconds * (6 * num_params + 12 * layers * seq_len * dim) / (n * peak)


def mfu_without_attention(tokens, seconds, num_params, layers, seq_len, dim, n, peak):
    return tokens / seconds * 6 * num_params / (n * peak)


def mfu_forward_only(tokens, seconds, num_params, layers, seq_len, dim, n, peak):
    return tokens / seconds * (2 * num_params + 4 * layers * seq_len * dim) / (n * peak)


def mfu_percent(tokens, seconds, num_params, layers, seq_len, dim, n, peak):
    return 100 * tokens / seconds * (6 * num_params + 12 * layers * seq_len * dim) / (n * peak)


@pytest.mark.parametrize(
    'wrong, hint',
    [
        (mfu_one_device, 'n times too high'),
        (mfu_tokens_per_device, 'n times too low'),
        (mfu_without_attention, "attention's FLOPs are missing"),
        (mfu_forward_only, 'only forward counted'),
        (mfu_percent, 'a percentage'),
    ],
    ids=lambda x: getattr(x, '__name__', ''),
)
def test_mfu_wrong_answers_are_rejected_with_their_hint(wrong, hint):
    for seed in SEEDS:
        verdict = exercises.check_mfu(wrong, seed=seed)
        assert verdict.attempted and not verdict.passed, verdict
        assert hint in verdict.message, verdict


def test_the_reference_mfu_matches_a_count_by_hand_and_passes():
    fn = solution('13_tensor_parallel_dtensor', 'mfu')
    # 1,000 tokens/s of a 1-layer model, 10 parameters, T = 2, D = 3: 6*10 + 12*2*3 = 132 FLOPs each,
    # on 2 devices of 1e5 FLOP/s: 132,000 / 200,000.
    assert fn(1000, 1.0, 10, 1, 2, 3, 2, 1e5) == pytest.approx(0.66)
    for seed in SEEDS:
        assert exercises.check_mfu(fn, seed=seed).passed
