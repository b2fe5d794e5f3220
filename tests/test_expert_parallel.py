"""All-to-all by hand and the expert-parallel MoE, against torch and against one process."""

import copy
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from d2lpar import expert_parallel as EP
from d2lpar.distributed import count_calls
from spawned import run_ranks

EPS = torch.finfo(torch.float64).eps


def dense_moe(moe, X):
    """Every expert on every token, weighted by a dense gate matrix: a reference with no routing."""
    probs = moe.router(X).softmax(-1)
    top, idx = probs.topk(moe.k, dim=-1)
    gates = torch.zeros_like(probs).scatter(1, idx, top / top.sum(-1, keepdim=True))
    outputs = torch.stack([net(X) for net in moe.experts], dim=1)  # (T, E, d)
    return (gates[..., None] * outputs).sum(1)


def test_moe_equals_a_dense_mixture():
    torch.manual_seed(0)
    moe = EP.MoE(6, 10, 5, k=2).double()
    X = torch.randn(40, 6, dtype=torch.float64)
    torch.testing.assert_close(moe(X), dense_moe(moe, X))
    assert moe.tokens_per_expert.sum() == 80


def test_route_keeps_first_choices_within_capacity():
    torch.manual_seed(1)
    logits = torch.randn(30, 4)
    expert, token, gate, _ = EP.route(logits, 2)
    first = logits.argmax(-1)
    assert torch.equal(expert[:30], first) and torch.equal(token[:30], torch.arange(30))
    kept, kept_token, _, _ = EP.route(logits, 2, capacity=5)
    assert torch.bincount(kept, minlength=4).max() <= 5
    # A kept assignment is among the first 5 of its expert in the full list.
    for e in range(4):
        assert kept_token[kept == e].tolist() == token[expert == e][:5].tolist()
    assert EP.expert_capacity(64, 2, 8, 1.25) == 20 and EP.expert_capacity(10, 1, 3, 1.0) == 4


def test_balancing_loss_is_one_when_uniform_and_E_when_collapsed():
    E = 6
    uniform = torch.full((12, E), 1 / E)
    assert math.isclose(EP.load_balancing_loss(uniform, 2).item(), 1, rel_tol=1e-6)
    collapsed = F.one_hot(torch.zeros(12, dtype=torch.long), E).float()
    assert EP.load_balancing_loss(collapsed, 1).item() == E


def test_all_to_all_cost_is_half_a_ring_allreduce():
    from d2lpar.collectives import allreduce_cost

    for n in (2, 3, 8):
        ring = allreduce_cost('ring', n, 1e6, 1e9)
        assert math.isclose(EP.all_to_all_cost(n, 1e6, 1e9), ring / 2)
    assert EP.all_to_all_cost(1, 1e6, 1e9, 1e-3) == 0


@pytest.mark.parametrize(
    'call, message',
    [
        (lambda: EP.route(torch.randn(4, 3), 4), 'only 3 experts'),
        (lambda: EP.route(torch.randn(4, 3), 1, capacity=0), 'capacity'),
        (lambda: EP.expert_capacity(10, 2, 4, 0), 'capacity_factor'),
        (lambda: EP.pairwise_all_to_all([torch.ones(1)], [torch.ones(1)]), 'init_process_group'),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises((TypeError, ValueError, RuntimeError), match=message):
        call()


def bytes_sent(calls):
    return calls['send']['bytes'] + calls['isend']['bytes']


def check(ours, reference, terms):
    error = (ours - reference).abs().max().item()
    return error <= terms * EPS * reference.abs().max().item(), error


def no_exchange_backward(ctx, dY):
    """A classic bug: the gradient of the exchanged rows is not sent back where they came from."""
    in_splits, _ = ctx.splits
    return dY.new_zeros(sum(in_splits), *dY.shape[1:]), None, None


def _ranks(rank, n):
    out = {}
    # all_to_all: uneven int64 blocks and empty ones, against all_to_all_single.
    send = [(rank + 2 * j) % 3 for j in range(n)]  # some blocks are empty
    recv = [(j + 2 * rank) % 3 for j in range(n)]
    X = torch.arange(sum(send)) + 100 * rank
    ours, theirs = torch.empty(sum(recv), dtype=X.dtype), torch.empty(sum(recv), dtype=X.dtype)
    with count_calls() as calls:
        EP.pairwise_all_to_all(list(ours.split(recv)), list(X.split(send)))
    dist.all_to_all_single(theirs, X, recv, send)
    out['a2a_equal'] = torch.equal(ours, theirs)
    out['a2a_bytes'] = (bytes_sent(calls), (sum(send) - send[rank]) * 8)
    try:
        EP.pairwise_all_to_all([torch.empty(1)] * n, [torch.empty(2)] * n)
    except ValueError as e:
        out['a2a_shape_error'] = str(e)
    # The expert-parallel MoE, outputs and gradients (input's too), against one process.
    torch.manual_seed(0)
    moe = EP.MoE(6, 8, 2 * n, k=2, capacity_factor=1.25).double()
    reference = copy.deepcopy(moe)
    X = torch.randn(n, 20, 6, dtype=torch.float64) + 0.3
    G = torch.randn(n, 20, 6, dtype=torch.float64)
    results = {}
    for name in ('right', 'no_exchange_backward'):
        if name != 'right':
            EP.AllToAll.backward = staticmethod(no_exchange_backward)
        moe.zero_grad(), reference.zero_grad()
        x = X[rank].clone().requires_grad_()
        ep = EP.ExpertParallelMoE(moe)
        ((ep(x) * G[rank]).sum() + 0.1 * ep.aux_loss).backward()
        Xs = X.clone().requires_grad_()
        loss = 0
        for r in range(n):
            loss = loss + (reference(Xs[r]) * G[r]).sum() + 0.1 * reference.aux_loss
        loss.backward()
        router = moe.router.weight.grad.clone()
        dist.all_reduce(router)
        theirs = [p.grad for e in reference.experts[rank * ep.local : (rank + 1) * ep.local] for p in e.parameters()]
        results[name] = {
            'input': check(x.grad, Xs.grad[rank], 200)[0],
            'router': check(router, reference.router.weight.grad, 200 * n)[0],
            'experts': all(check(a.grad, b, 200 * n)[0] for a, b in zip(ep.experts.parameters(), theirs)),
        }
    out['moe'] = results
    return out


def test_on_three_ranks():
    reports = run_ranks(_ranks, 3)
    for rank, report in reports.items():
        assert report['a2a_equal']
        sent, expected = report['a2a_bytes']
        assert sent == expected
        assert 'size each output block like what its rank sends' in report['a2a_shape_error']
        assert report['moe']['right'] == {'input': True, 'router': True, 'experts': True}
        # The check catches a backward that does not send the gradients back.
        assert report['moe']['no_exchange_backward']['input'] is False
