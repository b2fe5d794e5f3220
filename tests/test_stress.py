"""verify/stress.py reports failing cells and what a run left behind, and ends it."""

import json
import os
import re
import shutil
import tempfile

import pytest
from verify import stress

CELLS = [
    'import subprocess, tempfile\nx = 1',
    'assert x == 2, "x is not two"',
]
LEAVES = [
    'import subprocess, tempfile\n'
    'sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)\n'
    'handle, path = tempfile.mkstemp(suffix=".part")',
]


def alive(pid):
    """Return True if process `pid` runs (a zombie does not)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] not in 'ZX'
    except OSError:
        return False


def notebook(path, sources):
    cells = [
        {'cell_type': 'code', 'metadata': {}, 'execution_count': None, 'outputs': [], 'source': source}
        for source in sources
    ]
    path.write_text(json.dumps({'cells': cells, 'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}))
    return str(path)


@pytest.fixture
def probe_dir():
    """A folder inside the repository (ignored by git): nbval collects only notebooks there."""
    (stress.ROOT / 'build').mkdir(exist_ok=True)
    path = tempfile.mkdtemp(prefix='stress-probe-', dir=stress.ROOT / 'build')
    yield stress.Path(path)
    shutil.rmtree(path)


@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='leftovers are found through /proc')
def test_a_failing_cell_and_leftovers_are_reported_and_cleaned(probe_dir, capsys):
    failing = notebook(probe_dir / 'failing.ipynb', CELLS)
    leaving = notebook(probe_dir / 'leaving.ipynb', LEAVES)
    status = stress.main(['--runs', '1', '--load', '1', failing, leaving])
    out = capsys.readouterr().out
    assert status == 1
    assert 'Cell 1: AssertionError: x is not two' in out
    assert 'left behind: process' in out and 'sleep 300' in out
    assert 'left behind: file $TMPDIR/' in out and '.part' in out
    assert '1 passed, 1 failed' in out
    # the sleeper the report names was ended (a zombie at most, waiting for its reaper)
    pid = int(re.search(r'left behind: process (\d+) \(sleep 300\)', out).group(1))
    assert not alive(pid)


def test_bad_arguments_are_refused(tmp_path, capsys):
    for argv in (['--runs', '0'], [str(tmp_path / 'absent.ipynb')]):
        try:
            stress.main(argv)
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(f'{argv} was accepted')
    assert 'no notebook at' in capsys.readouterr().err
