"""Collective operations written by hand from point-to-point messages.

Every function here runs on every rank of the default process group, like
its `torch.distributed` namesake, and is built only from point-to-point
messages (`send`/`recv`, `isend`/`irecv`):
broadcast, reduce, all-gather, reduce-scatter, a naive allreduce (reduce to
one rank, then broadcast) and a chunked ring allreduce (reduce-scatter, then
all-gather). Pass `traffic={}` to count the bytes this rank sends and
receives, which is what the cost model of the notebook predicts.
"""
import math
import time

import torch
import torch.distributed as dist

from ._checks import positive_int

__all__ = ['broadcast', 'reduce', 'all_gather', 'reduce_scatter', 'naive_allreduce',
           'ring_allreduce', 'allreduce_cost', 'bandwidths', 'allreduce_timings']

_COMBINE = (  # (op, in-place combine of a received tensor into ours)
    (dist.ReduceOp.SUM, torch.Tensor.add_),
    (dist.ReduceOp.PRODUCT, torch.Tensor.mul_),
    (dist.ReduceOp.MIN, lambda a, b: torch.minimum(a, b, out=a)),
    (dist.ReduceOp.MAX, lambda a, b: torch.maximum(a, b, out=a)),
)


def _setup(caller, tensor=None):
    """Return (rank, world_size) of the default group after checking the arguments."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f'{caller}: no process group; call torch.distributed.'
                           'init_process_group first (each rank of a script run by torchrun)')
    if tensor is not None and not isinstance(tensor, torch.Tensor):
        raise TypeError(f'{caller}: expected a tensor, got {type(tensor).__name__}')
    return dist.get_rank(), dist.get_world_size()


def _check_rank(caller, name, value, world_size):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < world_size:
        raise ValueError(f'{caller}: {name} must be a rank in 0..{world_size - 1}, got {value!r}')


def _combiner(caller, op):
    if op == dist.ReduceOp.AVG:
        raise ValueError(f'{caller}: ReduceOp.AVG is not supported (gloo has an open correctness '
                         'report on it); reduce with ReduceOp.SUM, then divide by the world size')
    for key, combine in _COMBINE:
        if op == key:
            return combine
    raise ValueError(f'{caller}: op must be ReduceOp.SUM, PRODUCT, MIN or MAX, got {op!r}')


def _check_list(caller, name, tensors, like, world_size):
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f'{caller}: {name} must be a list of {world_size} tensors, one per rank')
    if len(tensors) != world_size:
        raise ValueError(f'{caller}: {name} holds {len(tensors)} tensors for a world of '
                         f'{world_size} ranks; pass one per rank')
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f'{caller}: {name}[{i}] is a {type(t).__name__}, not a tensor')
        if t.shape != like.shape or t.dtype != like.dtype:
            raise ValueError(f'{caller}: {name}[{i}] has shape {tuple(t.shape)} and dtype {t.dtype}, '
                             f'expected {tuple(like.shape)} and {like.dtype} like the tensor')


def _count(traffic, key, tensor):
    if traffic is not None:
        traffic[key] = traffic.get(key, 0) + tensor.numel() * tensor.element_size()


def _contiguous(tensor):
    """Return a contiguous flat tensor to work on, and whether it must be copied back."""
    if tensor.is_contiguous():
        return tensor.view(-1), False
    return tensor.reshape(-1).clone(), True


def broadcast(tensor, src, traffic=None):
    """Copy `tensor` of rank `src` into `tensor` on every rank: `src` sends it to each in turn."""
    rank, n = _setup('broadcast', tensor)
    _check_rank('broadcast', 'src', src, n)
    flat, copy_back = _contiguous(tensor)
    if rank == src:
        works = [dist.isend(flat, dst) for dst in range(n) if dst != src and flat.numel()]
        for work in works:
            _count(traffic, 'sent', flat)
            work.wait()
    else:
        if flat.numel():
            _count(traffic, 'received', flat)
            dist.recv(flat, src)
        if copy_back:
            tensor.copy_(flat.view_as(tensor))
    return tensor


def reduce(tensor, dst, op=dist.ReduceOp.SUM, traffic=None):
    """Combine `tensor` of every rank into `tensor` on rank `dst`; other ranks' tensors are unchanged."""
    rank, n = _setup('reduce', tensor)
    _check_rank('reduce', 'dst', dst, n)
    combine = _combiner('reduce', op)
    flat, copy_back = _contiguous(tensor)
    if rank != dst:
        if flat.numel():
            _count(traffic, 'sent', flat)
            dist.send(flat, dst)
        return tensor
    # Receive from everyone at once, then combine in rank order (a fixed
    # order gives the same float rounding on every run).
    parts = {src: torch.empty_like(flat) for src in range(n) if src != dst}
    works = [dist.irecv(buf, src) for src, buf in parts.items() if buf.numel()]
    for buf in parts.values():
        _count(traffic, 'received', buf)
    for work in works:
        work.wait()
    for src in sorted(parts):
        combine(flat, parts[src])
    if copy_back:
        tensor.copy_(flat.view_as(tensor))
    return tensor


def _ring(blocks, rank, n, traffic, combine=None, gather=True):
    """Pass `blocks` around the ring in place: reduce-scatter (if `combine`), then all-gather.

    Reduce-scatter: in each of n-1 steps every rank sends one block's partial
    result to its right neighbour and combines the block arriving from its
    left one into its own copy; afterwards rank r holds the total of blocks[r].
    All-gather: in n-1 more steps every rank passes a complete block on, so
    that every rank ends with all of them.
    """
    if n == 1:
        return
    right, left = (rank + 1) % n, (rank - 1) % n
    # (phase, block to send, block to receive) of each step; the block received in
    # one step is the one sent in the next.
    steps = []
    if combine is not None:
        steps += [('reduce', (rank - t - 1) % n, (rank - t - 2) % n) for t in range(n - 1)]
    if gather:
        steps += [('gather', (rank - t) % n, (rank - t - 1) % n) for t in range(n - 1)]
    # Partial results arrive in one of two buffers, so the next step's receive can
    # be posted before this step's block is combined: the left neighbour's next
    # message flows in while we add. Sends are waited for only when their block
    # is about to be overwritten (or at the end): waiting for each send would tie
    # every step to the right neighbour's progress as well as the left one's.
    size = max(b.numel() for b in blocks)
    buffers = [blocks[0].new_empty(size) for _ in range(2 if combine is not None else 0)]
    sending = {}  # block -> its send still in flight; waited for only before the block is overwritten

    def post_receive(t):
        phase, _, b = steps[t]
        if phase == 'reduce':
            target = buffers[t % 2][:blocks[b].numel()].view_as(blocks[b])
        else:
            target = blocks[b]
            if b in sending:
                sending.pop(b).wait()
        _count(traffic, 'received', target)
        return target, dist.irecv(target, left) if target.numel() else None

    receive = post_receive(0)
    for t, (phase, send, recv) in enumerate(steps):
        if blocks[send].numel():
            if send in sending:
                sending.pop(send).wait()
            sending[send] = dist.isend(blocks[send], right)
            _count(traffic, 'sent', blocks[send])
        target, work = receive
        if work is not None:
            work.wait()
        if t + 1 < len(steps):
            receive = post_receive(t + 1)
        if phase == 'reduce':
            combine(blocks[recv], target)
    for work in sending.values():
        work.wait()


def all_gather(tensor_list, tensor, traffic=None):
    """Fill `tensor_list[r]` with `tensor` of rank r on every rank, passing blocks around a ring."""
    rank, n = _setup('all_gather', tensor)
    _check_list('all_gather', 'tensor_list', tensor_list, tensor, n)
    for i, t in enumerate(tensor_list):
        if not t.is_contiguous():
            raise ValueError(f'all_gather: tensor_list[{i}] is not contiguous, so it cannot be '
                             'received into; allocate the outputs with torch.empty_like(tensor)')
    tensor_list[rank].copy_(tensor)
    _ring(tensor_list, rank, n, traffic)
    return tensor_list


def reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, traffic=None):
    """Set `output` on rank r to input_list[r] combined over all ranks, around a ring."""
    rank, n = _setup('reduce_scatter', output)
    _check_list('reduce_scatter', 'input_list', input_list, output, n)
    combine = _combiner('reduce_scatter', op)
    # Work on a copy: partial results pass through every block but one, and
    # the inputs, as with torch.distributed.reduce_scatter, stay untouched.
    work = torch.stack([t.detach() for t in input_list])
    _ring(list(work.unbind()), rank, n, traffic, combine, gather=False)
    output.copy_(work[rank])
    return output


def naive_allreduce(tensor, op=dist.ReduceOp.SUM, traffic=None):
    """Combine `tensor` over all ranks in place: reduce to rank 0, then broadcast from it."""
    reduce(tensor, 0, op, traffic)
    return broadcast(tensor, 0, traffic)


def ring_allreduce(tensor, op=dist.ReduceOp.SUM, traffic=None):
    """Combine `tensor` over all ranks in place: ring reduce-scatter of n chunks, then ring all-gather."""
    rank, n = _setup('ring_allreduce', tensor)
    combine = _combiner('ring_allreduce', op)
    flat, copy_back = _contiguous(tensor)
    if n == 1 or flat.numel() == 0:
        return tensor
    # tensor_split makes n contiguous views of sizes differing by at most one
    # (some empty when numel < n), so no padding copy is needed.
    _ring(flat.tensor_split(n), rank, n, traffic, combine)
    if copy_back:
        tensor.copy_(flat.view_as(tensor))
    return tensor


def allreduce_cost(algorithm, n, size, bandwidth, latency=0.0):
    """Return the model's seconds for an allreduce of `size` bytes on `n` ranks.

    naive: rank 0 receives n-1 messages of `size` and sends n-1 back, one
    after another through its link: 2 latencies + 2(n-1) size / bandwidth.
    ring: 2(n-1) steps, each one latency and size/n bytes on every link at once.
    """
    if algorithm not in ('naive', 'ring'):
        raise ValueError(f"allreduce_cost: algorithm must be 'naive' or 'ring', got {algorithm!r}")
    numbers = (size, bandwidth, latency)
    if (not isinstance(n, int) or isinstance(n, bool) or n < 1
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers)
            or size < 0 or bandwidth <= 0 or latency < 0):
        raise ValueError('allreduce_cost: need an int n >= 1 and numbers size >= 0 (bytes), '
                         'bandwidth > 0 (bytes/s), '
                         f'latency >= 0; got n={n!r}, size={size!r}, bandwidth={bandwidth!r}, '
                         f'latency={latency!r}')
    if n == 1:
        return 0.0
    if algorithm == 'naive':
        return 2 * latency + 2 * (n - 1) * size / bandwidth
    return 2 * (n - 1) * latency + 2 * (n - 1) / n * size / bandwidth


def bandwidths(size, seconds, n):
    """Return (algbw, busbw) in bytes/s of an allreduce, as nccl-tests defines them."""
    if seconds <= 0 or n < 1:
        raise ValueError(f'bandwidths: need seconds > 0 and n >= 1, got {seconds!r} and {n!r}')
    algbw = size / seconds
    return algbw, algbw * 2 * (n - 1) / n


def allreduce_timings(sizes, repeats=5, min_bytes=1 << 22, max_iters=50):
    """Time naive, ring and built-in allreduce of float32 `sizes` (bytes) on every rank.

    Run it on every rank. The variants are interleaved so that background noise
    hits them alike; each measurement averages enough calls to move `min_bytes`
    (at most `max_iters`), is the slowest rank's time, and the best of
    `repeats` is kept. Returns a list of dicts (method, bytes, seconds).
    """
    _setup('allreduce_timings')
    positive_int(repeats, 'allreduce_timings: repeats')
    methods = {'naive': naive_allreduce, 'ring': ring_allreduce, 'built-in': dist.all_reduce}
    results = []
    for size in sizes:
        if size % 4 or size <= 0:
            raise ValueError(f'allreduce_timings: sizes are bytes of float32, so positive '
                             f'multiples of 4; got {size!r}')
        X = torch.zeros(size // 4)  # zeros stay zeros, however often they are summed
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
                elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                best[name] = min(best[name], elapsed.item())
        results.extend({'method': name, 'bytes': size, 'seconds': t} for name, t in best.items())
    return results
