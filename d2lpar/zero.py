"""ZeRO stages 1, 2 and 3 written by hand (notebook 10).

Each stage is a small change to the previous one, built from notebook 9's ring
collectives (`ring_reduce_scatter`, `ring_all_gather`, `ring_allreduce`) and
its bucket hooks (`make_buckets`, `BucketDDP.grad_ready`):

- `Zero1` wraps any torch optimizer, in the shape of torch's
  `ZeroRedundancyOptimizer` (`params, optimizer_class, **defaults`): each rank
  keeps optimizer state for its 1/N shard of every parameter; after backward
  the gradients are reduce-scattered, the shards updated, the parameters
  all-gathered.
- `Zero2` reduce-scatters each bucket as soon as backward completes it and
  frees the bucket's full gradients there and then.
- `Zero3` keeps only the shards between uses: each layer gathers its
  parameters just before its forward and its backward and frees them right
  after each.

Every tensor is flattened and padded with zeros to a multiple of N, so that
every rank holds one equal shard even when a size does not divide by N; every
allocation names the parameters' device. Each definition is a `#@save` cell
of notebook 10 (tests/test_saved_cells.py compares them); the `_check_...`
functions validate the arguments first (d2lpar/_checks.py).
"""
import torch
import torch.distributed as dist
from torch import nn

from ._checks import checked, finite_number, process_group_size
from .collectives import ring_all_gather, ring_allreduce, ring_reduce_scatter
from .miniddp import BucketDDP, make_buckets

__all__ = ['model_state_bytes', 'pad_to_shards', 'Zero1', 'Zero2', 'Zero3', 'RingDDP',
           'zero_bytes_sent']

STAGES = ('ddp', 'zero1', 'zero2', 'zero3')


# Checks: run by @checked before each function, so that its code stays the algorithm.

def _check_model_state_bytes(stage, num_params, n, bytes_param=4, bytes_grad=4, bytes_state=8):
    if stage not in STAGES:
        raise ValueError(f"model_state_bytes: stage must be one of {STAGES}, got {stage!r}")
    for name, value in (('num_params', num_params), ('n', n)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f'model_state_bytes: {name} must be a positive int, got {value!r}')
    for name, value in (('bytes_param', bytes_param), ('bytes_grad', bytes_grad),
                        ('bytes_state', bytes_state)):
        finite_number(value, name, 'model_state_bytes')


def _check_zero_bytes_sent(stage, num_params, n, bytes_per_value=4):
    _check_model_state_bytes(stage, num_params, n)
    finite_number(bytes_per_value, 'bytes_per_value', 'zero_bytes_sent', positive=True)


def _check_pad_to_shards(tensor, n):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f'pad_to_shards: tensor must be a tensor, got {type(tensor).__name__}')
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f'pad_to_shards: n must be a positive int (the world size), got {n!r}')


def _check_zero(self, params, optimizer_class, *args, **defaults):
    name = type(self).__name__
    process_group_size(name)
    if isinstance(params, nn.Module):
        raise TypeError(f'{name}: pass the parameters (net.parameters()), not the module')
    params = list(params)
    if not params or not all(isinstance(p, torch.Tensor) for p in params):
        raise TypeError(f'{name}: params must be a non-empty iterable of tensors, such as '
                        'net.parameters()')
    if not any(p.requires_grad for p in params):
        raise ValueError(f'{name}: no parameter requires grad; there is nothing to train')
    if not (isinstance(optimizer_class, type)
            and issubclass(optimizer_class, torch.optim.Optimizer)):
        raise TypeError(f'{name}: optimizer_class must be a torch optimizer class such as '
                        f'torch.optim.AdamW (the class, not an instance), got {optimizer_class!r}')
    return (self, params, optimizer_class, *args), defaults


def _check_zero3(self, net, optimizer_class, *args, **defaults):
    if not isinstance(net, nn.Module):
        raise TypeError(f'Zero3: net must be an nn.Module (each layer gathers its parameters '
                        f'just in time), got {type(net).__name__}')
    _check_zero(self, list(net.parameters()), optimizer_class)


def _check_step(self):
    missing = [p for p in self.params if p.grad is None and id(p) not in self.reduced]
    if missing:
        raise RuntimeError(f'{type(self).__name__}.step: {len(missing)} parameter(s) have no '
                           'gradient; run backward first (every trained parameter must take '
                           'part in the loss, or set requires_grad=False before wrapping)')


# The algorithms: each is a `#@save` cell of notebook 10.

@checked(_check_model_state_bytes)
def model_state_bytes(stage, num_params, n, bytes_param=4, bytes_grad=4, bytes_state=8):
    """Return the bytes one of `n` ranks holds for parameters, gradients and optimizer state."""
    shards = {'ddp': (1, 1, 1), 'zero1': (1, 1, n), 'zero2': (1, n, n), 'zero3': (n, n, n)}
    p, g, s = shards[stage]
    return num_params * (bytes_param / p + bytes_grad / g + bytes_state / s)


@checked(_check_zero_bytes_sent)
def zero_bytes_sent(stage, num_params, n, bytes_per_value=4):
    """Return the bytes one of `n` ranks sends per step around a ring."""
    passes = 3 if stage == 'zero3' else 2  # reduce-scatter + all-gather (+ one more all-gather)
    return passes * (n - 1) / n * num_params * bytes_per_value


@checked(_check_pad_to_shards)
def pad_to_shards(tensor, n):
    """Return `tensor` flattened, padded with zeros to a multiple of `n`, as `n` rows."""
    flat = tensor.detach().reshape(-1)
    return nn.functional.pad(flat, (0, -flat.numel() % n)).view(n, -1)


class Zero1:
    """ZeRO-1: each rank keeps optimizer state for its 1/N shard of every parameter."""

    @checked(_check_zero)
    def __init__(self, params, optimizer_class, **defaults):
        self.n, self.rank = dist.get_world_size(), dist.get_rank()
        # dict.fromkeys: a tied parameter once, in order; frozen ones stay whole everywhere
        self.params = [p for p in dict.fromkeys(params) if p.requires_grad]
        self.flats, self.shards = {}, {}
        for p in self.params:
            dist.broadcast(p.detach(), 0)  # the replicas start equal, as in DDP
            self.shards[p] = self.shard_param(p)
        self.optimizer = optimizer_class(list(self.shards.values()), **defaults)
        self.reduced = set()  # ids of parameters whose gradient shard is ready

    def shard_param(self, p):
        """Move `p` into a padded flat buffer; return this rank's row of it (a view)."""
        self.flats[p] = pad_to_shards(p, self.n).clone()  # on p's device, like every buffer
        p.data = self.flats[p].view(-1)[:p.numel()].view_as(p)
        return self.flats[p][self.rank]

    def reduce_bucket(self, bucket):
        """Reduce-scatter the bucket's gradients: this rank keeps the mean of its shards."""
        sizes = [self.shards[p].numel() for p in bucket]
        rows = torch.empty(self.n, sum(sizes), dtype=bucket[0].dtype, device=bucket[0].device)
        for p, columns in zip(bucket, rows.split(sizes, dim=1)):
            columns.copy_(pad_to_shards(p.grad, self.n))  # row r: every parameter's shard r
            p.grad = None  # in the bucket now: free the full gradient
        ring_reduce_scatter(list(rows))  # row `rank` becomes the sum over the ranks
        for p, grad in zip(bucket, (rows[self.rank] / self.n).split(sizes)):
            self.shards[p].grad = grad  # the mean: single-process training's gradient
            self.reduced.add(id(p))

    @checked(_check_step)
    def step(self):
        """Reduce-scatter the gradients, update this rank's shards, all-gather the parameters."""
        for p in self.params:
            if id(p) not in self.reduced:
                self.reduce_bucket([p])
        self.optimizer.step()
        self.gather_params()
        self.reduced = set()

    def gather_params(self):
        """All-gather every parameter from the shards the ranks just updated."""
        for p in self.params:
            ring_all_gather(list(self.flats[p]))

    def zero_grad(self):
        """Forget the gradients of the last step."""
        for p in self.params:
            p.grad = self.shards[p].grad = None


class Zero2(Zero1):
    """ZeRO-2: each bucket is reduce-scattered as soon as backward completes it."""

    def __init__(self, params, optimizer_class, bucket_cap_mb=25, **defaults):
        super().__init__(params, optimizer_class, **defaults)
        # backward produces the gradients roughly in reverse order of registration
        self.buckets = make_buckets(self.params[::-1], bucket_cap_mb)
        self.ready, self.launched = set(), 0
        for p in self.params:
            p.register_post_accumulate_grad_hook(self.grad_ready)

    # notebook 9's rule: a complete bucket is reduced once all buckets before it are
    grad_ready = BucketDDP.grad_ready

    def step(self):
        super().step()  # every bucket was reduce-scattered during backward already
        self.ready, self.launched = set(), 0


class Zero3(Zero2):
    """ZeRO-3: only shards stay; each layer gathers its parameters just for its passes."""

    @checked(_check_zero3)
    def __init__(self, net, optimizer_class, bucket_cap_mb=25, **defaults):
        super().__init__(net.parameters(), optimizer_class, bucket_cap_mb, **defaults)
        for layer in net.modules():
            if any(p in self.shards for p in layer.parameters(recurse=False)):
                layer.register_forward_pre_hook(lambda m, args: self.gather(m))
                layer.register_forward_hook(lambda m, args, out: self.free(m))
                layer.register_full_backward_pre_hook(lambda m, grad_out: self.gather(m))

    def shard_param(self, p):
        """As ZeRO-1, but keep a copy of this rank's row and free the full buffer."""
        shard = super().shard_param(p).clone()
        self.flats[p].untyped_storage().resize_(0)  # p keeps its shape; its bytes are gone
        return shard

    def gather(self, layer):
        """All-gather the parameters of `layer` into their buffers, allocated again."""
        for p in layer.parameters(recurse=False):
            rows = self.flats.get(p)
            if rows is not None and rows.untyped_storage().nbytes() == 0:
                rows.untyped_storage().resize_(rows.numel() * rows.element_size())
                rows[self.rank] = self.shards[p]
                ring_all_gather(list(rows))

    def free(self, layer):
        """Free the full parameters of `layer`; only the shards stay."""
        for p in layer.parameters(recurse=False):
            if p in self.flats:
                self.flats[p].untyped_storage().resize_(0)

    def grad_ready(self, p):
        """Reduce-scatter as ZeRO-2, then free `p`: its part of backward is over."""
        Zero2.grad_ready(self, p)
        self.flats[p].untyped_storage().resize_(0)

    def gather_params(self):
        """Nothing to gather: the next forward gathers each layer just in time."""


class RingDDP(BucketDDP):
    """Notebook 9's BucketDDP with the hand-written ring allreduce (every byte is ours)."""

    def reduce_bucket(self, bucket):
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        ring_allreduce(flat)
        self.write_back(flat, bucket)
