"""d2lpar.fault_tolerance (notebook 16): stuck-rank finding, checkpoint intervals, replay."""

import math
import random
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from d2lpar import fault_tolerance as ft


def test_behind_names_the_ranks_that_never_reached_the_collective():
    assert ft.behind({0: 4, 1: 4, 2: 3}) == (4, [2])
    assert ft.behind({0: 7, 1: 5, 2: 7, 3: 6}) == (7, [1, 3])
    assert ft.behind({0: 2, 1: 2}) == (2, [])


def test_set_timeout_exists_on_this_torch():
    # the notebook's set_timeout calls one of the two, whichever this torch has
    assert hasattr(dist, 'set_timeout') or hasattr(dist.distributed_c10d, '_set_pg_timeout')


@pytest.mark.parametrize('C,M', [(60.0, 4 * 3600.0), (10.0, 24 * 3600.0), (2.0, 600.0)])
def test_young_interval_minimises_the_first_order_waste(C, M):
    def first_order(T):
        return C / T + T / (2 * M)

    T = ft.young_interval(C, M)
    assert all(first_order(T) <= first_order(T * f) for f in (0.9, 0.99, 1.01, 1.1))


@pytest.mark.parametrize('C,M,R', [(60.0, 4 * 3600.0, 120.0), (5.0, 1800.0, 0.0)])
def test_young_interval_is_near_the_exact_optimum(C, M, R):
    grid = [ft.young_interval(C, M) * 2 ** (k / 64) for k in range(-128, 129)]
    best = min(ft.expected_waste(T, C, M, R) for T in grid)
    assert ft.expected_waste(ft.young_interval(C, M), C, M, R) <= 1.005 * best


def test_expected_waste_agrees_with_the_simulation():
    C, M, R, n = 60.0, 3600.0, 30.0, 4000
    rng = random.Random(1)
    failures, t = [], 0.0
    while t < 3 * n * M:
        t += rng.expovariate(1 / M)
        failures.append(t)
    for T in (300.0, 900.0, 2400.0):
        simulated = 1 - n * M / ft.simulate_run(n * M, T, C, R, failures)
        assert abs(simulated - ft.expected_waste(T, C, M, R)) <= 4 / math.sqrt(n) * simulated


def test_simulate_run_without_failures_is_work_plus_checkpoints():
    assert ft.simulate_run(100.0, 30.0, 2.0, 5.0, []) == 100.0 + 4 * 2.0  # 30+30+30+10


def test_simulate_run_loses_the_segment_and_restarts():
    # a failure at t=50 in the second segment [32, 64): restart at 60, redo it
    assert ft.simulate_run(60.0, 30.0, 2.0, 10.0, [50.0]) == 60.0 + 32


def test_replay_with_one_replica_is_full_batch_sgd():
    losses, net = ft.replay_quorums([1] * 5, lr=0.05, momentum=0.9)
    ref = ft.make_net()
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(5):
        X, y = ft.global_batch(step)
        assert losses[step] == ft.full_loss(ref, X, y)
        opt.zero_grad()
        F.mse_loss(ref(X), y).backward()
        opt.step()
    for a, b in zip(net.parameters(), ref.parameters()):
        assert torch.equal(a, b)


def test_replay_quorum_sizes_change_only_rounding():
    steps = 30
    whole, _ = ft.replay_quorums([2] * steps, lr=0.05, momentum=0.9)
    mixed, _ = ft.replay_quorums([2] * 5 + [1] * 10 + [2] * 15, lr=0.05, momentum=0.9)
    eps = torch.finfo(torch.float64).eps
    assert whole[:5] == mixed[:5]
    assert max(abs(a - b) for a, b in zip(whole, mixed)) <= steps * 12 * eps * max(whole)
    assert whole[-1] < whole[0] / 3  # it learns


def test_shard_splits_the_global_batch_evenly():
    X, y = ft.global_batch(0)
    parts = [ft.shard(X, y, r, 3) for r in range(3)]
    assert torch.equal(torch.cat([p[0] for p in parts]), X)
    assert all(len(p[1]) == 4 for p in parts)


@pytest.fixture
def world_of_one():
    store = dist.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)
    dist.init_process_group('gloo', store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_slow_all_reduce_waits_counts_and_keeps_shapes(world_of_one):
    tensors = [torch.ones(3, 2, dtype=torch.float64), torch.arange(4.0, dtype=torch.float64)]
    sent = []
    begin = time.perf_counter()
    out = ft.slow_all_reduce(tensors, 0.05, sent)
    assert time.perf_counter() - begin >= 0.05
    assert sent == [10 * 8]  # one message: the tensors flattened together
    for a, b in zip(out, tensors):
        assert a.shape == b.shape and torch.equal(a, b)


def test_outer_step_is_nesterov_sgd_on_the_outer_gradient(world_of_one):
    net = ft.make_net()
    start = [p.detach().clone() for p in net.parameters()]
    with torch.no_grad():
        for p in net.parameters():
            p.sub_(0.01 * torch.randn_like(p))  # as if after some inner steps
    local = [p.detach().clone() for p in net.parameters()]
    before = [p0.clone() for p0 in start]
    lr, mu = 0.7, 0.9
    outer = torch.optim.SGD(net.parameters(), lr=lr, momentum=mu, nesterov=True)
    sent = []
    ft.outer_step(net, start, outer, 0.0, sent)
    assert len(sent) == 1  # one message per outer step
    eps = torch.finfo(torch.float64).eps
    for p, p0, q, s in zip(net.parameters(), before, local, start):
        delta = p0 - q  # first step: the momentum buffer is delta, so Nesterov steps (1 + mu) * lr * delta
        expected = p0 - lr * (1 + mu) * delta
        assert torch.allclose(p.detach(), expected, rtol=0, atol=8 * eps)
        assert torch.equal(s, p.detach())  # the next round starts from the new weights
