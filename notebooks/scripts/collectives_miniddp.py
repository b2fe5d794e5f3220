"""Train with DDP and with the hand-written d2lpar MiniDDP in the same processes.

Run:  torchrun --standalone --nproc-per-node=2 scripts/collectives_miniddp.py \
          --check-steps 5 --time-steps 10

--check-steps K: train K steps with DDP and with MiniDDP for each bucket size
from the same start on the same data, and assert that the parameters agree.
--time-steps N: time N steps of each variant, interleaved, best of --repeats;
each time is the slowest rank's. Every rank takes its slice of each global batch.
"""
import argparse
import copy
import math
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import d2lpar
from d2lpar.distributed import (default_timeout, dist_env, emit_result, exit_now, pick_backend,
                                rank_device)
from d2lpar.miniddp import MiniDDP


class LeNet(nn.Module):
    """The course's functional `d2lpar.lenet`, with its parameters registered for DDP."""

    def __init__(self, params):
        super().__init__()
        self.params = nn.ParameterList([nn.Parameter(p.detach().clone()) for p in params])

    def forward(self, X):
        return d2lpar.lenet(X, list(self.params))


def make_net(model, seed):
    if model == 'lenet':
        return LeNet(d2lpar.init_lenet_params(seed=seed))
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512),
                         nn.ReLU(), nn.Linear(512, 10))


def get_batches(args):
    """Return a list of global batches (X, y): from --data, or random ones."""
    if args.data:
        X, y = torch.load(args.data, weights_only=True)
        return list(zip(X.split(args.batch_size), y.split(args.batch_size)))
    g = torch.Generator().manual_seed(0)  # the same on every rank
    return [(torch.rand(args.batch_size, 1, 28, 28, generator=g),
             torch.randint(0, 10, (args.batch_size,), generator=g)) for _ in range(4)]


def train_steps(net, sync, batches, steps, rank, n, device, lr):
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    for step in range(steps):
        X, y = batches[step % len(batches)]
        X, y = X.tensor_split(n)[rank].to(device), y.tensor_split(n)[rank].to(device)
        optimizer.zero_grad()
        F.cross_entropy(net(X), y).backward()
        if sync is not None:
            sync()
        optimizer.step()


def flat(net):
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--model', choices=['mlp', 'lenet'], default='mlp')
    parser.add_argument('--data', default=None, help='.pt file with (X, y) of global batches')
    parser.add_argument('--batch-size', type=int, default=128, help='global batch size')
    parser.add_argument('--lr', type=float, default=0.1)
    parser.add_argument('--buckets', type=float, nargs='+', default=[25.0],
                        help='MiniDDP bucket caps in MB (inf: one bucket)')
    parser.add_argument('--check-steps', type=int, default=0)
    parser.add_argument('--time-steps', type=int, default=0)
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args()

    env = dist_env()
    backend = pick_backend(env.local_world_size)
    device = rank_device(backend, env.local_rank)
    dist.init_process_group(backend, timeout=default_timeout())
    rank, n = dist.get_rank(), dist.get_world_size()
    if args.batch_size % n:
        raise SystemExit(f'--batch-size {args.batch_size} must be a multiple of {n} processes')
    torch.set_num_threads(1)
    batches = get_batches(args)
    net = make_net(args.model, seed=rank).to(device)  # unequal: the wrappers copy rank 0's
    device_ids = [device] if device.type == 'cuda' else None

    def variants():
        yield 'DDP', DDP(copy.deepcopy(net), device_ids=device_ids), None
        for cap in args.buckets:
            mini = MiniDDP(copy.deepcopy(net), bucket_cap_mb=cap)
            yield f'MiniDDP {cap:g} MB', mini, mini.finish_sync

    report = {'world_size': n, 'backend': backend, 'device': str(device),
              'params': sum(p.numel() for p in net.parameters()), 'global_batch': args.batch_size}
    if args.check_steps:
        results = {}
        for name, wrapped, sync in variants():
            train_steps(wrapped, sync, batches, args.check_steps, rank, n, device, args.lr)
            results[name] = flat(wrapped)
        report['max_diff'] = {name: (p - results['DDP']).abs().max().item()
                              for name, p in results.items()}
        report['fingerprint'] = {name: p.double().sum().item() for name, p in results.items()}
        for name, p in results.items():
            torch.testing.assert_close(p, results['DDP'])
        print(f'after {args.check_steps} steps every MiniDDP equals DDP (largest difference '
              f'{max(report["max_diff"].values()):.1e})', flush=True)

    if args.time_steps:
        models = list(variants())
        report['buckets'] = {name: wrapped.bucket_sizes() for name, wrapped, _ in models
                             if isinstance(wrapped, MiniDDP)}
        best = dict.fromkeys([name for name, _, _ in models], math.inf)
        for name, wrapped, sync in models:  # warm-up
            train_steps(wrapped, sync, batches, 2, rank, n, device, args.lr)
        for r in range(args.repeats):
            # Interleaved and rotated, so bursts of background load hit every variant.
            for name, wrapped, sync in models[r % len(models):] + models[:r % len(models)]:
                dist.barrier()
                start = time.perf_counter()
                train_steps(wrapped, sync, batches, args.time_steps, rank, n, device, args.lr)
                d2lpar.synchronize(device)
                elapsed = torch.tensor([(time.perf_counter() - start) / args.time_steps],
                                       dtype=torch.float64, device=device)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                best[name] = min(best[name], elapsed.item())
            if rank == 0:
                print(f'round {r + 1}/{args.repeats}: ' + ', '.join(
                    f'{k} {v * 1e3:.1f} ms' for k, v in best.items()), flush=True)
        report['step_seconds'] = best
    emit_result(report)
    dist.destroy_process_group()
    exit_now()  # DDP keeps gloo's threads alive, and Python's own teardown can abort on them


if __name__ == '__main__':
    main()
