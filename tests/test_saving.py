"""save_cells: a notebook's #@save cells become a module that a fresh process imports."""

import shutil
import subprocess
import sys

import pytest
from IPython.core.interactiveshell import InteractiveShell

import d2lpar
from d2lpar.machinery import saving
from full_disk import run_on_a_full_disk

CELLS = [
    'import json\nimport torch\nfrom torch import nn',
    '#@save\ndef double(x):\n    """Return twice x."""\n    return int(torch.tensor(2 * x))',
    'y = double(3)',  # not saved
]


@pytest.fixture
def shell(monkeypatch):
    shell = InteractiveShell.instance()
    monkeypatch.setattr(saving, '_kernel', lambda: shell)
    yield shell
    for callback in list(shell.events.callbacks['post_run_cell']):
        if hasattr(callback, 'd2lpar_saves_to'):
            shell.events.unregister('post_run_cell', callback)
    InteractiveShell.clear_instance()


def run(shell, *cells):
    for cell in cells:
        shell.run_cell(cell, store_history=True)


def call_in_fresh_process(folder, expression):
    """Import the saved module in a new Python and return what `expression` prints."""
    code = f'import sys; sys.path.insert(0, {str(folder)!r}); import steps; print({expression})'
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_saved_cells_with_their_imports_run_in_a_fresh_process(shell, tmp_path):
    run(shell, *CELLS)
    path = d2lpar.save_cells(tmp_path / 'steps.py')
    text = path.read_text()
    assert 'import torch' in text and 'def double' in text and 'y = double' not in text
    # only the imports the saved cells use: every rank that imports the module pays for them
    assert 'json' not in text and 'nn' not in text.split('def double')[0]
    assert call_in_fresh_process(tmp_path, 'steps.double(3)') == '6'


def test_an_edit_to_a_saved_cell_takes_effect_in_the_next_import(shell, tmp_path):
    run(shell, *CELLS)
    d2lpar.save_cells(tmp_path / 'steps.py')
    run(shell, CELLS[1].replace('2 * x', '3 * x'))  # the learner edits and reruns the cell
    assert call_in_fresh_process(tmp_path, 'steps.double(3)') == '9'
    # A saved cell that fails to run leaves the module as it was.
    run(shell, '#@save\ndef double(x):\n    return 4 * x\nraise ValueError("typo")')
    assert call_in_fresh_process(tmp_path, 'steps.double(3)') == '9'
    # Saving again to the same file does not register a second writer.
    d2lpar.save_cells(tmp_path / 'steps.py')
    writers = [c for c in shell.events.callbacks['post_run_cell'] if hasattr(c, 'd2lpar_saves_to')]
    assert len(writers) == 1


def test_a_kernel_that_keeps_no_history_saves_the_cells_it_runs(shell, tmp_path):
    # Notebook runners such as nbval execute every cell with store_history=False: `In` stays
    # empty, so the cells must be recorded as they run, magics included.
    shell.run_cell(
        f'%xmode Plain\nimport torch\nimport d2lpar\nd2lpar.save_cells({str(tmp_path / "steps.py")!r})',
        store_history=False,
    )
    for cell in CELLS[1:]:
        shell.run_cell(cell, store_history=False)
    assert call_in_fresh_process(tmp_path, 'steps.double(3)') == '6'
    assert 'import torch' in (tmp_path / 'steps.py').read_text()
    assert len(shell.user_ns['In']) <= 1  # nothing in the history, yet every cell was saved
    shell.run_cell(CELLS[1].replace('2 * x', '5 * x'), store_history=False)
    assert call_in_fresh_process(tmp_path, 'steps.double(3)') == '15'
    shell.run_cell(
        CELLS[1].replace('2 * x', '4 * x') + '\nraise ValueError("typo")', store_history=False
    )  # a failing edit leaves the module as it was
    assert call_in_fresh_process(tmp_path, 'steps.double(3)') == '15'


def test_the_module_does_not_import_itself(tmp_path):
    text = saving.saved_source(['import steps\nimport os', '#@save\nX = os.sep'], module='steps')
    assert 'import steps' not in text and 'import os' in text


def test_bad_input_says_what_to_do(shell, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match='save_cells: path must name a Python module'):
        d2lpar.save_cells(tmp_path / 'steps.txt')
    with pytest.raises(ValueError, match='save_cells: folder .* does not exist'):
        d2lpar.save_cells(tmp_path / 'missing' / 'steps.py')
    monkeypatch.setattr(saving, '_kernel', lambda: None)
    with pytest.raises(RuntimeError, match='save_cells: runs inside a Jupyter or IPython kernel'):
        d2lpar.save_cells(tmp_path / 'steps.py')
    assert not list(tmp_path.iterdir())  # nothing written on a refusal


def test_a_removed_folder_stops_the_saving_with_a_message_not_a_traceback(shell, tmp_path, capsys):
    folder = tmp_path / 'work'
    folder.mkdir()
    run(shell, *CELLS)
    d2lpar.save_cells(folder / 'steps.py')
    shutil.rmtree(folder)  # what a notebook's last cell does
    result = shell.run_cell(CELLS[1], store_history=True)  # the learner reruns a saved cell
    out = capsys.readouterr()
    assert result.success and 'Traceback' not in out.out + out.err
    assert 'save_cells: ' in out.out and 'is gone' in out.out
    assert not folder.exists()
    assert not [c for c in shell.events.callbacks['post_run_cell'] if hasattr(c, 'd2lpar_saves_to')]


def test_a_checkpoint_that_cannot_be_written_whole_leaves_the_old_one(tmp_path):
    # torch.save through replace_whole on a disk that fills halfway: the old checkpoint stays,
    # readable, and no temporary file is left beside it.
    torch = pytest.importorskip('torch')
    path = tmp_path / 'checkpoint.pt'
    torch.save({'step': 1}, path)
    done = run_on_a_full_disk(f"""
        import torch
        from d2lpar.machinery.saving import replace_whole, write_whole
        full_disk(4096)
        for write in (lambda: replace_whole({str(path)!r}, lambda tmp: torch.save(torch.zeros(10**4), tmp)),
                      lambda: write_whole({str(path)!r}, 'x' * 10**4)):
            try:
                write()
            except (OSError, RuntimeError) as e:  # torch.save says RuntimeError (an iostream error)
                print('raised', type(e).__name__)
        """)
    assert done.stdout.count('raised') == 2, done.stdout + done.stderr
    assert torch.load(path, weights_only=True) == {'step': 1}
    assert [p.name for p in tmp_path.iterdir()] == ['checkpoint.pt']
