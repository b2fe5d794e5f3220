"""Run a test's function on every rank of a small gloo group of spawned processes."""
import datetime
import os
import queue as queue_module

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import d2lpar


def _rank_main(fn, rank, world_size, port, args, results):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)  # the ranks share this machine's few cores
    dist.init_process_group('gloo', rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    try:
        # plain Python values: a tensor in a queue is shared memory that dies with this process
        results.put((rank, fn(rank, world_size, *args)))
    finally:
        dist.destroy_process_group()


def run_ranks(fn, world_size, *args):
    """Return {rank: fn(rank, world_size, *args)} computed on `world_size` gloo processes.

    `fn` must be importable (defined at the top of a test module). A rank that
    dies fails the test at once instead of leaving the others waiting.
    """
    ctx = mp.get_context('spawn')
    results = ctx.Queue()
    port = d2lpar.free_port()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, port, args, results))
             for r in range(world_size)]
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
