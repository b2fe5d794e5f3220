"""Checker of notebook 7: gradient accumulation over micro-batches of different sizes."""

import contextlib

import torch
from torch import nn

from ._verdict import _call, _checker, _Fail


class _StandInDDP(nn.Module):
    """A stand-in for DDP in one process: it records which forwards would synchronise.

    DDP decides during the forward whether the coming backward allreduces: it
    does unless the forward runs inside `no_sync()`. In a world of one process
    the allreduce would change nothing, so only that decision is recorded.
    """

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.sync = True
        self.synced = []  # one entry per forward: would its backward allreduce?

    @contextlib.contextmanager
    def no_sync(self):
        previous, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = previous

    def forward(self, X):
        self.synced.append(self.sync)
        return self.module(X)


class _CountingSGD(torch.optim.SGD):
    """SGD that counts its steps."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.steps = 0

    def step(self, closure=None):
        self.steps += 1
        return super().step(closure)


def _net(g, dims):
    net = nn.Sequential(nn.Linear(dims[0], dims[1]), nn.Tanh(), nn.Linear(dims[1], dims[2]))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return net.double()


def _step(net, batches, lr, scale, stale=None):
    """Return the parameters after one SGD step with micro-batch losses scaled by scale(i, y)."""
    for p, s in zip(net.parameters(), stale or [None] * len(list(net.parameters()))):
        p.grad = None if s is None else s.clone()
    for i, (X, y) in enumerate(batches):
        (nn.functional.cross_entropy(net(X), y) * scale(i, y)).backward()
    with torch.no_grad():
        for p in net.parameters():
            p -= lr * p.grad
    return [p.detach().clone() for p in net.parameters()]


@_checker('accumulate_uneven(net, optimizer, micro_batches, loss_fn)', 'accumulate_uneven')
def check_accumulation(accumulate_uneven, rng):
    """Check one optimizer step over micro-batches of any sizes, synchronised once.

    The answer runs on a stand-in for DDP (one process) and a counting SGD,
    with stale gradients left in `.grad`. It must call `optimizer.step()` once,
    run every forward but the last inside `net.no_sync()`, and leave the
    parameters where one SGD step on the concatenated micro-batches (mean
    cross-entropy over all samples) puts them.
    """
    sizes = [[4, 4, 4], [3, 4, 5], [1, 6, 2, 3], [5], [2, 2], [7, 1]]
    sizes += [[rng.randint(1, 8) for _ in range(rng.randint(2, 5))] for _ in range(3)]
    for k, size in enumerate(sizes):
        g = torch.Generator().manual_seed(rng.randrange(2**31))
        dims = (rng.randint(2, 5), rng.randint(3, 6), rng.randint(2, 4))
        start = _net(g, dims)
        batches = [
            (torch.randn(n, dims[0], generator=g, dtype=torch.float64), torch.randint(0, dims[2], (n,), generator=g))
            for n in size
        ]
        stale = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in start.parameters()]
        lr = 0.1 * rng.randint(1, 5)
        net = _StandInDDP(_net(torch.Generator().manual_seed(0), dims))
        net.module.load_state_dict(start.state_dict())
        for p, s in zip(net.parameters(), stale):
            p.grad = s.clone()  # left over from the last step
        optimizer = _CountingSGD(net.parameters(), lr)
        case = f'micro-batches of sizes {size}'
        copies = [(X.clone(), y.clone()) for X, y in batches]
        _call(accumulate_uneven, (net, optimizer, copies, nn.functional.cross_entropy), case, first=k == 0)
        if optimizer.steps != 1:
            raise _Fail(
                f'{case}: optimizer.step() was called {optimizer.steps} times. Hint: '
                + (
                    'stepping after every micro-batch takes k small steps, not one '
                    'step on the whole batch; step once, after the last micro-batch.'
                    if optimizer.steps > 1
                    else 'call it once, after the last micro-batch.'
                )
            )
        if len(net.synced) != len(size):
            raise _Fail(
                f'{case}: the model ran {len(net.synced)} forwards for {len(size)} '
                'micro-batches. Hint: one forward and one backward per micro-batch.'
            )
        if sum(net.synced) > 1:
            raise _Fail(
                f'{case}: {sum(net.synced)} of {len(size)} forwards ran outside '
                'net.no_sync(), so DDP would allreduce after each of them. Hint: run '
                'the forward and backward of every micro-batch but the last inside '
                '`with net.no_sync():`.'
            )
        if not any(net.synced):
            raise _Fail(
                f'{case}: every forward ran inside net.no_sync(), so DDP would never '
                'allreduce and each rank would step with its own gradients. Hint: run '
                'the last micro-batch outside the context.'
            )
        if not net.synced[-1]:
            raise _Fail(
                f'{case}: micro-batch {net.synced.index(True)} synchronised, not the '
                'last one: the gradients accumulated after it would never be '
                'allreduced. Hint: no_sync for all but the last micro-batch.'
            )
        got = [p.detach() for p in net.parameters()]
        total = sum(size)

        def ref(scale, stale_grads=None):
            return _step(_copy(start), batches, lr, scale, stale_grads)

        want = ref(lambda i, y: len(y) / total)
        if all(torch.allclose(a, b, rtol=1e-7, atol=1e-9) for a, b in zip(got, want)):
            continue
        wrong = {
            'by_k': (
                'each loss divided by k: that is the mean over all samples only when the '
                'micro-batches have equal sizes. Hint: weight micro-batch i by its share '
                'of the samples, len(y_i) / total.',
                lambda i, y: 1 / len(size),
            ),
            'none': (
                'the losses were not divided at all: the gradient is a sum over the '
                'micro-batches, not the mean over the batch. Hint: scale each loss by '
                'len(y_i) / total.',
                lambda i, y: 1.0,
            ),
        }
        for why, scale in wrong.values():
            if all(torch.allclose(a, b, rtol=1e-7, atol=1e-9) for a, b in zip(got, ref(scale))):
                raise _Fail(f'{case}: {why}')
        if all(
            torch.allclose(a, b, rtol=1e-7, atol=1e-9) for a, b in zip(got, ref(lambda i, y: len(y) / total, stale))
        ):
            raise _Fail(
                f'{case}: the step included gradients left over from before. Hint: start with optimizer.zero_grad().'
            )
        gap = max((a - b).abs().max().item() for a, b in zip(got, want))
        raise _Fail(
            f'{case}: the parameters after your step differ from one SGD step on the '
            f'concatenated batch by up to {gap:.2e}. Hint: zero the gradients, scale '
            'each micro-batch loss by len(y_i) / total, backward, and step once.'
        )
    return (
        f'{len(sizes)} sets of micro-batches (equal and unequal sizes): one step equal to '
        'the step on the concatenated batch, one optimizer step, and only the last '
        'micro-batch synchronised.'
    )


def _copy(net):
    """Return a fresh copy of `net` (float64, gradients cleared)."""
    clone = _net(torch.Generator().manual_seed(0), (net[0].in_features, net[0].out_features, net[2].out_features))
    clone.load_state_dict(net.state_dict())
    return clone
