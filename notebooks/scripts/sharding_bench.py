"""Time one training step and measure its peak bytes per rank: DDP, hand ZeRO-1/2/3, FSDP2.

Run:  torchrun --standalone --nproc-per-node=2 scripts/sharding_bench.py --width 512 --steps 5
Same MLP (6 blocks of Linear(width, width) and Tanh), same batches, AdamW for every
strategy. Step time: the slowest rank's median over `steps` timed steps (after one
warm-up step). Peak: the most bytes of tensor storages rank 0 holds during one more
step (d2lpar.memory.StepMemory), next to notebook 10's model-state formula.
"""
import argparse
import statistics
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

from d2lpar import fsdp, zero
from d2lpar.distributed import default_timeout, emit_result
from d2lpar.memory import StepMemory

warnings.filterwarnings('ignore', message='.*returned a view tensor.*')
parser = argparse.ArgumentParser()
parser.add_argument('--width', type=int, default=512)
parser.add_argument('--steps', type=int, default=5)
args = parser.parse_args()
dist.init_process_group('gloo', timeout=default_timeout())
rank, n = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
W = args.width
layer_mb = (W * W + W) * 4 / 2**20


def make_net():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(W, W), nn.Tanh()) for _ in range(6)])


def build(method):
    """Return (model, optimizer, tensors held before a step)."""
    net = make_net()
    adamw = dict(lr=1e-3)
    if method == 'torch DDP':
        model = DDP(net, gradient_as_bucket_view=True)
        opt = torch.optim.AdamW(net.parameters(), **adamw)
        return model, opt, [net, opt]
    if method == 'hand DDP':
        model = zero.RingDDP(net, layer_mb)
        opt = torch.optim.AdamW(net.parameters(), **adamw)
        return model, opt, [net, opt]
    if method == 'FSDP2':
        fsdp.shard_blocks(net, init_device_mesh('cpu', (n,)), list(net))
        opt = torch.optim.AdamW(net.parameters(), **adamw)
        return net, opt, [net, opt]
    if method == 'ZeRO-1':
        opt = zero.Zero1(net.parameters(), torch.optim.AdamW, **adamw)
    elif method == 'ZeRO-2':
        opt = zero.Zero2(net.parameters(), torch.optim.AdamW, layer_mb, **adamw)
    else:
        opt = zero.Zero3(net, torch.optim.AdamW, layer_mb, **adamw)
    return net, opt, [net, opt.optimizer, opt.flats, opt.shards]


def step(model, opt, X, y):
    opt.zero_grad(set_to_none=False) if isinstance(model, DDP) else opt.zero_grad()
    nn.functional.mse_loss(model(X), y).backward()
    if hasattr(model, 'finish_sync'):
        model.finish_sync()
    opt.step()


X, y = torch.randn(8, W), torch.randn(8, W)
results = {}
for method in ('torch DDP', 'hand DDP', 'ZeRO-1', 'ZeRO-2', 'ZeRO-3', 'FSDP2'):
    model, opt, held = build(method)
    times = []
    for _ in range(args.steps + 1):  # the first step warms up and creates the optimizer state
        dist.barrier()
        start = time.perf_counter()
        step(model, opt, X, y)
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
    with StepMemory(*held) as mem:
        step(model, opt, X, y)
    results[method] = {'seconds': statistics.median(times[1:]), 'peak': mem.peak}
    del model, opt, held
emit_result(world_size=n, num_params=sum(p.numel() for p in make_net().parameters()),
            layer_bytes=(W * W + W) * 4, results=results)
dist.destroy_process_group()
