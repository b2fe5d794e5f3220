"""Context parallelism by hand: ring attention with the online-softmax merge (notebook 14).

Every rank holds one part of the sequence: its queries stay, its keys and
values travel around a ring of ranks. Each rank attends its queries to every
block of keys as it passes, and merges the partial results with their
log-sum-exps (`merge_attention`), so that no rank ever holds more than two
blocks of keys and values or one block of scores. With a causal mask, the
zig-zag split (`sequence_chunks`) gives every rank the same work. The
backward pass is written by hand (`RingAttention.backward`): the keys and
values travel around the ring once more, now with their gradients, which
arrive back at their owner after a full turn. Each function's code is a
`#@save` cell of notebook 14 (tests/test_saved_cells.py compares them); the
`_check_...` functions validate the arguments before it runs.
"""
import math

import torch
import torch.distributed as dist

from ._checks import checked, positive_int, process_group_size

__all__ = ['attend_block', 'merge_attention', 'sequence_chunks', 'shard_sequence', 'chunk_mask',
           'RingAttention', 'ring_attention', 'ring_attention_bytes']


def _check_merge(O1, lse1, O2, lse2):
    if O1.shape != O2.shape or lse1.shape != lse2.shape or lse1.shape != O1.shape[:-1] + (1,):
        raise ValueError('merge_attention: O1 and O2 must have one shape (..., queries, d), '
                         'lse1 and lse2 the shape (..., queries, 1)')


def _check_chunks(n, zigzag=True):
    positive_int(n, 'sequence_chunks: n (the number of ranks)')


def _check_shard(X, n, rank, zigzag=True):
    positive_int(n, 'shard_sequence: n (the number of ranks)')
    if not isinstance(rank, int) or not 0 <= rank < n:
        raise ValueError(f'shard_sequence: rank must be in 0..{n - 1}, got {rank!r}')
    parts = 2 * n if zigzag else n
    if X.shape[-2] % parts:
        raise ValueError(f'shard_sequence: a sequence of {X.shape[-2]} positions cannot be cut '
                         f'into {parts} equal chunks ({"2n, zig-zag" if zigzag else "n"}); use a '
                         f'length divisible by {parts}')


def _check_ring(Q, K, V, causal=True, zigzag=True, stats=None, group=None):
    process_group_size('ring_attention')
    if not (Q.shape == K.shape == V.shape) or Q.dim() < 2:
        raise ValueError('ring_attention: Q, K and V must have one shape (..., local length, d): '
                         "this rank's part of the sequence")
    parts = 2 if zigzag else 1
    if Q.shape[-2] % parts:
        raise ValueError(f'ring_attention: a zig-zag part holds two equal chunks, but this '
                         f'rank has {Q.shape[-2]} positions; use an even local length')


# The algorithms: each is a `#@save` cell of notebook 14.

def attend_block(Q, K, V, mask=None):
    """Attend queries Q to one block of keys and values; return the output and its log-sum-exp."""
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float('-inf'))
    lse = scores.logsumexp(dim=-1, keepdim=True)
    return torch.exp(scores - lse) @ V, lse


@checked(_check_merge)
def merge_attention(O1, lse1, O2, lse2):
    """Merge the attention results over two disjoint blocks of keys into the one over both."""
    lse = torch.logaddexp(lse1, lse2)  # log(e^lse1 + e^lse2), the larger one factored out
    return torch.exp(lse1 - lse) * O1 + torch.exp(lse2 - lse) * O2, lse


@checked(_check_chunks)
def sequence_chunks(n, zigzag=True):
    """Return the chunks each of n ranks holds: chunk r of n, or r and 2n-1-r of 2n (zig-zag)."""
    return [[r, 2 * n - 1 - r] if zigzag else [r] for r in range(n)]


@checked(_check_shard)
def shard_sequence(X, n, rank, zigzag=True):
    """Return rank's part of X (..., sequence, d): its chunks, in order."""
    chunks = X.chunk(2 * n if zigzag else n, dim=-2)
    return torch.cat([chunks[c] for c in sequence_chunks(n, zigzag)[rank]], dim=-2)


def chunk_mask(i, j, size, causal, device=None):
    """Return how query chunk i sees key chunk j: None (all of it), False (none), or a mask."""
    if not causal or j < i:
        return None
    if j > i:
        return False
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


class RingAttention(torch.autograd.Function):
    """Attention over the whole sequence for this rank's queries, keys and values in a ring."""

    @staticmethod
    def forward(ctx, Q, K, V, causal, zigzag, stats, group):
        rank, n = dist.get_rank(group), dist.get_world_size(group)  # within the group (None: all)
        chunks = sequence_chunks(n, zigzag)
        mine, size = chunks[rank], Q.shape[-2] // len(chunks[rank])
        results = [None] * len(mine)  # (output, lse) of each of our query chunks, so far
        KV = torch.stack([K, V])  # one message per step
        for step in range(n):
            src = (rank - step) % n  # whose keys and values we hold now
            if step < n - 1:  # pass them on to the right while we compute with them
                received = torch.empty_like(KV)
                requests = [dist.isend(KV, group_dst=(rank + 1) % n, group=group),
                            dist.irecv(received, group_src=(rank - 1) % n, group=group)]
            for a, i in enumerate(mine):
                for b, j in enumerate(chunks[src]):
                    mask = chunk_mask(i, j, size, causal, Q.device)
                    if mask is False:  # all of these keys come after all of these queries
                        continue
                    q, k, v = (t.narrow(-2, x * size, size) for t, x in
                               ((Q, a), (KV[0], b), (KV[1], b)))
                    O, lse = attend_block(q, k, v, mask)
                    results[a] = (O, lse) if results[a] is None else merge_attention(
                        *results[a], O, lse)
                    if stats is not None:
                        stats['scores'] = stats.get('scores', 0) + q.shape[-2] * k.shape[-2]
            if step < n - 1:
                for request in requests:
                    request.wait()
                KV = received
        O = torch.cat([O for O, _ in results], dim=-2)
        lse = torch.cat([lse for _, lse in results], dim=-2)
        ctx.save_for_backward(Q, K, V, O, lse)
        ctx.causal, ctx.zigzag, ctx.group = causal, zigzag, group
        return O

    @staticmethod
    def backward(ctx, dO):
        Q, K, V, O, lse = ctx.saved_tensors
        group = ctx.group
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        chunks = sequence_chunks(n, ctx.zigzag)
        mine, size = chunks[rank], Q.shape[-2] // len(chunks[rank])
        scale = 1 / math.sqrt(Q.shape[-1])
        D = (dO * O).sum(dim=-1, keepdim=True)  # softmax's backward needs sum_j P_ij dP_ij
        dQ = torch.zeros_like(Q)
        KV, dKV = torch.stack([K, V]), torch.zeros(2, *K.shape, dtype=K.dtype, device=K.device)
        for step in range(n):
            src = (rank - step) % n
            for a, i in enumerate(mine):
                for b, j in enumerate(chunks[src]):
                    mask = chunk_mask(i, j, size, ctx.causal, Q.device)
                    if mask is False:
                        continue
                    rows, cols = slice(a * size, (a + 1) * size), slice(b * size, (b + 1) * size)
                    q, do = Q[..., rows, :], dO[..., rows, :]
                    k, v = KV[0][..., cols, :], KV[1][..., cols, :]
                    scores = q @ k.transpose(-2, -1) * scale
                    if mask is not None:
                        scores = scores.masked_fill(~mask, float('-inf'))
                    P = torch.exp(scores - lse[..., rows, :])  # the forward's probabilities, again
                    dS = P * (do @ v.transpose(-2, -1) - D[..., rows, :])
                    dQ[..., rows, :] += dS @ k * scale
                    dKV[0][..., cols, :] += dS.transpose(-2, -1) @ q * scale
                    dKV[1][..., cols, :] += P.transpose(-2, -1) @ do
            if n > 1:  # pass the block with its gradient; after n passes the gradient is home
                message = torch.cat([KV, dKV]) if step < n - 1 else dKV
                received = torch.empty_like(message)
                request = dist.isend(message, group_dst=(rank + 1) % n, group=group)
                dist.recv(received, group_src=(rank - 1) % n, group=group)
                request.wait()
                KV, dKV = (received[:2], received[2:]) if step < n - 1 else (KV, received)
        return dQ, dKV[0], dKV[1], None, None, None, None


@checked(_check_ring)
def ring_attention(Q, K, V, causal=True, zigzag=True, stats=None, group=None):
    """Return softmax(QK^T/sqrt(d))V for this rank's part of the sequence, keys passed in a ring.

    The ring is the ranks of `group` (None: every rank), in the order of their ranks in it.
    """
    return RingAttention.apply(Q, K, V, causal, zigzag, stats, group)


def ring_attention_bytes(n, block_bytes):
    """Return the bytes a rank sends in forward and in backward; its K holds `block_bytes`."""
    if n == 1:
        return 0, 0
    forward = (n - 1) * 2 * block_bytes  # K and V, n-1 times
    backward = (n - 1) * 4 * block_bytes + 2 * block_bytes  # K, V, dK, dV; dK, dV once more
    return forward, backward
