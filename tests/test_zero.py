"""ZeRO stages by hand (d2lpar.zero) against single-process training, and the bugs the checks catch.

One spawn of 2 gloo ranks runs everything (a spawn costs seconds): each stage
trains a model with sizes that do not divide by 2, a frozen layer and a tied
weight, with plain SGD and with AdamW, next to one process on the whole batch;
then the same with three classic bugs planted. In-process tests run each stage
on parameters on the 'meta' device and see every tensor it makes land there.
"""

import functools

import pytest
import torch
import torch.distributed as dist
from spawned import run_ranks
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import d2lpar.lessons.nb10_zero
from d2lpar import zero
from d2lpar.distributed import count_calls

STEPS, WORLD = 3, 2
TOL = 1e-5  # float32: a few roundings per value per step differ from one process's sums
OPTIMIZERS = {
    'SGD': (torch.optim.SGD, dict(lr=0.5)),
    'AdamW': (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.01)),
    'momentum': (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
}
STAGES = ['Zero1', 'Zero2', 'Zero3']
BUGS = [None, 'no division', 'divided twice', 'wrong shard']


class Net(nn.Module):
    """Sizes that do not divide by 2 (7x5, 5, 5x5), a frozen layer, and one weight used by two layers."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.frozen = nn.Linear(7, 5), nn.Linear(5, 5)
        self.mid, self.mid2, self.head = nn.Linear(5, 5), nn.Linear(5, 5), nn.Linear(5, 2)
        self.mid2.weight = self.mid.weight  # tied
        self.frozen.requires_grad_(False)

    def forward(self, X):
        for layer in (self.embed, self.frozen, self.mid, self.mid2):
            X = torch.tanh(layer(X))
        return self.head(X)


def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(2 * WORLD, 7, generator=g), torch.randn(2 * WORLD, 2, generator=g)) for _ in range(STEPS)]


def buggy(cls, bug):
    """Return `cls` with one classic bug planted (None: unchanged)."""

    class Buggy(cls):
        def reduce_bucket(self, bucket):
            super().reduce_bucket(bucket)
            for p in bucket:
                if bug == 'no division':  # the sum over ranks, not the mean
                    self.shards[p].grad.mul_(self.n)
                elif bug == 'divided twice':
                    self.shards[p].grad.div_(self.n)

        def shard_param(self, p):
            if bug != 'wrong shard':
                return super().shard_param(p)
            other = (self.rank + 1) % self.n  # this rank updates its neighbour's shard
            copy = zero.pad_to_shards(p, self.n)[other].clone()
            super().shard_param(p)
            return copy if isinstance(self, zero.Zero3) else self.flats[p][other]

    return Buggy if bug else cls


def make(stage, net, optimizer, bug=None):
    opt_class, defaults = OPTIMIZERS[optimizer]
    cls = CarelessPad if stage == 'careless' else buggy(getattr(zero, stage), bug)
    if stage == 'Zero1':
        return cls(net.parameters(), opt_class, **defaults)
    if stage in ('Zero2', 'careless'):
        return cls(net.parameters(), opt_class, bucket_cap_mb=1e-4, **defaults)
    return cls(net, opt_class, bucket_cap_mb=1e-4, **defaults)


def full_params(net, opt):
    if isinstance(opt, zero.Zero3):
        for layer in net.modules():
            opt.gather(layer)
    return [p.detach().clone() for p in net.parameters()]


@functools.lru_cache
def reference(optimizer):
    """Parameters after STEPS of one process on the whole batch, and the first gradients."""
    net = Net()
    opt_class, defaults = OPTIMIZERS[optimizer]
    opt, first = opt_class([p for p in net.parameters() if p.requires_grad], **defaults), None
    for X, y in batches():
        opt.zero_grad()
        nn.functional.mse_loss(net(X), y).backward()
        first = first or {name: p.grad.clone() for name, p in net.named_parameters() if p.grad is not None}
        opt.step()
    return full_params(net, None), first


def run(rank, n, stage, optimizer, bug):
    """Train; return (largest parameter difference, largest gradient-shard difference)."""
    want, first = reference(optimizer)
    net = Net()
    opt = make(stage, net, optimizer, bug)
    grad_diff = None
    for i, (X, y) in enumerate(batches()):
        opt.zero_grad()
        nn.functional.mse_loss(net(X.chunk(n)[rank]), y.chunk(n)[rank]).backward()
        if i == 0:  # the averaged gradient shards, compared directly
            for p in opt.params:
                if id(p) not in opt.reduced:
                    opt.reduce_bucket([p])
            names = {p: name for name, p in net.named_parameters()}
            grad_diff = max(
                (opt.shards[p].grad - zero.pad_to_shards(first[names[p]], n)[rank]).abs().max().item()
                for p in opt.params
            )
        opt.step()
    diff = max((p - q).abs().max().item() for p, q in zip(full_params(net, opt), want))
    return diff, grad_diff


class CarelessPad(zero.Zero2):
    """ZeRO-2 whose bucket buffer is made on the default device (issue: CPU next to a GPU)."""

    def reduce_bucket(self, bucket):
        sizes = [self.shards[p].numel() for p in bucket]
        rows = torch.empty(self.n, sum(sizes), dtype=bucket[0].dtype)  # no device=
        for p, columns in zip(bucket, rows.split(sizes, dim=1)):
            columns.copy_(zero.pad_to_shards(p.grad, self.n))
            p.grad = None
        zero.ring_reduce_scatter(list(rows))
        for p, grad in zip(bucket, (rows[self.rank] / self.n).split(sizes)):
            self.shards[p].grad = grad
            self.reduced.add(id(p))


def zero3_frees(rank, n):
    """Bytes of gathered parameters Zero3 holds after forward, after backward, after step."""
    net = Net()
    opt = make('Zero3', net, 'SGD')
    held = lambda: sum(f.untyped_storage().nbytes() for f in opt.flats.values())
    X, y = batches()[0]
    loss = nn.functional.mse_loss(net(X.chunk(n)[rank]), y.chunk(n)[rank])
    after_forward = held()
    loss.backward()
    after_backward = held()
    opt.step()
    return after_forward, after_backward, held()


def bytes_sent(rank, n, stage):
    net = Net()
    opt = make(stage, net, 'SGD')
    X, y = batches()[0]
    with count_calls(('send', 'isend')) as sent:
        opt.zero_grad()
        nn.functional.mse_loss(net(X.chunk(n)[rank]), y.chunk(n)[rank]).backward()
        opt.step()
    return sent['send']['bytes'] + sent['isend']['bytes']


def worker(rank, n):
    out = {'runs': {}, 'sent': {}}
    for stage in STAGES:
        for optimizer, bugs in (('SGD', BUGS), ('AdamW', [None, 'no division'])):
            for bug in bugs:
                out['runs'][stage, optimizer, bug] = run(rank, n, stage, optimizer, bug)
        out['sent'][stage] = bytes_sent(rank, n, stage)
    out['zero3_frees'] = zero3_frees(rank, n)
    return out


@pytest.fixture(scope='module')
def results():
    return run_ranks(worker, WORLD)


@pytest.mark.parametrize('optimizer', ['SGD', 'AdamW'])
@pytest.mark.parametrize('stage', STAGES)
def test_each_stage_trains_like_one_process(results, stage, optimizer):
    for rank in range(WORLD):
        diff, grad_diff = results[rank]['runs'][stage, optimizer, None]
        assert diff < TOL and grad_diff < TOL, (rank, diff, grad_diff)


@pytest.mark.parametrize('bug', BUGS[1:])
@pytest.mark.parametrize('stage', STAGES)
def test_plain_sgd_catches_each_classic_bug(results, stage, bug):
    diff, grad_diff = results[0]['runs'][stage, 'SGD', bug]
    assert diff > 100 * TOL, diff  # the parameters after 3 steps
    if bug != 'wrong shard':  # the gradient shards themselves are wrong
        assert grad_diff > 100 * TOL, grad_diff


def test_adamw_alone_would_hide_a_wrong_scale(results):
    # Adam divides by the gradient's running size: N times too large barely changes it.
    for stage in STAGES:
        sgd, _ = results[0]['runs'][stage, 'SGD', 'no division']
        adamw, _ = results[0]['runs'][stage, 'AdamW', 'no division']
        assert adamw < sgd / 10, (stage, adamw, sgd)


class DeviceAudit(TorchDispatchMode):
    """Record the device of every tensor any operation in the block makes."""

    def __init__(self):
        super().__init__()
        self.devices = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.devices |= {t.device.type for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)}
        return out


def one_step_on_meta(monkeypatch, stage):
    """One step of `stage` with its parameters on 'meta' (no data: shapes only) and the
    collectives replaced by no-ops (rank 0 of 2): return the devices of all it made."""
    for name, value in dict(
        is_initialized=lambda: True, get_world_size=lambda: 2, get_rank=lambda: 0, broadcast=lambda *a, **k: None
    ).items():
        monkeypatch.setattr(dist, name, value)
    for name in ('ring_reduce_scatter', 'ring_all_gather', 'ring_allreduce'):
        monkeypatch.setattr(d2lpar.lessons.nb10_zero, name, lambda blocks, *a: blocks)
    net = Net().to('meta')
    X, y = torch.randn(4, 7, device='meta'), torch.randn(4, 2, device='meta')
    with DeviceAudit() as audit:
        opt = make(stage, net, 'momentum')
        try:
            for _ in range(2):
                opt.zero_grad()
                nn.functional.mse_loss(net(X), y).backward()
                opt.step()
        except NotImplementedError:  # a CPU buffer meets a meta tensor
            audit.devices.add('failed')
    return audit.devices


@pytest.mark.parametrize('stage', STAGES + ['careless'])
def test_every_buffer_is_made_on_the_parameters_device(monkeypatch, stage):
    devices = one_step_on_meta(monkeypatch, stage)
    if stage == 'careless':  # the check can fail: one buffer made on the default device
        assert 'cpu' in devices, devices
    else:
        assert devices == {'meta'}, devices


def test_zero3_frees_gathered_parameters_after_forward_and_backward(results):
    for rank in range(WORLD):
        assert results[rank]['zero3_frees'] == (0, 0, 0)


def test_bytes_sent_follow_the_ring_formula_with_padding_frozen_and_tied(results):
    net = Net()
    trained = list(dict.fromkeys(p for p in net.parameters() if p.requires_grad))
    padded = sum(-(-p.numel() // WORLD) * WORLD for p in trained)  # tied once, frozen never
    for stage in STAGES:
        want = zero.zero_bytes_sent(stage.lower(), padded, WORLD)
        if stage == 'Zero3':  # the tied weight is gathered again by its second layer's forward
            w = -(-net.mid.weight.numel() // WORLD) * WORLD
            want += (WORLD - 1) / WORLD * w * 4
        assert all(results[r]['sent'][stage] == want for r in range(WORLD)), (
            stage,
            [results[r]['sent'][stage] for r in range(WORLD)],
            want,
        )


def test_model_state_bytes_follows_the_zero_table():
    kw = dict(bytes_param=2, bytes_grad=2, bytes_state=12)  # mixed precision, ZeRO paper
    assert zero.model_state_bytes('ddp', 1000, 8, **kw) == 16000
    assert zero.model_state_bytes('zero1', 1000, 8, **kw) == 1000 * (4 + 12 / 8)
    assert zero.model_state_bytes('zero2', 1000, 8, **kw) == 1000 * (2 + 14 / 8)
    assert zero.model_state_bytes('zero3', 1000, 8, **kw) == 1000 * 16 / 8


def test_pad_to_shards_pads_with_zeros_on_the_tensors_device():
    rows = zero.pad_to_shards(torch.arange(5.0), 2)
    assert rows.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 0.0]]
    assert zero.pad_to_shards(torch.ones(5, device='meta'), 2).device.type == 'meta'


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match='model_state_bytes: stage'):
        zero.model_state_bytes('zero4', 10, 2)
    with pytest.raises(ValueError, match='pad_to_shards: n'):
        zero.pad_to_shards(torch.ones(3), 0)
    with pytest.raises(RuntimeError, match='Zero1: no process group'):
        zero.Zero1([torch.ones(2)], torch.optim.SGD, lr=0.1)
