"""Memory over a training step: the bytes of every tensor storage a process holds (notebooks 10, 11).

`StepMemory` is a `TorchDispatchMode`: every tensor operation inside its block
passes through it, so it sees every storage an operation creates, on any device
(CPU included, where torch keeps no allocator statistics), whoever made it: the
model, autograd, the optimizer, a ZeRO stage, FSDP2 or a communication buffer.
It also counts the storages it is given at the start (parameters, gradients,
optimizer state made before the step). After each operation it records the sum
of the *current* sizes of the storages still alive, so a storage freed
(garbage-collected) or resized to zero (as ZeRO-3 and FSDP2 free gathered
parameters) stops counting at once. The record is memory over the step; its
maximum is the peak, the number that decides whether a step fits.

What it does not see: memory that C++ code allocates without creating a tensor
(the gloo transport's own buffers, the allocator's caching and fragmentation).

A collective's buffers may outlive their use by a moment: gloo's worker thread
drops its reference to a finished collective only after `wait()` has returned
(`ProcessGroupGloo::runLoop` in torch/csrc/distributed/c10d/ProcessGroupGloo.cpp),
so a buffer the step no longer holds may still count. `settled_bytes` waits
for such releases before it reads.
"""

import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ['StepMemory', 'tensors_of']


def tensors_of(*objects):
    """Return the tensors held by modules, optimizers, tensors and (nested) lists or dicts."""
    found, todo = [], list(objects)
    while todo:
        obj = todo.pop()
        if isinstance(obj, torch.Tensor):
            found.append(obj)
            if obj.grad is not None:
                found.append(obj.grad)
        elif isinstance(obj, torch.nn.Module):
            todo.extend(obj.parameters())
            todo.extend(obj.buffers())
        elif isinstance(obj, torch.optim.Optimizer):
            todo.extend(obj.state.values())
            todo.extend(p for group in obj.param_groups for p in group['params'])
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            todo.extend(obj)
    return found


def _local(t):
    return t.to_local() if hasattr(t, 'to_local') else t  # a DTensor holds a local shard


class StepMemory(TorchDispatchMode):
    """Record the bytes of live tensor storages after every operation in the block.

    with d2lpar.memory.StepMemory(net, opt) as mem:
        ...one training step...
    mem.peak, mem.timeline  # bytes; [(operation index, bytes)]
    """

    def __init__(self, *held):
        super().__init__()
        self.storages = {}  # id -> weak reference to a live storage
        self.timeline, self.marks, self.ops = [], [], []
        for t in tensors_of(*held):
            self.add(t)

    def add(self, t):
        t = _local(t)
        storage = t.untyped_storage()
        key = id(storage)
        if key not in self.storages and t.device.type != 'meta':
            self.storages[key] = weakref.ref(storage, lambda _, key=key: self.storages.pop(key, None))

    def bytes(self):
        """Return the bytes of the storages alive now (at their current size)."""
        return sum(s.nbytes() for s in (ref() for ref in list(self.storages.values())) if s is not None)

    def settled_bytes(self, quiet=0.1, timeout=10.0):
        """Return `bytes()` once no storage has been freed for `quiet` seconds (at most `timeout`).

        Call it where no operation of this process runs: the wait lets other threads (a
        collective's worker) release what they still hold of the finished collectives.
        """
        start = last_change = time.monotonic()
        held = self.bytes()
        while time.monotonic() - last_change < quiet and time.monotonic() - start < timeout:
            time.sleep(quiet / 10)  # releases the GIL, which a releasing thread needs
            now = self.bytes()
            if now != held:
                held, last_change = now, time.monotonic()
        return held

    def sample(self, what=''):
        self.timeline.append((len(self.timeline), self.bytes()))
        self.ops.append(what)

    def mark(self, label):
        """Label this moment of the step (for a plot): 'forward', 'backward', 'step'."""
        self.sample(label)
        self.marks.append((len(self.timeline) - 1, label))

    def __enter__(self):
        result = super().__enter__()
        self.sample()
        return result

    def __exit__(self, *exc):
        self.sample()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.add(t)
        self.sample(str(func))
        return out

    @property
    def peak(self):
        """The most bytes held at any moment of the block."""
        return max(b for _, b in self.timeline)
