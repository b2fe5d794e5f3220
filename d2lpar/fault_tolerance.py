"""Fault tolerance (notebook 15): finding a stuck rank, checkpoint intervals, replicas that recover.

The functions and classes here are the notebook's `#@save` cells: the notebook writes them in
front of the learner, the launched scripts import them from there, and a test checks that the
two agree.
"""
import datetime
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ['set_timeout', 'behind', 'young_interval', 'expected_waste', 'simulate_run',
           'make_net', 'global_batch', 'shard', 'full_loss', 'local_grads', 'replay_quorums']


def set_timeout(seconds, group=None):
    """Change the timeout of the later collectives of `group` (default: the whole world)."""
    timeout = datetime.timedelta(seconds=seconds)
    if hasattr(dist, 'set_timeout'):  # public in newer torch (2.15 has it)
        dist.set_timeout(timeout, group)
    else:  # torch 2.13: the same function, still private
        dist.distributed_c10d._set_pg_timeout(timeout, group)


def behind(progress):
    """Return (the collective the others wait in, the ranks that never reached it)."""
    newest = max(progress.values())
    return newest, sorted(rank for rank, count in progress.items() if count < newest)


def young_interval(checkpoint_cost, mtbf):
    """Return the checkpoint interval that minimises the expected waste (Young's rule)."""
    return math.sqrt(2 * checkpoint_cost * mtbf)


def expected_waste(interval, checkpoint_cost, mtbf, restart_cost=0.0):
    """Return the expected fraction of time wasted, failures arriving at random every mtbf s."""
    segment_time = (mtbf + restart_cost) * math.expm1((interval + checkpoint_cost) / mtbf)
    return 1 - interval / segment_time


def simulate_run(work, interval, checkpoint_cost, restart_cost, failures):
    """Return the wall time to do `work` s of training that fails at the times in `failures`."""
    t, saved, failures = 0.0, 0.0, iter(sorted(failures))
    next_failure = next(failures, math.inf)
    while saved < work:
        segment = min(interval, work - saved)
        end = t + segment + checkpoint_cost  # train, then write the checkpoint
        if end <= next_failure:
            t, saved = end, saved + segment
            continue
        t = next_failure + restart_cost  # the segment is lost; restart from the last checkpoint
        while next_failure < t:  # a failure while restarting: the restart continues
            next_failure = next(failures, math.inf)
    return t


def make_net(seed=0):
    """Return the small float64 regression network every replica starts from."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).double()


def global_batch(step, batch_size=12):
    """Return the global batch of `step`: the same on every replica, whoever is alive."""
    g = torch.Generator().manual_seed(1000 + step)
    X = torch.randn(batch_size, 8, dtype=torch.float64, generator=g)
    w = torch.linspace(-0.5, 0.5, 8, dtype=torch.float64)[:, None]
    return X, torch.tanh(X @ w)  # a function the network can learn


def shard(X, y, rank, num_replicas):
    """Return replica `rank`'s equal share of the global batch (X, y)."""
    return X.chunk(num_replicas)[rank], y.chunk(num_replicas)[rank]


def full_loss(net, X, y):
    """Return the loss of `net` on the whole global batch, as a float."""
    with torch.no_grad():
        return F.mse_loss(net(X), y).item()


def local_grads(net, X, y):
    """Return the gradients of the mean loss over (X, y), one tensor per parameter."""
    net.zero_grad()
    F.mse_loss(net(X), y).backward()
    return [p.grad.clone() for p in net.parameters()]


def replay_quorums(quorum_sizes, lr, momentum):
    """Train in one process as the replicas do, with quorum_sizes[s] replicas at step s."""
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    losses = []
    for step, n in enumerate(quorum_sizes):
        X, y = global_batch(step)
        losses.append(full_loss(net, X, y))
        shares = [local_grads(net, *shard(X, y, r, n)) for r in range(n)]
        for p, *grads in zip(net.parameters(), *shares):
            p.grad = sum(grads) / n  # the all-reduce: a sum, then divided by the quorum's size
        opt.step()
    return losses, net
