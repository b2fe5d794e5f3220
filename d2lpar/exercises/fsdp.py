"""Checker of notebook 11 (FSDP2 in practice): how many rows a rank holds under Shard(0)."""

from ._verdict import _call, _checker, _Fail


def _reference(num_rows, n, rank):
    """Rows of piece `rank` when torch.chunk cuts `num_rows` into `n` (DTensor's Shard rule)."""
    size = -(-num_rows // n)  # ceil: every piece but the last ones is this big
    return max(0, min(size, num_rows - rank * size))


@_checker('shard_rows(num_rows, n, rank)', 'shard_rows')
def check_shard_rows(shard_rows, rng):
    """Check `shard_rows(num_rows, n, rank)`: rows of a parameter rank `rank` holds under
    `Shard(0)` on a mesh dimension of `n` ranks (FSDP2's placement), as `torch.chunk` cuts it.
    The reference is that rule computed by hand; notebook 11's placements show it on ranks."""
    cases = [(4, 4), (6, 4), (10, 4), (7, 3), (5, 4), (1, 2), (64, 4), (9, 8), (3, 4)]
    cases += [(rng.randint(1, 40), rng.randint(2, 8)) for _ in range(6)]
    for k, (rows, n) in enumerate(cases):
        got_all = [
            _call(shard_rows, (rows, n, rank), f'shard_rows({rows}, {n}, {rank})', first=k == 0 and rank == 0)
            for rank in range(n)
        ]
        want = [_reference(rows, n, rank) for rank in range(n)]
        if got_all == want:
            continue
        case = f'shard_rows({rows}, n={n}, rank=0..{n - 1})'
        if got_all == [rows // n] * n:
            raise _Fail(
                f'{case}: you returned {got_all}, an even split that drops '
                f'{rows % n} row(s); every row must live somewhere. Hint: torch.chunk '
                'makes pieces of ceil(rows / n) rows.'
            )
        if got_all == [rows // n + (r < rows % n) for r in range(n)]:
            raise _Fail(
                f'{case}: you returned {got_all}, the balanced split of '
                'torch.tensor_split; DTensor cuts as torch.chunk does, expected '
                f'{want}. Hint: pieces of ceil(rows / n), the last ones smaller or empty.'
            )
        if got_all == [-(-rows // n)] * n:
            raise _Fail(
                f'{case}: you returned {got_all}, {sum(got_all)} rows in all for a '
                f'tensor of {rows}. Hint: the last pieces get what is left, maybe none.'
            )
        raise _Fail(
            f'{case}: expected {want}, got {got_all}. Hint: pieces of ceil(rows / n) '
            'rows in rank order, the last ones smaller or empty.'
        )
    return f'all {len(cases)} cases match torch.chunk, the rule of Shard(0).'
