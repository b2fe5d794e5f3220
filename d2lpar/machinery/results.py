"""What a launched rank hands back and how it leaves; what it sent.

`emit_result` hands a JSON object to `d2lpar.launch` (or prints it when run by hand),
`exit_now` leaves without the interpreter's teardown, `count_calls` counts the
point-to-point and collective calls of a block, `gloo_threads` names gloo's threads.
d2lpar.distributed re-exports them beside d2lpar/machinery/ranks.py's helpers.
"""

import contextlib
import functools
import json
import logging
import os
import sys
import threading
import time

import torch

from .saving import write_whole

__all__ = ['emit_result', 'exit_now', 'gloo_threads', 'count_calls']

RESULT_PREFIX = 'D2LPAR_RESULT '


def _to_json(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    raise TypeError(f'emit_result cannot store a {type(value).__name__}; use numbers, strings, lists, dicts or tensors')


def _brief(value):
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().tolist()
    if isinstance(value, (list, tuple, dict)) and len(value) > 6:
        return f'<{type(value).__name__} of {len(value)}>'
    return repr(value)


def emit_result(obj=None, **fields):
    """Hand a JSON object (with this process's rank) to the launcher, or print it.

    Under `d2lpar.launch` the object is written atomically to the launcher's
    result directory and appears in `LaunchResult.results`; otherwise it is
    summarised in one line starting with 'D2LPAR_RESULT '.
    """
    record = dict(obj or {}, **fields)
    if 'rank' not in record:
        record['rank'] = int(os.environ['RANK']) if 'RANK' in os.environ else 0
    text = json.dumps(record, default=_to_json)
    directory = os.environ.get('D2LPAR_RESULT_DIR')
    if not directory:  # run by hand: say what would have been handed back, briefly
        print(RESULT_PREFIX + ', '.join(f'{k}={_brief(v)}' for k, v in record.items()), flush=True)
        return record
    name = f'{record["rank"]}-{time.time_ns()}-{os.getpid()}.json'
    write_whole(os.path.join(directory, name), text)  # the launcher reads every *.json it finds
    return record


def exit_now(code=0):
    """End this process at once, skipping the interpreter's teardown; call it last.

    With torch 2.13 to 2.15 a DDP model keeps its gloo process group alive after
    `destroy_process_group()`: its worker threads may still be releasing the
    tensors of a collective while Python shuts down, and the process then
    aborts with "terminate called without an active exception" (SIGABRT, as in
    pytorch/pytorch#190489), which torchrun and mp.spawn report as a failed
    rank. Once the script's results are written, leaving without that teardown
    is safe. What C code printed (NCCL_DEBUG=INFO) is flushed too: into a file or
    a pipe, C stdio is fully buffered unless Python runs with -u, and os._exit
    would drop it. os._exit also skips everything else Python does at exit:
    atexit handlers do not run and logging handlers are not flushed or closed, so
    close your loggers (logging.shutdown()) and finish your own clean-up first.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()  # flush and close the logging handlers, which os._exit would not
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C library to ask (an unusual platform)
        pass
    os._exit(code)


def gloo_threads():
    """Return the names of this process's gloo threads (None where there is no /proc)."""
    try:
        tasks = os.listdir('/proc/self/task')
    except OSError:
        return None
    names = []
    for task in tasks:
        try:
            with open(f'/proc/self/task/{task}/comm') as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return sorted(name for name in names if 'gloo' in name)


@contextlib.contextmanager
def count_calls(names=('send', 'recv', 'isend', 'irecv', 'all_reduce')):
    """Count the calls of `torch.distributed.<name>` and the bytes of their tensors while in the block.

    Yields {name: {'calls': k, 'bytes': b}}, where b sums the size of each call's
    first argument (the tensor sent, received or reduced). The functions are
    wrapped in the torch.distributed module for the duration of the block, so
    every call written `dist.<name>(...)` is counted (the hand-written
    collectives, MiniDDP), and so is each isend and irecv of a
    `dist.batch_isend_irecv`; calls that C++ code makes directly, such as DDP's,
    are not.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    counts = {name: {'calls': 0, 'bytes': 0} for name in names}
    originals = {name: getattr(dist, name) for name in names}
    # P2POp accepts only an op that `is` distributed_c10d's isend or irecv, and
    # batch_isend_irecv tells them apart the same way: wrap them there too.
    inner = {
        name: getattr(distributed_c10d, name)
        for name in names
        if getattr(distributed_c10d, name, None) is originals[name]
    }

    inside = threading.local()  # torch's send calls its isend (2.15): count the outer call only

    def counting(name):
        @functools.wraps(originals[name])  # its name too: P2POp's repr tells sends by it
        def call(tensor, *args, **kwargs):
            if getattr(inside, 'call', False):
                return originals[name](tensor, *args, **kwargs)
            counts[name]['calls'] += 1
            counts[name]['bytes'] += tensor.numel() * tensor.element_size()
            inside.call = True
            try:
                return originals[name](tensor, *args, **kwargs)
            finally:
                inside.call = False

        return call

    for name in names:
        setattr(dist, name, counting(name))
        if name in inner:
            setattr(distributed_c10d, name, getattr(dist, name))
    try:
        yield counts
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
        for name, fn in inner.items():
            setattr(distributed_c10d, name, fn)
