"""Sharded data parallelism by hand: ZeRO stages 1, 2 and 3 (notebook 10).

Each stage is a small diff of the previous one and uses the hand-written
`all_gather` and `reduce_scatter` of notebook 9. A tensor is flattened and
padded with zeros to a multiple of the world size N, so that every rank holds
one equal shard of it, even when its size does not divide by N.
"""
import torch
import torch.distributed as dist

from ._checks import checked, finite_number, process_group_size
from .collectives import all_gather, reduce_scatter, ring_allreduce

__all__ = ['model_state_bytes', 'pad_to_shards', 'Zero1', 'Zero2', 'Zero3']


def _check_model_state_bytes(stage, num_params, n, bytes_param=4, bytes_grad=4, bytes_state=8):
    if stage not in ('ddp', 'zero1', 'zero2', 'zero3'):
        raise ValueError(f"model_state_bytes: stage must be 'ddp', 'zero1', 'zero2' or 'zero3', "
                         f'got {stage!r}')
    for name, value in (('num_params', num_params), ('n', n)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f'model_state_bytes: {name} must be a positive int, got {value!r}')
    for name, value in (('bytes_param', bytes_param), ('bytes_grad', bytes_grad),
                        ('bytes_state', bytes_state)):
        finite_number(value, name, 'model_state_bytes')


def _check_pad_to_shards(tensor, n):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f'pad_to_shards: tensor must be a tensor, got {type(tensor).__name__}')
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f'pad_to_shards: n must be a positive int (the world size), got {n!r}')


def _check_zero(caller):
    def check(self, params, lr=1e-3, weight_decay=0.01):
        process_group_size(caller)
        params = list(params)
        if not params or not all(isinstance(p, torch.Tensor) for p in params):
            raise TypeError(f'{caller}: params must be a non-empty iterable of tensors, such as '
                            'net.parameters()')
        finite_number(lr, 'lr', caller, positive=True)
        finite_number(weight_decay, 'weight_decay', caller)
        return (self, params), {'lr': lr, 'weight_decay': weight_decay}
    return check


def _check_zero3(self, net, lr=1e-3, weight_decay=0.01):
    if not isinstance(net, torch.nn.Module):
        raise TypeError(f'Zero3: net must be an nn.Module (its layers gather their parameters '
                        f'just in time), got {type(net).__name__}')


@checked(_check_model_state_bytes)
def model_state_bytes(stage, num_params, n, bytes_param=4, bytes_grad=4, bytes_state=8):
    """Return the bytes one of `n` ranks holds for parameters, gradients and optimizer state."""
    shards = {'ddp': (1, 1, 1), 'zero1': (1, 1, n), 'zero2': (1, n, n), 'zero3': (n, n, n)}
    p, g, s = shards[stage]
    return num_params * (bytes_param / p + bytes_grad / g + bytes_state / s)


@checked(_check_pad_to_shards)
def pad_to_shards(tensor, n):
    """Flatten `tensor` and pad it with zeros to a multiple of `n`; return its `n` shards."""
    flat = tensor.detach().flatten()
    padded = torch.zeros((flat.numel() + n - 1) // n * n, dtype=flat.dtype)
    padded[:flat.numel()] = flat
    return list(padded.chunk(n))


class Zero1:
    """ZeRO-1: each rank keeps AdamW state for its shard only; full gradients everywhere."""
    @checked(_check_zero('Zero1'))
    def __init__(self, params, lr=1e-3, weight_decay=0.01):
        self.params, self.n, self.rank = list(params), dist.get_world_size(), dist.get_rank()
        self.shards = [pad_to_shards(p, self.n)[self.rank].clone() for p in self.params]
        self.optimizer = torch.optim.AdamW(self.shards, lr=lr, weight_decay=weight_decay)

    def shard_grad(self, p):
        """Average the full gradient over ranks (as DDP); return this rank's shard of it."""
        grad = torch.cat(pad_to_shards(p.grad, self.n))
        ring_allreduce(grad)
        grad /= self.n
        p.grad = grad[:p.numel()].view_as(p)
        return grad.chunk(self.n)[self.rank]  # a view: no extra memory

    def step(self):
        """Update this rank's shards with AdamW, then all-gather the full parameters."""
        for p, shard in zip(self.params, self.shards):
            shard.grad = self.shard_grad(p)
        self.optimizer.step()
        for p, shard in zip(self.params, self.shards):
            blocks = [torch.empty_like(shard) for _ in range(self.n)]
            all_gather(blocks, shard)
            p.data.copy_(torch.cat(blocks)[:p.numel()].view_as(p))

    def zero_grad(self):
        """Forget the gradients of the last step."""
        for p in self.params:
            p.grad = None


class Zero2(Zero1):
    """ZeRO-2: as ZeRO-1, but each rank keeps only its shard of the averaged gradient."""
    def shard_grad(self, p):
        """Reduce-scatter the gradient, divide by N and free the full one."""
        shard = torch.empty((p.numel() + self.n - 1) // self.n, dtype=p.dtype)
        reduce_scatter(shard, pad_to_shards(p.grad, self.n))
        p.grad = None
        return shard / self.n


class Zero3(Zero2):
    """ZeRO-3: as ZeRO-2, but parameters too are sharded, gathered per layer just in time."""
    @checked(_check_zero3)
    def __init__(self, net, lr=1e-3, weight_decay=0.01):
        super().__init__(net.parameters(), lr, weight_decay)
        self.shards_of = {p: shard for p, shard in zip(self.params, self.shards)}
        self.shapes = {p: p.shape for p in self.params}
        for layer in net.modules():
            if list(layer.parameters(recurse=False)):
                layer.register_forward_pre_hook(lambda m, args: self.gather(m))
                layer.register_forward_hook(lambda m, args, out: self.free(m))
                layer.register_full_backward_pre_hook(lambda m, grad_out: self.gather(m))
        self.free(net)

    def gather(self, layer):
        """All-gather the full parameters of `layer` from the shards of every rank."""
        for p in layer.parameters(recurse=False):
            shard = self.shards_of[p]
            blocks = [torch.empty_like(shard) for _ in range(self.n)]
            all_gather(blocks, shard)
            p.data = torch.cat(blocks)[:self.shapes[p].numel()].view(self.shapes[p])

    def free(self, layer):
        """Drop the full parameters of `layer` (and its sublayers); only the shards stay."""
        for p in layer.parameters():
            p.data = torch.empty(0, dtype=p.dtype)

    def step(self):
        """Update this rank's shards with AdamW; the next forward gathers them again."""
        for p, shard in zip(self.params, self.shards):
            shard.grad = self.shard_grad(p)
            p.data = torch.empty(0, dtype=p.dtype)  # gathered again for backward: free it
        self.optimizer.step()
