"""Will it fit, on a GPU: one FSDP2 step of a small Llama, its peak measured by CUDA's allocator.

Run:  torchrun --standalone --nproc-per-node=1 verify/scale_fit_cuda.py   (PYTHONPATH=the repo)

Notebook 17 checks `scale.predict`'s memory against CPU processes (`StepMemory`) and fake runs;
this is the same step on CUDA (bf16 compute, fp32 reduction, AdamW, full checkpointing, so that
torch's CUDA attention kernels save nothing the CPU one does not), measured over the second
step with torch.cuda.max_memory_allocated. verify/gpucheck.py compares it with the prediction.
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from d2lpar import scale
from d2lpar.distributed import emit_result

CFG = dict(dim=1024, n_layers=2, n_heads=8, n_kv_heads=4, hidden=2816, vocab=32000)
BATCH, SEQ, AC = 2, 1024, 'full'

local = int(os.environ.get('LOCAL_RANK', 0))
torch.cuda.set_device(local)
dist.init_process_group('nccl', device_id=torch.device('cuda', local))
torch.manual_seed(0)
net = scale.Llama(CFG, ac=AC).cuda()
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for block in net.layers:
    fully_shard(block, mp_policy=policy)
fully_shard(net, mp_policy=policy)
opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
tokens = torch.randint(0, CFG['vocab'], (BATCH, SEQ), device='cuda')


def step():
    loss = F.cross_entropy(net(tokens).flatten(0, 1).float(), tokens.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()


step()  # the optimizer's state exists from now on
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
step()
torch.cuda.synchronize()
emit_result(
    cfg=CFG,
    batch=BATCH,
    seq_len=SEQ,
    ac=AC,
    world_size=dist.get_world_size(),
    max_allocated=torch.cuda.max_memory_allocated(),
)
dist.destroy_process_group()
