"""One row run: in a session of its own, ended on timeout or Ctrl-C, its results checked."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from . import NOTEBOOKS, PORT
from .checks import CheckFailed
from .rows import _python


def _end(proc):
    """End `proc`'s session: SIGTERM first (torchrun then stops its workers), then SIGKILL."""
    from d2lpar.machinery.processes import end_processes, launched_processes

    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
    end_processes(launched_processes())  # ranks of a d2lpar.launch inside a notebook row


def _read_results(folder):
    records = []
    for f in sorted(Path(folder).glob('*.json')):
        records.append(json.loads(f.read_text()))
    return records


def run_row(row, log, results_dir, online=False):
    """Run one row, writing its output to `log`; return (ok, seconds, note)."""
    from d2lpar.machinery.ports import free_port

    env = dict(os.environ)
    env.pop('D2LPAR_SMALL', None)  # full size, as a learner runs it, unless the row says
    if not online:  # no download (it has no timeout): the announced stand-in data
        env['D2LPAR_OFFLINE'] = '1'
    env.update(row.env)
    if row.check is not None:
        shutil.rmtree(results_dir, ignore_errors=True)
        Path(results_dir).mkdir(parents=True)
        env['D2LPAR_RESULT_DIR'] = str(results_dir)  # what the ranks hand back, to check
    start = time.perf_counter()
    if row.notebook is not None:
        # A child process, so that a row's CUDA_VISIBLE_DEVICES applies before CUDA starts.
        code = (
            'import sys; from d2lpar.machinery.render import execute_notebook; '
            'nb, setup, s, error = execute_notebook(sys.argv[1], timeout=int(sys.argv[2])); '
            'print(setup); print(error or "ok"); sys.exit(1 if error else 0)'
        )
        argv = _python('-c', code, row.notebook, row.timeout)
    else:
        port = str(free_port()) if any(PORT in str(a) for a in row.argv) else None
        argv = [str(a).replace(PORT, port) if port else a for a in row.argv]
    with open(log, 'w') as out:
        # In a session of its own, so that a timeout or Ctrl-C ends the row's whole tree.
        proc = subprocess.Popen(
            argv, cwd=NOTEBOOKS, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=row.timeout)
            ok, note = proc.returncode == 0, f'exit {proc.returncode}'
        except subprocess.TimeoutExpired:
            ok, note = False, f'timed out after {row.timeout} s'
        finally:
            _end(proc)
    seconds = time.perf_counter() - start
    text = Path(log).read_text(errors='replace')
    if ok and row.check is not None:
        try:
            row.check(_read_results(results_dir), text)
            note = 'checked'
        except CheckFailed as e:
            ok, note = False, f'check failed: {e}'
        except (KeyError, TypeError, ValueError, IndexError) as e:  # a record lacks a field
            ok, note = False, f'check failed: results malformed ({type(e).__name__}: {e})'
    if not ok and not note.startswith('check failed'):
        tail = text.strip().splitlines()[-1:] or ['']
        note = f'{note}: {tail[0][:100]}'
    return ok, seconds, note
