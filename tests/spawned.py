"""The one multi-process test harness: a test's function on every rank of a small gloo group.

    run_ranks(fn, n, *args)  {rank: fn(rank, n, *args)}, for tests that compare values
    spawn(fn, n, *args)      fn(rank, n, *args) on every rank, for tests that assert inside

`fn` must be importable (defined at the top of a test module). A rank that dies fails the
test at once instead of leaving the others waiting.
"""

import datetime
import faulthandler
import gc
import os
import queue as queue_module

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import d2lpar


def _in_group(fn, rank, world_size, port, args):
    """Join the gloo group as `rank`, return fn(rank, world_size, *args), then leave it."""
    faulthandler.enable()  # a crash in C++ (SIGABRT, SIGSEGV) still shows the Python stack
    os.environ['OMP_NUM_THREADS'] = '1'
    torch.set_num_threads(1)  # the ranks share this machine's few cores
    dist.init_process_group(
        'gloo',
        init_method=f'tcp://127.0.0.1:{port}',
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        return fn(rank, world_size, *args)
    finally:
        # Free DDP wrappers (kept alive by reference cycles) while their process group
        # still exists: left to interpreter shutdown, gloo can abort the process.
        gc.collect()
        dist.destroy_process_group()


def _rank_main(fn, rank, world_size, port, args, results):
    # plain Python values: a tensor in a queue is shared memory that dies with this process
    results.put((rank, _in_group(fn, rank, world_size, port, args)))


def _spawned(rank, fn, world_size, port, args):
    _in_group(fn, rank, world_size, port, args)


def spawn(fn, world_size, *args):
    """Run fn(rank, world_size, *args) in `world_size` fresh processes joined by gloo."""
    # An exception in one rank ends the others and is re-raised here by mp.spawn.
    mp.spawn(_spawned, args=(fn, world_size, d2lpar.free_port(), args), nprocs=world_size)


def run_ranks(fn, world_size, *args):
    """Return {rank: fn(rank, world_size, *args)} computed on `world_size` gloo processes."""
    ctx = mp.get_context('spawn')
    results = ctx.Queue()
    port = d2lpar.free_port()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, port, args, results)) for r in range(world_size)]
    for p in procs:
        p.start()
    found = {}
    try:
        while len(found) < world_size:
            try:
                rank, value = results.get(timeout=1)
                found[rank] = value
            except queue_module.Empty:
                assert all(p.exitcode in (None, 0) for p in procs), 'a rank failed; see its traceback'
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return found
