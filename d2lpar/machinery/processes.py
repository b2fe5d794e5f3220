"""Find and end the processes of launches: what `d2lpar.launch` uses to leave nothing behind.

Every process a launch starts carries D2LPAR_LAUNCH_ID=<launching pid>-<id> in
its environment, so it can be found from its environment alone, even after
its parent died: on Linux by reading /proc, elsewhere with BSD `ps -E`.
"""

import os
import signal
import subprocess
import time
from collections import namedtuple

__all__ = ['launched_processes', 'end_processes']

MARKER = 'D2LPAR_LAUNCH_ID'

ProcInfo = namedtuple('ProcInfo', 'pid ppid pgid launch_id start cmd')


def _read(path, mode='r'):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:  # gone, or not ours to read
        return None


def _proc_stat(pid):
    """Return (state, ppid, pgid, start time) of a Linux process, or None."""
    stat = _read(f'/proc/{pid}/stat')
    if not stat:
        return None
    fields = stat.rsplit(')', 1)[1].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[19])


def _linux_processes():
    table = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        pid = int(entry)
        stat = _proc_stat(pid)
        environ = _read(f'/proc/{pid}/environ', 'rb')
        if stat is None or not environ or stat[0] in 'ZX':
            continue
        launch_id = None
        for item in environ.split(b'\0'):
            if item.startswith(MARKER.encode() + b'='):
                launch_id = item.split(b'=', 1)[1].decode(errors='replace')
        cmd = (_read(f'/proc/{pid}/cmdline', 'rb') or b'').replace(b'\0', b' ').decode(errors='replace').strip()
        table.append(ProcInfo(pid, stat[1], stat[2], launch_id, stat[3], cmd))
    return table


def _ps_processes():
    # BSD ps (macOS) prints each process's environment after its command with -E.
    out = subprocess.run(
        ['ps', '-A', '-ww', '-E', '-o', 'pid=,ppid=,pgid=,stat=,command='], capture_output=True, text=True, timeout=10
    ).stdout
    table = []
    for line in out.splitlines():
        parts = line.split(None, 4)
        if len(parts) < 5 or parts[3].startswith('Z'):
            continue
        marker = [w.split('=', 1)[1] for w in parts[4].split() if w.startswith(MARKER + '=')]
        table.append(
            ProcInfo(int(parts[0]), int(parts[1]), int(parts[2]), marker[0] if marker else None, None, parts[4])
        )
    return table


def _all_processes():
    if os.path.isdir('/proc/self'):
        return _linux_processes()
    if os.name == 'posix':
        return _ps_processes()
    return []


def environment(env):
    """Return `env` as what a launched child changes in its environment: {name: str, or None}.

    The one convention of every launcher (d2lpar.launch, d2lpar.run_with_mask): a dict from
    variable names to strings or numbers (made strings: {'OMP_NUM_THREADS': 1}); None unsets
    the variable. A name is a non-empty string without '='.
    """
    if env is None:
        return {}
    if not hasattr(env, 'items'):
        raise TypeError(f'env must be a dict of variable names to values, got {type(env).__name__}')
    checked = {}
    for key, value in env.items():
        if not isinstance(key, str) or not key or '=' in key:
            raise ValueError(f'bad environment variable name {key!r}')
        if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
            raise TypeError(f'env[{key!r}] must be a string, a number or None (to unset it), got {value!r}')
        checked[key] = None if value is None else str(value)
    return checked


def launched_processes(launch_id=None):
    """Return the live processes of one launch (or of every launch made by this process)."""
    if launch_id is None:
        launch_id = f'{os.getpid()}-'
    me = os.getpid()
    return [p for p in _all_processes() if p.launch_id and p.launch_id.startswith(launch_id) and p.pid != me]


def _same_process(p):
    """Return True if `p` still runs (not a zombie) and is the process we saw."""
    if os.path.isdir('/proc/self'):
        stat = _proc_stat(p.pid)
        return stat is not None and stat[0] not in 'ZX' and (p.start is None or stat[3] == p.start)
    try:
        os.kill(p.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return any(q.pid == p.pid and q.cmd == p.cmd for q in _all_processes())


def _owner_alive(launch_id):
    """Return True unless the process that made launch `launch_id` is gone."""
    try:
        owner = int(launch_id.split('-', 1)[0])
        os.kill(owner, 0)
    except ValueError:
        return True  # not an id this module wrote: not ours to judge
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = _proc_stat(owner) if os.path.isdir('/proc/self') else None
    return stat is None or stat[0] not in 'ZX'


def _end_orphans(say):
    """End processes of earlier launches whose launching process died (a killed kernel)."""
    orphans = [p for p in _all_processes() if p.launch_id and p.pid != os.getpid() and not _owner_alive(p.launch_id)]
    if orphans:
        say(
            f'ending {len(orphans)} process(es) left by an earlier launch whose Python '
            f'process is gone: {sorted(p.pid for p in orphans)}'
        )
        end_processes(orphans, grace=1.0)


def _signal(pid, sig):
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_until(predicate, seconds, step=0.05):
    end = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() >= end:
            return False
        time.sleep(step)
    return True


def end_processes(procs, grace=3.0):
    """End `procs` (from `launched_processes`): SIGTERM, then SIGKILL after `grace` s.

    Returns the processes still alive afterwards (normally an empty list).
    """
    procs = list(procs)
    odd = [p for p in procs if not isinstance(p, ProcInfo)]
    if odd:
        raise TypeError(
            f'end_processes: pass the processes d2lpar.launched_processes() returns, '
            f'not {odd[0]!r} (to end one pid yourself: os.kill(pid, signal.SIGTERM))'
        )
    procs = [p for p in procs if p.pid != os.getpid()]
    if not procs or os.name != 'posix':
        return procs
    for p in procs:
        if _same_process(p):
            _signal(p.pid, signal.SIGTERM)
    alive = lambda: [p for p in procs if _same_process(p)]  # noqa: E731
    if not _wait_until(lambda: not alive(), grace):
        for p in alive():
            _signal(p.pid, signal.SIGKILL)
        _wait_until(lambda: not alive(), 5.0)
    return alive()
