"""Hand-written collectives, checked against torch.distributed's own on real gloo process groups."""

import pytest
import torch
import torch.distributed as dist

from d2lpar import collectives as C
from d2lpar.distributed import count_calls
from spawned import spawn

OPS = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32]


def _data(rank, numel, dtype, seed):
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=g, dtype=dtype)
    return torch.randint(-4, 5, (numel,), generator=g, dtype=dtype)


def _assert_same(actual, expected):
    # Floats summed in another order differ in the last bits; integers must be exact.
    exact = not actual.dtype.is_floating_point
    torch.testing.assert_close(actual, expected, rtol=0 if exact else None, atol=0 if exact else None)


def _check_all(rank, n):
    for numel in (1, 4 * n, 4 * n + 1):  # fewer elements than ranks, divisible, not divisible
        for dtype in DTYPES:
            X = _data(rank, numel, dtype, seed=numel)
            # Every op on the two main dtypes; SUM (what training uses) on all four.
            ops = OPS if dtype in (torch.float32, torch.int64) else OPS[:1]
            for op in ops:
                expected = X.clone()
                dist.all_reduce(expected, op=op)
                for fn in (C.naive_allreduce, C.ring_allreduce):
                    actual = X.clone()
                    assert fn(actual, op=op) is actual
                    _assert_same(actual, expected)
                for root in range(n):
                    expected, actual = X.clone(), X.clone()
                    dist.reduce(expected, root, op=op)
                    C.reduce(actual, root, op=op)
                    _assert_same(actual, expected if rank == root else X)
            for src in range(n):
                expected, actual = X.clone(), X.clone()
                dist.broadcast(expected, src)
                C.broadcast(actual, src)
                _assert_same(actual, expected)
            expected = [torch.empty_like(X) for _ in range(n)]
            actual = [torch.full_like(X, 7) for _ in range(n)]
            dist.all_gather(expected, X)
            C.all_gather(actual, X)
            for a, e in zip(actual, expected):
                _assert_same(a, e)
            inputs = [_data(rank, numel, dtype, seed=numel + 10 * i) for i in range(n)]
            before = [t.clone() for t in inputs]
            expected, actual = torch.empty_like(X), torch.full_like(X, 7)
            dist.reduce_scatter(expected, [t.clone() for t in inputs])
            C.reduce_scatter(actual, inputs)
            _assert_same(actual, expected)
            for t, b in zip(inputs, before):
                assert torch.equal(t, b)  # inputs untouched


def _check_layouts_and_traffic(rank, n):
    # A non-contiguous tensor cannot be sent in place: a clear error, and nothing sent.
    X = _data(rank, 6 * 5, torch.float64, seed=3).reshape(6, 5).t()
    for fn in (C.naive_allreduce, C.ring_allreduce):
        with pytest.raises(ValueError, match='tensor is not contiguous'):
            fn(X)
    # The bytes each rank moves are those of the cost model, counted at the calls.
    S = 12 * n * 4  # float32 bytes, divisible by n
    with count_calls() as naive:
        C.naive_allreduce(torch.ones(12 * n))
    with count_calls() as ring:
        C.ring_allreduce(torch.ones(12 * n))
    sent = lambda c: c['send']['bytes'] + c['isend']['bytes']  # noqa: E731
    received = lambda c: c['recv']['bytes'] + c['irecv']['bytes']  # noqa: E731
    assert sent(naive) == ((n - 1) * S if rank == 0 else S) == received(naive)
    assert sent(ring) == 2 * (n - 1) * S // n == received(ring)
    # each ring step is one batch of an isend and an irecv (send_and_receive)
    assert ring['isend']['calls'] == ring['irecv']['calls'] == 2 * (n - 1)
    assert ring['send']['calls'] == ring['recv']['calls'] == 0
    # The cost model charges what the code pays: rank 0 of the naive allreduce receives, then
    # sends, one message at a time (2(n-1) latencies, 2(n-1)S bytes over its link); a ring step
    # sends and receives at once (2(n-1) latencies, 2(n-1)S/n bytes).
    messages = lambda c: sum(c[f]['calls'] for f in ('send', 'isend', 'recv', 'irecv'))  # noqa: E731
    if rank == 0:
        assert C.allreduce_cost('naive', n, 0, 1.0, latency=1.0) == messages(naive)
        assert C.allreduce_cost('naive', n, S, 1.0) == sent(naive) + received(naive)
    assert C.allreduce_cost('ring', n, 0, 1.0, latency=1.0) == messages(ring) / 2
    assert C.allreduce_cost('ring', n, S, 1.0) == pytest.approx(sent(ring))
    assert naive['all_reduce']['calls'] == ring['all_reduce']['calls'] == 0
    # Empty tensors and zero-length chunks move nothing and still agree.
    empty = torch.empty(0)
    C.ring_allreduce(empty)
    C.naive_allreduce(empty)
    _check_bad_input(rank, n)


def _check_bad_input(rank, n):
    X = torch.ones(4)
    with pytest.raises(ValueError, match='AVG is not supported'):
        C.ring_allreduce(X, op=dist.ReduceOp.AVG)
    with pytest.raises(ValueError, match=f'src must be a rank in 0..{n - 1}'):
        C.broadcast(X, n)
    with pytest.raises(ValueError, match='dst must be a rank'):
        C.reduce(X, -1)
    with pytest.raises(ValueError, match=f'holds 1 tensors for a world of {n}'):
        C.all_gather([torch.empty(4)], X)
    with pytest.raises(ValueError, match=r'input_list\[1\] has shape \(3,\)'):
        C.reduce_scatter(X, [torch.ones(4), torch.ones(3)] + [torch.ones(4)] * (n - 2))
    with pytest.raises(TypeError, match='expected a tensor'):
        C.ring_allreduce([1, 2])
    with pytest.raises(ValueError, match='not contiguous'):
        C.all_gather([torch.empty(4, 2).t()[0]] * n, X)
    with pytest.raises(ValueError, match='op must be ReduceOp.SUM'):
        C.reduce(X, 0, op='sum')
    with pytest.raises(ValueError, match='blocks holds 1 tensors'):
        C.ring_all_gather([X])
    # Nothing was sent by the failed calls: a real collective still matches up.
    dist.all_reduce(X)
    assert X.tolist() == [float(n)] * 4


@pytest.mark.parametrize('n', [1, 2, 3, 4])
def test_collectives_equal_torch_distributed(n):
    spawn(_check_all, n)


def test_layouts_traffic_and_bad_input():
    spawn(_check_layouts_and_traffic, 3)


def test_needs_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match='init_process_group'):
        C.ring_allreduce(torch.ones(2))


def test_cost_model_by_hand():
    MB = 2**20
    # 4 ranks, 8 MB, 1 GB/s, 1 ms: naive 6*1ms + 6*8MB/1GB/s (rank 0 receives 3 messages, then
    # sends 3, one at a time); ring 6*1ms + 1.5*8MB/1GB/s.
    assert C.allreduce_cost('naive', 4, 8 * MB, 2**30, 1e-3) == pytest.approx(6e-3 + 6 * 8 / 1024)
    assert C.allreduce_cost('ring', 4, 8 * MB, 2**30, 1e-3) == pytest.approx(6e-3 + 1.5 * 8 / 1024)
    assert C.allreduce_cost('ring', 1, MB, 1.0) == 0.0
    # nccl-tests: busbw = algbw * 2(n-1)/n.
    assert C.bandwidths(100, 2.0, 4) == (50.0, 75.0)
    with pytest.raises(ValueError, match="'naive' or 'ring'"):
        C.allreduce_cost('tree', 4, MB, 1.0)
    with pytest.raises(TypeError, match="size .bytes. must be a number, got '1MB'"):
        C.allreduce_cost('ring', 4, '1MB', 1.0)
    with pytest.raises(ValueError, match='n .the number of processes. must be a positive int, got True'):
        C.allreduce_cost('ring', True, MB, 1.0)
    with pytest.raises(ValueError, match='seconds must be a finite number > 0'):
        C.bandwidths(100, 0.0, 4)
    # NaN and infinity are refused rather than turned into a NaN or zero cost
    for bad in (float('nan'), float('inf')):
        with pytest.raises(ValueError, match='bandwidth .bytes/s. must be a finite number > 0'):
            C.allreduce_cost('ring', 4, MB, bad)
        with pytest.raises(ValueError, match='latency .s. must be a finite number >= 0'):
            C.allreduce_cost('ring', 4, MB, 1.0, latency=bad)
        with pytest.raises(ValueError, match='seconds must be a finite number > 0'):
            C.bandwidths(100, bad, 2)
    with pytest.raises(TypeError, match="size .bytes. must be a number, got 'a'"):
        C.bandwidths('a', 1, 2)
