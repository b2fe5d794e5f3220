"""Checker of notebook 15: the online-softmax merge of two partial attention results."""

import torch

from ._verdict import _call, _checker, _Fail

# Float64 rounds each operation to about 1e-16 relative; a merge does a handful of them, so
# the right answer agrees with softmax(s) @ V to ~1e-15. Every mistake below is off by far
# more (at least 1e-3 on these cases), so 1e-9 separates the two with room to spare.
TOL = 1e-9


def partial(scores, V):
    """Return the running state (m, l, acc) of a block: max, sum of exp(s - m), of exp(s - m) v."""
    m = scores.max(dim=-1, keepdim=True).values
    w = torch.exp(scores - m)
    w = torch.where(torch.isinf(m), torch.zeros_like(w), w)  # a query that sees no key here
    return m, w.sum(dim=-1, keepdim=True), w @ V


def _finish(m, l, acc):
    return acc / l, m + torch.log(l)


def _tensor(x, shape, what, case):
    if not isinstance(x, torch.Tensor):
        raise _Fail(f'{case}: {what} is a {type(x).__name__}; return tensors (m, l, acc).')
    if tuple(x.shape) != shape:
        raise _Fail(
            f'{case}: {what} has shape {tuple(x.shape)}, expected {shape} (one row per query, like the inputs).'
        )
    return x.double()


def _close(a, b):
    scale = max(1.0, b.abs().max().item())
    return bool(torch.isfinite(a).all()) and (a - b).abs().max().item() <= TOL * scale


def _diagnose(state1, state2, O, lse):
    """Return a hint naming the mistake whose result (O, lse) matches, or a general one."""
    (m1, l1, acc1), (m2, l2, acc2) = state1, state2
    m = torch.maximum(m1, m2)
    added_o = acc1 / l1 + acc2 / l2
    wrong = {
        'no rescale': _finish(m, l1 + l2, acc1 + acc2)[0],
        'added outputs': added_o,
        'averaged outputs': added_o / 2,
        'inverse rescale': _finish(
            m, l1 * torch.exp(m - m1) + l2 * torch.exp(m - m2), acc1 * torch.exp(m - m1) + acc2 * torch.exp(m - m2)
        )[0],
    }
    if not (torch.isfinite(O).all() and torch.isfinite(lse).all()):
        return (
            'your result holds inf or nan. exp() of scores near 1000 overflows (above ~709 '
            'in float64): keep the running maximum m = max(m1, m2) and multiply each '
            'block by exp(m_i - m), which is at most 1. A block in which a query sees no key '
            'has m_i = -inf, l_i = 0, and its factor exp(-inf - m) is then 0.'
        )
    for name, O_wrong in wrong.items():
        if torch.isfinite(O_wrong).all() and (O - O_wrong).abs().max() <= 1e-6:
            return {
                'no rescale': (
                    'you added l and acc as they are, but each block computed them '
                    'relative to its own maximum m_i: rescale each by exp(m_i - m) '
                    'with m = max(m1, m2) before adding.'
                ),
                'added outputs': (
                    'you added the two blocks\' normalised outputs acc_i / l_i, '
                    'as if '
                    'each block held all the probability: add the rescaled sums '
                    'l_i * exp(m_i - m) and acc_i * exp(m_i - m) instead, and '
                    'divide only at the end.'
                ),
                'averaged outputs': (
                    'you averaged the two blocks\' outputs with equal weights; '
                    'a block weighs by its share of the softmax\'s mass, '
                    'l_i * exp(m_i - m) / l. Add the rescaled sums instead.'
                ),
                'inverse rescale': (
                    'the factor is exp(m_i - m), at most 1 since m is the larger maximum, not exp(m - m_i).'
                ),
            }[name]
    return (
        'the merged state must satisfy acc / l == softmax over both blocks @ V and '
        'm + log(l) == logsumexp over both blocks. Take m = max(m1, m2), then '
        'l = l1 exp(m1 - m) + l2 exp(m2 - m) and acc likewise.'
    )


@_checker('merge_partial(m1, l1, acc1, m2, l2, acc2)', 'merge_partial')
def check_online_softmax_merge(merge_partial, rng):
    """Check `merge_partial`: merge the running softmax states (m, l, acc) of two key blocks.

    A block's state is m = max_j s_j, l = sum_j exp(s_j - m), acc = sum_j exp(s_j - m) v_j
    for each query row. The merged state must give the attention over both blocks:
    acc / l == softmax(s) @ V and m + log l == logsumexp(s), compared with PyTorch in
    float64 on blocks of similar scores, very different maxima, scores near 1000 (where
    exp overflows) and a block in which some queries see no key.
    """
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    cases = [
        ('similar scores', 0.0, 0.0, False),
        ('different maxima', 0.0, 8.0, False),
        ('scores near 1000', 1000.0, 1000.0 + rng.uniform(5, 20), False),
        ('some queries see no key in block 1', 0.0, 3.0, True),
    ]
    for k, (name, shift1, shift2, masked) in enumerate(cases):
        q, k1, k2, d = rng.randint(2, 5), rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 4)
        s1 = torch.randn(q, k1, generator=gen, dtype=torch.float64) * 2 + shift1
        s2 = torch.randn(q, k2, generator=gen, dtype=torch.float64) * 2 + shift2
        if masked:
            s1[::2] = float('-inf')  # every other query sees none of block 1's keys
        V1 = torch.randn(k1, d, generator=gen, dtype=torch.float64)
        V2 = torch.randn(k2, d, generator=gen, dtype=torch.float64)
        state1, state2 = partial(s1, V1), partial(s2, V2)
        case = f'case "{name}" ({q} queries, blocks of {k1} and {k2} keys, d={d})'
        args = tuple(t.clone() for t in (*state1, *state2))
        got = _call(merge_partial, args, case, first=k == 0)
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            raise _Fail(
                f'{case}: your function returned {type(got).__name__}; return the merged state as a tuple (m, l, acc).'
            )
        m = _tensor(got[0], (q, 1), 'm', case)
        l = _tensor(got[1], (q, 1), 'l', case)
        acc = _tensor(got[2], (q, d), 'acc', case)
        O, lse = _finish(m, l, acc)
        s, V = torch.cat([s1, s2], dim=1), torch.cat([V1, V2])
        O_ref, lse_ref = torch.softmax(s, dim=1) @ V, torch.logsumexp(s, dim=1, keepdim=True)
        if not (_close(O, O_ref) and _close(lse, lse_ref)):
            raise _Fail(
                f'{case}: acc / l or m + log(l) differs from the attention over both '
                f'blocks. Hint: {_diagnose(state1, state2, O, lse)}'
            )
    return (
        'your merge gives the attention over both blocks, also where exp would overflow '
        'and where a block is masked out for some queries: the update a FlashAttention '
        'kernel makes for every new block of keys.'
    )
