"""The processes a launch starts: its arguments checked, then each process's command line.

d2lpar/machinery/launch.py starts them; `result.commands` shows what each ran.
"""

import os
import subprocess
import sys
from pathlib import Path

from ..checks import positive_int
from .processes import environment

LAUNCHERS = ('torchrun', 'python', 'torch.distributed.launch')

# Runs before torchrun, then becomes it: see its docstring.
_AGENT_WRAPPER = Path(__file__).with_name('programs') / 'start_agent.py'


# ---------------------------------------------------------------- checking the arguments


def _check_script(script):
    if not isinstance(script, (str, os.PathLike)):
        raise TypeError(f'script must be a path to a Python file, got {type(script).__name__}')
    path = Path(script).expanduser().resolve()
    if not path.is_file():
        raise ValueError(
            f'no script at {str(script)!r} (looked in {path.parent}); '
            f'paths are relative to the working directory {os.getcwd()}'
        )
    return path


def _check_args(args):
    if isinstance(args, (str, bytes)):
        raise TypeError(
            f'args must be a list of strings, not one string {args!r}: '
            f'write args=[{", ".join(repr(a) for a in str(args).split())}]'
        )
    try:
        args = list(args)
    except TypeError:
        raise TypeError(f'args must be a list of strings, got {type(args).__name__}') from None
    for a in args:
        if isinstance(a, bool) or not isinstance(a, (str, int, float, os.PathLike)):
            raise TypeError(f'each of args must be a string or number, got {a!r}')
    return [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]


def _check_seconds(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f'{name} must be a positive number of seconds, got {value!r}')
    if value == float('inf'):  # a launch that may never end leaves its processes running
        raise ValueError(
            f'{name} must be finite, got inf; for a long run pass a large number of seconds, such as 24 * 3600'
        )
    return float(value)


def _check_env(env):
    return environment(env)


def check_launch(script, nproc, nnodes, args, env, timeout, grace, launcher, port, max_restarts):
    """Return launch's arguments checked: (script, nproc, nnodes, args, env, timeout, grace)."""
    script = _check_script(script)
    nproc, nnodes = positive_int(nproc, 'nproc'), positive_int(nnodes, 'nnodes')
    args, env = _check_args(args), _check_env(env)
    timeout, grace = _check_seconds(timeout, 'timeout'), _check_seconds(grace, 'grace')
    if launcher not in LAUNCHERS:
        raise ValueError(f'launcher must be one of {LAUNCHERS}, got {launcher!r}')
    if launcher == 'python' and (nproc != 1 or nnodes != 1):
        raise ValueError(
            "launcher='python' starts one process: use nproc=1 and pass the "
            "number of workers to the script itself (e.g. args=['--nproc', '2'])"
        )
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        raise ValueError(f'port must be an int in 1..65535 or None (pick a free one), got {port!r}')
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(
            f'max_restarts must be an int >= 0 (how many times torchrun may restart '
            f'the group after a failure), got {max_restarts!r}'
        )
    if launcher == 'python' and max_restarts:
        raise ValueError(
            "max_restarts needs torchrun: launcher='python' runs one plain process "
            "that nothing restarts; use launcher='torchrun'"
        )
    if os.name != 'posix':
        raise OSError('d2lpar.launch needs Linux or macOS (on Windows use WSL, or run torchrun yourself in a terminal)')
    return script, nproc, nnodes, args, env, timeout, grace


# ---------------------------------------------------------------- the command lines


def _commands(script, nproc, nnodes, args, launcher, port, work, max_restarts=0):
    """Return [(stream name, argv)] for the processes a launch starts."""
    shim = os.path.join(work, 'shim', script.name)  # so torchrun's reports name the script
    if launcher == 'python':
        return [('main', [sys.executable, '-u', shim, str(script), *args])]
    module = 'torch.distributed.run' if launcher == 'torchrun' else launcher
    common = [
        sys.executable,
        '-m',
        module,
        f'--nproc-per-node={nproc}',
        f'--log-dir={os.path.join(work, "torchelastic")}',
    ]
    if max_restarts:
        common.append(f'--max-restarts={max_restarts}')
    tail = [shim, str(script), *args]
    if nnodes == 1:
        return [
            (
                launcher,
                common + ['--nnodes=1', '--node-rank=0', '--master-addr=127.0.0.1', f'--master-port={port}', *tail],
            )
        ]
    # The static form (--node-rank): with c10d, the first node would host the rendezvous
    # and the workers' store itself, listening on every interface.
    return [
        (
            f'node{i}',
            common
            + [f'--nnodes={nnodes}', f'--node-rank={i}', '--master-addr=127.0.0.1', f'--master-port={port}', *tail],
        )
        for i in range(nnodes)
    ]


def _wrapped(argv):
    """Return the argv a launch starts for `argv`: the agent wrapper, which becomes `argv`."""
    return [sys.executable, str(_AGENT_WRAPPER), str(os.getpid()), *argv]


def _popen(argv, env):
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def _changes(env, base):
    """Return {name: value} where `env` differs from `base`; None for a removed name."""
    changed = {k: v for k, v in env.items() if base.get(k) != v}
    changed.update({k: None for k in base if k not in env})
    return dict(sorted(changed.items()))
