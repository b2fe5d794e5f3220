"""d2lpar.fault_tolerance (notebook 15): stuck-rank finding, checkpoint intervals, replay."""
import math
import random

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
