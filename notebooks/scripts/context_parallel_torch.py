"""PyTorch's own context parallelism (torch.distributed.tensor.experimental.context_parallel).

Run:  torchrun --standalone --nproc-per-node=2 scripts/context_parallel_torch.py

Inside `context_parallel(mesh, buffers=...)` every rank keeps its part of
each buffer along the sequence (in the head-tail, that is zig-zag, order) and
`F.scaled_dot_product_attention` runs as ring attention over the mesh. Each
rank compares its output and gradients with full attention in one process.
With 2+ GPUs the ranks use NCCL and a GPU each; otherwise gloo and the CPU,
where torch has no context-parallel rule for its CPU attention kernel: the
rank then reports the error it got instead of a result. On GPUs (NCCL) such an
error is a failure: the script exits with status 1.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import context_parallel_unshard

from d2lpar.distributed import (default_timeout, dist_env, emit_result, pick_backend,
                                rank_device)

env = dist_env()
backend = pick_backend(env.local_world_size)
device = rank_device(backend, env.local_rank)
dist.init_process_group(backend, timeout=default_timeout(),
                        device_id=device if device.type == 'cuda' else None)
rank, n = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh(device.type, (n,))
torch.backends.cuda.matmul.allow_tf32 = False  # float32 as written, on any GPU

torch.manual_seed(0)  # the same sequence on every rank: (batch, heads, sequence, d)
S = 64 * n
Q, K, V, G = (torch.randn(1, 2, S, 32, device=device) for _ in range(4))
full_QKV = [t.clone().requires_grad_() for t in (Q, K, V)]
full = F.scaled_dot_product_attention(*full_QKV, is_causal=True)
(full * G).sum().backward()

report = {'backend': backend, 'device': str(device), 'torch': torch.__version__}
try:
    # The buffers are cut in place on entry (and restored on exit): plain tensors, no grad.
    with context_parallel(mesh, buffers=[Q, K, V, G], buffer_seq_dims=[2, 2, 2, 2]):
        q, k, v = (t.detach().requires_grad_() for t in (Q, K, V))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        (out * G).sum().backward()
        local = [out.detach(), q.grad, k.grad, v.grad]
    # Put the rank's parts back together, in sequence order, to compare with one process.
    ours = context_parallel_unshard(mesh, local, [2, 2, 2, 2])
    theirs = [full.detach()] + [t.grad for t in full_QKV]
    eps = torch.finfo(torch.float32).eps
    errors = [(a - b).abs().max().item() for a, b in zip(ours, theirs)]
    bounds = [S * eps * b.abs().max().item() for b in theirs]  # rounding of sums of S terms
    assert all(e <= b for e, b in zip(errors, bounds)), (errors, bounds)
    report.update(supported=True, local_shape=list(local[0].shape), errors=errors)
    print(f'rank {rank}: context_parallel output and gradients equal full attention '
          f'(largest difference {max(errors):.1e})')
except NotImplementedError as e:  # no context-parallel rule for this device's attention kernel
    report.update(supported=False, error=type(e).__name__, message=str(e).splitlines()[0])
    print(f'rank {rank}: context_parallel is not supported here: {report["message"]}')
emit_result(report)
dist.destroy_process_group()
if backend == 'nccl' and not report['supported']:  # on GPUs torch has the rule: a failure
    raise SystemExit(f'rank {rank}: context_parallel failed on {device}')
