"""Run code in a child process whose files cannot grow past a few bytes: a disk that fills mid-write.

The child's writes fail with OSError (EFBIG) once a file reaches `limit` bytes, after the
bytes before it were written: what a full disk or quota does to a file written in place.
Linux and macOS (RLIMIT_FSIZE); the tests that use it are skipped elsewhere.
"""

import subprocess
import sys
import textwrap

import pytest

PRELUDE = '''
import resource, signal

def full_disk(limit={limit}):
    """From now on, no file of this process grows past `limit` bytes (SIGXFSZ ignored: EFBIG)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
'''


def run_on_a_full_disk(code, limit=64, timeout=180, cwd=None):
    """Run `code` (which calls full_disk() after its imports); return the finished process."""
    pytest.importorskip('resource')
    source = PRELUDE.format(limit=limit) + textwrap.dedent(code)
    return subprocess.run([sys.executable, '-c', source], capture_output=True, text=True, timeout=timeout, cwd=cwd)
