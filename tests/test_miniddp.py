"""The hand-written MiniDDP, checked against DistributedDataParallel and single-process SGD."""

import copy
import math

import pytest
import torch
import torch.distributed as dist
from test_collectives import spawn
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from d2lpar.distributed import count_calls
from d2lpar.miniddp import BucketDDP, HookDDP, MiniDDP, make_buckets

STEPS, BATCH = 4, 8


def make_net(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))


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
    variants = [(HookDDP, {}, None)] + [
        (cls, {'bucket_cap_mb': cap}, sizes)
        for cls in (BucketDDP, MiniDDP)
        for cap, sizes in [(1e-6, [1] * num_params), (0.005, None), (math.inf, [num_params])]
    ]
    for cls, kwargs, sizes in variants:
        wrapped = cls(copy.deepcopy(net), **kwargs)
        buckets = [len(b) for b in getattr(wrapped, 'buckets', [[p] for p in net.parameters()])]
        if sizes is not None:
            assert buckets == sizes
        assert sum(buckets) == num_params
        with count_calls() as calls:
            ours = train(wrapped, STEPS, lambda s: batch(rank, s), sync=wrapped.finish_sync)
        # One all_reduce per parameter (HookDDP), then one per bucket.
        assert calls['all_reduce']['calls'] == STEPS * len(buckets), (cls, kwargs)
        for p, q, r in zip(ours, ddp, single):
            torch.testing.assert_close(p, q)
            torch.testing.assert_close(p, r)
        # Every replica holds exactly the same numbers.
        flat = torch.cat([p.reshape(-1) for p in ours])
        gathered = [torch.empty_like(flat) for _ in range(n)]
        dist.all_gather(gathered, flat)
        for other in gathered:
            assert torch.equal(other, flat)
    assert 1 < len(MiniDDP(copy.deepcopy(net), bucket_cap_mb=0.005).buckets) < num_params


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
    with pytest.raises(TypeError, match='HookDDP wraps an nn.Module'):
        HookDDP(lambda x: x)
    with pytest.raises(ValueError, match='BucketDDP: the module has no parameters that require'):
        BucketDDP(nn.Linear(2, 2).requires_grad_(False))
    with pytest.raises(ValueError, match='several dtypes or devices'):
        make_buckets([torch.zeros(2), torch.zeros(2, dtype=torch.float64)], 25)
    # BucketDDP's buckets are all-reduced in their hooks, but it too needs finish_sync().
    bucketed = BucketDDP(nn.Linear(4, 2))
    bucketed(torch.ones(3, 4)).sum().backward()
    with pytest.raises(RuntimeError, match='BucketDDP: a second backward before finish_sync'):
        bucketed(torch.ones(3, 4)).sum().backward()


@pytest.mark.parametrize('n', [2, 3])
def test_miniddp_equals_ddp_and_single_process(n):
    spawn(_check_against_ddp, n)


def test_miniddp_misuse():
    spawn(_check_misuse, 2)


def test_miniddp_needs_a_process_group():
    assert not dist.is_initialized()
    for cls in (HookDDP, BucketDDP, MiniDDP):
        with pytest.raises(RuntimeError, match=f'{cls.__name__}: no process group.*init_process_gr'):
            cls(nn.Linear(2, 2))


def test_buckets_by_hand():
    # 40, 20480, 2048 and 40 bytes, in order. A cap of 0.01 MB (10485 bytes) closes a
    # bucket before the parameter that would overflow it; one above the cap sits alone.
    params = [torch.zeros(10), torch.zeros(5120), torch.zeros(512), torch.zeros(10)]
    assert [len(b) for b in make_buckets(params, 0.01)] == [1, 1, 2]
    assert [len(b) for b in make_buckets(params, 0.02)] == [2, 2]
    assert [len(b) for b in make_buckets(params, math.inf)] == [4]
    assert [len(b) for b in make_buckets(params, 1e-9)] == [1, 1, 1, 1]
    assert make_buckets(params, 1)[0][1] is params[1]  # the parameters themselves, not copies
