"""Helpers the training scripts share: ranks, world size, backend, device, SLURM, results.

A process started by `torchrun` finds `RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
`LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` in its environment. A
process started by SLURM's `srun` finds `SLURM_PROCID`, `SLURM_LOCALID`,
`SLURM_NTASKS` and `SLURM_NODELIST` instead; `torch_env_from_slurm` maps those to
the torchrun names, so one script serves both launchers. `dist_env` reads the
result, and a process started by neither is rank 0 of a world of size 1.
"""

import contextlib
import datetime
import functools
import json
import logging
import os
import re
import sys
import threading
import time
import warnings
from dataclasses import dataclass

import torch

from .devices import num_gpus
from .saving import write_whole

__all__ = [
    'DistEnv',
    'dist_env',
    'expand_nodelist',
    'torch_env_from_slurm',
    'pick_backend',
    'rank_device',
    'default_timeout',
    'emit_result',
    'exit_now',
    'gloo_threads',
    'count_calls',
]

BACKENDS = ('gloo', 'nccl', 'mpi')
DEFAULT_MASTER_PORT = 29500
RESULT_PREFIX = 'D2LPAR_RESULT '


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in a distributed job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str  # 'torchrun' (RANK etc. set), 'slurm' (mapped from SLURM_*) or 'single'


def _int_var(environ, name, minimum=0):
    value = environ[name]
    try:
        number = int(value)
    except ValueError:
        raise ValueError(
            f'environment variable {name}={value!r} is not an integer; unset it or give it a whole number'
        ) from None
    if number < minimum:
        raise ValueError(f'environment variable {name}={value!r} must be >= {minimum}')
    return number


def _split_top_level(text, sep=','):
    """Split `text` at `sep` outside square brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == '[':
            depth += 1
            if depth > 1:
                raise ValueError(f'nested brackets in SLURM nodelist {text!r}')
        elif ch == ']':
            depth -= 1
            if depth < 0:
                raise ValueError(f'unbalanced "]" in SLURM nodelist {text!r}')
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f'unbalanced "[" in SLURM nodelist {text!r}')
    parts.append(text[start:])
    return parts


def _expand_range_list(body, nodelist):
    """Expand '03-05,07' to ['03', '04', '05', '07'], keeping zero padding."""
    items = []
    for part in body.split(','):
        match = re.fullmatch(r'(\d+)(?:-(\d+))?', part.strip())
        if not match:
            raise ValueError(
                f'bad range {part!r} in SLURM nodelist {nodelist!r}; expected numbers like 3, 03-05 or 1,4-6'
            )
        lo, hi = match.group(1), match.group(2) or match.group(1)
        if int(hi) < int(lo):
            raise ValueError(f'range {part!r} in SLURM nodelist {nodelist!r} runs backwards')
        items.extend(str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1))
    return items


def expand_nodelist(nodelist):
    """Expand a SLURM hostlist such as 'node[03-05,07],gpu1' into host names."""
    if not isinstance(nodelist, str) or not nodelist.strip():
        raise ValueError(f'SLURM nodelist must be a non-empty string, got {nodelist!r}')
    hosts = []
    for expr in _split_top_level(nodelist.strip()):
        if not expr:
            raise ValueError(f'empty host name in SLURM nodelist {nodelist!r}')
        expanded = ['']
        for literal, body in re.findall(r'([^\[]*)(?:\[([^\]]*)\])?', expr):
            options = _expand_range_list(body, nodelist) if body else ['']
            expanded = [head + literal + opt for head in expanded for opt in options]
        hosts.extend(expanded)
    return hosts


def _slurm_tasks_on_this_node(environ):
    """Return how many tasks SLURM runs on this node, or None if it does not say."""
    if 'SLURM_NTASKS_PER_NODE' in environ:
        return _int_var(environ, 'SLURM_NTASKS_PER_NODE', 1)
    spec = environ.get('SLURM_STEP_TASKS_PER_NODE') or environ.get('SLURM_TASKS_PER_NODE')
    if not spec:
        return None
    counts = []  # SLURM writes e.g. '2(x3),1': three nodes with 2 tasks, then one with 1
    for part in spec.split(','):
        match = re.fullmatch(r'(\d+)(?:\(x(\d+)\))?', part.strip())
        if not match:
            raise ValueError(f'cannot parse SLURM_TASKS_PER_NODE={spec!r}')
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    node = _int_var(environ, 'SLURM_NODEID') if 'SLURM_NODEID' in environ else 0
    return counts[node] if node < len(counts) else counts[0]


def torch_env_from_slurm(environ=None, port=DEFAULT_MASTER_PORT):
    """Return the torchrun variables (RANK, ..., MASTER_PORT) that SLURM's variables imply.

    Empty when the process was not started by `srun`, or when `RANK` is already
    set (torchrun started inside a SLURM job). MASTER_ADDR is the first host of
    SLURM_NODELIST unless already set; MASTER_PORT is `port` unless already set.
    Use it as `os.environ.update(d2lpar.distributed.torch_env_from_slurm())` before
    `init_process_group(init_method='env://')`.
    """
    environ = os.environ if environ is None else environ
    if 'RANK' in environ or 'SLURM_PROCID' not in environ:
        return {}
    missing = [name for name in ('SLURM_NTASKS', 'SLURM_LOCALID') if name not in environ]
    nodelist = environ.get('SLURM_NODELIST') or environ.get('SLURM_JOB_NODELIST')
    if nodelist is None and 'MASTER_ADDR' not in environ:
        missing.append('SLURM_NODELIST')
    if missing:
        raise ValueError(
            f'SLURM_PROCID is set but {", ".join(missing)} is not: start the job '
            f'with srun (not by running the script inside sbatch directly)'
        )
    rank = _int_var(environ, 'SLURM_PROCID')
    world_size = _int_var(environ, 'SLURM_NTASKS', 1)
    local_rank = _int_var(environ, 'SLURM_LOCALID')
    if rank >= world_size:
        raise ValueError(f'SLURM_PROCID={rank} is not below SLURM_NTASKS={world_size}')
    local_world_size = _slurm_tasks_on_this_node(environ) or world_size
    master_addr = environ.get('MASTER_ADDR') or expand_nodelist(nodelist)[0]
    return {
        'RANK': str(rank),
        'WORLD_SIZE': str(world_size),
        'LOCAL_RANK': str(local_rank),
        'LOCAL_WORLD_SIZE': str(local_world_size),
        'MASTER_ADDR': master_addr,
        'MASTER_PORT': str(environ.get('MASTER_PORT', port)),
    }


def dist_env(environ=None):
    """Return this process's DistEnv from torchrun's variables, SLURM's, or neither."""
    environ = dict(os.environ if environ is None else environ)
    source = 'torchrun'
    if 'RANK' not in environ:
        slurm = torch_env_from_slurm(environ)
        if slurm:
            environ.update(slurm)
            source = 'slurm'
        else:
            return DistEnv(
                0,
                0,
                1,
                1,
                environ.get('MASTER_ADDR', '127.0.0.1'),
                _int_var(environ, 'MASTER_PORT') if 'MASTER_PORT' in environ else DEFAULT_MASTER_PORT,
                'single',
            )
    if 'WORLD_SIZE' not in environ:
        raise ValueError(
            'RANK is set but WORLD_SIZE is not: launch with torchrun, '
            'or set both (and LOCAL_RANK, MASTER_ADDR, MASTER_PORT)'
        )
    rank = _int_var(environ, 'RANK')
    world_size = _int_var(environ, 'WORLD_SIZE', 1)
    if rank >= world_size:
        raise ValueError(f'RANK={rank} must be below WORLD_SIZE={world_size}')
    local_rank = _int_var(environ, 'LOCAL_RANK') if 'LOCAL_RANK' in environ else 0
    local_world_size = _int_var(environ, 'LOCAL_WORLD_SIZE', 1) if 'LOCAL_WORLD_SIZE' in environ else world_size
    port = _int_var(environ, 'MASTER_PORT', 1) if 'MASTER_PORT' in environ else DEFAULT_MASTER_PORT
    return DistEnv(
        rank, local_rank, world_size, local_world_size, environ.get('MASTER_ADDR', '127.0.0.1'), port, source
    )


def pick_backend(local_world_size=1, override=None):
    """Return 'nccl' when every local process can have its own GPU, else 'gloo'.

    `override` (a script's --backend, or the D2LPAR_BACKEND environment variable)
    forces a backend, after the same check: nccl with fewer GPUs than local
    processes is refused here, before any rank asks for a GPU it does not have.
    """
    choice = override or os.environ.get('D2LPAR_BACKEND') or None
    import torch.distributed as dist

    gpus = num_gpus()
    if choice is not None:
        if choice not in BACKENDS:
            raise ValueError(f'unknown backend {choice!r}; choose one of {BACKENDS}')
        if choice == 'nccl' and gpus < local_world_size:
            raise ValueError(
                f'backend nccl needs one GPU per process: {local_world_size} '
                f'local process(es) but {gpus} usable GPU(s) visible; '
                f'use gloo or fewer processes per node'
            )
        if choice == 'nccl' and not dist.is_nccl_available():
            raise ValueError(
                'backend nccl is not built into this torch (it exists on Linux CUDA builds only); use gloo'
            )
        return choice
    if sys.platform.startswith('linux') and dist.is_nccl_available() and gpus >= local_world_size > 0:
        return 'nccl'
    if 0 < gpus < local_world_size and 'SLURM_JOB_ID' in os.environ:
        # Not the 1-GPU laptop case: under SLURM, a job that binds one GPU to each task
        # (--gpus-per-task=1, --gpu-bind) shows each process only its own GPU.
        warnings.warn(
            f'pick_backend: {local_world_size} processes on this node, but this '
            f'process sees {gpus} GPU(s), so the ranks use gloo on the CPU. Under '
            'SLURM with one GPU bound per task every task sees only its own GPU: ask '
            'for the node\'s GPUs without a per-task binding (--gpus-per-node=N), or '
            'set D2LPAR_BACKEND=gloo to choose the CPU on purpose.',
            stacklevel=2,
        )
    return 'gloo'


def rank_device(backend, local_rank=0):
    """Return the device a rank computes on: its own GPU with nccl, else the CPU."""
    if backend not in BACKENDS:
        raise ValueError(f'rank_device: unknown backend {backend!r}; choose one of {BACKENDS}')
    if backend == 'nccl':
        device = torch.device('cuda', local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device('cpu')


def default_timeout(seconds=None):
    """Return the timeout for init_process_group (D2LPAR_DIST_TIMEOUT, else 60 s)."""
    if seconds is None:
        seconds = os.environ.get('D2LPAR_DIST_TIMEOUT', 60)
    try:
        seconds = float(seconds)
    except (TypeError, ValueError):
        raise ValueError(f'timeout must be a number of seconds, got {seconds!r}') from None
    if seconds <= 0:
        raise ValueError(f'timeout must be positive, got {seconds}')
    return datetime.timedelta(seconds=seconds)


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
