"""Run code in child processes that each start with their own CUDA_VISIBLE_DEVICES, and collect
what each saw: `run_with_mask(s)`, the measurement beside notebook 2's predictions
(d2lpar/visibility.py re-exports them). The child is d2lpar/machinery/programs/mask_child.py.
"""

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .processes import environment

__all__ = ['run_with_mask', 'run_with_masks']

_MASK_VAR = 'CUDA_VISIBLE_DEVICES'


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


# Runs in each child: see its docstring.
_CHILD = Path(__file__).with_name('programs') / 'mask_child.py'
_MARKER = '@@d2lpar-child-report@@ '


def _per_child(value, n, name, check):
    """Return `value` repeated n times, or the list of n values given."""
    if isinstance(value, list):
        if len(value) != n:
            raise ValueError(
                f'{name} lists {len(value)} values for {n} mask(s); give one per mask or a single value for all'
            )
        values = value
    else:
        values = [value] * n
    for v in values:
        check(v)
    return values


def _check_code(code):
    if code is not None and not isinstance(code, str):
        raise TypeError(f'code must be a string of Python source, got {type(code).__name__}')


def _check_env(env):
    if _MASK_VAR in environment(env):
        raise ValueError('pass the CUDA_VISIBLE_DEVICES value as the mask argument, not in env')


def _child_env(mask, env):
    child = dict(os.environ)
    child.pop(_MASK_VAR, None)
    if mask is not None:
        child[_MASK_VAR] = mask
    for k, v in environment(env).items():
        if v is None:
            child.pop(k, None)
        else:
            child[k] = v
    return child


def _kill(proc):
    """Kill `proc` and, on POSIX, whatever is left in its process group."""
    try:
        if os.name == 'posix':
            # The group outlives its leader while members remain, and its id
            # is not reused meanwhile, so this reaches only our processes.
            os.killpg(proc.pid, signal.SIGKILL)
        elif proc.poll() is None:
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass


def _tail(text, lines=30):
    text = text.rstrip()
    kept = text.splitlines()[-lines:]
    return '\n'.join(kept) if kept else '(nothing on stderr)'


def _run_one(spec, env, timeout, live, lock, cancelled):
    kwargs = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if os.name == 'posix':
        kwargs['start_new_session'] = True  # so that a kill reaches its own children too
    else:
        kwargs['creationflags'] = subprocess.CREATE_NEW_PROCESS_GROUP
    with lock:
        if cancelled.is_set():
            return None
        proc = subprocess.Popen([sys.executable, str(_CHILD), json.dumps(spec)], **kwargs)
        live.add(proc)
    tik = time.perf_counter()
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill(proc)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a grandchild that left the group holds the pipes
            proc.wait()
            out, err = '', ''
        timed_out = True
    finally:
        _kill(proc)  # also what the child may have started and left running
        with lock:
            live.discard(proc)
    return dict(out=out, err=err, returncode=proc.returncode, timed_out=timed_out, seconds=time.perf_counter() - tik)


def _label(mask):
    return 'unset' if mask is None else repr(mask)


def run_with_masks(masks, code=None, script=None, args=(), env=None, timeout=120.0, max_parallel=None):
    """Run one child process per mask and return what each saw, as a list of dicts.

    Each child starts with CUDA_VISIBLE_DEVICES set to its mask (None: unset),
    runs `code` (Python source) or `script` (a path, with `args`), then reports
    `device_count`, GPU `names` and `uuids` (as torch prints them),
    `cuda_available`, the `mask` and the CUDA and OpenMP variables (`env`) it
    ended with, its `pid`, the `report` dict the code may fill, its other
    `stdout` and `stderr`, and `seconds`. `code` and `env` may be lists, one
    per mask; `env` values are strings, or None to unset a variable. Up to `max_parallel`
    children (default: the CPU count) run at once, each for at most `timeout`
    seconds: a child that takes longer is killed with its process group and
    TimeoutError is raised; a child that fails raises RuntimeError with its
    stderr. No child outlives the call, even when it is interrupted.
    """
    if isinstance(masks, str) or not isinstance(masks, (list, tuple)):
        raise TypeError(
            f'masks must be a list of CUDA_VISIBLE_DEVICES values such as ["0", "1,0"] (None for unset), got {masks!r}'
        )
    n = len(masks)
    if n == 0:
        raise ValueError('masks is empty: give at least one mask (None for unset)')
    for mask in masks:
        if mask is not None and not isinstance(mask, str):
            raise TypeError(
                f'a mask is a string such as "0" or "0,2" (None for unset), got {type(mask).__name__} {mask!r}'
            )
    codes = _per_child(code, n, 'code', _check_code)
    envs = _per_child(env, n, 'env', _check_env)
    if script is not None:
        if any(c is not None for c in codes):
            raise ValueError('give code or script, not both')
        script = os.fspath(script)
        if not os.path.isfile(script):
            raise FileNotFoundError(f'script {script!r} does not exist (relative paths start from {os.getcwd()})')
    if isinstance(args, str) or not all(isinstance(a, str) for a in args):
        raise TypeError(f'args must be a list of strings, got {args!r}')
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f'timeout must be a positive number of seconds, got {timeout!r}')
    if max_parallel is None:
        max_parallel = os.cpu_count() or 1
    if not _is_int(max_parallel) or max_parallel < 1:
        raise ValueError(f'max_parallel must be a positive int, got {max_parallel!r}')

    specs = [dict(code=c or '', script=script, args=list(args), marker=_MARKER) for c in codes]
    child_envs = [_child_env(m, e) for m, e in zip(masks, envs)]
    live, lock, cancelled = set(), threading.Lock(), threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(n, max_parallel))
    try:
        futures = [pool.submit(_run_one, s, e, timeout, live, lock, cancelled) for s, e in zip(specs, child_envs)]
        runs = [f.result() for f in futures]
    except BaseException:
        with lock:  # no new child starts after this; kill those running
            cancelled.set()
            for proc in list(live):
                _kill(proc)
        raise
    finally:
        pool.shutdown(wait=True)

    seen = []
    for k, (mask, run) in enumerate(zip(masks, runs)):
        where = f'child {k} (CUDA_VISIBLE_DEVICES {_label(mask)})'
        if run['timed_out']:
            raise TimeoutError(
                f'{where} did not finish within {timeout} s and was killed; its stderr:\n{_tail(run["err"])}'
            )
        if run['returncode'] != 0:
            raise RuntimeError(f'{where} failed with exit code {run["returncode"]}; its stderr:\n{_tail(run["err"])}')
        head, found, tail = run['out'].rpartition('\n' + _MARKER)
        if not found:
            raise RuntimeError(
                f'{where} exited without its report (did the code call sys.exit?); its stderr:\n{_tail(run["err"])}'
            )
        result = json.loads(tail.splitlines()[0])
        result.update(stdout=head, stderr=run['err'], seconds=run['seconds'])
        seen.append(result)
    return seen


def run_with_mask(mask, code=None, script=None, args=(), env=None, timeout=120.0):
    """Run `code` or `script` in a child process under a mask; return what it saw.

    See `run_with_masks` for the keys of the returned dict and the errors.
    """
    if isinstance(code, list) or isinstance(env, list):
        raise TypeError('run_with_mask runs one child: give code and env as single values')
    return run_with_masks([mask], code=code, script=script, args=args, env=env, timeout=timeout)[0]
