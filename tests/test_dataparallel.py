"""DataParallel by hand, checked against single-device PyTorch (and nn.DataParallel on 2+ GPUs)."""

import os
import threading

import pytest
import torch
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

import d2lpar

CPU = torch.device('cpu')


def small_cnn(dtype=torch.float64):
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 10)
    ).to(dtype)


def grads(net):
    return [p.grad.clone() for p in net.parameters()]


@pytest.mark.parametrize('rows,k,dim', [(8, 2, 0), (9, 2, 0), (10, 4, 0), (6, 3, 1), (5, 2, -1)])
def test_scatter_inputs_matches_torch_chunk(rows, k, dim):
    X = torch.arange(rows * rows * 2).reshape(rows, rows, 2)
    shards = d2lpar.scatter_inputs((X, 'flag'), [CPU] * k, dim)
    assert len(shards) == k
    for (part, flag), ref in zip(shards, torch.chunk(X, k, dim)):
        torch.testing.assert_close(part, ref, rtol=0, atol=0)
        assert flag == 'flag'


def test_scatter_inputs_bad_input():
    with pytest.raises(ValueError, match='dim=3 does not exist'):
        d2lpar.scatter_inputs(torch.ones(4, 2), [CPU, CPU], dim=3)
    with pytest.raises(TypeError, match='tensor or a tuple'):
        d2lpar.scatter_inputs({'x': torch.ones(2)}, [CPU, CPU])
    with pytest.raises(ValueError, match='empty'):
        d2lpar.scatter_inputs(torch.ones(4, 2), [])
    # 5 rows on 4 devices: torch.chunk makes 3 shards, which nn.DataParallel would quietly accept
    assert len(torch.ones(5, 2).chunk(4)) == 3
    with pytest.raises(ValueError, match='leaving a device idle'):
        d2lpar.scatter_inputs(torch.ones(5, 2), [CPU] * 4)


def test_scatter_cuts_evenly_wherever_the_batch_lives():
    """Moving the batch to another device first does not rebalance the split."""
    X = torch.randn(10, 3)
    sizes = [len(s) for (s,) in d2lpar.scatter_inputs(X, [CPU] * 4)]
    assert sizes == [len(c) for c in X.chunk(4)] == [3, 3, 3, 1]


def test_replicate_copies_except_on_the_first_device():
    net = small_cnn()
    replicas = d2lpar.replicate(net, [CPU] * 3)
    originals = dict(net.named_parameters())
    for k, replica in enumerate(replicas):
        assert replica.skeleton is not net
        for name, t in replica.tensors.items():
            torch.testing.assert_close(t, originals[name], rtol=0, atol=0)
            shares = t.data_ptr() == originals[name].data_ptr()
            assert shares == (k == 0), (k, name)
            # Copies stay in the graph: their gradients reach the original parameters.
            assert k == 0 or t.grad_fn is not None
    with torch.no_grad():
        detached = d2lpar.replicate(net, [CPU, CPU])
    assert all(t.grad_fn is None for t in detached[1].tensors.values())


def test_replicate_refuses_a_module_elsewhere():
    net = nn.Linear(2, 2, device='meta')
    with pytest.raises(ValueError, match=r"must live on devices\[0\] = cpu.*'weight' is on meta"):
        d2lpar.replicate(net, [CPU, CPU])
    with pytest.raises(TypeError, match='nn.Module'):
        d2lpar.replicate(lambda x: x, [CPU])


@pytest.mark.parametrize('k', [1, 2, 3])
def test_data_parallel_equals_one_device(k):
    net = small_cnn()
    X, y = torch.randn(12, 1, 8, 8, dtype=torch.float64), torch.randint(0, 10, (12,))
    nn.functional.cross_entropy(net(X), y).backward()
    expected_out, expected = net(X).detach(), grads(net)
    net.zero_grad()
    out = d2lpar.data_parallel(net, X, [CPU] * k)
    torch.testing.assert_close(out, expected_out, rtol=0, atol=0)
    nn.functional.cross_entropy(out, y).backward()
    torch.testing.assert_close(grads(net), expected, rtol=1e-12, atol=1e-14)


def test_data_parallel_along_dim_1():
    torch.manual_seed(0)
    net = nn.Linear(3, 2).double()
    X = torch.randn(5, 6, 3, dtype=torch.float64, requires_grad=True)  # (seq, batch, features)
    out = d2lpar.HandDataParallel(net, [CPU, CPU, CPU], dim=1)(X)
    torch.testing.assert_close(out, net(X), rtol=0, atol=0)
    out.sum().backward()
    torch.testing.assert_close(X.grad, net.weight.sum(0).expand(5, 6, 3), rtol=0, atol=1e-14)


def test_parallel_apply_really_runs_replicas_at_once():
    barrier = threading.Barrier(3, timeout=20)

    class Meet(nn.Module):
        def forward(self, X):
            barrier.wait()  # breaks (and raises) unless all replicas are inside forward together
            return X * 2

    out = d2lpar.data_parallel(Meet(), torch.arange(6.0), [CPU] * 3)
    torch.testing.assert_close(out, torch.arange(6.0) * 2)


def test_parallel_apply_carries_grad_mode_and_reports_failures():
    net = small_cnn()
    X = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        assert d2lpar.data_parallel(net, X, [CPU, CPU]).grad_fn is None
    assert d2lpar.data_parallel(net, X, [CPU, CPU]).grad_fn is not None
    with torch.autocast('cpu', dtype=torch.bfloat16):  # autocast is per thread too
        assert d2lpar.data_parallel(nn.Linear(4, 2), torch.randn(4, 4), [CPU, CPU]).dtype == torch.bfloat16

    class FailOnSmall(nn.Module):
        def forward(self, X):
            if len(X) < 3:
                raise ArithmeticError('too small')
            return X

    with pytest.raises(RuntimeError, match='replica 1 on cpu failed: ArithmeticError: too small'):
        d2lpar.data_parallel(FailOnSmall(), torch.ones(5), [CPU, CPU])
    with pytest.raises(ValueError, match='2 replicas but 1 inputs'):
        d2lpar.parallel_apply(d2lpar.replicate(net, [CPU, CPU]), [(X,)])


def test_gather_scalars_tuples_dicts():
    losses = [torch.tensor(1.0), torch.tensor(3.0)]
    torch.testing.assert_close(d2lpar.gather(losses, CPU), torch.tensor([1.0, 3.0]))
    parts = [(torch.ones(2, 1), {'a': torch.zeros(1, 2)}), (torch.ones(1, 1), {'a': torch.ones(3, 2)})]
    first, second = d2lpar.gather(parts, CPU)
    assert first.shape == (3, 1) and second['a'].shape == (4, 2)
    with pytest.raises(TypeError, match='cannot gather outputs of type str'):
        d2lpar.gather(['a', 'b'], CPU)
    assert d2lpar.gather([None, None], CPU) is None  # a module that returns nothing
    for mixed in ([None, torch.ones(1)], [(torch.ones(1), None), (torch.ones(1), torch.ones(1))]):
        with pytest.raises(TypeError, match='some replicas returned None|mix of tensors'):
            d2lpar.gather(mixed, CPU)


def test_batchnorm_buffers_follow_replica_zero():
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(3).double()
    reference = nn.BatchNorm1d(3).double()
    X = torch.randn(8, 3, dtype=torch.float64)
    d2lpar.data_parallel(bn, X, [CPU, CPU])
    reference(X[:4])  # as with nn.DataParallel, only the first replica's statistics are kept
    torch.testing.assert_close(bn.running_mean, reference.running_mean, rtol=0, atol=0)
    assert int(bn.num_batches_tracked) == 1


def test_state_dict_has_the_module_prefix_like_nn_dataparallel():
    net = small_cnn()
    assert list(d2lpar.HandDataParallel(net, [CPU]).state_dict()) == list(nn.DataParallel(net).state_dict())


@pytest.mark.skipif(d2lpar.num_gpus() < 2, reason='needs 2 GPUs to run nn.DataParallel')
def test_equals_nn_dataparallel_on_gpus():
    devices = d2lpar.try_all_gpus()
    net = small_cnn().to(devices[0])
    # Two rows per GPU: 16 rows on 5 or 7 GPUs make fewer torch.chunk parts than GPUs.
    X = torch.randn(2 * len(devices), 1, 8, 8, dtype=torch.float64)
    ours = d2lpar.HandDataParallel(net, devices)(X)
    ours.sum().backward()
    expected = grads(net)
    net.zero_grad()
    theirs = nn.DataParallel(net)(X)
    theirs.sum().backward()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    torch.testing.assert_close(grads(net), expected, rtol=1e-12, atol=1e-14)


class WithSubmodule(nn.Module):
    """A layer whose name contains 'module.' in the middle: 'submodule.weight'."""

    def __init__(self):
        super().__init__()
        self.submodule = nn.Linear(2, 2)


@pytest.mark.parametrize('source_wrapped,target_wrapped', [(True, False), (False, True), (True, True), (False, False)])
def test_load_state_dict_flexible_adds_or_strips_the_prefix(source_wrapped, target_wrapped):
    source, target = WithSubmodule(), WithSubmodule()
    saved = (nn.DataParallel(source) if source_wrapped else source).state_dict()
    d2lpar.load_state_dict_flexible(nn.DataParallel(target) if target_wrapped else target, saved)
    # .cpu(): with exactly one GPU, nn.DataParallel moves the module it wraps to cuda:0.
    for p, q in zip(source.parameters(), target.parameters()):
        torch.testing.assert_close(q.cpu(), p.cpu(), rtol=0, atol=0)
    # It agrees with PyTorch's own helper, and unlike str.replace keeps 'submodule.'.
    official = dict(nn.DataParallel(source).state_dict())
    consume_prefix_in_state_dict_if_present(official, 'module.')
    assert list(official) == list(source.state_dict()) == ['submodule.weight', 'submodule.bias']
    assert 'subweight' in [k.replace('module.', '') for k in nn.DataParallel(source).state_dict()]


def test_load_state_dict_flexible_refuses_a_partial_load():
    net = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    before = [p.clone() for p in net.parameters()]
    other = nn.Sequential(nn.Linear(2, 4), nn.Linear(4, 1), nn.Linear(1, 1)).state_dict()
    with pytest.raises(ValueError) as info:
        d2lpar.load_state_dict_flexible(net, other)
    message = str(info.value)
    assert 'nothing was loaded' in message
    assert 'unexpected keys (2): 2.bias, 2.weight' in message
    assert '0.weight (4, 2) != (3, 2)' in message and '1.weight (1, 4) != (1, 3)' in message
    missing = dict(net.state_dict())
    del missing['1.bias']
    with pytest.raises(ValueError, match=r'missing keys \(1\): 1.bias'):
        d2lpar.load_state_dict_flexible(net, missing)
    for p, q in zip(before, net.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=0)
    with pytest.raises(TypeError, match='mapping'):
        d2lpar.load_state_dict_flexible(net, [1, 2])


def test_save_checkpoint_round_trip_and_errors(tmp_path):
    net = small_cnn()
    path = d2lpar.save_checkpoint(nn.DataParallel(net).state_dict(), tmp_path / 'ckpt.pt')
    loaded = torch.load(path, map_location='cpu', weights_only=True)
    fresh = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 4, 10)
    ).double()
    d2lpar.load_state_dict_flexible(fresh, loaded)
    for p, q in zip(net.parameters(), fresh.parameters()):  # net is on cuda:0 if there is one GPU
        torch.testing.assert_close(q, p.cpu(), rtol=0, atol=0)
    with pytest.raises(ValueError, match='does not exist'):
        d2lpar.save_checkpoint(net.state_dict(), tmp_path / 'no' / 'ckpt.pt')
    with pytest.raises(TypeError, match='not the net'):
        d2lpar.save_checkpoint(net, tmp_path / 'net.pt')
    with pytest.raises(Exception):  # a lambda cannot be pickled: nothing may be left behind
        d2lpar.save_checkpoint({'f': lambda: 0}, tmp_path / 'bad.pt')
    assert sorted(os.listdir(tmp_path)) == ['ckpt.pt']


def test_a_checkpoint_with_an_arbitrary_object_is_refused_by_weights_only(tmp_path):
    import pickle

    path = d2lpar.save_checkpoint({'weight': torch.ones(2), 'extra': _Anything()}, tmp_path / 'x.pt')
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['x.pt']  # no temporary left behind


class _Anything:
    pass


def test_an_unindexed_cuda_device_means_the_current_one(monkeypatch):
    """Issue 18, defect 8: replicate refused a module on cuda:0 when given devices=['cuda', ...]."""
    from types import SimpleNamespace

    from d2lpar.checks.nb03_data_parallel import _check_replicate, _normalize_devices

    # Why the devices are normalised: a CUDA tensor's .device always has an index.
    assert torch.device('cuda').index is None and torch.device('cuda') != torch.device('cuda', 0)

    class OnCuda0(nn.Module):  # what a module moved with .to('cuda') reports, without a GPU
        def named_parameters(self, *args, **kwargs):
            yield 'weight', SimpleNamespace(device=torch.device('cuda', 0))

    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)  # as on a 2-GPU machine
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    for current in (0, 1):
        monkeypatch.setattr(torch.cuda, 'current_device', lambda: current)
        assert _normalize_devices(['cuda', 'cuda:1', CPU, torch.device('cuda')], 'replicate') == [
            torch.device('cuda', current),
            torch.device('cuda', 1),
            CPU,
            torch.device('cuda', current),
        ]
        if current == 0:
            (_, devices), _ = _check_replicate(OnCuda0(), ['cuda', 'cuda:1'])
            assert devices == [torch.device('cuda', 0), torch.device('cuda', 1)]
        else:
            with pytest.raises(ValueError, match=r'devices\[0\] = cuda:1.*is on cuda:0'):
                _check_replicate(OnCuda0(), ['cuda', 'cuda:0'])
    # A CPU device list never asks CUDA anything.
    monkeypatch.setattr(torch.cuda, 'current_device', lambda: pytest.fail('CUDA was asked'))
    assert _normalize_devices(['cpu', CPU], 'scatter_inputs') == [CPU, CPU]


def test_every_entry_point_normalises_its_devices(monkeypatch):
    from d2lpar.checks import nb03_data_parallel as checks03

    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)  # as on a 2-GPU machine
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 1)
    cuda1 = torch.device('cuda', 1)
    X, net = torch.ones(4, 2), nn.Linear(2, 2)
    (_, devices, _), _ = checks03._check_scatter_inputs(X, ['cuda', 'cuda:0'])
    assert devices == [cuda1, torch.device('cuda', 0)]
    (_, _, devices, output_device, _), _ = checks03._check_data_parallel(net, X, ['cuda'], 'cuda')
    assert devices == [cuda1] and output_device == cuda1
    (_, _, devices, output_device, _), _ = checks03._check_hand_data_parallel(None, net, ['cuda'], 'cuda')
    assert devices == [cuda1] and output_device == cuda1
    (_, output_device, _), _ = checks03._check_gather([X, X], 'cuda')
    assert output_device == cuda1
    # The checked functions are called with what the checks return.
    hand = d2lpar.HandDataParallel(net, ['cpu', 'cpu'], output_device='cpu')
    assert hand.devices == [CPU, CPU] and hand.output_device == CPU


def test_the_checks_refuse_what_the_algorithm_cannot_do():
    with pytest.raises(ValueError, match='3 rows of inputs\\[0\\] cannot be split across 4'):
        d2lpar.scatter_inputs(torch.ones(3, 2), [CPU] * 4)
    with pytest.raises(ValueError, match='into only 3 parts for 4 devices'):
        d2lpar.scatter_inputs(torch.ones(5, 2), [CPU] * 4)  # chunks of 2: 2 + 2 + 1
    with pytest.raises(ValueError, match='0-dim tensor'):
        d2lpar.scatter_inputs((torch.ones(4), torch.tensor(1.0)), [CPU, CPU])
    with pytest.raises(ValueError, match='no tensor to split'):
        d2lpar.scatter_inputs(('a', 3), [CPU, CPU])
    with pytest.raises(TypeError, match='list of devices'):
        d2lpar.replicate(nn.Linear(2, 2), 'cpu')
    with pytest.raises(ValueError, match='scalars'):
        d2lpar.gather([torch.tensor(1.0), torch.ones(2)], CPU)
    with pytest.raises(TypeError, match='different types or lengths'):
        d2lpar.gather([{'a': torch.ones(1)}, {'b': torch.ones(1)}], CPU)
    with pytest.raises(TypeError, match='not a replica'):
        d2lpar.parallel_apply([nn.Linear(2, 2)], [(torch.ones(1, 2),)])
    # One argument per replica may be given bare instead of as a 1-tuple.
    replicas = d2lpar.replicate(nn.Linear(2, 1), [CPU, CPU])
    outs = d2lpar.parallel_apply(replicas, [torch.ones(1, 2), (torch.ones(1, 2),)])
    torch.testing.assert_close(outs[0], outs[1])


def test_comparisons_across_devices_go_through_cpu_copies():
    """Issue 18, defect 1: assert_close refuses tensors on two devices, equal or not."""
    a, b = torch.ones(2), torch.ones(2, device='meta')
    with pytest.raises(AssertionError):  # equal values: only the devices differ
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # Notebook 3 compares tensors only as CPU copies: every comparison's tensors go through
    # on_cpu(...) or .cpu() (its helper assert_close_on_cpu does, and so must every other call).
    import ast
    import json
    from pathlib import Path

    cells = json.loads((Path(__file__).resolve().parent.parent / 'notebooks' / '03_data_parallel.ipynb').read_text())[
        'cells'
    ]
    compared = 0
    for cell in cells:
        if cell['cell_type'] != 'code':
            continue
        for node in ast.walk(ast.parse(''.join(cell['source']))):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if name in ('torch.testing.assert_close', 'torch.equal', 'torch.allclose', 'torch.isclose'):
                compared += 1
                for arg in node.args[:2]:
                    text = ast.unparse(arg)
                    assert text.startswith('on_cpu(') or text.endswith('.cpu()'), (
                        f'notebook 3 compares {text} without a CPU copy: {ast.unparse(node)}'
                    )
            elif name == 'assert_close_on_cpu':
                compared += 1
    assert compared > 20
