"""Which GPUs a process sees: choosing one by index, CUDA_VISIBLE_DEVICES rules, masked children.

`visible_gpus` predicts, in pure Python, what a mask shows on a machine with a
given number of GPUs, following the rules torch mirrors from the CUDA driver.
`run_with_mask(s)` measures it: each child process starts with the mask and
reports what it saw.
"""

import concurrent.futures
import difflib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from .devices import gpu_problem, num_gpus
from .processes import environment

__all__ = [
    'choose_gpu',
    'parse_visible_devices',
    'visible_gpus',
    'misspelled_cuda_vars',
    'run_with_mask',
    'run_with_masks',
    'exclusive_gpus',
]

_MASK_VAR = 'CUDA_VISIBLE_DEVICES'
_KNOWN_VARS = ('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER')
# Real variables of other tools whose names look like CUDA_VISIBLE_DEVICES.
_OTHER_VARS = ('NVIDIA_VISIBLE_DEVICES', 'HIP_VISIBLE_DEVICES', 'ROCR_VISIBLE_DEVICES')


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def choose_gpu(i=0):
    """Return the device cuda:i, or raise ValueError if this process cannot see GPU i.

    Unlike `try_gpu`, which falls back to the CPU, this refuses an index that
    does not exist and says which ones do. Indices count the GPUs this process
    sees, i.e. within CUDA_VISIBLE_DEVICES when it is set.
    """
    if not _is_int(i):
        raise TypeError(f'choose_gpu(i) needs an int GPU index such as 0 or 1, got {type(i).__name__} {i!r}')
    n = num_gpus()
    if 0 <= i < n:
        return torch.device('cuda', i)
    seen = 'no GPU' if n == 0 else f'{n} GPU(s): indices 0 to {n - 1}'
    problem = gpu_problem() if n == 0 else None
    if problem:
        seen += f' it can use ({problem.rstrip(".")})'
    mask = os.environ.get(_MASK_VAR)
    if mask is not None:
        seen += (
            f' (CUDA_VISIBLE_DEVICES={mask!r} is set: indices count the GPUs it lets through, not the physical ones)'
        )
    fallback = f', or use d2lpar.try_gpu({i}) to fall back to the CPU' if i >= 0 else ''
    raise ValueError(f'GPU index {i} does not exist: this process sees {seen}. Choose an index in range{fallback}.')


def _strtoul(s):
    """Return the integer `s` starts with, like C's strtoul, or -1 if none."""
    digits = s[1:] if s[:1] in ('+', '-') else s
    n = 0
    while n < len(digits) and digits[n] in '0123456789':
        n += 1
    if n == 0:
        return -1
    value = int(digits[:n])
    return -value if s[:1] == '-' else value


def parse_visible_devices(mask):
    """Return the entries a CUDA_VISIBLE_DEVICES value selects, in order.

    Returns None for an unset variable (every GPU visible), a list of ordinals
    for a numeric mask, or a list of UUID prefixes for a `GPU-...` or `MIG-...`
    mask. The rules are torch's: parsing stops at the first invalid entry
    ('0,2,-1,1' gives [0, 2]); a repeated entry, '', '-1' or 'abc' give [].
    Each numeric entry is read like C's strtoul, so ' 1' is 1 and '1gpu' is 1.
    """
    if mask is None:
        return None
    if not isinstance(mask, str):
        raise TypeError(
            f'parse_visible_devices: mask (a CUDA_VISIBLE_DEVICES value) is a '
            f'string such as "0" or "0,2", '
            f'got {type(mask).__name__} {mask!r}'
        )
    for prefix in ('GPU-', 'MIG-'):
        if mask.startswith(prefix):
            uuids = []
            for entry in mask.split(','):
                if entry in uuids:
                    return []
                if not entry.startswith(prefix):
                    break
                uuids.append(entry)
            return uuids
    ordinals = []
    for entry in mask.split(','):
        x = _strtoul(entry.strip())
        if x in ordinals:
            return []
        if x < 0:
            break
        ordinals.append(x)
    return ordinals


def visible_gpus(mask, num_gpus, uuids=None):
    """Return the physical GPUs a mask shows, in logical order (cuda:0 first).

    `num_gpus` is the number of GPUs the machine has. Ordinals past the last
    GPU stop the list, as an invalid entry does: '0,5' shows [0, 5] with 8
    GPUs but only [0] with 4. `len(...)` is what torch.cuda.device_count()
    reports in a process started with that mask. A UUID mask ('GPU-8f...',
    'MIG-...') needs `uuids`, the machine's UUIDs in device order as
    `nvidia-smi -L` prints them (MIG UUIDs for a MIG mask); each entry may be
    any prefix that matches one UUID only.
    """
    if not _is_int(num_gpus) or num_gpus < 0:
        raise ValueError(f'num_gpus must be an int >= 0 (how many GPUs the machine has), got {num_gpus!r}')
    if uuids is not None:
        if isinstance(uuids, str) or not all(isinstance(u, str) for u in uuids):
            raise TypeError(f'uuids must be a list of UUID strings, got {uuids!r}')
        if len(uuids) != num_gpus:
            raise ValueError(
                f'uuids lists {len(uuids)} UUID(s) for a machine with '
                f'{num_gpus} GPU(s); give one per GPU, in device order'
            )
    entries = parse_visible_devices(mask)
    if entries is None:
        return list(range(num_gpus))
    if entries and isinstance(entries[0], str):
        if uuids is None:
            raise ValueError(
                f'mask {mask!r} names devices by UUID: pass uuids=[...], the '
                f'UUIDs of the machine in device order (nvidia-smi -L prints them)'
            )
        shown = []
        for prefix in entries:
            matches = [k for k, u in enumerate(uuids) if u.startswith(prefix)]
            if len(matches) != 1:  # unknown or ambiguous: parsing stops here
                break
            if matches[0] in shown:
                return []
            shown.append(matches[0])
        return shown
    shown = []
    for ordinal in entries:
        if ordinal >= num_gpus:
            break
        shown.append(ordinal)
    return shown


def misspelled_cuda_vars(environ=None):
    """Return names in `environ` (default os.environ) that look like CUDA variables but are not.

    CUDA ignores `CUDA_VISIBLE_DEVICE` (no S) or `cuda_visible_devices`
    without a word; this finds such near misses.
    """
    environ = os.environ if environ is None else environ
    suspects = []
    for name in environ:
        if name in _KNOWN_VARS or name in _OTHER_VARS:
            continue
        upper = name.upper().strip()
        match = difflib.get_close_matches(upper, _KNOWN_VARS, n=1, cutoff=0.85)
        if not match:
            continue
        # XPU_VISIBLE_DEVICES, MLU_VISIBLE_DEVICES, ...: other accelerators' variables end
        # the same way; only a prefix close to CUDA (CUDE_, CDUA_) is a typo.
        prefix, _, rest = upper.partition('_')
        if rest == match[0].partition('_')[2] and difflib.SequenceMatcher(None, prefix, 'CUDA').ratio() < 0.75:
            continue
        suspects.append(name)
    return sorted(suspects)


def exclusive_gpus(smi='nvidia-smi'):
    """Return the UUIDs of the GPUs that serve one process at a time, as torch prints them.

    Such a GPU is in the EXCLUSIVE_PROCESS compute mode (`nvidia-smi -q -d COMPUTE`
    shows it): while one process uses it, CUDA refuses it to every other. The list
    is empty where `smi` is missing or lists no such GPU.
    """
    exe = shutil.which(smi)
    if exe is None:
        return []
    try:
        query = [exe, '--query-gpu=uuid,compute_mode', '--format=csv,noheader']
        out = subprocess.run(query, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = []
    for line in out.splitlines():
        uuid, _, mode = line.partition(',')
        if mode.strip().lower().startswith('exclusive'):
            found.append(uuid.strip().lower().removeprefix('gpu-'))
    return found


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
