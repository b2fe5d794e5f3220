"""Checker of notebook 5: a DistributedSampler without padding."""

import torch

from ._verdict import _call, _checker, _Fail


class _Sized:
    """A stand-in dataset: only its length matters to a sampler."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def _torch_unpadded(n, k, rank, shuffle, seed, epoch):
    """Return DistributedSampler's indices for `rank` with the padding taken off."""
    return _torch_padded(n, k, rank, shuffle, seed, epoch)[: len(range(rank, n, k))]


def _torch_padded(n, k, rank, shuffle, seed, epoch):
    """Return DistributedSampler's indices for `rank`, padding included."""
    sampler = torch.utils.data.DistributedSampler(_Sized(n), num_replicas=k, rank=rank, shuffle=shuffle, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def _shard(Sampler, n, k, rank, shuffle, seed, epoch, case, first=False):
    sampler = _call(Sampler, (_Sized(n),), case, first, dict(num_replicas=k, rank=rank, shuffle=shuffle, seed=seed))
    if epoch is not None:
        _call(sampler.set_epoch, (epoch,), f'{case}, set_epoch({epoch})')
    indices = _call(lambda: [int(i) for i in sampler], (), f'{case}, iterating')
    length = _call(len, (sampler,), f'{case}, len(sampler)')
    return indices, length


@_checker('UnpaddedSampler(dataset, num_replicas, rank, shuffle, seed)', 'UnpaddedSampler')
def check_sampler(Sampler, rng):
    """Check a DistributedSampler that shards without padding.

    `Sampler(dataset, num_replicas=k, rank=r, shuffle=..., seed=...)` with
    `set_epoch`, `__iter__` and `__len__` must give each index to exactly one
    rank, in DistributedSampler's order (a permutation seeded by seed + epoch,
    split rank::num_replicas) minus its padding.
    """
    cases = [(10, 3), (12, 4), (2, 4), (1, 2), (7, 1)]
    cases += [(rng.randint(1, 60), rng.randint(2, 6)) for _ in range(4)]
    first = True
    for n, k in cases:
        for shuffle in (True, False):
            seed, epoch = rng.randint(0, 1000), rng.randint(1, 20)
            setting = f'{n} samples, {k} ranks, shuffle={shuffle}, seed={seed}, epoch {epoch}'
            shards, owner = [], {}
            for rank in range(k):
                case = f'{setting}: rank {rank}'
                indices, length = _shard(Sampler, n, k, rank, shuffle, seed, epoch, case, first)
                first = False
                if length != len(indices):
                    raise _Fail(
                        f'{case}: len(sampler) is {length}, but iterating gives '
                        f'{len(indices)} indices. Hint: without padding the shards '
                        'differ in size: rank r gets len(range(r, n, num_replicas)).'
                    )
                for i in indices:
                    if not 0 <= i < n:
                        raise _Fail(f'{case}: index {i} is not in the dataset (0..{n - 1}).')
                    if i in owner:
                        padded = indices == _torch_padded(n, k, rank, shuffle, seed, epoch)
                        raise _Fail(
                            f'{case}: index {i} is served twice (to rank {owner[i]} '
                            f'and rank {rank}). Hint: '
                            + (
                                'that is the padding DistributedSampler adds to make '
                                'the shards equal; here each index must appear once.'
                                if padded
                                else 'do all ranks shuffle with the same permutation? Seed '
                                'a torch.Generator with seed + epoch on every rank, '
                                'then give each rank its own positions.'
                            )
                        )
                    owner[i] = rank
                shards.append(indices)
            missing = sorted(set(range(n)) - set(owner))
            if missing:
                raise _Fail(
                    f'{setting}: indices {missing[:5]} are served to no rank. Hint: '
                    'dropping the remainder (like drop_last=True) loses samples; '
                    'every index must go to some rank.'
                )
            for rank, indices in enumerate(shards):
                expected = _torch_unpadded(n, k, rank, shuffle, seed, epoch)
                if indices != expected:
                    stale = _torch_unpadded(n, k, rank, shuffle, seed, 0)
                    hint = (
                        'set_epoch had no effect: the order is that of epoch 0. Seed the '
                        'permutation with seed + epoch, or every epoch repeats it.'
                        if shuffle and indices == stale
                        else 'use DistributedSampler\'s order: torch.randperm(n, generator=g) '
                        'with g.manual_seed(seed + epoch) (range(n) without shuffle), then '
                        'take indices[rank::num_replicas].'
                    )
                    raise _Fail(
                        f'{setting}: rank {rank} gets {indices[:8]}'
                        f'{"..." if len(indices) > 8 else ""}, DistributedSampler '
                        f'without padding gives {expected[:8]}'
                        f'{"..." if len(expected) > 8 else ""}. Hint: {hint}'
                    )
    for n, k, rank in [(10, 3, 3), (10, 3, -1)]:
        case = f'a sampler for rank {rank} of {k} ranks'
        try:
            Sampler(_Sized(n), num_replicas=k, rank=rank, shuffle=True, seed=0)
        except NotImplementedError:
            raise _Fail(f'{case}: your code raised NotImplementedError; finish it.') from None
        except Exception:
            continue
        raise _Fail(
            f'{case} was created without complaint. Hint: ranks go from 0 to '
            'num_replicas - 1; raise ValueError for anything else, as '
            'DistributedSampler does.'
        )
    return (
        f'{len(cases)} datasets, with and without shuffling, are split into disjoint '
        'shards that cover every index once, in DistributedSampler\'s order without its '
        'padding; set_epoch reshuffles and bad ranks are refused.'
    )
