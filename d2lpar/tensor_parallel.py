"""Tensor parallelism by hand, Megatron-style (notebook 11).

One layer's weights are split across the ranks of a process group. A
column-parallel linear holds a block of the output features, a row-parallel
linear a block of the input features; two conjugate autograd functions move the
data: `copy_to_parallel` (Megatron's f: identity forward, all-reduce of the
gradient in backward) where a block enters the split region, and
`reduce_from_parallel` (Megatron's g: all-reduce forward, identity backward)
where it leaves it. The algorithms are written in notebook 11's cells (marked
`#@save`) and are the same code here; argument checks run first, in `@checked`.
All-reduces are SUM (gloo's AVG is not trusted).
"""
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from ._checks import checked, positive_int, process_group_size

__all__ = ['CopyToParallel', 'ReduceFromParallel', 'copy_to_parallel', 'reduce_from_parallel',
           'ColumnParallelLinear', 'RowParallelLinear', 'ParallelMLP', 'attend', 'SelfAttention',
           'ParallelSelfAttention', 'communication_bytes']


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


def _check_communication_bytes(num_inputs, num_hiddens, batch_size, bytes_per_value=4):
    for name, value in (('num_inputs', num_inputs), ('num_hiddens', num_hiddens),
                        ('batch_size', batch_size), ('bytes_per_value', bytes_per_value)):
        positive_int(value, f'communication_bytes: {name}')


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

    def forward(self, X):
        return reduce_from_parallel(F.linear(X, self.weight)) + self.bias


class ParallelMLP(nn.Module):
    """Megatron's MLP: f, a column-parallel linear, the activation, a row-parallel linear (g)."""

    @checked(_check_mlp)
    def __init__(self, mlp):
        super().__init__()
        self.fc1, self.act, self.fc2 = ColumnParallelLinear(mlp[0]), mlp[1], RowParallelLinear(mlp[2])

    def forward(self, X):
        return self.fc2(self.act(self.fc1(copy_to_parallel(X))))


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

    def forward(self, X):
        X = copy_to_parallel(X)  # once for q, k and v: one all-reduce of X's gradient
        return self.out(attend(self.q(X), self.k(X), self.v(X), self.head_dim))


@checked(_check_communication_bytes)
def communication_bytes(num_inputs, num_hiddens, batch_size, bytes_per_value=4):
    """Return the bytes a rank hands to communication per step for a Linear-act-Linear MLP.

    'data': every gradient, all-reduced; 'tensor': the output in forward and the
    input's gradient in backward, all-reduced; 'pipeline' (2 stages, cut between
    the linears): stage 0 sends the hidden activations, stage 1 their gradients.
    """
    d, h, B = num_inputs, num_hiddens, batch_size
    num_params = d * h + h + h * d + d
    return {'data': num_params * bytes_per_value,
            'tensor': 2 * B * d * bytes_per_value,
            'pipeline': B * h * bytes_per_value}
