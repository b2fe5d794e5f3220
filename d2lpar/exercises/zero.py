"""Checker of notebook 10 (ZeRO by hand): ZeRO-2's per-bucket reduce-scatter hook.

The learner's `zero2_hook(bucket, shards, n, rank, reduce_scatter)` returns the
hook that each parameter of `bucket` registers with
`register_post_accumulate_grad_hook`. The checker runs N simulated ranks as N
threads of this process, each with its own copy of a small MLP and its slice of
the batch, and a `reduce_scatter(rows)` that really combines the ranks' rows (a
barrier, then each rank sums its row over the ranks; the other rows, which hold
partial sums after a real ring, become NaN). It compares every shard's
gradient with single-process training on the whole batch, counts the
reduce-scatters, and records each rank's memory over forward and backward with
`d2lpar.memory.StepMemory`, against the same run with the reference hook.
"""

import threading

import torch
from torch import nn

from ..helpers.memory import StepMemory
from ._verdict import _call, _checker, _Fail

_TIMEOUT = 20  # seconds a simulated rank waits for the others at a reduce-scatter


def _pad_rows(tensor, n):
    flat = tensor.detach().reshape(-1)
    return nn.functional.pad(flat, (0, -flat.numel() % n)).view(n, -1)


def _reference_hook(bucket, shards, n, rank, reduce_scatter):
    """ZeRO-2 as notebook 10 writes it: one buffer per bucket, full gradients freed at once."""
    ready = set()

    def hook(p):
        ready.add(p)
        if len(ready) < len(bucket):
            return
        ready.clear()
        sizes = [shards[q].numel() for q in bucket]
        rows = torch.empty(n, sum(sizes), dtype=p.dtype, device=p.device)
        for q, columns in zip(bucket, rows.split(sizes, dim=1)):
            columns.copy_(_pad_rows(q.grad, n))
            q.grad = None
        reduce_scatter(list(rows))
        for q, grad in zip(bucket, (rows[rank] / n).split(sizes)):
            shards[q].grad = grad

    return hook


class _World:
    """N simulated ranks in threads; `reduce_scatter(rank)` is rank `rank`'s collective."""

    def __init__(self, n):
        self.n, self.rows = n, [None] * n
        self.barrier = threading.Barrier(n, timeout=_TIMEOUT)
        self.calls = [0] * n

    def reduce_scatter(self, rank):
        def reduce_scatter(rows):
            """Sum row r of every rank's `rows` into row r of rank r's (a list of N tensors)."""
            rows = list(rows)
            shapes = {tuple(t.shape) for t in rows if isinstance(t, torch.Tensor)}
            if len(rows) != self.n or len(shapes) != 1:
                raise ValueError(
                    f'reduce_scatter wants a list of N = {self.n} tensors of one '
                    f'shape (one row per rank), got {len(rows)} of shapes '
                    f'{sorted(shapes)}'
                )
            self.calls[rank] += 1
            self.rows[rank] = rows
            self.barrier.wait()  # every rank has handed in its rows
            shapes = {tuple(r[0].shape) for r in self.rows}
            if len(shapes) != 1:
                raise ValueError(f'the ranks reduce-scatter rows of different shapes {shapes}')
            rows[rank].copy_(sum(r[rank] for r in self.rows))  # no other rank reads this row
            self.barrier.wait()  # every rank has read the rows it needs
            for other in range(self.n):  # as after a ring: no total there, so nothing usable
                if other != rank:
                    rows[other].fill_(float('nan'))
            return rows

        return reduce_scatter


def _make_net(widths):
    torch.manual_seed(0)
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def _run(make_hook, widths, n, X, y, steps=2):
    """Train `steps` backward passes on n simulated ranks; return, per rank, the shard
    gradients of each step, the reduce-scatters made and the peak bytes of the first step."""
    world = _World(n)
    nets = [_make_net(widths) for _ in range(n)]
    shards, hooks = [], []
    for rank, net in enumerate(nets):
        params = list(net.parameters())
        shards.append({p: _pad_rows(p, n)[rank].clone() for p in params})
        # one bucket per Linear layer, in the order backward produces them
        buckets = [params[i : i + 2] for i in range(0, len(params), 2)][::-1]
        hooks.append(
            [(bucket, make_hook(bucket, shards[rank], n, rank, world.reduce_scatter(rank))) for bucket in buckets]
        )
    for rank, net in enumerate(nets):
        for bucket, hook in hooks[rank]:
            if not callable(hook):
                raise _Fail(
                    f'zero2_hook returned a {type(hook).__name__}; return the hook '
                    'itself, a function hook(p) that backward calls with each parameter '
                    'whose gradient is complete.'
                )
            for p in bucket:
                p.register_post_accumulate_grad_hook(hook)
    results = [dict(grads=[], peak=None) for _ in range(n)]
    errors, step_of_error = [None] * n, [0] * n

    def rank_main(rank):
        try:
            net, step = nets[rank], 0
            for step in range(steps):
                Xs, ys = X[step].chunk(n)[rank], y[step].chunk(n)[rank]
                for shard in shards[rank].values():
                    shard.grad = None
                with StepMemory(net, shards[rank]) as mem:
                    nn.functional.mse_loss(net(Xs), ys).backward()
                if step == 0:
                    results[rank]['peak'] = mem.peak
                results[rank]['grads'].append([shards[rank][p].grad for p in net.parameters()])
        except BaseException as e:  # the learner's error: stop the other ranks too
            errors[rank], step_of_error[rank] = e, step
            world.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(rank,), daemon=True) for rank in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(steps * _TIMEOUT + 5)
    first = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    if first:
        e = first[0]
        if isinstance(e, NotImplementedError):
            raise _Fail(f'your hook raised NotImplementedError({e}) during backward; finish it.')
        again = (
            ''
            if step_of_error[errors.index(e)] == 0
            else ' It worked in the first '
            'backward and failed in the second. Hint: once a bucket is reduced, forget '
            'which of its gradients arrived, so that the next backward starts afresh.'
        )
        raise _Fail(f'during backward on {n} ranks, your hook raised {type(e).__name__}: {e}.{again}')
    if any(errors) or any(t.is_alive() for t in threads):
        raise _Fail(
            f'the {n} ranks did not meet at the same reduce-scatters (one waited '
            f'{_TIMEOUT} s for the others). Hint: every rank must call reduce_scatter '
            'once per bucket, when the last gradient of the bucket arrives.'
        )
    return results, world.calls, len(hooks[0])


@_checker('zero2_hook(bucket, shards, n, rank, reduce_scatter)', 'zero2_hook')
def check_zero2_hook(zero2_hook, rng):
    """Check `zero2_hook(bucket, shards, n, rank, reduce_scatter)`: ZeRO-2's hook for a bucket.

    The returned `hook(p)` is registered on every parameter of `bucket`. When
    the last gradient of the bucket is complete, it must copy the bucket's full
    gradients, flattened and padded with zeros to N rows, into one buffer, free
    them (`p.grad = None`), call `reduce_scatter(rows)` once (afterwards row
    `rank` holds the sum over the ranks), and set `shards[p].grad` to this rank's
    part of the mean. The reference is single-process training on the whole
    batch, and, for memory, the same ranks running the reference hook.
    """
    cases = [(2, (7, 9, 9, 9, 5)), (3, (7, 9, 9, 9, 5)), (4, (5, 6, 6, 6, 6, 3))]
    cases += [(rng.randint(2, 4), tuple(rng.randint(3, 9) for _ in range(5))) for _ in range(2)]
    for k, (n, widths) in enumerate(cases):
        case = f'{n} ranks, an MLP of widths {widths} (one bucket per Linear layer)'
        g = torch.Generator().manual_seed(rng.randrange(2**31))
        X = [torch.randn(2 * n, widths[0], generator=g) for _ in range(2)]
        y = [torch.randn(2 * n, widths[-1], generator=g) for _ in range(2)]
        first = [k == 0]

        def make_hook(*args):
            hook = _call(zero2_hook, args, case, first=first[0])
            first[0] = False
            return hook

        results, calls, num_buckets = _run(make_hook, widths, n, X, y)
        ref = _make_net(widths)
        for step in range(2):
            ref.zero_grad()
            nn.functional.mse_loss(ref(X[step]), y[step]).backward()
            for rank in range(n):
                for i, (name, p) in enumerate(ref.named_parameters()):
                    got = results[rank]['grads'][step][i]
                    _compare(
                        got, p.grad, n, rank, f'{case}, step {step + 1}, rank {rank}, the gradient shard of {name}'
                    )
            if step == 0:  # a gradient not freed also adds up into the next step's
                _check_peak(results, widths, n, X, y, case)
        if any(c != 2 * num_buckets for c in calls):
            raise _Fail(
                f'{case}: the ranks made {calls} reduce-scatters in 2 steps; expected '
                f'{2 * num_buckets}, one per bucket per step. Hint: gather the whole '
                'bucket into one buffer and reduce-scatter it once, when its last '
                'gradient arrives.'
            )
    return (
        f'all {len(cases)} cases match one process on the whole batch, with one '
        'reduce-scatter per bucket and the peak of ZeRO-2.'
    )


def _check_peak(results, widths, n, X, y, case):
    """Fail when a rank's peak in the first step exceeds ZeRO-2's (the reference hook's) by
    more than one bucket: room for another way to build the buffer, not for the gradients."""
    ref_results, _, _ = _run(_reference_hook, widths, n, X, y, steps=1)
    peak = max(r['peak'] for r in results)
    ref_peak = max(r['peak'] for r in ref_results)
    bucket_bytes = max(
        ((a + 1) * b + -a * b % n + -b % n) * 4 for a, b in zip(widths, widths[1:])
    )  # padded weight and bias
    if peak > ref_peak + bucket_bytes:
        raise _Fail(
            f'{case}: the gradients are right, but a rank holds up to {peak} bytes '
            f'during the step, {peak - ref_peak} more than ZeRO-2 needs (one bucket '
            f'is {bucket_bytes}). Hint: once a gradient is copied into the bucket '
            'buffer, free it (p.grad = None); otherwise every full gradient stays '
            'until the end of backward, as in DDP, and the peak is not lowered.'
        )


def _compare(got, grad, n, rank, case):
    """Raise _Fail with the classic mistake's hint when `got` is not rank's shard of `grad`."""
    want = _pad_rows(grad, n)[rank]
    if got is None:
        raise _Fail(
            f'{case}: shards[p].grad is not set after backward. Hint: after the '
            'reduce-scatter, set shards[p].grad to row `rank` of the buffer divided '
            'by N (the part of it that belongs to p).'
        )
    if not isinstance(got, torch.Tensor) or got.numel() != want.numel():
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise _Fail(
            f'{case}: expected a shard of {want.numel()} values, got {shape}. Hint: '
            'flatten each gradient, pad it with zeros to N rows and keep row `rank`.'
        )
    got = got.detach().flatten().float()
    close = lambda a, b: torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    if close(got, want):
        return
    if close(got, want * n):
        raise _Fail(
            f'{case}: your shard is the sum over the ranks, N = {n} times too large. '
            'Hint: divide the reduce-scattered row by N, so that the step equals '
            'single-process training on the whole batch.'
        )
    if close(got, want / n):
        raise _Fail(
            f'{case}: your shard is N = {n} times too small: divided twice. Hint: the '
            'reduce-scatter sums; divide that sum by N once.'
        )
    if torch.isnan(got).any():
        raise _Fail(
            f'{case}: rank {rank} took a row of the buffer that is not its own: after '
            'a reduce-scatter only row `rank` holds a total (the others hold partial '
            'sums, here NaN), so this rank would update another rank\'s shard. Hint: '
            'take row `rank`.'
        )
    raise _Fail(
        f'{case}: expected {want.tolist()!s:.200}, got {got.tolist()!s:.200}. Hint: '
        'row r of the bucket buffer holds row r of every parameter\'s padded gradient '
        '(viewed as N rows), side by side; reduce-scatter it, divide row `rank` by N.'
    )
