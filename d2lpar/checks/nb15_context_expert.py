"""Argument checks for the code notebook 15 teaches (d2lpar/lessons/nb15_context_expert.py).

Each check takes the same arguments as the function it guards and raises a TypeError or
ValueError naming the function and what to do; CHECKS maps the definition's name to it, and
`make lib` writes `@checked(CHECKS[name])` above that definition in the lesson module.
"""

import torch
import torch.distributed as dist

from d2lpar.checks import finite_number, positive_int, process_group_size


def _check_merge(O1, lse1, O2, lse2):
    if O1.shape != O2.shape or lse1.shape != lse2.shape or lse1.shape != O1.shape[:-1] + (1,):
        raise ValueError(
            'merge_attention: O1 and O2 must have one shape (..., queries, d), '
            'lse1 and lse2 the shape (..., queries, 1)'
        )


def _check_chunks(n, zigzag=True):
    positive_int(n, 'sequence_chunks: n (the number of ranks)')


def _check_shard(X, n, rank, zigzag=True):
    positive_int(n, 'shard_sequence: n (the number of ranks)')
    if not isinstance(rank, int) or not 0 <= rank < n:
        raise ValueError(f'shard_sequence: rank must be in 0..{n - 1}, got {rank!r}')
    parts = 2 * n if zigzag else n
    if X.shape[-2] % parts:
        raise ValueError(
            f'shard_sequence: a sequence of {X.shape[-2]} positions cannot be cut '
            f'into {parts} equal chunks ({"2n, zig-zag" if zigzag else "n"}); use a '
            f'length divisible by {parts}'
        )


def _check_ring(Q, K, V, causal=True, zigzag=True, stats=None, group=None):
    process_group_size('ring_attention')
    if not (Q.shape == K.shape == V.shape) or Q.dim() < 2:
        raise ValueError(
            'ring_attention: Q, K and V must have one shape (..., local length, d): this rank\'s part of the sequence'
        )
    parts = 2 if zigzag else 1
    if Q.shape[-2] % parts:
        raise ValueError(
            f'ring_attention: a zig-zag part holds two equal chunks, but this '
            f'rank has {Q.shape[-2]} positions; use an even local length'
        )


def _check_pairwise_all_to_all(output_list, input_list):
    n = process_group_size('pairwise_all_to_all')
    for name, tensors in (('output_list', output_list), ('input_list', input_list)):
        if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
            raise TypeError(f'pairwise_all_to_all: {name} must be a list of {n} tensors, one per rank')
        if len(tensors) != n:
            raise ValueError(
                f'pairwise_all_to_all: {name} holds {len(tensors)} tensors for a world of {n} ranks; pass one per rank'
            )
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor) or not t.is_contiguous():
                raise ValueError(f'pairwise_all_to_all: {name}[{i}] must be a contiguous tensor')
    rank = dist.get_rank()
    if output_list[rank].shape != input_list[rank].shape:
        raise ValueError(
            f'pairwise_all_to_all: output_list[{rank}] has shape '
            f'{tuple(output_list[rank].shape)} but this rank sends itself '
            f'{tuple(input_list[rank].shape)}; size each output block like what '
            'its rank sends'
        )


def _check_all_to_all_cost(n, size, bandwidth, latency=0.0):
    positive_int(n, 'all_to_all_cost: n (the number of processes)')
    finite_number(size, 'size (bytes)', 'all_to_all_cost')
    finite_number(bandwidth, 'bandwidth (bytes/s)', 'all_to_all_cost', positive=True)
    finite_number(latency, 'latency (s)', 'all_to_all_cost')


def _check_route(logits, k, capacity=None):
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError('route: logits must be a (tokens, experts) tensor')
    positive_int(k, 'route: k (experts per token)')
    if k > logits.shape[1]:
        raise ValueError(f'route: k={k} but there are only {logits.shape[1]} experts')
    if capacity is not None:
        positive_int(capacity, 'route: capacity (assignments per expert)')


def _check_expert_capacity(num_tokens, k, num_experts, capacity_factor):
    positive_int(k, 'expert_capacity: k')
    positive_int(num_experts, 'expert_capacity: num_experts')
    finite_number(num_tokens, 'num_tokens', 'expert_capacity')
    finite_number(capacity_factor, 'capacity_factor', 'expert_capacity', positive=True)


def _check_expert_parallel(self, moe):
    from d2lpar.lessons.nb15_context_expert import MoE  # the lesson imports this module

    n = process_group_size('ExpertParallelMoE')
    if not isinstance(moe, MoE):
        raise TypeError(f'ExpertParallelMoE: expected a d2lpar MoE, got {type(moe).__name__}')
    if len(moe.experts) % n:
        raise ValueError(
            f'ExpertParallelMoE: {len(moe.experts)} experts cannot be split evenly '
            f'over {n} ranks; use a multiple of {n} experts'
        )


CHECKS = {
    'merge_attention': _check_merge,
    'sequence_chunks': _check_chunks,
    'shard_sequence': _check_shard,
    'ring_attention': _check_ring,
    'pairwise_all_to_all': _check_pairwise_all_to_all,
    'all_to_all_cost': _check_all_to_all_cost,
    'route': _check_route,
    'expert_capacity': _check_expert_capacity,
    'ExpertParallelMoE.__init__': _check_expert_parallel,
}
