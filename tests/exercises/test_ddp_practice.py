"""Notebook 7's checker, check_accumulation: wrong answers get their hint; the reference equals one step
on the concatenated batch."""

import contextlib

import pytest
import torch

from d2lpar import exercises

from .reference import SEEDS, solution


def accumulation_variant(scale, sync='last', step_every=False, zero=True):
    """An accumulation loop with one typical mistake (or none, with the defaults)."""

    def accumulate_uneven(net, optimizer, micro_batches, loss_fn):
        total, k = sum(len(y) for _, y in micro_batches), len(micro_batches)
        if zero:
            optimizer.zero_grad()
        for i, (X, y) in enumerate(micro_batches):
            synced = {'last': i == k - 1, 'every': True, 'never': False, 'first': i == 0}[sync]
            with contextlib.nullcontext() if synced else net.no_sync():
                (loss_fn(net(X), y) * scale(len(y), total, k)).backward()
            if step_every:
                optimizer.step()
                optimizer.zero_grad()
        if not step_every:
            optimizer.step()

    return accumulate_uneven


SHARE = lambda n, total, k: n / total  # noqa: E731 (the right weight)


@pytest.mark.parametrize(
    'wrong, hint',
    [
        (accumulation_variant(lambda n, total, k: 1 / k), 'len(y_i) / total'),
        (accumulation_variant(lambda n, total, k: 1.0), 'not divided at all'),
        (accumulation_variant(SHARE, sync='every'), 'but the last inside'),
        (accumulation_variant(SHARE, sync='never'), 'would never allreduce'),
        (accumulation_variant(SHARE, sync='first'), 'not the last one'),
        (accumulation_variant(SHARE, step_every=True), 'step once, after the last micro-batch'),
        (accumulation_variant(SHARE, zero=False), 'optimizer.zero_grad()'),
    ],
    ids=['divides-by-k', 'no-division', 'syncs-every', 'never-syncs', 'syncs-first', 'steps-every', 'no-zero-grad'],
)
def test_accumulation_wrong_answers_get_their_hint(wrong, hint):
    for seed in SEEDS:
        verdict = exercises.check_accumulation(wrong, seed=seed)
        assert verdict.attempted and not verdict.passed, verdict
        assert hint in verdict.message, verdict
    assert exercises.check_accumulation(accumulation_variant(SHARE), seed=0).passed


def test_accumulation_reference_equals_one_step_on_the_concatenated_batch():
    from d2lpar.exercises.ddp_practice import _StandInDDP

    fn = solution('07_ddp_practice', 'accumulate_uneven')
    torch.manual_seed(0)
    X, y = torch.randn(9, 3), torch.randint(0, 2, (9,))
    sizes = [2, 3, 4]
    nets = [torch.nn.Linear(3, 2) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    opts = [torch.optim.SGD(n.parameters(), lr=0.5) for n in nets]
    fn(_StandInDDP(nets[0]), opts[0], list(zip(X.split(sizes), y.split(sizes))), torch.nn.functional.cross_entropy)
    torch.nn.functional.cross_entropy(nets[1](X), y).backward()
    opts[1].step()
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        torch.testing.assert_close(a, b)
