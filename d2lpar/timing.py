"""Timing: a wall-clock Timer that waits for the GPU, and an Accumulator."""
import time

import torch

from .devices import synchronize

__all__ = ['Timer', 'Accumulator']


class Timer:
    """Record multiple running times.

    CUDA kernels run asynchronously, so timing GPU work without waiting for it
    measures only the launch. The Timer waits for queued CUDA work at start and
    stop: on `device` if given, on every GPU if not; on the CPU it never waits.
    """

    def __init__(self, device=None):
        if device is not None:
            try:
                if isinstance(device, bool):  # torch.device(True) would be cuda:1
                    raise TypeError(device)
                parsed = torch.device(device)
                if parsed.index is not None and parsed.index < 0:
                    raise ValueError(device)
            except (RuntimeError, TypeError, ValueError, OverflowError):
                raise ValueError(f"Timer: device must be None (wait for every GPU), a "
                                 f"torch.device or a name such as 'cuda:0' or 'cpu', got "
                                 f"{device!r}") from None
            device = parsed
        self.device = device
        self.times = []
        self.start()

    def start(self):
        """Start the timer."""
        synchronize(self.device)
        self.tik = time.perf_counter()

    def stop(self):
        """Stop the timer and record the time in a list."""
        synchronize(self.device)
        self.times.append(time.perf_counter() - self.tik)
        return self.times[-1]

    def avg(self):
        """Return the average time."""
        if not self.times:
            raise RuntimeError('Timer.avg(): no time recorded yet; call stop() first')
        return sum(self.times) / len(self.times)

    def sum(self):
        """Return the sum of time."""
        return sum(self.times)

    def cumsum(self):
        """Return the accumulated time."""
        total, out = 0.0, []
        for t in self.times:
            total += t
            out.append(total)
        return out


class Accumulator:
    """For accumulating sums over `n` variables."""

    def __init__(self, n):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f'Accumulator(n) needs a positive int n, the number of sums, '
                             f'got {n!r}')
        self.data = [0.0] * n

    def add(self, *args):
        if len(args) != len(self.data):
            raise ValueError(f'Accumulator holds {len(self.data)} sums, '
                             f'add() got {len(args)} values')
        self.data = [a + float(b) for a, b in zip(self.data, args)]

    def reset(self):
        self.data = [0.0] * len(self.data)

    def __getitem__(self, idx):
        return self.data[idx]
