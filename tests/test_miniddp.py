"""The hand-written MiniDDP, checked against DistributedDataParallel and single-process SGD."""
import copy
import math

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from d2lpar.miniddp import MiniDDP
from test_collectives import spawn

STEPS, BATCH = 4, 8


def make_net(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 3))


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(BATCH, 12, generator=g), torch.randint(0, 3, (BATCH,), generator=g)


def train(net, steps, batches, sync=None):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        X, y = batches(step)
        optimizer.zero_grad()
        nn.functional.cross_entropy(net(X), y).backward()
        if sync is not None:
            sync()
        optimizer.step()
    return [p.detach().clone() for p in net.parameters()]


def _check_against_ddp(rank, n):
    net = make_net(seed=rank)  # different on every rank: the wrappers must copy rank 0's
    ddp = train(DDP(copy.deepcopy(net)), STEPS, lambda s: batch(rank, s))
    # The same global batch on one process, with rank 0's initial parameters.
    whole = lambda s: [torch.cat(t) for t in zip(*(batch(r, s) for r in range(n)))]  # noqa: E731
    single = train(make_net(seed=0), STEPS, whole)
    num_params = len(list(net.parameters()))
    for cap, sizes in [(1e-6, [1] * num_params), (0.005, None), (math.inf, [num_params])]:
        mini = MiniDDP(copy.deepcopy(net), bucket_cap_mb=cap)
        if sizes is not None:
            assert mini.bucket_sizes() == sizes
        assert sum(mini.bucket_sizes()) == num_params
        ours = train(mini, STEPS, lambda s: batch(rank, s), sync=mini.finish_sync)
        for p, q, r in zip(ours, ddp, single):
            torch.testing.assert_close(p, q)
            torch.testing.assert_close(p, r)
        # Every replica holds exactly the same numbers.
        flat = torch.cat([p.reshape(-1) for p in ours])
        gathered = [torch.empty_like(flat) for _ in range(n)]
        dist.all_gather(gathered, flat)
        for other in gathered:
            assert torch.equal(other, flat)
    assert 1 < len(MiniDDP(copy.deepcopy(net), bucket_cap_mb=0.005).bucket_sizes()) < num_params


def _check_misuse(rank, n):
    net = nn.ModuleDict({'used': nn.Linear(4, 2), 'unused': nn.Linear(4, 2)})
    mini = MiniDDP(net, bucket_cap_mb=1e-6)
    mini.module['used'](torch.ones(3, 4)).sum().backward()
    with pytest.raises(RuntimeError, match=r"no gradient reached \['unused.weight', 'unused.bias'\]"):
        mini.finish_sync()
    mini = MiniDDP(nn.Linear(4, 2))
    mini(torch.ones(3, 4)).sum().backward()
    with pytest.raises(RuntimeError, match='second backward before finish_sync'):
        mini(torch.ones(3, 4)).sum().backward()
    with pytest.raises(ValueError, match='bucket_cap_mb must be a positive number'):
        MiniDDP(nn.Linear(2, 2), bucket_cap_mb=0)
    with pytest.raises(TypeError, match='wraps an nn.Module'):
        MiniDDP(lambda x: x)


@pytest.mark.parametrize('n', [2, 3])
def test_miniddp_equals_ddp_and_single_process(n):
    spawn(_check_against_ddp, n)


def test_miniddp_misuse():
    spawn(_check_misuse, 2)


def test_miniddp_needs_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match='init_process_group'):
        MiniDDP(nn.Linear(2, 2))
