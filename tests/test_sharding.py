"""ZeRO stages by hand (d2lpar.sharding) against one single-process AdamW step on the global batch."""

import pytest
import torch
from torch import nn

from spawned import run_ranks
from d2lpar import sharding

STEPS, LR, WD = 3, 0.05, 0.01


def make_net():
    torch.manual_seed(0)  # 7x5 weights: 35 and 5 values, neither divides by 2 or 4 evenly
    return nn.Sequential(nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3))


def batches(world_size):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4 * world_size, 7, generator=g), torch.randn(4 * world_size, 3, generator=g))
            for _ in range(STEPS)]


def reference(world_size):
    net = make_net()
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WD)
    for X, y in batches(world_size):
        opt.zero_grad()
        nn.functional.mse_loss(net(X), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def worker(rank, world_size, stage):
    net = make_net()
    opt = getattr(sharding, stage)(net if stage == 'Zero3' else net.parameters(),
                                   lr=LR, weight_decay=WD)
    for X, y in batches(world_size):
        opt.zero_grad()
        Xs, ys = X.chunk(world_size)[rank], y.chunk(world_size)[rank]
        nn.functional.mse_loss(net(Xs), ys).backward()
        opt.step()
    if stage == 'Zero3':
        assert all(p.numel() == 0 for p in net.parameters())  # only the shards are kept
        opt.gather(net[0]), opt.gather(net[2])
    return [p.detach().tolist() for p in net.parameters()]


@pytest.mark.parametrize('stage', ['Zero1', 'Zero2', 'Zero3'])
def test_zero_stage_matches_single_process_adamw(stage):
    world_size = 2
    results = run_ranks(worker, world_size, stage)
    want = reference(world_size)
    for rank in range(world_size):
        for got, ref in zip(results[rank], want):
            torch.testing.assert_close(torch.tensor(got), ref, rtol=1e-5, atol=1e-6)
    assert not torch.equal(want[0], make_net()[0].weight)  # the steps moved the weights


def test_model_state_bytes_follows_the_zero_table():
    # mixed precision, 16 bytes per parameter for DDP: 2 + 2 + 12 (fp32 copy, momentum, variance)
    kw = dict(bytes_param=2, bytes_grad=2, bytes_state=12)
    assert sharding.model_state_bytes('ddp', 1000, 8, **kw) == 16000
    assert sharding.model_state_bytes('zero1', 1000, 8, **kw) == 1000 * (4 + 12 / 8)
    assert sharding.model_state_bytes('zero2', 1000, 8, **kw) == 1000 * (2 + 14 / 8)
    assert sharding.model_state_bytes('zero3', 1000, 8, **kw) == 1000 * 16 / 8


def test_pad_to_shards_pads_with_zeros():
    shards = sharding.pad_to_shards(torch.arange(5.), 2)
    assert [s.tolist() for s in shards] == [[0., 1., 2.], [3., 4., 0.]]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="model_state_bytes: stage"):
        sharding.model_state_bytes('zero4', 10, 2)
    with pytest.raises(ValueError, match='pad_to_shards: n'):
        sharding.pad_to_shards(torch.ones(3), 0)
    with pytest.raises(RuntimeError, match='Zero1: no process group'):
        sharding.Zero1([torch.ones(2)])
