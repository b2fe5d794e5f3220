"""Notebook 12's checker, check_row_parallel_linear: wrong answers get their hint; the reference agrees
with autograd on the unsplit layer."""

import pytest
import torch

from d2lpar import exercises

from .reference import SEEDS, solution


def _row_blocks(X, weight, n, weight_dim=1):
    return X.chunk(n, dim=1), weight.chunk(n, dim=weight_dim)


def rp_no_all_reduce(X, weight, bias, G, n, all_reduce):
    Xs, Ws = _row_blocks(X, weight, n)
    return [(x @ w.T + bias, G @ w, G.T @ x, G.sum(0)) for x, w in zip(Xs, Ws)]


def rp_reduces_twice(X, weight, bias, G, n, all_reduce):
    Xs, Ws = _row_blocks(X, weight, n)
    sums = all_reduce(all_reduce([x @ w.T for x, w in zip(Xs, Ws)]))
    return [(s + bias, G @ w, G.T @ x, G.sum(0)) for s, x, w in zip(sums, Xs, Ws)]


def rp_reduces_in_backward(X, weight, bias, G, n, all_reduce):
    Xs, Ws = _row_blocks(X, weight, n)
    sums, Gs = all_reduce([x @ w.T for x, w in zip(Xs, Ws)]), all_reduce([G] * n)
    return [(s + bias, g @ w, g.T @ x, g.sum(0)) for s, g, x, w in zip(sums, Gs, Xs, Ws)]


def rp_wrong_dimension(X, weight, bias, G, n, all_reduce):
    Xs, Ws = _row_blocks(X, weight, n, weight_dim=0)  # the column-parallel split
    sums = all_reduce([x @ w.T for x, w in zip(Xs, Ws)])
    return [(s + bias, G @ w, G.T @ x, G.sum(0)) for s, x, w in zip(sums, Xs, Ws)]


def rp_bias_on_every_rank(X, weight, bias, G, n, all_reduce):
    Xs, Ws = _row_blocks(X, weight, n)
    sums = all_reduce([x @ w.T + bias for x, w in zip(Xs, Ws)])
    return [(s, G @ w, G.T @ x, G.sum(0)) for s, x, w in zip(sums, Xs, Ws)]


def rp_sums_without_communicating(X, weight, bias, G, n, all_reduce):
    Xs, Ws = _row_blocks(X, weight, n)
    total = sum(x @ w.T for x, w in zip(Xs, Ws)) + bias
    return [(total, G @ w, G.T @ x, G.sum(0)) for x, w in zip(Xs, Ws)]


def rp_full_input_gradient(X, weight, bias, G, n, all_reduce):
    Xs, Ws = _row_blocks(X, weight, n)
    sums = all_reduce([x @ w.T for x, w in zip(Xs, Ws)])
    return [(s + bias, G @ weight, G.T @ x, G.sum(0)) for s, x, w in zip(sums, Xs, Ws)]


@pytest.mark.parametrize(
    'wrong, hint',
    [
        (rp_no_all_reduce, 'missing all-reduce'),
        (rp_reduces_twice, 'reducing twice'),
        (rp_reduces_in_backward, 'reducing twice'),
        (rp_wrong_dimension, 'weight.chunk(n, dim=1)'),
        (rp_bias_on_every_rank, 'bias was added'),
        (rp_sums_without_communicating, 'exactly one all_reduce'),
        (rp_full_input_gradient, 'its block of X has shape'),
    ],
    ids=lambda x: getattr(x, '__name__', None),
)
def test_row_parallel_wrong_answers_get_their_hint(wrong, hint):
    for seed in SEEDS:
        verdict = exercises.check_row_parallel_linear(wrong, seed=seed)
        assert verdict.attempted and not verdict.passed and hint in verdict.message, verdict


def test_row_parallel_reference_agrees_with_autograd_on_the_unsplit_layer():
    fn = solution('12_tensor_parallel', 'row_parallel_linear')
    layer, n = torch.nn.Linear(6, 4), 3
    X = torch.randn(5, 6, requires_grad=True)
    G = torch.randn(5, 4)
    out = layer(X)
    out.backward(G)
    ranks = fn(X.detach(), layer.weight.detach(), layer.bias.detach(), G, n, lambda ts: [sum(ts)] * len(ts))
    for r, (o, gx, gw, gb) in enumerate(ranks):
        torch.testing.assert_close(o, out.detach())
        torch.testing.assert_close(gx, X.grad.chunk(n, 1)[r])
        torch.testing.assert_close(gw, layer.weight.grad.chunk(n, 1)[r])
