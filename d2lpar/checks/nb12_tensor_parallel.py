"""Argument checks for the code notebook 12 teaches (d2lpar/lessons/nb12_tensor_parallel.py).

Each check takes the same arguments as the function it guards and raises a TypeError or
ValueError naming the function and what to do; CHECKS maps the definition's name to it, and
`make lib` writes `@checked(CHECKS[name])` above that definition in the lesson module.
"""

import torch
from torch import nn

from d2lpar.checks import positive_int, process_group_size


def _check_split(caller, size, what):
    n = process_group_size(caller)
    if size % n:
        raise ValueError(
            f'{caller}: {what} ({size}) must divide by the world size ({n}), so that every rank holds an equal block'
        )


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
    if not (
        isinstance(mlp, nn.Sequential)
        and len(mlp) == 3
        and isinstance(mlp[0], nn.Linear)
        and isinstance(mlp[2], nn.Linear)
    ):
        raise TypeError(f'ParallelMLP: mlp must be nn.Sequential(nn.Linear, activation, nn.Linear), got {mlp!r}')


def _check_self_attention(self, dim, num_heads):
    positive_int(dim, 'SelfAttention: dim')
    positive_int(num_heads, 'SelfAttention: num_heads')
    if dim % num_heads:
        raise ValueError(f'SelfAttention: dim ({dim}) must divide by num_heads ({num_heads})')


def _check_parallel_attention(self, attention):
    from d2lpar.lessons.nb12_tensor_parallel import SelfAttention  # the lesson imports this module

    if not isinstance(attention, SelfAttention):
        raise TypeError(
            'ParallelSelfAttention: attention must be a d2lpar.tensor_parallel.'
            f'SelfAttention, got {type(attention).__name__}'
        )
    n = process_group_size('ParallelSelfAttention')
    if attention.num_heads % n:
        raise ValueError(
            f'ParallelSelfAttention: the {attention.num_heads} heads must divide by '
            f'the world size ({n}), so that every rank computes whole heads'
        )


def _check_attend(q, k, v, head_dim):
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise TypeError(
            'attend: q, k and v must be tensors (batch, tokens, features), got '
            f'{type(q).__name__}, {type(k).__name__}, {type(v).__name__}'
        )
    if not (q.shape == k.shape == v.shape) or q.dim() != 3:
        raise ValueError(
            'attend: q, k and v must have the same shape (batch, tokens, features), '
            f'got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}'
        )
    positive_int(head_dim, 'attend: head_dim')
    if q.shape[-1] % head_dim:
        raise ValueError(f'attend: the {q.shape[-1]} features must divide into heads of head_dim={head_dim}')


def _check_block(block):
    from d2lpar.lessons.nb12_tensor_parallel import Block  # the lesson imports this module

    if not isinstance(block, Block):
        raise TypeError(f'megatron_block: block must be a d2lpar.tensor_parallel.Block, got {type(block).__name__}')
    n = process_group_size('megatron_block')
    if block.mlp[0].out_features % n or block.attention.num_heads % n:
        raise ValueError(
            f'megatron_block: the hidden size ({block.mlp[0].out_features}) and the '
            f'heads ({block.attention.num_heads}) must divide by the world size ({n})'
        )


CHECKS = {
    'ColumnParallelLinear.__init__': _check_linear('ColumnParallelLinear'),
    'RowParallelLinear.__init__': _check_linear('RowParallelLinear'),
    'ParallelMLP.__init__': _check_mlp,
    'attend': _check_attend,
    'SelfAttention.__init__': _check_self_attention,
    'ParallelSelfAttention.__init__': _check_parallel_attention,
    'megatron_block': _check_block,
    'sequence_parallel_block': _check_block,
}
