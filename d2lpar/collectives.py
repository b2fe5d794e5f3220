"""Collective operations written by hand from point-to-point messages (notebook 9).

Every function here runs on every rank of the default process group, like
its `torch.distributed` namesake, and is built only from point-to-point
messages (`send`/`recv`, `isend`): broadcast, reduce, all-gather,
reduce-scatter, a naive allreduce (reduce to one rank, then broadcast) and a
ring allreduce (ring reduce-scatter, then ring all-gather), with the cost
model that compares them. Each function's code is a `#@save` cell of
notebook 9 (tests/test_saved_cells.py compares them); the `_check_...`
functions validate the arguments before it runs (see d2lpar/_checks.py).
"""
import math
import time

import torch
import torch.distributed as dist

from ._checks import checked, finite_number, positive_int, process_group_size
from .devices import synchronize

__all__ = ['combine', 'broadcast', 'reduce', 'send_and_receive', 'ring_reduce_scatter',
           'ring_all_gather', 'all_gather', 'reduce_scatter', 'naive_allreduce', 'ring_allreduce',
           'allreduce_cost', 'bandwidths', 'allreduce_timings']

_OPS = (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX)


# Argument checks: run by @checked before each function, so that its code stays the algorithm.

def _tensor(caller, tensor, name='tensor'):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f'{caller}: expected a tensor, got {type(tensor).__name__}')
    if not tensor.is_contiguous():
        raise ValueError(f'{caller}: {name} is not contiguous, so it cannot be sent or received '
                         f'in place; pass t = {name}.contiguous() and copy the result back '
                         f'with {name}.copy_(t)')


def _rank(caller, name, value, world_size):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < world_size:
        raise ValueError(f'{caller}: {name} must be a rank in 0..{world_size - 1}, got {value!r}')


def _op(caller, op):
    if op == dist.ReduceOp.AVG:
        raise ValueError(f'{caller}: ReduceOp.AVG is not supported (gloo has an open correctness '
                         'report on it); reduce with ReduceOp.SUM, then divide by the world size')
    if not any(op == known for known in _OPS):
        raise ValueError(f'{caller}: op must be ReduceOp.SUM, PRODUCT, MIN or MAX, got {op!r}')


def _tensors(caller, name, tensors, world_size, like=None):
    """Check a list of one contiguous tensor per rank (shaped like `like`, if given)."""
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f'{caller}: {name} must be a list of {world_size} tensors, one per rank')
    if len(tensors) != world_size:
        raise ValueError(f'{caller}: {name} holds {len(tensors)} tensors for a world of '
                         f'{world_size} ranks; pass one per rank')
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f'{caller}: {name}[{i}] is a {type(t).__name__}, not a tensor')
        if like is not None and (t.shape != like.shape or t.dtype != like.dtype):
            raise ValueError(f'{caller}: {name}[{i}] has shape {tuple(t.shape)} and dtype '
                             f'{t.dtype}, expected {tuple(like.shape)} and {like.dtype} '
                             'like the tensor')
        if not t.is_contiguous():
            raise ValueError(f'{caller}: {name}[{i}] is not contiguous, so it cannot be received '
                             'into; allocate it with torch.empty_like(tensor)')


def _check_combine(a, b, op=dist.ReduceOp.SUM):
    _op('combine', op)


def _check_broadcast(tensor, src):
    n = process_group_size('broadcast')
    _tensor('broadcast', tensor)
    _rank('broadcast', 'src', src, n)


def _check_reduce(tensor, dst, op=dist.ReduceOp.SUM):
    n = process_group_size('reduce')
    _tensor('reduce', tensor)
    _rank('reduce', 'dst', dst, n)
    _op('reduce', op)


def _check_ring_reduce_scatter(blocks, op=dist.ReduceOp.SUM):
    _tensors('ring_reduce_scatter', 'blocks', blocks, process_group_size('ring_reduce_scatter'))
    _op('ring_reduce_scatter', op)


def _check_ring_all_gather(blocks):
    _tensors('ring_all_gather', 'blocks', blocks, process_group_size('ring_all_gather'))


def _check_all_gather(tensor_list, tensor):
    n = process_group_size('all_gather')
    _tensor('all_gather', tensor)
    _tensors('all_gather', 'tensor_list', tensor_list, n, like=tensor)


def _check_reduce_scatter(output, input_list, op=dist.ReduceOp.SUM):
    n = process_group_size('reduce_scatter')
    _tensor('reduce_scatter', output, 'output')
    _op('reduce_scatter', op)
    if isinstance(input_list, (list, tuple)):  # inputs are cloned, so any layout will do
        input_list = [t.contiguous() if isinstance(t, torch.Tensor) else t for t in input_list]
    _tensors('reduce_scatter', 'input_list', input_list, n, like=output)


def _check_allreduce(caller):
    def check(tensor, op=dist.ReduceOp.SUM):
        process_group_size(caller)
        _tensor(caller, tensor)
        _op(caller, op)
    return check


def _check_allreduce_cost(algorithm, n, size, bandwidth, latency=0.0):
    caller = 'allreduce_cost'
    if algorithm not in ('naive', 'ring'):
        raise ValueError(f"{caller}: algorithm must be 'naive' or 'ring', got {algorithm!r}")
    positive_int(n, f'{caller}: n (the number of processes)')
    finite_number(size, 'size (bytes)', caller)
    finite_number(bandwidth, 'bandwidth (bytes/s)', caller, positive=True)
    finite_number(latency, 'latency (s)', caller)


def _check_bandwidths(size, seconds, n):
    positive_int(n, 'bandwidths: n (the number of processes)')
    finite_number(size, 'size (bytes)', 'bandwidths')
    finite_number(seconds, 'seconds', 'bandwidths', positive=True)


# The algorithms: each is the `#@save` cell of notebook 9 that teaches it.

@checked(_check_combine)
def combine(a, b, op=dist.ReduceOp.SUM):
    """Combine `b` into `a` in place with a reduce op: SUM, PRODUCT, MIN or MAX."""
    if op == dist.ReduceOp.SUM:
        return a.add_(b)
    if op == dist.ReduceOp.PRODUCT:
        return a.mul_(b)
    if op == dist.ReduceOp.MIN:
        return torch.minimum(a, b, out=a)
    return torch.maximum(a, b, out=a)


@checked(_check_broadcast)
def broadcast(tensor, src):
    """Copy `tensor` of rank `src` into `tensor` on every rank: `src` sends it to each in turn."""
    if dist.get_rank() == src:
        for dst in range(dist.get_world_size()):
            if dst != src:
                dist.send(tensor, dst)
    else:
        dist.recv(tensor, src)
    return tensor


@checked(_check_reduce)
def reduce(tensor, dst, op=dist.ReduceOp.SUM):
    """Combine `tensor` of every rank into `tensor` on rank `dst`; the others' stay unchanged."""
    if dist.get_rank() != dst:
        dist.send(tensor, dst)
        return tensor
    received = torch.empty_like(tensor)
    for src in range(dist.get_world_size()):  # in rank order: the same rounding every run
        if src != dst:
            dist.recv(received, src)
            combine(tensor, received, op)
    return tensor


def send_and_receive(tensor, dst, received, src):
    """Send `tensor` to rank `dst` while receiving `received` from rank `src`; wait for both."""
    # One batch, not an isend and then a recv: NCCL may hold a send until the peer posts
    # its receive, so two ranks that each send first can wait for each other forever
    # (NCCL's docs: concurrent sends and receives must be grouped). batch_isend_irecv
    # starts both as one NCCL group; gloo, which sends without waiting, runs them in turn.
    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, dst),
                                       dist.P2POp(dist.irecv, received, src)])
    for request in requests:
        request.wait()
    return received


@checked(_check_ring_reduce_scatter)
def ring_reduce_scatter(blocks, op=dist.ReduceOp.SUM):
    """Combine `blocks` (one per rank) around a ring: rank r ends with block r's total."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        send, recv = (rank - step - 1) % n, (rank - step - 2) % n
        received = send_and_receive(blocks[send], right, torch.empty_like(blocks[recv]), left)
        combine(blocks[recv], received, op)
    return blocks


@checked(_check_ring_all_gather)
def ring_all_gather(blocks):
    """Pass complete blocks around a ring until every rank has all; rank r starts with block r."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        send, recv = (rank - step) % n, (rank - step - 1) % n
        send_and_receive(blocks[send], right, blocks[recv], left)
    return blocks


@checked(_check_all_gather)
def all_gather(tensor_list, tensor):
    """Fill `tensor_list[r]` with `tensor` of rank r, on every rank, around a ring."""
    tensor_list[dist.get_rank()].copy_(tensor)
    ring_all_gather(tensor_list)
    return tensor_list


@checked(_check_reduce_scatter)
def reduce_scatter(output, input_list, op=dist.ReduceOp.SUM):
    """Set `output` on rank r to input_list[r] combined over all ranks, around a ring."""
    blocks = [t.clone() for t in input_list]  # as in torch.distributed, the inputs stay untouched
    ring_reduce_scatter(blocks, op)
    return output.copy_(blocks[dist.get_rank()])


@checked(_check_allreduce('naive_allreduce'))
def naive_allreduce(tensor, op=dist.ReduceOp.SUM):
    """Combine `tensor` over all ranks in place: reduce to rank 0, then broadcast from it."""
    reduce(tensor, 0, op)
    return broadcast(tensor, 0)


@checked(_check_allreduce('ring_allreduce'))
def ring_allreduce(tensor, op=dist.ReduceOp.SUM):
    """Combine `tensor` over all ranks in place: ring reduce-scatter, then ring all-gather."""
    # n views of the flat tensor, their sizes differing by at most one (empty if numel < n)
    blocks = tensor.view(-1).tensor_split(dist.get_world_size())
    ring_reduce_scatter(blocks, op)
    ring_all_gather(blocks)
    return tensor


@checked(_check_allreduce_cost)
def allreduce_cost(algorithm, n, size, bandwidth, latency=0.0):
    """Return the model's seconds for an allreduce of `size` bytes on `n` ranks."""
    if n == 1:
        return 0.0
    if algorithm == 'naive':  # rank 0 receives n-1 tensors, then sends n-1, one at a time
        return 2 * (n - 1) * latency + 2 * (n - 1) * size / bandwidth
    return 2 * (n - 1) * latency + 2 * (n - 1) / n * size / bandwidth  # 2(n-1) steps of size/n


@checked(_check_bandwidths)
def bandwidths(size, seconds, n):
    """Return (algbw, busbw) in bytes/s of an allreduce, as nccl-tests defines them."""
    algbw = size / seconds
    return algbw, algbw * 2 * (n - 1) / n


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
    device = (torch.device('cuda', torch.cuda.current_device())
              if dist.get_backend() == 'nccl' else torch.device('cpu'))
    methods = {'naive': naive_allreduce, 'ring': ring_allreduce, 'built-in': dist.all_reduce}
    results = []
    for size in sizes:
        if size % 4 or size <= 0:
            raise ValueError(f'allreduce_timings: sizes are bytes of float32, so positive '
                             f'multiples of 4; got {size!r}')
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
                elapsed = torch.tensor([(time.perf_counter() - start) / iters],
                                       dtype=torch.float64, device=device)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                best[name] = min(best[name], elapsed.item())
        results.extend({'method': name, 'bytes': size, 'seconds': t} for name, t in best.items())
    return results
