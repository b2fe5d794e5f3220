"""Tensor parallelism by hand (d2lpar.tensor_parallel) on 2 gloo processes, against the unsplit modules."""

import pytest
import torch
from spawned import run_ranks
from torch import nn

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
    for name, make, X in [
        ('mlp', make_mlp, torch.randn(5, 6, generator=torch.Generator().manual_seed(2))),
        ('attention', make_attention, torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(3))),
    ]:
        net = tp.ParallelMLP(make()) if name == 'mlp' else tp.ParallelSelfAttention(make())
        X = X.clone().requires_grad_()
        with count_calls(['all_reduce']) as forward:
            out = net(X)
        with count_calls(['all_reduce']) as backward:
            (out * torch.arange(out.numel()).view_as(out).sin()).sum().backward()
            report[name] = dict(
                out=out.tolist(),
                grads=[p.grad.tolist() for p in net.parameters()],
                x_grad=X.grad.tolist(),
                calls=[forward['all_reduce']['calls'], backward['all_reduce']['calls']],
            )
    return report


def both_workers(rank, world_size):
    return dict(worker(rank, world_size), blocks=block_worker(rank, world_size))


@pytest.fixture(scope='module')
def all_reports():
    return run_ranks(both_workers, 2)  # one start of two processes for every test below


@pytest.fixture(scope='module')
def reports(all_reports):
    return all_reports


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
    want = (
        nn.functional.scaled_dot_product_attention(*(t.view(2, 5, 3, 4).transpose(1, 2) for t in (q, k, v)))
        .transpose(1, 2)
        .reshape(2, 5, 12)
    )
    torch.testing.assert_close(tp.attend(q, k, v, 4), want)


def test_block_bytes_formulas_by_hand():
    # n = 4: ring factor 3/4; 100 parameters (10 replicated), 8 tokens x 5 features, float32
    got = tp.block_bytes(100, 8, 5, 4, replicated=10)
    assert got == {
        'DP': 2 * 0.75 * 400,
        'FSDP': 3 * 0.75 * 400,
        'TP': 8 * 0.75 * 160,
        'TP+SP': 8 * 0.75 * 160 + 2 * 0.75 * 40,
        'PP': 2 * 160,
    }
    assert tp.block_bytes(100, 8, 5, 2)['PP'] == 160  # two stages: each sends one way only


def test_bad_arguments_are_named():
    with pytest.raises(RuntimeError, match='ColumnParallelLinear: no process group'):
        tp.ColumnParallelLinear(nn.Linear(4, 4))
    with pytest.raises(TypeError, match='ParallelMLP: mlp must be'):
        tp.ParallelMLP(nn.Linear(4, 4))
    with pytest.raises(ValueError, match='SelfAttention: dim'):
        tp.SelfAttention(10, num_heads=4)
    with pytest.raises(ValueError, match='attend: the 10 features'):
        tp.attend(*torch.randn(3, 1, 2, 10).unbind(0), 4)
    with pytest.raises(ValueError, match='block_bytes: tokens'):
        tp.block_bytes(4, 0, 8, 2)
    with pytest.raises(ValueError, match='block_bytes: replicated'):
        tp.block_bytes(4, 8, 8, 2, replicated=5)
    with pytest.raises(TypeError, match='megatron_block: block must be'):
        tp.megatron_block(nn.Linear(4, 4))


@pytest.mark.parametrize('bad', [None, 'abc', -1, 0, 2.5, float('nan'), True, [], torch.ones(3)])
def test_bad_values_get_a_named_error(bad):
    calls = [
        lambda: tp.attend(bad, torch.ones(1, 2, 4), torch.ones(1, 2, 4), 2),
        lambda: tp.attend(*torch.ones(3, 1, 2, 4).unbind(0), bad),
        lambda: tp.SelfAttention(bad, 2),
        lambda: tp.SelfAttention(8, bad),
        lambda: tp.block_bytes(bad, 8, 4, 2),
        lambda: tp.block_bytes(4, 8, 4, bad),
        lambda: tp.ParallelMLP(bad),
        lambda: tp.ParallelSelfAttention(bad),
    ]
    for call in calls:
        with pytest.raises((TypeError, ValueError), match='attend|SelfAttention|block_bytes|ParallelMLP'):
            call()


def make_block():
    torch.manual_seed(0)
    return tp.Block(8, 2, 16)


def block_worker(rank, world_size):
    """Unsplit, Megatron and sequence-parallel blocks on the same batch; what each rank got."""
    g = torch.Generator().manual_seed(4)
    X, keep = torch.randn(2, 4, 8, generator=g), [(torch.rand(2, 4, 8, generator=g) > 0.2).float() for _ in range(2)]
    mine = lambda t: t.chunk(world_size, 1)[rank].contiguous()
    weights = torch.linspace(-1, 1, X.numel()).view_as(X)
    report = {}
    for name, make, inputs in [
        ('unsplit', lambda b: b, (X, keep, weights)),
        ('megatron', tp.megatron_block, (X, keep, weights)),
        ('sp', tp.sequence_parallel_block, (mine(X), [mine(k) for k in keep], mine(weights))),
        ('sp_unsummed', tp.sequence_parallel_block, (mine(X), [mine(k) for k in keep], mine(weights))),
    ]:
        block, Xi = make(make_block()), inputs[0].clone().requires_grad_()
        with tp.count_wire_bytes() as wire:
            out = block(Xi, inputs[1])
            (out * inputs[2]).sum().backward()
            if name == 'sp':
                tp.sum_replicated_grads(block)
        report[name] = dict(
            out=out.tolist(),
            x_grad=Xi.grad.tolist(),
            wire=dict(wire),
            norm=block.norm1.weight.grad.tolist(),
            fc2_bias=block.mlp[2].bias.grad.tolist() if name == 'unsplit' else block.mlp.fc2.bias.grad.tolist(),
        )
    # The overlapped backward equals the synchronous one, bit for bit.
    torch.manual_seed(5)
    Xo, W, b, G = torch.randn(6, 4), torch.randn(3, 4), torch.randn(3), torch.randn(6, 3)
    grads = []
    for overlap in (False, True):
        leaves = [t.clone().requires_grad_() for t in (Xo, W, b)]
        tp.CopyAndLinear.apply(*leaves, overlap, []).backward(G)
        grads.append([t.grad for t in leaves])
    ref = [t.clone().requires_grad_() for t in (Xo, W, b)]
    nn.functional.linear(tp.copy_to_parallel(ref[0]), ref[1], ref[2]).backward(G)
    report['overlap_equal'] = all(torch.equal(a, c) and torch.equal(a, r.grad) for a, c, r in zip(*grads, ref))
    return report


@pytest.fixture(scope='module')
def block_reports(all_reports):
    return {rank: r['blocks'] for rank, r in all_reports.items()}


def test_megatron_and_sequence_parallel_blocks_equal_the_unsplit_block(block_reports):
    for rank, r in block_reports.items():
        want = r['unsplit']
        torch.testing.assert_close(torch.tensor(r['megatron']['out']), torch.tensor(want['out']))
        torch.testing.assert_close(torch.tensor(r['megatron']['x_grad']), torch.tensor(want['x_grad']))
        mine = lambda t: torch.tensor(t).chunk(2, 1)[rank]
        torch.testing.assert_close(torch.tensor(r['sp']['out']), mine(want['out']))
        torch.testing.assert_close(torch.tensor(r['sp']['x_grad']), mine(want['x_grad']))
        for key in ('norm', 'fc2_bias'):  # whole on every rank: summed over the ranks' tokens
            torch.testing.assert_close(torch.tensor(r['sp'][key]), torch.tensor(want[key]))
            # The classic bug, a forgotten sum, is caught: far from the true gradient.
            assert (torch.tensor(r['sp_unsummed'][key]) - torch.tensor(want[key])).abs().max() > 1e-2
        assert r['overlap_equal']


def test_count_wire_bytes_applies_the_ring_factors(block_reports):
    activation = 2 * 4 * 8 * 4  # (batch 2, 4 tokens, 8 features), float32
    r = block_reports[0]
    assert r['unsplit']['wire'] == {}
    assert r['megatron']['wire'] == {'all_reduce': (4, 4 * activation)}  # 2(n-1)/n = 1 for n = 2
    replicated = (8 + 8) * 2 + 8 + 8  # two norms, two output biases
    assert r['sp']['wire'] == {
        'all_gather': (4, 4 * activation // 2),
        'reduce_scatter': (4, 4 * activation // 2),
        'all_reduce': (6, replicated * 4),
    }
