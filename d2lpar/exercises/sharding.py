"""Checker of notebook 10 (ZeRO by hand): the ZeRO-2 gradient step (simulated for N ranks in one process)."""
import torch

from ._verdict import _Fail, _call, _checker


def _reference(grads, rank):
    """Rank `rank`'s shard of the mean of `grads`, padded with zeros to a multiple of N."""
    n = len(grads)
    mean = torch.stack([g.flatten() for g in grads]).sum(0) / n
    chunk = (mean.numel() + n - 1) // n
    padded = torch.zeros(chunk * n, dtype=mean.dtype)
    padded[:mean.numel()] = mean
    return padded[rank * chunk:(rank + 1) * chunk]


@_checker('zero2_grad_shard(grads, rank)', 'zero2_grad_shard')
def check_zero2_grad_shard(zero2_grad_shard, rng):
    """Check `zero2_grad_shard(grads, rank)`: the gradient shard rank `rank` updates in ZeRO-2.

    `grads` holds the full gradient of one parameter on each of N ranks. The
    answer is what a reduce-scatter followed by a division by N leaves on rank
    `rank`: its 1/N shard (flattened, padded with zeros to a multiple of N) of
    the gradient averaged over the ranks, the gradient of single-process
    training on the whole batch. The reference is that computation in torch.
    """
    shapes = [(6,), (5,), (3, 4), (7, 3), (1,), (2, 5, 3)]
    cases = [(shape, n) for shape in shapes for n in (1, 2, 3, 4)]
    cases += [((rng.randint(1, 9), rng.randint(1, 9)), rng.randint(2, 6)) for _ in range(4)]
    for k, (shape, n) in enumerate(cases):
        g = torch.Generator().manual_seed(rng.randrange(2**31))
        grads = [torch.randn(shape, generator=g) for _ in range(n)]
        for rank in range(n):
            case = f'zero2_grad_shard(grads of shape {shape} on {n} ranks, rank={rank})'
            copies = [t.clone() for t in grads]
            got = _call(zero2_grad_shard, (copies, rank), case, first=k == 0 and rank == 0)
            if not all(torch.equal(a, b) for a, b in zip(copies, grads)):
                raise _Fail(f'{case}: your code changed the gradients it was given; the other '
                            'ranks still need theirs. Hint: work on copies (torch.stack, clone).')
            want = _reference(grads, rank)
            if not isinstance(got, torch.Tensor):
                raise _Fail(f'{case}: return a tensor, got {type(got).__name__}.')
            if got.numel() == want.numel() and torch.allclose(
                    got.detach().flatten().to(want.dtype), want, rtol=1e-5, atol=1e-6):
                continue
            if n > 1 and got.numel() >= grads[0].numel():
                raise _Fail(f'{case}: you returned {got.numel()} values, the whole gradient; a '
                            f'rank keeps only its shard of {want.numel()}. Hint: ZeRO-2 '
                            'reduce-scatters; gathering the full gradient (or updating the '
                            'full tensor) is what it avoids.')
            if got.numel() != want.numel():
                raise _Fail(f'{case}: expected a shard of {want.numel()} values, got shape '
                            f'{tuple(got.shape)}. Hint: flatten, pad with zeros to a multiple '
                            f'of N ({n}), then take block `rank` of N equal blocks.')
            got = got.detach().flatten().to(want.dtype)
            if n > 1 and torch.allclose(got, want * n, rtol=1e-5, atol=1e-6):
                raise _Fail(f'{case}: your shard is the sum over the ranks, N = {n} times too '
                            'large. Hint: divide by N so the step matches single-process '
                            'training on the whole batch.')
            if n > 1 and torch.allclose(got, want / n, rtol=1e-5, atol=1e-6):
                raise _Fail(f'{case}: your shard is N = {n} times too small: divided twice. '
                            'Hint: the reduce-scatter sums; divide that sum by N once.')
            other = [r for r in range(n) if r != rank
                     and torch.allclose(got, _reference(grads, r), rtol=1e-5, atol=1e-6)]
            if other:
                raise _Fail(f'{case}: you returned the shard of rank {other[0]}, not of rank '
                            f'{rank}. Hint: rank r keeps block r of the N equal blocks.')
            raise _Fail(f'{case}: expected {want.tolist()!s:.200}, got '
                            f'{got.tolist()!s:.200}. Hint: sum the flattened gradients of all '
                            'ranks, divide by N, pad with zeros and take block `rank`.')
    return f'all {len(cases)} cases match the averaged, reduce-scattered gradient shard.'
