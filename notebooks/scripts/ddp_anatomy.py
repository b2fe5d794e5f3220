"""DDP's pieces checked on real ranks: sampler shards, SyncBatchNorm, unused parameters.

Run:  torchrun --standalone --nproc-per-node=2 scripts/ddp_anatomy.py
"""
import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from d2lpar.distributed import (BACKENDS, default_timeout, dist_env, emit_result, exit_now,
                                pick_backend, rank_device)


def sampler_shards(size=11):
    """Return this rank's indices: padded, with drop_last, and shuffled in epochs 0 and 1."""
    data = list(range(size))  # DistributedSampler reads rank and world size from the group
    shards = {'padded': list(DistributedSampler(data, shuffle=False)),
              'dropped': list(DistributedSampler(data, shuffle=False, drop_last=True))}
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        shards[f'epoch{epoch}'] = list(sampler)
    return shards


def sync_batchnorm_by_hand(rank, world_size, device, eps=1e-5):
    """Normalise this rank's batch with the mean and variance of the global batch.

    As nn.SyncBatchNorm's forward does: each rank computes the mean and variance of its
    own batch, one all_gather hands every rank all (mean, var, count) triples, and each
    combines them weighted by the counts. Combining per-rank statistics is numerically
    safer than global sums of squares, where E[x^2] - mean^2 cancels badly.
    """
    g = torch.Generator().manual_seed(rank)  # ranks hold different batches, of unequal sizes
    X = (torch.randn(3 + rank, 4, generator=g) * (rank + 1) + rank).to(device)
    mine = torch.cat([X.mean(0), X.var(0, unbiased=False), torch.tensor([float(len(X))],
                                                                        device=device)])
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(gathered, mine)  # every rank gets every rank's (mean, var, count)
    stats = torch.stack(gathered)
    means, variances, counts = stats[:, :4], stats[:, 4:8], stats[:, 8:]
    n = counts.sum()
    mean = (counts * means).sum(0) / n
    # each rank's spread around its own mean, plus its mean's distance from the global one
    var = (counts * (variances + (means - mean) ** 2)).sum(0) / n  # biased, as BatchNorm uses
    return X, (X - mean) / torch.sqrt(var + eps), mean, var


class TwoHeads(nn.Module):
    """A net whose `aux` head forward never uses (as in a model with an optional branch)."""

    def __init__(self):
        super().__init__()
        self.body, self.head, self.aux = nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, X):
        return self.head(torch.relu(self.body(X)))


def unused_parameters(device, find_unused_parameters):
    """Train two steps; return DDP's error message, or None if there was none."""
    torch.manual_seed(0)
    on_gpu = device.type == 'cuda'
    net = DDP(TwoHeads().to(device), device_ids=[device.index] if on_gpu else None,
              find_unused_parameters=find_unused_parameters)
    for _ in range(2):
        try:
            net(torch.randn(8, 4, device=device)).sum().backward()
        except RuntimeError as e:
            return str(e).split('. ')[0]
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--backend', choices=BACKENDS, default=None,
                        help='default: nccl when every process has a GPU of its own, else gloo')
    args = parser.parse_args()
    env = dist_env()
    backend = pick_backend(env.local_world_size, args.backend)
    # Bind this process to its device first (device_id too): NCCL then sets up on this GPU.
    device = rank_device(backend, env.local_rank)
    dist.init_process_group(backend, init_method='env://', rank=env.rank,
                            world_size=env.world_size, timeout=default_timeout(),
                            device_id=device if device.type == 'cuda' else None)
    X, Y, mean, var = sync_batchnorm_by_hand(env.rank, env.world_size, device)
    net = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.Linear(4, 4),
                                                                nn.BatchNorm1d(4)))
    sbn = nn.SyncBatchNorm(4, affine=False).to(device)
    try:  # the real module synchronises only GPU tensors: CPU ones in training raise
        syncbn = {'Y': sbn(X)}  # handed back as a CPU copy, compared in the notebook
    except ValueError as e:
        syncbn = {'error': f'{type(e).__name__}: {e}'}
    with torch.no_grad():  # no synchronisation to do in eval mode: the CPU is fine
        syncbn['eval'] = sbn.eval()(X)
    errors = {find: unused_parameters(device, find) for find in (False, True)}
    shards = sampler_shards()
    print(f'rank {env.rank} of {env.world_size}: shard of 11 items {shards["padded"]}, '
          f'local batch of {X.shape[0]} rows', flush=True)
    dist.destroy_process_group()
    emit_result(rank=env.rank, backend=backend, shards=shards, X=X, Y=Y, mean=mean,
                var=var, converted=[type(m).__name__ for m in net], syncbn=syncbn,
                unused_error=errors[False], unused_error_with_find=errors[True])
    exit_now()  # DDP keeps gloo's threads alive, and Python's own teardown can abort on them


if __name__ == '__main__':
    main()
