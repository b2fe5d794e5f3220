"""A hand-written DistributedDataParallel, built in three steps (notebook 9).

1. `HookDDP`: a hook on every parameter all-reduces its gradient as soon as
   backward has produced it (one all_reduce per parameter).
2. `BucketDDP`: gradients are grouped into buckets (`make_buckets`), one
   all_reduce per bucket.
3. `MiniDDP`: each bucket's all_reduce is asynchronous and overlaps the rest of
   backward; `finish_sync()` waits for them before the optimizer step.

`MLP` is the notebook's test model: its output layer is registered first and
used last, so the reverse of registration order, which `BucketDDP` assumes, is
not the order backward produces the gradients in (DDP measures that order in
its first iteration and rebuilds its buckets from it).

Every wrapper starts the replicas from rank 0's parameters and buffers, as DDP
does, and needs `finish_sync()` after each backward. Each class is a `#@save`
cell of notebook 9 (tests/test_saved_cells.py compares them); the `_check_...`
functions validate the arguments and the order of calls first (d2lpar/_checks.py).
"""
import torch
import torch.distributed as dist
from torch import nn

from ._checks import checked, process_group_size

__all__ = ['HookDDP', 'MLP', 'make_buckets', 'BucketDDP', 'MiniDDP']


# Checks: run by @checked before each method, so that its code stays the algorithm.

def _check_wrap(self, module, *args, **kwargs):
    name = type(self).__name__
    if not isinstance(module, nn.Module):
        raise TypeError(f'{name} wraps an nn.Module, got {type(module).__name__}')
    process_group_size(name)


def _check_make_buckets(params, bucket_cap_mb):
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) \
            or not bucket_cap_mb > 0:
        raise ValueError(f'bucket_cap_mb must be a positive number of MB '
                         f'(math.inf for one bucket), got {bucket_cap_mb!r}')
    params = list(params)
    if not params:
        raise ValueError('make_buckets: no parameters to put in buckets')
    if len({(p.dtype, p.device) for p in params}) > 1:
        raise ValueError('make_buckets: the parameters have several dtypes or devices '
                         f'{sorted({(str(p.dtype), str(p.device)) for p in params})}; a bucket is '
                         'one flat tensor, so give the module one dtype and one device')
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
        raise RuntimeError(f'{type(self).__name__}: a second backward before finish_sync(); call '
                           'finish_sync() after every backward (no gradient accumulation)')


def _check_finish_sync(self):
    missing = {id(p) for bucket in self.buckets[self.launched:] for p in bucket
               if id(p) not in self.ready}
    if missing:
        self.ready, self.launched = set(), 0  # so that the next step starts clean
        names = [n for n, p in self.module.named_parameters() if id(p) in missing]
        raise RuntimeError(f'{type(self).__name__}: no gradient reached {names} '
                           'in this backward; every parameter must take part in the loss '
                           '(or set requires_grad=False before wrapping)')


# The three steps: each is the `#@save` cell of notebook 9 that builds it.

class HookDDP(nn.Module):
    """Wrap `module` so that backward averages each gradient across ranks as soon as it is ready."""

    @checked(_check_wrap)
    def __init__(self, module):
        super().__init__()
        self.module = module
        with torch.no_grad():  # the replicas start equal: rank 0's parameters, as in DDP
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, 0)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self.grad_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def grad_ready(self, p):
        """Average `p.grad` across ranks (backward calls this once `p.grad` is complete)."""
        dist.all_reduce(p.grad)  # SUM, then divide: gloo's AVG is not trusted
        p.grad /= dist.get_world_size()

    def finish_sync(self):
        """Nothing to wait for: every gradient was averaged in its hook."""


class MLP(nn.Module):
    """A 784-512-512-10 MLP whose output layer is registered first but used last."""

    def __init__(self):
        super().__init__()
        self.output = nn.Linear(512, 10)
        self.hidden = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(),
                                    nn.Linear(512, 512), nn.ReLU())

    def forward(self, X):
        return self.output(self.hidden(X))


@checked(_check_make_buckets)
def make_buckets(params, bucket_cap_mb):
    """Split `params`, in order, into lists of at most `bucket_cap_mb` MB (at least one each)."""
    buckets, size = [[]], 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if buckets[-1] and size + nbytes > bucket_cap_mb * 2**20:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    return buckets


class BucketDDP(HookDDP):
    """HookDDP that averages the gradients in buckets of about `bucket_cap_mb` MB."""

    @checked(_check_bucket_ddp)
    def __init__(self, module, bucket_cap_mb=25):
        super().__init__(module)
        # Backward produces the gradients roughly in reverse order of registration.
        params = [p for p in module.parameters() if p.requires_grad][::-1]
        self.buckets = make_buckets(params, bucket_cap_mb)
        self.ready, self.launched = set(), 0  # ids of complete gradients; buckets reduced

    @checked(_check_grad_ready)
    def grad_ready(self, p):
        self.ready.add(id(p))
        # Every rank must reduce the same buckets in the same order, so a complete
        # bucket also waits for the buckets before it.
        while (self.launched < len(self.buckets)
               and all(id(q) in self.ready for q in self.buckets[self.launched])):
            self.reduce_bucket(self.buckets[self.launched])
            self.launched += 1

    def reduce_bucket(self, bucket):
        """Average the gradients of `bucket` across ranks with one all_reduce."""
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        dist.all_reduce(flat)
        self.write_back(flat, bucket)

    def write_back(self, flat, bucket):
        """Divide the summed `flat` by the world size and copy it into the bucket's gradients."""
        flat /= dist.get_world_size()
        for p, g in zip(bucket, flat.split([p.numel() for p in bucket])):
            p.grad.copy_(g.view_as(p))

    @checked(_check_finish_sync)
    def finish_sync(self):
        """Get ready for the next backward."""
        self.ready, self.launched = set(), 0


class MiniDDP(BucketDDP):
    """BucketDDP whose all_reduces run in the background while backward goes on.

    Call `finish_sync()` after `backward()` and before `optimizer.step()`.
    """

    def __init__(self, module, bucket_cap_mb=25):
        super().__init__(module, bucket_cap_mb)
        self.pending = []  # (work, flat, bucket) of each all_reduce in flight

    def reduce_bucket(self, bucket):
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        work = dist.all_reduce(flat, async_op=True)  # returns at once
        self.pending.append((work, flat, bucket))

    def finish_sync(self):
        """Wait for every bucket's all_reduce and write the averages into the gradients."""
        for work, flat, bucket in self.pending:
            work.wait()
            self.write_back(flat, bucket)
        self.pending = []
        super().finish_sync()
