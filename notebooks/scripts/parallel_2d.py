"""2D parallelism: FSDP2 over one dimension of a 2x2 DeviceMesh, tensor parallelism over the other.

Run:  torchrun --standalone --nproc-per-node=4 scripts/parallel_2d.py --steps 3
The 4 ranks form a mesh of 2 data-parallel groups ('dp') of 2 tensor-parallel ranks ('tp').
A small transformer block (layer norms, notebook 12's SelfAttention, an MLP, residuals) is
split over 'tp' with parallelize_module (q, k, v and the MLP's first linear column-wise, the
attention output and the MLP's second linear row-wise), then sharded over 'dp' with
fully_shard. Each dp group trains on its half of every global batch, the two tp ranks of a
group on the same half. Every rank compares its parameters after --steps SGD steps with
one process trained on the whole batches, and hands back the differences and what it holds.
"""
import argparse
import logging
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from d2lpar import tensor_parallel as tp
from d2lpar.distributed import default_timeout, emit_result, exit_now

# FSDP2 warns that a wrapped module returned a view (in-place ops on it would skip a hook); we make none.
warnings.filterwarnings('ignore', message='FSDP2-wrapped module .* returned a view tensor')
# full_tensor() of a 2D-sharded parameter warns that it gathers one mesh dimension at a time;
# we call it only to compare, after training.
logging.getLogger('torch.distributed.tensor._redistribute').setLevel(logging.ERROR)
parser = argparse.ArgumentParser()
parser.add_argument('--steps', type=int, default=3)
args = parser.parse_args()
dist.init_process_group('gloo', timeout=default_timeout())
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
DIM, HEADS, HIDDEN, LR = 16, 4, 64, 0.1


class Block(nn.Module):
    """A transformer block: X + attention(norm(X)), then X + mlp(norm(X))."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # the same weights on every rank and in the reference
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attention = tp.SelfAttention(DIM, HEADS)
        self.mlp = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, DIM))

    def forward(self, X):
        X = X + self.attention(self.norm1(X))
        return X + self.mlp(self.norm2(X))


mesh = init_device_mesh('cpu', (2, world_size // 2), mesh_dim_names=('dp', 'tp'))
dp_rank = mesh['dp'].get_local_rank()
g = torch.Generator().manual_seed(1)
batches = [(torch.randn(8, 5, DIM, generator=g), torch.randn(8, 5, DIM, generator=g))
           for _ in range(args.steps)]


def train(net, shard):
    """Train `net` on `batches` (this dp group's half of each, if `shard`); return it."""
    # SGD: Adam would turn rounding noise into whole steps where a gradient is zero in exact
    # arithmetic (the keys' bias: softmax ignores a shift that all keys share).
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for X, y in batches:
        X, y = (X.chunk(2)[dp_rank], y.chunk(2)[dp_rank]) if shard else (X, y)
        opt.zero_grad()
        nn.functional.mse_loss(net(X), y).backward()
        opt.step()
    return net


reference = train(Block(), shard=False)
net = Block()
parallelize_module(net, mesh['tp'], {
    'attention.q': ColwiseParallel(), 'attention.k': ColwiseParallel(),
    'attention.v': ColwiseParallel(), 'attention.out': RowwiseParallel(),
    'mlp.0': ColwiseParallel(), 'mlp.2': RowwiseParallel()})
fully_shard(net, mesh=mesh['dp'])
train(net, shard=True)
diffs = {name: (p.full_tensor() - q.detach()).abs().max().item()
         for (name, p), q in zip(net.named_parameters(), reference.parameters())}
held = {name: dict(placements=str(p.placements), mesh=list(p.device_mesh.mesh_dim_names or ()),
                   local=list(p.to_local().shape), full=list(p.shape))
        for name, p in net.named_parameters()}
# Which rows of the full weight this rank's block of mlp.0.weight is (its rows are all different).
full, local = net.mlp[0].weight.full_tensor(), net.mlp[0].weight.to_local()
first_row = next(i for i, row in enumerate(full) if torch.equal(row, local[0]))
moved = max((p.detach() - q).abs().max().item()
            for p, q in zip(reference.parameters(), Block().parameters()))
print(f'rank {rank} (dp {dp_rank}, tp {mesh["tp"].get_local_rank()}): '
      f'largest difference from one process {max(diffs.values()):.1e}')
emit_result(dp=dp_rank, tp=mesh['tp'].get_local_rank(), max_diff=diffs, held=held,
            reference_moved=moved, steps=args.steps, mlp0_rows=[first_row, first_row + len(local)])
dist.destroy_process_group()
exit_now()
