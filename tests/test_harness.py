"""The notebook harness itself: nbval fails the suite when a notebook cell fails."""

import subprocess
import sys

import nbformat
import pytest


def run_nbval(tmp_path, *cells):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbformat.write(nb, tmp_path / 'probe.ipynb')
    (tmp_path / 'pytest.ini').write_text('[pytest]\n')  # keep this repo's settings out
    return subprocess.run(
        [
            sys.executable,
            '-m',
            'pytest',
            '-q',
            '-p',
            'no:cacheprovider',
            '--nbval-lax',
            '--nbval-current-env',
            'probe.ipynb',
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    'cells,passes',
    [
        (['x = 1', 'assert x == 1'], True),
        (['x = 1', 'assert x == 2, "a claim that stopped being true"'], False),
    ],
)
def test_nbval_passes_and_fails_with_the_notebook(tmp_path, cells, passes):
    result = run_nbval(tmp_path, *cells)
    assert (result.returncode == 0) == passes, result.stdout + result.stderr
    assert ('1 failed' in result.stdout) == (not passes), result.stdout


def test_kernels_see_the_test_suite_settings(tmp_path):
    import os

    assert os.environ['D2LPAR_OFFLINE'] == '1' and os.environ['D2LPAR_SMALL'] == '1'
    result = run_nbval(tmp_path, 'import os, d2lpar\nassert d2lpar.small_workload() and d2lpar.offline()')
    assert result.returncode == 0, result.stdout + result.stderr
