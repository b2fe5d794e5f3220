"""Argument checks for the code notebook 09 teaches (d2lpar/lessons/nb09_collectives.py).

Each check takes the same arguments as the function it guards and raises a TypeError or
ValueError naming the function and what to do; CHECKS maps the definition's name to it, and
`make lib` writes `@checked(CHECKS[name])` above that definition in the lesson module.
"""

import torch
import torch.distributed as dist
from torch import nn

from d2lpar.checks import finite_number, positive_int, process_group_size

_OPS = (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX)


def _tensor(caller, tensor, name='tensor'):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f'{caller}: expected a tensor, got {type(tensor).__name__}')
    if not tensor.is_contiguous():
        raise ValueError(
            f'{caller}: {name} is not contiguous, so it cannot be sent or received '
            f'in place; pass t = {name}.contiguous() and copy the result back '
            f'with {name}.copy_(t)'
        )


def _rank(caller, name, value, world_size):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < world_size:
        raise ValueError(f'{caller}: {name} must be a rank in 0..{world_size - 1}, got {value!r}')


def _op(caller, op):
    if op == dist.ReduceOp.AVG:
        raise ValueError(
            f'{caller}: ReduceOp.AVG is not supported (gloo has an open correctness '
            'report on it); reduce with ReduceOp.SUM, then divide by the world size'
        )
    if not any(op == known for known in _OPS):
        raise ValueError(f'{caller}: op must be ReduceOp.SUM, PRODUCT, MIN or MAX, got {op!r}')


def _tensors(caller, name, tensors, world_size, like=None):
    """Check a list of one contiguous tensor per rank (shaped like `like`, if given)."""
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f'{caller}: {name} must be a list of {world_size} tensors, one per rank')
    if len(tensors) != world_size:
        raise ValueError(
            f'{caller}: {name} holds {len(tensors)} tensors for a world of {world_size} ranks; pass one per rank'
        )
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f'{caller}: {name}[{i}] is a {type(t).__name__}, not a tensor')
        if like is not None and (t.shape != like.shape or t.dtype != like.dtype):
            raise ValueError(
                f'{caller}: {name}[{i}] has shape {tuple(t.shape)} and dtype '
                f'{t.dtype}, expected {tuple(like.shape)} and {like.dtype} '
                'like the tensor'
            )
        if not t.is_contiguous():
            raise ValueError(
                f'{caller}: {name}[{i}] is not contiguous, so it cannot be received '
                'into; allocate it with torch.empty_like(tensor)'
            )


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


def _check_wrap(self, module, *args, **kwargs):
    name = type(self).__name__
    if not isinstance(module, nn.Module):
        raise TypeError(f'{name} wraps an nn.Module, got {type(module).__name__}')
    process_group_size(name)


def _check_make_buckets(params, bucket_cap_mb):
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb > 0:
        raise ValueError(
            f'bucket_cap_mb must be a positive number of MB (math.inf for one bucket), got {bucket_cap_mb!r}'
        )
    params = list(params)
    if not params:
        raise ValueError('make_buckets: no parameters to put in buckets')
    if len({(p.dtype, p.device) for p in params}) > 1:
        raise ValueError(
            'make_buckets: the parameters have several dtypes or devices '
            f'{sorted({(str(p.dtype), str(p.device)) for p in params})}; a bucket is '
            'one flat tensor, so give the module one dtype and one device'
        )
    return (params, bucket_cap_mb), {}


def _check_bucket_ddp(self, module, bucket_cap_mb=25):
    _check_wrap(self, module)
    name = type(self).__name__
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f'{name}: the module has no parameters that require grad')
    try:
        _check_make_buckets(params, bucket_cap_mb)
    except ValueError as e:
        raise ValueError(f'{name}: {e}') from None


def _check_grad_ready(self, p):
    if id(p) in self.ready:
        raise RuntimeError(
            f'{type(self).__name__}: a second backward before finish_sync(); call '
            'finish_sync() after every backward (no gradient accumulation)'
        )


def _check_finish_sync(self):
    missing = {id(p) for bucket in self.buckets[self.launched :] for p in bucket if id(p) not in self.ready}
    if missing:
        self.ready, self.launched = set(), 0  # so that the next step starts clean
        names = [n for n, p in self.module.named_parameters() if id(p) in missing]
        raise RuntimeError(
            f'{type(self).__name__}: no gradient reached {names} '
            'in this backward; every parameter must take part in the loss '
            '(or set requires_grad=False before wrapping)'
        )


CHECKS = {
    'combine': _check_combine,
    'broadcast': _check_broadcast,
    'reduce': _check_reduce,
    'ring_reduce_scatter': _check_ring_reduce_scatter,
    'ring_all_gather': _check_ring_all_gather,
    'all_gather': _check_all_gather,
    'reduce_scatter': _check_reduce_scatter,
    'naive_allreduce': _check_allreduce('naive_allreduce'),
    'ring_allreduce': _check_allreduce('ring_allreduce'),
    'allreduce_cost': _check_allreduce_cost,
    'bandwidths': _check_bandwidths,
    'HookDDP.__init__': _check_wrap,
    'make_buckets': _check_make_buckets,
    'BucketDDP.__init__': _check_bucket_ddp,
    'BucketDDP.grad_ready': _check_grad_ready,
    'BucketDDP.finish_sync': _check_finish_sync,
}
