"""Save an FSDP2 model's sharded state with torch.distributed.checkpoint, or load it on another world size.

Run:  torchrun --standalone --nproc-per-node=4 scripts/sharding_checkpoint.py save CHECKPOINT_DIR
      torchrun --standalone --nproc-per-node=2 scripts/sharding_checkpoint.py load CHECKPOINT_DIR
`save` trains one AdamW step and writes each rank's shards (no rank gathers the
model); `load` builds the model over a mesh of a different size, reads the
checkpoint into its own shards (resharding) and checks nothing else loaded.
Both hand back the full parameters (gathered only to compare) and the local shard shapes.
"""
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from d2lpar.distributed import default_timeout, emit_result

mode, path = sys.argv[1], sys.argv[2]
dist.init_process_group('gloo', timeout=default_timeout())
rank, n = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0 if mode == 'save' else 1)  # `load` starts from other weights on purpose
net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4))
mesh = init_device_mesh('cpu', (n,))
for layer in (net[0], net[2]):
    fully_shard(layer, mesh=mesh)
fully_shard(net, mesh=mesh)
if mode == 'save':
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    nn.functional.mse_loss(net(torch.randn(4, 6)), torch.randn(4, 4)).backward()
    opt.step()
    dcp.save(net.state_dict(), checkpoint_id=path)
else:
    before = {k: v.full_tensor().tolist() for k, v in net.state_dict().items()}
    state = net.state_dict()
    dcp.load(state, checkpoint_id=path)  # in place, into this rank's shards
full = {k: v.full_tensor().tolist() for k, v in net.state_dict().items()}
local = {k: list(v.to_local().shape) for k, v in net.state_dict().items()}
emit_result(mode=mode, world_size=n, full=full, local_shapes=local,
            before=before if mode == 'load' else None)
dist.destroy_process_group()
