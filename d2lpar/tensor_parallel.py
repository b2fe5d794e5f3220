"""Tensor and sequence parallelism by hand, Megatron-style, and what they cost (notebook 12).

One layer's weights are split across the ranks of a process group. A
column-parallel linear holds a block of the output features, a row-parallel
linear a block of the input features; two conjugate autograd functions move the
data: `copy_to_parallel` (Megatron's f: identity forward, all-reduce of the
gradient in backward) where a block enters the split region, and
`reduce_from_parallel` (Megatron's g: all-reduce forward, identity backward)
where it leaves it. `CopyAndLinear` overlaps f's backward all-reduce with the
weight-gradient matmul. Sequence parallelism swaps f and g for an all-gather
and a reduce-scatter of the tokens (`GatherTokens`, `ScatterTokens`), so that
norms, dropout and residuals run on each rank's tokens only. `saved_bytes`,
`count_wire_bytes` and `block_bytes` measure and predict the activations and
the bytes. The algorithms are written in notebook 12's cells (marked `#@save`)
and are the same code here; argument checks run first, in `@checked`.
All-reduces are SUM (gloo's AVG is not trusted).
"""
import contextlib
import copy
import inspect
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from ._checks import checked, positive_int, process_group_size

__all__ = ['CopyToParallel', 'ReduceFromParallel', 'copy_to_parallel', 'reduce_from_parallel',
           'ColumnParallelLinear', 'RowParallelLinear', 'ParallelMLP', 'attend', 'SelfAttention',
           'ParallelSelfAttention', 'CopyAndLinear', 'all_gather_tokens', 'reduce_scatter_tokens',
           'GatherTokens', 'ScatterTokens', 'Block', 'megatron_block',
           'sequence_parallel_block', 'sum_replicated_grads', 'saved_bytes', 'count_wire_bytes', 'block_bytes']


def _check_split(caller, size, what):
    n = process_group_size(caller)
    if size % n:
        raise ValueError(f'{caller}: {what} ({size}) must divide by the world size ({n}), so '
                         'that every rank holds an equal block')


def _check_linear(caller):
    def check(self, linear):
        if not isinstance(linear, nn.Linear):
            raise TypeError(f'{caller}: linear must be an nn.Linear, got {type(linear).__name__}')
        if linear.bias is None:
            raise ValueError(f'{caller}: linear must have a bias (nn.Linear(..., bias=True))')
        if caller == 'ColumnParallelLinear':
            _check_split(caller, linear.out_features, 'out_features')
        else:
            _check_split(caller, linear.in_features, 'in_features')
    return check


def _check_mlp(self, mlp):
    if not (isinstance(mlp, nn.Sequential) and len(mlp) == 3
            and isinstance(mlp[0], nn.Linear) and isinstance(mlp[2], nn.Linear)):
        raise TypeError('ParallelMLP: mlp must be nn.Sequential(nn.Linear, activation, nn.Linear), '
                        f'got {mlp!r}')


def _check_self_attention(self, dim, num_heads):
    positive_int(dim, 'SelfAttention: dim')
    positive_int(num_heads, 'SelfAttention: num_heads')
    if dim % num_heads:
        raise ValueError(f'SelfAttention: dim ({dim}) must divide by num_heads ({num_heads})')


def _check_parallel_attention(self, attention):
    if not isinstance(attention, SelfAttention):
        raise TypeError('ParallelSelfAttention: attention must be a d2lpar.tensor_parallel.'
                        f'SelfAttention, got {type(attention).__name__}')
    n = process_group_size('ParallelSelfAttention')
    if attention.num_heads % n:
        raise ValueError(f'ParallelSelfAttention: the {attention.num_heads} heads must divide by '
                         f'the world size ({n}), so that every rank computes whole heads')


def _check_attend(q, k, v, head_dim):
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise TypeError('attend: q, k and v must be tensors (batch, tokens, features), got '
                        f'{type(q).__name__}, {type(k).__name__}, {type(v).__name__}')
    if not (q.shape == k.shape == v.shape) or q.dim() != 3:
        raise ValueError('attend: q, k and v must have the same shape (batch, tokens, features), '
                         f'got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}')
    positive_int(head_dim, 'attend: head_dim')
    if q.shape[-1] % head_dim:
        raise ValueError(f'attend: the {q.shape[-1]} features must divide into heads of '
                         f'head_dim={head_dim}')


def _check_block_bytes(num_params, tokens, dim, n, replicated=0, bytes_per_value=4):
    for name, value in (('num_params', num_params), ('tokens', tokens), ('dim', dim), ('n', n),
                        ('bytes_per_value', bytes_per_value)):
        positive_int(value, f'block_bytes: {name}')
    if not isinstance(replicated, int) or isinstance(replicated, bool) or not 0 <= replicated <= num_params:
        raise ValueError(f'block_bytes: replicated must be an int from 0 to num_params, got {replicated!r}')


def _check_block(block):
    if not isinstance(block, Block):
        raise TypeError('megatron_block: block must be a d2lpar.tensor_parallel.Block, got '
                        f'{type(block).__name__}')
    n = process_group_size('megatron_block')
    if block.mlp[0].out_features % n or block.attention.num_heads % n:
        raise ValueError(f'megatron_block: the hidden size ({block.mlp[0].out_features}) and the '
                         f'heads ({block.attention.num_heads}) must divide by the world size ({n})')


class CopyToParallel(torch.autograd.Function):
    """Megatron's f: identity in forward; all-reduce (sum) of the gradient in backward."""

    @staticmethod
    def forward(ctx, X):
        return X.view_as(X)  # no copy; a new tensor, so autograd records this function

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()  # autograd may hand the same tensor to others: reduce a copy
        dist.all_reduce(grad)
        return grad


class ReduceFromParallel(torch.autograd.Function):
    """Megatron's g: all-reduce (sum) in forward; identity in backward."""

    @staticmethod
    def forward(ctx, X):
        X = X.clone()  # all_reduce works in place; the caller's tensor stays this rank's own
        dist.all_reduce(X)
        return X

    @staticmethod
    def backward(ctx, grad):
        return grad


def copy_to_parallel(X):
    """Enter the split region: X is the same on every rank; its gradients are summed over ranks."""
    return CopyToParallel.apply(X)


def reduce_from_parallel(X):
    """Leave the split region: sum the ranks' partial results; the gradient is the same on all."""
    return ReduceFromParallel.apply(X)


class ColumnParallelLinear(nn.Module):
    """Rank r's block of the output features of `linear` (rows of its weight): no communication."""

    @checked(_check_linear('ColumnParallelLinear'))
    def __init__(self, linear):
        super().__init__()
        rank, n = dist.get_rank(), dist.get_world_size()
        self.weight = nn.Parameter(linear.weight.detach().chunk(n, dim=0)[rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().chunk(n)[rank].clone())

    def forward(self, X):
        return F.linear(X, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Rank r's block of the input features of `linear` (columns of its weight); sums over ranks."""

    @checked(_check_linear('RowParallelLinear'))
    def __init__(self, linear):
        super().__init__()
        rank, n = dist.get_rank(), dist.get_world_size()
        self.weight = nn.Parameter(linear.weight.detach().chunk(n, dim=1)[rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())  # whole, added once, after the sum
        self.leave = reduce_from_parallel  # how the partial products are summed (g)

    def forward(self, X):
        return self.leave(F.linear(X, self.weight)) + self.bias


class ParallelMLP(nn.Module):
    """Megatron's MLP: f, a column-parallel linear, the activation, a row-parallel linear (g)."""

    @checked(_check_mlp)
    def __init__(self, mlp):
        super().__init__()
        self.fc1, self.act, self.fc2 = ColumnParallelLinear(mlp[0]), mlp[1], RowParallelLinear(mlp[2])
        self.enter = copy_to_parallel  # how the input enters the split region (f)

    def forward(self, X):
        return self.fc2(self.act(self.fc1(self.enter(X))))


@checked(_check_attend)
def attend(q, k, v, head_dim):
    """Scaled dot-product attention, each head `head_dim` features of the last dimension."""
    B, T = q.shape[:2]
    q, k, v = (t.view(B, T, -1, head_dim).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, hd)
    weights = torch.softmax(q @ k.transpose(-2, -1) / head_dim ** 0.5, dim=-1)
    return (weights @ v).transpose(1, 2).reshape(B, T, -1)


class SelfAttention(nn.Module):
    """Multi-head self-attention: q, k, v projections, attention per head, an output projection."""

    @checked(_check_self_attention)
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, X):
        return self.out(attend(self.q(X), self.k(X), self.v(X), self.head_dim))


class ParallelSelfAttention(nn.Module):
    """`attention` with its heads split across ranks: q, k, v column-, out row-parallel."""

    @checked(_check_parallel_attention)
    def __init__(self, attention):
        super().__init__()
        self.head_dim = attention.head_dim
        self.q, self.k, self.v = (ColumnParallelLinear(layer)
                                  for layer in (attention.q, attention.k, attention.v))
        self.out = RowParallelLinear(attention.out)
        self.enter = copy_to_parallel

    def forward(self, X):
        X = self.enter(X)  # once for q, k and v: one all-reduce of X's gradient
        return self.out(attend(self.q(X), self.k(X), self.v(X), self.head_dim))


class CopyAndLinear(torch.autograd.Function):
    """f and a column-parallel linear in one, so that backward can overlap f's all-reduce."""

    @staticmethod
    def forward(ctx, X, weight, bias, overlap, events):
        ctx.save_for_backward(X, weight)
        ctx.overlap, ctx.events = overlap, events
        return F.linear(X, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        X, weight = ctx.saved_tensors
        # On a GPU the host only queues kernels: wait for this stream's (not NCCL's) before a stamp.
        ready = torch.cuda.current_stream().synchronize if grad.is_cuda else lambda: None
        grad_X = grad @ weight  # this rank's term of the input's gradient
        ready()
        ev = dict(started=time.perf_counter())
        work = dist.all_reduce(grad_X, async_op=True)  # sum the terms; returns at once
        if not grad.is_cuda:  # gloo's thread completes the future the moment the sum has arrived
            work.get_future().then(lambda _: ev.setdefault('arrived', time.perf_counter()))
        if not ctx.overlap:
            work.wait()  # the synchronous version: wait before computing anything else
            ready()
        ev.update(computing=time.perf_counter(), in_flight=not work.is_completed())
        grad_W = grad.flatten(0, -2).T @ X.flatten(0, -2)  # needs no communication
        grad_b = grad.flatten(0, -2).sum(0)
        ready()
        ev.update(computed=time.perf_counter(), done_meanwhile=work.is_completed())
        work.wait()
        ready()
        ev['waited'] = time.perf_counter()
        ctx.events.append(ev)
        return grad_X, grad_W, grad_b, None, None


def all_gather_tokens(X):
    """Put the ranks' blocks of tokens (dim 1) side by side: the whole sequence on every rank."""
    blocks = [torch.empty_like(X) for _ in range(dist.get_world_size())]
    dist.all_gather(blocks, X.contiguous())
    return torch.cat(blocks, dim=1)


def reduce_scatter_tokens(X):
    """Sum X over the ranks and keep this rank's block of tokens (dim 1)."""
    blocks = [block.contiguous() for block in X.chunk(dist.get_world_size(), dim=1)]
    out = torch.empty_like(blocks[0])
    dist.reduce_scatter(out, blocks)
    return out


class GatherTokens(torch.autograd.Function):
    """Enter the split region from sequence parallelism: all-gather; reduce-scatter in backward."""

    @staticmethod
    def forward(ctx, X):
        return all_gather_tokens(X)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_tokens(grad)


class ScatterTokens(torch.autograd.Function):
    """Leave the split region to sequence parallelism: reduce-scatter; all-gather in backward."""

    @staticmethod
    def forward(ctx, X):
        return reduce_scatter_tokens(X)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_tokens(grad)


class Block(nn.Module):
    """A transformer block: X + attention(norm1(X)), then X + mlp(norm2(X)), each after dropout."""

    def __init__(self, dim, num_heads, hidden, p=0.1):
        super().__init__()
        self.norm1, self.norm2, self.p = nn.LayerNorm(dim), nn.LayerNorm(dim), p
        self.attention = SelfAttention(dim, num_heads)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, X, keep):
        """`keep`: dropout's two masks of X's shape (given, so that split blocks drop the same)."""
        X = X + self.attention(self.norm1(X)) * keep[0] / (1 - self.p)
        return X + self.mlp(self.norm2(X)) * keep[1] / (1 - self.p)


@checked(_check_block)
def megatron_block(block):
    """Return a copy of `block` with its attention and MLP split across the ranks."""
    block = copy.deepcopy(block)
    block.attention, block.mlp = ParallelSelfAttention(block.attention), ParallelMLP(block.mlp)
    return block


@checked(_check_block)
def sequence_parallel_block(block):
    """Return megatron_block(block) whose norms, dropout and residuals see this rank's tokens."""
    block = megatron_block(block)
    for part, last in ((block.attention, block.attention.out), (block.mlp, block.mlp.fc2)):
        part.enter, last.leave = GatherTokens.apply, ScatterTokens.apply
    return block


def sum_replicated_grads(block):
    """Sum the gradients of the parameters each rank holds whole but used on its tokens only."""
    for p in (*block.norm1.parameters(), *block.norm2.parameters(),
              block.attention.out.bias, block.mlp.fc2.bias):
        dist.all_reduce(p.grad)


def saved_bytes(fn, *args, exclude=()):
    """Return fn(*args) and the bytes autograd saved for backward (tensors in `exclude` not counted)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    storages = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, sum(storages.values())


WIRE_FACTORS = {  # bytes a rank sends, per byte of the call's tensor, n ranks, ring algorithms
    'all_reduce': lambda n: 2 * (n - 1) / n,  # reduce-scatter, then all-gather (notebook 9)
    'all_gather': lambda n: n - 1,  # its input block goes to the n - 1 others
    'all_gather_into_tensor': lambda n: n - 1,
    'all_gather_single': lambda n: n - 1,
    'reduce_scatter': lambda n: n - 1,  # one block of its output's size to each of the others
    'reduce_scatter_tensor': lambda n: n - 1,
    'reduce_scatter_single': lambda n: n - 1,
    'send': lambda n: 1, 'isend': lambda n: 1}


@contextlib.contextmanager
def count_wire_bytes():
    """Count the bytes this rank sends in collectives and sends while in the block, by name."""
    counts, originals, depth = {}, {}, [0]

    def counting(name, original):
        def call(*args, **kwargs):
            if depth[0] == 0:  # a collective that calls another is counted once
                given = inspect.signature(original).bind(*args, **kwargs).arguments
                n = dist.get_world_size(given.get('group'))
                # The tensor whose size the factor refers to: the input of a gather, the output
                # of a scatter (both are the block one rank contributes or keeps).
                tensor = list(given.values())[1 if name.startswith('all_gather') else 0]
                if isinstance(tensor, (list, tuple)):
                    tensor = tensor[0]
                sent = round(WIRE_FACTORS[name](n) * tensor.numel() * tensor.element_size())
                calls, total = counts.get(name, (0, 0))
                counts[name] = (calls + 1, total + sent)
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1
        return call

    for name in WIRE_FACTORS:
        if hasattr(dist, name):
            originals[name] = getattr(dist, name)
            setattr(dist, name, counting(name, originals[name]))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


@checked(_check_block_bytes)
def block_bytes(num_params, tokens, dim, n, replicated=0, bytes_per_value=4):
    """Return the bytes one rank sends in one training step of one transformer block, by strategy.

    `tokens`: the step's tokens (all ranks together); `num_params`: the block's parameters,
    `replicated` of them whole on every rank under tensor parallelism (norms, output
    biases); `dim`: its width; `n`: ranks. Ring algorithms: an all-reduce of S bytes sends
    2(n-1)/n S per rank, an all-gather or a reduce-scatter (n-1)/n S.
    """
    ring = (n - 1) / n
    activation = tokens * dim * bytes_per_value  # one (tokens, dim) activation of the step
    return {'DP': 2 * ring * num_params * bytes_per_value,  # all-reduce of every gradient
            'FSDP': 3 * ring * num_params * bytes_per_value,  # gather, gather again, scatter
            'TP': 4 * 2 * ring * activation,  # all-reduces: 2 in forward, 2 in backward
            'TP+SP': 8 * ring * activation  # 4 all-gathers, 4 reduce-scatters
            + 2 * ring * replicated * bytes_per_value,  # and the replicated gradients summed
            'PP': (1 if n == 2 else 2) * activation}  # busiest stage: output on, gradient back
