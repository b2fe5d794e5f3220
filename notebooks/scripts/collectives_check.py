"""Check every hand-written collective of d2lpar.collectives against torch.distributed's own.

Run:  torchrun --standalone --nproc-per-node=3 scripts/collectives_check.py
Each rank compares, for several sizes and dtypes, its result with the built-in
collective's and hands back the largest difference; any mismatch fails the run.
"""
import torch
import torch.distributed as dist

from d2lpar import collectives as C
from d2lpar.distributed import count_calls, default_timeout, emit_result

dist.init_process_group('gloo', timeout=default_timeout())
rank, n = dist.get_rank(), dist.get_world_size()


def data(numel, dtype, seed):
    """Return this rank's test tensor: random floats, or small integers."""
    g = torch.Generator().manual_seed(100 * seed + rank)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=g, dtype=dtype)
    return torch.randint(-9, 10, (numel,), generator=g, dtype=dtype)


def ours_and_theirs(name, X):
    """Return (hand-written result, built-in result) of collective `name` on X."""
    if name in ('naive allreduce', 'ring allreduce'):
        fn = C.naive_allreduce if name.startswith('naive') else C.ring_allreduce
        ours, theirs = fn(X.clone()), X.clone()
        dist.all_reduce(theirs)
    elif name == 'broadcast':  # from the last rank, to show any root works
        ours, theirs = C.broadcast(X.clone(), n - 1), X.clone()
        dist.broadcast(theirs, n - 1)
    elif name == 'reduce':  # compared on the root, where the result lives
        ours, theirs = C.reduce(X.clone(), n - 1), X.clone()
        dist.reduce(theirs, n - 1)
        if rank != n - 1:
            theirs = X
    elif name == 'all_gather':
        ours, theirs = [torch.empty_like(X) for _ in range(n)], [torch.empty_like(X) for _ in range(n)]
        C.all_gather(ours, X)
        dist.all_gather(theirs, X)
        ours, theirs = torch.stack(ours), torch.stack(theirs)
    else:  # reduce_scatter: block r of every rank's input list is summed into rank r
        inputs = [X * (i + 1) for i in range(n)]
        ours, theirs = torch.empty_like(X), torch.empty_like(X)
        C.reduce_scatter(ours, inputs)
        dist.reduce_scatter(theirs, [t.clone() for t in inputs])
    return ours, theirs


NAMES = ['broadcast', 'reduce', 'all_gather', 'reduce_scatter', 'naive allreduce', 'ring allreduce']
checks = []
for numel in (n * 1000, n * 1000 + 1, n - 1):  # divisible by n, not divisible, fewer than n
    for dtype in (torch.float32, torch.int64):
        X = data(numel, dtype, seed=numel)
        for name in NAMES:
            ours, theirs = ours_and_theirs(name, X)
            # Integers must match exactly; float sums taken in another order may
            # differ in the last bits, which assert_close's default tolerance allows.
            exact = not dtype.is_floating_point
            torch.testing.assert_close(ours, theirs, rtol=0 if exact else None,
                                       atol=0 if exact else None)
            diff = (ours.double() - theirs.double()).abs().max().item() if ours.numel() else 0.0
            checks.append({'collective': name, 'numel': numel, 'dtype': str(dtype)[6:],
                           'max_diff': diff})

# Bytes each rank sends and receives for a message of S bytes (S divisible by n),
# counted at every call of dist.send, recv, isend and irecv while the allreduce runs.
S = 4 * 1000 * n
traffic = {'S': S}
for name, fn in (('naive', C.naive_allreduce), ('ring', C.ring_allreduce)):
    with count_calls() as calls:
        fn(torch.zeros(S // 4))
    traffic[name] = {'sent': calls['send']['bytes'] + calls['isend']['bytes'],
                     'received': calls['recv']['bytes'] + calls['irecv']['bytes'],
                     'messages': sum(calls[f]['calls'] for f in ('send', 'isend'))}
print(f'{len(checks)} comparisons equal to torch.distributed; for S = {S} bytes this rank '
      f'sent/received: naive {traffic["naive"]["sent"]}/{traffic["naive"]["received"]}, '
      f'ring {traffic["ring"]["sent"]}/{traffic["ring"]["received"]}')
emit_result(checks=checks, traffic=traffic, world_size=n)
dist.destroy_process_group()
