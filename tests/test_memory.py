"""StepMemory: the bytes of live tensor storages over a block, checked by hand counts."""

import threading
import time

import torch
from torch import nn

from d2lpar.memory import StepMemory, tensors_of


def test_counts_what_is_made_and_forgets_what_is_freed():
    held = torch.zeros(10)  # 40 bytes given at the start
    with StepMemory(held) as mem:
        big = torch.ones(1000)  # 4000 bytes
        del big
        small = torch.ones(5)  # 20 bytes
    assert mem.timeline[0][1] == 40
    assert mem.peak == 40 + 4000
    assert mem.timeline[-1][1] == 40 + 20
    del small


def test_a_view_adds_nothing_and_a_storage_resized_to_zero_stops_counting():
    flat = torch.zeros(100)
    with StepMemory(flat) as mem:
        view = flat[10:20] * 1  # a new 40-byte tensor
        flat[:50].add_(1)  # in place on a view: nothing new
        flat.untyped_storage().resize_(0)
        one = torch.ones(1)  # an operation, so that a sample is taken
    assert mem.peak == 400 + 40
    assert mem.timeline[-1][1] == 40 + 4
    del view, one


def test_settled_bytes_waits_for_a_buffer_another_thread_still_holds():
    # as gloo's worker holds a finished collective's buffers a moment after wait() returns
    counted = threading.Event()

    def release_later():
        counted.wait()
        time.sleep(0.05)
        holder.clear()

    with StepMemory() as mem:
        holder = [torch.empty(1000)]  # 4000 bytes, made inside the block
        release = threading.Thread(target=release_later)
        release.start()
        before = mem.bytes()
        counted.set()
        settled = mem.settled_bytes(quiet=1.0)  # far longer than the thread's delay
    release.join()
    assert before == 4000 and settled == 0, (before, settled)


def test_the_peak_of_a_training_step_is_above_its_end():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    X = torch.randn(64, 32)
    with StepMemory(net, opt) as mem:
        net(X).sum().backward()
        opt.step()
    params = sum(p.numel() for p in net.parameters()) * 4
    assert mem.timeline[0][1] == params
    assert mem.timeline[-1][1] == 2 * params  # parameters and gradients
    # forward kept activations for backward: 64 x 32 floats per saved tensor
    assert mem.peak >= 2 * params + 64 * 32 * 4


def test_tensors_of_finds_parameters_gradients_and_optimizer_state():
    net = nn.Linear(3, 2)
    opt = torch.optim.AdamW(net.parameters())
    net(torch.ones(1, 3)).sum().backward()
    opt.step()
    found = {id(t) for t in tensors_of(net, opt)}
    state = [v for s in opt.state.values() for v in s.values()]
    assert {id(p) for p in net.parameters()} <= found
    assert {id(p.grad) for p in net.parameters()} <= found
    assert {id(v) for v in state} <= found
