"""Ring attention and the online-softmax merge, against PyTorch's attention."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from spawned import run_ranks

from d2lpar import context_parallel as CP
from d2lpar.lessons import nb15_context_expert as lesson
from d2lpar.distributed import count_calls

EPS = torch.finfo(torch.float64).eps


def test_merging_blocks_equals_the_softmax_over_all_keys():
    torch.manual_seed(0)
    Q, K, V = torch.randn(2, 5, 4) * 10, torch.randn(2, 9, 4) * 10, torch.randn(2, 9, 4)
    full = F.scaled_dot_product_attention(Q, K, V)
    sizes = [2, 3, 4]
    blocks = [CP.attend_block(Q, k, v) for k, v in zip(K.split(sizes, 1), V.split(sizes, 1))]
    O, lse = blocks[0]
    for block in blocks[1:]:
        O, lse = CP.merge_attention(O, lse, *block)
    torch.testing.assert_close(O, full)
    torch.testing.assert_close(lse, (Q @ K.transpose(1, 2) / 2).logsumexp(-1, keepdim=True))


def test_zigzag_split_round_trip_and_chunks():
    assert CP.sequence_chunks(3) == [[0, 5], [1, 4], [2, 3]]
    assert CP.sequence_chunks(3, zigzag=False) == [[0], [1], [2]]
    X = torch.arange(12.0).view(12, 1)
    parts = [CP.shard_sequence(X, 3, r) for r in range(3)]
    assert parts[0].view(-1).tolist() == [0, 1, 10, 11]
    assert sorted(torch.cat(parts).view(-1).tolist()) == X.view(-1).tolist()
    assert CP.chunk_mask(2, 1, 3, True) is None and CP.chunk_mask(1, 2, 3, True) is False
    assert CP.chunk_mask(1, 2, 3, False) is None
    assert torch.equal(CP.chunk_mask(1, 1, 3, True), torch.ones(3, 3, dtype=torch.bool).tril())
    assert CP.ring_attention_bytes(1, 100) == (0, 0)
    assert CP.ring_attention_bytes(4, 100) == (600, 1400)


@pytest.mark.parametrize(
    'call, message',
    [
        (lambda: CP.shard_sequence(torch.ones(10, 2), 3, 0), 'divisible by 6'),
        (lambda: CP.shard_sequence(torch.ones(12, 2), 3, 3), 'rank must be in 0..2'),
        (lambda: CP.merge_attention(torch.ones(2, 3), torch.ones(2), torch.ones(2, 3), torch.ones(2)), 'shape'),
        (lambda: CP.ring_attention(*[torch.ones(4, 2)] * 3), 'init_process_group'),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises((ValueError, RuntimeError), match=message):
        call()


def added_without_rescaling(O1, lse1, O2, lse2):
    """A classic bug: partial outputs added as they are."""
    return O1 + O2, torch.logaddexp(lse1, lse2)


def _ranks(rank, n):
    S, results = 6 * n, {}
    g = torch.Generator().manual_seed(0)
    Q, K, V, G = (torch.randn(2, S, 4, generator=g, dtype=torch.float64) for _ in range(4))
    for name in ('right', 'added_without_rescaling'):
        if name != 'right':
            lesson.merge_attention = added_without_rescaling  # RingAttention looks it up there
        for causal, zigzag in ((False, True), (True, False), (True, True)):
            q, k, v = (CP.shard_sequence(t, n, rank, zigzag).requires_grad_() for t in (Q, K, V))
            stats = {}
            with count_calls() as calls:
                out = CP.ring_attention(q, k, v, causal, zigzag, stats)
                out.backward(CP.shard_sequence(G, n, rank, zigzag))
            full_in = [t.clone().requires_grad_() for t in (Q, K, V)]
            full = F.scaled_dot_product_attention(*full_in, is_causal=causal)
            full.backward(G)
            pairs = zip((out.detach(), q.grad, k.grad, v.grad), [full.detach()] + [t.grad for t in full_in])
            equal = [
                (a - CP.shard_sequence(b, n, rank, zigzag)).abs().max().item() <= S * EPS * b.abs().max().item()
                for a, b in pairs
            ]
            results[name, causal, zigzag] = {
                'equal': equal,
                'scores': stats['scores'],
                'sent': calls['isend']['bytes'] + calls['send']['bytes'],
                'predicted': sum(CP.ring_attention_bytes(n, k.numel() * 8)),
            }
    return results


def test_ring_attention_on_three_ranks():
    reports = run_ranks(_ranks, 3)
    n, S = 3, 18
    for rank, report in reports.items():
        for (name, causal, zigzag), r in report.items():
            assert r['sent'] == r['predicted']
            if name == 'right':
                assert all(r['equal']), (rank, causal, zigzag, r)
            elif not (causal and not zigzag and rank == 0):  # that rank sees only its own block
                assert not r['equal'][0]  # the equality check catches the missing rescale
        c = S // n
        assert report['right', True, False]['scores'] == (rank + 1) * c * c  # in order: uneven
        assert report['right', True, True]['scores'] == (2 * n + 1) * (c // 2) ** 2  # balanced
        assert report['right', False, True]['scores'] == S * c


def _subgroup_ranks(rank, n):
    """Two rings of two, interleaved (ranks 0, 2 and 1, 3), each on its own sequence."""
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    group, ring = groups[rank % 2], rank % 2
    S = 8
    g = torch.Generator().manual_seed(ring)  # each ring its own data: crossed wires would show
    Q, K, V, G = (torch.randn(2, S, 4, generator=g, dtype=torch.float64) for _ in range(4))
    me = dist.get_rank(group)
    q, k, v = (CP.shard_sequence(t, 2, me).requires_grad_() for t in (Q, K, V))
    out = CP.ring_attention(q, k, v, group=group)
    out.backward(CP.shard_sequence(G, 2, me))
    full_in = [t.clone().requires_grad_() for t in (Q, K, V)]
    full = F.scaled_dot_product_attention(*full_in, is_causal=True)
    full.backward(G)
    return [
        (a - CP.shard_sequence(b, 2, me)).abs().max().item() / (S * EPS * b.abs().max().item())
        for a, b in zip((out.detach(), q.grad, k.grad, v.grad), [full.detach()] + [t.grad for t in full_in])
    ]


def test_ring_attention_within_subgroups():
    """Ring attention over each half of 4 ranks equals full attention of that half's sequence."""
    for rank, errors in run_ranks(_subgroup_ranks, 4).items():
        assert max(errors) <= 1, (rank, errors)  # output and the three gradients, in units of the bound


def _batches(rank, n):
    """Every send of ring attention, as (size of its batch, kinds, global peers), on two rings."""
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    group, me = groups[rank % 2], dist.get_rank(groups[rank % 2])
    batches, batch = [], dist.batch_isend_irecv

    def recording(ops):
        batches.append([(op.op.__name__, op.peer) for op in ops])
        return batch(ops)

    q, k, v = (torch.randn(1, 8, 4, dtype=torch.float64).requires_grad_() for _ in range(3))
    dist.batch_isend_irecv = recording
    try:
        with count_calls() as calls:
            CP.ring_attention(q, k, v, group=group).backward(torch.ones(1, 8, 4, dtype=torch.float64))
    finally:
        dist.batch_isend_irecv = batch
    return {'batches': batches, 'isends': calls['isend']['calls'], 'me': me}


def test_ring_messages_are_grouped_pairs_with_global_peers():
    """NCCL's contract: a send and a receive in flight together are posted as one group."""
    ring_size = 2
    for rank, report in run_ranks(_batches, 4).items():
        right = left = (rank + 2) % 4  # in a ring of two, both neighbours are the other rank
        assert report['batches'] == [[('isend', right), ('irecv', left)]] * (3 * ring_size - 2)
        assert report['isends'] == len(report['batches'])  # no isend outside a batch
