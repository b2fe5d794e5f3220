"""Notebook 9's launched scripts run the notebook's own #@save cells, and join NCCL bound to a GPU.

The notebook writes its scripts with `%%writefile {work}/NAME` and the saved cells into
`{work}/collectives_steps.py` (d2lpar.save_cells). These tests build the same folder from the
notebook file: an edit that breaks a saved cell must make the next launch fail.
"""

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

from d2lpar import distributed
from d2lpar.machinery import saving
from d2lpar import launch, launched_processes

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / 'notebooks' / '09_collectives.ipynb'
MODULE = 'collectives_steps'


def code_cells():
    cells = json.loads(NOTEBOOK.read_text())['cells']
    return [''.join(c['source']) for c in cells if c['cell_type'] == 'code']


def notebook_script(name):
    """Return the script that notebook 9 writes with `%%writefile {work}/<name>`."""
    for source in code_cells():
        first, _, body = source.partition('\n')
        if first.strip() == f'%%writefile {{work}}/{name}':
            return body
    raise AssertionError(f'notebook 9 writes no {name}')


def work_folder(folder, script, edit=None):
    """Write `script` and the saved cells (with `edit` = (old, new) applied) into `folder`."""
    cells = code_cells()
    if edit is not None:
        old, new = edit
        hits = [i for i, source in enumerate(cells) if old in source]
        assert len(hits) == 1, f'{old!r} is in {len(hits)} cells, not one'
        cells[hits[0]] = cells[hits[0]].replace(old, new)
    # The notebook's first cell holds magics (not Python); like save_cells, skip what fails to parse.
    (folder / f'{MODULE}.py').write_text(saving.saved_source(cells, module=MODULE))
    path = folder / script
    path.write_text(notebook_script(script))
    return path


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    assert launched_processes() == []


def test_an_edit_to_a_saved_cell_reaches_the_launch(tmp_path):
    good = work_folder(tmp_path, 'check_collectives.py')
    launched = launch(good, nproc=2, timeout=120, echo=False)
    assert launched.ok, launched.text()
    assert set(launched.by_rank()) == {0, 1}
    # A ring all-gather that stops one step short leaves a block unsummed on every rank.
    broken_dir = tmp_path / 'broken'
    broken_dir.mkdir()
    broken = work_folder(
        broken_dir,
        'check_collectives.py',
        edit=(
            'for step in range(n - 1):\n        send, recv = (rank - step) % n',
            'for step in range(n - 2):\n        send, recv = (rank - step) % n',
        ),
    )
    launched = launch(broken, nproc=2, timeout=120, echo=False)
    assert not launched.ok and 'AssertionError' in launched.text()


class Joined(Exception):
    """Raised by the fake init_process_group: the script got as far as joining."""


def joining_kwargs(monkeypatch, run):
    """Run a script up to init_process_group as if on 2 GPUs with NCCL; return its kwargs."""
    calls = []

    def fake_init(*args, **kwargs):
        calls.append((args, kwargs))
        raise Joined

    monkeypatch.setattr(torch.distributed, 'init_process_group', fake_init)
    monkeypatch.setattr(distributed, 'pick_backend', lambda *a, **k: 'nccl')
    # cuda:0 without asking CUDA (there may be none): what rank_device gives local rank 0.
    monkeypatch.setattr(distributed, 'rank_device', lambda backend, local_rank=0: torch.device('cuda', local_rank))
    for name, value in {'RANK': '0', 'LOCAL_RANK': '0', 'WORLD_SIZE': '2', 'LOCAL_WORLD_SIZE': '2'}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(Joined):
        run()
    ((args, kwargs),) = calls
    return args, kwargs


def test_the_notebook_script_joins_nccl_with_its_device(tmp_path, monkeypatch):
    path = work_folder(tmp_path, 'train_miniddp.py')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, 'argv', [str(path), '--variant', 'hook'])
    args, kwargs = joining_kwargs(monkeypatch, lambda: runpy.run_path(str(path)))
    assert args == ('nccl',) and kwargs['device_id'] == torch.device('cuda', 0)


def test_the_benchmark_script_joins_nccl_with_its_device(monkeypatch):
    path = ROOT / 'notebooks' / 'scripts' / 'collectives_miniddp.py'
    monkeypatch.setattr(sys, 'argv', [str(path), '--variant', 'hook'])
    args, kwargs = joining_kwargs(monkeypatch, lambda: runpy.run_path(str(path), run_name='__main__'))
    assert args == ('nccl',) and kwargs['device_id'] == torch.device('cuda', 0)
