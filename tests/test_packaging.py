"""Packaging: environment.yml agrees with pyproject.toml, notebooks are clean, info works."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONDA_NAMES = {'torch': 'pytorch'}  # PyPI name -> conda-forge name where they differ


def parse(requirement):
    name, spec = re.match(r'\s*([A-Za-z0-9_.\-]+)\s*(.*)', requirement).groups()
    return name.lower().replace('_', '-'), spec.replace(' ', '')


def test_environment_yml_matches_pyproject():
    try:
        import tomllib
    except ImportError:  # Python < 3.11: only this test needs the tomli backport
        tomllib = pytest.importorskip('tomli')
    project = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']
    wanted = [*project['dependencies'], *project['optional-dependencies']['course']]
    wanted = dict(parse(r) for r in wanted)
    wanted = {CONDA_NAMES.get(name, name): spec for name, spec in wanted.items()}
    env = yaml.safe_load((ROOT / 'environment.yml').read_text())
    conda = [d for d in env['dependencies'] if isinstance(d, str)]
    pip = [d for d in env['dependencies'] if isinstance(d, dict)][0]['pip']
    listed = dict(parse(d) for d in conda if not d.startswith(('python', 'pip')))
    listed.update(parse(d) for d in pip if d != '-e .')  # PyPI-only packages (torchft)
    assert listed == wanted
    assert '-e .' in pip, 'environment.yml must install the package itself with pip: -e .'
    python = [d for d in conda if re.match(r'python\b', d)][0]
    assert python.replace(' ', '') == 'python' + project['requires-python']


def test_notebooks_are_committed_without_outputs():
    for path in sorted((ROOT / 'notebooks').glob('**/*.ipynb')):
        if '.ipynb_checkpoints' in path.parts:
            continue
        cells = json.loads(path.read_text())['cells']
        dirty = [
            i
            for i, c in enumerate(cells)
            if c['cell_type'] == 'code' and (c.get('outputs') or c.get('execution_count'))
        ]
        assert not dirty, f'{path.name}: cells {dirty} carry outputs; clear them before committing'


def test_notebooks_are_numbered_and_end_with_summary_and_exercises():
    for path in sorted((ROOT / 'notebooks').glob('*.ipynb')):
        assert re.match(r'\d\d_\w+\.ipynb$', path.name), path.name
        cells = json.loads(path.read_text())['cells']
        headings = [
            c_line
            for c in cells
            if c['cell_type'] == 'markdown'
            for c_line in ''.join(c['source']).splitlines()
            if c_line.startswith('#')
        ]
        assert any(h.strip('# ').startswith('Summary') for h in headings), path.name
        assert any(h.strip('# ').startswith('Exercises') for h in headings), path.name
        first_code = next(c for c in cells if c['cell_type'] == 'code')
        assert 'd2lpar.show_setup(' in ''.join(first_code['source']), path.name


def test_import_has_no_side_effects():
    code = (
        'import os, sys, torch; env = dict(os.environ); cwd = set(os.listdir()); '
        'import d2lpar; '
        'print(torch.cuda.is_initialized(), "matplotlib.pyplot" in sys.modules, '
        'dict(os.environ) == env, set(os.listdir()) == cwd)'
    )
    run = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True, cwd=ROOT)
    # Importing initialises no CUDA, loads no pyplot, sets no variable, writes no file,
    # and prints nothing besides the probe's own line.
    assert run.stdout.split() == ['False', 'False', 'True', 'True'] and run.stderr == ''


def test_info_command():
    out = subprocess.run([sys.executable, '-m', 'd2lpar', 'info'], capture_output=True, text=True, check=True).stdout
    import torch

    import d2lpar

    assert torch.__version__ in out
    assert 'CUDA_VISIBLE_DEVICES' in out and 'gloo' in out and 'CPU cores' in out
    assert f'hardware tier     {d2lpar.hardware_tier()}' in out


def test_every_torch_load_passes_weights_only():
    """A checkpoint is data: never let torch.load unpickle arbitrary objects from it."""
    import ast

    # The project's own files: not the virtual environments (.venv, .venv-floor) or other
    # hidden folders, whose installed packages are not ours to check.
    sources = [
        (p, p.read_text())
        for p in ROOT.glob('**/*.py')
        if not any(part.startswith('.') for part in p.relative_to(ROOT).parts)
    ]
    for path in ROOT.glob('notebooks/**/*.ipynb'):
        for i, cell in enumerate(json.loads(path.read_text())['cells']):
            if cell['cell_type'] == 'code':
                code = '\n'.join(
                    line for line in ''.join(cell['source']).splitlines() if not line.lstrip().startswith(('%', '!'))
                )
                sources.append((f'{path.name} cell {i}', code))
    found = 0
    for where, code in sources:
        for node in ast.walk(ast.parse(code)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == 'load'
                and getattr(node.func.value, 'id', '') == 'torch'
            ):
                found += 1
                flags = {k.arg: k.value for k in node.keywords}
                assert getattr(flags.get('weights_only'), 'value', None) is True, (
                    f'{where}: torch.load without weights_only=True'
                )
    assert found >= 4  # the check saw the calls it is about


def test_notebooks_are_valid_nbformat_with_cell_ids():
    nbformat = pytest.importorskip('nbformat')
    for path in sorted((ROOT / 'notebooks').glob('**/*.ipynb')):
        if '.ipynb_checkpoints' in path.parts:
            continue
        nb = json.loads(path.read_text())
        ids = [c.get('id') for c in nb['cells']]
        # nbformat 4.5 cells need unique ids; without them Jupyter rewrites the file on every save.
        assert None not in ids and len(set(ids)) == len(ids), (
            f'{path.name}: cells {[i for i, x in enumerate(ids) if x is None]} lack an id or ids '
            f'repeat; run nbformat.validator.normalize on it (or save it once in JupyterLab)'
        )
        nbformat.validate(nbformat.reads(path.read_text(), as_version=4))


def test_an_older_torch_is_named_and_the_floor_matches_pyproject():
    import re

    from d2lpar.machinery import info

    text = (Path(__file__).resolve().parent.parent / 'pyproject.toml').read_text()
    floor = re.search(r'"torch>=(\d+)\.(\d+)"', text).groups()
    assert tuple(map(int, floor)) == info.TORCH_FLOOR
    assert info.torch_problem('2.12.1+cu126').startswith('torch 2.12.1+cu126 is older than 2.13')
    assert info.torch_problem('1.13.0') is not None
    assert info.torch_problem('2.13.0+cpu') is None and info.torch_problem('2.15.0') is None
    assert info.torch_problem('2.16.0a0+git123') is None and info.torch_problem('3.0') is None


def test_notebooks_are_normalized_and_normalizing_keeps_every_cell_id():
    from d2lpar.tools import notebooks as normalize

    for path in sorted((ROOT / 'notebooks').glob('**/*.ipynb')):
        text = path.read_text()
        assert normalize.normalized(text) == text, f'{path.name}: run `make normalize`'
    # A cell without an id gets one; the others keep theirs, and a second pass changes nothing.
    nb = json.loads((ROOT / 'notebooks' / '03_data_parallel.ipynb').read_text())
    ids = [c['id'] for c in nb['cells']]
    del nb['cells'][5]['id']
    code = next(i for i, c in enumerate(nb['cells']) if i > 5 and c['cell_type'] == 'code')
    nb['cells'][code]['outputs'] = [{'output_type': 'stream', 'name': 'stdout', 'text': ['x\n']}]
    once = normalize.normalized(json.dumps(nb))
    again = json.loads(once)
    new_ids = [c['id'] for c in again['cells']]
    assert new_ids[:5] + new_ids[6:] == ids[:5] + ids[6:] and new_ids[5] not in ids
    assert again['cells'][code]['outputs'] == [] and normalize.normalized(once) == once
