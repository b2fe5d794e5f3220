"""Time one training step and count per-rank model-state bytes: DDP, hand ZeRO-1/2/3, FSDP2.

Run:  torchrun --standalone --nproc-per-node=2 scripts/sharding_bench.py --width 512 --steps 5
Same MLP, same batches for every method; each step time is the slowest rank's
median; bytes are the distinct storages of parameters, gradients and optimizer
state after the last step, and the process's resident set size (RSS).
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from d2lpar import sharding
from d2lpar.distributed import default_timeout, emit_result

parser = argparse.ArgumentParser()
parser.add_argument('--width', type=int, default=512)
parser.add_argument('--steps', type=int, default=5)
args = parser.parse_args()
dist.init_process_group('gloo', timeout=default_timeout())
rank, n = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)


def make_net():
    torch.manual_seed(0)
    w = args.width
    return nn.Sequential(nn.Linear(w, w), nn.Tanh(), nn.Linear(w, w), nn.Tanh(), nn.Linear(w, w))


def storage_bytes(tensors):
    seen = {}
    for t in tensors:
        if t is not None and t.numel() > 0:
            t = t.to_local() if hasattr(t, 'to_local') else t
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def rss():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * 4096


X, y = torch.randn(8, args.width), torch.randn(8, args.width)
results = {}
for method in ('DDP', 'Zero1', 'Zero2', 'Zero3', 'FSDP2'):
    net = make_net()
    shards = []
    if method == 'DDP':
        model, opt = DDP(net), torch.optim.AdamW(net.parameters(), lr=1e-3)
    elif method == 'FSDP2':
        mesh = init_device_mesh('cpu', (n,))
        for i in (0, 2, 4):
            fully_shard(net[i], mesh=mesh)
        model = fully_shard(net, mesh=mesh)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    else:
        model = net
        opt = getattr(sharding, method)(net if method == 'Zero3' else net.parameters(), lr=1e-3)
        shards = opt.shards
    times = []
    for _ in range(args.steps + 1):  # the first step warms up
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.mse_loss(model(X), y).backward()
        opt.step()
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
    state_opt = opt.optimizer if hasattr(opt, 'optimizer') else opt
    params = list(net.parameters())
    held = storage_bytes(params + [p.grad for p in params] + [s.grad for s in shards]
                         + list(shards) + [v for st in state_opt.state.values()
                                           for k, v in st.items() if k != 'step'])
    results[method] = {'seconds': statistics.median(times[1:]), 'bytes': held, 'rss': rss()}
    del model, net, opt, shards
emit_result(world_size=n, num_params=sum(p.numel() for p in make_net().parameters()),
            results=results)
dist.destroy_process_group()
