"""Timing: a wall-clock Timer that waits for the GPU, and an Accumulator."""

import time

import torch

from .devices import synchronize

__all__ = ['Timer', 'Accumulator']


class Timer:
    """Time a piece of code again and again, keeping every measurement in `times`.

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
                raise ValueError(
                    f"Timer: device must be None (wait for every GPU), a "
                    f"torch.device or a name such as 'cuda:0' or 'cpu', got "
                    f"{device!r}"
                ) from None
            device = parsed
        self.device = device
        self.times = []
        self.start()

    def start(self):
        """Begin a measurement (after queued GPU work has finished)."""
        synchronize(self.device)
        self.tik = time.perf_counter()

    def stop(self):
        """End the measurement, append it to `times` and return it, in seconds."""
        synchronize(self.device)
        self.times.append(time.perf_counter() - self.tik)
        return self.times[-1]

    def avg(self):
        """Return the mean of the measurements."""
        if not self.times:
            raise RuntimeError('Timer.avg(): no time recorded yet; call stop() first')
        return sum(self.times) / len(self.times)

    def sum(self):
        """Return the total of the measurements."""
        return sum(self.times)

    def cumsum(self):
        """Return the running totals: the time elapsed after each measurement."""
        total, out = 0.0, []
        for t in self.times:
            total += t
            out.append(total)
        return out


class Accumulator:
    """Keep `n` running sums side by side, e.g. correct predictions and examples seen."""

    def __init__(self, n):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f'Accumulator(n) needs a positive int n, the number of sums, got {n!r}')
        self.data = [0.0] * n

    def add(self, *args):
        """Add one value to each sum, in order."""
        if len(args) != len(self.data):
            raise ValueError(f'Accumulator holds {len(self.data)} sums, add() got {len(args)} values')
        values = []
        for k, b in enumerate(args):
            try:  # numbers, 0-d tensors and NumPy scalars all convert
                values.append(float(b))
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(
                    f'Accumulator.add: value {k} must be a number (or a tensor '
                    f'with one element), got {type(b).__name__} {b!r}; nothing '
                    'was added'
                ) from None
        self.data = [a + b for a, b in zip(self.data, values)]

    def reset(self):
        """Set every sum back to zero."""
        self.data = [0.0] * len(self.data)

    def __getitem__(self, idx):
        """Return sum number `idx`."""
        return self.data[idx]
