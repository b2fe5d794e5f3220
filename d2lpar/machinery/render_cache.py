"""`make html`'s execution cache: a notebook is not run again while nothing it depends on changed.

The key is a hash of the notebook's code cells (Markdown edits re-render without re-running),
the workload, the torch release, the D2LPAR_* settings, and every source file of the package
and of notebooks/scripts (a change there can change any output). A hit grafts the stored
outputs onto the notebook's code cells; only runs that succeeded are stored.
"""

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path

from .saving import write_whole

PACKAGE = Path(__file__).resolve().parents[1]  # all of d2lpar, not only this folder


def cache_key(nb, notebook, small):
    """Return the hash that decides whether `notebook` (read as `nb`) must run again."""
    h = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == 'code':
            h.update(cell.source.encode() + b'\0')
    try:
        torch_version = metadata.version('torch')
    except metadata.PackageNotFoundError:
        torch_version = 'none'
    settings = sorted((k, v) for k, v in os.environ.items() if k.startswith('D2LPAR_'))
    h.update(json.dumps([bool(small), torch_version, settings]).encode())
    sources = sorted(PACKAGE.rglob('*.py')) + sorted((Path(notebook).parent / 'scripts').glob('*.py'))
    for path in sources:
        h.update(str(path.relative_to(path.anchor)).encode() + b'\0' + path.read_bytes())
    return h.hexdigest()


def load(cache_dir, stem, key, nb):
    """Put the stored outputs on `nb`'s code cells and return (setup, seconds), or None on a miss."""
    path = Path(cache_dir) / f'{stem}.json'
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    cells = [cell for cell in nb.cells if cell.cell_type == 'code']
    if entry.get('key') != key or len(entry.get('cells', ())) != len(cells):
        return None
    import nbformat

    for cell, stored in zip(cells, entry['cells']):
        cell.outputs = [nbformat.from_dict(output) for output in stored['outputs']]
        cell.execution_count = stored['execution_count']
    return entry['setup'], entry['seconds']


def store(cache_dir, stem, key, nb, setup, seconds):
    """Keep a successful run's outputs under `key`, written whole or not at all."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    cells = [
        {'outputs': cell.outputs, 'execution_count': cell.execution_count}
        for cell in nb.cells
        if cell.cell_type == 'code'
    ]
    text = json.dumps({'key': key, 'setup': setup, 'seconds': seconds, 'cells': cells})
    write_whole(cache_dir / f'{stem}.json', text)
