"""Train with DDP and with notebook 9's hand-written DDPs in the same processes.

Run:  torchrun --standalone --nproc-per-node=2 scripts/collectives_miniddp.py \
          --variant hook buckets overlap --buckets 0.25 --check-steps 3 --time-steps 10

--variant: which steps of the hand-written DDP to run: hook (HookDDP, one
all_reduce per gradient), buckets (BucketDDP, one per bucket), overlap (MiniDDP,
asynchronous buckets); the last two once per bucket cap in --buckets (MB).
--check-steps K: train K steps with DDP, with each variant and with one process
on the whole global batch, from the same start on the same data; assert that
the parameters agree, and count each variant's all_reduce calls.
--time-steps N: time N steps of DDP and of each variant, interleaved, best of
--repeats; each time is the slowest rank's. Every rank takes its slice of each
global batch.
Backend: gloo with CPU tensors, unless every process can have a GPU of its own
(2+ GPUs): then nccl, one GPU per process (d2lpar.distributed.pick_backend).
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
from d2lpar.distributed import (count_calls, default_timeout, dist_env, emit_result, exit_now,
                                pick_backend, rank_device)
from d2lpar.miniddp import BucketDDP, HookDDP, MiniDDP

VARIANTS = {'hook': HookDDP, 'buckets': BucketDDP, 'overlap': MiniDDP}


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


def train_steps(net, batches, steps, rank, n, device, lr):
    """Train `steps` SGD steps, this rank on its 1/n of each global batch."""
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    finish_sync = getattr(net, 'finish_sync', lambda: None)  # DDP and one process need none
    for step in range(steps):
        X, y = batches[step % len(batches)]
        X, y = X.tensor_split(n)[rank].to(device), y.tensor_split(n)[rank].to(device)
        optimizer.zero_grad()
        F.cross_entropy(net(X), y).backward()
        finish_sync()
        optimizer.step()


def flat(net):
    """Return all parameters as one flat tensor on the CPU, where every comparison is made."""
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).cpu()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--variant', choices=list(VARIANTS), nargs='+', default=['overlap'])
    parser.add_argument('--model', choices=['mlp', 'lenet'], default='mlp')
    parser.add_argument('--data', default=None, help='.pt file with (X, y) of global batches')
    parser.add_argument('--batch-size', type=int, default=128, help='global batch size')
    parser.add_argument('--lr', type=float, default=0.1)
    parser.add_argument('--buckets', type=float, nargs='+', default=[25.0],
                        help='bucket caps in MB (inf: one bucket)')
    parser.add_argument('--check-steps', type=int, default=0)
    parser.add_argument('--time-steps', type=int, default=0)
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args()

    env = dist_env()
    backend = pick_backend(env.local_world_size)  # the only GPU-dependent choices:
    device = rank_device(backend, env.local_rank)  # nccl and cuda:<local rank>, or gloo and cpu
    # Bound to its GPU from the start (notebook 5): NCCL then knows each rank's device, and
    # barrier() need not guess it.
    dist.init_process_group(backend, timeout=default_timeout(),
                            device_id=device if device.type == 'cuda' else None)
    rank, n = dist.get_rank(), dist.get_world_size()
    if args.batch_size % n:
        raise SystemExit(f'--batch-size {args.batch_size} must be a multiple of {n} processes')
    torch.set_num_threads(1)
    batches = get_batches(args)
    net = make_net(args.model, seed=rank).to(device)  # unequal: the wrappers copy rank 0's
    device_ids = [device] if device.type == 'cuda' else None

    def variants():
        yield 'DDP', DDP(copy.deepcopy(net), device_ids=device_ids)
        for variant in args.variant:
            if variant == 'hook':
                yield 'HookDDP', HookDDP(copy.deepcopy(net))
                continue
            for cap in args.buckets:
                cls = VARIANTS[variant]
                yield f'{cls.__name__} {cap:g} MB', cls(copy.deepcopy(net), bucket_cap_mb=cap)

    report = {'world_size': n, 'backend': backend, 'device': str(device),
              'params': sum(p.numel() for p in net.parameters()),
              'param_tensors': len(list(net.parameters())), 'global_batch': args.batch_size}
    if args.check_steps:
        # One process on the whole global batch, from rank 0's initial parameters.
        single = make_net(args.model, seed=0).to(device)
        train_steps(single, batches, args.check_steps, 0, 1, device, args.lr)
        results, report['allreduce_calls'], report['buckets'] = {}, {}, {}
        for name, wrapped in variants():
            with count_calls(['all_reduce']) as calls:
                train_steps(wrapped, batches, args.check_steps, rank, n, device, args.lr)
            results[name] = flat(wrapped)
            if name != 'DDP':  # DDP's reducer calls the process group from C++: not counted
                report['allreduce_calls'][name] = calls['all_reduce']['calls'] / args.check_steps
                report['buckets'][name] = [len(b) for b in getattr(wrapped, 'buckets', [])]
        reference = flat(single)
        report['max_diff'] = {name: (p - results['DDP']).abs().max().item()
                              for name, p in results.items()}
        report['max_diff_single'] = {name: (p - reference).abs().max().item()
                                     for name, p in results.items()}
        report['fingerprint'] = {name: p.double().sum().item() for name, p in results.items()}
        for name, p in results.items():
            torch.testing.assert_close(p, results['DDP'])
            torch.testing.assert_close(p, reference)
        print(f'after {args.check_steps} steps ' + ', '.join(results) + ' agree with one process '
              f'on the global batch (largest difference '
              f'{max(report["max_diff_single"].values()):.1e})', flush=True)

    if args.time_steps:
        models = list(variants())
        best = dict.fromkeys([name for name, _ in models], math.inf)
        for name, wrapped in models:  # warm-up
            train_steps(wrapped, batches, 2, rank, n, device, args.lr)
        for r in range(args.repeats):
            # Interleaved and rotated, so bursts of background load hit every variant.
            for name, wrapped in models[r % len(models):] + models[:r % len(models)]:
                dist.barrier()
                start = time.perf_counter()
                train_steps(wrapped, batches, args.time_steps, rank, n, device, args.lr)
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
