"""d2lpar.ddp: the DDP loop of notebook 5 and the snapshots of notebook 6, in a world of one.

The multi-process runs are in tests/test_ddp_scripts.py and the notebooks; here the
functions are checked against plain PyTorch and for what bad input and crashes leave behind.
"""

import datetime
import os

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

from d2lpar import save_checkpoint
from d2lpar.ddp import init_process, load_snapshot, make_loader, train_ddp
from d2lpar import free_port


def data(n=64):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g))


def net_and_optimizer(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    return net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)


def test_train_ddp_in_one_process_is_the_plain_loop():
    dataset = data()
    net, optimizer = net_and_optimizer()
    sampler, train_iter = make_loader(dataset, 16, 1, 0, seed=3)
    seen = []
    losses = train_ddp(
        net, sampler, train_iter, optimizer, 'cpu', 3, on_epoch_end=lambda epoch, loss: seen.append((epoch, loss))
    )
    # the same by hand: the permutation DistributedSampler draws (seed + epoch), 4 full batches
    ref, ref_opt = net_and_optimizer()
    X, y = dataset.tensors
    for epoch in range(3):
        order = torch.randperm(64, generator=torch.Generator().manual_seed(3 + epoch))
        total = 0.0
        for batch in order.split(16):
            ref_opt.zero_grad()
            loss = nn.functional.cross_entropy(ref(X[batch]), y[batch])
            loss.backward()
            ref_opt.step()
            total += loss.item()
        assert losses[epoch] == pytest.approx(total / 4, rel=1e-6)
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)
    assert seen == sorted(losses.items())


def test_train_ddp_resumes_at_first_epoch():
    dataset = data()
    whole, opt_whole = net_and_optimizer()
    sampler, train_iter = make_loader(dataset, 16, 1, 0, seed=0)
    train_ddp(whole, sampler, train_iter, opt_whole, 'cpu', 4)
    part, opt_part = net_and_optimizer()
    sampler, train_iter = make_loader(dataset, 16, 1, 0, seed=0)
    train_ddp(part, sampler, train_iter, opt_part, 'cpu', 2)
    assert sorted(train_ddp(part, sampler, train_iter, opt_part, 'cpu', 4, first_epoch=2)) == [2, 3]
    for p, q in zip(whole.parameters(), part.parameters()):
        assert torch.equal(p, q)


def test_make_loader_shards_cover_the_data_in_full_batches():
    dataset = data(50)
    batches = [list(make_loader(dataset, 4, 3, rank, seed=1)[1]) for rank in range(3)]
    assert all(len(b) == 4 and all(len(X) == 4 for X, _ in b) for b in batches)  # 17 -> 4 batches


def test_init_process_binds_the_cpu_for_gloo_and_joins(monkeypatch):
    monkeypatch.setenv('MASTER_ADDR', '127.0.0.1')
    monkeypatch.setenv('MASTER_PORT', str(free_port()))
    device = init_process('gloo', 0, 1, timeout=datetime.timedelta(seconds=20))
    try:
        assert device == torch.device('cpu') and dist.get_world_size() == 1
        x = torch.ones(2)
        dist.all_reduce(x)
        assert x.tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_init_process_accepts_a_store_instead_of_an_init_method():
    store = dist.HashStore()
    init_process('gloo', 0, 1, init_method='tcp://unused:1', store=dist.PrefixStore('a0', store))
    try:
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(backend='nccl2'), 'unknown backend'),
        (dict(rank=2, world_size=2), 'must be below world_size'),
        (dict(rank=-1), 'rank must be an int >= 0'),
        (dict(world_size=0), 'world_size must be a positive int'),
        (dict(timeout=60), 'positive datetime.timedelta'),
        (dict(backend='nccl', local_rank=torch.cuda.device_count() + 3), 'GPU(s) are visible'),
    ],
)
def test_init_process_refuses_bad_arguments_before_joining(kwargs, message):
    call = dict(backend='gloo', rank=0, world_size=1, local_rank=0)
    call.update(kwargs)
    with pytest.raises(ValueError, match=message.replace('(', r'\(').replace(')', r'\)')):
        init_process(**call)
    assert not dist.is_initialized()


def test_a_saved_snapshot_is_replaced_atomically_and_load_snapshot_resumes(tmp_path):
    path = tmp_path / 'snap.pt'
    net, optimizer = net_and_optimizer()
    assert load_snapshot(path, net, optimizer, 'cpu') == 0  # no snapshot yet: epoch 0
    save_checkpoint({'net': net.state_dict(), 'optimizer': optimizer.state_dict(), 'epoch': 6}, path)
    other, other_opt = net_and_optimizer(seed=1)
    assert load_snapshot(path, other, other_opt, 'cpu') == 7
    for p, q in zip(net.parameters(), other.parameters()):
        assert torch.equal(p, q)
    assert os.listdir(tmp_path) == ['snap.pt']


class Unsaveable:
    def __reduce__(self):
        raise RuntimeError('died while writing')


def test_a_failed_save_keeps_the_old_snapshot_and_leaves_no_temporary(tmp_path):
    path = tmp_path / 'snap.pt'
    save_checkpoint({'epoch': 1}, path)
    with pytest.raises(RuntimeError, match='died while writing'):
        save_checkpoint({'w': torch.zeros(10_000), 'epoch': 2, 'x': Unsaveable()}, path)
    assert torch.load(path, weights_only=True) == {'epoch': 1}
    assert os.listdir(tmp_path) == ['snap.pt']


def test_train_ddp_refuses_a_sampler_without_set_epoch():
    net, optimizer = net_and_optimizer()
    with pytest.raises(TypeError, match='set_epoch'):
        train_ddp(net, range(3), [], optimizer, 'cpu', 1)
