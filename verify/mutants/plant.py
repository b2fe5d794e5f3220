"""Planting a mutant in a scratch copy of the repository, and keeping its notebook up to the catching cell."""

import json
import shutil
import subprocess
from pathlib import Path


class Broken(Exception):
    """The mutant cannot be planted as written."""


def repo_files(root):
    """Return the repository's tracked files and the untracked ones git does not ignore."""
    try:
        out = subprocess.run(
            ['git', 'ls-files', '-co', '--exclude-standard', '-z'], cwd=root, capture_output=True, text=True, check=True
        ).stdout
        return [p for p in out.split('\0') if p and (Path(root) / p).is_file()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: everything but caches
        skip = {'.git', '.venv', '.venv-floor', '__pycache__', 'build', '.ipynb_checkpoints'}
        return [
            str(p.relative_to(root))
            for p in Path(root).rglob('*')
            if p.is_file() and not skip & set(p.relative_to(root).parts)
        ]


def copy_repo(root, dest):
    for rel in repo_files(root):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(root) / rel, dest / rel)


def code_sources(nb):
    return [(i, ''.join(c['source'])) for i, c in enumerate(nb['cells']) if c['cell_type'] == 'code']


def set_source(cell, text):
    cell['source'] = text.splitlines(keepends=True)
    cell['outputs'], cell['execution_count'] = [], None


def plant(copy, mutant):
    """Replace mutant.old by mutant.new in the copy; raise Broken unless it matches exactly once."""
    path = copy / mutant.target
    if not path.is_file():
        raise Broken(f'target {mutant.target} does not exist')
    if mutant.old == mutant.new:
        raise Broken('old and new are the same text')
    if path.suffix == '.ipynb':
        nb = json.loads(path.read_text())
        hits = [(i, s.count(mutant.old)) for i, s in code_sources(nb) if mutant.old in s]
        total = sum(n for _, n in hits)
        if total != 1:
            raise Broken(f'`old` matches {total} times in the code cells of {mutant.target}')
        i = hits[0][0]
        set_source(nb['cells'][i], ''.join(nb['cells'][i]['source']).replace(mutant.old, mutant.new))
        path.write_text(json.dumps(nb, indent=1))
    else:
        text = path.read_text()
        if text.count(mutant.old) != 1:
            raise Broken(f'`old` matches {text.count(mutant.old)} times in {mutant.target}')
        path.write_text(text.replace(mutant.old, mutant.new))


def notebook_path(mutant):
    """Return the repo-relative notebook a mutant runs, or None when it runs a test."""
    if mutant.run is None:
        return f'notebooks/{mutant.notebook}.ipynb'
    return mutant.run if mutant.run.endswith('.ipynb') else None


def catch_cell(nb, catch, where):
    """Return (cell index, code-cell number) of the one code cell that contains `catch`."""
    hits = [(k, i) for k, (i, s) in enumerate(code_sources(nb)) if catch in s]
    if len(hits) != 1:
        raise Broken(f'`catch` is in {len(hits)} code cells of {where}; it must name one')
    k, i = hits[0]
    return i, k


def truncate(path, catch):
    """Keep the notebook up to the cell that contains `catch`; return its (cell index, code number)."""
    nb = json.loads(path.read_text())
    index, number = catch_cell(nb, catch, path.name)
    nb['cells'] = nb['cells'][: index + 1]
    path.write_text(json.dumps(nb, indent=1))
    return index, number
