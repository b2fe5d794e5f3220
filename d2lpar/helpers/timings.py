"""allreduce_timings: notebook 9's naive and ring allreduce timed against the built-in one."""

import math
import time

import torch
import torch.distributed as dist

from ..checks import positive_int, process_group_size
from ..devices import synchronize
from ..lessons.nb09_collectives import naive_allreduce, ring_allreduce

__all__ = ['allreduce_timings']


def allreduce_timings(sizes, repeats=5, min_bytes=1 << 22, max_iters=50):
    """Time naive, ring and built-in allreduce of float32 `sizes` (bytes) on every rank.

    Run it on every rank, on gloo (CPU tensors) or NCCL (tensors on the rank's current
    GPU, which it must have bound with torch.cuda.set_device). The variants are interleaved so that background noise
    hits them alike; each measurement averages enough calls to move `min_bytes`
    (at most `max_iters`), is the slowest rank's time, and the best of
    `repeats` is kept. Returns a list of dicts (method, bytes, seconds).
    """
    process_group_size('allreduce_timings')
    positive_int(repeats, 'allreduce_timings: repeats')
    # NCCL takes only tensors on this rank's GPU (the current one, bound before the group).
    device = torch.device('cuda', torch.cuda.current_device()) if dist.get_backend() == 'nccl' else torch.device('cpu')
    methods = {'naive': naive_allreduce, 'ring': ring_allreduce, 'built-in': dist.all_reduce}
    results = []
    for size in sizes:
        if size % 4 or size <= 0:
            raise ValueError(f'allreduce_timings: sizes are bytes of float32, so positive multiples of 4; got {size!r}')
        X = torch.zeros(size // 4, device=device)  # zeros stay zeros, however often summed
        iters = max(1, min(max_iters, math.ceil(min_bytes / size)))
        best = dict.fromkeys(methods, math.inf)
        for name, fn in methods.items():  # warm-up: connections, allocations
            fn(X)
        for _ in range(repeats):
            for name, fn in methods.items():
                dist.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    fn(X)
                synchronize(device)  # on a GPU the calls above only queued the work
                elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                best[name] = min(best[name], elapsed.item())
        results.extend({'method': name, 'bytes': size, 'seconds': t} for name, t in best.items())
    return results
