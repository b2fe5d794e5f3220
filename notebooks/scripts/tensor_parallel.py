"""Tensor parallelism on N processes: by hand (Megatron), with DTensor, and the bytes it moves.

Run:  torchrun --standalone --nproc-per-node=2 scripts/tensor_parallel.py --batches 32 128
Part 1: notebook 11's ParallelMLP and ParallelSelfAttention against the unsplit modules on
the same input (every rank gets the whole batch: tensor parallelism splits layers, not data),
all_reduce calls and bytes counted in forward and backward.
Part 2: DTensor placements Shard, Replicate and Partial on a small tensor (what each rank
holds, what full_tensor() returns, which collective each redistribute runs).
Part 3: parallelize_module with ColwiseParallel/RowwiseParallel on the same MLP and attention,
against the hand-written versions, collectives counted with CommDebugMode.
Part 4: the bytes data parallelism (notebook 9's HookDDP, each rank a shard of the batch) and
tensor parallelism (ParallelMLP) all-reduce in one training step, for each batch size in
--batches. Every rank hands back what it computed; the notebook asserts.
"""
import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from d2lpar import tensor_parallel as tp
from d2lpar.distributed import count_calls, default_timeout, emit_result, exit_now
from d2lpar.miniddp import HookDDP

parser = argparse.ArgumentParser()
parser.add_argument('--batches', type=int, nargs='+', default=[32, 128])
args = parser.parse_args()
dist.init_process_group('gloo', timeout=default_timeout())
rank, n = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
D, H, HEADS = 16, 64, 4  # the MLP is Linear(D, H), ReLU, Linear(H, D); attention has D features


def make_mlp():
    torch.manual_seed(0)  # the same weights on every rank, and in the unsplit reference
    return nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, D))


def make_attention():
    torch.manual_seed(0)
    return tp.SelfAttention(D, HEADS)


g = torch.Generator().manual_seed(1)
inputs = {'mlp': torch.randn(8, D, generator=g), 'attention': torch.randn(2, 5, D, generator=g)}


def step(net, X):
    """Forward and backward of a fixed linear loss; return output, gradients and collectives."""
    X = X.clone().requires_grad_()
    with count_calls(['all_reduce']) as forward, CommDebugMode() as comm:
        out = net(X)
        forward_dtensor = sum(comm.get_comm_counts().values())
    with count_calls(['all_reduce']) as backward, CommDebugMode() as comm_back:
        weights = torch.linspace(-1, 1, out.numel()).view_as(out)  # a loss not symmetric in the outputs
        (out * weights).sum().backward()
        backward_dtensor = sum(comm_back.get_comm_counts().values())
    local = lambda t: t.to_local() if isinstance(t, DTensor) else t
    return dict(out=out.detach(), grads=[local(p.grad) for p in net.parameters()], x_grad=X.grad,
                names=[name for name, _ in net.named_parameters()],
                all_reduce=[forward['all_reduce'], backward['all_reduce']],
                dtensor_collectives=[forward_dtensor, backward_dtensor])


# Part 1: by hand
report = {'world_size': n, 'D': D, 'H': H, 'heads': HEADS}
report['unsplit'] = {'mlp': step(make_mlp(), inputs['mlp']),
                     'attention': step(make_attention(), inputs['attention'])}
report['hand'] = {'mlp': step(tp.ParallelMLP(make_mlp()), inputs['mlp']),
                  'attention': step(tp.ParallelSelfAttention(make_attention()), inputs['attention'])}

# Part 2: placements
mesh = init_device_mesh('cpu', (n,))
A = torch.arange(4. * 2 * n).view(2 * n, 4)  # the same full tensor on every rank
placements = {}
for name, placement in [('Shard(0)', Shard(0)), ('Shard(1)', Shard(1)), ('Replicate()', Replicate())]:
    dA = distribute_tensor(A, mesh, [placement])
    placements[name] = dict(local=dA.to_local(), full=dA.full_tensor())
mine = torch.full((2, 2), float(rank + 1))  # a different tensor on each rank
dP = DTensor.from_local(mine, mesh, [Partial()])  # "each rank holds a term of the sum"
placements['Partial()'] = dict(local=dP.to_local(), full=dP.full_tensor())
report['placements'] = placements
redistributions = {}
for source, target in [(Partial(), Replicate()), (Shard(0), Replicate()), (Partial(), Shard(0))]:
    start = dP if source == Partial() else distribute_tensor(A, mesh, [source])
    with CommDebugMode() as comm:
        result = start.redistribute(mesh, [target])
    redistributions[f'{source} -> {target}'] = dict(
        collectives={str(k).split('.')[-1]: v for k, v in comm.get_comm_counts().items() if v},
        local=result.to_local())
report['redistribute'] = redistributions

# Part 3: parallelize_module on the same modules
mlp_plan = {'0': ColwiseParallel(), '2': RowwiseParallel()}
attention_plan = {'q': ColwiseParallel(), 'k': ColwiseParallel(), 'v': ColwiseParallel(),
                  'out': RowwiseParallel()}
mlp = parallelize_module(make_mlp(), mesh, mlp_plan)
report['dtensor'] = {'mlp': step(mlp, inputs['mlp']),
                     'attention': step(parallelize_module(make_attention(), mesh, attention_plan),
                                       inputs['attention'])}
report['dtensor_weight'] = {name: dict(placements=str(p.placements), local=list(p.to_local().shape),
                                       full=list(p.shape)) for name, p in mlp.named_parameters()}

# Part 4: bytes all-reduced per training step
report['bytes'] = {}
for B in args.batches:
    # The input's gradient is wanted, as it is for every layer but the first of a deeper network.
    X = torch.randn(B, D, generator=g).requires_grad_()
    data = HookDDP(make_mlp())  # notebook 9: every gradient all-reduced in a hook
    with count_calls(['all_reduce']) as data_calls:
        data(X.chunk(n)[rank]).pow(2).mean().backward()
    with count_calls(['all_reduce']) as tensor_calls:
        tp.ParallelMLP(make_mlp())(X).pow(2).mean().backward()
    report['bytes'][B] = {'data': data_calls['all_reduce'], 'tensor': tensor_calls['all_reduce']}

print(f'rank {rank}: hand-written, DTensor and bytes done')
emit_result(report)
dist.destroy_process_group()
exit_now()  # HookDDP keeps gloo's threads alive, and Python's own teardown can abort on them
