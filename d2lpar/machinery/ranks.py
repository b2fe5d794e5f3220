"""Where a launched rank stands: rank, world size, backend, device, timeout, from torchrun or SLURM.

A process started by `torchrun` finds `RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
`LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` in its environment. A
process started by SLURM's `srun` finds `SLURM_PROCID`, `SLURM_LOCALID`,
`SLURM_NTASKS` and `SLURM_NODELIST` instead; `torch_env_from_slurm` maps those to
the torchrun names, so one script serves both launchers. `dist_env` reads the
result, and a process started by neither is rank 0 of a world of size 1.
"""

import datetime
import os
import re
import sys
import warnings
from dataclasses import dataclass

import torch

from ..devices import num_gpus

__all__ = [
    'DistEnv',
    'dist_env',
    'expand_nodelist',
    'torch_env_from_slurm',
    'pick_backend',
    'rank_device',
    'default_timeout',
]

BACKENDS = ('gloo', 'nccl', 'mpi')
DEFAULT_MASTER_PORT = 29500


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
