"""Train one tiny MLP with hand-written ZeRO-1/2/3 and with FSDP2; compare each with single-process AdamW.

Run:  torchrun --standalone --nproc-per-node=2 scripts/sharding_zero.py
Every rank takes its slice of the same global batches, runs each method for a few
steps from the same start, and hands back: the largest difference from one
single-process AdamW run on the whole batch, and the bytes of the distinct tensor
storages it holds for parameters, gradients and optimizer state after the last step.
It also runs FSDP2 with reshard_after_forward True and False (parameter bytes held between
forward and backward, collectives counted) and DDP, side by side, on the same batches.
"""
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.nn.parallel import DistributedDataParallel as DDP

from d2lpar import sharding
from d2lpar.distributed import default_timeout, emit_result

# FSDP2 warns that a wrapped module returned a view (in-place ops on it would skip a hook); we make none.
warnings.filterwarnings('ignore', message='FSDP2-wrapped module .* returned a view tensor')
STEPS, LR, WD = 3, 0.05, 0.01
dist.init_process_group('gloo', timeout=default_timeout())
rank, n = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)


def make_net():
    """Return the same MLP on every rank; every tensor's size divides by 2 and by 4."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8))


g = torch.Generator().manual_seed(1)
data = [(torch.randn(4 * n, 16, generator=g), torch.randn(4 * n, 8, generator=g)) for _ in range(STEPS)]


def train(net, opt, whole_batch=False):
    for X, y in data:
        opt.zero_grad()
        if not whole_batch:
            X, y = X.chunk(n)[rank], y.chunk(n)[rank]
        nn.functional.mse_loss(net(X), y).backward()
        opt.step()


def storage_bytes(tensors):
    """Sum the bytes of the distinct storages behind `tensors` (a view adds nothing)."""
    seen = {}
    for t in tensors:
        if t is not None and t.numel() > 0:
            t = t.to_local() if isinstance(t, DTensor) else t
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def held(net, opt, shards=()):
    """Bytes of parameters, gradients and optimizer state this rank holds."""
    params = list(net.parameters())
    grads = [p.grad for p in params] + [s.grad for s in shards]
    states = list(shards) + [v for st in opt.state.values() for k, v in st.items() if k != 'step']
    return {'params': storage_bytes(params), 'grads': storage_bytes(grads),
            'state': storage_bytes(states)}


reference = make_net()
adamw = torch.optim.AdamW(reference.parameters(), lr=LR, weight_decay=WD)
train(reference, adamw, whole_batch=True)
want = [p.detach() for p in reference.parameters()]
results = {'num_params': sum(p.numel() for p in want),
           'ddp_like': held(reference, adamw)}  # one full AdamW copy: what DDP keeps per rank

for stage in ('Zero1', 'Zero2', 'Zero3'):
    net = make_net()
    opt = getattr(sharding, stage)(net if stage == 'Zero3' else net.parameters(), lr=LR, weight_decay=WD)
    train(net, opt)
    memory = held(net, opt.optimizer, opt.shards)
    if stage == 'Zero3':
        opt.gather(net[0]), opt.gather(net[2])  # full parameters again, to compare
    diff = max((p.detach() - w).abs().max().item() for p, w in zip(net.parameters(), want))
    results[stage] = dict(memory, max_diff=diff)

mesh = init_device_mesh('cpu', (n,))


def fsdp2_net(reshard_after_forward=True):
    """Return make_net() with fully_shard on each Linear and on the root."""
    net = make_net()
    for layer in (net[0], net[2]):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return fully_shard(net, mesh=mesh)


net = fsdp2_net()
opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WD)
train(net, opt)
weight = net[0].weight
results['fsdp2'] = dict(held(net, opt), placements=str(weight.placements),
                        local_shape=list(weight.to_local().shape), global_shape=list(weight.shape),
                        max_diff=max((p.full_tensor() - w).abs().max().item()
                                     for p, w in zip(net.parameters(), want)))

# Between forward and backward: which parameter bytes stay, and which collectives run where.
for reshard in (True, False):
    net, X = fsdp2_net(reshard), data[0][0].chunk(n)[rank]
    between = {}
    net.register_forward_hook(lambda m, args, out: between.update(bytes=storage_bytes(m.parameters())))
    with CommDebugMode() as comm:
        out = net(X)
        forward = dict(comm.get_comm_counts())
        out.sum().backward()
        total = dict(comm.get_comm_counts())
    count = lambda counts, op: sum(v for k, v in counts.items() if op in str(k))
    results[f'reshard_{reshard}'] = dict(
        bytes_between=between['bytes'],
        all_gathers_forward=count(forward, 'allgather'),
        all_gathers_backward=count(total, 'allgather') - count(forward, 'allgather'),
        reduce_scatters=count(total, 'reduce_scatter'))

# DDP, side by side: the same batches, the same start, full copies everywhere.
net = DDP(make_net())
train(net, torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WD))
results['ddp'] = dict(max_diff=max((p.detach() - w).abs().max().item()
                                   for p, w in zip(net.module.parameters(), want)))
print(f'rank {rank}: ' + ', '.join(f'{k} {v["max_diff"]:.1e}' for k, v in results.items()
                                   if isinstance(v, dict) and 'max_diff' in v))
emit_result(results)
dist.destroy_process_group()
