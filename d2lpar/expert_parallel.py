"""All-to-all from point-to-point messages; a mixture of experts split across ranks (notebook 14).

`pairwise_all_to_all` is written in the style of notebook 9's collectives, from
`isend` and `recv` only. `route`, `load_balancing_loss` and `MoE` are a
mixture-of-experts layer in one process; `AllToAll` makes the exchange
differentiable, and `ExpertParallelMoE` runs the same layer with its experts
split across the ranks, tokens dispatched to their experts and their outputs
combined by two all-to-alls. Each function's code is a `#@save` cell of
notebook 14 (tests/test_saved_cells.py compares them); the `_check_...`
functions validate the arguments before it runs (see d2lpar/_checks.py).
"""
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ._checks import checked, finite_number, positive_int, process_group_size
from .collectives import send_and_receive

__all__ = ['pairwise_all_to_all', 'all_to_all_cost', 'AllToAll', 'route', 'expert_capacity',
           'load_balancing_loss', 'MoE', 'ExpertParallelMoE']


# Argument checks: run by @checked before each function, so that its code stays the algorithm.

def _check_pairwise_all_to_all(output_list, input_list):
    n = process_group_size('pairwise_all_to_all')
    for name, tensors in (('output_list', output_list), ('input_list', input_list)):
        if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
            raise TypeError(f'pairwise_all_to_all: {name} must be a list of {n} tensors, '
                            'one per rank')
        if len(tensors) != n:
            raise ValueError(f'pairwise_all_to_all: {name} holds {len(tensors)} tensors for a '
                             f'world of {n} ranks; pass one per rank')
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor) or not t.is_contiguous():
                raise ValueError(f'pairwise_all_to_all: {name}[{i}] must be a contiguous tensor')
    rank = dist.get_rank()
    if output_list[rank].shape != input_list[rank].shape:
        raise ValueError(f'pairwise_all_to_all: output_list[{rank}] has shape '
                         f'{tuple(output_list[rank].shape)} but this rank sends itself '
                         f'{tuple(input_list[rank].shape)}; size each output block like what '
                         'its rank sends')


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
    n = process_group_size('ExpertParallelMoE')
    if not isinstance(moe, MoE):
        raise TypeError(f'ExpertParallelMoE: expected a d2lpar MoE, got {type(moe).__name__}')
    if len(moe.experts) % n:
        raise ValueError(f'ExpertParallelMoE: {len(moe.experts)} experts cannot be split evenly '
                         f'over {n} ranks; use a multiple of {n} experts')


# The algorithms: each is a `#@save` cell of notebook 14.

@checked(_check_pairwise_all_to_all)
def pairwise_all_to_all(output_list, input_list):
    """Send input_list[j] to rank j and receive output_list[j] from rank j, on every rank."""
    rank, n = dist.get_rank(), dist.get_world_size()
    output_list[rank].copy_(input_list[rank])  # what a rank sends itself never leaves it
    for step in range(1, n):  # step s: send s ranks ahead, receive from s ranks behind
        dst, src = (rank + step) % n, (rank - step) % n
        send_and_receive(input_list[dst], dst, output_list[src], src)  # notebook 9's, batched
    return output_list


@checked(_check_all_to_all_cost)
def all_to_all_cost(n, size, bandwidth, latency=0.0):
    """Return the model's seconds for an all-to-all of `size` bytes per rank, split evenly."""
    return (n - 1) * latency + (n - 1) / n * size / bandwidth  # n-1 messages of size/n


class AllToAll(torch.autograd.Function):
    """An all-to-all of rows: in_splits[j] rows go to rank j, out_splits[j] rows come from it."""

    @staticmethod
    def forward(ctx, X, in_splits, out_splits):
        ctx.splits = in_splits, out_splits
        Y = X.new_empty(sum(out_splits), *X.shape[1:])
        pairwise_all_to_all(list(Y.split(out_splits)), list(X.contiguous().split(in_splits)))
        return Y

    @staticmethod
    def backward(ctx, dY):
        # Each row's gradient goes back to the rank the row came from: the same exchange reversed.
        in_splits, out_splits = ctx.splits
        dX = dY.new_empty(sum(in_splits), *dY.shape[1:])
        pairwise_all_to_all(list(dX.split(in_splits)), list(dY.contiguous().split(out_splits)))
        return dX, None, None


@checked(_check_route)
def route(logits, k, capacity=None):
    """Return each kept (expert, token, gate) assignment of the top-k, and the probabilities."""
    probs = logits.softmax(dim=-1)
    top, expert = probs.topk(k, dim=-1)
    gate = top / top.sum(dim=-1, keepdim=True)  # a token's k gates add up to one
    # All first choices, then all second choices...: first choices claim capacity first.
    expert, gate = expert.t().reshape(-1), gate.t().reshape(-1)
    token = torch.arange(logits.shape[0], device=logits.device).repeat(k)
    if capacity is not None:  # each expert keeps its first `capacity` assignments
        place = F.one_hot(expert, logits.shape[1]).cumsum(dim=0).gather(1, expert[:, None])[:, 0]
        keep = place <= capacity
        expert, token, gate = expert[keep], token[keep], gate[keep]
    return expert, token, gate, probs


@checked(_check_expert_capacity)
def expert_capacity(num_tokens, k, num_experts, capacity_factor):
    """Return how many assignments each expert accepts: capacity_factor times a fair share."""
    return math.ceil(capacity_factor * num_tokens * k / num_experts)


def load_balancing_loss(probs, k):
    """Return the Switch Transformer's balancing loss: E * sum_e (share of e) * (mean prob of e)."""
    num_experts = probs.shape[1]
    expert = probs.topk(k, dim=-1).indices.reshape(-1)
    share = torch.bincount(expert, minlength=num_experts) / expert.numel()
    return num_experts * (share * probs.mean(dim=0)).sum()


class MoE(nn.Module):
    """A mixture of `num_experts` MLPs: a router sends each token to its top-k experts."""

    def __init__(self, dim, hidden, num_experts, k=2, capacity_factor=None):
        super().__init__()
        self.k, self.capacity_factor = k, capacity_factor
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim))
            for _ in range(num_experts))

    def capacity(self, num_tokens):
        if self.capacity_factor is None:
            return None
        return expert_capacity(num_tokens, self.k, len(self.experts), self.capacity_factor)

    def forward(self, X):
        expert, token, gate, probs = route(self.router(X), self.k, self.capacity(len(X)))
        self.aux_loss = load_balancing_loss(probs, self.k)
        self.tokens_per_expert = torch.bincount(expert, minlength=len(self.experts))
        Y = X.new_zeros(len(token), X.shape[1])
        for e, net in enumerate(self.experts):
            mask = expert == e
            Y[mask] = net(X[token[mask]])
        # A token's output: its experts' outputs weighted by their gates (zero if all dropped).
        return torch.zeros_like(X).index_add(0, token, Y * gate[:, None])


class ExpertParallelMoE(nn.Module):
    """An MoE whose experts are split across the ranks; every rank keeps the router."""

    @checked(_check_expert_parallel)
    def __init__(self, moe):
        super().__init__()
        n, rank = dist.get_world_size(), dist.get_rank()
        self.k, self.capacity = moe.k, moe.capacity
        self.num_experts, self.local = len(moe.experts), len(moe.experts) // n
        self.router = moe.router
        self.experts = moe.experts[rank * self.local:(rank + 1) * self.local]  # ours only

    def forward(self, X):
        n, local = dist.get_world_size(), self.local
        expert, token, gate, probs = route(self.router(X), self.k, self.capacity(len(X)))
        self.aux_loss = load_balancing_loss(probs, self.k)
        order = torch.argsort(expert, stable=True)  # group the assignments by expert...
        expert, token, gate = expert[order], token[order], gate[order]  # ...so by rank too
        counts = torch.bincount(expert, minlength=self.num_experts)
        self.tokens_per_expert = counts
        # 1. Tell every rank how many rows to expect for each of its experts.
        received = torch.empty_like(counts)
        pairwise_all_to_all(list(received.split(local)), list(counts.split(local)))
        send = counts.view(n, local).sum(dim=1).tolist()
        recv = received.view(n, local).sum(dim=1).tolist()
        self.splits = send, recv  # rows sent to and received from each rank
        # 2. Dispatch: each assignment's token travels to the rank holding its expert.
        X_in = AllToAll.apply(X[token], send, recv)
        # the local expert of each received row: rows come by rank, then by expert
        which = torch.arange(local, device=X.device).repeat(n).repeat_interleave(received)
        Y_in = X_in.new_zeros(X_in.shape)
        for e, net in enumerate(self.experts):
            mask = which == e
            Y_in[mask] = net(X_in[mask])
        # 3. Combine: the outputs travel back, in the order they came, and are weighted and summed.
        Y = AllToAll.apply(Y_in, recv, send)
        return torch.zeros_like(X).index_add(0, token, Y * gate[:, None])
