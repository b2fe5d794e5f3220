"""Notebook 5's checker, check_sampler: wrong answers get their hint."""

import pytest
import torch

from d2lpar import exercises

from .reference import assert_rejected, wrong_ids


class Padded(torch.utils.data.DistributedSampler):
    def __init__(self, dataset, num_replicas, rank, shuffle=True, seed=0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)


class DropsLast(torch.utils.data.DistributedSampler):
    def __init__(self, dataset, num_replicas, rank, shuffle=True, seed=0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=True)


def sampler_variant(seed_of, epoch_used=True, blocks=False):
    """Return an unpadded sampler class with one mistake."""

    class Variant(torch.utils.data.Sampler):
        def __init__(self, dataset, num_replicas, rank, shuffle=True, seed=0):
            if not 0 <= rank < num_replicas:
                raise ValueError('bad rank')
            self.n, self.k, self.rank, self.shuffle, self.seed = (len(dataset), num_replicas, rank, shuffle, seed)
            self.epoch = 0

        def set_epoch(self, epoch):
            self.epoch = epoch

        def _mine(self):
            g = torch.Generator().manual_seed(seed_of(self) + (self.epoch if epoch_used else 0))
            order = torch.randperm(self.n, generator=g).tolist() if self.shuffle else list(range(self.n))
            if blocks:  # contiguous blocks instead of DistributedSampler's strides
                bounds = [len(t) for t in torch.tensor_split(torch.arange(self.n), self.k)]
                start = sum(bounds[: self.rank])
                return order[start : start + bounds[self.rank]]
            return order[self.rank :: self.k]

        def __iter__(self):
            return iter(self._mine())

        def __len__(self):
            return len(self._mine())

    return Variant


WRONG = [
    (exercises.check_sampler, Padded, 'padding'),
    (exercises.check_sampler, DropsLast, 'served to no rank'),
    (exercises.check_sampler, sampler_variant(lambda s: s.seed + s.rank), 'same permutation'),
    (exercises.check_sampler, sampler_variant(lambda s: s.seed, epoch_used=False), 'set_epoch had no effect'),
    (exercises.check_sampler, sampler_variant(lambda s: s.seed, blocks=True), "DistributedSampler's order"),
]


@pytest.mark.parametrize('check,answer,hint', WRONG, ids=wrong_ids(WRONG))
def test_wrong_answer_fails_with_its_hint(check, answer, hint):
    assert_rejected(check, answer, hint)
