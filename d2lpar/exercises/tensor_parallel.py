"""Checker of notebook 12: a row-parallel linear's forward and backward, simulated for N ranks in one process."""

import torch

from ._verdict import _call, _checker, _Fail

_SPLIT = (
    'a row-parallel linear splits the input features: X.chunk(n, dim=1) and the weight\'s '
    'columns, weight.chunk(n, dim=1); the weight\'s rows (dim 0) are the column-parallel split'
)


class _AllReduce:
    """A stand-in all-reduce: takes one tensor per simulated rank, gives each rank the sum; counts calls."""

    def __init__(self, n):
        self.n, self.calls = n, 0

    def __call__(self, tensors):
        tensors = list(tensors)
        if len(tensors) != self.n or not all(isinstance(t, torch.Tensor) for t in tensors):
            raise ValueError(f'all_reduce takes a list of {self.n} tensors, one per rank')
        self.calls += 1
        total = torch.stack(tensors).sum(0)
        return [total.clone() for _ in range(self.n)]


def _reference(X, weight, bias, grad_output, n):
    """What rank r holds after forward and backward.

    Its output, input-gradient block, weight-gradient block and bias gradient.
    """
    out = X @ weight.T + bias
    grad_X, grad_W, grad_b = grad_output @ weight, grad_output.T @ X, grad_output.sum(0)
    return [(out, gx, gw, grad_b) for gx, gw in zip(grad_X.chunk(n, 1), grad_W.chunk(n, 1))]


def _same(got, want):
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and torch.allclose(got.detach().to(want.dtype), want, rtol=1e-4, atol=1e-5)
    )


@_checker('row_parallel_linear(X, weight, bias, grad_output, n, all_reduce)', 'row_parallel_linear')
def check_row_parallel_linear(row_parallel_linear, rng):
    """Check a row-parallel nn.Linear simulated on n ranks, forward and backward.

    `row_parallel_linear(X, weight, bias, grad_output, n, all_reduce)` gets the
    whole input X (batch, in_features), the unsplit layer's weight (out, in) and
    bias, the gradient of the output (the same on every rank) and a stand-in
    `all_reduce(list of n tensors) -> list of n sums`. It returns, for each rank
    r, (output, grad of its block of X, grad of its block of weight, grad of the
    bias). The reference is the unsplit layer's output and gradients, cut into
    the blocks each rank holds; one all-reduce, in forward, is the right count.
    """
    cases = [(b, n * k, o, n) for n in (1, 2, 3, 4) for b, k, o in [(3, 2, 5), (1, 3, 4)]]
    cases += [
        (rng.randint(1, 6), n * rng.randint(1, 4), rng.randint(1, 6), n) for n in (rng.randint(2, 5) for _ in range(4))
    ]
    for k, (batch, num_in, num_out, n) in enumerate(cases):
        g = torch.Generator().manual_seed(rng.randrange(2**31))
        X, weight = torch.randn(batch, num_in, generator=g), torch.randn(num_out, num_in, generator=g)
        bias, grad_output = torch.randn(num_out, generator=g), torch.randn(batch, num_out, generator=g)
        case = f'row_parallel_linear(X {batch}x{num_in}, weight {num_out}x{num_in}, n={n})'
        given = [t.clone() for t in (X, weight, bias, grad_output)]
        all_reduce = _AllReduce(n)
        got = _call(row_parallel_linear, (*given, n, all_reduce), case, first=k == 0, hint=_SPLIT)
        if not all(torch.equal(a, b) for a, b in zip(given, (X, weight, bias, grad_output))):
            raise _Fail(
                f'{case}: your code changed the tensors it was given. Hint: slice and '
                'compute new tensors; the other ranks still need the originals.'
            )
        if (
            not isinstance(got, (list, tuple))
            or len(got) != n
            or not all(isinstance(r, (list, tuple)) and len(r) == 4 for r in got)
        ):
            raise _Fail(
                f'{case}: return a list of {n} tuples, one per rank: (output, '
                'grad_input_block, grad_weight_block, grad_bias).'
            )
        want = _reference(X, weight, bias, grad_output, n)
        partials = [x @ w.T for x, w in zip(X.chunk(n, 1), weight.chunk(n, 1))]
        for r, ((out, gx, gw, gb), (w_out, w_gx, w_gw, w_gb)) in enumerate(zip(got, want)):
            where = f'{case}, rank {r}'
            if not _same(out, w_out):
                if isinstance(out, torch.Tensor) and out.shape != w_out.shape:
                    raise _Fail(
                        f'{where}: the output has shape {tuple(out.shape)}, the layer\'s is '
                        f'{tuple(w_out.shape)} on every rank. Hint: {_SPLIT}.'
                    )
                if n > 1 and _same(out, partials[r] + bias):
                    raise _Fail(
                        f'{where}: the output is this rank\'s partial product only. Hint: the '
                        'missing all-reduce: sum the partial products X_r W_r^T over the ranks '
                        'with all_reduce, then add the bias.'
                    )
                if n > 1 and _same(out, n * sum(partials) + bias):
                    raise _Fail(
                        f'{where}: the output is {n} times the sum of the partial products. '
                        'Hint: reducing twice: one all_reduce already gives every rank the sum.'
                    )
                if n > 1 and _same(out, sum(partials) + n * bias):
                    raise _Fail(
                        f'{where}: the bias was added {n} times. Hint: add the (whole) bias '
                        'once, after the all-reduce, not to every rank\'s partial product.'
                    )
                raise _Fail(
                    f'{where}: the output is not the unsplit layer\'s X @ weight.T + bias. '
                    f'Hint: {_SPLIT}; sum the partial products with all_reduce.'
                )
            for name, value, right in (
                ('the gradient of its block of X', gx, w_gx),
                ('the gradient of its block of the weight', gw, w_gw),
                ('the gradient of the bias', gb, w_gb),
            ):
                if _same(value, right):
                    continue
                if isinstance(value, torch.Tensor) and value.shape != right.shape:
                    raise _Fail(
                        f'{where}: {name} has shape {tuple(value.shape)}, expected '
                        f'{tuple(right.shape)}. Hint: {_SPLIT}; each rank keeps the '
                        'gradients of the blocks it holds, the bias whole.'
                    )
                if n > 1 and _same(value, n * right):
                    raise _Fail(
                        f'{where}: {name} is {n} times too large. Hint: reducing twice: g\'s '
                        'backward is the identity, since the output\'s gradient is already '
                        'the same on every rank; no all-reduce in backward.'
                    )
                raise _Fail(
                    f'{where}: {name} is wrong. Hint: with G the output\'s gradient, rank r '
                    'needs G @ W_r (its X block), G.T @ X_r (its weight block), G.sum(0).'
                )
        if all_reduce.calls != 1 and n > 1:
            raise _Fail(
                f'{case}: right numbers, but {all_reduce.calls} all_reduce calls. Hint: a '
                'rank cannot read the other ranks\' partial products; exactly one '
                'all_reduce, in forward, is needed (g), none in backward.'
            )
    return f'all {len(cases)} cases match the unsplit layer, with one all-reduce each.'
