"""A hand-written DistributedDataParallel: bucketed gradient averaging that overlaps backward."""
import torch
import torch.distributed as dist
from torch import nn

__all__ = ['MiniDDP']


class _Bucket:
    """Gradients of a few parameters, averaged across ranks by one all_reduce."""

    def __init__(self, params):
        self.params = params
        self.buffer = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype,
                                  device=params[0].device)
        offsets = [0]
        for p in params:
            offsets.append(offsets[-1] + p.numel())
        self.views = {id(p): self.buffer[a:b].view_as(p)
                      for p, a, b in zip(params, offsets, offsets[1:])}
        self.work = None
        self.arrived = set()


class MiniDDP(nn.Module):
    """Wrap `module` so that backward averages its gradients across ranks, as DDP does.

    At construction every rank takes rank 0's parameters and buffers. Parameters
    are grouped, in reverse order of registration (roughly the order backward
    produces their gradients), into buckets of at most `bucket_cap_mb` MB
    (`math.inf`: a single bucket). A hook copies each gradient into its bucket as
    soon as it is accumulated; a full bucket is summed across ranks by an
    asynchronous all_reduce while backward goes on. Call `finish_sync()` after
    `backward()` and before `optimizer.step()`: it waits for the buckets and
    writes the averages back into `.grad`.
    """

    def __init__(self, module, bucket_cap_mb=25):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f'MiniDDP wraps an nn.Module, got {type(module).__name__}')
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) \
                or not bucket_cap_mb > 0:
            raise ValueError(f'MiniDDP: bucket_cap_mb must be a positive number of MB '
                             f'(math.inf for one bucket), got {bucket_cap_mb!r}')
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError('MiniDDP: no process group; call torch.distributed.'
                               'init_process_group first, in every rank')
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError('MiniDDP: the module has no parameters that require grad')
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():  # the replicas must start equal, like DDP's
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, 0)
        self.buckets = self._make_buckets(params[::-1], bucket_cap_mb * 2**20)
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._next = 0  # buckets are launched in order, the same order on every rank
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params]

    @staticmethod
    def _make_buckets(params, cap_bytes):
        buckets, current, size = [], [], 0
        for p in params:
            nbytes = p.numel() * p.element_size()
            if current and (size + nbytes > cap_bytes or p.dtype != current[0].dtype
                            or p.device != current[0].device):
                buckets.append(_Bucket(current))
                current, size = [], 0
            current.append(p)
            size += nbytes
        buckets.append(_Bucket(current))
        return buckets

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _grad_ready(self, p):
        bucket = self._bucket_of[id(p)]
        if id(p) in bucket.arrived:
            raise RuntimeError('MiniDDP: a second backward before finish_sync(); call '
                               'finish_sync() after every backward (no gradient accumulation)')
        bucket.views[id(p)].copy_(p.grad)
        bucket.arrived.add(id(p))
        # Every rank must issue the all_reduces in the same order, or they would
        # sum different buckets together; so a ready bucket waits for the ones
        # before it, which the same backward fills at about the same time.
        while (self._next < len(self.buckets)
               and len(self.buckets[self._next].arrived) == len(self.buckets[self._next].params)):
            bucket = self.buckets[self._next]
            bucket.work = dist.all_reduce(bucket.buffer, async_op=True)
            self._next += 1

    def finish_sync(self):
        """Wait for every bucket's all_reduce and put the averaged gradients into `.grad`."""
        missing = {id(p) for b in self.buckets[self._next:] for p in b.params
                   if id(p) not in b.arrived}
        if missing:
            names = [n for n, p in self.module.named_parameters() if id(p) in missing]
            for bucket in self.buckets[:self._next]:
                bucket.work.wait()  # let the launched ones finish, so the next step starts clean
            self._reset()
            raise RuntimeError(f'MiniDDP: no gradient reached {names} '
                               'in this backward; every parameter must take part in the loss '
                               '(or set requires_grad=False before wrapping)')
        for bucket in self.buckets:
            bucket.work.wait()
            bucket.buffer.div_(self.world_size)  # SUM then divide: gloo's AVG is not trusted
            for p in bucket.params:
                p.grad.copy_(bucket.views[id(p)])
        self._reset()

    def _reset(self):
        for bucket in self.buckets:
            bucket.work = None
            bucket.arrived.clear()
        self._next = 0

    def bucket_sizes(self):
        """Return the number of parameters in each bucket, in launch order."""
        return [len(b.params) for b in self.buckets]

    def remove_hooks(self):
        """Detach the gradient hooks from the module's parameters."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
