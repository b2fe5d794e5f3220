"""Tensor parallelism by hand (d2lpar.tensor_parallel) on 2 gloo processes, against the unsplit modules."""

import pytest
import torch
from torch import nn

from spawned import run_ranks
from d2lpar import tensor_parallel as tp
from d2lpar.distributed import count_calls


def make_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 6))


def make_attention():
    torch.manual_seed(0)
    return tp.SelfAttention(8, num_heads=4)


def reference(make, X):
    """Output and gradients (parameters in order, then X) of the unsplit module."""
    net, X = make(), X.clone().requires_grad_()
    out = net(X)
    (out * torch.arange(out.numel()).view_as(out).sin()).sum().backward()  # a loss not symmetric in the outputs
    return out.detach(), [p.grad for p in net.parameters()] + [X.grad]


def worker(rank, world_size):
    report = {}
    for name, make, X in [('mlp', make_mlp, torch.randn(5, 6, generator=torch.Generator().manual_seed(2))),
                          ('attention', make_attention,
                           torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(3)))]:
        net = tp.ParallelMLP(make()) if name == 'mlp' else tp.ParallelSelfAttention(make())
        X = X.clone().requires_grad_()
        with count_calls(['all_reduce']) as forward:
            out = net(X)
        with count_calls(['all_reduce']) as backward:
            (out * torch.arange(out.numel()).view_as(out).sin()).sum().backward()
            report[name] = dict(out=out.tolist(), grads=[p.grad.tolist() for p in net.parameters()],
                            x_grad=X.grad.tolist(), calls=[forward['all_reduce']['calls'],
                                                           backward['all_reduce']['calls']])
    return report


@pytest.fixture(scope='module')
def reports():
    return run_ranks(worker, 2)


def test_parallel_mlp_equals_the_unsplit_mlp(reports):
    X = torch.randn(5, 6, generator=torch.Generator().manual_seed(2))
    out, (w1, b1, w2, b2, x_grad) = reference(make_mlp, X)
    for rank, report in reports.items():
        r = report['mlp']
        torch.testing.assert_close(torch.tensor(r['out']), out)
        got_w1, got_b1, got_w2, got_b2 = map(torch.tensor, r['grads'])
        torch.testing.assert_close(got_w1, w1.chunk(2, 0)[rank])  # a block of rows
        torch.testing.assert_close(got_b1, b1.chunk(2)[rank])
        torch.testing.assert_close(got_w2, w2.chunk(2, 1)[rank])  # a block of columns
        torch.testing.assert_close(got_b2, b2)  # the whole bias, on every rank
        torch.testing.assert_close(torch.tensor(r['x_grad']), x_grad)
        assert r['calls'] == [1, 1]  # one all-reduce forward (g), one backward (f)


def test_parallel_attention_splits_the_heads(reports):
    X = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(3))
    out, grads = reference(make_attention, X)
    *params, x_grad = grads
    for rank, report in reports.items():
        r = report['attention']
        torch.testing.assert_close(torch.tensor(r['out']), out)
        got = list(map(torch.tensor, r['grads']))
        # q, k, v: weight rows and bias blocks of this rank's two heads; out: columns, whole bias
        want = [g.chunk(2, 0)[rank] for g in params[:6]] + [params[6].chunk(2, 1)[rank], params[7]]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
        torch.testing.assert_close(torch.tensor(r['x_grad']), x_grad)
        assert r['calls'] == [1, 1]


def test_attend_equals_torch_scaled_dot_product_attention():
    q, k, v = torch.randn(3, 2, 5, 12).unbind(0)
    want = nn.functional.scaled_dot_product_attention(
        *(t.view(2, 5, 3, 4).transpose(1, 2) for t in (q, k, v))).transpose(1, 2).reshape(2, 5, 12)
    torch.testing.assert_close(tp.attend(q, k, v, 4), want)


def test_communication_bytes_formulas():
    got = tp.communication_bytes(64, 256, 32)
    assert got == {'data': (64 * 256 * 2 + 256 + 64) * 4, 'tensor': 2 * 32 * 64 * 4,
                   'pipeline': 32 * 256 * 4}


def test_bad_arguments_are_named():
    with pytest.raises(RuntimeError, match='ColumnParallelLinear: no process group'):
        tp.ColumnParallelLinear(nn.Linear(4, 4))
    with pytest.raises(TypeError, match='ParallelMLP: mlp must be'):
        tp.ParallelMLP(nn.Linear(4, 4))
    with pytest.raises(ValueError, match='SelfAttention: dim'):
        tp.SelfAttention(10, num_heads=4)
    with pytest.raises(ValueError, match='attend: the 10 features'):
        tp.attend(*torch.randn(3, 1, 2, 10).unbind(0), 4)
    with pytest.raises(ValueError, match='communication_bytes: batch_size'):
        tp.communication_bytes(4, 8, 0)


@pytest.mark.parametrize('bad', [None, 'abc', -1, 0, 2.5, float('nan'), True, [], torch.ones(3)])
def test_bad_values_get_a_named_error(bad):
    calls = [lambda: tp.attend(bad, torch.ones(1, 2, 4), torch.ones(1, 2, 4), 2),
             lambda: tp.attend(*torch.ones(3, 1, 2, 4).unbind(0), bad),
             lambda: tp.SelfAttention(bad, 2), lambda: tp.SelfAttention(8, bad),
             lambda: tp.communication_bytes(bad, 8, 4), lambda: tp.communication_bytes(4, 8, bad),
             lambda: tp.ParallelMLP(bad), lambda: tp.ParallelSelfAttention(bad)]
    for call in calls:
        with pytest.raises((TypeError, ValueError), match='attend|SelfAttention|communication_bytes|ParallelMLP'):
            call()


def test_notebook_11_scripts_open_with_the_command_that_runs_them():
    from pathlib import Path
    scripts = Path(__file__).resolve().parent.parent / 'notebooks' / 'scripts'
    for name, nproc in [('tensor_parallel.py', 2), ('pipeline_stages.py', 2), ('parallel_2d.py', 4)]:
        run = [line for line in (scripts / name).read_text().splitlines()[:4] if line.startswith('Run:  ')]
        assert run and f'--nproc-per-node={nproc} scripts/{name}' in run[0], name
